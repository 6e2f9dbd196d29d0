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

import os
import stat
from collections.abc import Callable, Iterable
from typing import NamedTuple

from cni_reaper import failpoint
from cni_reaper.boot import FirstReading, Written, WrittenVerdict, iso
from cni_reaper.filestat import FileStat
from cni_reaper.trust import untrusted

RECORD_DIR = "cni-reaper/pre-runtime"  # under ROOT/run
_MAGIC = b"cni-reaper pre-runtime record 1"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
MAX_RECORD_BYTES = 256 << 20  # 100,000 files make about 15 MB

RECORD_WRITTEN = failpoint.declare("pre-runtime.record-written")


class Seen(NamedTuple):
    """A file as the record holds it: enough to tell that it is the same file, unchanged."""

    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, file: FileStat) -> Seen:
        return cls(file.inode, file.size, file.mtime_ns, file.ctime_ns)


class DirRecord(NamedTuple):
    device: int
    inode: int
    files: dict[str, Seen]


class PreRuntimeRecord(NamedTuple):
    boot_id: str
    taken_at: float  # by the clock of the run that took it; for people, never for a verdict
    first: FirstReading  # how the boot's start read then, for the report of later runs
    dirs: dict[str, DirRecord]  # by the directory's path


class Proof:
    """What decides, for this run, whether a file was written before any runtime of this boot.

    One of three: a record an earlier run of this boot took (`loaded`), the record this run
    takes (`taking`: every file it finds, pending a last look that no runtime started meanwhile),
    or none (`missing`: nothing is proven, nothing is acted on)."""

    def __init__(
        self,
        boot_id: str,
        record: PreRuntimeRecord | None,
        taking: bool,
        why_missing: str | None,
        now: float,
    ) -> None:
        self.boot_id = boot_id
        self.record = record
        self.taking = taking
        self.why_missing = why_missing
        self._now = now
        self._dir_ids: dict[str, tuple[int, int] | None] = {}  # path -> (dev, ino) now

    @classmethod
    def loaded(cls, record: PreRuntimeRecord) -> Proof:
        return cls(record.boot_id, record, False, None, record.taken_at)

    @classmethod
    def taken_now(cls, boot_id: str, now: float, first: FirstReading) -> Proof:
        return cls(boot_id, PreRuntimeRecord(boot_id, now, first, {}), True, None, now)

    @classmethod
    def missing(cls, boot_id: str, why: str) -> Proof:
        return cls(boot_id, None, False, why, 0.0)

    @property
    def summary(self) -> str:
        """One sentence for the report's boot section."""
        if self.record is None:
            return f"no pre-runtime record: {self.why_missing}"
        when = iso(self.record.taken_at)
        if self.taking:
            return f"pre-runtime record taken by this run ({when}): no runtime had started"
        return f"pre-runtime record taken at {when} by this boot's first run"

    def to_json(self) -> dict[str, object]:
        return {
            "state": "taking" if self.taking else "loaded" if self.record else "missing",
            "taken_at": iso(self.record.taken_at) if self.record else None,
            "files": sum(len(d.files) for d in self.record.dirs.values()) if self.record else 0,
            "why_missing": self.why_missing,
        }

    def open_dir(self, path: str, st: os.stat_result) -> None:
        """The directory about to be judged, as it is now (a recreated dir holds no old file)."""
        self._dir_ids[path] = (st.st_dev, st.st_ino)
        if self.taking and self.record is not None:
            self.record.dirs.setdefault(path, DirRecord(st.st_dev, st.st_ino, {}))

    def written(
        self, directory: str, name: str, file: FileStat, by_clock: WrittenVerdict
    ) -> WrittenVerdict:
        """The verdict for a file of directory (opened with open_dir first): the record's;
        what the clocks say stays in the evidence, for people."""
        clocks = f"clocks: {by_clock.evidence}"
        if self.record is None:
            return WrittenVerdict(
                Written.UNKNOWN,
                f"no record of this boot's CNI state from before a runtime "
                f"started ({self.why_missing}); {clocks}",
                by_clock.writing_boot,
                by_clock.seconds_before_last_record,
            )
        kept = self.record.dirs.get(directory)
        if self.taking and kept is not None:
            kept.files[name] = Seen.of(file)
            return _previous(by_clock, f"found by this run before any runtime started; {clocks}")
        if kept is None or (kept.device, kept.inode) != self._dir_ids.get(directory):
            why = "its directory is not the one in this boot's pre-runtime record"
            return WrittenVerdict(Written.CURRENT_BOOT, f"{why}; {clocks}")
        seen = kept.files.get(name)
        if seen is None:
            why = "not in this boot's pre-runtime record: written since a runtime could start"
            return WrittenVerdict(Written.CURRENT_BOOT, f"{why}; {clocks}")
        if seen != Seen.of(file):
            why = "changed since this boot's pre-runtime record was taken"
            return WrittenVerdict(Written.CURRENT_BOOT, f"{why}; {clocks}")
        return _previous(by_clock, f"unchanged since this boot's pre-runtime record; {clocks}")


