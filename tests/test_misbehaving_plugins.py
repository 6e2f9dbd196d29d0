"""Plugins that misbehave, each a fake script for a failure mode no real plugin shows on cue: the
run goes on, reports each precisely, and still quarantines per policy."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from cni_reaper.errors import ExitCode
from tests.crashed import Crashed, by_path
from tests.nodetree import CONTAINER_IDS


def plugin_network(crashed: Crashed, name: str, script: str) -> str:
    """A network whose only plugin is script; returns the damaged cache file left for it."""
    crashed.node.fake_plugin_network(name, name, script)
    return crashed.node.write_result(f"{name}-{CONTAINER_IDS[0]}-eth0", b"").name


def run(crashed: Crashed, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any]]:
    crashed.reboot()
    bin_dir = str(crashed.node.root / "opt/cni/bin")
    return crashed.run(capsys, "--bin-dir", bin_dir, "--plugin-timeout", "2")


def alive(pid: int) -> bool:
    """Running, as opposed to gone or a zombie waiting for whoever inherited it."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def quarantined(crashed: Crashed, name: str) -> bool:
    return not (crashed.node.results / name).exists() and any(
        p.name == name for p in crashed.node.quarantine.rglob(name)
    )


@pytest.fixture(params=["pidfd", "polling"])
def exit_wakeup(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The plugin's exit seen through a pidfd, and by polling as on a kernel before 5.3."""
    if request.param == "polling":
        monkeypatch.delattr(os, "pidfd_open", raising=False)
    return str(request.param)


def test_a_plugin_that_forks_a_daemon_holding_its_output_open(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path, exit_wakeup: str
) -> None:
    pidfile = tmp_path / "daemon.pid"
    # The daemon leaves the plugin's process group (setsid) and keeps stdout and stderr open.
    name = plugin_network(
        crashed, "forker", f"setsid sh -c 'echo $$ > {pidfile}; exec sleep 300' &\nexit 0\n"
    )
    try:
        code, report = run(crashed, capsys)
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pidfile.read_text()), signal.SIGKILL)
    # The plugin itself exited 0: DEL succeeded; the run did not wait out the daemon, nor
    # left it running beside the runtime.
    entry = by_path(report)[name]
    assert (entry["outcome"], code) == ("done", ExitCode.OK)
    assert quarantined(crashed, name)
    daemon = int(pidfile.read_text())
    assert not alive(daemon)
    assert (
        "killed 1 process(es) plugins left running outside their process groups, after the "
        f"last plugin ended: {daemon} (sleep)"
    ) in report["warnings"]


