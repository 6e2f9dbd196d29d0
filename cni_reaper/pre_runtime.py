"""This boot's record of the CNI state as it was before any container runtime started in it.

No wall clock proves that a file predates this boot: RTC-less boards start in the past, NTP
steps the clock, and /proc/stat btime (now minus uptime) moves with every step. What does prove
it: /run is a tmpfs made anew at every boot, and every runtime leaves its state there as it
starts, before it can set up a pod. The first run of a boot that finds no runtime has started
yet (runtime.liveness.started_this_boot) records each file of the CNI state it will act on:
name, inode, size, mtime and ctime, per directory, with the directory's own identity. Every
file in that record was there before any runtime of this boot could write one. Later runs of
the same boot act only on files in the record and unchanged since; a boot without a record (the
unit did not run before the runtime) acts on nothing.

The record lies in ROOT/run/cni-reaper/pre-runtime/<boot id>, written by a real run only
(a dry run keeps what it would record in memory), before that run changes anything.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import stat
import struct
from array import array
from collections.abc import Callable

from cni_reaper import failpoint, new_file
from cni_reaper.boot import BootContext, FirstReading, Written, WrittenVerdict, iso
from cni_reaper.evidence import time_read
from cni_reaper.filestat import FileStat
from cni_reaper.pool import dotted_quad_number
from cni_reaper.record import Record
from cni_reaper.trust import untrusted
from cni_reaper.unopened import DIR_FLAGS, NotRegularFile, open_regular

RECORD_DIR = "cni-reaper/pre-runtime"  # under ROOT/run
_MAGIC = b"cni-reaper pre-runtime record 1"
MAX_RECORD_BYTES = 256 << 20  # 100,000 files make about 15 MB

RECORD_WRITTEN = failpoint.declare("pre-runtime.record-written")


def identity(file: FileStat) -> bytes:
    """A file as the record holds it, enough to tell that it is the same file, unchanged:
    inode, size, mtime and ctime (ns), in decimal, as the record file writes them (in memory,
    FileIdentities keeps the numbers)."""
    return b"%d %d %d %d" % (file.inode, file.size, file.mtime_ns, file.ctime_ns)


Numbers = tuple[int, int, int, int]  # inode, size, mtime and ctime (ns)


class FileIdentities:
    """name -> a file's numbers as a record holds them, in a few bytes a file: the record of
    a host-local store of 100,000 reservations, as a dict of names and identity() bytes, was
    about 18 MB. A name that is a dotted quad (pool.is_dotted_quad, one spelling per address:
    host-local's IPv4 reservations) is kept as its number in a sorted array, its numbers
    packed beside it; any other name, or numbers that do not pack, in a dict."""

    _PACKED = struct.Struct("=QQqq")

    def __init__(self) -> None:
        self._keys = array("I")
        self._packed = bytearray()
        self._sorted = True
        self._others: dict[str, Numbers] = {}

    def set(self, name: str, numbers: Numbers) -> None:
        key = dotted_quad_number(name)
        if key is not None:
            try:
                packed = self._PACKED.pack(*numbers)
            except struct.error:
                pass  # out of 64 bits: kept as they are
            else:
                self._others.pop(name, None)
                if self._keys and key <= self._keys[-1]:
                    self._sorted = False
                self._keys.append(key)
                self._packed += packed
                return
            self._drop(key)
        self._others[name] = numbers

    def get(self, name: str) -> Numbers | None:
        key = dotted_quad_number(name)
        found = self._others.get(name)
        if key is None or found is not None:
            return found
        index = self._index(key)
        if index is None:
            return None
        unpacked: Numbers = self._PACKED.unpack_from(self._packed, index * self._PACKED.size)
        return unpacked

    def __len__(self) -> int:
        if not self._sorted:
            self._sort()  # a name set twice is one file
        return len(self._keys) + len(self._others)

    def _index(self, key: int) -> int | None:
        if not self._sorted:
            self._sort()
        keys = self._keys
        index = bisect.bisect_left(keys, key)
        return index if index < len(keys) and keys[index] == key else None

    def _drop(self, key: int) -> None:
        """A name set again (a record that names a file twice: the last one holds, as a dict
        would have it) that no longer packs: its packed numbers go."""
        index = self._index(key)
        if index is not None:
            del self._keys[index]
            size = self._PACKED.size
            del self._packed[index * size : (index + 1) * size]

    def _sort(self) -> None:
        """By key; of a key set more than once, the last one set."""
        keys, packed, size = self._keys, self._packed, self._PACKED.size
        order = sorted(range(len(keys)), key=keys.__getitem__)  # stable: the last one last
        new_keys, new_packed = array("I"), bytearray()
        for position, index in enumerate(order):
            if position + 1 < len(order) and keys[order[position + 1]] == keys[index]:
                continue
            new_keys.append(keys[index])
            new_packed += packed[index * size : (index + 1) * size]
        self._keys, self._packed, self._sorted = new_keys, new_packed, True


class DirRecord(Record):
    device: int
    inode: int
    files: FileIdentities


class PreRuntimeRecord(Record):
    boot_id: str
    taken_at: float  # by the clock of the run that took it; for people, never for a verdict
    first: FirstReading  # how the boot's start read then, for the report of later runs
    dirs: dict[str, DirRecord]  # by the directory's path


class Proof:
    """What decides, for this run, whether a file was written before any runtime of this boot.

    One of three: a record an earlier run of this boot took (`loaded`), the record this run
    takes (`taking`: every file it finds, pending a last look that no runtime started meanwhile),
    or none (`missing`: nothing is proven, nothing is acted on). A record being taken is
    written out as the files are judged, not kept (a real run; a dry run keeps nothing): only
    the dirs judged after it is saved, the host-local stores, are also kept in memory."""

    def __init__(
        self,
        boot_id: str,
        record: PreRuntimeRecord | None,
        taking: bool,
        why_missing: str | None,
        writer: _RecordWriter | None = None,
    ) -> None:
        self.boot_id = boot_id
        self.record = record
        self.taking = taking
        self.why_missing = why_missing
        self._writer = writer
        self._dir_ids: dict[str, tuple[int, int]] = {}  # path -> (dev, ino) now
        # The dirs given to record_dir(), which the record holds; a dry run past the point
        # where a real run keeps its record (sealed) judges no other by the taking rule.
        self._recordable: set[str] = set()
        self._sealed = False

    @classmethod
    def loaded(cls, record: PreRuntimeRecord) -> Proof:
        return cls(record.boot_id, record, False, None)

    @classmethod
    def taken_now(
        cls, boot_id: str, now: float, first: FirstReading, run_dir: str | None = None
    ) -> Proof:
        """This run takes the record; run_dir: where to keep it (None: a dry run keeps none)."""
        record = PreRuntimeRecord(boot_id, now, first, {})
        writer = _RecordWriter(run_dir, record) if run_dir is not None else None
        return cls(boot_id, record, True, None, writer)

    @classmethod
    def missing(cls, boot_id: str, why: str) -> Proof:
        return cls(boot_id, None, False, why)

    @property
    def summary(self) -> str:
        """One sentence for the report's boot section."""
        if self.record is None:
            return f"no pre-runtime record: {self.why_missing}"
        when = iso(self.record.taken_at)
        if self.taking and self._writer is None:
            return (
                f"pre-runtime record taken by this dry run ({when}), and not kept: a real run "
                "before the runtime starts must take it for any run of this boot to repair"
            )
        if self.taking:
            return f"pre-runtime record taken by this run ({when}): no runtime had started"
        return f"pre-runtime record taken at {when} by this boot's first run"

    def to_json(self) -> dict[str, object]:
        return {
            "state": "taking" if self.taking else "loaded" if self.record else "missing",
            "taken_at": iso(self.record.taken_at) if self.record else None,
            "why_missing": self.why_missing,
        }

    def open_dir(self, path: str, st: os.stat_result) -> None:
        """The directory about to be judged, as it is now (a recreated dir holds no old file)."""
        self._dir_ids[path] = (st.st_dev, st.st_ino)
        if self.taking and self._writer is not None:
            self._writer.add(b"D %d %d %s\0" % (st.st_dev, st.st_ino, os.fsencode(path)))

    def written(
        self, directory: str, name: str, file: FileStat, clocks: BootContext
    ) -> WrittenVerdict:
        """The verdict for a file of directory (opened with open_dir first): the record's;
        what the clocks say stays in the evidence, for people."""
        recorded = not self._sealed or directory in self._recordable
        if self.taking and directory in self._dir_ids and recorded:
            if self._writer is not None:
                self._writer.add(b"%s %s\0" % (identity(file), os.fsencode(name)))
            return WrittenVerdict.by_clocks(
                Written.PREVIOUS_BOOT, _FOUND, clocks, file.mtime, file.ctime
            )
        if self.record is None:
            why = f"{no_record(self.why_missing)}; clocks: "
            return WrittenVerdict.by_clocks(Written.UNKNOWN, why, clocks, file.mtime, file.ctime)
        kept = self.record.dirs.get(directory)
        if self.taking or kept is None or (kept.device, kept.inode) != self._dir_ids.get(directory):
            # (taking here: a dry run past its seal, judging a dir its record would not hold)
            why = "its directory is not the one in this boot's pre-runtime record"
        elif (seen := kept.files.get(name)) is None:
            why = "not in this boot's pre-runtime record: written since a runtime could start"
        elif seen != (file.inode, file.size, file.mtime_ns, file.ctime_ns):
            why = "changed since this boot's pre-runtime record was taken"
        else:
            return WrittenVerdict.by_clocks(
                Written.PREVIOUS_BOOT, _UNCHANGED, clocks, file.mtime, file.ctime
            )
        # Written in this boot, whatever the clocks say, and by no earlier boot.
        return WrittenVerdict(
            Written.CURRENT_BOOT, f"{why}; clocks: {clocks.clocks_say(file.mtime, file.ctime)[0]}"
        )

    def held_before(
        self, directory: str, dir_st: os.stat_result, name: str, st: os.stat_result
    ) -> str | None:
        """Why the file st, found in directory under another name (a move cut short hid it:
        leaving.py), may not be taken for the file its record holds as name: None when it may,
        as every file may while this run takes the record. Inode, size and mtime: the rename
        that hid it kept them, and set its ctime."""
        if self.taking:
            return None
        if self.record is None:
            return no_record(self.why_missing)
        kept = self.record.dirs.get(directory)
        if kept is None or (kept.device, kept.inode) != (dir_st.st_dev, dir_st.st_ino):
            return "its directory is not the one in this boot's pre-runtime record"
        seen = kept.files.get(name)
        if seen is None or seen[:3] != (st.st_ino, st.st_size, st.st_mtime_ns):
            return f"not the file this boot's pre-runtime record holds as {name}"
        return None

    @property
    def keeps_record(self) -> bool:
        """Whether the record being taken is kept: a dry run keeps none, and, never saving
        it, judges every file it finds by the `taking` rule to its end, never against it."""
        return self.taking and self._writer is not None

    def recordable(self, directory: str) -> None:
        """directory is one the record holds (record_dir), if this run keeps it."""
        self._recordable.add(directory)

    def keep(self, directory: str, dir_st: os.stat_result, name: str, st: os.stat_result) -> None:
        """Record a file of a dir judged only after the record is saved: written out like
        any, and kept in memory for those later verdicts."""
        assert self.taking and self.record is not None
        kept = self.record.dirs.get(directory)
        if kept is None:
            files = FileIdentities()
            kept = self.record.dirs[directory] = DirRecord(dir_st.st_dev, dir_st.st_ino, files)
        numbers = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        kept.files.set(name, numbers)
        if self._writer is not None:
            self._writer.add(b"%d %d %d %d %s\0" % (*numbers, os.fsencode(name)))

    def abandon(self, why: str) -> None:
        """Nothing this run found is proven after all."""
        if self._writer is not None:
            self._writer.abandon()
        self.record, self.taking, self.why_missing = None, False, why

    def seal(self) -> None:
        """A dry run at the point where a real run keeps the record it took: from then on, a
        dir record_dir() was not given is judged as that run judges it, not in the record (a
        store only a DEL's check reads: a NetworkAttachmentDefinition's that Multus's
        scratch file names), so that the dry run says what the real run will do."""
        self._sealed = self.taking

    def save(self) -> None:
        """The record this run took, renamed into place; from then on, files are judged
        against what it kept, like any later run's. Raises why it could not be kept."""
        self.taking = False
        if self._writer is not None:
            self._writer.commit()


# How a file's evidence begins for every file of a run: the text report says these once.
FOUND = "found by this run before any runtime started"
_FOUND = FOUND + "; clocks: "
_UNCHANGED = "unchanged since this boot's pre-runtime record; clocks: "


def no_record(why_missing: str | None) -> str:
    return f"no record of this boot's CNI state from before a runtime started ({why_missing})"


class _RecordWriter:
    """The record being taken, written to a temp file in the record dir as files are judged,
    renamed into place by commit(). A record that cannot be written is no record: later runs
    of the boot act on nothing, and commit() raises why."""

    def __init__(self, run_dir: str, record: PreRuntimeRecord) -> None:
        self.directory = os.path.join(run_dir, RECORD_DIR)
        self._name = record.boot_id
        self._temp = f".{record.boot_id}.tmp"
        self._dir_fd: int | None = None
        self._fd: int | None = None
        self._problem: OSError | None = None
        numbers = (record.taken_at, *record.first)
        shown = b" ".join(b"-" if n is None else repr(n).encode() for n in numbers)
        self._buffer = bytearray(b"%s %s %s\0" % (_MAGIC, record.boot_id.encode(), shown))

    def add(self, data: bytes) -> None:
        self._buffer += data
        if len(self._buffer) >= 1 << 20:
            self._flush()

    def _flush(self) -> None:
        if self._problem is None:
            try:
                if self._fd is None:
                    self._open()
                assert self._fd is not None
                with memoryview(self._buffer) as whole:  # released before the buffer is cleared
                    view = whole
                    while view:
                        view = view[os.write(self._fd, view) :]
                    view.release()
            except OSError as e:
                self._problem = e
                self.abandon()
        self._buffer.clear()

    def _open(self) -> None:
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        self._dir_fd = os.open(self.directory, DIR_FLAGS)
        problem = untrusted(os.fstat(self._dir_fd))
        if problem:
            raise PermissionError(f"{self.directory} {problem}: no record kept there")
        self._fd = new_file.create(self._temp, self._dir_fd)

    def commit(self) -> None:
        self._flush()
        if self._problem is not None:
            raise self._problem
        assert self._fd is not None and self._dir_fd is not None
        os.fsync(self._fd)
        os.close(self._fd)
        self._fd = None
        os.rename(self._temp, self._name, src_dir_fd=self._dir_fd, dst_dir_fd=self._dir_fd)
        os.fsync(self._dir_fd)
        os.close(self._dir_fd)
        self._dir_fd = None

    def abandon(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._dir_fd is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._temp, dir_fd=self._dir_fd)
            os.close(self._dir_fd)
            self._dir_fd = None


def establish(
    boot_id: str,
    now: float,
    first: FirstReading | None,
    loaded: PreRuntimeRecord | None,
    problem: str | None,
    runtime_started: Callable[[], list[str]],
    run_dir: str | None = None,
) -> Proof:
    """The proof this run works with: this boot's record if an earlier run took it (loaded,
    see load()), else a new one if no runtime has started yet (kept under run_dir; a dry run,
    with none, keeps nothing), else none."""
    if not boot_id:
        return Proof.missing(boot_id, "the boot id cannot be read, so this boot has no name")
    if loaded is not None:
        return Proof.loaded(loaded)
    evidence = runtime_started()
    if evidence:
        more = f"; and {len(evidence) - 3} more" if evidence[3:] else ""
        why = f"a runtime has started in this boot ({'; '.join(evidence[:3])}{more})"
        if problem:
            why = f"{problem}, and {why}"
        return Proof.missing(boot_id, why)
    return Proof.taken_now(boot_id, now, first or FirstReading(None, None), run_dir)


def confirm(proof: Proof, runtime_started: Callable[[], list[str]]) -> str | None:
    """The last look before a run that is taking the record acts on it: why not, if a runtime
    started while the state was read (then nothing this run found is proven)."""
    if not proof.taking:
        return None
    evidence = runtime_started()
    if evidence:
        proof.abandon(f"a runtime started while this run read the CNI state ({evidence[0]})")
        return proof.why_missing
    return None


def record_dir(proof: Proof, path: str) -> None:
    """Add a directory's files to the record being taken (a host-local store, whose files are
    judged after the DELs have run, but must be recorded before). Not by a dry run, whose
    verdicts never read it (Proof.keeps_record): 100,000 reservations made it 30 MB."""
    proof.recordable(path)
    if not proof.keeps_record:
        return
    try:
        fd = os.open(path, DIR_FLAGS)
    except (OSError, ValueError):  # ValueError: a NUL in the path, which names no dir
        return
    try:
        dir_st = os.fstat(fd)
        proof.open_dir(path, dir_st)
        for name in os.listdir(fd):
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                proof.keep(path, dir_st, name, st)
    finally:
        os.close(fd)


def save(proof: Proof) -> None:
    """Keep the record this run took, before the run changes anything; raises why not (then
    later runs of this boot act on nothing; this run, having seen no runtime, goes on)."""
    if proof.taking:
        proof.save()
        failpoint.hit(RECORD_WRITTEN)


def load(run_dir: str, boot_id: str) -> tuple[PreRuntimeRecord | None, str | None]:
    """This boot's record, or why there is none that can be used (None when simply absent)."""
    directory = os.path.join(run_dir, RECORD_DIR)
    try:
        dir_fd = os.open(directory, DIR_FLAGS)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, f"cannot open {directory}: {e.strerror}"
    try:
        problem = untrusted(os.fstat(dir_fd))
        if problem:
            return None, f"{directory} {problem}, so its record is not trusted"
        try:
            # Never blocking on a FIFO put in its place, never a directory read as a file.
            fd = open_regular(boot_id, dir_fd)
        except FileNotFoundError:
            return None, None
        except NotRegularFile:
            return None, f"this boot's record in {directory} is not a file"
        except OSError as e:
            return None, f"cannot read this boot's record in {directory}: {e.strerror}"
        try:
            st = os.fstat(fd)
            problem = untrusted(st)
            if problem:
                return None, f"this boot's record in {directory} {problem}"
            with os.fdopen(os.dup(fd), "rb") as f:
                data = f.read(MAX_RECORD_BYTES + 1)
        finally:
            os.close(fd)
    finally:
        os.close(dir_fd)
    record = _decode(data, boot_id)
    if record is None:
        return None, f"this boot's record in {directory} cannot be read: it is damaged"
    return record, None


def _decode(data: bytes, boot_id: str) -> PreRuntimeRecord | None:
    if len(data) > MAX_RECORD_BYTES or not data.endswith(b"\0"):
        return None
    tokens = data[:-1].split(b"\0")
    header = tokens[0].rsplit(b" ", 4)
    if len(header) != 5 or header[0] != _MAGIC or header[1] != boot_id.encode():
        return None
    taken_at = time_read(header[2])
    readings = [None if n == b"-" else time_read(n) for n in header[3:]]
    if taken_at is None or any(t is None and n != b"-" for t, n in zip(readings, header[3:])):
        return None  # NaN, inf or a number past the years a report shows: no time it wrote
    first = FirstReading(*readings)
    try:
        dirs: dict[str, DirRecord] = {}
        files: FileIdentities | None = None
        for token in tokens[1:]:
            if token.startswith(b"D "):
                _, device, inode, path = token.split(b" ", 3)
                files = FileIdentities()
                dirs[os.fsdecode(path)] = DirRecord(int(device), int(inode), files)
            elif files is not None:
                inode, size, mtime_ns, ctime_ns, name = token.split(b" ", 4)
                # Read as numbers: the same as this file's now exactly when they are equal,
                # however a record spelled them.
                numbers = (int(inode), int(size), int(mtime_ns), int(ctime_ns))
                files.set(os.fsdecode(name), numbers)
            else:
                return None
    except ValueError:
        return None
    return PreRuntimeRecord(boot_id, taken_at, first, dirs)
