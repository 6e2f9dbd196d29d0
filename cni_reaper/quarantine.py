"""Moving a damaged cache file out of the results dir, with a JSON sidecar, durably.

Nothing is deleted: the file is renamed into <state-dir>/quarantine/<boot-id>/ and both
directories are fsynced, so after a crash it is in exactly one of the two places.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from collections.abc import Callable
from typing import Any

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
SIDECAR_SUFFIX = ".json"


class QuarantineError(OSError):
    pass


def _open_or_make_dir(parent_fd: int | None, path: str) -> int:
    """Open (creating it 0700 if absent) a directory, refusing a symlink at the last step."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700, dir_fd=parent_fd)
    return os.open(path, DIR_FLAGS, dir_fd=parent_fd)


def _open_dir_chain(path: str) -> int:
    """A descriptor for path, creating missing components; no component may be a symlink
    below the first one that exists (the parts above belong to the system, not to us)."""
    missing: list[str] = []
    head = os.path.abspath(path)
    while not os.path.lexists(head):
        head, tail = os.path.split(head)
        missing.append(tail)
    fd = os.open(head, DIR_FLAGS)
    for name in reversed(missing):
        try:
            child = _open_or_make_dir(fd, name)
        finally:
            os.close(fd)
        fd = child
    return fd


class Quarantine:
    def __init__(self, quarantine_dir: str, boot_id: str) -> None:
        self.dir = os.path.join(quarantine_dir, boot_id or "unknown-boot")
        self._fd: int | None = None

    def _dir_fd(self) -> int:
        if self._fd is None:
            try:
                self._fd = _open_dir_chain(self.dir)
            except OSError as e:
                raise QuarantineError(
                    e.errno, f"cannot open quarantine dir {self.dir}: {e.strerror}"
                ) from None
        return self._fd

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _free_name(self, fd: int, name: str) -> str:
        candidate, n = name, 0
        while _exists(fd, candidate) or _exists(fd, candidate + SIDECAR_SUFFIX):
            n += 1
            candidate = f"{name}.{n}"
        return candidate

    def move(self, results_fd: int, name: str, sidecar: Callable[[str], dict[str, Any]]) -> str:
        """Write the sidecar, then move the file beside it; returns the path it now has."""
        fd = self._dir_fd()
        dest = self._free_name(fd, name)
        path = os.path.join(self.dir, dest)
        _write_durably(fd, dest + SIDECAR_SUFFIX, json.dumps(sidecar(path), indent=2) + "\n")
        try:
            os.rename(name, dest, src_dir_fd=results_fd, dst_dir_fd=fd)
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise QuarantineError(e.errno, f"cannot move {name}: {e.strerror}") from None
            _copy_then_unlink(results_fd, name, fd, dest)
        os.fsync(fd)
        os.fsync(results_fd)
        return path


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _write_durably(dir_fd: int, name: str, text: str) -> None:
    tmp = f".{name}.tmp"
    fd = os.open(
        tmp,
        os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
        0o600,
        dir_fd=dir_fd,
    )
    try:
        _write_all(fd, text.encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    os.fsync(dir_fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _copy_then_unlink(src_dir: int, name: str, dst_dir: int, dest: str) -> None:
    """Across file systems: a durable copy first, the original removed only after it."""
    src = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=src_dir)
    try:
        if not stat.S_ISREG(os.fstat(src).st_mode):
            raise QuarantineError(errno.EINVAL, f"{name} is no longer a regular file")
        dst = os.open(
            dest,
            os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=dst_dir,
        )
        try:
            while True:
                chunk = os.read(src, 1 << 16)
                if not chunk:
                    break
                _write_all(dst, chunk)
            os.fsync(dst)
        finally:
            os.close(dst)
    finally:
        os.close(src)
    os.fsync(dst_dir)
    os.unlink(name, dir_fd=src_dir)
