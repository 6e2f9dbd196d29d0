"""What lies under a name, seen before the name is opened for reading.

Opening a device runs its driver's open: a watchdog's arms the machine's reset, a tape's rewinds
it, a terminal's may make it the reader's controlling terminal. With --root on a node's disk
the node decides what lies under every path the run reads there, down to a device's major and
minor. An open with O_PATH runs no driver: what it finds is looked at first, and only a regular
file, or a symlink that the caller's own open refuses or follows as before, is opened for real.

Used where a run reads a file by a name it did not list: its markers, wtmp, a tree's /proc,
configs, wtmpdb's side files. Where every entry of a dir is read (the results, a store), the
listing says which are regular files (lstat, or the listing's own file types), and nothing
else is opened: an O_PATH look at each of 100,000 entries cost 2.3 us.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat

# Every read of a file by name: never through a symlink, never waiting on a FIFO swapped in,
# never taking a terminal.
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
# Every open of a dir by name: O_DIRECTORY refuses anything else before a driver's open runs.
DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

_KINDS = {
    stat.S_IFIFO: "FIFO",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
    stat.S_IFSOCK: "socket",
    stat.S_IFDIR: "directory",
    stat.S_IFLNK: "symlink",
}


class NotRegularFile(OSError):
    """What lies under a name is no regular file (kind: what it is), and was not opened."""

    def __init__(self, kind: str, name: str) -> None:
        super().__init__(errno.EINVAL, "not a regular file", name)
        self.kind = kind


def refuse_unless_regular(name: str, dir_fd: int | None = None, *, follow: bool = False) -> None:
    """Raises NotRegularFile when what lies under name is neither a regular file nor, unless
    follow, a symlink; the errors of a lookup (FileNotFoundError, ...) as an open would."""
    mode = _looked_at(name, dir_fd, follow)
    if not follow and stat.S_ISLNK(mode):
        return
    refuse_unless_regular_mode(mode, name)


def _looked_at(name: str, dir_fd: int | None = None, follow: bool = False) -> int:
    """The mode of what lies under name, seen through O_PATH: no driver's open runs."""
    fd = os.open(name, os.O_PATH | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW), dir_fd=dir_fd)
    try:
        return os.fstat(fd).st_mode
    finally:
        os.close(fd)


def refuse_unless_regular_mode(mode: int, name: str) -> None:
    """refuse_unless_regular() of a name already looked at (lstat), with this mode."""
    if not stat.S_ISREG(mode):
        raise NotRegularFile(_KINDS.get(stat.S_IFMT(mode), "special file"), name)


def open_regular(name: str, dir_fd: int | None = None, *, follow: bool = False) -> int:
    """A descriptor, for reading, of the regular file under name: looked at before the open
    (refuse_unless_regular), and after it, as the name may have changed hands in between.
    Raises NotRegularFile for anything else; a symlink fails the open (ELOOP), unless follow,
    when what it points to is looked at and opened as name itself would be."""
    refuse_unless_regular(name, dir_fd, follow=follow)
    flags = READ_FLAGS & ~os.O_NOFOLLOW if follow else READ_FLAGS
    return _checked(os.open(name, flags, dir_fd=dir_fd), name)


def open_lock(name: str, access: int) -> int:
    """A descriptor of the regular file under name, made (0600) if nothing is there, for a
    lock: access is os.O_RDONLY or os.O_RDWR. What lies there is looked at first, as by
    open_regular, and a symlink is refused too; a lock file is shared with others
    (host-local's), so it is never made anew."""
    with contextlib.suppress(FileNotFoundError):  # made below
        refuse_unless_regular_mode(_looked_at(name), name)
    return _checked(os.open(name, access | os.O_CREAT | READ_FLAGS, 0o600), name)


def _checked(fd: int, name: str) -> int:
    """fd, if it is of a regular file; else closed, and NotRegularFile raised: a name swapped
    between the look and the open."""
    try:
        refuse_unless_regular_mode(os.fstat(fd).st_mode, name)
    except OSError:  # NotRegularFile among them
        os.close(fd)
        raise
    return fd
