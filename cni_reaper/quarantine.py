"""Moving a damaged cache file out of the results dir, with a JSON sidecar, durably.

Nothing is deleted: the file is renamed into <state-dir>/quarantine/<boot-id>/ and both
directories are fsynced, so after a crash it is in exactly one of the two places. Across file
systems it is copied (to a temp name, fsynced, renamed into place) before the original is
unlinked; a crash between the two leaves it in both places, with a sidecar whose sha256 says
so, and the next run finishes the move instead of making a second copy.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import itertools
import json
import os
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from cni_reaper import __version__, failpoint
from cni_reaper.boot import iso

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC  # temp files
SIDECAR_SUFFIX = ".json"
# Threads that fsync a batch's sidecars at once. Past a few, they share commits anyway.
FSYNC_LANES = 8


# A file name may have 255 bytes; its quarantine name leaves room for ".N", ".json" and the
# temp names' "." and ".tmp". The sidecar keeps the original name.
MAX_NAME_BYTES = 200

SIDECAR_WRITTEN = failpoint.declare("quarantine.sidecar-written")
SIDECAR_IN_PLACE = failpoint.declare("quarantine.sidecar-in-place")
FILE_RENAMED = failpoint.declare("quarantine.file-renamed")
COPY_WRITTEN = failpoint.declare("quarantine.copy-written")
COPY_IN_PLACE = failpoint.declare("quarantine.copy-in-place")
DIRS_FSYNCED = failpoint.declare("quarantine.dirs-fsynced")


class QuarantineError(OSError):
    pass


class Move(NamedTuple):
    """A file to quarantine, and its sidecar, given the path the file will have."""

    results_fd: int
    name: str
    sidecar: Callable[[str], dict[str, Any]]
    sha256: str | None = None


def sidecar(record: dict[str, Any], sha256: str | None, now: float) -> dict[str, Any]:
    """What lies beside a quarantined file: its report record, its digest, when it came."""
    return {
        "schema": 1,
        "reaper_version": __version__,
        "quarantined_at": iso(now),
        "sha256": sha256,
        **record,
    }


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
        self._dirty: set[int] = set()  # results dirs with moves not yet fsynced

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
            if self._dirty:
                self.flush()
            os.close(self._fd)
            self._fd = None

    def _names(self, name: str) -> Iterator[str]:
        base = _short(name)
        yield base
        for n in itertools.count(1):
            yield f"{base}.{n}"

    def _free_name(self, fd: int, name: str, taken: set[str]) -> str:
        """The first name not taken by a quarantined file, nor by a file of this batch. A
        sidecar alone is what a move interrupted before its rename left behind: it is written
        anew."""
        return next(c for c in self._names(name) if c not in taken and not _exists(fd, c))

    def _copied_earlier(self, fd: int, name: str, sha256: str | None) -> str | None:
        """A quarantined copy of this very file whose original was never unlinked."""
        if sha256 is None:
            return None
        for candidate in self._names(name):
            if not _exists(fd, candidate):
                return None
            recorded = _read_sidecar(fd, candidate + SIDECAR_SUFFIX)
            if recorded.get("sha256") == sha256 and sha256_of(fd, candidate) == sha256:
                return candidate
        return None

    def move(
        self,
        results_fd: int,
        name: str,
        sidecar: Callable[[str], dict[str, Any]],
        sha256: str | None = None,
    ) -> str:
        """One file: the path it now has; raises why it could not move."""
        (moved,) = self.move_all([Move(results_fd, name, sidecar, sha256)])
        if isinstance(moved, OSError):
            raise moved
        return moved

    def move_all(self, moves: Sequence[Move]) -> list[str | OSError]:
        """Move a batch of files, each beside its sidecar; for each, the path it now has or
        why it could not move (it then stays where it was).

        Every sidecar is written, then all are fsynced at once, then each file is moved. The
        sidecar is on disk before its rename; the renames of the sidecar and of the file are
        made durable together, by flush(): journalling file systems commit a directory's
        changes in order, so a file is never found here without its sidecar. A power cut
        before flush() may undo some moves; the next run redoes them, DEL being idempotent.
        """
        if not moves:
            return []  # no quarantine dir made for nothing
        try:
            fd = self._dir_fd()
        except QuarantineError as e:
            return [e for _ in moves]
        moved: list[str | OSError] = []
        staged: list[tuple[int, str, int]] = []  # (index in moves, dest, sidecar temp fd)
        taken: set[str] = set()  # names given to this batch, not yet on disk
        try:
            for index, move in enumerate(moves):
                try:
                    earlier = self._copied_earlier(fd, move.name, move.sha256)
                    if earlier is not None:
                        os.unlink(move.name, dir_fd=move.results_fd)
                        os.fsync(move.results_fd)
                        moved.append(os.path.join(self.dir, earlier))
                        continue
                    dest = self._free_name(fd, move.name, taken)
                    taken.add(dest)
                    record = move.sidecar(os.path.join(self.dir, dest))
                    text = json.dumps(record, separators=(",", ":")) + "\n"  # as the report's
                    staged.append((index, dest, _write_temp(fd, dest + SIDECAR_SUFFIX, text)))
                    moved.append(dest)  # until it is in place
                except OSError as e:
                    moved.append(e)
            synced = _fsync_together([temp for _, _, temp in staged])
        except BaseException:
            for _, _, temp in staged:
                os.close(temp)
            raise
        for (index, dest, temp), error in zip(staged, synced):
            os.close(temp)
            moved[index] = error or self._put_in_place(fd, moves[index], dest)
        return moved

    def _put_in_place(self, fd: int, move: Move, dest: str) -> str | OSError:
        """The fsynced sidecar to its name, then the file beside it."""
        failpoint.hit(SIDECAR_WRITTEN)
        sidecar = dest + SIDECAR_SUFFIX
        try:
            os.rename(_temp_name(sidecar), sidecar, src_dir_fd=fd, dst_dir_fd=fd)
            failpoint.hit(SIDECAR_IN_PLACE)
            try:
                os.rename(move.name, dest, src_dir_fd=move.results_fd, dst_dir_fd=fd)
                failpoint.hit(FILE_RENAMED)
            except OSError as e:
                if e.errno != errno.EXDEV:
                    return QuarantineError(e.errno, f"cannot move {move.name}: {e.strerror}")
                _copy_then_unlink(move.results_fd, move.name, fd, dest)
        except OSError as e:
            return e
        self._dirty.add(move.results_fd)
        return os.path.join(self.dir, dest)

    def flush(self) -> None:
        """Make every move so far durable: one fsync of each directory involved."""
        if self._fd is None:
            return
        for error in _fsync_together([self._fd, *sorted(self._dirty)]):
            if error is not None:
                raise error
        self._dirty.clear()
        failpoint.hit(DIRS_FSYNCED)


def _short(name: str) -> str:
    raw = os.fsencode(name)
    if len(raw) <= MAX_NAME_BYTES:
        return name
    return os.fsdecode(raw[:160]) + "~" + hashlib.sha256(raw).hexdigest()[:16]


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _temp_name(name: str) -> str:
    return f".{name}.tmp"


def _write_temp(dir_fd: int, name: str, text: str) -> int:
    """Write text to name's temp file; its descriptor, still open, for the fsync."""
    fd = os.open(_temp_name(name), TEMP_FLAGS, 0o600, dir_fd=dir_fd)
    try:
        _write_all(fd, text.encode())
    except OSError:
        os.close(fd)
        raise
    return fd


