"""A file the reaper writes and then renames into place: always a new inode of its own.

An open with O_CREAT|O_TRUNC opens whatever lies under the name: a FIFO, whose open waits for a
reader for ever; a device, into which the bytes would go (with --root on a node's disk, one of
this machine's own disks, by the node's choice of major and minor). Whatever lies under one of
these names is a leftover of a run cut short, or was put there: its name is unlinked (the name
only: the inode is never opened) and the file is made anew with O_EXCL.
"""

from __future__ import annotations

import contextlib
import errno
import os

FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_TRIES = 3  # a name taken again as fast as it is freed is someone at work there: give up


def create(name: str, dir_fd: int | None = None, mode: int = 0o600) -> int:
    """A descriptor, open for writing, of a new regular file under name (in dir_fd)."""
    for _ in range(_TRIES):
        try:
            return os.open(name, FLAGS, mode, dir_fd=dir_fd)
        except FileExistsError:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name, dir_fd=dir_fd)
    raise FileExistsError(errno.EEXIST, "taken again each time it was freed", name)