def test_processes_a_plugin_left_running_and_the_processes_they_start_are_killed(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A daemon that leaves its group, whose own child leaves again and starts another: each
    becomes the run's child as its parent dies, and is killed in turn. A process of the
    caller's, there before the plugins ran, is left alone."""
    pids = tmp_path / "pids"
    script = (
        "setsid sh -c '"
        f'echo $$ >> {pids}; setsid sh -c "echo \\$\\$ >> {pids}; exec sleep 300" & '
        "exec sleep 300' &\n"
        f"while [ $(wc -l < {pids} 2>/dev/null || echo 0) -lt 2 ]; do sleep 0.01; done\n"
        "exit 0\n"
    )
    name = plugin_network(crashed, "forker", script)
    own = subprocess.Popen(["sleep", "300"], start_new_session=True)
    try:
        code, report = run(crashed, capsys)
        assert own.poll() is None  # the caller's own child, in a session of its own
    finally:
        own.kill()
        own.wait()
        for line in pids.read_text().split() if pids.exists() else []:
            with contextlib.suppress(OSError):
                os.kill(int(line), signal.SIGKILL)
    strays = [int(line) for line in pids.read_text().split()]
    assert len(strays) == 2
    assert not any(alive(pid) for pid in strays)
    (warning,) = [w for w in report["warnings"] if w.startswith("killed ")]
    assert warning.startswith("killed 2 process(es) plugins left running")
    assert (by_path(report)[name]["outcome"], code) == ("done", ExitCode.OK)


def test_a_plugin_that_prints_100_mib(crashed: Crashed, capsys: pytest.CaptureFixture[str]) -> None:
    name = plugin_network(crashed, "loud", "head -c 104857600 /dev/zero\nexit 1\n")
    code, report = run(crashed, capsys)
    error = by_path(report)[name]["plugin_errors"][0]
    assert error["exit_status"] == 1
    assert error["msg"] == "netplugin failed with no error message"
    assert code == ExitCode.ACTION_FAILED
    assert quarantined(crashed, name)


def test_a_plugin_that_exits_0_with_garbage(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    name = plugin_network(crashed, "garbler", "printf '\\001\\377not json at all'\nexit 0\n")
    code, report = run(crashed, capsys)
    # DEL has no result: exit 0 is success whatever it printed.
    assert (by_path(report)[name]["outcome"], code) == ("done", ExitCode.OK)
    assert quarantined(crashed, name)


def test_a_plugin_that_crashes_with_a_signal(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    name = plugin_network(crashed, "crasher", "kill -SEGV $$\n")
    code, report = run(crashed, capsys)
    error = by_path(report)[name]["plugin_errors"][0]
    assert (error["msg"], error["exit_status"]) == ("killed by SIGSEGV", -signal.SIGSEGV)
    assert code == ExitCode.ACTION_FAILED
    assert quarantined(crashed, name)


def test_a_plugin_that_is_not_a_program(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """Executable, but neither a script nor a binary: the kernel refuses it (libcni's exec
    too), the refusal is reported, and the pipes made for it are closed."""
    name = plugin_network(crashed, "garbage", "")
    plugin = crashed.node.root / "opt/cni/bin/garbage"
    plugin.write_bytes(b"\x7fELF but nothing else")
    fds_before = sorted(os.listdir("/proc/self/fd"))
    code, report = run(crashed, capsys)
    error = by_path(report)[name]["plugin_errors"][0]
    assert error["msg"].startswith(f"cannot run {plugin}: [Errno {errno.ENOEXEC}]")
    assert code == ExitCode.ACTION_FAILED
    assert quarantined(crashed, name)
    assert sorted(os.listdir("/proc/self/fd")) == fds_before


def test_a_plugin_that_hangs_with_a_child_is_killed_with_it(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path, exit_wakeup: str
) -> None:
    pidfile = tmp_path / "child.pid"
    name = plugin_network(crashed, "hanger", f"sleep 300 &\necho $! > {pidfile}\nwait\n")
    code, report = run(crashed, capsys)
    error = by_path(report)[name]["plugin_errors"][0]
    assert (error["timed_out"], error["msg"]) == (True, "killed after the 2 s timeout")
    child = int(pidfile.read_text())
    for _ in range(50):
        if not alive(child):
            break
        time.sleep(0.02)
    assert not alive(child)
    assert code == ExitCode.ACTION_FAILED
    assert quarantined(crashed, name)


def test_every_misbehaving_plugin_in_one_run_each_reported(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    names = {
        plugin_network(crashed, "crasher", "kill -ABRT $$\n"): "killed by SIGABRT",
        plugin_network(
            crashed, "errjson", 'echo \'{"code": 7, "msg": "stuck", "details": "d"}\'\nexit 1\n'
        ): "stuck",
    }
    # Different container ids, so each network has its own file.
    for index, old in enumerate(list(names)):
        new = old.replace(CONTAINER_IDS[0], CONTAINER_IDS[index + 1])
        (crashed.node.results / old).rename(crashed.node.results / new)
        names[new] = names.pop(old)
    valid = crashed.add(CONTAINER_IDS[5])
    code, report = run(crashed, capsys)
    for name, msg in names.items():
        assert by_path(report)[name]["plugin_errors"][0]["msg"] == msg
        assert quarantined(crashed, name)
    assert by_path(report)[valid.name]["action"] == "keep"
    assert valid.exists()
    assert code == ExitCode.ACTION_FAILED
