"""Journal files with chosen trusted fields (_BOOT_ID, _TRANSPORT), written by systemd's own
systemd-journal-remote from journal export format: what journald would have stored, for a
boot that is not this one or kernel messages this machine did not log."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

JOURNAL_REMOTE = next(
    (
        str(p)
        for p in (
            Path("/usr/lib/systemd/systemd-journal-remote"),
            Path("/lib/systemd/systemd-journal-remote"),
        )
        if p.exists()
    ),
    shutil.which("systemd-journal-remote"),
)


def why_not() -> str | None:
    if JOURNAL_REMOTE is None:
        return "needs systemd-journal-remote (Debian package systemd-journal-remote)"
    return None


def write_journal(directory: Path, entries: Sequence[Mapping[str, str]]) -> Path:
    """One journal file in directory holding entries, in order. Each needs
    __REALTIME_TIMESTAMP and __MONOTONIC_TIMESTAMP (microseconds) and _BOOT_ID (32 hex)."""
    assert JOURNAL_REMOTE is not None, why_not()
    directory.mkdir(parents=True, exist_ok=True)
    export = "".join(
        "".join(f"{key}={value}\n" for key, value in entry.items()) + "\n" for entry in entries
    )
    target = directory / "remote.journal"
    subprocess.run(
        [JOURNAL_REMOTE, "-o", str(target), "-"],
        input=export.encode(),
        check=True,
        capture_output=True,
    )
    return target
