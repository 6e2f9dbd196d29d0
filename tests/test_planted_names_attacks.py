"""An attacker's review of commit 293f6de (new_file.py, unopened.py): names under --root that a
run still opens for real, with a device node planted there by the node's disk. Each run is
watched by strace; an open of a planted name without O_PATH is a defect.

Reviewed: host-local's store (host_local.py), wtmpdb and sqlite's side files (wtmpdb.py), the
runtimes' configs, drop-ins and records (runtime/*.py), Multus's files, the journal dir, a
tree's proc/, the metrics file. Three defects, mended in the commit after 293f6de: a device in
host-local's store was opened O_RDONLY; wtmpdb's -wal and -shm were opened O_RDWR|O_CREAT by
sqlite, and its -journal O_RDONLY. The other planted names held (not opened: whether each was
reached in these trees is not asserted).
"""

from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from tests.crashed import Crashed
from tests.nodetree import CONTAINER_IDS
from tests.private_node import cannot_run
from tests.test_planted_names import traced_runs


@pytest.fixture(autouse=True)
def _as_root_with_strace() -> None:
    if os.geteuid() != 0:
        cannot_run("needs root: a device node, and a real run that confines its plugins")
    if shutil.which("strace") is None:
        cannot_run("strace is not installed")


@pytest.fixture
def orphaned(crashed: Crashed) -> Crashed:
    orphan = crashed.add(CONTAINER_IDS[1])
    orphan.unlink()  # its reservation is an orphan: no results entry names it
    crashed.reboot()
    return crashed


# Was opened O_RDONLY|O_NONBLOCK before its type was looked at: the driver's open ran.
def test_a_device_in_host_locals_store_is_never_opened(orphaned: Crashed, tmp_path: Path) -> None:
    assert traced_runs(orphaned, tmp_path, ["var/lib/cni/networks/hl/10.22.0.99"]) == []


def _wtmpdb(crashed: Crashed, journal_mode: str) -> None:
    crashed.node.wtmpdb_boot(crashed.t0 - 3600)
    db = crashed.node.root / "var/log/wtmp.db"
    conn = sqlite3.connect(str(db))
    try:
        conn.execute(f"PRAGMA journal_mode={journal_mode}").fetchone()
    finally:
        conn.close()


# sqlite opened both by itself, O_RDWR|O_CREAT, after the database was looked at.
def test_devices_at_wtmpdbs_wal_and_shm_are_never_opened(orphaned: Crashed, tmp_path: Path) -> None:
    _wtmpdb(orphaned, "wal")
    names = ["var/log/wtmp.db-wal", "var/log/wtmp.db-shm"]
    assert traced_runs(orphaned, tmp_path, names) == []


# sqlite opened a hot journal by itself, O_RDONLY.
def test_a_device_at_wtmpdbs_rollback_journal_is_never_opened(
    orphaned: Crashed, tmp_path: Path
) -> None:
    _wtmpdb(orphaned, "delete")
    assert traced_runs(orphaned, tmp_path, ["var/log/wtmp.db-journal"]) == []


HELD = [
    "var/log/journal/0123456789abcdef0123456789abcdef/system.journal",
    "etc/crio/crio.conf",
    "etc/crio/crio.conf.d/10-x.conf",
    "etc/containers/storage.conf",
    "run/crio/version",
    "var/lib/crio/clean.shutdown",
    "var/lib/containers/storage/overlay-containers/containers.json",
    "var/lib/containers/storage/overlay-containers/volatile-containers.json",
    "etc/rancher/k3s/config.yaml",
    "etc/rancher/k3s/config.yaml.d/10-x.yaml",
    "etc/rancher/rke2/config.yaml",
    "var/lib/rancher/k3s/agent/etc/containerd/config.toml",
    "etc/containerd/conf.d/x.toml",
    "var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db",
    "var/lib/cni/multus/multus-scratch",
    "etc/cni/net.d/00-multus.conf",
    "etc/machine-id",
    "proc/sys/kernel/random/boot_id",
    "proc/stat",
    "proc/1/stat",
    "proc/self/mountinfo",
]


def test_devices_at_runtime_configs_records_multus_journal_and_proc_are_never_opened(
    orphaned: Crashed, tmp_path: Path
) -> None:
    assert traced_runs(orphaned, tmp_path, HELD) == []
