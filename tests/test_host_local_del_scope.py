"""What host-local's DEL releases is every file under its store whose content, trimmed as Go
trims it, names the owner (ReleaseByID: filepath.Walk, subdirectories too; the ID alone if no
file names the ifname), not the one address the reaper planned. A DEL runs only when each of
them is a reservation this run proves an earlier boot made (found by an attacker's review:
an orphan's DEL released an address of the same owner reserved in this boot, one in a nested
store, one too large for the inventory to read, while the report said they were kept)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni_reaper import host_local
from cni_reaper.errors import ExitCode
from tests.crashed import Crashed
from tests.nodetree import CONTAINER_IDS, PLUGIN_DIR, host_local_conflist

A, B = CONTAINER_IDS[:2]
OWNER_A = f"{A}\r\neth0".encode()


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
