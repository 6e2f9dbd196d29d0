"""What host-local's DEL releases is every file under its store whose content, trimmed as Go
trims it, names the owner (ReleaseByID: filepath.Walk, subdirectories too; the ID alone if no
file names the ifname), not the one address the reaper planned. A DEL runs only when each of
them is a reservation this run proves an earlier boot made (found by an attacker's review:
an orphan's DEL released an address of the same owner reserved in this boot, one in a nested
store, one too large for the inventory to read, while the report said they were kept)."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni_reaper import host_local, multus, pre_runtime
from cni_reaper.errors import ExitCode
from cni_reaper.netconf import NetworkConfigs, NetworkList, kinds_run, parse_conf_bytes
from cni_reaper.node_root import RootBinds
from tests.crashed import Crashed
from tests.nodetree import CONTAINER_IDS, PLUGIN_DIR, cache_entry_bytes, host_local_conflist
from tests.private_node import cannot_run, unshare

A, B = CONTAINER_IDS[:2]
OWNER_A = f"{A}\r\neth0".encode()
BOOT_ID = "11111111-2222-3333-4444-555555555555"  # NodeTree's
REPO = Path(__file__).resolve().parent.parent


def orphaned(crashed: Crashed, *container_ids: str) -> Path:
    """Each container's address in hl's store, its results entry lost: orphans."""
    for container_id in container_ids:
        crashed.add(container_id)
    shutil.rmtree(crashed.node.results)
    crashed.node.results.mkdir(mode=0o700)
    return crashed.ipam / "hl"


def first_run_recorded(crashed: Crashed, store: Path) -> None:
    """The reboot, and this boot's first run's record of the results dir and the store."""
    crashed.reboot()
    crashed.node.record_before_runtime(crashed.t0 + 20, store)


def by_ip(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["ip"]: r for r in report["host_local"]}


def test_an_orphans_del_is_not_run_past_an_address_of_its_owner_reserved_in_this_boot(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    store = orphaned(crashed, A)
    first_run_recorded(crashed, store)
    (store / "10.22.0.50").write_bytes(OWNER_A)  # a runtime's ADD of the same owner, later
    held = crashed.ips()

    code, dry = crashed.run(capsys, "--dry-run", "-v")
    assert code == ExitCode.DATA
    code, real = crashed.run(capsys, "-v")

    assert code == ExitCode.DATA
    assert crashed.ips() == held
    for report in (dry, real):
        orphan, fresh = by_ip(report)["10.22.0.2"], by_ip(report)["10.22.0.50"]
        assert (orphan["action"], orphan["outcome"], orphan["del"]) == ("leave", "skipped", None)
        assert orphan["reason"] == (
            f"host-local's DEL would also release {store / '10.22.0.50'}, which was written "
            "current-boot: not in this boot's pre-runtime record: written since a runtime "
            "could start"
        )
        assert (fresh["action"], fresh["written"]) == ("keep", "current-boot")
    (pool,) = real["pools"]
    assert (pool["released"], pool["left"], pool["left_by_owner"]) == (
        0,
        2,
        {"current-boot": 1, "left": 1},
    )


def test_nor_past_one_changed_since_the_record(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """The record holds the second address, but not as it is now (its ctime moved): the
    reaper keeps it, so no DEL of its owner may release it behind the report's back."""
    store = orphaned(crashed, A)
    (store / "10.22.0.50").write_bytes(OWNER_A)
    first_run_recorded(crashed, store)
    time.sleep(0.01)
    (store / "10.22.0.50").chmod(0o600)
    held = crashed.ips()

    code, report = crashed.run(capsys, "-v")

    assert code == ExitCode.DATA
    assert crashed.ips() == held
    found = by_ip(report)
    assert found["10.22.0.2"]["action"] == "leave"
    assert "which was written current-boot: changed since" in found["10.22.0.2"]["reason"]
    assert found["10.22.0.50"]["action"] == "keep"


def test_nor_past_one_in_a_directory_within_the_store(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """A network whose dataDir is hl's store keeps its own store inside it: host-local's DEL
    of hl walks into it. No record holds what lies there."""
    store = orphaned(crashed, A)
    inner = json.loads(host_local_conflist("inner", "10.33.0.0/24"))
    for plugin in inner["plugins"]:
        if "ipam" in plugin:
            plugin["ipam"]["dataDir"] = "/var/lib/cni/networks/hl"
    crashed.node.write_conf("20-inner.conflist", json.dumps(inner).encode())
    first_run_recorded(crashed, store)
    (store / "inner").mkdir()
    (store / "inner/10.33.0.7").write_bytes(OWNER_A)

    code, report = crashed.run(capsys)

    assert code == ExitCode.DATA
    assert (store / "10.22.0.2").exists() and (store / "inner/10.33.0.7").exists()
    orphan = by_ip(report)["10.22.0.2"]
    assert orphan["reason"] == (
        f"host-local's DEL would also release {store / 'inner/10.33.0.7'}, which lies in a "
        "directory no pre-runtime record holds"
    )


def test_an_entrys_del_is_not_run_past_its_address_changed_since_the_record(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """A damaged entry's DEL releases its owner's address too: one this run cannot prove an
    earlier boot reserved leaves the entry alone, whole where it is."""
    entry = crashed.add(A)
    entry.write_bytes(b"")
    store = crashed.ipam / "hl"
    first_run_recorded(crashed, store)
    time.sleep(0.01)
    (store / "10.22.0.2").chmod(0o600)

    code, dry = crashed.run(capsys, "--dry-run")
    assert code == ExitCode.DATA
    code, report = crashed.run(capsys)

    assert code == ExitCode.DATA
    assert entry.exists() and (store / "10.22.0.2").exists()
    for doc in (dry, report):
        (found,) = doc["entries"]
        assert (found["action"], found["outcome"]) == ("leave", "skipped")
        assert found["reason"].startswith(
            f"host-local's DEL would also release {store / '10.22.0.2'}, which was written "
            "current-boot: changed since this boot's pre-runtime record was taken"
        )


def test_what_the_inventory_cannot_read_is_read_as_host_local_reads_it(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """A's second address is padded past what a reservation holds, which host-local trims
    away: A's DEL would release it, and nothing says an earlier boot wrote it as it is now, so
    it is not run. B's second address ends in a no-break space, which Go trims too: B's DEL
    releases both, and the report says so."""
    store = orphaned(crashed, A, B)
    (store / "10.22.0.60").write_bytes(OWNER_A + b" " * 5000)
    (store / "10.22.0.61").write_bytes(f"{B}\r\neth0\u00a0".encode())
    crashed.reboot()  # the first run: every file predates the runtime

    code, report = crashed.run(capsys)

    assert code == ExitCode.DATA
    assert sorted(crashed.ips()) == ["10.22.0.2", "10.22.0.60"]
    found = by_ip(report)
    assert found["10.22.0.2"]["action"] == "leave"
    assert found["10.22.0.2"]["reason"] == (
        f"host-local's DEL would also release {store / '10.22.0.60'}, which holds "
        f"{len(OWNER_A) + 5000} bytes, more than host-local writes"
    )
    assert found["10.22.0.61"]["content"] == "valid"
    assert found["10.22.0.61"]["owner"] == {"container_id": B, "ifname": "eth0"}
    for ip in ("10.22.0.3", "10.22.0.61"):
        assert (found[ip]["action"], found[ip]["outcome"]) == ("del", "done")
        assert found[ip]["del"]["released"] == ["10.22.0.3", "10.22.0.61"]


def test_a_symlink_in_the_store_stops_every_del_through_it(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """host-local reads through a symlink in its store; the reaper never follows one, so what
    any DEL would release there cannot be told."""
    store = orphaned(crashed, A)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(OWNER_A)
    (store / "10.22.0.9").symlink_to(elsewhere)
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert code == ExitCode.DATA
    assert (store / "10.22.0.2").exists() and (store / "10.22.0.9").is_symlink()
    assert elsewhere.read_bytes() == OWNER_A
    assert by_ip(report)["10.22.0.2"]["reason"] == (
        f"host-local's DEL reads every file of {store}, and {store / '10.22.0.9'} is a "
        "symlink: what else it would release cannot be told"
    )


# Around an owner: Go's spaces (ASCII's six, NEL, NBSP, Unicode's), what is no space to Go
# (the separators \x1c and \x1f, which str.isspace takes; a zero-width space; a BOM) and bytes
# that are no UTF-8 (a lone NEL or NBSP byte).
GO_SPACES = [" ", "\t", "\n", "\r", "\v", "\f", "\x85", "\xa0", "\u1680", "\u2003", "\u3000"]
NO_GO_SPACES = ["\x1c", "\x1f", "\u200b", "\ufeff"]
PADDING = st.lists(
    st.sampled_from([*GO_SPACES, "\u2028", "\u205f", *NO_GO_SPACES]).map(str.encode)
    | st.sampled_from([b"\x85", b"\xa0", b"\xc2"]),
    max_size=3,
).map(b"".join)


@pytest.mark.netns
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.tuples(PADDING, st.booleans(), PADDING), min_size=1, max_size=5))
def test_the_reaper_reads_an_owner_as_the_real_host_local_releases_it(
    crashed: Crashed, files: list[tuple[bytes, bool, bytes]]
) -> None:
    """go_trim_space() and read_owner(), against the real plugin's DEL of A eth0: each file it
    releases is one whose trimmed content names A eth0 (or A alone, when none does)."""
    store = crashed.node.root / "hl-oracle"
    shutil.rmtree(store, ignore_errors=True)
    (store / "hl").mkdir(parents=True)
    contents = {}
    for n, (before, full, after) in enumerate(files):
        content = before + (OWNER_A if full else A.encode()) + after
        (store / "hl" / f"10.22.1.{n}").write_bytes(content)
        contents[f"10.22.1.{n}"] = content
    exact = {ip for ip, c in contents.items() if host_local.go_trim_space(c) == OWNER_A}
    id_only = {ip for ip, c in contents.items() if host_local.go_trim_space(c) == A.encode()}
    for ip in exact:
        assert host_local.read_owner(contents[ip])[1] == host_local.Owner(A, "eth0")

    conf = json.loads(host_local_conflist("hl", "10.22.0.0/16"))
    ipam = next(p["ipam"] for p in conf["plugins"] if "ipam" in p)
    stdin = {"cniVersion": conf["cniVersion"], "name": "hl", "type": "host-local"}
    stdin["ipam"] = {**ipam, "dataDir": str(store)}
    env = {"CNI_COMMAND": "DEL", "CNI_CONTAINERID": A, "CNI_IFNAME": "eth0", "CNI_NETNS": ""}
    subprocess.run(
        ["unshare", "--net", "--mount", f"{PLUGIN_DIR}/host-local"],
        input=json.dumps(stdin).encode(),
        env={**env, "CNI_PATH": PLUGIN_DIR, "PATH": os.environ.get("PATH", "")},
        check=True,
        capture_output=True,
    )

    released = set(contents) - set(os.listdir(store / "hl"))
    assert released == (exact or id_only)


def test_a_chain_that_reaches_host_local_through_a_delegating_plugin_is_checked_too(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """flannel's config names no IPAM: its DEL runs the delegate config it keeps in its scratch
    file, whose host-local keeps the store named after the network in the default dataDir.
    That store, which the run finds by name, is checked (found by the review of the check)."""
    flannel = (
        '[ "$CNI_COMMAND" = DEL ] || exit 0\n'
        'f=/var/lib/cni/flannel/"$CNI_CONTAINERID"\n'
        '[ -f "$f" ] || exit 0\n'
        f'{PLUGIN_DIR}/bridge < "$f"; rc=$?; rm -f "$f"; exit $rc\n'
    )
    bin_dir = crashed.node.fake_plugin_network("cbr0", "flannel", flannel)
    root = crashed.node.root
    store = root / "var/lib/cni/networks/cbr0"
    store.mkdir(parents=True)
    (store / "10.244.0.5").write_bytes(OWNER_A)
    scratch = root / "var/lib/cni/flannel"
    scratch.mkdir(parents=True)
    delegate: dict[str, Any] = {"cniVersion": "1.0.0", "name": "cbr0", "type": "bridge"}
    delegate["ipam"] = {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]]}
    (scratch / A).write_text(json.dumps(delegate))
    entry = crashed.node.write_result(f"cbr0-{A}-eth0", b"")
    first_run_recorded(crashed, store)
    (store / "10.244.0.6").write_bytes(OWNER_A)

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir))

    assert code == ExitCode.DATA
    assert entry.exists() and sorted(os.listdir(store)) == ["10.244.0.5", "10.244.0.6"]
    (found,) = report["entries"]
    assert (found["action"], found["del"]) == ("leave", None)
    assert found["reason"].startswith(f"host-local's DEL would also release {store / '10.244.0.6'}")


def two_host_locals(crashed: Crashed, second_data_dir: str) -> tuple[Path, Path, Path]:
    """A chain whose two plugins each run host-local with a store of its own; a damaged
    entry of A, and an address of A in the second store reserved in this boot."""
    root = crashed.node.root

    def ipam(data_dir: str, subnet: str) -> dict[str, Any]:
        return {"type": "host-local", "dataDir": data_dir, "ranges": [[{"subnet": subnet}]]}

    plugins = [
        {"type": "host-local", "ipam": ipam("/var/lib/cni/a", "10.50.0.0/24")},
        {"type": "host-local", "ipam": ipam(second_data_dir, "10.51.0.0/24")},
    ]
    conf = {"cniVersion": "1.0.0", "name": "two", "plugins": plugins}
    crashed.node.write_conf("30-two.conflist", json.dumps(conf).encode())
    first, second = root / "var/lib/cni/a/two", Path(second_data_dir) / "two"
    if not second.is_absolute() or str(second).startswith("/var/"):
        second = root / str(second).lstrip("/")
    for store, ip in ((first, "10.50.0.2"), (second, "10.51.0.2")):
        store.mkdir(parents=True)
        (store / ip).write_bytes(OWNER_A)
    entry = crashed.node.write_result(f"two-{A}-eth0", b"")
    crashed.reboot()
    crashed.node.record_before_runtime(crashed.t0 + 20, first, second)
    (second / "10.51.0.9").write_bytes(OWNER_A)
    return entry, first, second


@pytest.mark.parametrize("where", ["in the root", "outside the root"])
def test_a_chain_that_runs_host_local_twice_runs_no_del(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path, where: str
) -> None:
    """Only one store a network is read, and bound for a --root: a DEL through a chain that
    runs host-local twice would release from the other unseen, and under a --root from this
    machine's own files where that dataDir lies outside the root (found by the review of the
    check). It is a DEL that cannot run: the damaged entry is quarantined, as for a missing
    config."""
    outside = tmp_path / "machine-side"
    second_data_dir = "/var/lib/cni/b" if where == "in the root" else str(outside)
    entry, _, second = two_host_locals(crashed, second_data_dir)

    code, report = crashed.run(capsys)

    assert code == ExitCode.ACTION_FAILED
    assert sorted(os.listdir(second)) == ["10.51.0.2", "10.51.0.9"]
    assert not entry.exists()
    (found,) = report["entries"]
    assert (found["outcome"], found["del"]["plugins_run"]) == ("failed", [])
    assert found["plugin_errors"][0]["msg"] == (
        "the chain of two runs host-local 2 times, each keeping a store of its own: its DEL "
        "would release from stores this run does not read"
    )


@pytest.mark.parametrize("data_dir", ["/etc", "/srv/ipam", "/var/lib", "/run/systemd/journal"])
def test_under_root_a_data_dir_outside_the_places_of_state_is_not_bound_and_runs_no_del(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], data_dir: str
) -> None:
    """A dataDir the node's config names was bound from the --root over this machine's dir of
    that name, in the namespace where the plugins and the reaper's own thread run as root:
    with "/etc", the node's ld.so.preload for every dynamically linked plugin (Debian's are),
    with a library or Python dir, the node's code. Only one below /var or /run is bound; a
    network whose dataDir lies elsewhere runs no DEL, its damaged entry quarantined as for a
    DEL that cannot run (found by reading confine.py's binds as a rescue box's operator)."""
    ipam = {"type": "host-local", "dataDir": data_dir, "ranges": [[{"subnet": "10.62.0.0/24"}]]}
    conf = {"cniVersion": "1.0.0", "name": "hx", "plugins": [{"type": "host-local", "ipam": ipam}]}
    crashed.node.write_conf("40-hx.conflist", json.dumps(conf).encode())
    store = crashed.node.root / data_dir.lstrip("/") / "hx"
    store.mkdir(parents=True)
    (store / "10.62.0.2").write_bytes(OWNER_A)
    entry = crashed.node.write_result(f"hx-{A}-eth0", b"")
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert code == ExitCode.ACTION_FAILED
    assert not entry.exists()
    (found,) = report["entries"]
    assert (found["outcome"], found["del"]["plugins_run"]) == ("failed", [])
    assert found["plugin_errors"][0]["msg"] == (
        f"host-local's dataDir is not bound for the plugins under {crashed.node.root}: "
        f"{data_dir} is not in a dir of CNI's own below /var/lib or /run (named cni...): bound "
        "there, the node's files would stand for this machine's own; no DEL of this network runs"
    )
    # The earlier boot's address released all the same, by the reaper under host-local's
    # lock in the root's own store, as for any DEL that cannot run.
    (address,) = report["host_local"]
    assert (address["action"], address["outcome"], address["del"]) == ("quarantine", "done", None)
    assert "10.62.0.2" not in os.listdir(store)


