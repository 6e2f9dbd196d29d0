"""A node's state made private to one mount namespace, and what a crash does to it.

Shared by the scenarios that run as root under `unshare` (tests/netns_scenario.py,
tests/runtime_scenario.py) and by the tests that start them.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import NoReturn

import pytest


def cannot_run(reason: str) -> NoReturn:
    """Skip on a developer's machine, but fail in CI, where every test must really run."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"cannot run this test in CI: {reason}")
    pytest.skip(reason)


def unshare(*, net: bool = False, pid: bool = False) -> list[str]:
    """The command prefix for a private mount namespace (and network, and PID namespace, whose
    first process is then PID 1: should it die, the kernel kills the rest)."""
    argv = ["unshare", "--mount", "--propagation", "private"]
    if net:
        argv.append("--net")
    if pid:
        argv += ["--pid", "--fork", "--kill-child", "--mount-proc"]
    return argv


def private_tmpfs(path: Path) -> None:
    """A tmpfs over path in this mount namespace only; an absent path is made under a tmpfs parent,
    so that nothing is created on the machine's own file system."""
    if not path.is_dir():
        private_tmpfs(path.parent)
        path.mkdir()
        return
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(path)], check=True)


def bind(source: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(source), str(target)], check=True)


def damage(path: Path, how: str) -> None:
    """What a power cut leaves of an unsynced truncate-and-write ("valid": the write made it)."""
    if how == "valid":
        return
    data = path.read_bytes()
    if how == "empty":
        path.write_bytes(b"")
    elif how == "zeroed":
        path.write_bytes(b"\0" * len(data))
    elif how == "truncated":
        path.write_bytes(data[: len(data) // 3])
    else:
        raise ValueError(f"unknown damage {how!r}")


def tree_digest(*roots: Path) -> dict[str, str]:
    """Mode, size, mtime and content hash of every path under roots."""
    digest: dict[str, str] = {}
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in dirnames + filenames:
                path = os.path.join(dirpath, name)
                st = os.lstat(path)
                entry = f"{st.st_mode:o} {st.st_size} {st.st_mtime_ns}"
                if os.path.isfile(path) and not os.path.islink(path):
                    entry += " " + hashlib.sha256(Path(path).read_bytes()).hexdigest()
                digest[path] = entry
    return digest


def reaper_command() -> list[str]:
    """The installed console script, as an operator runs it."""
    script = Path(sys.executable).with_name("cni-reaper")
    return [str(script)] if script.exists() else [sys.executable, "-m", "cni_reaper"]
