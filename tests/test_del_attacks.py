"""Attacks on the two DEL paths that act on whole state: whole results entries of sandboxes no
runtime will DEL ("forgotten"), and host-local reservations no results entry owns ("orphans").

Each scenario is a node an unlucky operator or a local foothold could leave: odd files in
host-local's stores, cached configs that name odd things, owners that are not container IDs,
state that changes while the run acts. Runs use real plugins from /usr/lib/cni (host-local),
or shell-script plugins where a plugin must show what it was given, on a --root (tests/crashed.py:
root, plugins confined to the root's state).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni_reaper.errors import ExitCode
from tests.bolt_writer import containerd_sandbox, write_db
from tests.crashed import Crashed, by_path
from tests.nodetree import CONTAINER_IDS, cache_entry_bytes, snapshot

META_DB = "var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db"
QUARANTINE_BOOT = "11111111-2222-3333-4444-555555555555"
A, B, C, KNOWN = CONTAINER_IDS[:4]


def containerd_knows(crashed: Crashed, *sandbox_ids: str) -> None:
    """containerd's meta.db, holding exactly these CRI sandboxes: every other whole entry of
    an earlier boot is of a sandbox no runtime will DEL."""
    path = crashed.node.root / META_DB
    path.parent.mkdir(parents=True, exist_ok=True)
    ops = [op for i in sandbox_ids for op in containerd_sandbox("k8s.io", i)]
    write_db(path, [ops], no_freelist_sync=True)


def reservations_of(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["ip"]: r for r in report["host_local"]}


@contextlib.contextmanager
def fifo_watchdog(fifos: list[Path], after: float) -> Iterator[list[str]]:
    """Unblocks a reader stuck opening one of the FIFOs after `after` seconds (so a hang fails
    the test instead of hanging it); the list names the FIFOs it had to open."""
    opened: list[str] = []
    done = threading.Event()

    def watch() -> None:
        if done.wait(after):
            return
        for fifo in fifos:
            with contextlib.suppress(OSError):  # ENXIO: nobody is reading it
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                opened.append(fifo.name)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield opened
    finally:
        done.set()
        thread.join()


def run_watched(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], fifos: list[Path], *extra: str
) -> tuple[int, dict[str, Any], list[str]]:
    with fifo_watchdog(fifos, after=20.0) as opened:
        code, report = crashed.run(capsys, *extra)
    return code, report, opened


# host-local's store holding what host-local never writes there.


def test_a_directory_named_like_an_address_does_not_break_the_check_of_a_del(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """The DEL of a damaged entry reads the store to see its address released; a directory
    named like an address in it is no reservation, and no reason to fail the run."""
    entry = crashed.add(A)
    entry.write_bytes(b"")
    (crashed.ipam / "hl/10.22.0.200").mkdir()
    crashed.reboot()

    code, report = crashed.run(capsys)

    e = by_path(report)[entry.name]
    assert (e["outcome"], len(e["del"]["released"])) == ("done", 1), e
    assert sorted(os.listdir(crashed.ipam / "hl")) == ["10.22.0.200", "last_reserved_ip.0", "lock"]
    assert code == ExitCode.OK


def test_a_fifo_named_like_an_address_stops_the_del_that_would_hang_on_it(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reaper never waits on it. host-local's own DEL reads every file of its store, and
    would (as it would for the runtime): what it would release cannot be told, so it is not
    run, and the entry stays, whole, for a look (until 2026-12-07 the DEL ran and was cut at
    the plugin timeout)."""
    entry = crashed.add(A)
    entry.write_bytes(b"")
    fifo = crashed.ipam / "hl/10.22.0.201"
    os.mkfifo(fifo, 0o600)
    crashed.reboot()

    code, report, opened = run_watched(crashed, capsys, [fifo], "--plugin-timeout", "2")

    assert opened == [], "the run blocked opening a FIFO in host-local's store"
    e = by_path(report)[entry.name]
    assert (e["action"], e["outcome"], e["quarantined_to"]) == ("leave", "skipped", None), e
    assert e["reason"] == (
        f"host-local's DEL reads every file of {crashed.ipam / 'hl'}, and {fifo} is no regular "
        "file: what else it would release cannot be told"
    )
    assert entry.exists()
    assert code == ExitCode.DATA