def hx_network(crashed: Crashed, data_dir: str) -> dict[str, Any]:
    """Network hx, host-local alone keeping its store in data_dir (10.62.0.0/24), in the
    conf dir; returns its config."""
    ipam = {"type": "host-local", "dataDir": data_dir, "ranges": [[{"subnet": "10.62.0.0/24"}]]}
    conf = {"cniVersion": "1.0.0", "name": "hx", "plugins": [{"type": "host-local", "ipam": ipam}]}
    crashed.node.write_conf("40-hx.conflist", json.dumps(conf).encode())
    return conf


def sealed_run(crashed: Crashed, in_the_way: str, *extra: str) -> tuple[int, dict[str, Any]]:
    """One run of its own, in a mount namespace where in_the_way is a file of the machine's."""
    sealed = [*unshare(), sys.executable, "-m", "tests.sealed_run", str(crashed.t0 + 60)]
    argv = [*sealed, in_the_way, "--", *crashed.argv("--json", *extra)]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.stdout, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def test_under_root_a_data_dir_whose_mount_point_cannot_be_made_stops_only_its_network(
    crashed: Crashed,
) -> None:
    """A dataDir whose mount point cannot be made on this machine (a file of its own in the
    way) refused the whole run (exit 75), every other network's repair with it: now only that
    network runs no DEL, as for a dataDir that may not be bound, and the dry run says so too
    (found by the attack review of 2dee816, F5)."""
    if os.geteuid() != 0:
        cannot_run("needs root to make a private mount namespace")
    entry_a = crashed.add(A)
    entry_a.write_bytes(b"")
    hx_network(crashed, "/run/cni-blocked/ipam")
    store = crashed.node.root / "run/cni-blocked/ipam/hx"
    store.mkdir(parents=True)
    (store / "10.62.0.2").write_bytes(f"{B}\r\neth0".encode())
    entry_b = crashed.node.write_result(f"hx-{B}-eth0", b"")
    crashed.reboot()
    refusal = (
        f"host-local's dataDir is not bound for the plugins under {crashed.node.root}: the mount "
        "point /run/cni-blocked/ipam cannot be made: /run/cni-blocked is no directory; no DEL of "
        "this network runs"
    )

    code, dry = sealed_run(crashed, "/run/cni-blocked", "--dry-run")

    assert code == ExitCode.ACTION_FAILED  # as the real run will end
    assert refusal in dry["warnings"]
    planned = {e["network"]: e for e in dry["entries"]}
    assert (planned["hl"]["del"]["config_problem"], planned["hx"]["del"]["config_problem"]) == (
        None,
        refusal,
    )

    code, report = sealed_run(crashed, "/run/cni-blocked")

    assert code == ExitCode.ACTION_FAILED
    assert not entry_a.exists() and not entry_b.exists()
    found = {e["network"]: e for e in report["entries"]}
    assert (found["hl"]["outcome"], found["hl"]["del"]["plugins_run"]) == ("done", ["host-local"])
    assert crashed.ips() == {}
    assert (found["hx"]["outcome"], found["hx"]["del"]["plugins_run"]) == ("failed", [])
    assert found["hx"]["plugin_errors"][0]["msg"] == refusal
    # Its earlier boot's address released all the same, by the reaper under host-local's lock.
    assert "10.62.0.2" not in os.listdir(store)


def test_under_root_a_data_dir_missing_from_the_root_is_deld_as_the_dry_run_said(
    crashed: Crashed,
) -> None:
    """A dataDir a conf names that the root does not hold (nothing reserved there, ever): on
    the node, host-local's DEL would make it and find nothing to release. Its plugins saw an
    empty read-only tmpfs there, so the DEL the dry run planned failed (exit 73 where the dry
    run said 0; found by the attack review of 290d74f, s7): a writable one now, whose writes
    go with the namespace."""
    if os.geteuid() != 0:
        cannot_run("needs root to make a private mount namespace")
    hx_network(crashed, "/run/cni-gone/ipam")
    entry = crashed.node.write_result(f"hx-{B}-eth0", b"")
    crashed.reboot()
    # A file of its own over /run in the run's namespace: the mount point is made there.
    sealed = "/run/cni-sealed/unused"

    code, dry = sealed_run(crashed, sealed, "--dry-run")

    assert code == ExitCode.OK, dry
    (planned,) = dry["entries"]
    assert (planned["action"], planned["del"]["config_problem"]) == ("del-and-quarantine", None)

    code, report = sealed_run(crashed, sealed)

    assert code == ExitCode.OK, report
    (found,) = report["entries"]
    assert (found["outcome"], found["del"]["plugins_run"]) == ("done", ["host-local"])
    assert not entry.exists()
    assert not (crashed.node.root / "run/cni-gone").exists()
    assert f"{crashed.node.root}/run/cni-gone/ipam is missing (" in " ".join(report["warnings"])


def test_under_root_the_store_a_cached_config_keeps_is_judged_alike_dry_and_real(
    crashed: Crashed,
) -> None:
    """A network no conf dir names, whose config a whole entry cached, keeps its store in a
    dataDir refused under the root: its damaged entry gets no DEL. The store was in no
    pre-runtime record: the dry run (which keeps none) took its earlier boot's address for
    one found before any runtime, the real run (judging against the record it kept) for one
    of this boot, and left the entry (dry 73, real 65; found by the attack review of
    290d74f, s10). The stores such configs keep are now recorded with the conf dirs'."""
    if os.geteuid() != 0:
        cannot_run("needs root to make a private mount namespace")
    hx = hx_network(crashed, "/run/cni-blocked/ipam")
    old = json.loads(json.dumps(hx).replace('"hx"', '"old"').replace("10.62.", "10.75."))
    cached = cache_entry_bytes(json.dumps(old).encode(), "old", CONTAINER_IDS[2], "eth0")
    crashed.node.write_result(f"old-{CONTAINER_IDS[2]}-eth0", cached)
    entry = crashed.node.write_result(f"old-{B}-eth0", b"")
    store = crashed.node.root / "run/cni-blocked/ipam/old"
    store.mkdir(parents=True)
    (store / "10.75.0.7").write_bytes(f"{B}\r\neth0".encode())
    crashed.reboot()
    refused = "its cached config's host-local dataDir /run/cni-blocked/ipam is not one the"

    code, dry = sealed_run(crashed, "/run/cni-blocked", "--dry-run")
    real_code, real = sealed_run(crashed, "/run/cni-blocked")

    assert (code, real_code) == (ExitCode.ACTION_FAILED, ExitCode.ACTION_FAILED), real
    planned = {e["path"]: e for e in dry["entries"]}[entry.name]
    found = {e["path"]: e for e in real["entries"]}[entry.name]
    assert (planned["action"], found["action"]) == ("del-and-quarantine", "del-and-quarantine")
    assert refused in planned["del"]["config_problem"] and refused in found["del"]["config_problem"]
    assert (found["outcome"], found["del"]["plugins_run"]) == ("failed", [])
    assert not entry.exists()


def test_under_root_a_data_dir_this_machines_symlink_nests_otherwise_runs_no_del(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A dataDir of /var/run/cni/x, on a machine whose /var/run is /run, as every systemd
    distribution's is: a plugin walks it into the /run/cni mounted from the root, whose x is
    a symlink to this machine's dir, while the reaper read the root's /var/run/cni/x (found
    by the attack review of 290d74f: this machine's file was removed, exit 0; before, the
    check ran inside the namespace and refused the network by accident)."""
    if os.path.realpath("/var/run") != "/run":
        cannot_run("needs this machine's /var/run to be a symlink to /run")
    victim = tmp_path / "victim"
    (victim / "hv").mkdir(parents=True)
    (victim / "hv/10.66.0.7").write_bytes(f"{B}\r\neth0".encode())
    ipam: dict[str, Any] = {"type": "host-local", "dataDir": "/var/run/cni/x"}
    ipam["ranges"] = [[{"subnet": "10.66.0.0/24"}]]
    conf = {"cniVersion": "1.0.0", "name": "hv", "plugins": [{"type": "host-local", "ipam": ipam}]}
    crashed.node.write_conf("40-hv.conflist", json.dumps(conf).encode())
    root = crashed.node.root
    (root / "var/run/cni/x/hv").mkdir(parents=True)
    (root / "run/cni").mkdir(parents=True)
    (root / "run/cni/x").symlink_to(victim)
    entry = crashed.node.write_result(f"hv-{B}-eth0", b"")
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert os.listdir(victim / "hv") == ["10.66.0.7"]
    assert code == ExitCode.ACTION_FAILED
    assert not entry.exists()
    (found,) = report["entries"]
    assert (found["outcome"], found["del"]["plugins_run"]) == ("failed", [])
    assert found["plugin_errors"][0]["msg"].startswith(
        f"host-local's dataDir is not bound for the plugins under {root}: /var/run/cni/x and "
        "/run/cni nest otherwise on this machine"
    )


def test_host_local_as_the_plugin_reads_its_ipam_whatever_type_it_names(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """host-local run as the plugin takes its ipam section as its own, with or without a type
    there: its store is checked as any (found by the review of the check)."""
    ipam = {"ranges": [[{"subnet": "10.60.0.0/24"}]]}
    conf = {"cniVersion": "1.0.0", "name": "hl3", "plugins": [{"type": "host-local", "ipam": ipam}]}
    crashed.node.write_conf("40-hl3.conflist", json.dumps(conf).encode())
    store = crashed.node.root / "var/lib/cni/networks/hl3"
    store.mkdir(parents=True)
    (store / "10.60.0.2").write_bytes(OWNER_A)
    entry = crashed.node.write_result(f"hl3-{A}-eth0", b"")
    first_run_recorded(crashed, store)
    (store / "10.60.0.9").write_bytes(OWNER_A)

    code, report = crashed.run(capsys)

    assert code == ExitCode.DATA
    assert entry.exists() and sorted(os.listdir(store)) == ["10.60.0.2", "10.60.0.9"]
    (found,) = report["entries"]
    assert found["reason"].startswith(f"host-local's DEL would also release {store / '10.60.0.9'}")


def test_a_store_others_may_write_stops_every_del_through_it(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its files are not read (anyone could have put one there, this boot), so what a DEL
    would release from it cannot be told."""
    entry = crashed.add(A)
    entry.write_bytes(b"")
    store = crashed.ipam / "hl"
    store.chmod(0o777)
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert code == ExitCode.DATA
    assert entry.exists() and (store / "10.22.0.2").exists()
    (found,) = report["entries"]
    assert found["reason"] == (
        f"host-local's DEL reads every file of {store}, and it may be written by others than "
        "root: what else it would release cannot be told"
    )


def test_an_entrys_del_is_checked_for_what_host_local_releases_of_an_id_only_store(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """A store that holds both '<id>\\r\\n<ifname>' and the ID alone for one container (plugins
    before and after v0.8.0): host-local's DEL releases only the first, as the real plugin
    shows; the ID-only one is no failure of that DEL."""
    entry = crashed.add(A)
    entry.write_bytes(b"")
    store = crashed.ipam / "hl"
    (store / "10.22.0.9").write_bytes(A.encode())
    first_run_recorded(crashed, store)

    code, report = crashed.run(capsys, "-v")

    assert code == ExitCode.OK
    (found,) = report["entries"]
    assert (found["action"], found["outcome"]) == ("del-and-quarantine", "done")
    assert found["del"]["released"] == ["10.22.0.2"]
    # What the DEL left of the container goes as a reservation of an earlier boot does.
    (legacy,) = report["host_local"]
    assert (legacy["ip"], legacy["action"], legacy["outcome"]) == (
        "10.22.0.9",
        "quarantine",
        "done",
    )
    assert crashed.ips() == {}


FLANNEL = (
    '[ "$CNI_COMMAND" = DEL ] || exit 0\n'
    'f=/var/lib/cni/flannel/"$CNI_CONTAINERID"\n'
    '[ -f "$f" ] || exit 0\n'
    f'{PLUGIN_DIR}/bridge < "$f"; rc=$?; rm -f "$f"; exit $rc\n'
)


@pytest.mark.parametrize("where", ["in the root", "outside the root"])
def test_flannels_own_ipam_names_the_store_its_delegate_releases_from(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path, where: str
) -> None:
    """flannel hands its delegate its own ipam, host-local's where it names no type: a dataDir
    there is the store its DEL releases from, checked as any, and bound for a --root where it
    lies outside the standard dirs (before, the default dataDir's store was checked, and the
    one the DEL released from was this machine's own there)."""
    outside = tmp_path / "machine-side"
    data_dir = "/var/lib/cni/fl-ipam" if where == "in the root" else str(outside)
    bin_dir = crashed.node.fake_plugin_network("cbr0", "flannel", FLANNEL)
    flannel: dict[str, Any] = {"type": "flannel", "ipam": {"dataDir": data_dir}}
    conf = {"cniVersion": "1.0.0", "name": "cbr0", "plugins": [flannel]}
    crashed.node.write_conf("60-cbr0.conflist", json.dumps(conf).encode())
    root = crashed.node.root
    store = root / data_dir.lstrip("/") / "cbr0"
    store.mkdir(parents=True)
    (store / "10.244.0.5").write_bytes(OWNER_A)
    machine_store = outside / "cbr0"
    if where == "outside the root":  # the same on this machine, which no DEL may touch
        shutil.copytree(store, machine_store)
    scratch = root / "var/lib/cni/flannel"
    scratch.mkdir(parents=True)
    delegate: dict[str, Any] = {"cniVersion": "1.0.0", "name": "cbr0", "type": "bridge"}
    delegate["ipam"] = {
        "type": "host-local",
        "dataDir": data_dir,
        "ranges": [[{"subnet": "10.244.0.0/24"}]],
    }
    (scratch / A).write_text(json.dumps(delegate))
    entry = crashed.node.write_result(f"cbr0-{A}-eth0", b"")
    first_run_recorded(crashed, store)
    (store / "10.244.0.6").write_bytes(OWNER_A)

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir))

    assert code == ExitCode.DATA
    assert entry.exists() and sorted(os.listdir(store)) == ["10.244.0.5", "10.244.0.6"]
    if where == "outside the root":
        assert os.listdir(machine_store) == ["10.244.0.5"]
    (found,) = report["entries"]
    assert (found["action"], found["del"]) == ("leave", None)
    assert found["reason"].startswith(f"host-local's DEL would also release {store / '10.244.0.6'}")


# flannel's DEL as flannel-io/cni-plugin's doCmdDel does it: the scratch file in flannel's own
# dataDir, never its config's ipam; the delegate run on it, the file removed if that succeeds.
FAITHFUL_FLANNEL = r"""[ "$CNI_COMMAND" = DEL ] || exit 0
d=$(python3 -c 'import json,sys; print(json.load(sys.stdin).get("dataDir") or sys.argv[1])' \
    /var/lib/cni/flannel)
f="$d/$CNI_CONTAINERID"
[ -f "$f" ] || exit 0
t=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["type"])' "$f") || exit 0
/usr/lib/cni/$t < "$f"; rc=$?; [ $rc = 0 ] && rm -f "$f"; exit $rc
"""


def flannel_node(
    crashed: Crashed, flannel: dict[str, Any], scratch_ipam: dict[str, Any]
) -> tuple[Path, Path]:
    """A flannel network cbr0 of the given plugin config, and the scratch file its ADD of A
    wrote with a bridge delegate of scratch_ipam; returns the plugin dir and the scratch."""
    bin_dir = crashed.node.fake_plugin_network("cbr0", "flannel", FAITHFUL_FLANNEL)
    conf = {"cniVersion": "1.0.0", "name": "cbr0", "plugins": [flannel]}
    crashed.node.write_conf("60-cbr0.conflist", json.dumps(conf).encode())
    data_dir = flannel.get("dataDir", "/var/lib/cni/flannel")
    scratch = crashed.node.root / data_dir.lstrip("/") / A
    scratch.parent.mkdir(parents=True, exist_ok=True)
    ipam = {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]], **scratch_ipam}
    delegate = {"cniVersion": "1.0.0", "name": "cbr0", "type": "bridge", "ipam": ipam}
    scratch.write_text(json.dumps(delegate))
    return bin_dir, scratch


def a_damaged_entry_and_its_address(crashed: Crashed) -> tuple[Path, Path]:
    """A's damaged entry of cbr0 and its address in the default store, both of the earlier
    boot (in this boot's record): the store and the entry."""
    default = crashed.node.root / "var/lib/cni/networks/cbr0"
    default.mkdir(parents=True)
    (default / "10.244.0.5").write_bytes(OWNER_A)
    entry = crashed.node.write_result(f"cbr0-{A}-eth0", b"")
    first_run_recorded(crashed, default)
    return default, entry


def test_flannels_del_is_checked_against_the_store_its_scratch_file_names(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """flannel's DEL runs the delegate config its ADD kept, not its config: a config whose
    ipam names another dataDir than that file (edited since the ADD) is no proof of the store
    the DEL releases from (found by the review of 8dbe3b7: the DEL released an address of this
    boot from the default store, and the report said none was released)."""
    flannel = {"type": "flannel", "ipam": {"dataDir": "/var/lib/cni/fl-ipam"}}
    bin_dir, scratch = flannel_node(crashed, flannel, {})
    root = crashed.node.root
    configured, default = root / "var/lib/cni/fl-ipam/cbr0", root / "var/lib/cni/networks/cbr0"
    configured.mkdir(parents=True)
    default.mkdir(parents=True)
    (default / "10.244.0.5").write_bytes(OWNER_A)
    entry = crashed.node.write_result(f"cbr0-{A}-eth0", b"")
    crashed.reboot()
    crashed.node.record_before_runtime(crashed.t0 + 20, configured, default)
    (default / "10.244.0.6").write_bytes(OWNER_A)  # this boot's

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir), "--bin-dir", PLUGIN_DIR)

    assert code == ExitCode.DATA
    assert entry.exists() and scratch.exists()
    assert sorted(os.listdir(default)) == ["10.244.0.5", "10.244.0.6"]
    (found,) = report["entries"]
    assert (found["action"], found["del"]) == ("leave", None)
    assert found["reason"] == (
        f"flannel's DEL runs the delegate config it kept in {scratch}, whose host-local keeps "
        f"{default}, not the store this run read for the network"
    )


