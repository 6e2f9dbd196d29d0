"""A name a run writes and renames into place, or locks, or reads, found taken by what is no
file of its own: a FIFO, whose open waits for a reader for ever, a device node, a socket. With
--root on a node's disk the node decides what lies under its /var/lib/cni-reaper and /run, down
to a device's major and minor (its /proc, which some trees carry, even names the boot whose
quarantine dir a run will write): an open with O_CREAT|O_TRUNC there would write the run's JSON
into one of the rescue machine's own disks. Each such name is now made anew
(cni_reaper/new_file.py), the run's lock is refused unless it is a regular file, and a name read
is looked at with O_PATH, and opened only when it is a regular file (cni_reaper/unopened.py).

The reaper runs as its own process, bounded in time: a run that hangs fails the test, and does
not hang the suite.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from cni_reaper.errors import ExitCode
from tests.crashed import Crashed, by_path
from tests.nodetree import CONTAINER_IDS
from tests.private_node import cannot_run
from tests.test_quarantine_durability import FD_PATH, calls

REPO = Path(__file__).resolve().parent.parent
BOOT = "11111111-2222-3333-4444-555555555555"  # the tree's own boot id (nodetree)
KINDS = ("fifo", "device", "socket")
KIND_MODES = {
    "fifo": stat.S_IFIFO,
    "device": stat.S_IFCHR,
    "socket": stat.S_IFSOCK,
    "symlink": stat.S_IFLNK,
}
THEIRS = b"a file the planted symlink names\n"


def plant(path: Path, kind: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if kind == "fifo":
        os.mkfifo(path, 0o600)
    elif kind == "symlink":
        # To a file of the node's own, which a run that followed it would use.
        (path.parent / "theirs").write_bytes(THEIRS)
        os.symlink("theirs", path)
    elif kind == "socket":
        # No one listens on it; mknod makes the node without a bind, whatever the path's length.
        os.mknod(path, 0o600 | stat.S_IFSOCK)
    else:
        # The null device: a write to it harms nothing, and is a write to a device all the same.
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))


def run(
    crashed: Crashed, *extra: str, trace: Sequence[str] = (), bin_dir: Path | None = None
) -> tuple[int, dict[str, Any], str]:
    """A real run (or as extra says) as its own process, under trace when given, its plugins
    from bin_dir when given; bounded in time."""
    reaper = [sys.executable, "-m", "tests.clocked_run", str(crashed.t0 + 60), "--"]
    argv = crashed.argv("--json", *extra)
    if bin_dir is not None:
        argv = ["--root", str(crashed.node.root), "--bin-dir", str(bin_dir), "--json", *extra]
    try:
        proc = subprocess.run(
            [*trace, *reaper, *argv], capture_output=True, text=True, cwd=REPO, timeout=120
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the run still waited after 120 s: it opened what was planted")
    report = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, report, proc.stderr


def damaged(crashed: Crashed) -> Path:
    result = crashed.add(CONTAINER_IDS[0])
    result.write_bytes(b"")
    crashed.reboot()
    return result


@pytest.fixture(autouse=True)
def _as_root() -> None:
    if os.geteuid() != 0:
        cannot_run("needs root: a device node, and a real run that confines its plugins")


# (the name planted, the file it becomes), under the node's root
WRITTEN = {
    "the last run's marker": ("var/lib/cni-reaper/.last-run.tmp", "var/lib/cni-reaper/last-run"),
    "this boot's shutdown evidence": (
        "run/cni-reaper/.shutdown-evidence.json.tmp",
        "run/cni-reaper/shutdown-evidence.json",
    ),
    "the pre-runtime record": (
        f"run/cni-reaper/pre-runtime/.{BOOT}.tmp",
        f"run/cni-reaper/pre-runtime/{BOOT}",
    ),
    "a sidecar in the quarantine": (
        f"var/lib/cni-reaper/quarantine/{BOOT}/.hl-{CONTAINER_IDS[0]}-eth0.json.tmp",
        f"var/lib/cni-reaper/quarantine/{BOOT}/hl-{CONTAINER_IDS[0]}-eth0.json",
    ),
}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("what", WRITTEN)
def test_a_name_the_run_writes_taken_by_what_is_no_file_is_made_anew_never_opened(
    crashed: Crashed, what: str, kind: str
) -> None:
    result = damaged(crashed)
    planted, becomes = (crashed.node.root / p for p in WRITTEN[what])
    plant(planted, kind)

    code, report, stderr = run(crashed)

    assert code == ExitCode.OK, stderr
    assert by_path(report)[result.name]["outcome"] == "done"
    assert stat.S_ISREG(os.lstat(becomes).st_mode), f"{becomes} is what was planted"
    assert becomes.read_bytes().strip(), becomes
    assert not os.path.lexists(planted)


@pytest.mark.parametrize("kind", (*KINDS, "symlink"))
def test_a_lock_that_is_no_file_refuses_the_run_and_is_never_opened(
    crashed: Crashed, kind: str
) -> None:
    result = damaged(crashed)
    lock = crashed.node.root / "run/cni-reaper.lock"
    plant(lock, kind)

    code, report, stderr = run(crashed)

    assert code == ExitCode.DATA, stderr
    assert f"{lock} is not a regular file" in report["error"]["message"], report
    assert result.read_bytes() == b""  # nothing done
    assert stat.S_IFMT(os.lstat(lock).st_mode) == KIND_MODES[kind]
    if kind == "symlink":
        assert (lock.parent / "theirs").read_bytes() == THEIRS


# Files a run reads by a name it did not list, under the node's root.
READ = {
    "the clean-shutdown marker": "var/lib/cni-reaper/clean-shutdown",
    "the last run's marker": "var/lib/cni-reaper/last-run",
    "this boot's shutdown evidence": "run/cni-reaper/shutdown-evidence.json",
    "wtmp": "var/log/wtmp",
    "the rotated wtmp": "var/log/wtmp.1",
    "the pre-runtime record": f"run/cni-reaper/pre-runtime/{BOOT}",
    "containerd's config": "etc/containerd/config.toml",
    "a conf file": "etc/cni/net.d/20-other.conf",
    "host-local's lock": "var/lib/cni/networks/hl/lock",
}
# The tree's own /proc files, planted apart: without a boot id, the run reads no pre-runtime
# record by its name.
READ_PROC = {
    "the tree's boot time": "proc/stat",
    "the tree's boot id": "proc/sys/kernel/random/boot_id",
}


def opened_for_real(log: str, paths: set[str]) -> list[str]:
    """Each open of one of paths (by its full path, or by a name below a descriptor of its
    dir, as `strace -y` shows it) that was not an O_PATH look."""
    found = []
    for name, arguments, _ in calls(log):
        if name not in ("open", "openat") or len(arguments) < 3:
            continue
        where, path, flags = arguments[0], arguments[1], arguments[2]
        dir_path = FD_PATH.fullmatch(where)
        full = os.path.join(dir_path.group(1), path) if dir_path else path
        if full in paths and "O_PATH" not in flags:
            found.append(f"{full}: {flags}")
    return found


def traced_runs(
    crashed: Crashed, tmp_path: Path, names: list[str], kind: str = "device"
) -> list[str]:
    """What kind says (a device unless told) planted at names; a real run and a dry run under
    strace. Each open of a planted name without O_PATH, and asserts each run ends with its
    report."""
    planted = set()
    for name in names:
        path = crashed.node.root / name
        if os.path.lexists(path):
            os.unlink(path)
        plant(path, kind)
        planted.add(str(path))
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    found: list[str] = []
    log = tmp_path / "strace.log"
    trace = ["strace", "-f", "-qq", "-y", "-s", "4096", "-o", str(log), "-e", "trace=open,openat"]
    for extra in (["--dry-run"], []):
        _, report, stderr = run(crashed, *extra, trace=trace, bin_dir=empty)
        assert "Traceback" not in stderr, stderr
        assert report["host_local"] is not None, report
        found += opened_for_real(log.read_text(), planted)
    return found


@pytest.mark.parametrize("names", [READ, READ_PROC], ids=["node files", "proc files"])
@pytest.mark.parametrize("kind", KINDS)
def test_no_file_where_a_run_reads_a_file_by_name_is_ever_opened(
    crashed: Crashed, tmp_path: Path, kind: str, names: dict[str, str]
) -> None:
    """A device node (a FIFO, a socket) at each such name, a dry run and a real run seen by
    strace: each is looked at with O_PATH, which runs no driver, and never opened. The
    runs (no DEL can run: no plugins, so the real run's orphaned reservation goes to the
    quarantine under host-local's lock) end with their reports."""
    if shutil.which("strace") is None:
        cannot_run("strace is not installed")
    orphan = crashed.add(CONTAINER_IDS[1])
    orphan.unlink()  # its reservation is an orphan: no results entry names it
    crashed.reboot()

    assert traced_runs(crashed, tmp_path, list(names.values()), kind) == []
