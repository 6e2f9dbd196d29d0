"""The installed console script and `python -m cni_reaper` are the same program."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from cni_reaper import __version__

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