def test_under_a_root_flannels_scratch_file_never_reaches_this_machines_store(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A scratch file whose delegate keeps its store outside the dirs the plugins see under
    the root would release this machine's own reservation there."""
    machine = tmp_path / "machine-ipam"
    (machine / "cbr0").mkdir(parents=True)
    (machine / "cbr0/10.244.0.9").write_bytes(OWNER_A)
    flannel = {"type": "flannel", "ipam": {"dataDir": "/var/lib/cni/fl-ipam"}}
    bin_dir, scratch = flannel_node(crashed, flannel, {"dataDir": str(machine)})
    configured = crashed.node.root / "var/lib/cni/fl-ipam/cbr0"
    configured.mkdir(parents=True)
    (configured / "10.244.0.5").write_bytes(OWNER_A)
    entry = crashed.node.write_result(f"cbr0-{A}-eth0", b"")
    first_run_recorded(crashed, configured)

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir), "--bin-dir", PLUGIN_DIR)

    assert code == ExitCode.DATA
    assert os.listdir(machine / "cbr0") == ["10.244.0.9"]
    assert entry.exists() and scratch.exists() and os.listdir(configured) == ["10.244.0.5"]
    (found,) = report["entries"]
    assert found["reason"] == (
        f"flannel's DEL runs the delegate config it kept in {scratch}, whose host-local keeps "
        f"{machine}/cbr0: not a store the plugins see under {crashed.node.root}, or one reached "
        "through a symlink"
    )


def test_under_a_root_flannels_own_data_dir_must_be_one_the_plugins_see(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """flannel's scratch dir, named by its own dataDir, is this machine's under a root when it
    lies outside the dirs bound there: its DEL would read, run and remove this machine's file.
    No DEL through it runs, an orphan's neither."""
    machine = tmp_path / "machine-flannel"
    machine.mkdir()
    (machine / A).write_text("{}")  # this machine's, which no DEL may consume
    bin_dir, _ = flannel_node(crashed, {"type": "flannel", "dataDir": str(machine)}, {})
    default = crashed.node.root / "var/lib/cni/networks/cbr0"
    default.mkdir(parents=True)
    (default / "10.244.0.5").write_bytes(OWNER_A)
    (default / "10.244.0.7").write_bytes(f"{B}\r\neth0".encode())  # an orphan's
    entry = crashed.node.write_result(f"cbr0-{A}-eth0", b"")
    first_run_recorded(crashed, default)

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir), "--bin-dir", PLUGIN_DIR)

    assert code == ExitCode.DATA
    assert os.listdir(machine) == [A]
    assert entry.exists() and sorted(os.listdir(default)) == ["10.244.0.5", "10.244.0.7"]
    why = (
        f"flannel's dataDir {str(machine)!r} is not one the plugins see under "
        f"{crashed.node.root}, or is reached through a symlink: its DEL would read this "
        "machine's own"
    )
    (found,) = report["entries"]
    assert found["reason"] == why
    assert by_ip(report)["10.244.0.7"]["reason"] == why


def test_a_damaged_scratch_file_runs_no_delegate_and_is_no_doubt(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """A crash leaves flannel's scratch file empty as often as libcni's: flannel's DEL then
    ends with success and runs no delegate, so nothing it could release is in doubt."""
    bin_dir, scratch = flannel_node(crashed, {"type": "flannel"}, {})
    scratch.write_bytes(b"")
    _, entry = a_damaged_entry_and_its_address(crashed)

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir), "--bin-dir", PLUGIN_DIR)

    (found,) = report["entries"]
    assert found["action"] == "del-and-quarantine"
    assert not entry.exists()
    # The DEL released nothing: the address goes as a reservation of an earlier boot does.
    assert found["outcome"] == "failed" and code == ExitCode.ACTION_FAILED
    assert by_ip(report)["10.244.0.5"]["action"] == "quarantine"


@pytest.mark.parametrize("link", ["the scratch file's dataDir", "flannel's own dataDir"])
def test_under_a_root_no_symlink_leads_flannels_del_to_this_machines_files(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path, link: str
) -> None:
    """A symlink in the root the reaper follows as the node has it, but a confined plugin
    follows as this machine has it: a scratch file naming its store through one, or flannel's
    dataDir being one, would have the DEL release (and consume) this machine's own (found by a
    review of the scratch check)."""
    root = crashed.node.root
    elsewhere = tmp_path / "elsewhere"
    machine_store = tmp_path / "machine-ipam/cbr0"
    machine_store.mkdir(parents=True)
    (machine_store / "10.244.0.9").write_bytes(OWNER_A)
    if link == "the scratch file's dataDir":
        (root / str(elsewhere).lstrip("/")).parent.mkdir(parents=True)
        os.symlink("/var/lib/cni/networks", root / str(elsewhere).lstrip("/"))
        bin_dir, scratch = flannel_node(crashed, {"type": "flannel"}, {"dataDir": str(elsewhere)})
    else:
        bin_dir, scratch = flannel_node(crashed, {"type": "flannel"}, {})
        moved = root / str(elsewhere).lstrip("/")
        moved.parent.mkdir(parents=True)
        os.rename(scratch.parent, moved)
        os.symlink(elsewhere, scratch.parent)
        elsewhere.mkdir()  # this machine's, with a scratch file of its own for A
        ipam = {"type": "host-local", "dataDir": str(machine_store.parent)}
        (elsewhere / A).write_text(json.dumps({"name": "cbr0", "type": "bridge", "ipam": ipam}))
    default, entry = a_damaged_entry_and_its_address(crashed)

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir), "--bin-dir", PLUGIN_DIR)

    assert code == ExitCode.DATA
    assert os.listdir(machine_store) == ["10.244.0.9"]
    assert entry.exists() and os.listdir(default) == ["10.244.0.5"]
    if link == "flannel's own dataDir":
        assert os.listdir(elsewhere) == [A]
    (found,) = report["entries"]
    assert found["action"] == "leave"
    assert "reached through a symlink" in found["reason"]


@pytest.mark.parametrize(
    "members",
    [
        # ipam given twice, in two cases: Go takes the later one in the file
        '"ipam":{"type":"host-local","ranges":[[{"subnet":"10.244.0.0/24"}]]},'
        '"IPAM":{"dataDir":"/var/lib/cni/other"}',
        # type given twice: flannel runs whichever Go's decoding leaves
        '"ipam":{"type":"static","dataDir":"/var/lib/cni/other"},"TYPE":"host-local"',
    ],
)
def test_a_scratch_file_that_gives_a_key_twice_in_any_case_leaves_the_del(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], members: str
) -> None:
    """The delegate decodes the scratch file's bytes as they are, in file order, a key in any
    case: which of two it takes is not told by a decoding that sorts them (found by a review
    of the scratch check: a DEL released an address of this boot from a store not read)."""
    bin_dir, scratch = flannel_node(crashed, {"type": "flannel"}, {})
    scratch.write_text('{"cniVersion":"1.0.0","name":"cbr0","type":"bridge",' + members + "}")
    root = crashed.node.root
    default, other = root / "var/lib/cni/networks/cbr0", root / "var/lib/cni/other/cbr0"
    default.mkdir(parents=True)
    other.mkdir(parents=True)
    (default / "10.244.0.5").write_bytes(OWNER_A)
    entry = crashed.node.write_result(f"cbr0-{A}-eth0", b"")
    crashed.reboot()
    crashed.node.record_before_runtime(crashed.t0 + 20, default, other)
    (other / "10.244.0.6").write_bytes(OWNER_A)  # this boot's

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir), "--bin-dir", PLUGIN_DIR)

    assert code == ExitCode.DATA
    assert entry.exists() and os.listdir(other) == ["10.244.0.6"]
    (found,) = report["entries"]
    assert found["reason"] == (
        f"flannel's DEL runs the delegate config it kept in {scratch}, which does not decode "
        "here (a key given twice, in some case): what it would release cannot be told"
    )


def test_flannels_empty_data_dir_is_the_working_dir_not_the_default(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """flannel decodes its config over its defaults: a dataDir of "" is kept, and its scratch
    file is then /<container ID> (filepath.Join), which no dir bound under a root holds."""
    bin_dir, _ = flannel_node(crashed, {"type": "flannel", "dataDir": ""}, {})
    _, entry = a_damaged_entry_and_its_address(crashed)

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir), "--bin-dir", PLUGIN_DIR)

    assert code == ExitCode.DATA and entry.exists()
    (found,) = report["entries"]
    assert found["reason"].startswith("flannel's dataDir '' is not one the plugins see under")


@pytest.mark.parametrize(
    "delegate",
    [
        {"type": "flannel", "dataDir": "/x"},
        # the delegating plugin run as the IPAM plugin the delegate execs (found by the attack
        # review of cd1ab78: Multus read and removed a file of the machine's)
        {"type": "bridge", "ipam": {"type": "multus"}, "cniDir": "/etc/multus-cache"},
    ],
)
def test_a_scratch_file_whose_delegate_is_flannel_again_leaves_the_del(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], delegate: dict[str, Any]
) -> None:
    """That flannel's DEL would run the delegate of a scratch file of its own dataDir's, which
    this run does not read."""
    bin_dir, scratch = flannel_node(crashed, {"type": "flannel"}, {})
    scratch.write_text(json.dumps({"cniVersion": "1.0.0", "name": "cbr0", **delegate}))
    _, entry = a_damaged_entry_and_its_address(crashed)

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir), "--bin-dir", PLUGIN_DIR)

    assert code == ExitCode.DATA and entry.exists()
    (found,) = report["entries"]
    assert found["reason"] == (
        f"flannel's DEL runs the delegate config it kept in {scratch}, whose delegate delegates "
        "again: what that would release is not read"
    )


# Multus's DEL as multus-cni's CmdDel does it, for what matters here: the scratch file its ADD
# kept (<cniDir>/<container ID>: a JSON list of its delegates, each with the config it runs,
# base64, in "Bytes"; cniDir as its config says, /var/lib/cni/multus by default), each
# delegate DEL'd with its own ifname (the first the one it is given, then net1, ...) and its
# plugin looked up in Multus's binDir (/opt/cni/bin), then CNI_PATH; the file removed once
# they are.
MULTUS_STAND_IN = r"""[ "$CNI_COMMAND" = DEL ] || exit 0
dir=$(python3 -c 'import json, sys; print(json.load(sys.stdin).get("cniDir") or "")')
dir=${dir:-/var/lib/cni/multus}
f="$dir/$CNI_CONTAINERID"
[ -f "$f" ] || exit 0
python3 - "$f" <<'PY' || exit 1
import base64, json, os, subprocess, sys
for n, item in enumerate(json.load(open(sys.argv[1]))):
    delegate = json.loads(base64.b64decode(item["Bytes"]))
    ifname = item.get("ifnameRequest") or (os.environ["CNI_IFNAME"] if n == 0 else f"net{n}")
    dirs = ["/opt/cni/bin", *os.environ["CNI_PATH"].split(":")]
    found = [d for d in dirs if os.path.isfile(os.path.join(d, delegate["type"]))]
    stdin = json.dumps(delegate).encode()
    env = {**os.environ, "CNI_IFNAME": ifname}
    subprocess.run([os.path.join(found[0], delegate["type"])], input=stdin, env=env, check=True)
PY
rm -f "$f"
"""


def plugin_dirs(root: Path, bin_dir: Path) -> list[str]:
    """--bin-dir for the node's own plugin dir (bin_dir, under root) and Debian's plugins."""
    return ["--bin-dir", "/" + str(bin_dir.relative_to(root)), "--bin-dir", PLUGIN_DIR]


def bridge(network: str, subnet: str) -> dict[str, Any]:
    """A delegate's config: bridge with host-local in the default dataDir, on <subnet>.0/24."""
    ipam = {"type": "host-local", "ranges": [[{"subnet": f"{subnet}.0/24"}]]}
    return {"cniVersion": "1.0.0", "name": network, "type": "bridge", "ipam": ipam}


def multus_scratch(*delegates: dict[str, Any]) -> str:
    """A scratch file as Multus's ADD writes it (saveDelegates: its DelegateNetConf list)."""
    listed = [
        {"Name": d["name"], "Bytes": base64.b64encode(json.dumps(d).encode()).decode()}
        for d in delegates
    ]
    return json.dumps(listed)


@pytest.mark.parametrize("this_boot", [True, False])
def test_multus_del_is_held_to_every_store_of_the_owner_whatever_its_ifname(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], this_boot: bool
) -> None:
    """Multus's DEL DELs each delegate its scratch file names, each from a store of its own
    network under an ifname of its own (net1, ...): the entry's network has no store, and
    its ifname is Multus's. Every store this run found is held to the owner under any
    ifname; one holding an address of A from this boot leaves the DEL (found reading
    cli.doubted against Multus's CmdDel: the DEL ran and released it, exit 0). The check
    comes before the one that keeps Multus's DEL from running under a --root at all."""
    bin_dir = crashed.node.fake_plugin_network("multus-cni-network", "multus", MULTUS_STAND_IN)
    root = crashed.node.root
    delegates = []
    stores = []
    for n, (network, subnet) in enumerate((("cbr0", "10.244.0"), ("extra", "10.245.0"))):
        ipam = {"type": "host-local", "ranges": [[{"subnet": f"{subnet}.0/24"}]]}
        delegates.append({"cniVersion": "1.0.0", "name": network, "type": "bridge", "ipam": ipam})
        ifname = f"net{n}" if n else "eth0"
        store = root / "var/lib/cni/networks" / network
        store.mkdir(parents=True)
        (store / f"{subnet}.5").write_bytes(f"{A}\r\n{ifname}".encode())
        stores.append(store)
        cached = cache_entry_bytes(json.dumps(delegates[-1]).encode(), network, A, ifname)
        result = root / "var/lib/cni/multus/results" / f"{network}-{A}-{ifname}"
        result.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        result.write_bytes(cached)
    (root / "var/lib/cni/multus" / A).write_text(multus_scratch(*delegates))
    entry = crashed.node.write_result(f"multus-cni-network-{A}-eth0", b"")
    crashed.reboot()
    crashed.node.record_before_runtime(crashed.t0 + 20, *stores)
    if not this_boot:
        # Every address of A an earlier boot's: under a --root no DEL through Multus runs at
        # all (its cniDir, its kubeconfig, its daemon's socket would be this machine's), the
        # entry is quarantined as for any DEL that cannot run, and the delegates' addresses
        # stay for Multus's DEL on the node (found by the attack review of the binds).
        code, report = crashed.run(capsys, "--bin-dir", str(bin_dir))
        assert code == ExitCode.ACTION_FAILED, report
        assert not entry.exists()
        assert [os.listdir(store) for store in stores] == [["10.244.0.5"], ["10.245.0.5"]]
        (found,) = report["entries"]
        assert (found["outcome"], found["del"]["plugins_run"]) == ("failed", [])
        assert "no DEL through Multus runs under a --root" in found["plugin_errors"][0]["msg"]
        return
    (stores[1] / "10.245.0.9").write_bytes(f"{A}\r\nnet1".encode())  # this boot's

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir))

    assert code == ExitCode.DATA
    assert entry.exists()
    assert sorted(os.listdir(stores[1])) == ["10.245.0.5", "10.245.0.9"]
    assert os.listdir(stores[0]) == ["10.244.0.5"]
    (found,) = report["entries"]
    assert (found["action"], found["del"]) == ("leave", None)
    assert found["reason"].startswith(
        f"host-local's DEL would also release {stores[1] / '10.245.0.9'}"
    )


def two_delegates(root: Path) -> tuple[list[dict[str, Any]], list[Path]]:
    """Multus's two delegates, cbr0 (10.244.0.0/24) and extra (10.245.0.0/24), each bridge
    with host-local in the default dataDir, and their stores, made empty."""
    delegates, stores = [], []
    for network, subnet in (("cbr0", "10.244.0"), ("extra", "10.245.0")):
        ipam = {"type": "host-local", "ranges": [[{"subnet": f"{subnet}.0/24"}]]}
        delegates.append({"cniVersion": "1.0.0", "name": network, "type": "bridge", "ipam": ipam})
        store = root / "var/lib/cni/networks" / network
        store.mkdir(parents=True)
        stores.append(store)
    return delegates, stores


