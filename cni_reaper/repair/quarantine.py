"""Moving a damaged cache file out of the results dir, with a JSON sidecar, durably.

Nothing is deleted: the file is renamed into <state-dir>/quarantine/<boot-id>/ and both
directories are fsynced, so after a crash it is in exactly one of the two places. Across file
systems it is copied (to a temp name, fsynced, renamed into place) before the original is
unlinked (by way of a hidden name: leaving.py); a crash between the two leaves it in both
places, with a sidecar whose sha256 says so, and the next run finishes the move instead of
making a second copy.
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import itertools
import json
import os
import threading
from collections.abc import Callable, Iterator, Sequence

from cni_reaper import __version__, failpoint, leaving, new_file
from cni_reaper.boot import iso
from cni_reaper.filestat import FileStat
from cni_reaper.read_only import read_only_noted
from cni_reaper.record import Record
from cni_reaper.trust import untrusted
from cni_reaper.unopened import DIR_FLAGS, READ_FLAGS, open_regular

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol, Union

    class _Digest(Protocol):
        def update(self, data: bytes, /) -> None: ...
        def hexdigest(self) -> str: ...


def _interpreters_sha256() -> Callable[..., _Digest]:
    """The interpreter's own SHA-256 (_sha2 from Python 3.12, _sha256 before), not OpenSSL's
    through hashlib: loading libcrypto alone added about 3.5 MiB to a real run's peak RSS, to
    hash files of a few KiB (about 2 us more each). hashlib's where it was built without."""
    for module in ("_sha2", "_sha256"):
        with contextlib.suppress(ImportError):
            found: Callable[..., _Digest] = importlib.import_module(module).sha256
            return found
    import hashlib  # noqa: PLC0415

    return hashlib.sha256


sha256 = _interpreters_sha256()

SIDECAR_SUFFIX = ".json"
# Threads that fsync the dirs of a flush at once. Past a few, they share commits anyway. (A
# batch's sidecars need none: see _write_temp.)
FSYNC_LANES = 8


def failed_move(error: OSError) -> str:
    """A failed move as its report says it: the system's words, and the read-only hint."""
    return read_only_noted(f"quarantine: {error.strerror or error}", error)


# A file name may have 255 bytes; its quarantine name leaves room for ".N", ".json" and the
# temp names' "." and ".tmp". The sidecar keeps the original name.
MAX_NAME_BYTES = 200

SIDECAR_WRITTEN = failpoint.declare("quarantine.sidecar-written")
SIDECAR_IN_PLACE = failpoint.declare("quarantine.sidecar-in-place")
FILE_RENAMED = failpoint.declare("quarantine.file-renamed")
COPY_WRITTEN = failpoint.declare("quarantine.copy-written")
COPY_IN_PLACE = failpoint.declare("quarantine.copy-in-place")
ORIGINAL_HIDDEN = failpoint.declare("quarantine.original-hidden")
# After the last check of an original by name, before it is hidden: where a test has it
# replaced or written to, as a writer could then.
ORIGINAL_CHECKED = failpoint.declare("quarantine.original-checked", step=False)
DIRS_FSYNCED = failpoint.declare("quarantine.dirs-fsynced")


class QuarantineError(OSError):
    pass


class FileChanged(Exception):
    """The file is no longer what the plan was made on: it stays in (or goes back to) the
    results dir, and is reported as changed, never quarantined."""


# A sidecar's record, or its JSON text already written out (compact, ASCII, one line with
# no newline), as sidecar_text() makes it.
if TYPE_CHECKING:
    Sidecar = Union[dict[str, Any], str]


class Move(Record):
    """A file to quarantine: where it is, what the scan saw of it, and its sidecar."""

    dir_fd: int
    name: str
    expected: FileStat  # moved only if the file is still exactly this one
    sidecar: Callable[[str, str], Sidecar]  # (its path in quarantine, sha256) -> the record
    # Why these bytes may not be moved (they are not what the plan judged), or None.
    vet: Callable[[bytes], str | None] | None = None


class _Held(Record):
    """A file opened, checked against the scan and hashed, kept open until it has moved."""

    fd: int
    st: os.stat_result
    sha256: str


def sidecar(record: dict[str, Any], sha256: str | None, now: float) -> dict[str, Any]:
    """What lies beside a quarantined file: its report record, its digest, when it came."""
    return {
        "schema": 1,
        "reaper_version": __version__,
        "quarantined_at": iso(now),
        "sha256": sha256,
        **record,
    }


