"""What a plugin process starts with: nothing of the reaper's but what libcni would give it."""

from __future__ import annotations

import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni_reaper.errors import ExitCode
from cni_reaper.plugin import ProcessRunner
from tests.crashed import Crashed
from tests.nodetree import CONTAINER_IDS

LEAKED_FD = 57  # an inheritable descriptor the reaper was started with


@pytest.fixture
def leaked_fd() -> Iterator[int]:
    """As a careless parent leaves one: open, without close-on-exec."""
    fd = os.open(os.devnull, os.O_RDONLY)
    os.dup2(fd, LEAKED_FD)  # inheritable
    os.close(fd)
    try:
        yield LEAKED_FD
    finally:
        os.close(LEAKED_FD)


@pytest.fixture
def blocked_sigusr1() -> Iterator[None]:
    """The run's threads, and so the plugins they start, would inherit this mask."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def signal_bits(mask: str, *signals: signal.Signals) -> int:
    return int(mask, 16) & sum(1 << (s - 1) for s in signals)


def test_a_plugin_starts_clean(
    crashed: Crashed,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    leaked_fd: int,
    blocked_sigusr1: None,
) -> None:
    """In /, in a session of its own, with default SIGPIPE and SIGXFSZ (which Python ignores),
    no signal blocked, no descriptor it was not meant to get, and CNI_PATH absolute though the
    plugin dir was given relative to where the reaper was started."""
    seen = tmp_path / "seen"
    script = f"""read -r stat < /proc/$$/stat
set -- $stat
{{
  echo "cwd=$(pwd)"
  echo "pid=$1 session=$6"
  if [ -e /proc/$$/fd/{leaked_fd} ]; then echo leaked=yes; else echo leaked=no; fi
  grep -E '^Sig(Ign|Blk):' /proc/$$/status | tr -d ' \\t' | tr ':' '='
  echo "CNI_PATH=$CNI_PATH"
}} > {seen}
cat > /dev/null
"""
    bin_dir = crashed.node.fake_plugin_network("clean", "clean", script)
    crashed.node.write_result(f"clean-{CONTAINER_IDS[0]}-eth0", b"")
    crashed.reboot()
    monkeypatch.chdir(bin_dir.parent)

    code, report = crashed.run(capsys, "--bin-dir", bin_dir.name, "--parallel", "2")

    assert (code, report["entries"][0]["outcome"]) == (ExitCode.OK, "done")
    facts = dict(line.split("=", 1) for line in seen.read_text().split())
    assert facts["cwd"] == "/"
    assert facts["session"] == facts["pid"]
    assert facts["leaked"] == "no"
    assert signal_bits(facts["SigIgn"], signal.SIGPIPE, signal.SIGXFSZ) == 0
    assert int(facts["SigBlk"], 16) == 0
    assert facts["CNI_PATH"].split(":")[-1] == str(bin_dir)
    # The reaper gives its caller's working directory back.
    assert Path.cwd() == bin_dir.parent


def test_a_plugin_gets_its_whole_config_however_large() -> None:
    """The config is written as the plugin reads it, then its stdin closed: wc counts every
    byte of a small config, of none, and of one four times what a pipe holds."""
    runner = ProcessRunner()
    for config in (b'{"cniVersion":"1.0.0"}\n', b"", b"x" * (256 << 10)):
        counted = runner.run(shutil.which("wc") or "/usr/bin/wc", {}, config, timeout=30)
        assert (counted.exit_status, counted.timed_out) == (0, False), counted.stderr
        assert counted.stdout.split()[-1] == str(len(config)).encode()


def test_a_plugin_that_never_reads_its_config_is_not_waited_for() -> None:
    """A program that exits without reading a config larger than a pipe holds is reaped as
    it exits, not held until its timeout: the rest of its input is given up, its exit status
    reported."""
    big = b"x" * (1 << 20)
    run = ProcessRunner().run(shutil.which("true") or "/bin/true", {}, big, timeout=30)
    assert (run.exit_status, run.timed_out) == (0, False)