class OnTheNode:
    """Runs at --root / on the tree as the node itself (tests/node_itself.py)."""

    def __init__(self, crashed: Crashed) -> None:
        if os.geteuid() != 0:
            cannot_run("needs root to make a mount and PID namespace and change root")
        self.crashed = crashed
        self.enter = [*unshare(net=True, pid=True), sys.executable, "-m", "tests.node_itself"]
        self.enter.append(str(crashed.node.root))

    def record(self, *dirs: str) -> None:
        """This boot's first run's record of the results dir and dirs (node paths)."""
        argv = [*self.enter, str(self.crashed.t0 + 20), *dirs, "--"]
        recorded = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert recorded.returncode == 0, recorded.stderr

    def run(self, *argv: str, root: str = "/") -> tuple[int, dict[str, Any]]:
        run = [*self.enter, str(self.crashed.t0 + 60), "--", "--root", root, "--json", *argv]
        proc = subprocess.run(run, cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.stdout, proc.stderr
        return proc.returncode, json.loads(proc.stdout)


@pytest.mark.parametrize("named", ["/", "//", "/host-itself"])
def test_on_the_node_an_entrys_del_through_multus_runs_and_releases_its_delegates(
    crashed: Crashed, named: str
) -> None:
    """The control the --root tests cannot give (no DEL through Multus runs under a --root):
    on the node, every address of the owner from an earlier boot, the damaged Multus entry's
    DEL runs Multus, whose delegates release their addresses, and the entry is quarantined.
    So it does for the node's / named otherwise (// or a symlink to /), which the plugins'
    confinement took for the node and the check of Multus's DEL for a --root (exit 73)."""
    bin_dir = crashed.node.fake_plugin_network("multus-cni-network", "multus", MULTUS_STAND_IN)
    root = crashed.node.root
    delegates, stores = two_delegates(root)
    (stores[0] / "10.244.0.5").write_bytes(OWNER_A)
    (stores[1] / "10.245.0.5").write_bytes(f"{A}\r\nnet1".encode())
    (root / "var/lib/cni/multus").mkdir(parents=True)
    (root / "var/lib/cni/multus" / A).write_text(multus_scratch(*delegates))
    entry = crashed.node.write_result(f"multus-cni-network-{A}-eth0", b"")
    crashed.reboot()
    (root / "host-itself").symlink_to("/")
    node = OnTheNode(crashed)
    node.record("/var/lib/cni/networks/cbr0", "/var/lib/cni/networks/extra")

    code, report = node.run("--bin-dir", "/opt/cni/bin", "--bin-dir", PLUGIN_DIR, root=named)

    assert bin_dir == root / "opt/cni/bin"
    assert code == ExitCode.OK, report
    assert not entry.exists() and not (root / "var/lib/cni/multus" / A).exists()
    assert [os.listdir(store) for store in stores] == [["lock"], ["lock"]]
    (found,) = report["entries"]
    assert (found["outcome"], found["del"]["plugins_run"]) == ("done", ["multus"])
    assert sorted(found["del"]["released"]) == ["10.244.0.5", "10.245.0.5"]


# A Multus whose DEL exits 0 and DELs no delegate, as Multus 4.x does with a scratch file Go
# cannot decode into its delegates' list.
MULTUS_DELETING_NOTHING = '[ "$CNI_COMMAND" = DEL ] || exit 0\nexit 0\n'


@pytest.mark.parametrize("multus", ["deletes nothing", "ifnameRequest"])
def test_on_the_node_what_multus_s_delegates_release_is_seen_in_their_stores(
    crashed: Crashed, multus: str
) -> None:
    """A DEL through Multus is done only where its delegates' stores no longer hold what they
    held for the owner, each under the ifname Multus's DEL gives it (the one its ADD was
    asked for, else the DEL's own for the first, net<index> for the others), and the report
    names what they released. Until now only the entry's network's own store was looked at
    after the DEL, and a Multus entry's network has none: a Multus that exited 0 and DEL'd
    no delegate was reported done, its addresses leaked, exit 0."""
    deleting_nothing = multus == "deletes nothing"
    stand_in = MULTUS_DELETING_NOTHING if deleting_nothing else MULTUS_STAND_IN
    crashed.node.fake_plugin_network("multus-cni-network", "multus", stand_in)
    root = crashed.node.root
    delegates, stores = two_delegates(root)
    (stores[0] / "10.244.0.5").write_bytes(OWNER_A)
    scratch = json.loads(multus_scratch(*delegates))
    if deleting_nothing:
        (stores[1] / "10.245.0.5").write_bytes(f"{A}\r\nnet1".encode())
    else:
        scratch[1]["ifnameRequest"] = "ext0"
        (stores[1] / "10.245.0.5").write_bytes(f"{A}\r\next0".encode())
    (root / "var/lib/cni/multus").mkdir(parents=True)
    (root / "var/lib/cni/multus" / A).write_text(json.dumps(scratch))
    entry = crashed.node.write_result(f"multus-cni-network-{A}-eth0", b"")
    crashed.reboot()
    node = OnTheNode(crashed)
    node.record("/var/lib/cni/networks/cbr0", "/var/lib/cni/networks/extra")

    code, report = node.run("--bin-dir", "/opt/cni/bin", "--bin-dir", PLUGIN_DIR)

    (found,) = report["entries"]
    assert not entry.exists()  # quarantined after its DEL, whatever the DEL did
    if not deleting_nothing:
        assert code == ExitCode.OK, report
        assert (found["outcome"], sorted(found["del"]["released"])) == (
            "done",
            ["10.244.0.5", "10.245.0.5"],
        )
        assert [os.listdir(store) for store in stores] == [["lock"], ["lock"]]
        return
    assert code == ExitCode.ACTION_FAILED, report
    assert (found["outcome"], found["del"]["released"]) == ("failed", [])
    assert found["plugin_errors"][0]["msg"] == (
        "every plugin exited 0, but /var/lib/cni/networks/cbr0 still holds 10.244.0.5; "
        "/var/lib/cni/networks/extra still holds 10.245.0.5 (ifname net1) for this attachment"
    )
    # What the DEL left, no entry names now: the reaper releases it itself, as an orphan's.
    assert [os.listdir(store) for store in stores] == [["lock"], ["lock"]]
    assert [(r["ip"], r["outcome"], r["problem"]) for r in report["host_local"]] == [
        ("10.244.0.5", "done", "DEL not run, and the address is still reserved"),
        ("10.245.0.5", "done", "DEL not run, and the address is still reserved"),
    ]


IFNAME_KEYS = st.sampled_from(["ifnameRequest", "IFNAMEREQUEST", "ifnamerequest"])
IFNAME_VALUES = st.sampled_from([None, "", "ext0", "net0", 5, ["x"]])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.tuples(IFNAME_KEYS, IFNAME_VALUES), max_size=3), max_size=4))
def test_each_delegate_is_released_under_the_ifname_multus_s_del_gives_it(
    tmp_path_factory: pytest.TempPathFactory, items: list[list[tuple[str, object]]]
) -> None:
    """Model (multus-cni: getIfname, over the scratch file Go decodes): a delegate is DEL'd
    under the ifname its ADD was asked for, the last string given for the field in any case
    of its key, a null leaving it as it was; where none (or ""), the first under the DEL's
    own, each other as net<index>. A value that is no string fails Go's decoding of the
    whole list: Multus's DEL then DELs no delegate, and the file is read as telling none."""
    root = tmp_path_factory.mktemp("node")
    cni_dir = root / "var/lib/cni/multus"
    cni_dir.mkdir(parents=True)
    config = {"cniVersion": "1.0.0", "name": "cbr0", "type": "bridge"}
    raw = base64.b64encode(json.dumps(config).encode()).decode()
    texts = []
    for members in items:
        extra = "".join(f", {json.dumps(key)}: {json.dumps(value)}" for key, value in members)
        texts.append(f'{{"Name": "cbr0", "Bytes": "{raw}"{extra}}}')
    (cni_dir / A).write_text(f"[{', '.join(texts)}]")
    multus_conf = {"cniVersion": "1.0.0", "name": "multus-cni-network", "type": "multus"}
    netlist = parse_conf_bytes(json.dumps(multus_conf).encode(), "multus.conf", True)

    (read,) = multus.scratch_delegates(netlist, A, str(root))

    wanted: list[str | None] = []
    for index, members in enumerate(items):
        given = [value for _, value in members if value is not None]
        if any(not isinstance(value, str) for value in given):
            assert read.problem is not None and "ifnameRequest is no string" in read.problem
            assert (read.delegates, read.ifnames) == ((), ())
            return
        requested = str(given[-1]) if given else ""
        wanted.append(requested or (None if index == 0 else f"net{index}"))
    assert (read.problem, read.unread, list(read.ifnames)) == (None, False, wanted)
    assert len(read.delegates) == len(items)


@pytest.mark.parametrize("this_boot", [True, False])
def test_on_the_node_an_orphans_del_through_multus_is_held_to_every_store_of_the_owner(
    crashed: Crashed, this_boot: bool
) -> None:
    """An orphan whose network's chain runs Multus: its DEL DELs every delegate Multus's
    scratch file names, from their own stores under their own ifnames. Only its own store was
    held to the owner, and on the node (--root /, where Multus's DEL runs) a delegate's
    address reserved in this boot was released (the review of 5cce9af held the entries' DELs
    so, not the orphans'). With nothing of the owner's from this boot, the DEL runs through
    Multus."""
    bin_dir = crashed.node.fake_plugin_network("multus-cni-network", "multus", MULTUS_STAND_IN)
    root = crashed.node.root
    networks = root / "var/lib/cni/networks"
    own = networks / "multus-cni-network"
    own.mkdir(parents=True)
    (own / "10.250.0.5").write_bytes(OWNER_A)  # the orphan: no results entry, no sandbox
    ipam = {"type": "host-local", "ranges": [[{"subnet": "10.245.0.0/24"}]]}
    delegate = {"cniVersion": "1.0.0", "name": "extra", "type": "bridge", "ipam": ipam}
    # Multus's first delegate runs as eth0 (here its own network again), the next as net1.
    (root / "var/lib/cni/multus").mkdir(parents=True)
    first = {
        **delegate,
        "name": "multus-cni-network",
        "ipam": {**ipam, "ranges": [[{"subnet": "10.250.0.0/24"}]]},
    }
    (root / "var/lib/cni/multus" / A).write_text(multus_scratch(first, delegate))
    extra = networks / "extra"
    extra.mkdir()
    crashed.node.results.mkdir(parents=True, mode=0o700)
    crashed.reboot()
    node = OnTheNode(crashed)
    node.record("/var/lib/cni/networks/multus-cni-network", "/var/lib/cni/networks/extra")
    argv = ["--bin-dir", "/" + str(bin_dir.relative_to(root)), "--bin-dir", PLUGIN_DIR]
    if not this_boot:
        code, report = node.run(*argv)
        assert code == ExitCode.OK, report
        assert os.listdir(own) == ["lock"]
        (found,) = report["host_local"]
        assert (found["ip"], found["outcome"], found["del"]["plugins_run"]) == (
            "10.250.0.5",
            "done",
            ["multus"],
        )
        return
    (extra / "10.245.0.9").write_bytes(f"{A}\r\nnet1".encode())  # this boot's

    code, report = node.run(*argv)

    assert code == ExitCode.DATA
    assert "10.245.0.9" in os.listdir(extra)
    assert "10.250.0.5" in os.listdir(own)
    found = by_ip(report)["10.250.0.5"]
    assert (found["action"], found["del"]) == ("leave", None)
    assert found["reason"].startswith(
        "host-local's DEL would also release /var/lib/cni/networks/extra/10.245.0.9, which was "
        "written current-boot"
    )


def orphans_of_a_through_multus(
    crashed: Crashed, nad_data_dir: str | None, *more_stores: str, recorded: bool = True
) -> tuple[OnTheNode, Path, Path]:
    """A's orphan (10.244.0.5: no results entry, no sandbox) in the store of Multus's network,
    whose first delegate keeps Multus's name, and A's address under net1 (10.245.0.5) in the
    store of its second, extra: in the default dataDir, or in the dataDir nad_data_dir (a
    NetworkAttachmentDefinition's, which no conf names); the scratch file Multus's ADD kept;
    the node rebooted and this boot's first run's record taken, of more_stores too (unless
    not recorded: the next run is the boot's first). The two stores are returned."""
    root = crashed.node.root
    networks = root / "var/lib/cni/networks"
    delegates, (own, extra) = two_delegates(root)
    delegates[0]["name"] = "multus-cni-network"
    own = own.rename(networks / "multus-cni-network")
    if nad_data_dir is not None:
        delegates[1]["ipam"]["dataDir"] = nad_data_dir
        nad = root / nad_data_dir.lstrip("/")
        nad.mkdir(parents=True)
        extra = extra.rename(nad / "extra")
    (own / "10.244.0.5").write_bytes(OWNER_A)
    (extra / "10.245.0.5").write_bytes(f"{A}\r\nnet1".encode())
    (root / "var/lib/cni/multus").mkdir(parents=True)
    (root / "var/lib/cni/multus" / A).write_text(multus_scratch(*delegates))
    crashed.node.results.mkdir(parents=True, mode=0o700)
    crashed.reboot()
    node = OnTheNode(crashed)
    if recorded:
        node.record(*("/" + str(store.relative_to(root)) for store in (own, extra)), *more_stores)
    return node, own, extra


@pytest.mark.parametrize("multus", ["deletes nothing", "deletes"])
def test_on_the_node_what_an_orphans_del_through_multus_releases_is_seen_in_every_store(
    crashed: Crashed, multus: str
) -> None:
    """An orphan's DEL through Multus releases, besides the orphan, each delegate's address
    of the owner from its own store under its own ifname: done only where each is gone, and
    the report names them. Until now only the orphan's own reservation was looked at after
    the DEL: a Multus that exited 0 and DEL'd no delegate left the delegate's address, and
    the orphan was released by the reaper as for a DEL that ran and left it."""
    deleting_nothing = multus == "deletes nothing"
    stand_in = MULTUS_DELETING_NOTHING if deleting_nothing else MULTUS_STAND_IN
    bin_dir = crashed.node.fake_plugin_network("multus-cni-network", "multus", stand_in)
    # The second keeps its addresses where a NetworkAttachmentDefinition says, which no conf
    # names: no orphan of its own there.
    node, own, extra = orphans_of_a_through_multus(crashed, "/var/lib/cni/nad-ipam")

    code, report = node.run(
        "--bin-dir", "/" + str(bin_dir.relative_to(crashed.node.root)), "--bin-dir", PLUGIN_DIR
    )

    orphan = by_ip(report)["10.244.0.5"]
    assert orphan["del"]["plugins_run"] == ["multus"]
    if not deleting_nothing:
        assert code == ExitCode.OK, report
        assert [os.listdir(own), os.listdir(extra)] == [["lock"], ["lock"]]
        assert (orphan["outcome"], orphan["del"]["ok"]) == ("done", True)
        assert sorted(orphan["del"]["released"]) == ["10.244.0.5", "10.245.0.5"]
        return
    assert code == ExitCode.ACTION_FAILED, report
    assert (orphan["del"]["ok"], orphan["del"]["released"]) == (False, [])
    assert orphan["del"]["plugin_errors"][0]["msg"] == (
        "every plugin exited 0, but /var/lib/cni/networks/multus-cni-network still holds "
        "10.244.0.5; /var/lib/cni/nad-ipam/extra still holds 10.245.0.5 (ifname net1) for "
        "this attachment"
    )
    assert orphan["problem"] == "DEL ran, and the address is still reserved"


def test_on_the_node_the_boot_s_first_run_records_the_stores_an_orphan_s_multus_del_releases(
    crashed: Crashed,
) -> None:
    """A's orphan in the store of Multus's network, whose DEL through Multus also releases
    A's address under net1 in a dataDir only a NetworkAttachmentDefinition names (so only
    Multus's scratch file of A). The boot's first run recorded the stores an entry's DEL
    through Multus would release from, but not an orphan's: the NAD's store was not in the
    record, its address could not be proven an earlier boot's, and the DEL was left, exit
    65, in that run and in every later one of every boot (said "written current-boot"; the
    dry run, keeping no record, had once taken the address for one found before any
    runtime and said 0). The first run now records too the stores that Multus's scratch
    files name for each owner of an address in the store of a network whose config runs
    Multus: the DEL runs, both addresses are released, and the dry run says so."""
    bin_dir = crashed.node.fake_plugin_network("multus-cni-network", "multus", MULTUS_STAND_IN)
    root = crashed.node.root
    node, own, extra = orphans_of_a_through_multus(crashed, "/var/lib/cni/nad-ipam", recorded=False)

    dry_code, dry = node.run("--dry-run", *plugin_dirs(root, bin_dir))
    code, report = node.run(*plugin_dirs(root, bin_dir))

    assert (dry_code, code) == (ExitCode.OK, ExitCode.OK), json.dumps(report["host_local"])
    assert [os.listdir(own), os.listdir(extra)] == [["lock"], ["lock"]]
    orphan = by_ip(report)["10.244.0.5"]
    assert (orphan["outcome"], orphan["del"]["plugins_run"]) == ("done", ["multus"])
    assert sorted(orphan["del"]["released"]) == ["10.244.0.5", "10.245.0.5"]
    assert by_ip(dry)["10.244.0.5"]["action"] == "del"


def tenant_delegate(data_dir: str, name: str = "big") -> dict[str, Any]:
    """A NetworkAttachmentDefinition's delegate: bridge and host-local in a dataDir it names."""
    delegate = bridge(name, "10.246.0")
    delegate["ipam"]["dataDir"] = data_dir
    return delegate


def a_in_a_store_named_like_multus(crashed: Crashed, *delegates: dict[str, Any]) -> Path:
    """An address of A in the default dataDir's store named like Multus's network (as one of
    the pod's NetworkAttachmentDefinitions, named so by any tenant, makes it), A's scratch
    file naming delegates; the node rebooted. Returns the plugin dir."""
    bin_dir = crashed.node.fake_plugin_network("multus-cni-network", "multus", MULTUS_STAND_IN)
    root = crashed.node.root
    own = root / "var/lib/cni/networks/multus-cni-network"
    own.mkdir(parents=True)
    (own / "10.244.0.5").write_bytes(OWNER_A)
    (root / "var/lib/cni/multus").mkdir(parents=True)
    (root / "var/lib/cni/multus" / A).write_text(multus_scratch(*delegates))
    crashed.node.results.mkdir(parents=True, mode=0o700, exist_ok=True)
    return bin_dir


