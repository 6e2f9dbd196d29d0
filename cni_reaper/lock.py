"""One run at a time: an flock on a file under /run, released by the kernel if the run dies."""

from __future__ import annotations

import errno
import fcntl
import os

from cni_reaper.errors import RefusedError, UnsafeInputError
from cni_reaper.unopened import NotRegularFile, open_lock


class RunLock:
    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = -1

    def __enter__(self) -> RunLock:
        os.makedirs(os.path.dirname(self.path), mode=0o755, exist_ok=True)
        try:
            # The open of a device can act (a watchdog's arms it), and with --root the node's
            # disk decides what lies under its /run.
            fd = open_lock(self.path, os.O_RDWR)
        except NotRegularFile as e:
            raise UnsafeInputError(
                f"{self.path} is not a regular file (a {e.kind}): not used as the run's lock"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise RefusedError(f"another cni-reaper holds {self.path}") from None
            raise
        self._fd = fd
        return self

    def __exit__(self, *exc: object) -> None:
        os.close(self._fd)
        self._fd = -1