def sidecar_text(record_text: str, sha256: str, now: float) -> str:
    """sidecar() as compact JSON text, from the report record's own text (an object): what
    json.dumps would make of sidecar(json.loads(record_text), ...), without building the dict
    and writing it out again, which cost a quarantined file as much as its moves did."""
    head = f'{{"schema":1,"reaper_version":{_VERSION},"quarantined_at":"{iso(now)}"'
    rest = record_text[1:]
    return f'{head},"sha256":{_quoted(sha256)}{"," if rest != "}" else ""}{rest}'


_quoted = json.encoder.encode_basestring_ascii
_VERSION = _quoted(__version__)


def _our_dir(name: str, where: str, parent_fd: int | None = None, *, make: bool = False) -> int:
    """The dir name (below parent_fd, or by path), never through a symlink at its last step,
    made 0700 first when make and missing; an OSError names it by where. Refused (EPERM)
    unless only root or the reaper's user may write it: anyone else could plant a FIFO under a
    sidecar's temp name, whose open would hang the boot, or a copy and sidecar that pass for a
    hidden file's, which would then be let go."""
    if parent_fd is not None and (name in ("", ".", "..") or "/" in name):
        raise OSError(errno.EINVAL, "not one name of a dir below the one before it", where)
    try:
        if make:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o700, dir_fd=parent_fd)
        fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError as e:
        raise OSError(e.errno, e.strerror, where) from None
    why = untrusted(os.fstat(fd))
    if why is not None:
        os.close(fd)
        raise OSError(errno.EPERM, f"{why}, so not trusted to hold a quarantine", where)
    return fd


def _open_dir_chain(top: str, below: Sequence[str]) -> int:
    """A descriptor for top/below..., making each missing dir 0700. The parts above top are the
    system's (/var/lib may be a symlink to a bigger disk) and are followed; top and every dir
    below it are ours (_our_dir), each opened below the one before it. Raises the OSError of
    the first dir that could not be opened, named by its path."""
    missing: list[str] = []
    # Not normalized: the kernel takes "link/.." through the link, and so does whoever reads
    # the paths a move reports (self.dir joined); a ".." among the dirs to make is refused.
    head = os.path.join(os.getcwd(), top.rstrip("/") or "/")
    while not os.path.lexists(head):
        head, tail = os.path.split(head)
        missing.append(tail)
    if not missing:
        fd = _our_dir(head, head)
    else:
        try:
            fd = os.open(head, _SYSTEM_DIR_FLAGS)
        except OSError as e:
            raise OSError(e.errno, e.strerror, head) from None
    where = head
    for name in (*reversed(missing), *below):
        where = os.path.join(where, name)
        try:
            child = _our_dir(name, where, fd, make=True)
        finally:
            os.close(fd)
        fd = child
    return fd


_SYSTEM_DIR_FLAGS = DIR_FLAGS & ~os.O_NOFOLLOW


