"""One run at a time: an flock on a file under /run, released by the kernel if the run dies."""

from __future__ import annotations

import errno
import fcntl
import os
import stat

from cni_reaper.errors import RefusedError, UnsafeInputError


class RunLock:
    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = -1

    def __enter__(self) -> RunLock:
        os.makedirs(os.path.dirname(self.path), mode=0o755, exist_ok=True)
        fd = _open_regular(self.path)
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


_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def _open_regular(path: str) -> int:
    """The lock file, made if absent; refused, and never opened, when something other than a
    regular file lies there: the open of a device can act (a watchdog's arms it), and with
    --root the node's disk decides what lies under its /run."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeInputError(f"{path} is not a regular file: not opened as the run's lock")
    fd = os.open(path, _FLAGS, 0o600)
    if not stat.S_ISREG(os.fstat(fd).st_mode):  # put there between the look and the open
        os.close(fd)
        raise UnsafeInputError(f"{path} is not a regular file: not used as the run's lock")
    return fd
