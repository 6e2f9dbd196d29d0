"""A dir the reaper must write that is read-only where it runs: under the unit, every path but
/var/lib/cni, /run and the state dir (ProtectSystem=strict), so a Multus cniDir or a host-local
dataDir elsewhere. The move fails, the report says why and what to change, and nothing of the
failed move is left behind. Real runs of the CLI, as root, each in a private mount namespace in
which one dir of the node's tree is bind-mounted read-only; no plugin touches the network."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cni_reaper.errors import ExitCode
from cni_reaper.read_only import READ_ONLY_HINT
from tests.nodetree import CONTAINER_IDS, NodeTree, host_local_conflist
from tests.private_node import cannot_run, unshare

REPO = Path(__file__).resolve().parent.parent

# A plugin whose DEL succeeds: the move is what fails.
DEL_DONE = "exit 0\n"


@pytest.fixture(autouse=True)
def _as_root() -> None:
    if os.geteuid() != 0:
        cannot_run("needs root: a real run, and a read-only bind mount in a mount namespace")


def run_with_read_only(node: NodeTree, read_only: Path, *argv: str) -> dict[str, Any]:
    """A real run of the CLI, with --json, while read_only is a read-only bind mount of itself
    in the run's own mount namespace; the JSON report, its exit code added."""
    script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name in ("JOURNAL_STREAM", "NOTIFY_SOCKET", "INVOCATION_ID"):
        env.pop(name, None)
    done = subprocess.run(
        [
            *unshare(),
            "sh",
            "-c",
            script,
            str(read_only),
            sys.executable,
            "-m",
            "cni_reaper",
            "--json",
            "--root",
            str(node.root),
            *argv,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert "Traceback" not in done.stderr, done.stderr
    doc: dict[str, Any] = json.loads(done.stdout)
    doc["exit_code"] = done.returncode
    return doc


def crashed_node(root: Path) -> NodeTree:
    node = NodeTree(root)
    node.write_boot_world(btime=1_700_000_000)
    return node


def test_a_read_only_results_dir_fails_the_move_saying_what_to_change(tmp_path: Path) -> None:
    node = crashed_node(tmp_path / "node")
    bin_dir = node.fake_plugin_network("net", "done", DEL_DONE)
    damaged = node.write_result(f"net-{CONTAINER_IDS[0]}-eth0", b"")

    doc = run_with_read_only(node, node.results, "--bin-dir", str(bin_dir))

    assert doc["exit_code"] == ExitCode.ACTION_FAILED
    (entry,) = doc["entries"]
    assert entry["action"] == "del-and-quarantine"
    assert entry["outcome"] == "failed"
    assert entry["quarantined_to"] is None
    (problem,) = entry["problems"]
    assert problem == f"quarantine: Read-only file system; {READ_ONLY_HINT}"
    # Still where the runtime looks, and no copy in the quarantine that says otherwise.
    assert damaged.read_bytes() == b""
    assert [p.name for p in node.quarantine.rglob("*") if p.is_file()] == []


def test_a_read_only_host_local_store_fails_the_release_saying_what_to_change(
    tmp_path: Path,
) -> None:
    """An orphaned reservation of an earlier boot in a store the unit does not make writable:
    host-local's DEL cannot release it either, and the move into the quarantine fails."""
    node = crashed_node(tmp_path / "node")
    node.write_conf("10-pods.conflist", host_local_conflist("pods", "10.77.0.0/24"))
    store = node.root / "var/lib/cni/networks/pods"
    store.mkdir(parents=True)
    reservation = store / "10.77.0.5"
    reservation.write_bytes(f"{CONTAINER_IDS[1]}\r\neth0".encode())

    doc = run_with_read_only(node, store, "--bin-dir", "/usr/lib/cni")

    assert doc["exit_code"] == ExitCode.ACTION_FAILED
    (held,) = doc["host_local"]
    assert held["outcome"] == "failed"
    assert held["problem"].endswith(f"Read-only file system; {READ_ONLY_HINT}")
    assert reservation.read_bytes() == f"{CONTAINER_IDS[1]}\r\neth0".encode()
    assert [p.name for p in node.quarantine.rglob("*") if p.is_file()] == []