def test_on_the_node_the_first_run_records_no_store_for_an_owner_with_no_orphan(
    crashed: Crashed,
) -> None:
    """A's Multus results entry is whole: the runtime's DEL releases A's addresses, and no
    DEL of this run goes through Multus for A. The first run read A's scratch file all the
    same and recorded every dir its delegates name, a tenant's choice (/srv/tenant/big, with
    its 50 files), found by the attack review of 0e90e6f. It records the stores of owners
    with no results entry of the network only."""
    root = crashed.node.root
    bin_dir = a_in_a_store_named_like_multus(crashed, tenant_delegate("/srv/tenant"))
    conf = (crashed.node.conf_dir / "60-multus-cni-network.conflist").read_bytes()
    entry = crashed.node.write_result(
        f"multus-cni-network-{A}-eth0", cache_entry_bytes(conf, "multus-cni-network", A, "eth0")
    )
    big = root / "srv/tenant/big"
    big.mkdir(parents=True)
    for n in range(50):
        (big / f"file-{n}").write_bytes(b"x")
    crashed.reboot()

    code, report = OnTheNode(crashed).run(*plugin_dirs(root, bin_dir))

    assert (code, entry.exists()) == (ExitCode.OK, True), report
    record, problem = pre_runtime.load(str(root / "run"), BOOT_ID)
    assert problem is None and record is not None
    assert "/srv/tenant/big" not in record.dirs


def test_on_the_node_the_stores_scratch_files_name_are_recorded_once_each_and_so_many_at_most(
    crashed: Crashed,
) -> None:
    """A's orphan; A's scratch file names 300 delegates whose dataDirs are spellings of one
    dir of 1,000 files (symlinks to it, in a dir a tenant can write), and 70 other dirs. The
    first run recorded that dir once per spelling (the attack review of 0e90e6f: at 1,200
    spellings of 4,000 files, 41 s and a record past what a later run loads, so that every
    later run of the boot acted on nothing), and the orphan's check read it once for each.
    Each dir is recorded, and read, once however it is spelled, and 64 at most are
    recorded; the run says how many more there were."""
    root = crashed.node.root
    tenant = root / "srv/t"
    (tenant / "big").mkdir(parents=True)
    for n in range(1000):
        (tenant / "big" / f"10.9.{n // 250}.{n % 250}").write_bytes(b"")
    for k in range(300):
        (tenant / f"l{k}").symlink_to(".")
    for k in range(70):
        (tenant / f"s{k}" / "big").mkdir(parents=True)
    spelled = [tenant_delegate(f"/srv/t/l{k}") for k in range(300)]
    others = [tenant_delegate(f"/srv/t/s{k}") for k in range(70)]
    bin_dir = a_in_a_store_named_like_multus(crashed, *spelled, *others)
    crashed.reboot()

    code, report = OnTheNode(crashed).run(*plugin_dirs(root, bin_dir))

    record, problem = pre_runtime.load(str(root / "run"), BOOT_ID)
    assert problem is None and record is not None, (code, problem)
    tenants = [d for d in record.dirs if d.startswith("/srv/t/")]
    assert (len(tenants), sum(len(record.dirs[d].files) for d in tenants)) == (64, 1000)
    assert any(
        "Multus's scratch files name 7 more host-local stores than the 64" in w
        for w in report["warnings"]
    ), report["warnings"]


def test_on_the_node_the_stores_scratch_files_name_are_recorded_and_read_to_so_many_names(
    crashed: Crashed,
) -> None:
    """A's orphan; A's scratch file names a delegate whose dataDir is a dir a tenant filled
    with files (an emptyDir, say; 4,097, one past the bound, here), and another whose store
    holds ten. The first run listed the first whole into the record (at a million files, a
    record /run holds in memory and no later run loads), and every run's check of the
    orphan's DEL read each of its files. A store only scratch files name is recorded, and
    read, only if it holds MAX_NAMED_STORE_NAMES names at most; the DEL that may release
    from one past it is left (exit 65), in the first run and in later ones alike, and the
    run says so."""
    root = crashed.node.root
    big, small = root / "srv/t/big", root / "srv/u/small"
    for store, names in ((big, host_local.MAX_NAMED_STORE_NAMES + 1), (small, 10)):
        store.mkdir(parents=True)
        for n in range(names):
            (store / f"f{n}").touch()
    bin_dir = a_in_a_store_named_like_multus(
        crashed, tenant_delegate("/srv/t"), tenant_delegate("/srv/u", "small")
    )
    crashed.reboot()
    node = OnTheNode(crashed)

    first_code, first = node.run(*plugin_dirs(root, bin_dir))
    code, report = node.run(*plugin_dirs(root, bin_dir))

    record, problem = pre_runtime.load(str(root / "run"), BOOT_ID)
    assert problem is None and record is not None
    assert ("/srv/t/big" in record.dirs, len(record.dirs["/srv/u/small"].files)) == (False, 10)
    assert (
        "the host-local store /srv/t/big, which Multus's scratch files name, holds more than "
        "4,096 names: not in this boot's pre-runtime record; the DELs that would release from "
        "it are left"
    ) in first["warnings"], first["warnings"]
    assert (first_code, code) == (ExitCode.DATA, ExitCode.DATA), json.dumps(report)
    for run in (first, report):
        orphan = by_ip(run)["10.244.0.5"]
        assert (orphan["action"], orphan["outcome"]) == ("leave", "skipped"), orphan
        assert orphan["reason"] == (
            f"the host-local store /srv/t/big, which a delegate in Multus's scratch file "
            f"/var/lib/cni/multus/{A} names and no conf does, holds more than 4,096 names: it "
            "is not read, and no DEL that may release from it runs"
        )
    assert (root / "var/lib/cni/networks/multus-cni-network/10.244.0.5").exists()


