"""The installed console script and `python -m cni_reaper` are the same program."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from cni_reaper import __version__
from cni_reaper.netconf import parse_conf_bytes
from tests.nodetree import CONTAINER_IDS, NodeTree, cache_entry_bytes, host_local_conflist
from tests.private_node import cannot_run

REPO = Path(__file__).resolve().parent.parent


def test_python_dash_m_and_console_script(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("cni-reaper")
    for argv in ([sys.executable, "-m", "cni_reaper"], [str(script)]):
        version = subprocess.run([*argv, "--version"], capture_output=True, text=True)
        assert (version.returncode, version.stdout.strip()) == (0, f"cni-reaper {__version__}")
        empty = subprocess.run(
            [*argv, "--dry-run", "--root", str(tmp_path)], capture_output=True, text=True
        )
        assert empty.returncode == 0, empty.stderr
        assert "nothing to do" in empty.stdout


def test_it_leaves_without_the_teardown_with_every_byte_and_its_exit_code(
    tmp_path: Path,
) -> None:
    """The command exits at once after main() (cli.console): the shipped example's JSON report
    (planned DELs that will fail: exit 73) still arrives whole through a pipe, and the stderr
    lines with it, and the exit code is main()'s."""
    node = tmp_path / "node"
    shutil.copytree(REPO / "examples/crashed-node", node, symlinks=True)
    ran = subprocess.run(
        [sys.executable, "-m", "cni_reaper", "--root", str(node), "--dry-run", "--json"],
        capture_output=True,
        text=True,
    )
    report = json.loads(ran.stdout)
    assert ran.returncode == report["summary"]["exit_code"] == 73, ran.stderr
    assert ran.stderr.splitlines()[-1].startswith("cni-reaper: 6 entries;"), ran.stderr


def _real_run_imports(node: NodeTree) -> tuple[int, set[str]]:
    """A real run over node, on a clock past its boot, with an empty plugin dir: its exit code
    and the modules it imported (-X importtime), as a boot reads them from disk."""
    empty = node.root / "empty-bin"
    empty.mkdir(exist_ok=True)
    ran = subprocess.run(
        [
            *(sys.executable, "-X", "importtime", "-m", "tests.clocked_run"),
            *(str(time.time() + 3600), "--", "--root", str(node.root), "--bin-dir", str(empty)),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in ran.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return ran.returncode, imported


REPAIRING = {
    "cni_reaper.repair.apply",
    "cni_reaper.repair.quarantine",
    "cni_reaper.repair.replay",
    "cni_reaper.spawn",
}
# Read only to plan the DEL of an entry with a cached config, which a crash rarely leaves whole.
CACHED_CONFIG = {"base64"}


def test_a_real_run_with_nothing_to_repair_never_loads_the_repair_machinery(
    tmp_path: Path,
) -> None:
    """Most boots have nothing to repair, and at boot every module is read from a cold disk:
    the DEL replay, the plugin runner's workers, the spawning of plugins and the quarantine are
    loaded only by a run that changes something; then the damaged file is quarantined as
    before."""
    if os.geteuid() != 0:
        cannot_run("a real run under --root confines itself: needs root")
    node = NodeTree(tmp_path / "root")
    conf = host_local_conflist("podnet", "10.88.0.0/16")
    node.write_conf("10-podnet.conflist", conf)
    for cid in CONTAINER_IDS[:3]:
        node.write_result(f"podnet-{cid}-eth0", cache_entry_bytes(conf, "podnet", cid, "eth0"))
    node.boot(time.time() - 86400)
    node.boot(time.time() - 60)
    node.write_boot_world(btime=time.time() - 60)
    code, imported = _real_run_imports(node)
    assert code == 0
    assert "cni_reaper.cli" in imported and not (REPAIRING | CACHED_CONFIG) & imported

    node.write_result(f"podnet-{CONTAINER_IDS[3]}-eth0", b"")  # damage from the crashed boot
    node.write_boot_world(btime=time.time() + 60, boot_id="22222222-2222-3333-4444-555555555555")
    code, imported = _real_run_imports(node)
    # The DEL cannot run (no plugin): exit 73, and the file goes to the quarantine all the same.
    assert code == 73 and imported >= REPAIRING
    assert not (node.results / f"podnet-{CONTAINER_IDS[3]}-eth0").exists()
    assert list(node.quarantine.glob(f"*/podnet-{CONTAINER_IDS[3]}-eth0"))


def test_the_command_loads_the_package_frozen_and_still_collects_the_runs_garbage() -> None:
    """The command loads the package with the cyclic collector off and freezes what that made
    (cni_reaper.command); the collector is on again for the run, and frees the cycles the run
    makes by itself, as a run over 100,000 entries needs to stay within its memory."""
    probe = """
import gc, sys, weakref
from cni_reaper import command
command.load()
class Cycle:
    pass
def made():
    cycle = Cycle()
    cycle.itself = cycle
    return weakref.ref(cycle)
refs = [made() for _ in range(10000)]
print(gc.isenabled(), gc.get_freeze_count() > 0, "cni_reaper.cli" in sys.modules,
      sum(ref() is None for ref in refs), gc.get_threshold()[0])
"""
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=REPO)
    enabled, frozen, loaded, freed, round_size = ran.stdout.split()
    assert (enabled, frozen, loaded) == ("True", "True", "True"), ran.stderr
    # Freed by the collector's own rounds, no gc.collect() (none with it off): all but those
    # made since its last round, fewer than the allocations that start one (700; 3.13 2,000).
    assert 10000 - int(freed) < int(round_size)


def test_the_shipped_examples_cached_configs_are_its_conf_dirs() -> None:
    """A whole entry's cached config is what a DEL falls back on once the network's conflist
    is gone: the example's named a dataDir of "@ROOT@/var/lib/cni/networks", a placeholder
    nothing filled in since the example moved to the default store, so that fallback could
    never run (found by an operator's review)."""
    example = REPO / "examples/crashed-node"
    conf = (example / "etc/cni/net.d/10-k8s-pod-network.conflist").read_bytes()
    on_disk = parse_conf_bytes(conf, "conf", single_plugin=False)
    cached = []
    for entry in sorted((example / "var/lib/cni/results").glob("k8s-pod-network-*")):
        with contextlib.suppress(ValueError):
            cached.append(base64.b64decode(json.loads(entry.read_bytes())["config"]))

    assert len(cached) == 2
    for config in cached:
        assert parse_conf_bytes(config, "cached", single_plugin=False).plugins == on_disk.plugins