@pytest.mark.parametrize("kind", ["FIFO", "symlink"])
def test_a_store_lock_that_is_no_file_does_not_hang_the_quarantine_nor_is_followed(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    """host-local's lock is a plain file; a FIFO in its place is not waited on, a symlink not
    followed (to the rescue machine's own store's lock, say), and no reservation moves."""
    store = crashed.ipam / "hl"
    store.mkdir(parents=True)
    (store / "10.22.0.7").write_bytes(b"")  # damaged: quarantined under the lock
    lock = store / "lock"
    if kind == "FIFO":
        os.mkfifo(lock, 0o600)
    else:
        (store.parent / "theirs").write_bytes(b"")
        os.symlink("../theirs", lock)
    crashed.reboot()

    code, report, opened = run_watched(crashed, capsys, [lock])

    assert opened == [], "the run blocked opening a FIFO as host-local's lock"
    r = reservations_of(report)["10.22.0.7"]
    assert (r["action"], r["outcome"]) == ("quarantine", "failed")
    assert r["problem"] == f"cannot lock {store}: its lock is a {kind}, not a regular file", r
    assert (store / "10.22.0.7").exists()
    assert code == ExitCode.ACTION_FAILED


# Whole entries of sandboxes no runtime will DEL: what their cache holds is handed on.


@pytest.mark.parametrize("depth", [980, 985, 988, 990, 992, 995, 1_000, 5_000])
def test_a_deeply_nested_cached_result_is_handed_on_or_left_never_a_crash(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], depth: int
) -> None:
    """A result and capability args nested about as deep as Python's codec allows (on 3.9 to
    3.11; 3.12 on takes 10,000 levels): the DEL gets them as prevResult and runtimeConfig, or
    the entry is unreadable. Never an internal error: the stdin's encoding raised
    RecursionError, uncaught, in the middle of the run's DELs wherever the inventory decoded
    what the DEL could not encode (go_marshal now walks without recursion, to any depth)."""
    containerd_knows(crashed, KNOWN)
    nested = "[" * depth + '"x"' + "]" * depth  # as text: this interpreter may not encode it
    entry = crashed.add(A)
    doc = json.loads(entry.read_bytes())
    doc["result"]["dns"] = {"options": "NESTED"}
    doc["capabilityArgs"] = {"portMappings": "NESTED"}
    entry.write_bytes(json.dumps(doc).replace('"NESTED"', nested).encode())
    crashed.reboot()

    code, report = crashed.run(capsys)

    e = by_path(report)[entry.name]
    outcome = (e["content"], e["action"], e["outcome"], code)
    assert outcome in (
        ("valid", "del-and-quarantine", "done", ExitCode.OK),
        ("unreadable", "report", "skipped", ExitCode.DATA),
    ), (e["reason"], e.get("plugin_errors"))


def cached_conf_entry(crashed: Crashed, container_id: str, conf: dict[str, Any]) -> Path:
    """A whole entry of a network no conf dir names, caching conf as the config ADD ran with."""
    name = f"fg-{container_id}-eth0"
    data = cache_entry_bytes(json.dumps(conf).encode(), "fg", container_id, "eth0")
    return crashed.node.write_result(name, data)


def canary(crashed: Crashed, tmp_path: Path) -> tuple[Path, Path]:
    """A plugin in the root's plugin dir that leaves a mark if it ever runs."""
    mark = tmp_path / "canary-ran"
    bin_dir = crashed.node.root / "opt/cni/bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    plugin = bin_dir / "canary"
    plugin.write_text(f'#!/bin/sh\ntouch "{mark}"\n')
    plugin.chmod(0o755)
    return bin_dir, mark


@pytest.mark.parametrize(
    "plugin",
    [
        {"type": "../bin/canary"},
        {"type": "/opt/cni/bin/canary"},
        {"type": "host-local", "ipam": {"type": "../bin/canary"}},
        {"type": "host-local", "ipam": {"type": "/opt/cni/bin/canary"}},
    ],
)
def test_a_cached_config_naming_a_plugin_by_path_runs_nothing(
    crashed: Crashed,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    plugin: dict[str, Any],
) -> None:
    bin_dir, mark = canary(crashed, tmp_path)
    conf = {"cniVersion": "1.0.0", "name": "fg", "plugins": [plugin]}
    entry = cached_conf_entry(crashed, A, conf)
    containerd_knows(crashed, KNOWN)
    crashed.reboot()

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir))

    assert not mark.exists()
    e = by_path(report)[entry.name]
    assert (e["action"], e["outcome"], e["del"]["plugins_run"]) == (
        "del-and-quarantine",
        "failed",
        [],
    ), e
    assert code == ExitCode.ACTION_FAILED