def test_the_first_run_under_a_root_records_no_store_a_scratch_file_names(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under a --root no DEL through Multus runs: the first run read the Multus network's
    store and a scratch file for each owner, for a record no DEL of the run can use (the
    attack review of 0e90e6f: about 1 s for 20,000 owners with no scratch file). It reads
    neither, and records nothing they name."""
    root = crashed.node.root
    a_in_a_store_named_like_multus(crashed, tenant_delegate("/srv/nad"))
    (root / "srv/nad/big").mkdir(parents=True)
    crashed.reboot()

    crashed.run(capsys)

    record, problem = pre_runtime.load(str(root / "run"), BOOT_ID)
    assert problem is None and record is not None
    assert not [d for d in record.dirs if "srv/nad" in d]


@pytest.mark.parametrize("multus", ["deletes", "deletes nothing"])
@pytest.mark.parametrize("extras_config", [None, "its own"])
def test_on_the_node_an_orphan_another_orphans_del_through_multus_releases_rides_on_it(
    crashed: Crashed, extras_config: str | None, multus: str
) -> None:
    """Two orphans of one owner: one in the store of Multus's network, whose DEL through
    Multus also DELs the delegate extra under net1; the other, in extra's store. The second
    rides on the first's DEL, as the runtime's one DEL of the pod would have released it:
    done when that DEL released it, quarantined with it when it did not. Before, extra with
    no config: its move found the address gone since the scan, left alone, exit 65, for an
    address the run had itself released (noted at stop 61). Extra with a config of its own:
    a second DEL of the same attachment ran beside the first, racing it. The dry run says
    what the real run does."""
    deletes = multus == "deletes"
    stand_in = MULTUS_STAND_IN if deletes else MULTUS_DELETING_NOTHING
    bin_dir = crashed.node.fake_plugin_network("multus-cni-network", "multus", stand_in)
    ran = "/var/lib/cni/extra-ran"
    if extras_config:
        crashed.node.fake_plugin_network("extra", "recorder", f'echo "$CNI_COMMAND" >> {ran}\n')
    root = crashed.node.root
    node, own, extra = orphans_of_a_through_multus(crashed, None)
    argv = ["--bin-dir", "/" + str(bin_dir.relative_to(root)), "--bin-dir", PLUGIN_DIR]

    dry_code, dry = node.run("--dry-run", *argv)
    code, report = node.run(*argv)

    assert not (root / ran.lstrip("/")).exists()  # extra's own DEL never ran
    planned, found = by_ip(dry), by_ip(report)
    riding = (
        "an orphan: no results entry for it, so no runtime will ever DEL it; released by its "
        "owner's DEL through network multus-cni-network (ifname eth0), whose delegate keeps it"
    )
    assert planned["10.245.0.5"]["reason"] == found["10.245.0.5"]["reason"] == riding
    assert found["10.245.0.5"]["del"] == found["10.244.0.5"]["del"]
    assert found["10.244.0.5"]["del"]["plugins_run"] == ["multus"]
    if deletes:
        assert (dry_code, code) == (ExitCode.OK, ExitCode.OK), json.dumps(report["host_local"])
        assert [os.listdir(own), os.listdir(extra)] == [["lock"], ["lock"]]
        assert sorted(found["10.244.0.5"]["del"]["released"]) == ["10.244.0.5", "10.245.0.5"]
        assert [(d["outcome"], d["quarantined_to"], d.get("problem")) for d in found.values()] == [
            ("done", None, None),
            ("done", None, None),
        ]
        return
    # The DEL ran and left both: each goes to the quarantine, its one error said once.
    assert (dry_code, code) == (ExitCode.OK, ExitCode.ACTION_FAILED)
    assert [os.listdir(own), os.listdir(extra)] == [["lock"], ["lock"]]
    assert found["10.244.0.5"]["del"]["plugin_errors"][0]["msg"] == (
        "every plugin exited 0, but /var/lib/cni/networks/multus-cni-network still holds "
        "10.244.0.5; /var/lib/cni/networks/extra still holds 10.245.0.5 (ifname net1) for "
        "this attachment"
    )
    for d in found.values():
        assert (d["outcome"], d["problem"]) == (
            "done",
            "DEL ran, and the address is still reserved",
        )
        assert d["quarantined_to"] is not None
    assert report["summary"]["plugin_errors"] == 1


@pytest.mark.parametrize(
    "rider",
    [
        "a dataDir through a symlink",
        "ID-only",
        "in Multus's store, sorted first",
        "in Multus's store, sorted after",
    ],
)
def test_on_the_node_an_orphan_rides_on_the_del_however_its_store_and_address_are_named(
    crashed: Crashed, rider: str
) -> None:
    """The rider of ..._releases_rides_on_it in other places (the attack review of ad7c81f):
    - extra's store named by the delegate through a symlinked dataDir: it was not found as
      the rider (a path compared, not the dir), its move found the address gone, exit 65,
      and the dry run said 73;
    - an ID-only reservation (host-local before 0.7): it rides, as it held;
    - in Multus's own store under net1 (the second delegate keeps Multus's network name):
      with its address sorted first it claimed the scratch file, its DEL ran Multus under
      net1, an ifname the runtime never gave it, and Multus's own attachment was left with
      no DEL (exit 73). The orphans no other DEL releases now claim first."""
    bin_dir = crashed.node.fake_plugin_network("multus-cni-network", "multus", MULTUS_STAND_IN)
    root = crashed.node.root
    delegates, (own, extra) = two_delegates(root)
    delegates[0]["name"] = "multus-cni-network"
    own = own.rename(root / "var/lib/cni/networks/multus-cni-network")
    (own / "10.244.0.5").write_bytes(OWNER_A)
    where, rider_ip, owned = extra, "10.245.0.5", f"{A}\r\nnet1"
    if rider == "a dataDir through a symlink":
        (root / "var/lib/cni/nets-link").symlink_to("networks")
        delegates[1]["ipam"]["dataDir"] = "/var/lib/cni/nets-link"
    elif rider == "ID-only":
        owned = A
    else:
        where = own
        rider_ip = "10.243.0.5" if rider.endswith("first") else "10.245.0.5"
        delegates[1]["name"] = "multus-cni-network"
        delegates[1]["ipam"]["ranges"] = [[{"subnet": rider_ip[:-1] + "0/24"}]]
    (where / rider_ip).write_bytes(owned.encode())
    (root / "var/lib/cni/multus").mkdir(parents=True)
    (root / "var/lib/cni/multus" / A).write_text(multus_scratch(*delegates))
    crashed.node.results.mkdir(parents=True, mode=0o700)
    crashed.reboot()
    node = OnTheNode(crashed)
    node.record(
        "/var/lib/cni/networks/multus-cni-network",
        "/var/lib/cni/networks/extra",
        "/var/lib/cni/nets-link/extra",
    )
    argv = ["--bin-dir", "/" + str(bin_dir.relative_to(root)), "--bin-dir", PLUGIN_DIR]

    dry_code, dry = node.run("--dry-run", *argv)
    code, report = node.run(*argv)

    assert (dry_code, code) == (ExitCode.OK, ExitCode.OK), json.dumps(report["host_local"])
    assert [os.listdir(own), os.listdir(where)] == [["lock"], ["lock"]]
    planned, found = by_ip(dry), by_ip(report)
    assert planned[rider_ip]["reason"] == found[rider_ip]["reason"]
    assert found[rider_ip]["reason"].endswith(
        "released by its owner's DEL through network multus-cni-network (ifname eth0), whose "
        "delegate keeps it"
    )
    runner = found["10.244.0.5"]
    assert (runner["outcome"], runner["del"]["ifname"], runner["del"]["plugins_run"]) == (
        "done",
        "eth0",
        ["multus"],
    )
    assert sorted(runner["del"]["released"]) == sorted(["10.244.0.5", rider_ip])
    assert found[rider_ip]["del"] == runner["del"]


# Multus's DEL, slow for the container SLOW_ID's: its network's other DELs wait behind it.
MULTUS_SLOW_FOR = MULTUS_STAND_IN.replace(
    "|| exit 0\n", '|| exit 0\n[ "$CNI_CONTAINERID" = SLOW_ID ] && sleep SECONDS\n', 1
)
# ... and, through the cniDir multus-b, slow after its delegates, or failing before them.
MULTUS_B_SLOW_AFTER = 'case "$dir" in */multus-b) sleep 3;; esac\nrm -f "$f"\n'
MULTUS_B_FAILING = '[ -f "$f" ] || exit 0\ncase "$dir" in */multus-b) exit 1;; esac\n'


@pytest.mark.parametrize(
    "multus_b",
    [
        "released it first",
        "released it, still running",
        "failed, another teardown beside",
        "released it first, then A's file changed",
    ],
)
def test_on_the_node_a_rider_another_del_released_first_does_not_hold_back_its_del(
    crashed: Crashed, multus_b: str
) -> None:
    """Two Multus networks, each with an orphan of A, each scratch file naming the delegate
    zextra under net1, whose orphan rides on the first's (multus-a's) DEL, which waits behind
    a slow DEL of another container. multus-b's DEL runs first and:
    - releases the rider: the first's DEL found it gone since the scan and did not run at
      all, A's orphan left, exit 65 (the attack review of ad7c81f);
    - releases it and is still running when the first's DEL begins: that DEL was left
      (exit 65) as though nobody of this run had released it (the third review);
    - fails, while something else tears the pod down beside the reaper (the rider and
      multus-a's scratch file gone): the rider was taken as released by the failed DEL, and
      the first's DEL ran Multus with no scratch file (the third review);
    - releases the rider, and then multus-a's scratch file of A changes: the first's DEL is
      left for the next run (exit 65), and the rider, released by a DEL of this run, was
      reported skipped with it, with no DEL (the attack review of f0f91fa).
    A rider found gone is released by another DEL of this run only if it was there when that
    DEL began and gone once it was done (one under way is waited for): then the first's DEL
    runs, unless its scratch file changed; else it is left for the next run. A rider another
    DEL released is reported with that DEL, whatever became of the one it rode on."""
    d = CONTAINER_IDS[1]
    failing = multus_b.startswith("failed")
    slow = MULTUS_SLOW_FOR.replace("SLOW_ID", d).replace("SECONDS", "1" if failing else "2")
    if multus_b == "released it, still running":
        slow = slow.replace('rm -f "$f"\n', MULTUS_B_SLOW_AFTER)
    if multus_b.endswith("file changed"):  # as something beside the run rewriting it
        touch = f'case "$dir" in */multus-b) touch /var/lib/cni/multus/{A};; esac\nrm -f "$f"\n'
        slow = slow.replace('rm -f "$f"\n', touch)
    if failing:
        slow = slow.replace('[ -f "$f" ] || exit 0\n', MULTUS_B_FAILING)
        beside = (
            f"sleep 0.5\nrm -f /var/lib/cni/networks/zextra/10.245.0.5 /var/lib/cni/multus/{A}\n"
        )
        crashed.node.fake_plugin_network("aaa", "outsider", beside)
    bin_dir = crashed.node.fake_plugin_network("multus-a", "multus", slow)
    root = crashed.node.root
    networks = root / "var/lib/cni/networks"
    conf = {
        "cniVersion": "1.0.0",
        "name": "multus-b",
        "plugins": [{"type": "multus", "cniDir": "/var/lib/cni/multus-b"}],
    }
    crashed.node.write_conf("61-multus-b.conflist", json.dumps(conf).encode())
    subnets = {
        "multus-a": "10.244.0",
        "multus-b": "10.246.0",
        "zextra": "10.245.0",
    }
    if failing:
        subnets["aaa"] = "10.250.0"
    for name in subnets:
        (networks / name).mkdir(parents=True)
    if failing:
        (networks / "aaa/10.250.0.2").write_bytes(f"{CONTAINER_IDS[2]}\r\neth0".encode())
    (networks / "multus-a/10.244.0.5").write_bytes(OWNER_A)
    (networks / "multus-a/10.244.0.2").write_bytes(f"{d}\r\neth0".encode())
    (networks / "multus-b/10.246.0.5").write_bytes(OWNER_A)
    (networks / "zextra/10.245.0.5").write_bytes(f"{A}\r\nnet1".encode())  # the rider
    scratch = {"multus": ("multus-a", A), "multus-b": ("multus-b", A)}
    for cni_dir, (network, owner) in scratch.items():
        (root / "var/lib/cni" / cni_dir).mkdir(parents=True)
        delegates = (bridge(network, subnets[network]), bridge("zextra", "10.245.0"))
        (root / "var/lib/cni" / cni_dir / owner).write_text(multus_scratch(*delegates))
    (root / "var/lib/cni/multus" / d).write_text(multus_scratch(bridge("multus-a", "10.244.0")))
    crashed.node.results.mkdir(parents=True, mode=0o700)
    crashed.reboot()
    node = OnTheNode(crashed)
    node.record(*(f"/var/lib/cni/networks/{n}" for n in subnets))

    code, report = node.run(*plugin_dirs(root, bin_dir), "--parallel", "2" if failing else "4")

    found = by_ip(report)
    if failing:
        # multus-b's own DEL failed (73); multus-a's is left, its address not moved.
        assert code == ExitCode.ACTION_FAILED, json.dumps(report["host_local"])
        assert sorted(os.listdir(networks / "multus-a")) == ["10.244.0.5", "lock"]
        assert [found[ip]["outcome"] for ip in ("10.244.0.5", "10.245.0.5")] == ["skipped"] * 2
        assert found["10.244.0.5"]["problem"] == (
            "/var/lib/cni/networks/zextra/10.245.0.5 gone since the scan; left for the next run"
        )
        return
    if multus_b.endswith("file changed"):
        assert code == ExitCode.DATA, json.dumps(report["host_local"])
        assert sorted(os.listdir(networks / "multus-a")) == ["10.244.0.5", "lock"]
        assert found["10.244.0.5"]["outcome"] == "skipped"
        assert found["10.244.0.5"]["problem"] == (
            f"Multus's scratch file /var/lib/cni/multus/{A} its mtime and ctime changed; the "
            "DEL is left for the next run"
        )
    else:
        assert code == ExitCode.OK, json.dumps(report["host_local"])
        assert os.listdir(networks / "multus-a") == ["lock"]
        assert found["10.244.0.5"]["outcome"] == "done"
        assert found["10.244.0.5"]["del"]["released"] == ["10.244.0.5"]
        assert not (root / "var/lib/cni/multus" / A).exists()
    assert [os.listdir(networks / n) for n in ("multus-b", "zextra")] == [["lock"]] * 2
    assert [found[ip]["outcome"] for ip in ("10.246.0.5", "10.245.0.5")] == ["done"] * 2
    assert found["10.245.0.5"]["reason"].endswith(
        "released by its owner's DEL through network multus-b (ifname eth0) before the one it "
        "rode on ran"
    )
    assert found["10.245.0.5"]["del"] == found["10.246.0.5"]["del"]
    assert "10.245.0.5" in found["10.246.0.5"]["del"]["released"]


def test_on_the_node_multus_s_own_attachment_claims_a_scratch_file_two_multus_read(
    crashed: Crashed,
) -> None:
    """Two Multus networks reading one cniDir (both the default), A's one scratch file naming
    multus-a's delegate (eth0) and zextra's (net1); A's orphans in multus-a, multus-b and
    zextra. multus-b's DEL would read multus-a's file: it releases multus-a's and zextra's
    addresses, never its own. It claimed the file first (its orphan held by no other DEL),
    ran, and failed for all three; the dry run said 0 (the second attack review of the
    riding). A DEL through Multus that would not release its own orphan does not run: the
    one through multus-a does, zextra's address rides on it, multus-b's is quarantined with
    no DEL, and the dry run says so."""
    bin_dir = crashed.node.fake_plugin_network("multus-a", "multus", MULTUS_STAND_IN)
    conf = {"cniVersion": "1.0.0", "name": "multus-b", "plugins": [{"type": "multus"}]}
    crashed.node.write_conf("61-multus-b.conflist", json.dumps(conf).encode())
    root = crashed.node.root
    networks = root / "var/lib/cni/networks"
    subnets = {"multus-a": "10.244.0", "multus-b": "10.246.0", "zextra": "10.245.0"}
    for name, subnet in subnets.items():
        (networks / name).mkdir(parents=True)
        ifname = "net1" if name == "zextra" else "eth0"
        (networks / name / f"{subnet}.5").write_bytes(f"{A}\r\n{ifname}".encode())
    (root / "var/lib/cni/multus").mkdir(parents=True)
    scratch = multus_scratch(bridge("multus-a", "10.244.0"), bridge("zextra", "10.245.0"))
    (root / "var/lib/cni/multus" / A).write_text(scratch)
    crashed.node.results.mkdir(parents=True, mode=0o700)
    crashed.reboot()
    node = OnTheNode(crashed)
    node.record(*(f"/var/lib/cni/networks/{n}" for n in subnets))
    argv = ["--bin-dir", "/" + str(bin_dir.relative_to(root)), "--bin-dir", PLUGIN_DIR]

    dry_code, dry = node.run("--dry-run", *argv)
    code, report = node.run(*argv)

    assert (dry_code, code) == (ExitCode.ACTION_FAILED, ExitCode.ACTION_FAILED)
    assert [os.listdir(networks / n) for n in subnets] == [["lock"]] * 3
    found = by_ip(report)
    own = found["10.244.0.5"]["del"]
    assert (own["config"], own["ok"]) == ("/etc/cni/net.d/60-multus-a.conflist", True)
    assert sorted(own["released"]) == ["10.244.0.5", "10.245.0.5"]
    assert found["10.245.0.5"]["del"] == own
    b = found["10.246.0.5"]
    assert (b["del"]["plugins_run"], b["quarantined_to"] is not None) == ([], True)
    assert (
        b["del"]["config_problem"]
        == by_ip(dry)["10.246.0.5"]["del"]["config_problem"]
        == (
            "its DEL through Multus would not release it: Multus's scratch file names no delegate "
            "that keeps it in its store under its ifname"
        )
    )
    assert report["summary"]["plugin_errors"] == 1


def test_on_the_node_a_del_through_multus_whose_delegates_hold_nothing_of_its_owner_is_not_run(
    crashed: Crashed,
) -> None:
    """A's orphan in multus-a's store; A's scratch file names one delegate, zextra, whose
    store holds nothing of A's. The DEL through multus-a would DEL zextra and release no
    address: before, it ran (Multus's DEL, the scratch file removed), left the orphan held,
    and exited 73, while the dry run said 0. A DEL through Multus that would release nothing
    of its own orphan is refused as one whose delegates keep something else is: no plugin
    runs, the orphan is quarantined, and the dry run says so."""
    bin_dir = crashed.node.fake_plugin_network("multus-a", "multus", MULTUS_STAND_IN)
    root = crashed.node.root
    networks = root / "var/lib/cni/networks"
    (networks / "multus-a").mkdir(parents=True)
    (networks / "multus-a" / "10.244.0.5").write_bytes(f"{A}\r\neth0".encode())
    (networks / "zextra").mkdir(parents=True)
    (root / "var/lib/cni/multus").mkdir(parents=True)
    scratch = root / "var/lib/cni/multus" / A
    scratch.write_text(multus_scratch(bridge("zextra", "10.245.0")))
    crashed.node.results.mkdir(parents=True, mode=0o700)
    crashed.reboot()
    node = OnTheNode(crashed)
    node.record("/var/lib/cni/networks/multus-a", "/var/lib/cni/networks/zextra")

    dry_code, dry = node.run("--dry-run", *plugin_dirs(root, bin_dir))
    code, report = node.run(*plugin_dirs(root, bin_dir))

    assert (dry_code, code) == (ExitCode.ACTION_FAILED, ExitCode.ACTION_FAILED)
    assert os.listdir(networks / "multus-a") == ["lock"]
    assert scratch.exists()  # Multus never ran
    own = by_ip(report)["10.244.0.5"]
    assert (own["del"]["plugins_run"], own["quarantined_to"] is not None) == ([], True)
    assert (
        own["del"]["config_problem"]
        == by_ip(dry)["10.244.0.5"]["del"]["config_problem"]
        == (
            "its DEL through Multus would not release it: Multus's scratch file names no delegate "
            "that keeps it in its store under its ifname"
        )
    )


def orphans_of_a_through_multus_after(
    crashed: Crashed, beside: str
) -> tuple[OnTheNode, Path, Path, list[str]]:
    """orphans_of_a_through_multus() (no NAD store), Multus the stand-in, and before them an
    orphan of another container in network aaa, whose plugin is the script beside: with
    --parallel 1 its DEL runs first. The run's --bin-dir arguments are returned too."""
    bin_dir = crashed.node.fake_plugin_network("multus-cni-network", "multus", MULTUS_STAND_IN)
    crashed.node.fake_plugin_network("aaa", "outsider", beside)
    root = crashed.node.root
    aaa = root / "var/lib/cni/networks/aaa"
    aaa.mkdir(parents=True)
    (aaa / "10.250.0.2").write_bytes(f"{CONTAINER_IDS[1]}\r\neth0".encode())
    node, own, extra = orphans_of_a_through_multus(crashed, None, "/var/lib/cni/networks/aaa")
    return node, own, extra, plugin_dirs(root, bin_dir)


# What tears the pod down beside the reaper, as the runtime's own DEL through Multus of a
# sandbox it knows would: the delegate's address and the scratch file gone. It runs as the
# plugin of another container's orphan, in a network whose DEL runs first.
TEARDOWN_BESIDE = f"""[ "$CNI_COMMAND" = DEL ] || exit 0
rm -f /var/lib/cni/networks/extra/10.245.0.5 /var/lib/cni/multus/{A}
rm -f /var/lib/cni/networks/aaa/10.250.0.2
"""


def test_on_the_node_a_rider_gone_with_no_del_of_this_run_to_release_it_holds_back_its_del(
    crashed: Crashed,
) -> None:
    """A rider found gone is released by another DEL of this run only if one that holds it
    has run. Here none has: something else removed it and Multus's scratch file between the
    plan and the DEL it rides on. That DEL ran Multus with no scratch file to read (the DEL
    claim_delegates forbids: Multus would DEL the networks the API server names), it was
    reported released by another DEL, and A's address was moved to the quarantine (the
    second attack review of the riding). The DEL is left for the next run, exit 65."""
    node, own, _, argv = orphans_of_a_through_multus_after(crashed, TEARDOWN_BESIDE)

    code, report = node.run(*argv, "--parallel", "1")

    assert code == ExitCode.DATA, json.dumps(report["host_local"])
    assert os.listdir(own) == ["10.244.0.5"]
    found = by_ip(report)
    assert [found[ip]["outcome"] for ip in ("10.244.0.5", "10.245.0.5")] == ["skipped"] * 2
    assert found["10.244.0.5"]["problem"] == (
        "/var/lib/cni/networks/extra/10.245.0.5 gone since the scan; left for the next run"
    )


# A teardown beside the reaper that takes only Multus's scratch file of A away, or an ADD of
# A's rewriting it in place, as the plugin of another container's orphan whose DEL runs first.
SCRATCH_FILE_CHANGED_BESIDE = {
    "removed": f"""[ "$CNI_COMMAND" = DEL ] || exit 0
rm -f /var/lib/cni/multus/{A} /var/lib/cni/networks/aaa/10.250.0.2
""",
    "rewritten": f"""[ "$CNI_COMMAND" = DEL ] || exit 0
printf '[]' > /var/lib/cni/multus/{A}
rm -f /var/lib/cni/networks/aaa/10.250.0.2
""",
}


@pytest.mark.parametrize("scratch_file", sorted(SCRATCH_FILE_CHANGED_BESIDE))
def test_on_the_node_a_del_through_multus_whose_scratch_file_changed_since_the_plan_is_left(
    crashed: Crashed, scratch_file: str
) -> None:
    """A's orphans, one riding on the other's DEL through Multus; between the plan and that
    DEL something beside the reaper removes Multus's scratch file of A, or rewrites it. The
    DEL ran Multus all the same: with no file, the real Multus DELs the networks the API
    server names (the DEL claim_delegates forbids), here a stand-in that then does nothing,
    and both addresses, still held, were moved to the quarantine (exit 73). Found by reading
    the third attack review of the riding. The DEL is now left for the next run, exit 65,
    both addresses where they were."""
    beside = SCRATCH_FILE_CHANGED_BESIDE[scratch_file]
    node, own, extra, argv = orphans_of_a_through_multus_after(crashed, beside)

    code, report = node.run(*argv, "--parallel", "1")

    assert code == ExitCode.DATA, json.dumps(report["host_local"])
    assert (os.listdir(own), os.listdir(extra)) == (["10.244.0.5"], ["10.245.0.5"])
    found = by_ip(report)
    assert [found[ip]["outcome"] for ip in ("10.244.0.5", "10.245.0.5")] == ["skipped"] * 2
    why = (
        "gone since it was read"
        if scratch_file == "removed"
        else "its size and mtime and ctime changed"
    )
    assert found["10.244.0.5"]["problem"] == (
        f"Multus's scratch file /var/lib/cni/multus/{A} {why}; the DEL is left for the next run"
    )
    assert found["10.250.0.2"]["outcome"] == "done"


@pytest.mark.parametrize("scratch_file", sorted(SCRATCH_FILE_CHANGED_BESIDE))
def test_on_the_node_an_entry_s_del_through_multus_whose_scratch_file_changed_is_left(
    crashed: Crashed, scratch_file: str
) -> None:
    """The same for a damaged entry's DEL through Multus: the DEL of another container's
    entry of the network, run just before it, has a delegate that takes A's scratch file
    away or rewrites it. Multus ran all the same (with no file the real one DELs what the
    API server names), and the entry was quarantined, exit 0. Now the entry is left where
    it is for the next run (exit 65), and no plugin of its DEL runs. The addresses A's
    delegates keep, which no entry of their networks names, are released as orphans all the
    same (here into the quarantine: no config of cbr0 or extra on the node, exit 73), as
    they are where the entry's DEL is doubted for good; their reason said "no results entry
    for it", where one is there, and now names it."""
    crashed.node.fake_plugin_network("multus-cni-network", "multus", MULTUS_STAND_IN)
    crashed.node.fake_plugin_network("aaa", "outsider", SCRATCH_FILE_CHANGED_BESIDE[scratch_file])
    root = crashed.node.root
    delegates, stores = two_delegates(root)
    held = {"10.244.0.5": OWNER_A, "10.245.0.5": f"{A}\r\nnet1".encode()}
    for store, (ip, owner) in zip(stores, held.items()):
        (store / ip).write_bytes(owner)
    scratch_dir = root / "var/lib/cni/multus"
    scratch_dir.mkdir(parents=True)
    (scratch_dir / A).write_text(multus_scratch(*delegates))
    entry = crashed.node.write_result(f"multus-cni-network-{A}-eth0", b"")
    # Another pod of the network, before A's in the plan: its DEL runs first.
    before = "0f" * 32
    (scratch_dir / before).write_text(multus_scratch({"name": "aaa", "type": "outsider"}))
    crashed.node.write_result(f"multus-cni-network-{before}-eth0", b"")
    crashed.reboot()
    node = OnTheNode(crashed)
    node.record("/var/lib/cni/networks/cbr0", "/var/lib/cni/networks/extra")

    code, report = node.run("--bin-dir", "/opt/cni/bin", "--bin-dir", PLUGIN_DIR, "--parallel", "2")

    assert code == ExitCode.ACTION_FAILED, report
    assert entry.exists()
    assert [os.listdir(store) for store in stores] == [["lock"], ["lock"]]
    reason = (
        "no results entry of its network names it, and its owner's results entry of "
        "multus-cni-network, whose DEL through Multus releases it, was left for a later run: "
        "released as an orphan now, which that DEL finds done; no DEL can run, so it goes to "
        "the quarantine"
    )
    assert [(r["ip"], r["action"], r["outcome"], r["reason"]) for r in report["host_local"]] == [
        (ip, "del", "done", reason) for ip in held
    ]
    first, mine = report["entries"]
    assert (first["container_id"], first["outcome"]) == (before, "done")
    why = (
        "gone since it was read"
        if scratch_file == "removed"
        else "its size and mtime and ctime changed"
    )
    assert (
        mine["container_id"],
        mine["outcome"],
        mine["del"]["plugins_run"],
        mine["problems"],
    ) == (
        A,
        "skipped",
        [],
        [f"Multus's scratch file /var/lib/cni/multus/{A} {why}; the DEL is left for the next run"],
    )


def test_on_the_node_a_scratch_file_go_cannot_decode_is_read_as_none_whose_delegates_can_be(
    crashed: Crashed,
) -> None:
    """A's scratch file is whole JSON but for a NaN in one delegate's item: Go's decoder
    (Multus's DEL) rejects it, and so does the reaper's verdict on the file, which moves it
    to the quarantine as garbage. The delegates' reading took it (Python's json takes NaN),
    so the damaged Multus entry's DEL through Multus was planned too, reading the file the
    run then moved: the dry run said 0; the boot's first real run found the file "gone since
    it was read" and left the entry (exit 65), blaming something beside the run for its own
    move; the next refused the DEL (73). Found by the attack review of f0f91fa. Read as Go
    reads it, the file is one whose delegates cannot be read: no DEL through it runs, the
    entry is quarantined, 73 in the dry run and the real run alike."""
    nad, _ = nad_with_a_store_of_this_boot(crashed)
    scratch = multus_scratch(CBR0, nad).replace('"Name": "cbr0"', '"Name": "cbr0", "x": NaN', 1)
    assert "NaN" in scratch
    multus_node_with_a_nad_store(crashed, nad, scratch)
    node = OnTheNode(crashed)  # no record before: this run, the boot's first, takes it
    argv = ("--bin-dir", "/opt/cni/bin", "--bin-dir", PLUGIN_DIR)

    dry_code, dry = node.run(*argv, "--dry-run")
    code, report = node.run(*argv)

    (planned,) = dry["entries"]
    (found,) = report["entries"]
    assert not any("gone since it was read" in p for p in found["problems"]), found["problems"]
    assert (dry_code, code) == (ExitCode.ACTION_FAILED, ExitCode.ACTION_FAILED)
    assert found["del"]["plugins_run"] == []
    assert planned["del"]["config_problem"] == found["del"]["config_problem"]
    assert found["del"]["config_problem"].startswith("Multus has no scratch file ")


@pytest.mark.parametrize("first", [True, False])
def test_on_the_node_a_delegate_named_with_a_nul_leaves_the_del_and_the_run_goes_on(
    crashed: Crashed, first: bool
) -> None:
    """A delegate in Multus's scratch file whose network name holds a NUL names no store
    host-local could make: its DEL is left, as for any store that cannot be reached. Its
    store's path ended the boot's first run in a traceback (exit 1) before it kept the
    record, so no run of the boot could repair; reached first, in the dry run too (found
    by the attack review of cf2c5bc)."""
    crashed.node.fake_plugin_network("multus-cni-network", "multus", MULTUS_STAND_IN)
    root = crashed.node.root
    delegates, (cbr0, _) = two_delegates(root)
    delegates[1]["name"] = "x\u0000y"
    if not first:
        again = {"cniVersion": "1.0.0", "name": "again", "type": "multus"}
        delegates.insert(1, again)
    (cbr0 / "10.244.0.5").write_bytes(OWNER_A)
    (root / "var/lib/cni/multus").mkdir(parents=True)
    (root / "var/lib/cni/multus" / A).write_text(multus_scratch(*delegates))
    entry = crashed.node.write_result(f"multus-cni-network-{A}-eth0", b"")
    crashed.reboot()
    node = OnTheNode(crashed)  # no record taken before: this run takes it
    argv = ("--bin-dir", "/opt/cni/bin", "--bin-dir", PLUGIN_DIR)

    dry_code, dry = node.run(*argv, "--dry-run")
    code, report = node.run(*argv)

    # 73: cbr0's address, which no entry names now, is released by the reaper alone.
    assert (dry_code, code) == (ExitCode.ACTION_FAILED, ExitCode.ACTION_FAILED), report
    runs = f"Multus's DEL runs the delegates its scratch file /var/lib/cni/multus/{A} names, "
    why = "one of which keeps a host-local store that cannot be reached"
    if not first:
        why = "one of which delegates again: what that would release is not read"
    for run in (dry, report):
        (found,) = run["entries"]
        assert (found["action"], found["reason"]) == ("leave", runs + why)
        assert by_ip(run)["10.244.0.5"]["action"] == "del"
    assert entry.exists()
    assert os.listdir(root / "run/cni-reaper/pre-runtime") == [BOOT_ID]


def multus_node_with_a_nad_store(
    crashed: Crashed, nad: dict[str, Any], scratch: list[dict[str, Any]] | str | None = None
) -> tuple[Path, Path, Path]:
    """A damaged Multus entry of A whose scratch file names cbr0 (the default dataDir) and a
    second delegate of the given config, as a NetworkAttachmentDefinition gives it (no conf in
    net.d names it); each holds an earlier boot's address of A, in this boot's record. Returns
    the entry and the two stores."""
    crashed.node.fake_plugin_network("multus-cni-network", "multus", MULTUS_STAND_IN)
    root = crashed.node.root
    ipam = {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]]}
    cbr0: dict[str, Any] = {"cniVersion": "1.0.0", "name": "cbr0", "type": "bridge", "ipam": ipam}
    (root / "var/lib/cni/multus").mkdir(parents=True)
    written = multus_scratch(cbr0, nad) if scratch is None else scratch
    if not isinstance(written, str):
        written = json.dumps(written)
    (root / "var/lib/cni/multus" / A).write_text(written)
    default = root / "var/lib/cni/networks/cbr0"
    default.mkdir(parents=True)
    (default / "10.244.0.5").write_bytes(OWNER_A)
    data_dir = nad["ipam"]["dataDir"]
    second = root / data_dir.lstrip("/") / nad["name"]
    second.mkdir(parents=True)
    (second / "10.245.0.5").write_bytes(f"{A}\r\nnet1".encode())
    for delegate, ifname in ((cbr0, "eth0"), (nad, "net1")):
        # What libcni cached of each delegate's ADD, in Multus's own cache dir.
        name = f"{delegate['name']}-{A}-{ifname}"
        cached = cache_entry_bytes(json.dumps(delegate).encode(), delegate["name"], A, ifname)
        result = root / "var/lib/cni/multus/results" / name
        result.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        result.write_bytes(cached)
    entry = crashed.node.write_result(f"multus-cni-network-{A}-eth0", b"")
    crashed.reboot()
    return entry, default, second


