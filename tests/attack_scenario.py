"""Attacks on a --root run with real plugins, inside a private mount namespace; run by
test_attacks.py.

Usage: unshare --mount --propagation private python -m tests.attack_scenario CASE WORKDIR

Before a case runs, the machine's CNI state as this namespace sees it (/var/lib/cni, /etc/cni,
/run) is a tmpfs: whatever the reaper gets wrong lands there, never on the machine. "The host"
below is that tmpfs. Each case prints what it saw as one JSON document on stdout.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cni_reaper import cli, failpoint, pre_runtime
from cni_reaper.repair import replay
from tests.nodetree import (
    CONTAINER_IDS,
    PLUGIN_DIR,
    NodeTree,
    cache_entry_bytes,
    host_local_conflist,
)

NETWORK = "hl"
SUBNET = "10.22.0.0/24"
IP = "10.22.0.5"
CONTAINER_ID = CONTAINER_IDS[0]
ENTRY = f"{NETWORK}-{CONTAINER_ID}-eth0"
RESERVATION = f"{CONTAINER_ID}\r\neth0"
# Somewhere on the host that is not one of the paths confine.py mounts over.
HOST_DATA = Path("/run/host-data")


def make_host_state() -> None:
    from tests.private_node import private_tmpfs  # noqa: PLC0415 (imports pytest)

    for path in (Path("/var/lib/cni"), Path("/etc/cni"), Path("/run")):
        private_tmpfs(path)


def listing(path: Path) -> list[str] | None:
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return None


def run_reaper(root: Path, *extra: str) -> dict[str, Any]:
    """One real run in this process, as the console script makes it; its JSON and exit code."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            code = int(
                cli.run(
                    ["--root", str(root), "--json", "--bin-dir", PLUGIN_DIR, *extra], environ={}
                )
            )
        except Exception as e:  # the exit code, as main() maps it
            code = int(cli.exit_code_for(e))
    text = out.getvalue()
    return {"exit": code, "report": json.loads(text) if text.strip() else None}


def crashed_node(workdir: Path) -> NodeTree:
    """A node disk whose previous boot crashed; this boot began a second ago."""
    node = NodeTree(workdir / "root")
    node.write_conf("10-hl.conflist", host_local_conflist(NETWORK, SUBNET))
    node.boot(time.time() - 600)
    node.write_boot_world(btime=time.time() - 1)
    return node


def results_dir_symlinked_out(workdir: Path) -> dict[str, Any]:
    """The node's /var/lib/cni is an absolute symlink (to where the node keeps its data). From
    the rescue machine it names the machine's own dir, which holds a damaged entry of a live
    pod and its reservation."""
    make_host_state()
    node = crashed_node(workdir)
    host_cni = HOST_DATA / "cni"
    (host_cni / "results").mkdir(parents=True, mode=0o700)
    (host_cni / "results" / ENTRY).write_bytes(b"")
    store = host_cni / "networks" / NETWORK
    store.mkdir(parents=True)
    (store / IP).write_text(RESERVATION)
    (node.root / "var/lib").mkdir(parents=True, exist_ok=True)
    (node.root / "var/lib/cni").symlink_to(host_cni)
    run = run_reaper(node.root)
    return {
        **run,
        "host_results_after": listing(host_cni / "results"),
        "host_store_after": listing(store),
    }


def store_symlinked_out(workdir: Path) -> dict[str, Any]:
    """The node's /var/lib/cni is a directory, but its networks/ (host-local's store) is an
    absolute symlink. The host's store there holds an empty reservation (a write in flight on
    the machine) and a live pod's reservation with the same owner as the node's damaged entry."""
    make_host_state()
    node = crashed_node(workdir)
    node.write_result(ENTRY, b"")
    host_networks = HOST_DATA / "networks"
    store = host_networks / NETWORK
    store.mkdir(parents=True)
    (store / IP).write_text(RESERVATION)
    (store / "10.22.0.6").write_bytes(b"")
    (node.root / "var/lib/cni/networks").symlink_to(host_networks)
    run = run_reaper(node.root)
    return {**run, "host_store_after": listing(store), "results_after": listing(node.results)}


def _store(node: NodeTree) -> Path:
    return node.root / "var/lib/cni/networks" / NETWORK


def _runtime_reserves_during_del(node: NodeTree) -> None:
    """A runtime starts while the reaper's DELs run, and host-local is writing a reservation
    for a new pod: the file is still empty."""
    started: list[bool] = []

    def runtime_starts() -> None:
        if not started:
            started.append(True)
            node.runtime_starts()
            (_store(node) / "10.22.0.9").write_bytes(b"")

    failpoint.interfere(replay.BEFORE_PLUGIN, runtime_starts)


def record_not_kept(workdir: Path, *, record_dir_mode: int | None) -> dict[str, Any]:
    """This boot's first run, before any runtime: it takes the pre-runtime record. With
    record_dir_mode, the record's dir is not trusted, so the record cannot be kept."""
    make_host_state()
    node = crashed_node(workdir)
    node.write_result(ENTRY, b"")
    _store(node).mkdir(parents=True)
    (_store(node) / IP).write_text(RESERVATION)
    if record_dir_mode is not None:
        record_dir = node.root / "run" / pre_runtime.RECORD_DIR
        record_dir.mkdir(parents=True)
        record_dir.chmod(record_dir_mode)
    _runtime_reserves_during_del(node)
    try:
        run = run_reaper(node.root)
    finally:
        failpoint.interfere(replay.BEFORE_PLUGIN, None)
    return {**run, "store_after": listing(_store(node))}


def record_kept(workdir: Path) -> dict[str, Any]:
    return record_not_kept(workdir, record_dir_mode=None)