class Quarantine:
    def __init__(
        self, quarantine_dir: str, boot_id: str, *box: str, owner_locks: bool = False
    ) -> None:
        """Files go to the boot's dir of the quarantine, or to the box below it (Multus's,
        or host-local's and its network's). owner_locks: the dirs files leave are locked by
        their owner through every move (host-local's store), so no name changes hands between
        a check and an unlink."""
        self._top = quarantine_dir
        self._below = (boot_id or "unknown-boot", *box)
        self.dir = os.path.join(quarantine_dir, *self._below)
        self._hide = not owner_locks
        self._fd: int | None = None
        self._failed: QuarantineError | None = None
        self._dirty: set[int] = set()  # source dirs with moves not yet fsynced

    def _dir_fd(self) -> int:
        if self._failed is not None:
            raise self._failed.with_traceback(None)  # a batch of 64 files is not 64 tries
        if self._fd is None:
            try:
                self._fd = _open_dir_chain(self._top, self._below)
            except OSError as e:
                why = e.strerror
                if e.errno in (errno.ELOOP, errno.ENOTDIR):
                    why = f"{why} (not a dir of its own: a symlink is never followed)"
                self._failed = QuarantineError(
                    e.errno, f"cannot open quarantine dir {e.filename}: {why}"
                )
                raise self._failed from None
        return self._fd

    def close(self) -> None:
        if self._fd is not None:
            if self._dirty:
                self.flush()
            os.close(self._fd)
            self._fd = None

    def _free_name(self, fd: int, name: str, taken: set[str]) -> str:
        """The first name not taken by a quarantined file, nor by a file of this batch. A
        sidecar alone is what a move interrupted before its rename left behind: it is written
        anew."""
        return next(c for c in _names(name) if c not in taken and not _exists(fd, c))

    def _copied_earlier(self, fd: int, move: Move, sha256: str) -> str | None:
        """A quarantined copy of this very file whose original was never unlinked: the same
        bytes, and a sidecar that names the same original (every empty file has one sha256)."""

        def path(candidate: str) -> object:
            return _record(move.sidecar(os.path.join(self.dir, candidate), sha256)).get("path")

        return _copy_named(fd, move.name, sha256, path)

    def move(self, move: Move) -> str:
        """One file: the path it now has; raises why it could not move, or FileChanged."""
        (moved,) = self.move_all([move])
        if isinstance(moved, (OSError, FileChanged)):
            raise moved
        return moved

    def move_all(self, moves: Sequence[Move]) -> list[str | OSError | FileChanged]:
        """Move a batch of files, each beside its sidecar; for each, the path it now has, why
        it could not move (it then stays where it was), or FileChanged.

        Each file is opened and checked against what the scan saw (inode, size, mtime, ctime),
        read and hashed, and its sidecar records that hash. Every sidecar is written, then all
        are fsynced at once, then each file is moved: checked once more just before it leaves,
        and again once it has arrived (the same inode, size, mtime and bytes; its ctime moves
        with the rename itself). A file that changed on the way is put back. The renames of the
        sidecar and of the file are made durable together, by flush(): journalling file
        systems commit a directory's changes in order, so a file is never found here without
        its sidecar. A power cut before flush() may undo some moves; the next run redoes
        them, DEL being idempotent.
        """
        self._failed = None  # a dir that could not be opened is tried again once a batch
        moved: list[str | OSError | FileChanged] = []
        held: list[_Held] = []
        staged: list[tuple[int, str, _Held]] = []  # (index in moves, dest, the file)
        temps: list[int] = []  # each staged file's sidecar, written, not yet in place
        try:
            taken: set[str] = set()  # names given to this batch, not yet on disk
            for index, move in enumerate(moves):
                try:
                    file = _hold(move)
                except (OSError, FileChanged) as e:
                    moved.append(e)
                    continue
                held.append(file)
                try:
                    fd = self._dir_fd()  # made only once a file is to move
                    earlier = self._copied_earlier(fd, move, file.sha256)
                    if earlier is not None:
                        moved.append(self._finish_copy(move, file, earlier, ours=False))
                        continue
                    dest = self._free_name(fd, move.name, taken)
                    taken.add(dest)
                    record = move.sidecar(os.path.join(self.dir, dest), file.sha256)
                    temps.append(_write_temp(fd, dest + SIDECAR_SUFFIX, _text(record)))
                    staged.append((index, dest, file))
                    moved.append(dest)  # until it is in place
                except OSError as e:
                    moved.append(e)
            synced = _fsync_all(temps)
            while temps:
                os.close(temps.pop())
            for (index, dest, file), error in zip(staged, synced):
                fd = self._dir_fd()  # open: a file is staged in it
                if error is not None:
                    _drop_temp(fd, dest + SIDECAR_SUFFIX)
                moved[index] = error or self._put_in_place(fd, moves[index], dest, file)
        finally:
            for temp in temps:
                os.close(temp)
            for file in held:
                os.close(file.fd)
        return moved

    def _put_in_place(
        self, fd: int, move: Move, dest: str, file: _Held
    ) -> str | OSError | FileChanged:
        """The fsynced sidecar to its name, then the file beside it, checked on both sides."""
        failpoint.hit(SIDECAR_WRITTEN)
        sidecar = dest + SIDECAR_SUFFIX
        try:
            try:
                os.rename(_temp_name(sidecar), sidecar, src_dir_fd=fd, dst_dir_fd=fd)
            except OSError:
                _drop_temp(fd, sidecar)
                raise
            failpoint.hit(SIDECAR_IN_PLACE)
            change = _still_held(move, file)
            if change is not None:
                _unlink_quietly(fd, sidecar)
                return FileChanged(change)
            try:
                os.rename(move.name, dest, src_dir_fd=move.dir_fd, dst_dir_fd=fd)
                failpoint.hit(FILE_RENAMED)
            except OSError as e:
                if e.errno != errno.EXDEV:
                    _unlink_quietly(fd, sidecar)
                    return QuarantineError(e.errno, f"cannot move {move.name}: {e.strerror}")
                return self._copy_then_unlink(move, file, dest)
            self._dirty.add(move.dir_fd)
            change = _arrived_unchanged(file, fd, dest)
            if change is not None:
                return self._put_back(move, fd, dest, change)
        except OSError as e:
            return e
        return os.path.join(self.dir, dest)

    def _put_back(self, move: Move, fd: int, dest: str, change: str) -> OSError | FileChanged:
        """A file that changed on its way out goes back, but never over a file that appeared
        under its name meanwhile: link() does not replace."""
        back, error = leaving.put_back(fd, dest, move.dir_fd, move.name)
        if isinstance(error, FileExistsError) and not back:
            # It stays here, with a sidecar that says what it holds now and why it is here.
            record = _record(move.sidecar(os.path.join(self.dir, dest), sha256_of(fd, dest) or ""))
            record["problems"] = [*record.get("problems", []), change]
            _replace_sidecar(fd, dest + SIDECAR_SUFFIX, record)
            return QuarantineError(
                errno.EEXIST, f"{change}, and a new {move.name} appeared meanwhile: left in {dest}"
            )
        if error is not None:
            raise error
        _unlink_quietly(fd, dest + SIDECAR_SUFFIX)
        return FileChanged(f"{change}; put back")

    def _copy_then_unlink(self, move: Move, file: _Held, dest: str) -> str | FileChanged:
        """Across file systems: a durable copy of the bytes that were hashed first, the
        original removed only after it, and only if it is still those bytes."""
        fd = self._dir_fd()
        data = _read_whole(file.fd, file.st.st_size)
        tmp = _temp_name(dest)
        if sha256(data).hexdigest() != file.sha256:
            _unlink_quietly(fd, dest + SIDECAR_SUFFIX)
            return FileChanged("its bytes changed as it was copied; left in place")
        try:
            copy = new_file.create(tmp, fd)
            try:
                _write_all(copy, data)
                os.fsync(copy)
            finally:
                os.close(copy)
        except OSError:
            # Nothing of this move is left here: the original stays where it was.
            _drop_temp(fd, dest)
            with contextlib.suppress(OSError):
                os.unlink(dest + SIDECAR_SUFFIX, dir_fd=fd)
            raise
        failpoint.hit(COPY_WRITTEN)
        os.rename(tmp, dest, src_dir_fd=fd, dst_dir_fd=fd)
        os.fsync(fd)
        failpoint.hit(COPY_IN_PLACE)
        return self._finish_copy(move, file, dest, ours=True)

    def _finish_copy(self, move: Move, file: _Held, dest: str, ours: bool) -> str | FileChanged:
        """The original of a durable copy is unlinked if it is still the file that was copied;
        otherwise the original stays, and a copy this run made goes (one an earlier run left
        stays: it holds the bytes that run saw)."""
        change = _still_held(move, file)
        failure: OSError | None = None
        if change is None:
            failpoint.hit(ORIGINAL_CHECKED)
            try:
                change = self._unlink_original(move, file)
            except QuarantineError as e:
                failure = e  # once hidden: it is back under its name, or said where it is
            except OSError as e:
                # It stayed where it was (a read-only results dir), or it went or changed just
                # now, as it may a moment earlier above.
                failure = e
                with contextlib.suppress(OSError):
                    change = _still_held(move, file)
            else:
                if change is None:
                    self._dirty.add(move.dir_fd)
                    return os.path.join(self.dir, dest)
        if ours:
            self._take_back(dest)
        if change is not None:
            return FileChanged(change)
        assert failure is not None
        raise failure

    def _unlink_original(self, move: Move, file: _Held) -> str | None:
        """The original of a durable copy gone from its dir, if it is still the file that was
        copied; why not, if not (it is then where it was). Hidden first under a name no one
        else writes, checked there, and only then unlinked (leaving.py): an unlink by name
        after a check by name could take a file that replaced it in between."""
        hidden = leaving.hidden_name(move.dir_fd, move.name) if self._hide else None
        if hidden is None:
            # The name has no room for the suffix (or the owner's lock guards it): by name.
            os.unlink(move.name, dir_fd=move.dir_fd)
            return None
        os.rename(move.name, hidden, src_dir_fd=move.dir_fd, dst_dir_fd=move.dir_fd)
        failpoint.hit(ORIGINAL_HIDDEN)
        try:
            change = _arrived_unchanged(file, move.dir_fd, hidden)
            if change is None:
                os.unlink(hidden, dir_fd=move.dir_fd)
                return None
        except OSError as e:
            back = _unhide(move, hidden)
            raise QuarantineError(e.errno, f"cannot move {move.name}: {e.strerror}{back}") from None
        return change + _unhide(move, hidden)

    def _take_back(self, dest: str) -> None:
        """A copy this run made leaves the quarantine again, so that it holds no file its report
        says stayed where it was; its sidecar only with it, never a copy without one. A removal
        that fails hides nothing: the move's own failure or change is what is said."""
        fd = self._dir_fd()
        try:
            _unlink_quietly(fd, dest)
        except OSError:
            return
        with contextlib.suppress(OSError):
            os.unlink(dest + SIDECAR_SUFFIX, dir_fd=fd)
        # Durable at once: a copy a power cut brought back would stay, beside a sidecar that
        # says it moved, where the report said it stayed.
        with contextlib.suppress(OSError):
            os.fsync(fd)

    def flush(self) -> None:
        """Make every move so far durable: one fsync of each directory involved."""
        if self._fd is None:
            return
        for error in _fsync_together([self._fd, *sorted(self._dirty)]):
            if error is not None:
                raise error
        self._dirty.clear()
        failpoint.hit(DIRS_FSYNCED)


