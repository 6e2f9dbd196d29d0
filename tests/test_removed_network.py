"""A network no conf dir names any more: every leftover of it (a damaged results file, a whole
entry of a forgotten sandbox, an orphaned reservation) is DEL'd with the config a whole entry of
the network cached, with the real host-local. That config is read before anything moves: the
entry that cached it may be one the run itself sends to the quarantine."""

from __future__ import annotations

import os
from typing import Any

import pytest

from cni_reaper.errors import ExitCode
from tests.bolt_writer import containerd_sandbox, write_db
from tests.crashed import Crashed, by_path
from tests.nodetree import CONTAINER_IDS
from tests.private_node import damage

META_DB = "var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db"
WHOLE, DAMAGED, ORPHAN = CONTAINER_IDS[:3]


def entry_name(container_id: str) -> str:
    return f"hl-{container_id}-eth0"


def containerd_knows(crashed: Crashed, *container_ids: str) -> None:
    path = crashed.node.root / META_DB
    path.parent.mkdir(parents=True, exist_ok=True)
    records = [op for cid in container_ids for op in containerd_sandbox("k8s.io", cid)]
    write_db(path, [records], no_freelist_sync=True)


def removed_network(crashed: Crashed) -> dict[str, str]:
    """Three attachments of hl, its conflist removed since: the first whole, the second's
    results file emptied by the crash, the third's gone (the node died before libcni wrote it).
    Their addresses, by owner."""
    for container_id in (WHOLE, DAMAGED, ORPHAN):
        crashed.add(container_id)
    damage(crashed.node.results / entry_name(DAMAGED), "empty")
    os.unlink(crashed.node.results / entry_name(ORPHAN))
    os.unlink(crashed.node.conf_dir / "10-hl.conflist")
    return {owner.split("\r\n")[0]: ip for ip, owner in crashed.ips().items()}


def test_a_damaged_entry_is_deleted_with_the_config_a_whole_one_cached(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """No runtime records: the whole entry is kept for the runtime; its cached config serves
    the damaged entry's DEL and the orphan's."""
    ips = removed_network(crashed)
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert code == ExitCode.OK, report
    entry = by_path(report)[entry_name(DAMAGED)]
    assert (entry["action"], entry["outcome"]) == ("del-and-quarantine", "done"), entry
    assert entry["del"]["config"] == f"the config cached in {entry_name(WHOLE)}"
    assert entry["del"]["released"] == [ips[DAMAGED]]
    (orphan,) = report["host_local"]
    assert (orphan["ip"], orphan["action"], orphan["outcome"]) == (ips[ORPHAN], "del", "done")
    assert orphan["del"]["config"] == f"the config cached in {entry_name(WHOLE)}"
    assert orphan["quarantined_to"] is None
    assert crashed.ips() == {ips[WHOLE]: f"{WHOLE}\r\neth0"}


def test_the_config_of_an_entry_the_run_quarantines_still_serves_the_orphans(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """The one whole entry is of a sandbox containerd forgot: DEL'd and quarantined; the
    damaged entry and the orphan are DEL'd with the config it cached all the same."""
    ips = removed_network(crashed)
    containerd_knows(crashed, DAMAGED, ORPHAN)
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert code == ExitCode.OK, report
    entries = by_path(report)
    cached_in = f"the config cached in {entry_name(WHOLE)}"
    for container_id in (WHOLE, DAMAGED):
        entry = entries[entry_name(container_id)]
        assert (entry["action"], entry["outcome"]) == ("del-and-quarantine", "done"), entry
        assert entry["del"]["config"] == cached_in
        assert entry["del"]["released"] == [ips[container_id]]
    (orphan,) = report["host_local"]
    assert (orphan["ip"], orphan["outcome"], orphan["del"]["config"]) == (
        ips[ORPHAN],
        "done",
        cached_in,
    )
    assert orphan["del"]["plugins_run"] == ["host-local"]
    assert crashed.ips() == {}
    assert os.listdir(crashed.node.results) == []


def test_with_no_whole_entry_left_the_damaged_one_still_goes_and_the_orphan_is_quarantined(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    ips = removed_network(crashed)
    os.unlink(crashed.node.results / entry_name(WHOLE))
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert code == ExitCode.ACTION_FAILED
    entry = by_path(report)[entry_name(DAMAGED)]
    assert (entry["action"], entry["outcome"]) == ("del-and-quarantine", "failed")
    assert entry["del"]["config_problem"].startswith("no config for network 'hl'")
    assert entry["quarantined_to"] is not None
    reservations: dict[str, Any] = {r["ip"]: r for r in report["host_local"]}
    assert set(reservations) == set(ips.values())
    for r in reservations.values():
        assert r["outcome"] == "done" and r["quarantined_to"] is not None, r
    assert crashed.ips() == {}