def _previous(by_clock: WrittenVerdict, evidence: str) -> WrittenVerdict:
    return WrittenVerdict(
        Written.PREVIOUS_BOOT, evidence, by_clock.writing_boot, by_clock.seconds_before_last_record
    )


def establish(
    boot_id: str,
    now: float,
    first: FirstReading | None,
    loaded: PreRuntimeRecord | None,
    problem: str | None,
    runtime_started: Callable[[], list[str]],
) -> Proof:
    """The proof this run works with: this boot's record if an earlier run took it (loaded,
    see load()), else a new one if no runtime has started yet, else none."""
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
    return Proof.taken_now(boot_id, now, first or FirstReading(None, None))


def confirm(proof: Proof, runtime_started: Callable[[], list[str]]) -> str | None:
    """The last look before a run that is taking the record acts on it: why not, if a runtime
    started while the state was read (then nothing this run found is proven)."""
    if not proof.taking:
        return None
    evidence = runtime_started()
    if evidence:
        proof.record = None
        proof.taking = False
        proof.why_missing = f"a runtime started while this run read the CNI state ({evidence[0]})"
        return proof.why_missing
    return None


def record_dir(proof: Proof, path: str) -> None:
    """Add a directory's files to the record being taken (a host-local store, whose files are
    judged after the DELs have run, but must be recorded before)."""
    if not proof.taking:
        return
    try:
        fd = os.open(path, _DIR_FLAGS)
    except OSError:
        return
    try:
        dir_st = os.fstat(fd)
        proof.open_dir(path, dir_st)
        assert proof.record is not None
        files = proof.record.dirs[path].files
        for name in os.listdir(fd):
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                files[name] = Seen(st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    finally:
        os.close(fd)


def save(run_dir: str, proof: Proof) -> None:
    """Write the record this run took, before the run changes anything."""
    record = proof.record
    if not proof.taking or record is None:
        return
    directory = os.path.join(run_dir, RECORD_DIR)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    dir_fd = os.open(directory, _DIR_FLAGS)
    try:
        problem = untrusted(os.fstat(dir_fd))
        if problem:
            raise PermissionError(f"{directory} {problem}: no record kept there")
        temp = f".{record.boot_id}.tmp"
        fd = os.open(
            temp,
            os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC,
            0o600,
            dir_fd=dir_fd,
        )
        with os.fdopen(fd, "wb") as out:
            out.write(b"".join(_encode(record)))
            out.flush()
            os.fsync(out.fileno())
        os.rename(temp, record.boot_id, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    proof.taking = False  # from now on, later files are judged against it like any run's
    failpoint.hit(RECORD_WRITTEN)


def _encode(record: PreRuntimeRecord) -> Iterable[bytes]:
    """NUL-separated, as file names hold any byte but NUL: a header, then per directory a
    line naming it and one per file."""
    numbers = (record.taken_at, *record.first)
    shown = b" ".join(b"-" if n is None else repr(n).encode() for n in numbers)
    yield b"%s %s %s\0" % (_MAGIC, record.boot_id.encode(), shown)
    for path, kept in record.dirs.items():
        yield b"D %d %d %s\0" % (kept.device, kept.inode, os.fsencode(path))
        for name, seen in kept.files.items():
            yield b"%d %d %d %d %s\0" % (*seen, os.fsencode(name))


def load(run_dir: str, boot_id: str) -> tuple[PreRuntimeRecord | None, str | None]:
    """This boot's record, or why there is none that can be used (None when simply absent)."""
    directory = os.path.join(run_dir, RECORD_DIR)
    try:
        dir_fd = os.open(directory, _DIR_FLAGS)
    except FileNotFoundError:
        return None, None
    except OSError as e:
        return None, f"cannot open {directory}: {e.strerror}"
    try:
        problem = untrusted(os.fstat(dir_fd))
        if problem:
            return None, f"{directory} {problem}, so its record is not trusted"
        try:
            fd = os.open(boot_id, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        except FileNotFoundError:
            return None, None
        except OSError as e:
            return None, f"cannot read this boot's record in {directory}: {e.strerror}"
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            problem = untrusted(st)
            if problem or not stat.S_ISREG(st.st_mode):
                return None, f"this boot's record in {directory} {problem or 'is not a file'}"
            data = f.read(MAX_RECORD_BYTES + 1)
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
    try:
        taken_at = float(header[2])
        first = FirstReading(*(None if n == b"-" else float(n) for n in header[3:]))
        dirs: dict[str, DirRecord] = {}
        files: dict[str, Seen] | None = None
        for token in tokens[1:]:
            if token.startswith(b"D "):
                _, device, inode, path = token.split(b" ", 3)
                files = {}
                dirs[os.fsdecode(path)] = DirRecord(int(device), int(inode), files)
            elif files is not None:
                inode, size, mtime_ns, ctime_ns, name = token.split(b" ", 4)
                files[os.fsdecode(name)] = Seen(int(inode), int(size), int(mtime_ns), int(ctime_ns))
            else:
                return None
    except ValueError:
        return None
    return PreRuntimeRecord(boot_id, taken_at, first, dirs)