def _hold(move: Move) -> _Held:
    """Open the file, check it is what the scan saw, read and hash it. The descriptor stays
    open, so that the inode that was hashed is the one checked again as it moves."""
    try:
        fd = os.open(move.name, READ_FLAGS, dir_fd=move.dir_fd)
    except FileNotFoundError:
        raise FileChanged("gone since the scan") from None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise FileChanged("replaced by a symlink since the scan") from None
        raise
    try:
        st = os.fstat(fd)
        change = move.expected.changes(st)
        if change is not None:
            raise FileChanged(f"{change} since the scan")
        data = _read_whole(fd, st.st_size)
        problem = move.vet(data) if move.vet is not None else None
        if problem is not None:
            raise FileChanged(problem)
        after = os.fstat(fd)
        change = move.expected.changes(after)
        if change is not None or len(data) != after.st_size:
            raise FileChanged(f"{change or 'its size changed'} while it was read")
        return _Held(fd, after, sha256(data).hexdigest())
    except BaseException:
        os.close(fd)
        raise


def _still_held(move: Move, file: _Held) -> str | None:
    """Whether the name is still the inode that was hashed, unchanged; why not, if not."""
    try:
        st = os.stat(move.name, dir_fd=move.dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return "gone since it was read"
    if st.st_ino != file.st.st_ino or st.st_dev != file.st.st_dev:
        return "replaced by another file since it was read"
    change = move.expected.changes(os.fstat(file.fd))
    return f"{change} since it was read" if change is not None else None


def _unhide(move: Move, hidden: str) -> str:
    """A file hidden on its way out back under its name (leaving.put_back): what became of it,
    to end a report's line. One left hidden, the next real run settles (leaving.settle); a
    hidden name whose unlink failed is a second name of the file, which settle drops."""
    back, error = leaving.put_back(move.dir_fd, hidden, move.dir_fd, move.name)
    if back:
        return "; put back"
    assert error is not None  # what kept it from going back
    if isinstance(error, FileExistsError):
        return f", and a new {move.name} appeared meanwhile: left as {hidden}"
    return f"; it could not go back ({error.strerror}): left as {hidden}"


def _arrived_unchanged(file: _Held, fd: int, dest: str) -> str | None:
    """Once renamed: the same inode arrived, with the size, mtime and bytes that were hashed."""
    st = os.stat(dest, dir_fd=fd, follow_symlinks=False)
    if st.st_ino != file.st.st_ino or st.st_dev != file.st.st_dev:
        return "another file took its place as it was moved"
    now = os.fstat(file.fd)
    if now.st_size != file.st.st_size or now.st_mtime_ns != file.st.st_mtime_ns:
        return "it was written to as it was moved"
    if sha256(_read_whole(file.fd, now.st_size)).hexdigest() != file.sha256:
        return "its bytes changed as it was moved"
    return None


def _read_whole(fd: int, size: int) -> bytes:
    """The file's bytes from its start, a byte more than size if it has grown."""
    chunks = []
    offset = 0
    while offset <= size:
        chunk = os.pread(fd, size + 1 - offset, offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _short(name: str) -> str:
    raw = os.fsencode(name)
    if len(raw) <= MAX_NAME_BYTES:
        return name
    return os.fsdecode(raw[:160]) + "~" + sha256(raw).hexdigest()[:16]


def _names(name: str) -> Iterator[str]:
    """The names a file may take in a quarantine dir, in order. None ends like a sidecar: a
    file named X.json would be written over by the sidecar of a file named X."""
    base = _short(name)
    if not base.endswith(SIDECAR_SUFFIX):
        yield base
    for n in itertools.count(1):
        yield f"{base}.{n}"


def _copy_named(fd: int, name: str, sha256: str, path: Callable[[str], object]) -> str | None:
    """The copy, in the quarantine dir open at fd, of a file called name holding these bytes,
    as its sidecar says too, whose sidecar's path is path(the copy's name)."""
    for candidate in _names(name):
        if not _exists(fd, candidate):
            return None
        recorded = _read_sidecar(fd, candidate + SIDECAR_SUFFIX)
        if recorded.get("sha256") != sha256 or sha256_of(fd, candidate) != sha256:
            continue
        if recorded.get("path") == path(candidate):
            return candidate
    return None


def _exists(dir_fd: int, name: str) -> bool:
    try:
        os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return False
    return True


def _unlink_quietly(dir_fd: int, name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)


def _temp_name(name: str) -> str:
    return f".{name}.tmp"


def _drop_temp(dir_fd: int, name: str) -> None:
    """name's temp file gone after a write, fsync or rename of it failed: the error said is
    that one, not the unlink's, on a file system that may refuse this too."""
    with contextlib.suppress(OSError):
        os.unlink(_temp_name(name), dir_fd=dir_fd)


def _text(record: Sidecar) -> str:
    """A sidecar's file content: its record as compact JSON, as the report's, on one line."""
    if isinstance(record, str):
        return record + "\n"
    return json.dumps(record, separators=(",", ":")) + "\n"


def _record(record: Sidecar) -> dict[str, Any]:
    if isinstance(record, str):
        doc: dict[str, Any] = json.loads(record)
        return doc
    return record


def _write_temp(dir_fd: int, name: str, text: str) -> int:
    """Write text to name's temp file; its descriptor, still open, for the fsync. Its write-
    back is started at once (POSIX_FADV_DONTNEED writes a file's dirty pages out, without
    waiting, then drops them from the cache): by the time the batch is fsynced, every sidecar
    has its blocks allocated, so the first fsync's journal commit carries them all and the
    others find their data already durable, where each fsync started its own file's writeback
    and waited for a commit of its own. Only the fsync is relied on."""
    fd = new_file.create(_temp_name(name), dir_fd)
    try:
        _write_all(fd, text.encode())
        # A hint: a file system that refuses it must not fail the move; the fsync decides.
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError:
        os.close(fd)
        _drop_temp(dir_fd, name)
        raise
    return fd


def _replace_sidecar(dir_fd: int, name: str, record: dict[str, Any]) -> None:
    temp = _write_temp(dir_fd, name, _text(record))
    try:
        os.fsync(temp)
    finally:
        os.close(temp)
    os.rename(_temp_name(name), name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def _fsync_all(fds: Sequence[int]) -> list[OSError | None]:
    """fsync each descriptor, one after another (their writeback already started: see
    _write_temp); for each, the error if it failed."""
    errors: list[OSError | None] = []
    for fd in fds:
        try:
            os.fsync(fd)
        except OSError as e:
            errors.append(e)
        else:
            errors.append(None)
    return errors


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


def _open_regular(dir_fd: int, name: str) -> int | None:
    """A descriptor for name in dir_fd if it is a regular file; None for anything else (a
    symlink, never followed; a dir; a FIFO or a device, never waited on nor read endlessly)
    and for what cannot be opened. Looked at before the open, as a device's open may act; and
    after it, as the name may have changed hands in between."""
    try:
        return open_regular(name, dir_fd)
    except OSError:
        return None


def _read_sidecar(dir_fd: int, name: str) -> dict[str, Any]:
    fd = _open_regular(dir_fd, name)
    if fd is None:
        return {}
    with os.fdopen(fd, "rb") as f:
        try:
            doc = json.loads(f.read(1 << 20))
        except (OSError, ValueError, RecursionError):
            return {}
    return doc if isinstance(doc, dict) else {}


def copy_finder(
    quarantine_dir: str,
    boot_id: str,
    box: str | None,
    dir_fd: int,
    path_of: Callable[[str], str],
) -> Callable[[str, str], tuple[str | None, str]]:
    """leaving.settle's copy_of for the dir open at dir_fd, whose files a move takes to the box
    of a boot's dir (None: the boot's dir itself), their sidecars naming each by path_of(its
    name): of a hidden file and its original's name, where a true copy of it is, in this boot's
    dir or, failing that, in any earlier boot's (a run killed in its last step, then a power
    cut, leaves the copy in the dir of a boot that is over); and what kept it from looking
    everywhere, "" if nothing did. Every dir is opened below the one before it, never through
    a symlink: one swapped in after the listing is refused, not followed."""
    boots = boot_dirs(quarantine_dir, boot_id or "unknown-boot")

    def copy_of(name: str, original: str) -> tuple[str | None, str]:
        digest = sha256_of(dir_fd, name)
        if digest is None:
            return None, "it could not be read to compare"
        path = path_of(original)
        try:
            top = open_quarantine(quarantine_dir)
        except OSError as e:
            return None, "" if e.errno in NO_DIR_THERE else _unsearched(e)
        unsearched = []
        try:
            for boot in boots:
                try:
                    found = _copy_in(top, quarantine_dir, boot, box, original, digest, path)
                except OSError as e:
                    if e.errno not in NO_DIR_THERE:
                        unsearched.append(_unsearched(e))
                    continue
                if found is not None:
                    return found, ""
        finally:
            os.close(top)
        return None, "; ".join(unsearched)

    return copy_of


def open_quarantine(quarantine_dir: str) -> int:
    """The quarantine dir, for looking in its boots' dirs (open_box); raises as _our_dir."""
    return _our_dir(quarantine_dir, quarantine_dir)


def open_box(top: int, quarantine_dir: str, boot: str, box: str | None) -> tuple[int, str]:
    """The box of a boot's dir (None: the boot's dir itself) of the quarantine open at top,
    and its path: each dir opened below the one before it, as _our_dir opens it."""
    where = os.path.join(quarantine_dir, boot)
    fd = _our_dir(boot, where, top)
    if box is None:
        return fd, where
    try:
        where = os.path.join(where, box)
        return _our_dir(box, where, fd), where
    finally:
        os.close(fd)


def _copy_in(
    top: int, quarantine_dir: str, boot: str, box: str | None, original: str, digest: str, path: str
) -> str | None:
    """_copy_named in the box of a boot's dir (or the boot's dir) of the quarantine open at
    top: the copy's path, or None."""
    fd, where = open_box(top, quarantine_dir, boot, box)
    try:
        found = _copy_named(fd, original, digest, lambda _: path)
    finally:
        os.close(fd)
    return None if found is None else os.path.join(where, found)


# A dir that is absent, or is no dir (a symlink among them: never followed), holds no copy.
NO_DIR_THERE = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)


def _unsearched(error: OSError) -> str:
    return f"{error.filename} not searched: {error.strerror or error}"


def boot_dirs(quarantine_dir: str, boot_id: str) -> list[str]:
    """The names of the boots' dirs the quarantine holds: this one first (whether or not it has
    a dir yet), then every other by name. Which are dirs the open says (_copy_in): O_DIRECTORY
    and O_NOFOLLOW refuse a symlink, a FIFO or a device before anything is opened."""
    try:
        names = os.listdir(quarantine_dir)
    except OSError:
        names = []
    return [boot_id, *sorted(name for name in names if name != boot_id)]


def sha256_of(dir_fd: int, name: str) -> str | None:
    """The regular file's digest, read through dir_fd without following a symlink; None if it
    is no regular file (_open_regular), or unreadable."""
    fd = _open_regular(dir_fd, name)
    if fd is None:
        return None
    digest = sha256()
    with os.fdopen(fd, "rb") as f:
        try:
            for chunk in iter(lambda: f.read(1 << 16), b""):
                digest.update(chunk)
        except OSError:
            return None
    return digest.hexdigest()