def _fsync_together(fds: Sequence[int]) -> list[OSError | None]:
    """fsync each descriptor, from up to FSYNC_LANES threads at once: a journalling file
    system then commits their data in one transaction, or a few, where fsyncs one after
    another cost a journal commit each. For each, the error if it failed."""
    errors: list[OSError | None] = [None for _ in fds]
    lanes = min(len(fds), FSYNC_LANES)

    def sync(lane: int) -> None:
        for index in range(lane, len(fds), lanes):
            try:
                os.fsync(fds[index])
            except OSError as e:
                errors[index] = e

    threads = [threading.Thread(target=sync, args=(lane,)) for lane in range(1, lanes)]
    for thread in threads:
        thread.start()
    try:
        if lanes:
            sync(0)
    finally:
        for thread in threads:
            thread.join()
    return errors


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _read_sidecar(dir_fd: int, name: str) -> dict[str, Any]:
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    except OSError:
        return {}
    with os.fdopen(fd, "rb") as f:
        try:
            doc = json.loads(f.read(1 << 20))
        except ValueError:
            return {}
    return doc if isinstance(doc, dict) else {}


def sha256_of(dir_fd: int, name: str) -> str | None:
    """The file's digest, read through dir_fd without following a symlink; None if unreadable."""
    try:
        fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    digest = hashlib.sha256()
    with os.fdopen(fd, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _copy_then_unlink(src_dir: int, name: str, dst_dir: int, dest: str) -> None:
    """Across file systems: a durable copy first, the original removed only after it."""
    src = os.open(name, READ_FLAGS, dir_fd=src_dir)
    tmp = _temp_name(dest)
    try:
        if not stat.S_ISREG(os.fstat(src).st_mode):
            raise QuarantineError(errno.EINVAL, f"{name} is no longer a regular file")
        dst = os.open(tmp, TEMP_FLAGS, 0o600, dir_fd=dst_dir)
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
    failpoint.hit(COPY_WRITTEN)
    os.rename(tmp, dest, src_dir_fd=dst_dir, dst_dir_fd=dst_dir)
    os.fsync(dst_dir)
    failpoint.hit(COPY_IN_PLACE)
    os.unlink(name, dir_fd=src_dir)
