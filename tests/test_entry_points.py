"""The installed console script and `python -m cni_reaper` are the same program."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from cni_reaper import __version__


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
