"""The reaper killed with SIGKILL at every step boundary of a repair, then run again, ends where an
uninterrupted run ends: every damaged file quarantined exactly once, every valid file untouched.

The steps are the failpoints the package declares (cni_reaper/failpoint.py); a reference run
logs which it reaches and how often, and every (step, n-th time) is then a crash of its own.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# apply imports every module a repair uses (cli loads it only for real runs), so every
# failpoint is declared once these are imported.
from cni_reaper import failpoint
from cni_reaper.repair import apply  # noqa: F401
from tests.libcni import add_network_list, reserved_ips
from tests.nodetree import CONTAINER_IDS, PLUGIN_DIR, NodeTree, have_plugins, host_local_conflist
from tests.private_node import cannot_run, damage, unshare

REPO = Path(__file__).resolve().parent.parent
DAMAGE = ("empty", "zeroed", "truncated")
# Times differ from run to run; the digest differs from instance to instance, since the cached
# config names the instance's own host-local dir (it is checked against the file instead).
SIDECAR_VOLATILE = ("quarantined_at", "file", "evidence", "writing_boot", "sha256")


class Instance:
    """One crashed node under dir: host-local attachments, three damaged and one valid, plus a
    damaged file of a network below cniVersion 0.4.0 (quarantine without DEL), and Multus's
    scratch files, one damaged and one whole (moved without DEL)."""

    def __init__(self, base: Path, state_dir: Path | None = None) -> None:
        self.base = base
        self.node = NodeTree(base / "node")
        self.ipam = self.node.root / "var/lib/cni/networks"
        self.state_dir = state_dir or self.node.root / "var/lib/cni-reaper"
        t0 = time.time()
        conflist = host_local_conflist("hl", "10.22.0.0/24")
        self.node.write_conf("10-hl.conflist", conflist)
        old = b'{"cniVersion":"0.3.1","name":"old","plugins":[{"type":"loopback"}]}'
        self.node.write_conf("20-old.conflist", old)
        self.node.boot(t0 - 3600)
        self.damaged: dict[str, bytes] = {}
        self.valid: dict[str, bytes] = {}
        for cid, how in zip(CONTAINER_IDS, ["valid", *DAMAGE]):
            add_network_list(conflist, cid, "eth0", f"/run/netns/{cid[:8]}", self.node.root)
            path = self.node.results / f"hl-{cid}-eth0"
            if how == "valid":
                self.valid[path.name] = path.read_bytes()
            else:
                damage(path, how)
                self.damaged[path.name] = path.read_bytes()
        old_file = self.node.write_result(f"old-{CONTAINER_IDS[9]}-lo", b"")
        self.damaged[old_file.name] = b""
        # Multus's scratch files (multus.py), moved through the same steps: one whole, one cut.
        self.multus = self.node.root / "var/lib/cni/multus"
        self.multus.mkdir(mode=0o700)
        for cid, data in ((CONTAINER_IDS[4], b'[{"Name":"hl"}]'), (CONTAINER_IDS[5], b'[{"Na')):
            (self.multus / cid).write_bytes(data)
            self.damaged[cid] = data
        self.valid[CONTAINER_IDS[4]] = self.damaged.pop(CONTAINER_IDS[4])
        self.node.boot(t0 + 10)
        self.node.write_boot_world(btime=t0 + 5)
        self.clock = t0 + 60

    def argv(self) -> list[str]:
        return [
            "--root",
            str(self.node.root),
            "--bin-dir",
            PLUGIN_DIR,
            "--state-dir",
            str(self.state_dir),
            "--json",
        ]

    def run(self, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
        # Sealed: a run killed with SIGKILL cannot leave its plugins' mount points behind.
        sealed = [*unshare(), sys.executable, "-m", "tests.sealed_run", str(self.clock), "--"]
        return subprocess.run(
            [*sealed, *self.argv()],
            cwd=REPO,
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=60,
        )

    def quarantined(self) -> dict[str, bytes]:
        qdir = self.state_dir / "quarantine"
        return {
            p.name: p.read_bytes() for p in qdir.rglob("*") if p.is_file() and p.suffix != ".json"
        }

    def sidecars(self) -> dict[str, Any]:
        found = {}
        for path in (self.state_dir / "quarantine").rglob("*.json"):
            text = path.read_text().replace(str(self.state_dir), "STATE")
            doc = json.loads(text.replace(str(self.base), "BASE"))
            quarantined = path.with_suffix("")
            if quarantined.exists():
                assert doc["sha256"] == hashlib.sha256(quarantined.read_bytes()).hexdigest()
            for key in SIDECAR_VOLATILE:
                doc.pop(key, None)
            if doc.get("del"):
                # A DEL replayed after a crash finds the address the first one released gone.
                doc["del"].pop("released")
            found[path.name] = doc
        return found

    def results(self) -> dict[str, bytes]:
        """The files in place: the results dir's and Multus's scratch files."""
        here = [*self.node.results.iterdir(), *self.multus.iterdir()]
        return {p.name: p.read_bytes() for p in here if p.is_file()}

    def final_state(self) -> dict[str, Any]:
        """What two instances share once done: which file is where, intact or not."""
        originals = {**self.damaged, **self.valid}
        return {
            "results": {n: data == originals[n] for n, data in self.results().items()},
            "quarantine": {n: data == originals[n] for n, data in self.quarantined().items()},
            "sidecars": self.sidecars(),
            "ips": reserved_ips(self.ipam, "hl"),
            "marker_files": sorted(
                p.name for p in self.state_dir.iterdir() if p.name != "quarantine"
            ),
        }

    def check_nothing_lost(self) -> None:
        """After a crash at any point: each damaged file is in the results dir or in
        quarantine, in both only as an interrupted cross-device copy whose sidecar has its
        sha256; no valid file has changed."""
        results, quarantined = self.results(), self.quarantined()
        for name, data in self.valid.items():
            assert results[name] == data
        for name in self.damaged:
            copies = [q for q in quarantined if q == name or q.startswith(name + ".")]
            if name in results and copies:
                assert len(copies) == 1
                sidecar = next((self.state_dir / "quarantine").rglob(copies[0] + ".json"))
                digest = hashlib.sha256(results[name]).hexdigest()
                assert json.loads(sidecar.read_text())["sha256"] == digest
            else:
                assert (name in results) != bool(copies), name


def reached_points(instance: Instance, tmp: Path) -> list[str]:
    log = tmp / "failpoints.log"
    proc = instance.run({failpoint.LOG_ENV: str(log)})
    assert proc.returncode == 0, proc.stderr
    return log.read_text().split()


def crashes(points: list[str]) -> Iterator[str]:
    seen: Counter[str] = Counter()
    for point in points:
        seen[point] += 1
        yield f"{point}#{seen[point]}"


@pytest.fixture(autouse=True)
def _plugins() -> None:
    if not have_plugins():
        cannot_run(f"containernetworking-plugins is not installed in {PLUGIN_DIR}")


def crash_everywhere(tmp_path: Path, state_parent: Path | None) -> tuple[list[str], set[str]]:
    def instance(name: str) -> Instance:
        # Names of one length: the cached config holds the instance's path, and file sizes
        # must not differ between instances.
        state = state_parent / name / "state" if state_parent else None
        return Instance(tmp_path / name, state)

    reference = instance("run-000")
    points = reached_points(reference, tmp_path)
    expected = reference.final_state()
    assert set(expected["quarantine"]) == set(reference.damaged)
    tried = []
    for number, spec in enumerate(crashes(points), start=1):
        crashed = instance(f"run-{number:03d}")
        killed = crashed.run({failpoint.ENV: spec})
        assert killed.returncode == -signal.SIGKILL, (spec, killed.stderr)
        crashed.check_nothing_lost()
        again = crashed.run({})
        assert again.returncode == 0, (spec, again.stderr)
        assert crashed.final_state() == expected, spec
        tried.append(spec)
    return tried, set(points)


def test_sigkill_at_every_step_then_a_rerun_ends_as_an_uninterrupted_run(tmp_path: Path) -> None:
    tried, reached = crash_everywhere(tmp_path, None)
    steps = set(failpoint.registered())
    same_device = steps - {
        "quarantine.copy-written",
        "quarantine.copy-in-place",
        "quarantine.original-hidden",
    }
    # Every step of a repair on one file system; points that are no step (for a test's
    # interference) are crashed at too, when reached.
    assert reached & steps == same_device
    print(f"{len(tried)} crashes, each followed by a rerun: {', '.join(tried)}")


def test_sigkill_during_a_move_across_file_systems(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        cannot_run("needs /dev/shm on a file system other than the test's temp dir")
    with tempfile.TemporaryDirectory(dir=shm) as other:
        tried, reached = crash_everywhere(tmp_path, Path(other))
    assert {
        "quarantine.copy-written",
        "quarantine.copy-in-place",
        "quarantine.original-hidden",
    } <= reached
    assert "quarantine.file-renamed" not in reached
    print(f"{len(tried)} crashes across file systems")


def test_failpoints_are_inert_unless_armed() -> None:
    assert failpoint.ENV not in os.environ
    for name in failpoint.registered():
        failpoint.hit(name)  # would kill the test process if armed
    assert len(failpoint.registered()) == len(set(failpoint.registered())) >= 10
