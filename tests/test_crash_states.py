"""The crash campaign's breaches, each replayed from the very state its crash left.

A campaign seed fixes a plan, not the instant: under emulation the two churn workers interleave
differently from run to run. So a crash that broke an invariant is kept as the node state of its
crashed disk (tests/vm/crash_state.py: the CNI configs and state, containerd's config and
metadata database, the boot records, cni-reaper's state; as the next boot's mount would find
them), in tests/crash_states/<suite>-<seed>.tar.xz. Here the reaper runs over each for real, in
a private network and mount namespace with Debian's plugins, in a boot begun after the crash, and
must leave only what the runtime will tear down itself: every results entry and host-local
reservation left names a sandbox whose record the runtime holds with its saved CNI result
(kubelet's teardown DELs each), every such file is as the crash left it, and the ones the
breach left for good are DEL'd and gone.
"""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from cni_reaper.cache import split_name
from cni_reaper.runtime import config as runtime_config
from cni_reaper.runtime import inventory
from tests.crashed import by_path
from tests.nodetree import PLUGIN_DIR, have_plugins
from tests.private_node import cannot_run, unshare

REPO = Path(__file__).resolve().parent.parent
STATES = Path(__file__).with_name("crash_states")
STORES = "var/lib/cni/networks"
RESULTS = "var/lib/cni/results"
PLUGINS = ("loopback", "bridge", "ptp", "host-local", "portmap")
pytestmark = pytest.mark.netns

# What each kept crash left for good before its fix, which the reaper must now DEL and move.
BREACHES: dict[str, dict[str, Any]] = {
    # Debian 13, containerd 1.7.24: the kernel died inside a RunPodSandbox after libcni wrote the
    # sandbox's whole cni-loopback entry and before containerd saved the CNI result in its
    # record; containerd 1.7.24 never DELs such a sandbox (tests/test_forgotten.py).
    "trixie-2002": {
        "deleted": [
            "cni-loopback-596e0d8747629225d0bbd3f1b82cab95410f2431557beda77e8adcfea7ae0f15-lo"
        ],
        "released": ["podnet/10.88.0.15", "ptpnet/10.99.0.15"],
    },
}


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root for unshare --net --mount"
    if shutil.which("unshare") is None:
        return "needs util-linux unshare"
    if not have_plugins():
        return "needs Debian's containernetworking-plugins in /usr/lib/cni"
    return None


def _unpack(state: Path, root: Path) -> None:
    with tarfile.open(state) as archive:
        # Nothing outside the root, no absolute link (3.9.17 and later have the filter).
        archive.extractall(root, filter="data")


def _files(root: Path) -> dict[str, bytes]:
    """The results entries and host-local reservations, by path under the root."""
    found = {}
    for top in (RESULTS, STORES):
        for path in sorted((root / top).rglob("*")):
            if path.is_file() and not path.is_symlink():
                found[str(path.relative_to(root))] = path.read_bytes()
    return found


def _owner(path: str, data: bytes) -> str | None:
    """The sandbox a results entry (<network>-<id>-<ifname>) or a reservation (named by its
    address, the id on its first line) belongs to; None for a store's own files (lock,
    last_reserved_ip.N)."""
    name = Path(path).name
    if path.startswith(RESULTS):
        identity, why_not = split_name(name, ())
        assert identity is not None, (path, why_not)
        return identity.container_id
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return None
    return data.decode().splitlines()[0].strip()


def _boot_after(root: Path, files: dict[str, bytes]) -> float:
    """A boot begun two minutes after the crash's last write; the clock a minute into it."""
    last = max((root / path).stat().st_mtime for path in files)
    btime = int(last) + 120
    (root / "proc/sys/kernel/random").mkdir(parents=True)
    (root / "proc/stat").write_text(f"cpu  1 0 1 1 0 0 0 0 0 0\nbtime {btime}\nprocesses 1\n")
    (root / "proc/sys/kernel/random/boot_id").write_text("0f0f0f0f-2222-3333-4444-555555555555\n")
    return btime + 60.0


@pytest.mark.parametrize("crash", sorted(BREACHES))
def test_the_reaper_leaves_only_what_the_runtime_will_tear_down(crash: str, tmp_path: Path) -> None:
    reason = _why_not()
    if reason:
        cannot_run(reason)
    root = tmp_path / "node"
    root.mkdir()
    _unpack(STATES / f"{crash}.tar.xz", root)
    before = _files(root)
    now = _boot_after(root, before)
    # The plugin dir containerd's config names, under the root: Debian's plugins.
    plugin_dir = root / "usr/lib/cni"
    plugin_dir.mkdir(parents=True)
    for plugin in PLUGINS:
        shutil.copy2(Path(PLUGIN_DIR) / plugin, plugin_dir / plugin)

    reaper = [sys.executable, "-m", "tests.clocked_run", str(now), "--", "--root", str(root)]
    ran = subprocess.run(
        [*unshare(net=True), *reaper, "--json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )

    report = json.loads(ran.stdout)
    assert ran.returncode == 0, (ran.stderr, report["summary"])
    after = _files(root)
    sandboxes = inventory.load(str(root), runtime_config.load(str(root)))
    for path, data in after.items():
        owner = _owner(path, data)
        if owner is not None:
            # Left for the runtime, which will DEL it when kubelet stops the sandbox.
            assert sandboxes.knows(owner) is True, (path, sandboxes.describe(owner))
        assert data == before[path], f"{path} changed"
    breach = BREACHES[crash]
    gone = sorted(set(before) - set(after))
    assert gone == sorted(
        [f"{RESULTS}/{name}" for name in breach["deleted"]]
        + [f"{STORES}/{address}" for address in breach["released"]]
    )
    quarantine = root / "var/lib/cni-reaper/quarantine/0f0f0f0f-2222-3333-4444-555555555555"
    for name in breach["deleted"]:
        entry = by_path(report)[name]
        assert (entry["action"], entry["outcome"]) == ("del-and-quarantine", "done"), entry
        assert (quarantine / name).read_bytes() == before[f"{RESULTS}/{name}"]
