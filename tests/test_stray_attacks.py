"""Attacks on the killing of processes plugins leave running outside their process groups
(strays.Strays, ProcessRunner.run): strays that try to outlive the sweep, processes of the
caller's that the sweep must leave alone, and the warning's accuracy (an attack review of
2026-12-05; its seven defects were mended in strays.py: a chain 600 deep, a process walking by
fork and exit, a pid a caller's child freed, a zombie leader with live threads). A program that
runs the reaper in its own process and starts children in sessions of their own while a DEL
runs is outside what strays.py promises (its docstring), and not tested here."""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cni_reaper import strays
from cni_reaper.errors import ExitCode
from tests.crashed import Crashed, by_path
from tests.test_misbehaving_plugins import alive, plugin_network

PR_GET_CHILD_SUBREAPER = 37
KILLED = "killed "


def _run(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[int, dict[str, Any]]:
    crashed.reboot()
    bin_dir = str(crashed.node.root / "opt/cni/bin")
    args = ("--plugin-timeout", "2", *extra) if "--plugin-timeout" not in extra else extra
    return crashed.run(capsys, "--bin-dir", bin_dir, *args)


def _run_leaving(
    crashed: Crashed,
    capsys: pytest.CaptureFixture[str],
    sessions: list[int],
    pids: Path,
    *extra: str,
) -> tuple[int, dict[str, Any]]:
    """_run, the sessions whose leaders' pids the plugins wrote to pids killed at the test's
    end whatever the run did."""
    try:
        return _run(crashed, capsys, *extra)
    finally:
        sessions.extend(_ints(pids))


def _subreaper() -> int:
    flag = ctypes.c_int(-1)
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    assert prctl(PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) == 0
    return flag.value


def _stat(pid: int) -> tuple[str, int, int, int] | None:
    """state, ppid, pgrp, session of pid, or None if gone."""
    try:
        line = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    fields = line[line.rfind(b")") + 2 :].split()
    return fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3])


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _session(sid: int) -> list[int]:
    """The live (not zombie) processes of session sid."""
    found = []
    for pid in _pids():
        st = _stat(pid)
        if st is not None and st[3] == sid and st[0] != "Z":
            found.append(pid)
    return found


