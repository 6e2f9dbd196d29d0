"""Addresses a crash or a reboot left reserved with no results entry to tell any runtime to DEL
them: released by a DEL through their network's config, with the real host-local; what no DEL
can release goes to the quarantine; what this boot reserved, or a runtime will release, stays."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni_reaper import cli, failpoint, host_local
from cni_reaper.boot import Written, WrittenVerdict
from cni_reaper.errors import ExitCode
from cni_reaper.filestat import FileStat
from cni_reaper.journal import EventLog
from cni_reaper.netconf import parse_conf_bytes
from cni_reaper.plugin import ChainCache, PluginDirs
from cni_reaper.reservations import (
    EntryFate,
    EntryFates,
    PlannedReservation,
    ReservationAction,
    ReservationPlanner,
    ThroughMultus,
    claimed_or_riding,
)
from tests.bolt_writer import containerd_sandbox, write_db
from tests.crashed import Crashed
from tests.nodetree import CONTAINER_IDS, PLUGIN_DIR, cache_entry_bytes, snapshot

QUARANTINE_BOOT = "11111111-2222-3333-4444-555555555555"


def reservations_of(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["ip"]: r for r in report["host_local"]}


def test_results_deleted_outright_leave_no_address_reserved(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the EKS AMI and Bottlerocket do at boot: every results file gone."""
    for container_id in CONTAINER_IDS[:3]:
        crashed.add(container_id)
    held = crashed.ips()
    assert len(held) == 3
    shutil.rmtree(crashed.node.results)
    crashed.reboot()

    code, report = crashed.run(capsys, "--dry-run")
    assert code == ExitCode.OK
    assert {r["action"] for r in report["host_local"]} == {"del"}
    assert crashed.ips() == held  # a dry run changes nothing

    code, report = crashed.run(capsys)

    assert code == ExitCode.OK
    assert crashed.ips() == {}
    for ip, r in reservations_of(report).items():
        assert (r["action"], r["outcome"], r["quarantined_to"]) == ("del", "done", None)
        assert r["del"]["released"] == [ip]
        assert r["del"]["plugins_run"] == ["host-local"]
        assert r["owner"] == {"container_id": held[ip].split("\r\n")[0], "ifname": "eth0"}
    (pool,) = report["pools"]
    assert (pool["network"], pool["capacity"], pool["reserved_before"]) == ("hl", 253, 3)
    assert (pool["released"], pool["left"], pool["free"]) == (3, 0, 253)


