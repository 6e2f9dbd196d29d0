"""ruff and mypy --strict are part of the suite: a lint failure fails the build."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from tests.private_node import cannot_run

REPO = Path(__file__).resolve().parent.parent


def run_tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True)


def test_ruff_check() -> None:
    proc = run_tool("ruff", "check", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_format() -> None:
    proc = run_tool("ruff", "format", "--check", ".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_mypy_strict() -> None:
    proc = run_tool("mypy", "--strict")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_gofmt() -> None:
    """The Go the tests build (tests/libcni_client) is as gofmt writes it."""
    gofmt = shutil.which("gofmt")
    if gofmt is None:
        cannot_run("needs Debian's golang-go (gofmt)")
    proc = subprocess.run([gofmt, "-l", "tests"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "", f"not gofmt-formatted:\n{proc.stdout}"