def test_a_cached_config_naming_another_network_runs_no_del(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """An entry of network fg whose cached config says it is hl, a network the conf dirs
    name with another config: neither config is the one fg's ADD ran with."""
    bin_dir, mark = canary(crashed, tmp_path)
    conf = {"cniVersion": "1.0.0", "name": "hl", "plugins": [{"type": "canary"}]}
    entry = cached_conf_entry(crashed, A, conf)
    containerd_knows(crashed, KNOWN)
    crashed.reboot()

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir))

    assert not mark.exists()
    e = by_path(report)[entry.name]
    assert "names network 'hl'" in e["del"]["config_problem"], e
    assert (e["outcome"], code) == ("failed", ExitCode.ACTION_FAILED)


def test_an_orphan_of_a_network_whose_cached_config_names_another_gets_no_del(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bin_dir, mark = canary(crashed, tmp_path)
    conf = {"cniVersion": "1.0.0", "name": "hl", "plugins": [{"type": "canary"}]}
    cached_conf_entry(crashed, KNOWN, conf)  # kept: containerd knows its sandbox
    containerd_knows(crashed, KNOWN)
    store = crashed.ipam / "fg"
    store.mkdir(parents=True)
    (store / "10.60.0.9").write_bytes(f"{A}\r\neth0".encode())
    crashed.reboot()

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir))

    assert not mark.exists()
    r = reservations_of(report)["10.60.0.9"]
    assert "names network 'hl'" in r["del"]["config_problem"], r
    assert (r["outcome"], r["del"]["plugins_run"], r["del"]["ok"]) == ("done", [], False)
    assert not (store / "10.60.0.9").exists()  # released into the quarantine
    assert code == ExitCode.ACTION_FAILED  # released, but no DEL could run: a look is wanted


def test_a_dry_run_of_forgotten_entries_and_orphans_changes_nothing(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """Forgotten entries, an orphan of a configured network and one of a network no conf
    names, a damaged reservation, a store without host-local's lock: a dry run plans them
    all, runs no plugin, writes nothing (not even this boot's pre-runtime record)."""
    crashed.add(A)
    crashed.add(B)
    os.unlink(crashed.node.results / f"hl-{B}-eth0")
    conf = json.loads(crashed.node.conf_dir.joinpath("10-hl.conflist").read_text())
    cached_conf_entry(crashed, C, {**conf, "name": "fg"})
    gone = crashed.ipam / "gone"
    gone.mkdir(parents=True)
    (gone / "10.70.0.2").write_bytes(f"{C}\r\neth0".encode())
    (gone / "10.70.0.3").write_bytes(b"")
    containerd_knows(crashed, KNOWN)
    crashed.reboot()
    before = snapshot(crashed.node.root)

    code, report = crashed.run(capsys, "--dry-run")

    assert snapshot(crashed.node.root) == before
    assert {e["outcome"] for e in report["entries"]} == {"planned"}
    assert {(r["action"], r["outcome"]) for r in report["host_local"]} == {
        ("del", "planned"),
        ("quarantine", "planned"),
    }
    assert code == ExitCode.ACTION_FAILED  # the unconfigured network's orphan gets no DEL


# Orphaned reservations: the owner a DEL is run for comes from the file.


def recording_network(crashed: Crashed, name: str, subnet: str, seen: Path) -> Path:
    """A network of one plugin that records what each DEL hands it, with host-local as its
    IPAM (so its store is read), and the plugin dir holding it."""
    bin_dir = crashed.node.fake_plugin_network(
        name, "record", f'echo "$CNI_CONTAINERID|$CNI_IFNAME" >> "{seen}"\n'
    )
    conf = {
        "cniVersion": "1.0.0",
        "name": name,
        "plugins": [{"type": "record", "ipam": {"type": "host-local", "subnet": subnet}}],
    }
    crashed.node.write_conf(f"60-{name}.conflist", json.dumps(conf).encode())
    return bin_dir


@pytest.mark.parametrize(
    "owner",
    [
        "../../../../etc/cni/net.d/10-hl.conflist\r\neth0",  # a path as the container ID
        f"{CONTAINER_IDS[5]}\r\n../../x",  # a path as the interface name
        f"{CONTAINER_IDS[5]}\r\neth0:1",
        f"{CONTAINER_IDS[5]}\r\nan-interface-name-too-long",
        "-rf\r\neth0",
        f"{CONTAINER_IDS[5]}\r\neth0\r\nmore",  # lines no DEL matches
    ],
)
def test_an_owner_libcni_would_never_have_named_gets_no_del(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path, owner: str
) -> None:
    """host-local writes the container ID and ifname libcni handed it, and libcni refuses
    both at ADD unless they are names (ValidateContainerID, ValidateInterfaceName). A file
    that says otherwise was not written by a DEL-able attachment: plugins join these into
    paths (flannel's and multus's scratch files, tuning's backups), so none is run with
    them; the address is released into the quarantine like any unreadable reservation."""
    seen = tmp_path / "seen"
    bin_dir = recording_network(crashed, "fg", "10.60.0.0/24", seen)
    store = crashed.ipam / "fg"
    store.mkdir(parents=True)
    (store / "10.60.0.9").write_bytes(owner.encode())
    crashed.reboot()

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir))

    assert not seen.exists(), seen.read_text()
    r = reservations_of(report)["10.60.0.9"]
    assert (r["action"], r["outcome"], r["owner"]) == ("quarantine", "done", None), r
    assert not (store / "10.60.0.9").exists()
    assert code == ExitCode.OK