def test_an_id_only_reservation_is_released_by_its_container_id(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """Stores written before plugins v0.8.0 hold the container ID alone; host-local's DEL
    releases those by the ID whatever ifname comes."""
    store = crashed.ipam / "hl"
    store.mkdir(parents=True)
    (store / "10.22.0.7").write_bytes(CONTAINER_IDS[1].encode())
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert code == ExitCode.OK
    assert not (store / "10.22.0.7").exists()
    r = reservations_of(report)["10.22.0.7"]
    assert r["owner"] == {"container_id": CONTAINER_IDS[1], "ifname": None}
    assert (r["del"]["ifname"], r["outcome"]) == ("eth0", "done")


def test_an_address_reserved_in_this_boot_stays(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed.reboot()
    assert crashed.run(capsys)[0] == ExitCode.OK  # the unit's run, before the runtime
    crashed.node.runtime_starts()
    crashed.add(CONTAINER_IDS[2])  # the runtime's ADD
    os.unlink(crashed.node.results / f"hl-{CONTAINER_IDS[2]}-eth0")  # its cache not yet written
    held = crashed.ips()
    before = snapshot(crashed.node.root)

    code, report = crashed.run(capsys, "--force")

    assert crashed.ips() == held
    assert report["host_local"] == []  # kept, and not listed without -v
    assert code == ExitCode.OK
    (pool,) = report["pools"]
    assert pool["left_by_owner"] == {"current-boot": 1}
    assert snapshot(crashed.node.root).keys() >= before.keys()


def test_with_no_del_possible_it_goes_to_the_quarantine(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """A network whose chain names a plugin that is nowhere: no DEL can run, the address is
    released under host-local's lock into the quarantine, with its sidecar."""
    conf = {
        "cniVersion": "1.0.0",
        "name": "gone",
        "plugins": [
            {"type": "no-such-plugin", "ipam": {"type": "host-local", "subnet": "10.40.0.0/24"}}
        ],
    }
    crashed.node.write_conf("20-gone.conflist", json.dumps(conf).encode())
    store = crashed.ipam / "gone"
    store.mkdir(parents=True)
    (store / "10.40.0.2").write_bytes(f"{CONTAINER_IDS[0]}\r\neth0".encode())
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert code == ExitCode.ACTION_FAILED  # released all the same; the DEL could not run
    r = reservations_of(report)["10.40.0.2"]
    assert (r["action"], r["outcome"]) == ("del", "done")
    assert "no-such-plugin" in r["del"]["config_problem"]
    dest = crashed.node.quarantine / QUARANTINE_BOOT / "host-local/gone/10.40.0.2"
    assert r["quarantined_to"] == str(dest)
    assert dest.read_bytes() == f"{CONTAINER_IDS[0]}\r\neth0".encode()
    assert json.loads(dest.with_name("10.40.0.2.json").read_text())["owner"]["ifname"] == "eth0"
    assert not (store / "10.40.0.2").exists()


def test_a_network_no_longer_configured_is_deleted_with_the_config_an_entry_cached(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed.add(CONTAINER_IDS[0])  # whole: the runtime's own DEL will use it
    crashed.add(CONTAINER_IDS[1])
    os.unlink(crashed.node.results / f"hl-{CONTAINER_IDS[1]}-eth0")  # the node died here
    os.unlink(crashed.node.conf_dir / "10-hl.conflist")  # the network was removed since
    kept_ip = next(ip for ip, owner in crashed.ips().items() if CONTAINER_IDS[0] in owner)
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert code == ExitCode.OK
    assert list(crashed.ips()) == [kept_ip]
    (r,) = report["host_local"]
    assert r["del"]["config"] == f"the config cached in hl-{CONTAINER_IDS[0]}-eth0"
    assert r["del"]["plugins_run"] == ["host-local"]


def test_one_del_releases_every_address_of_a_dual_stack_attachment(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    ipam = {
        "type": "host-local",
        "ranges": [
            [{"subnet": "10.50.0.0/24", "rangeStart": "10.50.0.10", "rangeEnd": "10.50.0.19"}],
            [{"subnet": "fd00:50::/64"}],
        ],
    }
    conf = {"cniVersion": "1.0.0", "name": "hl", "plugins": [{"type": "host-local", "ipam": ipam}]}
    crashed.node.write_conf("10-hl.conflist", json.dumps(conf).encode())
    crashed.add(CONTAINER_IDS[3])
    assert len(crashed.ips()) == 2
    shutil.rmtree(crashed.node.results)
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert code == ExitCode.OK
    assert crashed.ips() == {}
    released = {tuple(r["del"]["released"]) for r in report["host_local"]}
    assert released == {("10.50.0.10", "fd00:50::2")}
    pools = {p["range_set"]: p for p in report["pools"]}
    assert (pools[0]["capacity"], pools[0]["released"]) == (10, 1)
    assert (pools[1]["capacity"], pools[1]["released"]) == ((1 << 64) - 2, 1)


def test_the_text_report_shows_the_pools(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    crashed.add(CONTAINER_IDS[0])
    shutil.rmtree(crashed.node.results)
    crashed.reboot()

    code = cli.run(crashed.argv("--dry-run"), clock=lambda: crashed.t0 + 60, environ={})
    out = capsys.readouterr().out
    assert code == ExitCode.OK
    assert "pool hl range set 0: 253 addresses, 1 reserved before, 1 to release, 0 left" in out
    assert "released" not in out.split("summary:")[0].split("pool hl")[1]  # a dry run releases none
    assert f"host-local reservation valid of {CONTAINER_IDS[0]} eth0" in out


def test_pool_health_reaches_the_metrics_file_and_the_journal_summary(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    for container_id in CONTAINER_IDS[:2]:
        crashed.add(container_id)
    os.unlink(crashed.node.results / f"hl-{CONTAINER_IDS[0]}-eth0")
    crashed.reboot()
    metrics = tmp_path / "cni-reaper.prom"
    logged: list[dict[str, str]] = []
    events = EventLog(lambda **fields: logged.append(fields))

    code, _ = crashed.run(capsys, "--metrics-file", str(metrics), events=events)

    assert code == ExitCode.OK
    text = metrics.read_text()
    assert 'cni_reaper_pool_capacity{network="hl",range_set="0"} 253' in text
    assert 'cni_reaper_pool_released{network="hl",range_set="0"} 1' in text
    assert 'cni_reaper_pool_left{network="hl",range_set="0",owner="runtime"} 1' in text
    (summary,) = [f for f in logged if f.get("CNI_REAPER_EVENT") == "summary"]
    assert summary["CNI_REAPER_POOLS"] == "hl/0=1/253"
    assert summary["CNI_REAPER_ADDRESSES_RELEASED"] == "1"


@pytest.mark.parametrize("container_id", [CONTAINER_IDS[4], "web-1.scratch_2"])
def test_an_id_only_reservation_whose_container_has_a_kept_entry_is_kept(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], container_id: str
) -> None:
    """The old format names no ifname: any whole entry of the container in the network that
    the runtime will DEL keeps it; of an ID no Kubernetes runtime makes too, which libcni
    takes (cnitool's, a script's; until 2026-12-07 such a one was DEL'd as an orphan)."""
    crashed.add(container_id, "net1")
    ((ip, _),) = crashed.ips().items()
    (crashed.ipam / "hl" / ip).write_bytes(container_id.encode())  # as plugins < 0.8 wrote
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert code == ExitCode.OK
    assert crashed.ips() == {ip: container_id}
    assert report["host_local"] == []
    (pool,) = report["pools"]
    assert pool["left_by_owner"] == {"runtime": 1}


def test_the_report_says_where_each_runtime_path_came_from(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    config = crashed.node.root / "etc/containerd/config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('version = 2\nroot = "/data/containerd"\n[grpc]\naddress = "/run/ctr.sock"\n')
    crashed.reboot()

    _, report = crashed.run(capsys, "--dry-run")

    paths = {(p["kind"], p["path"]): p for p in report["runtime_paths"]}
    socket = paths[("socket", str(crashed.node.root / "run/ctr.sock"))]
    assert (socket["runtime"], socket["in_effect"]) == ("containerd", True)
    assert socket["source"] == f"{config}: [grpc] address"
    root = paths[("persistent-root", str(crashed.node.root / "data/containerd"))]
    assert root["source"] == f"{config}: root"
    default = paths[("socket", str(crashed.node.root / "run/containerd/containerd.sock"))]
    assert (default["source"], default["in_effect"]) == ("default", False)


def test_past_the_deadline_no_reservation_is_moved_and_the_run_says_so(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bounded time: the quarantine of a large store stops at --deadline; what is left stays
    reserved for the next run, and the run ends 73."""
    store = crashed.ipam / "hl"
    store.mkdir(parents=True)
    for n in range(2, 40):
        (store / f"10.22.0.{n}").write_bytes(b"")
    crashed.reboot()

    code, report = crashed.run(capsys, "--deadline", "0.000001")

    assert code == ExitCode.ACTION_FAILED
    assert {r["outcome"] for r in report["host_local"]} == {"failed"}
    assert all("deadline" in r["problem"] for r in report["host_local"])
    assert len([p for p in store.iterdir() if p.name.startswith("10.")]) == 38


def test_under_root_the_file_system_witness_says_it_cannot_speak_for_the_root(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """The live kernel log and udev describe this machine: under --root the file system's
    crash record is not consulted, and the report says why (evidence/fs_crash.py)."""
    crashed.reboot()

    _, report = crashed.run(capsys, "--dry-run")

    record = report["file_system"]
    assert record["verdict"] == "unknown"
    assert "describe this machine, not the root's" in record["detail"]
    assert record["consulted"] is False


def test_a_delegates_address_multus_will_release_is_no_orphan(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """Multus runs its delegates through libcni with its own cache dir: the delegate's entry is
    in /var/lib/cni/multus/results, the runtime's entry is Multus's own. A sandbox the runtime
    knows gets Multus's DEL, which DELs the delegate and releases its address: the reaper
    leaves that address to it. Of a sandbox no runtime will tear down, the address is an
    orphan as any other: nobody's DEL will come."""
    known, forgotten = CONTAINER_IDS[:2]
    delegates = crashed.node.root / "var/lib/cni/multus/results"
    delegates.mkdir(parents=True)
    for container_id in (known, forgotten):
        entry = crashed.add(container_id)  # the delegate's ADD, as Multus runs it
        entry.rename(delegates / entry.name)
    multus = {"cniVersion": "0.3.1", "name": "multus-cni-network", "type": "multus"}
    conf = json.dumps(multus).encode()
    crashed.node.write_result(
        f"multus-cni-network-{known}-eth0",
        cache_entry_bytes(conf, "multus-cni-network", known, "eth0"),
    )
    meta_db = crashed.node.root / "var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db"
    meta_db.parent.mkdir(parents=True)
    write_db(meta_db, [containerd_sandbox("k8s.io", known)], no_freelist_sync=True)
    held = crashed.ips()
    crashed.reboot()

    code, report = crashed.run(capsys, "-v")

    assert code == ExitCode.OK, report
    by_owner = {r["owner"]["container_id"]: r for r in report["host_local"]}
    kept = by_owner[known]
    assert kept["action"] == "keep", kept
    assert f"Multus cached it as a delegate's ({delegates / f'hl-{known}-eth0'})" in kept["reason"]
    assert by_owner[forgotten]["action"] == "del", by_owner[forgotten]
    assert list(crashed.ips().values()) == [f"{known}\r\neth0"]
    assert len(held) == 2
    assert (delegates / f"hl-{known}-eth0").exists()


def _store_of_every_kind(crashed: Crashed) -> dict[str, str]:
    """Two orphans (their results entries lost in the crash), one reservation a whole entry
    keeps, one whose content names no owner (no DEL can release it: it goes to the
    quarantine), one too large to read (left): and host-local's own lock and
    last_reserved_ip files, which are no addresses."""
    for container_id in CONTAINER_IDS[:3]:
        crashed.add(container_id)
    for container_id in CONTAINER_IDS[:2]:
        os.unlink(crashed.node.results / f"hl-{container_id}-eth0")
    store = crashed.ipam / "hl"
    (store / "10.22.0.200").write_bytes(b"\x00\x01 not an owner")
    (store / "10.22.0.201").write_bytes(b"x" * 5000)
    assert {"lock", "last_reserved_ip.0"} <= set(os.listdir(store))
    crashed.reboot()
    return crashed.ips()


def test_a_dry_run_counts_the_pools_as_the_real_run_then_leaves_them(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dry run counts the store from the listing its inventory took (it changes nothing
    before or after it): what it says of each pool is what the real run then does."""
    held = _store_of_every_kind(crashed)

    code, dry = crashed.run(capsys, "--dry-run")
    assert code == ExitCode.OK
    assert crashed.ips() == held
    code, real = crashed.run(capsys)

    assert code == ExitCode.OK
    assert len(crashed.ips()) == len(held) - 3
    (pool,) = dry["pools"]
    assert (pool["reserved_before"], pool["released"], pool["left"]) == (5, 3, 2)
    assert dry["pools"] == real["pools"]


def test_a_dry_run_counts_what_it_plans_not_what_a_runtime_released_meanwhile(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run by hand on a live node, a dry run races the runtime's own ADDs and DELs. Its pools
    say what it would release, of the store it judged: not an address the runtime released
    after the listing, nor one it reserved since."""
    held = _store_of_every_kind(crashed)
    store = crashed.ipam / "hl"
    kept = next(ip for ip, owner in held.items() if CONTAINER_IDS[2] in owner)

    def runtime_at_work() -> None:
        os.unlink(store / kept)  # the runtime's DEL of the kept attachment
        (store / "10.22.0.99").write_bytes(f"{CONTAINER_IDS[5]}\r\neth0".encode())

    failpoint.interfere(host_local.STORE_LISTED, runtime_at_work)
    try:
        code, dry = crashed.run(capsys, "--dry-run")
    finally:
        failpoint.interfere(host_local.STORE_LISTED, None)

    assert code == ExitCode.OK
    planned = {r["ip"]: r["action"] for r in dry["host_local"] if r["outcome"] == "planned"}
    assert planned.keys() == set(held) - {kept, "10.22.0.201"}
    (pool,) = dry["pools"]
    assert (pool["reserved_before"], pool["released"], pool["left"]) == (5, 3, 2)
    assert "10.22.0.99" in crashed.ips()  # a dry run leaves the runtime's work as it found it


def fake_plugin_with_host_local(
    crashed: Crashed, name: str, script: str, subnet: str
) -> tuple[Path, Path]:
    """A network name whose one plugin is a script of that name, with host-local as its IPAM
    (there, to pass the chain's checks: the script never calls it) on subnet.0/24; the plugin
    dir and the network's store, made empty."""
    bin_dir = crashed.node.fake_plugin_network(name, name, script)
    shutil.copy2(Path(PLUGIN_DIR) / "host-local", bin_dir)
    ipam = {"type": "host-local", "ranges": [[{"subnet": f"{subnet}.0/24"}]]}
    conf = {"cniVersion": "1.0.0", "name": name, "plugins": [{"type": name, "ipam": ipam}]}
    crashed.node.write_conf(f"60-{name}.conflist", json.dumps(conf).encode())
    store = crashed.ipam / name
    store.mkdir(parents=True)
    return bin_dir, store


def test_an_address_a_del_that_exited_0_left_is_said_to_be_still_reserved_after_it(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """A plugin that exits 0 on DEL but never hands the DEL to its IPAM (a failure mode no
    real plugin shows on cue): the DEL ran, every plugin exited 0, and the address is still
    reserved. The entry's DEL failed, and says why; the address goes to the quarantine, and
    its reason says the DEL ran and left it, not that it failed or could not run."""
    bin_dir, store = fake_plugin_with_host_local(crashed, "forgetful", "exit 0\n", "10.30.0")
    (store / "10.30.0.2").write_bytes(f"{CONTAINER_IDS[0]}\r\neth0".encode())
    crashed.node.results.mkdir(parents=True)
    (crashed.node.results / f"forgetful-{CONTAINER_IDS[0]}-eth0").write_bytes(b"")
    crashed.reboot()

    code = cli.run(
        ["--json", "--root", str(crashed.node.root), "--bin-dir", str(bin_dir)],
        clock=lambda: crashed.t0 + 60,
        environ={},
    )
    report = json.loads(capsys.readouterr().out)

    assert code == ExitCode.ACTION_FAILED
    (entry,) = report["entries"]
    assert (entry["outcome"], entry["del"]["plugins_run"]) == ("failed", ["forgetful"])
    assert f"every plugin exited 0, but {store} still holds 10.30.0.2" in json.dumps(entry)
    (held,) = report["host_local"]
    assert (held["ip"], held["action"], held["outcome"]) == ("10.30.0.2", "quarantine", "done")
    assert held["reason"] == "still reserved after the DEL of its results entry"
    assert not (store / "10.30.0.2").exists()


# As an entry's error says it:
FAILED_DEL = "plugin type='failing' failed (CNI error 11): try again; busy"
STILL_RESERVED = "DEL failed, and the address is still reserved"


def orphan_whose_del_fails(crashed: Crashed) -> tuple[Path, Path]:
    """An orphaned address whose DEL fails with a CNI error that has details; the plugin dir
    and the reservation."""
    error = '{"cniVersion":"1.0.0","code":11,"msg":"try again","details":"busy"}'
    bin_dir, store = fake_plugin_with_host_local(
        crashed, "failing", f"echo '{error}'\nexit 1\n", "10.31.0"
    )
    reservation = store / "10.31.0.2"
    reservation.write_bytes(f"{CONTAINER_IDS[0]}\r\neth0".encode())
    crashed.reboot()
    return bin_dir, reservation


def test_the_text_report_says_a_failed_del_of_an_orphan_once(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """The address goes to the quarantine all the same. Its lines say the plugin's error once,
    as a results entry's do, and the problem says what the failure left."""
    bin_dir, reservation = orphan_whose_del_fails(crashed)

    code = cli.run(
        ["--root", str(crashed.node.root), "--bin-dir", str(bin_dir)],
        clock=lambda: crashed.t0 + 60,
        environ={},
    )
    out = capsys.readouterr().out

    assert code == ExitCode.ACTION_FAILED
    assert out.count("try again") == 1, out
    assert f"    error: {FAILED_DEL}\n    problem: {STILL_RESERVED}\n    moved to " in out, out
    assert not reservation.exists()
    # What makes the run exit 73 when every reservation was done:
    said = "host-local reservations: 1 done, 0 failed, 0 left alone (1 of them moved after a DEL"
    assert f"{said} that failed or could not run); exit 73\n" in out, out


def test_the_journal_record_of_a_failed_del_of_an_orphan_has_its_plugin_errors(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """As a results entry's record has them, in their field; the JSON keeps them whole."""
    bin_dir, reservation = orphan_whose_del_fails(crashed)
    logged: list[dict[str, str]] = []

    code, report = crashed.run(
        capsys, "--bin-dir", str(bin_dir), events=EventLog(lambda **f: logged.append(f))
    )

    assert code == ExitCode.ACTION_FAILED
    (record,) = [f for f in logged if f.get("CNI_REAPER_FILE") == str(reservation)]
    assert record["CNI_REAPER_PLUGIN_ERRORS"] == FAILED_DEL
    assert record["CNI_REAPER_PROBLEMS"] == STILL_RESERVED
    (held,) = [r for r in report["host_local"] if r["ip"] == "10.31.0.2"]
    (error,) = held["del"]["plugin_errors"]
    assert (error["code"], error["msg"], error["details"]) == (11, "try again", "busy")
    assert held["problem"] == STILL_RESERVED


_NAME_PART = st.text("ab1-._", min_size=1, max_size=4)
_IDS = st.sampled_from([CONTAINER_IDS[0], CONTAINER_IDS[1], "a", "a-b", "a.1", "b_a"])


@settings(max_examples=300)
@given(
    entries=st.lists(
        st.tuples(st.sampled_from(["hl", "hl-b"]), _IDS, _NAME_PART, st.booleans()),
        max_size=12,
        unique_by=lambda entry: entry[:3],
    ),
    asked=st.lists(st.tuples(st.sampled_from(["hl", "hl-b"]), _IDS), min_size=1, max_size=6),
)
def test_an_id_only_owners_entries_are_found_by_every_name_that_begins_with_its_own(
    entries: list[tuple[str, str, str, bool]], asked: list[tuple[str, str]]
) -> None:
    """Whatever IDs and network names the results dir holds, and whatever dashes they share,
    an ID-only reservation's entry is any named '<network>-<id>-<ifname>' (kept when it is
    still there, else what the run noted of it): the names are indexed or sorted once, and
    each owner is looked up in them, never by listing the dir again."""
    present = {f"{n}-{c}-{i}" for n, c, i, kept in entries if kept}
    listed = sorted({f"{n}-{c}-{i}" for n, c, i, _ in entries})
    listings = []

    def names() -> list[str]:
        listings.append(1)
        return listed

    fates = EntryFates(present.__contains__, names)
    for n, c, i, kept in entries:
        if not kept:
            fates.note(n, c, i, EntryFate.DELETED)
    deleted = {(n, c, i) for n, c, i, kept in entries if not kept}
    for network, container_id in asked:
        # The model: every name listed, each that begins with the owner's prefix an entry of
        # it, a kept one winning over a deleted one, the first ifname in order among equals.
        prefix = f"{network}-{container_id}-"
        found = {}
        for name in listed:
            if name.startswith(prefix):
                ifname = name[len(prefix) :]
                if (network, container_id, ifname) in deleted:
                    found[ifname] = EntryFate.DELETED
                elif name in present:
                    found[ifname] = EntryFate.KEPT
        expected: tuple[EntryFate | None, str | None] = (None, None)
        for fate in (EntryFate.KEPT, EntryFate.DELETED):
            first = min((i for i, f in found.items() if f is fate), default=None)
            if first is not None:
                expected = (fate, first)
                break
        assert fates.of(_id_only(network, container_id)) == expected
    assert len(listings) <= 2  # once for the index of hex IDs, once sorted for the others


_FATES_NOTED = st.sampled_from(
    [EntryFate.KEPT, EntryFate.DELETED, EntryFate.DEL_FAILED, EntryFate.LEFT, EntryFate.MOVED]
)


@settings(max_examples=400)
@given(
    entries=st.lists(
        st.tuples(
            st.sampled_from(["multus", "hl", "hl-b"]),
            _IDS,
            st.sampled_from(["eth0", "net1"]),
            _FATES_NOTED,
            st.booleans(),
        ),
        max_size=10,
        unique_by=lambda entry: entry[:3],
    ),
    held=st.lists(
        st.tuples(
            st.sampled_from(["multus", "hl", "hl-b"]), _IDS, st.sampled_from(["eth0", "net1", None])
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_an_orphan_whose_owner_s_multus_entry_was_left_says_so(
    entries: list[tuple[str, str, str, EntryFate, bool]],
    held: list[tuple[str, str, str | None]],
) -> None:
    """Model (ReservationPlanner over EntryFates): an address of an earlier boot with no entry
    of its own network is an orphan, whatever became of its owner's other entries; where its
    owner has an entry whose DEL through Multus was held back (left, its config running
    Multus), whose delegates keep it, its reason names that entry, where it said "no results
    entry for it". Every other address is planned by its own entry's fate where it has one
    (one moved aside with no DEL: as if none), as a plain orphan otherwise."""
    present = {f"{n}-{c}-{i}" for n, c, i, fate, _ in entries if fate is EntryFate.KEPT}
    names = sorted({f"{n}-{c}-{i}" for n, c, i, _, _ in entries})
    fates = EntryFates(present.__contains__, lambda: names)
    for network, container_id, ifname, fate, runs_multus in entries:
        fates.note(network, container_id, ifname, fate, runs_multus)
    planner = ReservationPlanner(
        fates, lambda _: None, lambda _: (None, "no config"), ChainCache(PluginDirs(())), {}
    )
    left_through: dict[str, str] = {}
    for network, container_id, _, fate, runs in entries:
        if fate is EntryFate.LEFT and runs:
            left_through.setdefault(container_id, network)
    own_fate = {
        EntryFate.KEPT: ReservationAction.KEEP,
        EntryFate.LEFT: ReservationAction.LEAVE,
        EntryFate.DELETED: ReservationAction.QUARANTINE,
        EntryFate.DEL_FAILED: ReservationAction.QUARANTINE,
    }
    for network, container_id, owner_ifname in held:
        file = FileStat("file", 0, 0.0, 0.0, 0, 0, 0, 0)
        written = WrittenVerdict(Written.PREVIOUS_BOOT, "a model's")
        owner = host_local.Owner(container_id, owner_ifname)
        r = host_local.Reservation(network, "", "10.22.0.2", 0, file, "valid", owner, written)
        its_own, _ = fates.of(r)
        planned = planner(r)
        if its_own in own_fate:
            assert planned.action is own_fate[its_own], (its_own, planned)
            continue
        assert planned.action is ReservationAction.DEL, planned
        through = left_through.get(container_id) if its_own is None else None
        if through is None:
            assert planned.reason.startswith("an orphan: no results entry for it"), planned
        else:
            assert planned.reason.startswith(
                "no results entry of its network names it, and its owner's results entry of "
                f"{through}, whose DEL through Multus releases it, was left for a later run"
            ), planned


def _id_only(network: str, container_id: str) -> host_local.Reservation:
    file = FileStat("file", 0, 0.0, 0.0, 0, 0, 0, 0)
    written = WrittenVerdict(Written.PREVIOUS_BOOT, "a model's")
    owner = host_local.Owner(container_id, None)
    return host_local.Reservation(network, "", "10.22.0.2", 0, file, "valid", owner, written)


_STORES = ("/s/own", "/s/extra", "/s/third")
_OWNERS = ("a" * 64, "b" * 64)
_IPS = ("10.0.0.1", "10.0.0.2")


@st.composite
def _planned_orphans(draw: st.DrawFn) -> list[PlannedReservation]:
    """Orphans over a few stores, owners and addresses: some DEL'd with their own config,
    some with none that can run, some only quarantined; some DELs through Multus, holding delegates'
    addresses (some of which are other orphans) or none."""
    file = FileStat("file", 0, 0.0, 0.0, 0, 0, 0, 0)
    written = WrittenVerdict(Written.PREVIOUS_BOOT, "a model's")
    planned = []
    for store, ip, owner, action, problem, holds in draw(
        st.lists(
            st.tuples(
                st.sampled_from(_STORES),
                st.sampled_from(_IPS),
                st.sampled_from(_OWNERS),
                st.sampled_from([ReservationAction.DEL, ReservationAction.QUARANTINE]),
                st.sampled_from([None, "no config"]),
                st.none()
                | st.lists(st.tuples(st.sampled_from(_STORES), st.sampled_from(_IPS)), max_size=3),
            ),
            max_size=8,
        )
    ):
        network = store.rsplit("/", 1)[1]
        r = host_local.Reservation(
            network, store, ip, 0, file, "valid", host_local.Owner(owner, "net1"), written
        )
        netlist = parse_conf_bytes(
            json.dumps({"cniVersion": "1.0.0", "name": network, "type": "x"}).encode(),
            f"{network}.conf",
            True,
        )
        hold = None
        if holds is not None:
            hold = ThroughMultus(tuple(host_local.Held(s, "net1", (i,)) for s, i in holds), ())
        planned.append(
            PlannedReservation(
                r, action, "an orphan", "failed", netlist, None, problem, "eth0", hold
            )
        )
    return planned


@settings(max_examples=400, deadline=None)
@given(_planned_orphans(), st.sets(st.sampled_from([s.rsplit("/", 1)[1] for s in _STORES])))
def test_an_orphan_rides_only_on_a_del_that_releases_it_and_no_del_is_added(
    planned: list[PlannedReservation], refused_networks: set[str]
) -> None:
    """Model (reservations.claimed_or_riding): an orphan rides only on another orphan's DEL
    that runs (its claim granted) and holds the orphan's address for its owner in its store;
    one whose claim was granted never rides; a claim refused, or a DEL through Multus that would not
    release its own orphan, leaves that DEL not run; one that cannot run may still ride;
    nothing else changes; no DEL is added; and no orphan a DEL that runs releases is left
    out of it, unless its own DEL, which runs, releases it too (found by the second attack
    review of the riding: one pass settled an orphan before the DEL that released it)."""
    before = list(planned)
    asked: list[int] = []
    # a claim is refused to every DEL of a network alike (another attachment's, planned before)
    refused = {n for n, p in enumerate(before) if p.netlist and p.netlist.name in refused_networks}

    def claim(p: PlannedReservation) -> str | None:
        n = next(n for n, b in enumerate(before) if b is p)
        asked.append(n)
        return "claimed before" if n in refused else None

    def del_of(p: PlannedReservation) -> tuple[str, str, str | None] | None:
        owner = p.reservation.owner
        runs = p.action is ReservationAction.DEL and p.config_problem is None
        if not runs or p.netlist is None or owner is None:
            return None
        return p.netlist.name, owner.container_id, p.del_ifname

    def holds(runner: PlannedReservation, p: PlannedReservation) -> bool:
        r = p.reservation
        return runner.reservation.owner == r.owner and any(
            h.store == r.store and r.ip in h.addresses
            for h in (runner.through_multus.hold if runner.through_multus else ())
        )

    claimed_or_riding(planned, claim, lambda store: store)

    assert len(planned) == len(before) and len(asked) == len(set(asked))
    for n, (old, new) in enumerate(zip(before, planned)):
        if new.riding:
            assert old.action is ReservationAction.DEL and (n not in asked or n in refused)
            runners = [q for q in planned if not q.riding and del_of(q) and holds(q, old)]
            assert any((q.netlist, q.del_ifname) == (new.netlist, new.del_ifname) for q in runners)
            assert new._replace(reason=old.reason) == old._replace(
                netlist=new.netlist,
                config_problem=None,
                del_ifname=new.del_ifname,
                through_multus=None,
                riding=True,
            )
        elif new != old:
            assert old.through_multus is not None or n in refused
            assert new == old._replace(config_problem=new.config_problem, through_multus=None)
            assert new.config_problem == "claimed before" or not holds(old, old)
        else:
            assert n not in refused or n not in asked
        if new.action is ReservationAction.DEL and not new.riding:
            by_running = [q for q in planned if del_of(q) and del_of(q) != del_of(new)]
            if any(holds(q, new) for q in by_running if not q.riding):
                assert del_of(new) is not None and holds(new, new)
    assert {del_of(p) for p in planned} - {None} <= {del_of(p) for p in before} - {None}