def _wait_for(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def _kill_sessions(*sids: int) -> None:
    """SIGKILL every process of the sessions, until none is left; ours among them reaped."""
    deadline = time.monotonic() + 20
    me = os.getpid()
    while time.monotonic() < deadline:
        left = False
        for sid in sids:  # atomic for a group whose members live too briefly to be scanned
            with contextlib.suppress(OSError):
                os.killpg(sid, signal.SIGKILL)
        for pid in _pids():
            st = _stat(pid)
            if st is None or st[3] not in sids:
                continue
            with contextlib.suppress(OSError):
                os.killpg(st[2], signal.SIGKILL)
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            if st[1] == me:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
            left = left or st[0] != "Z" or st[1] == me
        if not left:
            return
        time.sleep(0.01)


def _ints(path: Path) -> list[int]:
    with contextlib.suppress(OSError, ValueError):
        return [int(word) for word in path.read_text().split()]
    return []


def _killed_warning(report: dict[str, Any]) -> str | None:
    found = [w for w in report["warnings"] if w.startswith(KILLED)]
    assert len(found) <= 1
    return found[0] if found else None


def _wait_file(path: Path, seconds: int = 20) -> str:
    """Shell: wait until path exists, for at most seconds."""
    return (
        f"i=0; while [ ! -e {path} ] && [ $i -lt {seconds * 100} ]; do "
        "sleep 0.01; i=$((i+1)); done\n"
    )


OK_RESULT = 'echo \'{"cniVersion":"1.0.0"}\'\nexit 0\n'


@pytest.fixture
def sessions() -> Iterator[list[int]]:
    """Sessions (their leader's pid) a test started: every process in them killed at the end."""
    started: list[int] = []
    try:
        yield started
    finally:
        _kill_sessions(*started)


# --- strays that should die ------------------------------------------------------------------


def test_a_timed_out_plugins_setsid_child_is_killed(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path, sessions: list[int]
) -> None:
    """The plugin hangs past --plugin-timeout after leaving a daemon in a session of its own."""
    pids = tmp_path / "pids"
    name = plugin_network(
        crashed,
        "hanger",
        f"setsid sh -c 'echo $$ > {pids}; exec sleep 300' &\n"
        f"while [ ! -s {pids} ]; do sleep 0.01; done\nexec sleep 300\n",
    )
    code, report = _run_leaving(crashed, capsys, sessions, pids, "--plugin-timeout", "1")
    (daemon,) = _ints(pids)
    assert not alive(daemon)
    assert _killed_warning(report) == (
        "killed 1 process(es) plugins left running outside their process groups, after the "
        f"last plugin ended: {daemon} (sleep)"
    )
    assert by_path(report)[name]["outcome"] != "done"
    assert code == ExitCode.ACTION_FAILED
    assert _subreaper() == 0


def test_a_stopped_stray_is_killed(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path, sessions: list[int]
) -> None:
    pids = tmp_path / "pids"
    name = plugin_network(
        crashed,
        "stopper",
        f"setsid sh -c 'echo $$ > {pids}; kill -STOP $$; exec sleep 300' &\n"
        f"while [ ! -s {pids} ] || ! grep -q ') T' /proc/$(cat {pids})/stat; do sleep 0.01; "
        "done\n" + OK_RESULT,
    )
    code, report = _run_leaving(crashed, capsys, sessions, pids)
    (stray,) = _ints(pids)
    assert not alive(stray)
    assert _killed_warning(report) == (
        "killed 1 process(es) plugins left running outside their process groups, after the "
        f"last plugin ended: {stray} (sh)"
    )
    assert (by_path(report)[name]["outcome"], code) == ("done", ExitCode.OK)
    assert _subreaper() == 0


def test_a_renamed_stray_is_killed_and_named_as_it_now_calls_itself(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path, sessions: list[int]
) -> None:
    """comm rewritten (/proc/self/comm); the stray blocks in open() of a fifo, a single process."""
    pids, fifo = tmp_path / "pids", tmp_path / "fifo"
    os.mkfifo(fifo)
    name = plugin_network(
        crashed,
        "renamer",
        f"setsid sh -c 'printf kubelet > /proc/$$/comm; echo $$ > {pids}; read x < {fifo}' &\n"
        f"while [ ! -s {pids} ]; do sleep 0.01; done\n" + OK_RESULT,
    )
    code, report = _run_leaving(crashed, capsys, sessions, pids)
    (stray,) = _ints(pids)
    assert not alive(stray)
    warning = _killed_warning(report)
    assert warning is not None and warning.endswith(f": {stray} (kubelet)")
    assert (by_path(report)[name]["outcome"], code) == ("done", ExitCode.OK)


def test_a_stray_that_exited_on_its_own_is_reaped_not_counted(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path, sessions: list[int]
) -> None:
    """A zombie when the sweep comes: reaped, and no warning claims it was killed."""
    pids = tmp_path / "pids"
    name = plugin_network(
        crashed,
        "quitter",
        f"(setsid sh -c 'echo $$ > {pids}' &)\n"
        f"while [ ! -s {pids} ] || ! grep -q ') Z' /proc/$(cat {pids})/stat; do sleep 0.01; "
        "done\n" + OK_RESULT,
    )
    code, report = _run_leaving(crashed, capsys, sessions, pids)
    (stray,) = _ints(pids)
    assert _stat(stray) is None  # reaped
    assert _killed_warning(report) is None
    assert (by_path(report)[name]["outcome"], code) == ("done", ExitCode.OK)
    assert _subreaper() == 0


def test_a_chain_of_sessions_each_alive_is_killed_to_the_last(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path, sessions: list[int]
) -> None:
    """Three strays, each in a session of its own and each the parent of the next, all alive:
    each becomes the run's child only as its parent dies."""
    pids = tmp_path / "pids"
    chain = tmp_path / "chain.sh"
    chain.write_text(
        f'echo $$ >> {pids}\nif [ "$1" -gt 0 ]; then setsid sh {chain} $(($1 - 1)) & fi\n'
        "exec sleep 300\n"
    )
    name = plugin_network(
        crashed,
        "chainer",
        f"setsid sh {chain} 2 &\n"
        f"while [ $(wc -l < {pids} 2>/dev/null || echo 0) -lt 3 ]; do sleep 0.01; done\n"
        + OK_RESULT,
    )
    code, report = _run_leaving(crashed, capsys, sessions, pids)
    strays = _ints(pids)
    assert len(strays) == 3
    assert not any(alive(pid) for pid in strays)
    warning = _killed_warning(report)
    assert warning is not None and warning.startswith("killed 3 process(es)")
    assert (by_path(report)[name]["outcome"], code) == ("done", ExitCode.OK)


def test_a_stray_forking_all_along_is_killed_with_everything_it_forked(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path, sessions: list[int]
) -> None:
    """A loop that keeps leaving orphans (each adopted by the run as it is left)."""
    pids = tmp_path / "pids"
    name = plugin_network(
        crashed,
        "spawner",
        f"setsid sh -c 'echo $$ > {pids}; while :; do (sleep 300 &); sleep 0.01; done' &\n"
        f"while [ ! -s {pids} ]; do sleep 0.01; done\nsleep 0.3\n" + OK_RESULT,
    )
    code, report = _run_leaving(crashed, capsys, sessions, pids)
    (sid,) = _ints(pids)
    assert _wait_for(lambda: not _session(sid), 5.0), _session(sid)
    warning = _killed_warning(report)
    assert warning is not None
    assert (by_path(report)[name]["outcome"], code) == ("done", ExitCode.OK)
    assert _subreaper() == 0


def test_strays_of_four_networks_deleted_in_parallel_are_all_killed(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path, sessions: list[int]
) -> None:
    pids = tmp_path / "pids"
    names = [
        plugin_network(
            crashed,
            f"par{n}",
            f"setsid sh -c 'echo $$ >> {pids}; exec sleep 300' &\n"
            f"while ! grep -q . {pids} 2>/dev/null; do sleep 0.01; done\n"
            f"sleep 0.{n}\n" + OK_RESULT,
        )
        for n in range(4)
    ]
    code, report = _run_leaving(crashed, capsys, sessions, pids, "--parallel", "4")
    strays = _ints(pids)
    assert len(strays) == 4
    assert not any(alive(pid) for pid in strays)
    warnings = [w for w in report["warnings"] if w.startswith(KILLED)]
    assert sum(int(w.split()[1]) for w in warnings) == 4
    assert all(by_path(report)[n]["outcome"] == "done" for n in names)
    assert code == ExitCode.OK
    assert _subreaper() == 0


def test_a_stray_is_killed_when_children_are_found_by_scanning_proc(
    crashed: Crashed,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    sessions: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kernel without /proc/PID/task/TID/children (CONFIG_PROC_CHILDREN unset)."""
    monkeypatch.setattr(strays, "threading", types.SimpleNamespace(get_native_id=lambda: -1))
    pids = tmp_path / "pids"
    name = plugin_network(
        crashed,
        "scanned",
        f"setsid sh -c 'echo $$ > {pids}; setsid sleep 300 & exec sleep 300' &\n"
        f"while [ ! -s {pids} ]; do sleep 0.01; done\n" + OK_RESULT,
    )
    code, report = _run_leaving(crashed, capsys, sessions, pids)
    (stray,) = _ints(pids)
    assert not alive(stray)
    assert not _session(stray)
    assert (by_path(report)[name]["outcome"], code) == ("done", ExitCode.OK)
    assert _subreaper() == 0


def test_a_plugin_that_cannot_be_started_leaves_no_subreaper(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    name = plugin_network(crashed, "broken", OK_RESULT)
    plugin = crashed.node.root / "opt/cni/bin/broken"
    plugin.write_text("#!/nonexistent/interpreter\n")
    code, report = _run(crashed, capsys)
    assert by_path(report)[name]["outcome"] != "done"
    assert code == ExitCode.ACTION_FAILED
    assert _subreaper() == 0


# --- what the sweep must leave alone ---------------------------------------------------------


def test_a_process_the_caller_starts_in_its_own_session_while_a_plugin_runs_is_left(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path, sessions: list[int]
) -> None:
    """Here the caller starts it in the reaper's session: the sweep leaves that session alone."""
    started, go = tmp_path / "started", tmp_path / "go"
    name = plugin_network(crashed, "waiter", f"touch {started}\n" + _wait_file(go) + OK_RESULT)
    mine: list[subprocess.Popen[bytes]] = []

    def meanwhile() -> None:
        if _wait_for(started.exists, 20):
            mine.append(subprocess.Popen(["sleep", "300"]))
        go.touch()

    helper = threading.Thread(target=meanwhile)
    helper.start()
    try:
        code, report = _run(crashed, capsys, "--plugin-timeout", "30")
        helper.join()
        (own,) = mine
        assert own.poll() is None
        assert alive(own.pid)
    finally:
        helper.join()
        for p in mine:
            p.kill()
            p.wait()
    assert _killed_warning(report) is None
    assert (by_path(report)[name]["outcome"], code) == ("done", ExitCode.OK)


def test_a_stray_that_gets_the_pid_of_a_child_the_caller_had_is_killed(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path, sessions: list[int]
) -> None:
    if not os.access("/proc/sys/kernel/ns_last_pid", os.W_OK):
        pytest.skip("cannot choose the next pid (/proc/sys/kernel/ns_last_pid)")
    go, pids = tmp_path / "go", tmp_path / "pids"
    own = subprocess.Popen(["sh", "-c", _wait_file(go)])
    reaper_of_own = threading.Thread(target=own.wait)
    reaper_of_own.start()
    x = own.pid
    # The caller's child exits and is reaped; the plugin then has its next fork get that pid.
    name = plugin_network(
        crashed,
        "reuser",
        f"touch {go}\nwhile [ -e /proc/{x} ]; do sleep 0.01; done\n"
        f"echo {x - 1} > /proc/sys/kernel/ns_last_pid\n"
        f"setsid sh -c 'echo $$ > {pids}; exec sleep 300' &\n"
        f"while [ ! -s {pids} ]; do sleep 0.01; done\n" + OK_RESULT,
    )
    try:
        code, report = _run(crashed, capsys, "--plugin-timeout", "30")
    finally:
        reaper_of_own.join()
        sessions.extend(_ints(pids))
    (stray,) = _ints(pids)
    if stray != x:
        pytest.skip(f"another process took pid {x} first")
    assert (by_path(report)[name]["outcome"], code) == ("done", ExitCode.OK)
    assert not alive(stray)


# --- strays that outrun the sweep --------------------------------------------------------------


def test_a_deep_chain_of_processes_is_killed_entirely(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path, sessions: list[int]
) -> None:
    top, ready = tmp_path / "top", tmp_path / "ready"
    chain = tmp_path / "chain.sh"
    chain.write_text(
        'level() {\n  if [ "$1" -gt 0 ]; then level $(($1 - 1)) & wait\n'
        f"  else touch {ready}; exec sleep 300; fi\n}}\n"
        f"echo $$ > {top}\nlevel 600\n"
    )
    name = plugin_network(
        crashed,
        "deep",
        f"setsid sh {chain} &\n" + _wait_file(ready, 60) + OK_RESULT,
    )
    code, report = _run_leaving(crashed, capsys, sessions, top, "--plugin-timeout", "60")
    (sid,) = _ints(top)
    assert (by_path(report)[name]["outcome"], code) == ("done", ExitCode.OK)
    assert _subreaper() == 0
    assert _wait_for(lambda: not _session(sid), 5.0), f"{len(_session(sid))} left"
    warning = _killed_warning(report)
    assert warning is not None and "still there" not in warning


def test_a_stray_walking_by_fork_and_exit_is_killed(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path, sessions: list[int]
) -> None:
    """Each step writes its pid to a file: too short-lived to be seen by a scan of /proc."""
    top, beat = tmp_path / "top", tmp_path / "beat"
    walker = tmp_path / "walk.sh"
    # A script that runs itself, not a function (dash caps the depth of a recursion).
    walker.write_text(f'echo $$ >> {beat}\nsh "$0" &\nsleep 0.01\n')
    name = plugin_network(
        crashed,
        "walker",
        f"setsid sh -c 'echo $$ > {top}; exec sh {walker}' &\n"
        f"while [ ! -s {top} ]; do sleep 0.01; done\nsleep 0.2\n" + OK_RESULT,
    )
    code, report = _run_leaving(crashed, capsys, sessions, top)
    assert (by_path(report)[name]["outcome"], code) == ("done", ExitCode.OK)
    assert _subreaper() == 0

    def stopped() -> bool:
        before = beat.stat().st_size
        time.sleep(0.2)
        return beat.stat().st_size == before

    assert _wait_for(stopped, 5.0), "still walking"


# --- the warning's accuracy ------------------------------------------------------------------

ZOMBIE_LEADER = """\
import ctypes, os, sys, threading, time
threading.Thread(target=time.sleep, args=(300,)).start()
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(os.getpid()))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
ctypes.CDLL(None).syscall(60, 0)  # SYS_exit (x86_64): this thread only
"""


def test_a_running_stray_whose_main_thread_exited_is_named(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path, sessions: list[int]
) -> None:
    if os.uname().machine != "x86_64":
        pytest.skip("SYS_exit is 60 on x86_64 only")
    script, pids = tmp_path / "zl.py", tmp_path / "pids"
    script.write_text(ZOMBIE_LEADER)
    name = plugin_network(
        crashed,
        "threaded",
        f"setsid {sys.executable} {script} {pids} &\n"
        f"while [ ! -s {pids} ] || ! grep -q ') Z' /proc/$(cat {pids})/stat; do sleep 0.01; "
        "done\n" + OK_RESULT,
    )
    code, report = _run_leaving(crashed, capsys, sessions, pids)
    (stray,) = _ints(pids)
    assert (by_path(report)[name]["outcome"], code) == ("done", ExitCode.OK)
    assert _wait_for(lambda: not Path(f"/proc/{stray}").exists(), 5.0)  # killed all the same
    warning = _killed_warning(report)
    assert warning is not None and f": {stray} (" in warning
