"""Whether a container runtime is up: its CRI socket accepts a connection."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable


def answering_socket(paths: Iterable[str], timeout: float = 1.0) -> str | None:
    """The first runtime socket that accepts a connection; a stale socket file does not count."""
    for path in paths:
        try:
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                continue
        except OSError:
            continue
        import socket  # noqa: PLC0415 (at boot there is normally no socket to probe)

        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(timeout)
            try:
                probe.connect(path)
            except OSError:
                continue
            return path
    return None