def test_an_orphan_of_a_network_no_conf_names_is_deleted_with_the_config_a_forgotten_entry_cached(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """The network's only whole entry is of a forgotten sandbox: DEL'd and moved to the
    quarantine first. The config it cached still serves the orphan's DEL."""
    forgotten = crashed.add(A)
    crashed.add(B)
    os.unlink(crashed.node.results / f"hl-{B}-eth0")  # the node died before libcni's write
    os.unlink(crashed.node.conf_dir / "10-hl.conflist")  # the network was removed since
    containerd_knows(crashed, KNOWN)
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert by_path(report)[forgotten.name]["outcome"] == "done"
    (r,) = report["host_local"]
    assert r["owner"]["container_id"] == B
    assert r["del"]["config"] == f"the config cached in {forgotten.name}", r
    assert (r["del"]["plugins_run"], r["quarantined_to"]) == (["host-local"], None)
    assert crashed.ips() == {}
    assert code == ExitCode.OK


# DELs the deadline leaves unattempted: a whole entry and an orphan keep what their DEL needs.


def test_after_the_deadline_a_forgotten_entry_and_its_address_wait_for_the_next_run(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """No DEL starts after the deadline. A damaged file is moved all the same (the runtime's
    own DEL aborts on it); a whole entry blocks nobody, and moving it would throw away the
    cached result, args and config its DEL needs, which no one else will ever run: it stays,
    and so does its address, for the next run's DEL."""
    entries = [crashed.add(cid) for cid in (A, B)]
    held = crashed.ips()
    containerd_knows(crashed, KNOWN)
    crashed.reboot()

    code, report = crashed.run(capsys, "--deadline", "0.001")

    for entry in entries:
        e = by_path(report)[entry.name]
        assert (e["action"], e["outcome"], e["quarantined_to"]) == (
            "del-and-quarantine",
            "failed",
            None,
        ), e
        assert "deadline" in e["plugin_errors"][0]["msg"]
        assert entry.exists()
    assert crashed.ips() == held
    assert all(r["outcome"] != "done" for r in report["host_local"]), report["host_local"]
    assert code == ExitCode.ACTION_FAILED

    code, report = crashed.run(capsys)  # a later run of the boot, with time

    assert [by_path(report)[e.name]["outcome"] for e in entries] == ["done", "done"]
    assert crashed.ips() == {}
    assert code == ExitCode.OK


def test_after_the_deadline_an_orphan_waits_for_the_next_run(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed.add(A)
    os.unlink(crashed.node.results / f"hl-{A}-eth0")
    held = crashed.ips()
    crashed.reboot()

    code, report = crashed.run(capsys, "--deadline", "0.001")

    (r,) = report["host_local"]
    assert (r["action"], r["outcome"], r["quarantined_to"]) == ("del", "failed", None), r
    assert "deadline" in r["del"]["plugin_errors"][0]["msg"]
    assert crashed.ips() == held
    assert code == ExitCode.ACTION_FAILED

    code, report = crashed.run(capsys)

    (r,) = report["host_local"]
    assert (r["outcome"], r["del"]["plugins_run"]) == ("done", ["host-local"])
    assert crashed.ips() == {}


def test_listing_the_kept_reservations_does_not_change_the_exit_code(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed.add(KNOWN)
    containerd_knows(crashed, KNOWN)
    crashed.reboot()

    quiet, _ = crashed.run(capsys, "--dry-run")
    verbose, report = crashed.run(capsys, "--dry-run", "-v")

    (r,) = report["host_local"]
    assert (r["action"], r["outcome"]) == ("keep", "skipped")
    assert verbose == quiet == ExitCode.OK
    assert report["summary"]["exit_code"] == ExitCode.OK


# Liveness: what the records on disk say never outweighs a container that runs.


def test_a_running_container_the_records_call_forgotten_is_never_deleted(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """meta.db does not name A (read while containerd runs, or damaged in a way that reads
    whole), but containerd keeps live task state for A, and for B, whose reservation has no
    results entry: with --force, neither is DEL'd nor released; the dead C is."""
    for cid in (A, B, C):
        crashed.add(cid)
    os.unlink(crashed.node.results / f"hl-{B}-eth0")
    held = crashed.ips()
    containerd_knows(crashed, KNOWN)
    crashed.reboot()
    crashed.node.record_before_runtime(crashed.t0, crashed.ipam / "hl")
    crashed.node.runtime_starts()
    for cid in (A, B):
        task = crashed.node.root / "run/containerd/io.containerd.runtime.v2.task/k8s.io" / cid
        task.mkdir(parents=True)

    code, report = crashed.run(capsys, "--force")

    entries = by_path(report)
    alive = entries[f"hl-{A}-eth0"]
    assert (alive["action"], alive["outcome"]) == ("leave", "skipped"), alive
    assert "live state" in alive["reason"]
    assert entries[f"hl-{C}-eth0"]["outcome"] == "done"
    left = {r["owner"]["container_id"]: r["action"] for r in report["host_local"]}
    assert left == {A: "leave", B: "leave"}
    assert {ip: o for ip, o in held.items() if C not in o} == crashed.ips()
    assert code == ExitCode.DATA


def test_reservations_rewritten_while_the_run_acts_are_left_as_they_are_now(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """With --force and a runtime up, host-local may hand out an address again as soon as a
    DEL frees it. Here the DEL of A's orphan stands in for that: it rewrites the reservation
    of B, whose DEL comes next, and writes into the empty file bound for the quarantine.
    Neither is DEL'd or moved: they are no longer what the plan was made on."""
    store = crashed.ipam / "fg"
    new_owner = f"{CONTAINER_IDS[9]}\r\neth0".encode()
    script = (
        f'if [ "$CNI_CONTAINERID" = {A} ]; then\n'
        f"  printf '%s\\r\\neth0' {CONTAINER_IDS[9]} > {store}/10.60.0.3\n"
        f"  printf '%s\\r\\neth0' {CONTAINER_IDS[9]} > {store}/10.60.0.4\n"
        f"  rm -f {store}/10.60.0.2\n"
        "fi\n"
    )
    bin_dir = crashed.node.fake_plugin_network("fg", "rewrite", script)
    conf = {
        "cniVersion": "1.0.0",
        "name": "fg",
        "plugins": [{"type": "rewrite", "ipam": {"type": "host-local", "subnet": "10.60.0.0/24"}}],
    }
    crashed.node.write_conf("60-fg.conflist", json.dumps(conf).encode())
    store.mkdir(parents=True)
    (store / "10.60.0.2").write_bytes(f"{A}\r\neth0".encode())
    (store / "10.60.0.3").write_bytes(f"{B}\r\neth0".encode())
    (store / "10.60.0.4").write_bytes(b"")
    crashed.reboot()

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir))

    found = reservations_of(report)
    assert (found["10.60.0.2"]["outcome"], found["10.60.0.2"]["del"]["released"]) == (
        "done",
        ["10.60.0.2"],
    )
    for ip in ("10.60.0.3", "10.60.0.4"):
        assert found[ip]["outcome"] == "skipped", found[ip]
        assert (store / ip).read_bytes() == new_owner
    assert code == ExitCode.DATA


def test_a_reservation_with_no_entry_in_the_results_dir_is_an_orphan_whoever_knows_its_sandbox(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """Multus caches its delegates' results in its own dir: the pod's entry in the results
    dir is multus's network, its address is reserved under the delegate's (here hl, with no
    entry of its own). containerd knows the sandbox, but its DEL goes through the networks it
    loads, not necessarily this one: the address is an orphan (issue 14 point 3), DEL'd
    through hl's config. The sandbox is an earlier boot's, dead; the runtime's later DEL
    through multus finds it done. Multus's own entry is kept for that DEL."""
    crashed.add(KNOWN)
    os.rename(
        crashed.node.results / f"hl-{KNOWN}-eth0",
        crashed.node.root / f"var/lib/cni/hl-{KNOWN}-eth0",  # as if in multus's cache
    )
    multus = {"cniVersion": "1.0.0", "name": "mn", "plugins": [{"type": "host-local"}]}
    data = cache_entry_bytes(json.dumps(multus).encode(), "mn", KNOWN, "eth0")
    crashed.node.write_result(f"mn-{KNOWN}-eth0", data)
    containerd_knows(crashed, KNOWN)
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert by_path(report)[f"mn-{KNOWN}-eth0"]["action"] == "keep"
    (r,) = report["host_local"]
    assert (r["action"], r["outcome"]) == ("del", "done"), r
    assert crashed.ips() == {}
    assert code == ExitCode.OK


def test_with_the_results_dir_deleted_every_reservation_is_an_orphan(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the EKS AMI does at boot: the whole results dir gone. Both addresses are DEL'd as
    orphans, the known sandbox's too (its runtime's later DEL, with no cached result, finds it
    done)."""
    for cid in (KNOWN, A):
        crashed.add(cid)
    shutil.rmtree(crashed.node.results)
    containerd_knows(crashed, KNOWN)
    crashed.reboot()

    code, report = crashed.run(capsys)

    found = {r["owner"]["container_id"]: r for r in report["host_local"]}
    assert (found[KNOWN]["action"], found[A]["action"]) == ("del", "del")
    assert {r["outcome"] for r in found.values()} == {"done"}
    assert crashed.ips() == {}
    assert code == ExitCode.OK


# --root on a rescue machine: the node's paths never lead to the machine's own files.


def test_a_store_of_no_configured_network_that_is_a_symlink_is_never_read(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A subdir of the node's default dataDir that is a symlink, absolute or relative out of
    the root, to a store of this machine's: no reservation there is read, DEL'd or moved."""
    elsewhere = tmp_path / "machine-store"
    elsewhere.mkdir()
    (elsewhere / "10.90.0.2").write_bytes(f"{A}\r\neth0".encode())
    (elsewhere / "10.90.0.3").write_bytes(b"")
    crashed.ipam.mkdir(parents=True)
    (crashed.ipam / "ghost").symlink_to(elsewhere)
    (crashed.ipam / "ghost2").symlink_to(os.path.relpath(elsewhere, crashed.ipam))
    before = snapshot(elsewhere)
    crashed.reboot()

    code, report = crashed.run(capsys, "-v")

    assert snapshot(elsewhere) == before
    assert report["host_local"] == []
    assert code == ExitCode.OK


def test_a_containerd_root_the_nodes_config_names_absolutely_is_read_inside_the_root(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """The node's containerd keeps its root at /srv/containerd, an absolute symlink there to
    /var/lib/containerd: followed from the rescue machine it names the machine's own. The
    records read are the node's: its known sandbox kept, its forgotten one DEL'd."""
    config = crashed.node.root / "etc/containerd/config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('version = 2\nroot = "/srv/containerd"\n')
    (crashed.node.root / "srv").mkdir()
    (crashed.node.root / "srv/containerd").symlink_to("/var/lib/containerd")
    for cid in (KNOWN, A):
        crashed.add(cid)
    containerd_knows(crashed, KNOWN)  # at ROOT/var/lib/containerd
    crashed.reboot()

    code, report = crashed.run(capsys)

    entries = by_path(report)
    assert entries[f"hl-{KNOWN}-eth0"]["action"] == "keep"
    assert entries[f"hl-{A}-eth0"]["outcome"] == "done"
    assert any(
        str(crashed.node.root / "srv/containerd") in line and "1 sandbox" in line
        for line in report["runtime_records"]
    ), report["runtime_records"]
    assert code == ExitCode.OK


def crio_sandboxes(
    crashed: Crashed, with_config: tuple[str, ...], without: tuple[str, ...]
) -> None:
    """CRI-O's storage holding pod sandboxes, with their config.json (CRI-O can load them)
    or without (written after the CNI ADD: a crash before it leaves none)."""
    storage = crashed.node.root / "var/lib/containers/storage/overlay-containers"
    storage.mkdir(parents=True)
    entries = []
    for sandbox_id in (*with_config, *without):
        metadata = {"pod": True, "pod-name": "web", "pod-id": sandbox_id}
        entries.append({"id": sandbox_id, "metadata": json.dumps(metadata)})
        userdata = storage / sandbox_id / "userdata"
        userdata.mkdir(parents=True)
        if sandbox_id in with_config:
            (userdata / "config.json").write_text('{"ociVersion": "1.0.2"}')
    (storage / "containers.json").write_text(json.dumps(entries))


def test_crio_started_in_this_boot_keeps_what_it_will_still_del(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """A by-hand run with --force after CRI-O started (its version file in /run): a sandbox
    CRI-O can load is one it will DEL when kubelet stops it, kept; one it cannot load (no
    config.json), and one it has no record of, are DEL'd."""
    loadable, unloadable = KNOWN, B
    entries = {cid: crashed.add(cid) for cid in (loadable, unloadable, A)}
    crio_sandboxes(crashed, (loadable,), (unloadable,))
    crashed.reboot()
    crashed.node.record_before_runtime(crashed.t0, crashed.ipam / "hl")
    version = crashed.node.root / "run/crio/version"
    version.parent.mkdir(parents=True)
    version.write_text("1.30.0")

    code, report = crashed.run(capsys, "--force")

    found = by_path(report)
    kept = found[entries[loadable].name]
    assert kept["action"] == "keep", kept
    assert "has started in this boot" in kept["reason"]
    for cid in (unloadable, A):
        assert found[entries[cid].name]["outcome"] == "done", found[entries[cid].name]
    assert [o.split("\r\n")[0] for o in crashed.ips().values()] == [loadable]
    assert code == ExitCode.OK


def test_a_reservation_hard_linked_to_another_file_moves_only_its_own_name(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """A damaged reservation that is a second name of the node's network config: its name is
    moved to the quarantine, the config keeps its own, byte for byte."""
    conf = crashed.node.conf_dir / "10-hl.conflist"
    data = conf.read_bytes()
    store = crashed.ipam / "hl"
    store.mkdir(parents=True)
    os.link(conf, store / "10.22.0.77")
    crashed.reboot()

    code, report = crashed.run(capsys)

    r = reservations_of(report)["10.22.0.77"]
    assert (r["content"], r["action"], r["outcome"]) == ("garbage", "quarantine", "done"), r
    assert conf.read_bytes() == data
    assert not (store / "10.22.0.77").exists()
    assert code == ExitCode.OK


def test_one_owner_in_two_networks_gets_one_del_in_each(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """A's addresses in two networks, neither with a results entry: each is released by its
    own network's DEL, with its own config and store."""
    crashed.add(A)
    ipam = {"type": "host-local", "ranges": [[{"subnet": "10.23.0.0/24"}]]}
    conf = {"cniVersion": "1.0.0", "name": "h2", "plugins": [{"type": "host-local", "ipam": ipam}]}
    crashed.node.write_conf("20-h2.conflist", json.dumps(conf).encode())
    store = crashed.ipam / "h2"
    store.mkdir(parents=True)
    (store / "10.23.0.2").write_bytes(f"{A}\r\neth0".encode())
    os.unlink(crashed.node.results / f"hl-{A}-eth0")
    crashed.reboot()

    code, report = crashed.run(capsys)

    found = reservations_of(report)
    assert {ip: r["del"]["released"] for ip, r in found.items()} == {
        "10.22.0.2": ["10.22.0.2"],
        "10.23.0.2": ["10.23.0.2"],
    }
    assert crashed.ips() == {} and not (store / "10.23.0.2").exists()
    assert code == ExitCode.OK


def test_with_no_results_dir_a_running_container_keeps_its_address(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """The results dir is gone; A's reservation predates this boot, and a runtime keeps live
    task state for A (podman, for one, starts a container again under its old ID): with
    --force, nothing alive is torn down, whatever its reservations say. The dead B's address
    is released."""
    crashed.add(A)
    crashed.add(B)
    shutil.rmtree(crashed.node.results)
    crashed.reboot()
    crashed.node.record_before_runtime(crashed.t0, crashed.ipam / "hl")
    crashed.node.runtime_starts()
    task = crashed.node.root / "run/containerd/io.containerd.runtime.v2.task/k8s.io" / A
    task.mkdir(parents=True)

    code, report = crashed.run(capsys, "--force")

    found = {r["owner"]["container_id"]: r for r in report["host_local"]}
    assert found[A]["action"] == "leave", found[A]
    assert "live state" in found[A]["reason"]
    assert found[B]["outcome"] == "done"
    assert [o.split("\r\n")[0] for o in crashed.ips().values()] == [A]
    assert code == ExitCode.DATA


def test_id_only_reservations_follow_the_entry_of_their_container(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """ID-only reservations (plugins before v0.8.0) name no ifname: KNOWN's goes with its
    whole, kept entry on net1; B's with its forgotten one on net1, whose DEL releases it
    (host-local's ReleaseByID falls back to the ID alone)."""
    for cid in (KNOWN, B):
        crashed.add(cid, "net1")
    for ip, owner in crashed.ips().items():
        (crashed.ipam / "hl" / ip).write_bytes(owner.split("\r\n")[0].encode())
    held = crashed.ips()
    containerd_knows(crashed, KNOWN)
    crashed.reboot()

    code, report = crashed.run(capsys)

    found = by_path(report)
    assert found[f"hl-{KNOWN}-net1"]["action"] == "keep"
    forgotten = found[f"hl-{B}-net1"]
    assert (forgotten["outcome"], len(forgotten["del"]["released"])) == ("done", 1), forgotten
    assert crashed.ips() == {ip: o for ip, o in held.items() if o == KNOWN}
    assert report["host_local"] == []
    assert code == ExitCode.OK


def test_on_a_node_with_containerd_and_crio_either_runtime_keeps_what_it_will_del(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    for cid in (KNOWN, B, A):
        crashed.add(cid)
    containerd_knows(crashed, KNOWN)
    crio_sandboxes(crashed, (B,), ())
    crashed.reboot()

    code, report = crashed.run(capsys)

    found = by_path(report)
    assert [found[f"hl-{cid}-eth0"]["action"] for cid in (KNOWN, B)] == ["keep", "keep"]
    assert found[f"hl-{A}-eth0"]["outcome"] == "done"
    assert sorted(o.split("\r\n")[0] for o in crashed.ips().values()) == sorted([KNOWN, B])
    assert code == ExitCode.OK


def test_a_reservation_that_is_a_symlink_is_never_followed(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(f"{A}\r\neth0".encode())
    store = crashed.ipam / "hl"
    store.mkdir(parents=True)
    (store / "10.22.0.88").symlink_to(target)
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert target.read_bytes() == f"{A}\r\neth0".encode()
    assert report["host_local"] == []
    assert code == ExitCode.OK


def test_a_store_lock_someone_holds_does_not_hold_the_run_past_its_deadline(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """host-local's lock held by something that never lets go (a plugin stuck in an ADD of a
    runtime that runs, with --force): the quarantine of that store fails at the deadline."""
    store = crashed.ipam / "hl"
    store.mkdir(parents=True)
    (store / "10.22.0.7").write_bytes(b"")
    crashed.reboot()
    holder = os.open(store / "lock", os.O_RDONLY | os.O_CREAT, 0o600)
    fcntl.flock(holder, fcntl.LOCK_EX)
    done: list[tuple[int, dict[str, Any]]] = []
    runner = threading.Thread(
        target=lambda: done.append(crashed.run(capsys, "--deadline", "2")), daemon=True
    )
    try:
        runner.start()
        runner.join(30)
        waited_on = runner.is_alive()
    finally:
        os.close(holder)  # lets a run that waited on it go on
        runner.join(30)
    assert not waited_on, "the run waited for host-local's lock past its deadline"
    code, report = done[0]
    r = reservations_of(report)["10.22.0.7"]
    assert (r["outcome"], "lock" in r["problem"]) == ("failed", True), r
    assert (store / "10.22.0.7").exists()
    assert code == ExitCode.ACTION_FAILED


def test_a_forgotten_entry_whose_del_fails_is_moved_and_its_address_released_exit_73(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """The DEL ran and failed (a plugin's CNI error): the entry is moved as the policy says,
    the address it holds goes to the quarantine under host-local's lock (no one else will
    release it), and the run says a DEL failed."""
    store = crashed.ipam / "fg"
    bin_dir = crashed.node.fake_plugin_network(
        "fg", "fail", 'echo \'{"cniVersion":"1.0.0","code":11,"msg":"try again"}\'\nexit 1\n'
    )
    conf = {
        "cniVersion": "1.0.0",
        "name": "fg",
        "plugins": [{"type": "fail", "ipam": {"type": "host-local", "subnet": "10.60.0.0/24"}}],
    }
    crashed.node.write_conf("60-fg.conflist", json.dumps(conf).encode())
    entry = crashed.node.write_result(
        f"fg-{A}-eth0", cache_entry_bytes(json.dumps(conf).encode(), "fg", A, "eth0")
    )
    store.mkdir(parents=True)
    (store / "10.60.0.5").write_bytes(f"{A}\r\neth0".encode())
    containerd_knows(crashed, KNOWN)
    crashed.reboot()

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir))

    e = by_path(report)[entry.name]
    assert (e["outcome"], e["plugin_errors"][0]["msg"]) == ("failed", "try again"), e
    assert e["quarantined_to"] is not None and not entry.exists()
    r = reservations_of(report)["10.60.0.5"]
    assert (r["action"], r["outcome"]) == ("quarantine", "done"), r
    assert not (store / "10.60.0.5").exists()
    assert code == ExitCode.ACTION_FAILED