def record_cannot_be_kept(workdir: Path) -> dict[str, Any]:
    return record_not_kept(workdir, record_dir_mode=0o777)


def firewall_via_path(workdir: Path) -> dict[str, Any]:
    """The operator's PATH holds a dir anyone may write to (sudo -E, a tool's bin dir). The
    real firewall plugin, chained in many conflists (podman's default among them), runs
    `iptables --version` from PATH on DEL, even with no netns and no prevResult."""
    make_host_state()
    node = crashed_node(workdir)
    conf = {"cniVersion": "1.0.0", "name": "fw", "plugins": [{"type": "firewall"}]}
    node.write_conf("20-fw.conflist", json.dumps(conf).encode())
    node.write_result(f"fw-{CONTAINER_ID}-eth0", b"")
    evil = workdir / "evil"
    evil.mkdir()
    marker = workdir / "ran-as-root"
    for tool in ("iptables", "ip6tables"):
        script = evil / tool
        script.write_text(f'#!/bin/sh\necho "$0 $*" >> {marker}\necho iptables v1.8.9\n')
        script.chmod(0o755)
        os.chown(script, 65534, 65534)
    evil.chmod(0o777)
    os.chown(evil, 65534, 65534)
    os.environ["PATH"] = f"{evil}:/usr/sbin:/usr/bin:/sbin:/bin"
    run = run_reaper(node.root)
    return {**run, "ran": marker.read_text().splitlines() if marker.exists() else []}


def boot_id_as_path(workdir: Path) -> dict[str, Any]:
    """A tree whose proc/ names the running boot (an image build, a test tree) and whose boot
    id is not a UUID but an absolute path: the boot id names the quarantine dir."""
    make_host_state()
    node = crashed_node(workdir)
    elsewhere = workdir / "elsewhere"
    node.write_boot_world(btime=time.time() - 1, boot_id=str(elsewhere))
    node.write_result(ENTRY, b"")
    run = run_reaper(node.root)
    return {**run, "elsewhere": listing(elsewhere)}


def forced_with_live_container(workdir: Path) -> dict[str, Any]:
    """The unit recorded two damaged entries before the runtime started; the runtime then
    started and answers, and one container is alive (its task dir; its netns pinned and
    named by a whole sibling entry). A by-hand run with --force DELs only the dead one."""
    make_host_state()
    node = crashed_node(workdir)
    alive, pinned, dead = CONTAINER_IDS[1], CONTAINER_IDS[2], CONTAINER_IDS[3]
    for cid in (alive, pinned, dead):
        node.write_result(f"{NETWORK}-{cid}-eth0", b"")
    node.record_before_runtime(time.time())
    node.runtime_starts()
    tasks = node.root / "run/containerd/io.containerd.runtime.v2.task/k8s.io" / alive
    tasks.mkdir(parents=True)
    netns = node.root / "run/netns/cni-pinned"
    netns.parent.mkdir(parents=True)
    netns.touch()
    subprocess.run(["mount", "--bind", "/proc/self/ns/net", str(netns)], check=True)
    conflist = host_local_conflist(NETWORK, SUBNET)
    whole = cache_entry_bytes(conflist, NETWORK, pinned, "net1", netns="/var/run/netns/cni-pinned")
    node.write_result(f"{NETWORK}-{pinned}-net1", whole)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(node.root / "run/containerd/containerd.sock"))
    listener.listen(8)
    refused = run_reaper(node.root)
    forced = run_reaper(node.root, "--force")
    listener.close()
    return {"refused": refused, "forced": forced, "results_after": listing(node.results)}


def results_dir_swapped_during_del(workdir: Path) -> dict[str, Any]:
    """While the first DEL runs, the results dir is moved aside and a new one made holding a
    new, empty file under the name of one of the planned entries (a runtime's write in
    flight), and the other planned file is rewritten whole (a runtime's ADD)."""
    make_host_state()
    node = crashed_node(workdir)
    swapped, rewritten = (f"{NETWORK}-{cid}-eth0" for cid in CONTAINER_IDS[1:3])
    node.write_result(swapped, b"")
    node.write_result(rewritten, b"")
    whole = cache_entry_bytes(
        host_local_conflist(NETWORK, SUBNET), NETWORK, CONTAINER_IDS[2], "eth0"
    )
    done: list[bool] = []

    def interfere() -> None:
        if done:
            return
        done.append(True)
        (node.results / rewritten).write_bytes(whole)
        node.results.rename(node.results.with_name("results.old"))
        node.results.mkdir(mode=0o700)
        (node.results / swapped).write_bytes(b"")

    failpoint.interfere(replay.BEFORE_PLUGIN, interfere)
    try:
        run = run_reaper(node.root, "--parallel", "1")
    finally:
        failpoint.interfere(replay.BEFORE_PLUGIN, None)
    old = node.results.with_name("results.old")
    return {
        **run,
        "results_after": listing(node.results),
        "old_after": listing(old),
        "rewritten_bytes": (node.results.with_name("results.old") / rewritten)
        .read_bytes()
        .decode(),
    }


CASES: dict[str, Callable[[Path], dict[str, Any]]] = {
    "results-dir-symlinked-out": results_dir_symlinked_out,
    "store-symlinked-out": store_symlinked_out,
    "record-kept": record_kept,
    "record-cannot-be-kept": record_cannot_be_kept,
    "firewall-via-path": firewall_via_path,
    "boot-id-as-path": boot_id_as_path,
    "forced-with-live-container": forced_with_live_container,
    "results-dir-swapped-during-del": results_dir_swapped_during_del,
}


if __name__ == "__main__":
    case, workdir = sys.argv[1], Path(sys.argv[2])
    print(json.dumps(CASES[case](workdir)))
