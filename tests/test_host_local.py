"""host-local reservations a crash left without an owner: freed when an earlier boot left them,
only reported when this boot did. (Seen for real in the VM test: host-local writes without
fsync, and a crash leaves its reservation files empty, so DEL can never release them.) A whole
one with no results entry is an orphan: its network's DEL releases it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cni_reaper.errors import ExitCode
from tests.crashed import Crashed
from tests.nodetree import CONTAINER_IDS, snapshot

NETWORK = "store-net"


def store_node(crashed: Crashed) -> Path:
    conf = {
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "plugins": [{"type": "bridge", "ipam": {"type": "host-local", "subnet": "10.30.0.0/24"}}],
    }
    crashed.node.write_conf("70-store.conflist", json.dumps(conf).encode())
    store = crashed.node.root / "var/lib/cni/networks" / NETWORK
    store.mkdir(parents=True)
    (store / "10.30.0.2").write_bytes(f"{CONTAINER_IDS[0]}\r\neth0".encode())
    (store / "10.30.0.3").write_bytes(b"")
    (store / "10.30.0.4").write_bytes(b"\0" * 70)
    (store / "last_reserved_ip.0").write_bytes(b"")
    (store / "lock").write_bytes(b"")
    return store


def test_reservations_without_an_owner_from_an_earlier_boot_are_freed(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    store = store_node(crashed)
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert code == ExitCode.OK
    assert sorted(os.listdir(store)) == ["last_reserved_ip.0", "lock"]
    found = {r["ip"]: r for r in report["host_local"]}
    orphan = found.pop("10.30.0.2")
    assert (orphan["action"], orphan["outcome"], orphan["quarantined_to"]) == ("del", "done", None)
    assert orphan["del"]["released"] == ["10.30.0.2"]
    assert orphan["del"]["plugins_run"] == ["bridge"]
    assert set(found) == {"10.30.0.3", "10.30.0.4"}
    assert (found["10.30.0.3"]["content"], found["10.30.0.4"]["content"]) == ("empty", "zeroed")
    qdir = crashed.node.quarantine / "11111111-2222-3333-4444-555555555555/host-local" / NETWORK
    for ip, reservation in found.items():
        assert (reservation["action"], reservation["outcome"]) == ("quarantine", "done")
        assert Path(reservation["quarantined_to"]) == qdir / ip
        assert json.loads((qdir / f"{ip}.json").read_text())["ip"] == ip
    assert report["summary"]["host_local"] == {"del/done": 1, "quarantine/done": 2}


def test_in_this_boot_they_are_only_reported_and_a_dry_run_changes_nothing(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    store = store_node(crashed)
    crashed.reboot()
    before = snapshot(crashed.node.root)
    code, report = crashed.run(capsys, "--dry-run")  # by hand, before the unit's run
    assert snapshot(crashed.node.root) == before  # not even this boot's record is written
    outcomes = {r["ip"]: (r["action"], r["outcome"]) for r in report["host_local"]}
    assert outcomes == {
        "10.30.0.2": ("del", "planned"),
        "10.30.0.3": ("quarantine", "planned"),
        "10.30.0.4": ("quarantine", "planned"),
    }
    assert code == ExitCode.OK

    assert crashed.run(capsys)[0] == ExitCode.OK  # the unit's run frees both
    crashed.node.runtime_starts()
    late = store / "10.30.0.9"  # reserved in this boot, its owner not yet written
    late.write_bytes(b"")
    before = snapshot(crashed.node.root)

    code, report = crashed.run(capsys, "--dry-run")

    assert snapshot(crashed.node.root) == before
    outcomes = {r["ip"]: (r["action"], r["outcome"]) for r in report["host_local"]}
    assert outcomes == {"10.30.0.9": ("leave", "skipped")}
    assert report["host_local"][0]["written"] == "current-boot"
    assert code == ExitCode.DATA
    code, report = crashed.run(capsys)
    assert code == ExitCode.DATA
    assert late.exists()
