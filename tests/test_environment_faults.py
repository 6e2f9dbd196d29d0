"""Faults of the machine around the reaper: a full or read-only file system, another file system
for the quarantine, a missing or odd wtmp. Each ends with a clear message and its documented
exit code, never with a traceback, and nothing is lost."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from cni_reaper.errors import ExitCode
from tests.crashed import Crashed, by_path
from tests.nodetree import CONTAINER_IDS, PLUGIN_DIR
from tests.private_node import cannot_run, unshare

REPO = Path(__file__).resolve().parent.parent


def run_in_mount_namespace(
    crashed: Crashed, setup: str, *extra: str
) -> tuple[int, dict[str, Any], str]:
    """The reaper as its own process in a private mount namespace, after the shell lines in
    setup have arranged the mounts there."""
    if os.geteuid() != 0:
        cannot_run("needs root for mounts in a private mount namespace")
    # sh -c takes the command after the script's own name ("sh"), as "$@".
    shell = [*unshare(), "sh", "-ec", setup + '\nexec "$@"']
    reaper = [sys.executable, "-m", "tests.clocked_run", str(crashed.t0 + 60), "--"]
    proc = subprocess.run(
        [*shell, "sh", *reaper, *crashed.argv("--json", *extra)],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    report = json.loads(proc.stdout) if proc.stdout.strip() else {}
    return proc.returncode, report, proc.stderr


def damaged_node(crashed: Crashed) -> tuple[Path, Path]:
    valid = crashed.add(CONTAINER_IDS[0])
    damaged = crashed.add(CONTAINER_IDS[1])
    damaged.write_bytes(b"")
    crashed.reboot()
    return valid, damaged


def test_quarantine_on_a_full_file_system(crashed: Crashed, tmp_path: Path) -> None:
    valid, damaged = damaged_node(crashed)
    state = tmp_path / "state"
    state.mkdir()
    fill = (
        f"mount -t tmpfs -o size=64k tmpfs {state}\n"
        f"dd if=/dev/zero of={state}/fill bs=4k 2>/dev/null || true"
    )

    code, report, stderr = run_in_mount_namespace(crashed, fill, "--state-dir", str(state))

    assert code == ExitCode.ACTION_FAILED, stderr
    assert "Traceback" not in stderr
    entry = by_path(report)[damaged.name]
    assert entry["outcome"] == "failed"
    assert "No space left on device" in " ".join(entry["problems"])
    assert any("cannot record this boot's evidence" in w for w in report["warnings"])
    # Nothing lost: the file stays where it was, the valid one untouched; DEL still ran.
    assert damaged.exists() and valid.exists()
    assert list(crashed.ips().values()) == [f"{CONTAINER_IDS[0]}\r\neth0"]


def test_read_only_results_dir(crashed: Crashed) -> None:
    valid, damaged = damaged_node(crashed)
    results = crashed.node.results
    read_only = f"mount --bind {results} {results}\nmount -o remount,bind,ro {results}"

    code, report, stderr = run_in_mount_namespace(crashed, read_only)

    assert code == ExitCode.ACTION_FAILED, stderr
    assert "Traceback" not in stderr
    problems = " ".join(by_path(report)[damaged.name]["problems"])
    assert "Read-only file system" in problems
    assert damaged.exists() and valid.exists()


def test_quarantine_on_another_file_system_is_copied_then_unlinked(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp_path).st_dev:
        cannot_run("needs /dev/shm on a file system other than the test's temp dir")
    valid, damaged = damaged_node(crashed)
    damaged.write_bytes(b"\0" * 300)
    with tempfile.TemporaryDirectory(dir=shm) as other:
        code, report = crashed.run(capsys, "--state-dir", other)
        moved = Path(by_path(report)[damaged.name]["quarantined_to"])
        assert moved.read_bytes() == b"\0" * 300
        assert moved.stat().st_dev != os.stat(tmp_path).st_dev
    assert code == ExitCode.OK
    assert not damaged.exists() and valid.exists()


@pytest.mark.parametrize("wtmp", ["missing", "fifo", "directory", "garbage"])
def test_missing_or_odd_wtmp_falls_back_to_btime_and_says_so(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], wtmp: str
) -> None:
    valid, damaged = damaged_node(crashed)
    path = crashed.node.root / "var/log/wtmp"
    path.unlink()
    if wtmp == "fifo":
        os.mkfifo(path)
    elif wtmp == "directory":
        path.mkdir()
    elif wtmp == "garbage":
        path.write_bytes(random.Random(7).randbytes(1000))  # noqa: S311 (repeatable, not secret)

    code, report = crashed.run(capsys)

    warnings = " ".join(report["warnings"] + report["boot"]["warnings"])
    expected = {
        "missing": "no wtmp at",
        "fifo": "is not a regular file",
        "directory": "is not a regular file",
        "garbage": "",
    }[wtmp]
    assert expected in warnings
    # /proc/stat's btime still places the files in an earlier boot: the repair goes ahead.
    assert report["boot"]["current_boot_start_source"] == "/proc/stat btime"
    assert (by_path(report)[damaged.name]["outcome"], code) == ("done", ExitCode.OK)
    assert valid.exists()


# A launcher that installs a seccomp filter refusing prctl(PR_SET_CHILD_SUBREAPER) with EPERM,
# as a unit's SystemCallFilter= could, then runs the rest of its argv: classic BPF over
# struct seccomp_data (nr at 0, args[0]'s low half at 16 on little-endian x86_64).
WITHOUT_SUBREAPER = """\
import ctypes, os, struct, sys
NR_PRCTL = 157  # x86_64
program = [
    (0x20, 0, 0, 0),  # A = nr
    (0x15, 0, 3, NR_PRCTL),  # nr == prctl ? next : allow
    (0x20, 0, 0, 16),  # A = args[0]
    (0x15, 0, 1, 36),  # == PR_SET_CHILD_SUBREAPER ? next : allow
    (0x06, 0, 0, 0x00050000 | 1),  # SECCOMP_RET_ERRNO | EPERM
    (0x06, 0, 0, 0x7FFF0000),  # SECCOMP_RET_ALLOW
]
code = b"".join(struct.pack("=HBBI", *insn) for insn in program)
buf = ctypes.create_string_buffer(code)
fprog = struct.pack("=HxxxxxxQ", len(program), ctypes.addressof(buf))
fprog_buf = ctypes.create_string_buffer(fprog)
libc = ctypes.CDLL(None, use_errno=True)
assert libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS
fprog_ptr = ctypes.c_void_p(ctypes.addressof(fprog_buf))
assert libc.prctl(22, 2, fprog_ptr, 0, 0) == 0, ctypes.get_errno()
os.execv(sys.argv[1], sys.argv[1:])
"""


def test_a_filter_refusing_the_subreaper_is_warned_of_and_the_dels_go_on(
    crashed: Crashed, tmp_path: Path
) -> None:
    """A plugin leaves a daemon in a session of its own; the reaper cannot be its subreaper:
    the run says it cannot end such processes, and the DELs are done as ever."""
    if os.uname().machine != "x86_64":
        cannot_run("the filter's system call number is x86_64's")
    _, damaged = damaged_node(crashed)
    pidfile = tmp_path / "daemon.pid"
    crashed.node.fake_plugin_network(
        "forker", "forker", f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 300' &\nexit 0\n"
    )
    left = crashed.node.write_result(f"forker-{CONTAINER_IDS[2]}-eth0", b"")
    bin_dir = str(crashed.node.root / "opt/cni/bin")
    launcher = [sys.executable, "-c", WITHOUT_SUBREAPER, sys.executable]
    reaper = ["-m", "tests.clocked_run", str(crashed.t0 + 60), "--"]
    argv = crashed.argv("--json", "--bin-dir", PLUGIN_DIR, "--bin-dir", bin_dir)
    try:
        proc = subprocess.run(
            [*launcher, *reaper, *argv], capture_output=True, text=True, cwd=REPO, timeout=120
        )
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
    assert proc.returncode == ExitCode.OK, proc.stderr
    report = json.loads(proc.stdout)
    entries = by_path(report)
    assert entries[damaged.name]["outcome"] == entries[left.name]["outcome"] == "done"
    assert (
        "processes plugins leave running outside their process groups cannot be ended "
        "(prctl(PR_SET_CHILD_SUBREAPER): Operation not permitted): they may run on beside "
        "the runtime"
    ) in report["warnings"] + report["later_warnings"]  # noted once the report had begun


@pytest.mark.parametrize(
    ("size", "fill", "damage"),
    [("64k", True, b""), ("8k", False, b'{"kind":"cniCacheV1","config":"' + b"A" * 12_000)],
    ids=["no-room-for-the-sidecar", "room-for-the-sidecar-not-the-copy"],
)
def test_a_move_that_fails_for_room_leaves_nothing_of_itself_in_the_quarantine(
    crashed: Crashed, tmp_path: Path, size: str, fill: bool, damage: bytes
) -> None:
    """The quarantine on a small tmpfs, so on another file system than the results dir: the
    sidecar's write, or the copy's, runs out of room. No temp file stays behind, and no
    sidecar without its file (a '.X.json.tmp' stayed, and the copy's '.X.tmp' beside X.json)."""
    valid, damaged = damaged_node(crashed)
    damaged.write_bytes(damage)
    state = tmp_path / "state"
    state.mkdir()
    listing = tmp_path / "listing"
    setup = f"mount -t tmpfs -o size={size} tmpfs {state}\n"
    if fill:
        setup += f"dd if=/dev/zero of={state}/fill bs=4k 2>/dev/null || true\n"
    # The run, then what its quarantine holds, before the tmpfs goes with the namespace.
    # (run_in_mount_namespace's own exec after it is never reached.)
    setup += f'set +e\n"$@"\nstatus=$?\nfind {state}/quarantine -type f > {listing}\n'
    setup += "exit $status"

    code, report, stderr = run_in_mount_namespace(crashed, setup, "--state-dir", str(state))

    assert code == ExitCode.ACTION_FAILED, stderr
    assert "No space left on device" in " ".join(by_path(report)[damaged.name]["problems"])
    assert listing.read_text() == ""
    assert damaged.read_bytes() == damage and valid.exists()