@pytest.mark.parametrize("this_boot", [True, False])
def test_on_the_node_multus_is_held_to_the_store_of_every_delegate_its_scratch_file_names(
    crashed: Crashed, this_boot: bool
) -> None:
    """A delegate Multus's scratch file names may keep its addresses in a dataDir no conf
    names (a NetworkAttachmentDefinition's): its store is read too, and one holding an
    address of the owner from this boot leaves the DEL (found by the attack review at
    --root /: the DEL ran and released it, exit 0, and the report named no such store)."""
    ipam: dict[str, Any] = {"type": "host-local", "dataDir": "/var/lib/cni/macvlan-ipam"}
    ipam["ranges"] = [[{"subnet": "10.245.0.0/24"}]]
    nad: dict[str, Any] = {"cniVersion": "1.0.0", "name": "extra", "type": "bridge"}
    nad["ipam"] = ipam
    entry, default, second = multus_node_with_a_nad_store(crashed, nad)
    node = OnTheNode(crashed)
    node.record("/var/lib/cni/networks/cbr0", "/var/lib/cni/macvlan-ipam/extra")
    if this_boot:
        (second / "10.245.0.9").write_bytes(f"{A}\r\nnet1".encode())

    code, report = node.run("--bin-dir", "/opt/cni/bin", "--bin-dir", PLUGIN_DIR)

    (found,) = report["entries"]
    if not this_boot:
        assert code == ExitCode.OK, report
        assert not entry.exists() and os.listdir(second) == ["lock"]
        assert (found["outcome"], found["del"]["plugins_run"]) == ("done", ["multus"])
        return
    assert code == ExitCode.DATA
    assert entry.exists() and sorted(os.listdir(second)) == ["10.245.0.5", "10.245.0.9"]
    assert os.listdir(default) == ["10.244.0.5"]
    assert (found["action"], found["del"]) == ("leave", None)
    assert found["reason"].startswith(
        "host-local's DEL would also release /var/lib/cni/macvlan-ipam/extra/10.245.0.9"
    )


def nad_with_a_store_of_this_boot(crashed: Crashed, **extra: Any) -> tuple[dict[str, Any], Path]:
    """extra, a delegate a NetworkAttachmentDefinition gives, keeping its addresses in
    /var/lib/cni/nad-ipam; returns its config and its store."""
    ipam = {"type": "host-local", "dataDir": "/var/lib/cni/nad-ipam"}
    nad: dict[str, Any] = {"cniVersion": "1.0.0", "name": "extra", "type": "bridge", **extra}
    nad["ipam"] = {**ipam, "ranges": [[{"subnet": "10.245.0.0/24"}]]}
    return nad, crashed.node.root / "var/lib/cni/nad-ipam/extra"


def the_nads_address_of_this_boot_leaves_the_del(
    crashed: Crashed, entry: Path, store: Path
) -> None:
    """Run on the node with an address of A reserved in this boot (after the record) in the
    NAD's store: the Multus entry's DEL is left for it (exit 65), the entry and both of the
    store's addresses where they were."""
    node = OnTheNode(crashed)
    node.record("/var/lib/cni/networks/cbr0", "/var/lib/cni/nad-ipam/extra")
    (store / "10.245.0.9").write_bytes(f"{A}\r\nnet1".encode())

    code, report = node.run("--bin-dir", "/opt/cni/bin", "--bin-dir", PLUGIN_DIR)

    assert code == ExitCode.DATA
    assert entry.exists() and sorted(os.listdir(store)) == ["10.245.0.5", "10.245.0.9"]
    (found,) = report["entries"]
    assert found["reason"].startswith(
        "host-local's DEL would also release /var/lib/cni/nad-ipam/extra/10.245.0.9"
    )


def b64(doc: dict[str, Any]) -> str:
    return base64.b64encode(json.dumps(doc).encode()).decode()


CBR0 = {
    "cniVersion": "1.0.0",
    "name": "cbr0",
    "type": "bridge",
    "ipam": {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]]},
}


@pytest.mark.parametrize(
    "spelling", ["a conf with a plugins key", "Bytes given twice", "ConfList's plugins null"]
)
def test_on_the_node_a_scratch_file_is_read_as_multus_reads_it(
    crashed: Crashed, spelling: str
) -> None:
    """Multus's DEL runs a delegate as a conflist only where its item's ConfList has plugins,
    else its Bytes as one plugin's config, "plugins" key or not; Go decodes the file in its
    order, a key in any case, the last one winning. Read otherwise, the delegate's store
    went unread and its address of this boot was released, exit 0 (found by the attack
    review of 780275b)."""
    scratch: list[dict[str, str]] | str
    if spelling == "a conf with a plugins key":
        nad, store = nad_with_a_store_of_this_boot(crashed, plugins=[{"type": "tuning"}])
        scratch = [{"Name": "cbr0", "Bytes": b64(CBR0)}, {"Name": "extra", "Bytes": b64(nad)}]
    elif spelling == "Bytes given twice":
        nad, store = nad_with_a_store_of_this_boot(crashed)
        decoy = {**nad, "ipam": {"type": "static"}}
        second = {"bytes": b64(decoy), "Name": "extra", "Bytes": b64(nad)}
        scratch = [{"Name": "cbr0", "Bytes": b64(CBR0)}, second]
    else:  # a null empties the slice, as Go decodes it (found by the review of c4138ba)
        nad, store = nad_with_a_store_of_this_boot(crashed, plugins=[{"type": "tuning"}])
        listed = '{"plugins": [{"type": "tuning"}], "plugins": null}'
        item = f'{{"Name": "extra", "ConfList": {listed}, "Bytes": "{b64(nad)}"}}'
        scratch = f'[{{"Name": "cbr0", "Bytes": "{b64(CBR0)}"}}, {item}]'
    entry, _, second_store = multus_node_with_a_nad_store(crashed, nad, scratch)
    assert second_store == store
    the_nads_address_of_this_boot_leaves_the_del(crashed, entry, store)


@pytest.mark.parametrize("what", ["two entries", "two orphans"])
def test_on_the_node_only_the_first_del_of_a_container_through_multus_runs(
    crashed: Crashed, what: str
) -> None:
    """Multus's DEL removes the scratch file it read: a second DEL of the same container
    through Multus (another ifname's entry or orphan) finds none and DELs the pod's networks
    the API server names, whose stores this run does not read. Only the first DEL planned
    runs; the second entry is quarantined with no DEL, the second orphan released by the
    reaper alone (found by the attack review of c4138ba: both were planned from one reading,
    and the second released an address of this boot, exit 0)."""
    bin_dir = crashed.node.fake_plugin_network("multus-cni-network", "multus", MULTUS_STAND_IN)
    root = crashed.node.root
    (root / "var/lib/cni/multus").mkdir(parents=True)
    own_ipam = {"type": "host-local", "ranges": [[{"subnet": "10.250.0.0/24"}]]}
    own = {"cniVersion": "1.0.0", "name": "multus-cni-network", "type": "bridge", "ipam": own_ipam}
    (root / "var/lib/cni/multus" / A).write_text(multus_scratch(own))
    store = root / "var/lib/cni/networks/multus-cni-network"
    store.mkdir(parents=True)
    if what == "two entries":
        for ifname in ("eth0", "net5"):
            crashed.node.write_result(f"multus-cni-network-{A}-{ifname}", b"")
    else:
        crashed.node.results.mkdir(parents=True, mode=0o700)
        (store / "10.250.0.5").write_bytes(OWNER_A)
        (store / "10.250.0.7").write_bytes(f"{A}\r\nnet7".encode())
    crashed.reboot()
    node = OnTheNode(crashed)
    node.record("/var/lib/cni/networks/multus-cni-network")

    code, report = node.run(
        "--bin-dir", "/" + str(bin_dir.relative_to(root)), "--bin-dir", PLUGIN_DIR
    )

    found = report["entries"] if what == "two entries" else report["host_local"]
    assert code == ExitCode.ACTION_FAILED, report
    ran = sorted((f["del"]["plugins_run"], f["del"]["config_problem"] or "") for f in found)
    assert [plugins for plugins, _ in ran] == [[], ["multus"]]
    assert ran[0][1].startswith(
        "a DEL of another attachment of the container through Multus, planned before, removes "
        f"its scratch file /var/lib/cni/multus/{A}"
    )
    assert os.listdir(store) in ([], ["lock"])


def multus_scratch_of_a(crashed: Crashed, alias: bool) -> Path:
    """A's scratch file in Multus's default cniDir, naming one delegate (its own network
    again), and, if alias, /var/lib/cni/multus-alias, a symlink to that dir; returns the
    plugin dir of the stand-in."""
    bin_dir = crashed.node.fake_plugin_network("multus-cni-network", "multus", MULTUS_STAND_IN)
    root = crashed.node.root
    (root / "var/lib/cni/multus").mkdir(parents=True)
    if alias:
        (root / "var/lib/cni/multus-alias").symlink_to("multus")
    own_ipam = {"type": "host-local", "ranges": [[{"subnet": "10.250.0.0/24"}]]}
    own = {"cniVersion": "1.0.0", "name": "multus-cni-network", "type": "bridge", "ipam": own_ipam}
    (root / "var/lib/cni/multus" / A).write_text(multus_scratch(own))
    (root / "var/lib/cni/networks/multus-cni-network").mkdir(parents=True)
    return bin_dir


@pytest.mark.parametrize("second", [{}, {"cniDir": "/var/lib/cni/multus-alias"}])
def test_on_the_node_two_multus_of_a_chain_reading_one_scratch_file_run_no_del(
    crashed: Crashed, second: dict[str, str]
) -> None:
    """Two Multus of one chain whose cniDirs name one dir (the same name, or one through a
    symlink): the DEL runs the later one first, which removes the file, and the other finds
    none and DELs the pod's networks the API server names, whose stores this run does not
    read. The entry is quarantined with no DEL (found by the attack review of d60dcdf: both
    ran, and a NAD's address of this boot was released, exit 0)."""
    bin_dir = multus_scratch_of_a(crashed, alias=bool(second))
    chain = [{"type": "multus"}, {"type": "multus", **second}]
    conf = {"cniVersion": "1.0.0", "name": "multus-cni-network", "plugins": chain}
    crashed.node.write_conf("60-multus-cni-network.conflist", json.dumps(conf).encode())
    entry = crashed.node.write_result(f"multus-cni-network-{A}-eth0", b"")
    crashed.reboot()
    node = OnTheNode(crashed)
    node.record("/var/lib/cni/networks/multus-cni-network")

    code, report = node.run(
        "--bin-dir", "/" + str(bin_dir.relative_to(crashed.node.root)), "--bin-dir", PLUGIN_DIR
    )

    assert code == ExitCode.ACTION_FAILED, report
    assert not entry.exists()
    assert (crashed.node.root / "var/lib/cni/multus" / A).exists()
    (found,) = report["entries"]
    assert (found["outcome"], found["del"]["plugins_run"]) == ("failed", [])
    assert found["del"]["config_problem"].startswith(
        "two Multus of the chain read one scratch file, /var/lib/cni/multus"
    )


@pytest.mark.parametrize("parallel", ["1", "4"])
def test_on_the_node_two_multus_networks_reading_one_scratch_file_run_one_del(
    crashed: Crashed, parallel: str
) -> None:
    """Two Multus networks whose cniDirs are one dir, the second's through a symlink, each
    with a damaged entry of A: only the first DEL planned runs Multus; the other, which would
    find the file removed, is quarantined with no DEL. Scratch files are claimed by the file,
    not by its name (found by the attack review of d60dcdf: with --parallel 4 both ran, and
    a NAD's address of this boot was released, exit 0)."""
    bin_dir = multus_scratch_of_a(crashed, alias=True)
    chain = [{"type": "multus", "cniDir": "/var/lib/cni/multus-alias"}]
    conf = {"cniVersion": "1.0.0", "name": "multus-b", "plugins": chain}
    crashed.node.write_conf("61-multus-b.conflist", json.dumps(conf).encode())
    for network in ("multus-cni-network", "multus-b"):
        crashed.node.write_result(f"{network}-{A}-eth0", b"")
    crashed.reboot()
    node = OnTheNode(crashed)
    node.record("/var/lib/cni/networks/multus-cni-network")

    code, report = node.run(
        "--bin-dir",
        "/" + str(bin_dir.relative_to(crashed.node.root)),
        "--bin-dir",
        PLUGIN_DIR,
        "--parallel",
        parallel,
    )

    assert code == ExitCode.ACTION_FAILED, report
    ran = sorted(
        (f["del"]["plugins_run"], f["del"]["config_problem"] or "") for f in report["entries"]
    )
    assert [plugins for plugins, _ in ran] == [[], ["multus"]]
    # Planned before the first DEL ran (in parallel) it is held by the first one's claim, or
    # after it ran (one at a time) by the file it removed.
    assert ran[0][1].startswith(
        (
            "a DEL of another attachment of the container through Multus, planned before, "
            "removes its scratch file /var/lib/cni/multus",
            "Multus has no scratch file /var/lib/cni/multus",
        )
    ), ran


def test_on_the_node_the_orphans_of_one_attachment_through_multus_share_its_one_del(
    crashed: Crashed,
) -> None:
    """A dual-stack pod's two addresses, orphans of one attachment in the store of the
    delegate that keeps Multus's network name: one DEL through Multus releases both. The
    second orphan found the scratch file claimed by the first, as if another attachment's
    DEL would remove it, and was held (exit 65, a wrong reason; found by the attack review
    of 8b7cbd0)."""
    bin_dir = multus_scratch_of_a(crashed, alias=False)
    root = crashed.node.root
    own_ipam = {
        "type": "host-local",
        "ranges": [[{"subnet": "10.250.0.0/24"}], [{"subnet": "fd00::/64"}]],
    }
    own = {"cniVersion": "1.0.0", "name": "multus-cni-network", "type": "bridge", "ipam": own_ipam}
    (root / "var/lib/cni/multus" / A).write_text(multus_scratch(own))
    store = root / "var/lib/cni/networks/multus-cni-network"
    (store / "10.250.0.5").write_bytes(OWNER_A)
    (store / "fd00::5").write_bytes(OWNER_A)
    crashed.node.results.mkdir(parents=True, mode=0o700)
    crashed.reboot()
    node = OnTheNode(crashed)
    node.record("/var/lib/cni/networks/multus-cni-network")

    code, report = node.run(
        "--bin-dir", "/" + str(bin_dir.relative_to(root)), "--bin-dir", PLUGIN_DIR
    )

    assert code == ExitCode.OK, report
    assert os.listdir(store) == ["lock"]
    for found in report["host_local"]:
        assert (found["outcome"], found["del"]["plugins_run"]) == ("done", ["multus"])
        assert sorted(found["del"]["released"]) == ["10.250.0.5", "fd00::5"]


def test_on_the_node_the_boots_first_run_records_the_stores_multus_s_delegates_keep(
    crashed: Crashed,
) -> None:
    """The unit's run, the boot's first, takes the pre-runtime record itself: of the conf
    dirs' stores only, not of a NetworkAttachmentDefinition's dataDir that only Multus's
    scratch file names. Its earlier boot's address of the owner was then judged against a
    record without its dir (this boot's) and the DEL left (exit 65), where the dry run,
    keeping no record, planned it (exit 0). Now the stores the planned DELs' delegates keep
    are recorded with the others, and a dry run judges a dir no record would hold as the
    real run does."""
    nad, store = nad_with_a_store_of_this_boot(crashed)
    entry, default, _ = multus_node_with_a_nad_store(crashed, nad)
    node = OnTheNode(crashed)  # no record taken before: this run takes it
    argv = ("--bin-dir", "/opt/cni/bin", "--bin-dir", PLUGIN_DIR)

    dry_code, dry = node.run(*argv, "--dry-run")
    code, report = node.run(*argv)

    assert (dry_code, code) == (ExitCode.OK, ExitCode.OK), report
    (planned,) = dry["entries"]
    assert (planned["action"], planned["outcome"]) == ("del-and-quarantine", "planned")
    (found,) = report["entries"]
    assert (found["outcome"], sorted(found["del"]["released"])) == (
        "done",
        ["10.244.0.5", "10.245.0.5"],
    )
    assert not entry.exists() and [os.listdir(default), os.listdir(store)] == [["lock"]] * 2


def test_on_the_node_a_chain_of_two_multus_has_both_scratch_files_read(
    crashed: Crashed,
) -> None:
    """Each Multus of a chain DELs what its own scratch file names: the second one's was
    not read when the first one's was missing (found by the attack review of 780275b)."""
    nad, store = nad_with_a_store_of_this_boot(crashed)
    entry, _, _ = multus_node_with_a_nad_store(crashed, nad)
    second = crashed.node.root / "var/lib/cni/multus-b" / A
    second.parent.mkdir()
    (crashed.node.root / "var/lib/cni/multus" / A).rename(second)
    chain = [
        {"type": "multus", "cniDir": "/var/lib/cni/multus-a"},
        {"type": "multus", "cniDir": "/var/lib/cni/multus-b"},
    ]
    conf = {"cniVersion": "1.0.0", "name": "multus-cni-network", "plugins": chain}
    crashed.node.write_conf("60-multus-cni-network.conflist", json.dumps(conf).encode())
    the_nads_address_of_this_boot_leaves_the_del(crashed, entry, store)


@pytest.mark.parametrize("scratch", ["lost in the crash", "damaged by the crash"])
def test_on_the_node_multus_with_no_scratch_file_to_read_runs_no_del(
    crashed: Crashed, scratch: str
) -> None:
    """With no scratch file (lost, or damaged and moved away by this run), Multus's DEL asks
    the API server for the pod's networks, whose stores this run does not read: no DEL
    through it runs, and the entry is quarantined, so that the runtime's own DEL of a sandbox
    it knows runs Multus (found by the attack review of 780275b: only the stores found were
    held, and a network's address of this boot was released, exit 0)."""
    nad, store = nad_with_a_store_of_this_boot(crashed)
    entry, default, _ = multus_node_with_a_nad_store(crashed, nad)
    scratch_file = crashed.node.root / "var/lib/cni/multus" / A
    if scratch == "lost in the crash":
        scratch_file.unlink()
    else:
        scratch_file.write_bytes(scratch_file.read_bytes()[:40])
    node = OnTheNode(crashed)
    node.record("/var/lib/cni/networks/cbr0", "/var/lib/cni/nad-ipam/extra", "/var/lib/cni/multus")
    (store / "10.245.0.9").write_bytes(f"{A}\r\nnet1".encode())

    code, report = node.run("--bin-dir", "/opt/cni/bin", "--bin-dir", PLUGIN_DIR)

    assert code == ExitCode.ACTION_FAILED, report
    assert not entry.exists()
    assert sorted(os.listdir(store)) == ["10.245.0.5", "10.245.0.9"]
    assert os.listdir(default) == ["10.244.0.5"]
    (found,) = report["entries"]
    assert (found["outcome"], found["del"]["plugins_run"]) == ("failed", [])
    assert found["del"]["config_problem"].startswith(
        f"Multus has no scratch file /var/lib/cni/multus/{A} whose delegates can be read"
    )


def test_on_the_node_no_del_runs_through_multus_s_daemon(crashed: Crashed) -> None:
    """The thick plugin hands the DEL to Multus's daemon, which runs the delegates from a
    config, cache dir and binDir of its own: none of them read here (found by the attack
    review of 780275b: with the daemon up, a delegate's address of this boot was released,
    and a bridge planted in a /opt/cni/bin others may write ran as root)."""
    nad, store = nad_with_a_store_of_this_boot(crashed)
    entry, _, _ = multus_node_with_a_nad_store(crashed, nad)
    (crashed.node.root / "opt/cni/bin/multus").rename(crashed.node.root / "opt/cni/bin/multus-shim")
    conf = {
        "cniVersion": "1.0.0",
        "name": "multus-cni-network",
        "plugins": [{"type": "multus-shim"}],
    }
    crashed.node.write_conf("60-multus-cni-network.conflist", json.dumps(conf).encode())
    node = OnTheNode(crashed)
    node.record("/var/lib/cni/networks/cbr0", "/var/lib/cni/nad-ipam/extra")

    code, report = node.run("--bin-dir", "/opt/cni/bin", "--bin-dir", PLUGIN_DIR)

    assert code == ExitCode.ACTION_FAILED, report
    assert not entry.exists() and os.listdir(store) == ["10.245.0.5"]
    (found,) = report["entries"]
    assert (found["outcome"], found["del"]["plugins_run"]) == ("failed", [])
    assert found["del"]["config_problem"].startswith("Multus's daemon runs its delegates")


def test_on_the_node_a_multus_delegate_that_delegates_again_leaves_the_del(
    crashed: Crashed,
) -> None:
    """Multus's delegate is flannel, whose DEL runs the config its own scratch file keeps,
    which may name any store (found by the attack review at --root /: a store of this boot's
    named there was released, exit 73). The DEL is left."""
    nad: dict[str, Any] = {"cniVersion": "1.0.0", "name": "extra", "type": "flannel"}
    nad["ipam"] = {"type": "host-local", "dataDir": "/var/lib/cni/fl-ipam"}
    entry, _, second = multus_node_with_a_nad_store(crashed, nad)
    node = OnTheNode(crashed)
    node.record("/var/lib/cni/networks/cbr0", "/var/lib/cni/fl-ipam/extra")

    code, report = node.run("--bin-dir", "/opt/cni/bin", "--bin-dir", PLUGIN_DIR)

    assert code == ExitCode.DATA
    assert entry.exists() and os.listdir(second) == ["10.245.0.5"]
    (found,) = report["entries"]
    assert found["reason"] == (
        f"Multus's DEL runs the delegates its scratch file /var/lib/cni/multus/{A} names, one of "
        "which delegates again: what that would release is not read"
    )


@pytest.mark.parametrize("bin_dir", ["named", "default"])
def test_on_the_node_no_del_runs_through_multus_whose_bin_dir_others_may_write(
    crashed: Crashed, bin_dir: str
) -> None:
    """Multus looks its delegates' plugins up in its binDir (/opt/cni/bin unless its config
    names one) before CNI_PATH, whatever plugin dirs the run was given: a bridge planted
    there by another user ran as root (found by the attack review at --root /). That dir
    passes a plugin dir's checks, or no DEL through Multus runs."""
    root = crashed.node.root
    own_bin = root / "srv/reaper-bin"  # where the run is told its plugins are
    own_bin.mkdir(parents=True)
    stand_in = MULTUS_STAND_IN.replace(
        "/opt/cni/bin", "/var/lib/multus-bin" if bin_dir == "named" else "/opt/cni/bin"
    )
    (own_bin / "multus").write_text("#!/bin/sh\n" + stand_in)
    (own_bin / "multus").chmod(0o755)
    multus_conf: dict[str, Any] = {"type": "multus"}
    planted_dir = root / "opt/cni/bin"
    if bin_dir == "named":
        multus_conf["binDir"] = "/var/lib/multus-bin"
        planted_dir = root / "var/lib/multus-bin"
    conf = {"cniVersion": "1.0.0", "name": "multus-cni-network", "plugins": [multus_conf]}
    crashed.node.write_conf("00-multus.conflist", json.dumps(conf).encode())
    planted_dir.mkdir(parents=True)
    planted_dir.chmod(0o777)
    marker = root / "planted-ran"
    (planted_dir / "bridge").write_text(f"#!/bin/sh\ntouch {'/' + str(marker.relative_to(root))}\n")
    (planted_dir / "bridge").chmod(0o755)
    ipam = {"type": "host-local", "ranges": [[{"subnet": "10.244.0.0/24"}]]}
    cbr0 = {"cniVersion": "1.0.0", "name": "cbr0", "type": "bridge", "ipam": ipam}
    (root / "var/lib/cni/multus").mkdir(parents=True)
    (root / "var/lib/cni/multus" / A).write_text(multus_scratch(cbr0))
    entry = crashed.node.write_result(f"multus-cni-network-{A}-eth0", b"")
    crashed.reboot()
    node = OnTheNode(crashed)
    node.record()

    code, report = node.run("--bin-dir", "/srv/reaper-bin", "--bin-dir", PLUGIN_DIR)

    assert not marker.exists()
    assert code == ExitCode.ACTION_FAILED, report
    assert not entry.exists()  # quarantined, as for any DEL that cannot run
    (found,) = report["entries"]
    assert (found["outcome"], found["del"]["plugins_run"]) == ("failed", [])
    shown = "/" + str(planted_dir.relative_to(root))
    assert found["plugin_errors"][0]["msg"].startswith(
        f"Multus runs its delegates' plugins from its binDir {shown} first, which fails the "
        "checks of a plugin dir ("
    )


def test_on_the_node_an_orphans_del_is_held_to_the_store_its_config_keeps(
    crashed: Crashed,
) -> None:
    """An orphan found in the default dataDir's store of a network no conf names is DEL'd
    through the config a whole entry of that network cached, whose host-local keeps another
    store (/srv/ipam): that store is read too, and an address of the owner reserved there in
    this boot leaves the DEL (found by the attack review at --root /: the DEL released it,
    and the report never named it)."""
    c = CONTAINER_IDS[2]
    root = crashed.node.root
    ipam = {"type": "host-local", "dataDir": "/srv/ipam", "ranges": [[{"subnet": "10.70.0.0/24"}]]}
    conf = {"cniVersion": "1.0.0", "name": "old", "plugins": [{"type": "host-local", "ipam": ipam}]}
    cached = cache_entry_bytes(json.dumps(conf).encode(), "old", c, "eth0")
    crashed.node.write_result(f"old-{c}-eth0", cached)
    default = root / "var/lib/cni/networks/old"
    default.mkdir(parents=True)
    (default / "10.70.0.5").write_bytes(f"{B}\r\neth0".encode())  # B's orphan
    srv = root / "srv/ipam/old"
    srv.mkdir(parents=True)
    (srv / "10.70.0.6").write_bytes(f"{c}\r\neth0".encode())
    crashed.reboot()
    node = OnTheNode(crashed)
    node.record("/var/lib/cni/networks/old", "/srv/ipam/old")
    (srv / "10.70.0.9").write_bytes(f"{B}\r\neth0".encode())  # this boot's

    code, report = node.run("--bin-dir", PLUGIN_DIR)

    assert code == ExitCode.DATA
    assert sorted(os.listdir(srv)) == ["10.70.0.6", "10.70.0.9"]
    assert os.listdir(default) == ["10.70.0.5"]
    found = by_ip(report)["10.70.0.5"]
    assert (found["action"], found["del"]) == ("leave", None)
    assert found["reason"].startswith(
        "host-local's DEL would also release /srv/ipam/old/10.70.0.9, which was written "
        "current-boot"
    )


def test_on_the_node_flannel_run_as_an_ipam_plugin_is_checked_as_flannel(
    crashed: Crashed,
) -> None:
    """flannel run as bridge's IPAM plugin runs the delegate config its scratch file keeps,
    as flannel the plugin does: that file's store is checked (found by the attack review at
    --root /: only a plugin whose own type is flannel was, and an address of this boot in
    the store the file named was released, exit 0)."""
    bin_dir = crashed.node.root / "opt/cni/bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "flannel").write_text("#!/bin/sh\n" + FAITHFUL_FLANNEL)
    (bin_dir / "flannel").chmod(0o755)
    bridge = {"type": "bridge", "bridge": "cni0", "ipam": {"type": "flannel"}}
    conf = {"cniVersion": "1.0.0", "name": "cbr0", "plugins": [bridge]}
    crashed.node.write_conf("10-cbr0.conflist", json.dumps(conf).encode())
    root = crashed.node.root
    ipam: dict[str, Any] = {"type": "host-local", "dataDir": "/var/lib/cni/old-ipam"}
    ipam["ranges"] = [[{"subnet": "10.244.0.0/24"}]]
    scratch = root / "var/lib/cni/flannel" / A
    scratch.parent.mkdir(parents=True)
    scratch.write_text(
        json.dumps({"cniVersion": "1.0.0", "name": "cbr0", "type": "host-local", "ipam": ipam})
    )
    store = root / "var/lib/cni/old-ipam/cbr0"
    store.mkdir(parents=True)
    (store / "10.244.0.5").write_bytes(OWNER_A)
    entry = crashed.node.write_result(f"cbr0-{A}-eth0", b"")
    crashed.reboot()
    node = OnTheNode(crashed)
    node.record("/var/lib/cni/old-ipam/cbr0")
    (store / "10.244.0.6").write_bytes(OWNER_A)  # this boot's

    code, report = node.run("--bin-dir", "/opt/cni/bin", "--bin-dir", PLUGIN_DIR)

    assert code == ExitCode.DATA
    assert entry.exists() and sorted(os.listdir(store)) == ["10.244.0.5", "10.244.0.6"]
    (found,) = report["entries"]
    assert (found["action"], found["del"]) == ("leave", None)
    assert found["reason"].startswith(
        f"flannel's DEL runs the delegate config it kept in /var/lib/cni/flannel/{A}, whose "
        "host-local keeps /var/lib/cni/old-ipam/cbr0"
    )


@pytest.mark.parametrize(
    "plugin",
    [
        {"type": "multus"},
        {"TYPE": "multus-shim"},
        {"type": "bridge", "ipam": {"type": "multus"}},  # run as bridge's IPAM plugin
    ],
)
def test_under_root_no_del_runs_through_multus_as_a_plugin_or_an_ipam_plugin(
    plugin: dict[str, Any],
) -> None:
    """Multus's DEL opens the files its config names (its cniDir, its kubeconfig, a daemon's
    socket), none of which the plugins' confinement mounts from a --root: the machine's own.
    Run as an IPAM plugin it was missed (found by the attack review of cd1ab78)."""
    netlist = NetworkList("m", "1.0.0", (plugin,), "(test)")
    configs = NetworkConfigs({"m": netlist}, ())
    refused = "no DEL through Multus runs under a --root"
    assert refused in host_local.store_problems(configs, RootBinds("/mnt/node"))["m"]
    assert refused in (host_local.cached_config_problem(netlist, RootBinds("/mnt/node")) or "")
    # On the node the thin plugin's DEL runs; the thick one's daemon is never asked.
    on_the_node = host_local.store_problems(configs, RootBinds("/"))
    assert refused not in on_the_node.get("m", "")
    assert ("m" in on_the_node) == (multus.THICK_SHIM in kinds_run(netlist))
