"""Which boot wrote a file: the boot list from wtmp or wtmpdb, this boot's start, and the verdict
per file.

Pitfalls this guards against are in shared/reference/boot-records.md sections 2, 4 and 5.
"""

from __future__ import annotations

import functools
import math
import os
import re
import time
from collections.abc import Sequence

from cni_reaper.choice import Choice
from cni_reaper.evidence import journal as journal_witness
from cni_reaper.evidence import previous_boot, shutdown_marker, wtmp, wtmpdb
from cni_reaper.evidence.fs_crash import FsCrashRecord
from cni_reaper.evidence.fs_crash import Verdict as FsVerdict
from cni_reaper.evidence.journal import JournalWitness
from cni_reaper.evidence.previous_boot import Account, PreviousBootVerdict
from cni_reaper.evidence.shutdown_marker import ShutdownEvidence, ShutdownState
from cni_reaper.paths import NodePaths
from cni_reaper.record import Record
from cni_reaper.unopened import NotRegularFile, open_regular

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

    Clock = Callable[[], float]

# btime has whole seconds and the kernel stamps files with a coarse clock: closer than this to
# the boundary, a file's boot cannot be told.
DEFAULT_MARGIN = 2.0
# The boot record is PID 1's start: after btime by kernel and initrd time, which on a slow
# machine can take minutes. A boot record further after btime is not this boot's.
MAX_USERSPACE_START_DELAY = 900.0


class Written(str, Choice):
    PREVIOUS_BOOT = "previous-boot"
    CURRENT_BOOT = "current-boot"
    UNKNOWN = "unknown"


class BootEnd(str, Choice):
    CLEAN = "clean"
    CRASHED = "crashed"
    RUNNING = "running"


class Boot(Record):
    start: float
    kernel: str
    last_record: float  # the newest record of any kind while this boot ran
    shutdown: float | None  # time of its shutdown record, if it wrote one
    end: BootEnd
    source: str = "wtmp"  # the witness that named this boot: "wtmp" or "wtmpdb"

    def to_json(self) -> dict[str, object]:
        return {
            "start": iso(self.start),
            "kernel": self.kernel,
            "end": self.end.value,
            "shutdown": iso(self.shutdown) if self.shutdown is not None else None,
            "last_record": iso(self.last_record),
            "source": self.source,
        }


class WrittenVerdict:
    """When a file was written (`written`), and what says so: `evidence`, for people, and the
    earlier boot that wrote it (`writing_boot`, `seconds_before_last_record`), the three
    together as said(). What the clocks say of a file is put into words when first asked: a
    boot's run keeps nearly every entry and says nothing of it, and over 100,000 entries the
    words were a sixth of a dry run."""

    __slots__ = ("_boot", "_ctime", "_mtime", "_reason", "_said", "written")
    written: Written
    # Until said() is first asked: the reason said first, then what the clocks say of these.
    _reason: str
    _boot: BootContext
    _mtime: float
    _ctime: float

    def __init__(
        self,
        written: Written,
        evidence: str,
        writing_boot: Boot | None = None,
        seconds_before_last_record: float | None = None,
    ) -> None:
        self.written = written
        self._said: tuple[str, Boot | None, float | None] | None = (
            evidence,
            writing_boot,
            seconds_before_last_record,
        )

    @classmethod
    def by_clocks(
        cls, written: Written, reason: str, boot: BootContext, mtime: float, ctime: float
    ) -> WrittenVerdict:
        """written, for reason, then what the clocks say of mtime and ctime against boot:
        put into words when asked."""
        verdict = cls.__new__(cls)
        verdict.written, verdict._said, verdict._reason = written, None, reason
        verdict._boot, verdict._mtime, verdict._ctime = boot, mtime, ctime
        return verdict

    def restated(self, written: Written, reason: str) -> WrittenVerdict:
        """This verdict's evidence and writing boot, written as reason says, reason said
        first."""
        said = self._said
        if said is None:
            return WrittenVerdict.by_clocks(
                written, reason + self._reason, self._boot, self._mtime, self._ctime
            )
        evidence, boot, seconds = said
        return WrittenVerdict(written, reason + evidence, boot, seconds)

    def said(self) -> tuple[str, Boot | None, float | None]:
        """(evidence, writing_boot, seconds_before_last_record)."""
        said = self._said
        if said is None:
            words, boot, seconds = self._boot.clocks_say(self._mtime, self._ctime)
            said = self._said = (self._reason + words, boot, seconds)
        return said

    @property
    def evidence(self) -> str:
        return self.said()[0]

    @property
    def writing_boot(self) -> Boot | None:
        return self.said()[1]

    @property
    def seconds_before_last_record(self) -> float | None:
        return self.said()[2]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WrittenVerdict):
            return NotImplemented
        return self.written is other.written and self.said() == other.said()

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"WrittenVerdict({self.written.value!r}, {self.evidence!r})"


# What the clocks say of a file against this boot's start (BootContext._case), each case in
# words of its own.
_NO_START, _CLOCK_BEHIND, _AHEAD_OF_CLOCK, _BEFORE, _AFTER, _ON_BOUNDARY = range(6)
_WRITTEN = (
    Written.UNKNOWN,
    Written.UNKNOWN,
    Written.UNKNOWN,
    Written.PREVIOUS_BOOT,
    Written.CURRENT_BOOT,
    Written.UNKNOWN,
)


class BootContext(Record):
    boot_id: str
    now: float
    btime: float | None
    current_start: float | None
    current_start_source: str
    previous_boots: tuple[Boot, ...]  # oldest first
    margin: float = DEFAULT_MARGIN
    warnings: tuple[str, ...] = ()
    shutdown: ShutdownEvidence | None = None
    first: FirstReading | None = None  # what a first run of this boot keeps of this reading
    # The boot records read, each "wtmp", "wtmpdb" or "journal" with what it said; the previous
    # boots come from boots_source. The journal only describes: it names no previous boot here.
    witnesses: tuple[tuple[str, str], ...] = ()
    boots_source: str = "wtmp"
    journal: JournalWitness | None = None  # the journal's boot list, when it was consulted
    # What wtmp and wtmpdb each say of the previous boot (the boot list is boots_source's).
    records: tuple[Account, ...] = ()
    file_system: FsCrashRecord | None = None  # the results dir's file system's crash record

    @property
    def previous_boot(self) -> Boot | None:
        return self.previous_boots[-1] if self.previous_boots else None

    @property
    def previous_boot_verdict(self) -> PreviousBootVerdict:
        """Every witness's account of how the previous boot ended, and the verdict
        (evidence/previous_boot.py says which decides)."""
        return previous_boot.combine(
            [
                self._marker_account(),
                _file_system_account(self.file_system),
                *self.records,
                _journal_account(self.journal, dict(self.witnesses).get("journal", "not read")),
            ]
        )

    @property
    def previous_boot_crashed(self) -> bool | None:
        return self.previous_boot_verdict.crashed

    def _marker_account(self) -> Account:
        name = "shutdown marker"
        evidence = self.shutdown
        if evidence is None:
            return Account(name, False, previous_boot.UNKNOWN, "not read: no boot id")
        if evidence.state is ShutdownState.UNKNOWN:
            return Account(name, True, previous_boot.UNKNOWN, evidence.detail)
        prev = self.previous_boot
        if evidence.time is None or (prev is not None and evidence.time < prev.start - self.margin):
            return Account(
                name,
                True,
                previous_boot.UNKNOWN,
                f"{evidence.state.value} for boot {evidence.boot_id}, older than the previous "
                f"boot in {self.boots_source}",
            )
        ended = (
            previous_boot.CRASHED
            if evidence.state is ShutdownState.UNCLEAN
            else previous_boot.CLEAN
        )
        return Account(name, True, ended, f"{evidence.state.value} for boot {evidence.boot_id}")

    @property
    def clock_trusted(self) -> bool:
        return self.current_start is not None and self.now + self.margin >= self.current_start

    def to_json(self) -> dict[str, object]:
        return {
            "boot_id": self.boot_id,
            "now": iso(self.now),
            "btime": iso(self.btime) if self.btime is not None else None,
            "current_boot_start": iso(self.current_start) if self.current_start else None,
            "current_boot_start_source": self.current_start_source,
            "previous_boot_crashed": self.previous_boot_crashed,
            "previous_boots": [b.to_json() for b in self.previous_boots],
            "shutdown_marker": self.shutdown.to_json() if self.shutdown else None,
            "previous_boots_source": self.boots_source,
            "boot_records": [{"source": s, "says": says} for s, says in self.witnesses],
            "journal": self.journal.to_json() if self.journal else None,
            "previous_boot": self.previous_boot_verdict.to_json(),
            "warnings": list(self.warnings),
        }

    def classify(self, mtime: float, ctime: float) -> WrittenVerdict:
        """previous-boot only when both times are clearly before this boot began.

        ctime is preferred as the proof because userspace cannot set it; mtime can be carried
        over by tar, cp -p or an image build and only ever weakens the verdict.
        """
        written = _WRITTEN[self._case(mtime, ctime)]
        return WrittenVerdict.by_clocks(written, "", self, mtime, ctime)

    def _case(self, mtime: float, ctime: float) -> int:
        start, now, margin = self.current_start, self.now, self.margin
        if start is None:
            return _NO_START
        if now + margin < start:  # not clock_trusted
            return _CLOCK_BEHIND
        newest, oldest = (mtime, ctime) if mtime > ctime else (ctime, mtime)
        if newest > now + margin:
            return _AHEAD_OF_CLOCK
        if newest < start - margin:
            return _BEFORE
        if oldest > start + margin:
            return _AFTER
        return _ON_BOUNDARY

    def clocks_say(self, mtime: float, ctime: float) -> tuple[str, Boot | None, float | None]:
        """What classify() says of these times, in words, and the earlier boot that wrote
        the file."""
        case = self._case(mtime, ctime)
        times = f"mtime {iso(mtime)}, ctime {iso(ctime)}"
        start, now, margin = self.current_start, self.now, self.margin
        if case == _NO_START or start is None:
            return f"{times}; this boot's start is not known", None, None
        if case == _CLOCK_BEHIND:
            return (
                f"{times}; the clock ({iso(now)}) is earlier than this boot's start "
                f"({iso(start)}): timestamps cannot be trusted",
                None,
                None,
            )
        if case == _AHEAD_OF_CLOCK:
            return f"{times}; later than the clock ({iso(now)})", None, None
        newest, oldest = (mtime, ctime) if mtime > ctime else (ctime, mtime)
        boundary = boot_began(start, self.current_start_source)
        if case == _BEFORE:
            # round() to an int formats as :.0f would (half to even), without the float
            # formatting, which showed at 100,000 entries.
            return self._previous(ctime, times, f"{round(start - newest)} s before {boundary}")
        if case == _AFTER:
            return f"{times}: {oldest - start:.0f} s after {boundary}", None, None
        return f"{times}: within {margin:.0f} s of, or on both sides of, {boundary}", None, None

    def _previous(
        self, when: float, times: str, before_start: str
    ) -> tuple[str, Boot | None, float | None]:
        writer = None
        for boot in self.previous_boots:
            if boot.start <= when:
                writer = boot
        if writer is None:
            if self.previous_boots:
                tail = f"older than every boot in {self.boots_source}"
            else:
                tail = f"{self.boots_source} names no earlier boot"
            return f"{times}: {before_start}; {tail}", None, None
        before = writer.last_record - when
        relation = f"{round(before)} s before" if before >= 0 else f"{round(-before)} s after"
        return (
            f"{times}: {before_start}; {written_in(writer)}, {relation} that boot's last "
            f"{writer.source} record",
            writer,
            round(before, 3),
        )


def _file_system_account(record: FsCrashRecord | None) -> Account:
    name = "file system"
    if record is None:
        return Account(name, False, previous_boot.UNKNOWN, "not read")
    if not record.consulted:
        return Account(name, False, previous_boot.UNKNOWN, record.detail)
    device = " ".join(x for x in (record.kernel_name, record.fs_type) if x) or record.path
    if record.verdict is FsVerdict.REPLAYED:
        ended, says = previous_boot.CRASHED, f"{device}: replayed at mount ({record.evidence})"
    elif record.verdict is FsVerdict.CLEAN:
        ended, says = previous_boot.CLEAN, f"{device}: mounted without a replay"
    else:
        ended, says = previous_boot.UNKNOWN, f"{device}: {record.detail}"
    return Account(name, True, ended, says)


def _journal_account(journal: JournalWitness | None, says: str) -> Account:
    if journal is None or not journal.consulted:
        return Account("journal", False, previous_boot.UNKNOWN, says)
    crashed = journal.previous_boot_crashed
    ended = {None: previous_boot.UNKNOWN, True: previous_boot.CRASHED, False: previous_boot.CLEAN}
    return Account("journal", True, ended[crashed], journal.says)


def _records_account(name: str, boots: Sequence[Boot], found: bool, start: float | None) -> Account:
    """What one boot record file says of the boot before this one: the newest begun clearly
    before this boot's start (a record within the margin of it is this boot's own)."""
    if not found:
        return Account(name, False, previous_boot.UNKNOWN, "not found")
    earlier = [b for b in boots if start is None or b.start < start - DEFAULT_MARGIN]
    if start is None and earlier and earlier[-1].end is BootEnd.RUNNING:
        earlier = earlier[:-1]  # with no other estimate, the open boot is this one
    if not earlier:
        return Account(name, True, previous_boot.UNKNOWN, "names no earlier boot")
    prev = earlier[-1]
    if prev.end is BootEnd.CLEAN:
        when = iso(prev.shutdown or prev.last_record)
        return Account(
            name, True, previous_boot.CLEAN, f"the boot begun {iso(prev.start)} shut down at {when}"
        )
    return Account(
        name,
        True,
        previous_boot.CRASHED,
        f"the boot begun {iso(prev.start)} has no shutdown record before the next boot",
    )


# Every file's evidence names the same boots: their part of it is made once each, and the text
# report, which says each once, knows it by these.


@functools.lru_cache(maxsize=8)
def boot_began(start: float, source: str) -> str:
    return f"this boot began {iso(start)} ({source})"


@functools.lru_cache(maxsize=64)
def written_in(boot: Boot) -> str:
    if boot.end is BootEnd.CRASHED:
        how = "which crashed (no shutdown record before the next boot)"
    else:
        how = f"which shut down cleanly at {iso(boot.shutdown or boot.last_record)}"
    return f"written in the boot that began {iso(boot.start)}, {how}"


_ISO_BY_SECOND: dict[int, str] = {}


def iso(t: float) -> str:
    """UTC, ISO 8601, to the second. Cached by the second: a report names the same few boot
    times again and again, and files written together share their second."""
    second = math.floor(t)  # the second gmtime() takes: floored, not truncated
    text = _ISO_BY_SECOND.get(second)
    if text is None:
        if len(_ISO_BY_SECOND) >= 4096:
            _ISO_BY_SECOND.clear()
        text = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(second))
        _ISO_BY_SECOND[second] = text
    return text


def boots_from_records(records: Sequence[wtmp.WtmpRecord]) -> list[Boot]:
    """Each boot record opens a boot; it ended cleanly iff a shutdown record precedes the next."""
    boots: list[Boot] = []
    start: wtmp.WtmpRecord | None = None
    last = 0.0
    shutdown: float | None = None

    def close(end: BootEnd) -> None:
        assert start is not None
        boots.append(Boot(start.time, start.host, last, shutdown, end))

    for record in records:
        if record.is_boot:
            if start is not None:
                close(BootEnd.CLEAN if shutdown is not None else BootEnd.CRASHED)
            start, last, shutdown = record, record.time, None
        elif start is not None:
            last = max(last, record.time)
            if record.is_shutdown:
                shutdown = record.time
    if start is not None:
        close(BootEnd.CLEAN if shutdown is not None else BootEnd.RUNNING)
    return boots


def boots_from_wtmpdb(rows: Sequence[wtmpdb.WtmpdbRow]) -> list[Boot]:
    """Each kernel boot row opens a boot; it ended cleanly iff the newest boot row of its
    kernel (its own, or the last soft reboot's: the same kernel, the same boot here) has a
    Logout, which only `wtmpdb shutdown` writes. Rows in insertion order, not by time."""
    boots: list[Boot] = []
    start: wtmpdb.WtmpdbRow | None = None
    last = 0.0
    shutdown: float | None = None

    def close(end: BootEnd) -> None:
        assert start is not None
        boots.append(Boot(start.login, start.host, last, shutdown, end, "wtmpdb"))

    for row in rows:
        if row.is_boot:
            if start is not None:
                close(BootEnd.CLEAN if shutdown is not None else BootEnd.CRASHED)
            start, last, shutdown = row, row.login, row.logout
        elif start is not None:
            last = max(last, row.login)
            if row.is_soft_reboot:
                shutdown = row.logout
        if start is not None and row.logout is not None:
            last = max(last, row.logout)
    if start is not None:
        close(BootEnd.CLEAN if shutdown is not None else BootEnd.RUNNING)
    return boots


def _says(boots: Sequence[Boot], found: bool) -> str:
    if not found:
        return "not found"
    if not boots:
        return "no boot records"
    newest = boots[-1]
    return f"{len(boots)} boot(s), the newest began {iso(newest.start)} ({newest.end.value})"


def read_btime(proc_stat: str) -> float | None:
    try:
        fd = open_regular(proc_stat, follow=True)  # a tree's own proc/stat, perhaps
        with open(fd, encoding="ascii", errors="replace") as lines:
            for line in lines:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


# The kernel's form (a random UUID, 36 characters): the boot id names a quarantine dir and the
# pre-runtime record's file, so anything else (a tree's forged proc file) is no boot id at all.
_BOOT_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")


def read_boot_id(path: str) -> str:
    """This boot's id, "" if it cannot be read or is not a UUID as the kernel writes it."""
    try:
        with open(open_regular(path, follow=True), encoding="ascii") as f:
            text = f.read(64).strip()
    except (OSError, UnicodeDecodeError):
        return ""
    return text if _BOOT_ID.match(text) else ""


def read_wtmp(files: Sequence[str]) -> tuple[list[wtmp.WtmpRecord], list[str]]:
    """The rotated file then the live one, as one stream; missing files are only a warning."""
    records: list[wtmp.WtmpRecord] = []
    warnings: list[str] = []
    found = False
    for path in files:
        try:
            fd = open_regular(path)
        except FileNotFoundError:
            continue
        except NotRegularFile as e:
            warnings.append(f"{path} is not a regular file (a {e.kind}, never opened); ignored")
            continue
        except OSError as e:
            warnings.append(f"cannot read {path}: {e.strerror}")
            continue
        with os.fdopen(fd, "rb") as f:
            data = f.read()
        found = True
        records.extend(wtmp.parse(data))
    if not found:
        warnings.append(f"no wtmp at {files[-1]}: boots and crashes are not known")
    return records, warnings


class FirstReading(Record):
    """What this boot's first run read of its start, kept in the pre-runtime record: later
    runs of the boot still know it after the clock, and so btime, has been stepped."""

    btime: float | None
    boot_record: float | None  # this boot's wtmp or wtmpdb boot record, as the first run found it


def load(
    paths: NodePaths,
    clock: Clock,
    margin: float = DEFAULT_MARGIN,
    first: FirstReading | None = None,
    file_system: Callable[[str], FsCrashRecord] | None = None,
) -> BootContext:
    """file_system: the crash record of the results dir's file system, given the boot id."""
    now = clock()
    records, warnings = read_wtmp(paths.wtmp_files)
    boots = boots_from_records(records)
    db_rows, db_read, db_warnings = wtmpdb.read(paths.root, paths.wtmpdb_node_path)
    db_boots = boots_from_wtmpdb(db_rows)
    wtmp_boots, wtmp_found = boots, bool(records) or not warnings
    witnesses = [
        ("wtmp", _says(boots, bool(records) or not warnings)),
        ("wtmpdb", _says(db_boots, bool(db_read))),
    ]
    source = "wtmp"
    if db_read:
        # wtmp's "not found" says nothing once wtmpdb speaks (Debian 13 writes only wtmpdb).
        warnings = [w for w in warnings if not w.startswith("no wtmp at ")]
    if not boots and db_boots:
        boots, source = db_boots, "wtmpdb"
    elif boots and db_boots:
        if _agree(boots, db_boots):
            source = "wtmp+wtmpdb"
        else:
            warnings.append(
                "wtmp and wtmpdb disagree about the previous boot: wtmp's account is used"
            )
    warnings.extend(db_warnings)
    boot_id = read_boot_id(paths.boot_id)
    # The journal: a witness beside the others, read in bounded time; it decides nothing.
    journal = journal_witness.read(paths.root, boot_id)
    witnesses.append(("journal", journal.says))
    warnings.extend(f"journal: {w}" for w in journal.warnings)
    btime = read_btime(paths.proc_stat)
    if btime is None:
        warnings.append(f"no btime in {paths.proc_stat}")

    # Every estimate of when this boot began; the boundary is the earliest of them, so that
    # doubt falls on the side of "this boot" (a step of the clock moves btime, not the record).
    estimates: list[tuple[float, str]] = []
    if btime is not None:
        estimates.append((btime, "/proc/stat btime"))
    if first is not None and first.btime is not None:
        estimates.append((first.btime, "btime as this boot's first run read it"))
    last = boots[-1] if boots else None
    if last is not None and last.end is BootEnd.RUNNING:
        known = first is not None and first.boot_record == last.start
        near_btime = (
            btime is not None and btime - margin <= last.start <= btime + MAX_USERSPACE_START_DELAY
        )
        if known or near_btime:
            estimates.append((last.start, f"{last.source} boot record"))
            boots = boots[:-1]
        elif btime is None:
            estimates.append((last.start, f"{last.source} boot record, unchecked: no btime"))
            boots = boots[:-1]
    current_start, start_source = min(estimates) if estimates else (None, "unknown")

    # A boot that was still open when this one began never shut down: it crashed.
    previous = tuple(
        b._replace(end=BootEnd.CRASHED) if b.end is BootEnd.RUNNING else b for b in boots
    )
    if current_start is not None:
        previous = tuple(b for b in previous if b.start < current_start)
    boot_record = next((start for start, src in estimates if src.startswith("wtmp")), None)
    accounts = (
        _records_account("wtmp", wtmp_boots, wtmp_found, current_start),
        _records_account("wtmpdb", db_boots, bool(db_read), current_start),
    )
    return BootContext(
        boot_id=boot_id,
        now=now,
        btime=btime,
        current_start=current_start,
        current_start_source=start_source,
        previous_boots=previous,
        margin=margin,
        warnings=tuple(warnings),
        shutdown=shutdown_marker.read(paths, boot_id) if boot_id else None,
        first=FirstReading(btime, boot_record),
        witnesses=tuple(witnesses),
        boots_source=source,
        journal=journal if journal.consulted else None,
        records=accounts,
        file_system=file_system(boot_id) if file_system is not None else None,
    )


def _agree(wtmp_boots: Sequence[Boot], db_boots: Sequence[Boot]) -> bool:
    """Whether the two say the same of the boot before the newest: both its end, and a start
    within the few minutes between the kernel's start (wtmpdb) and PID 1's (wtmp)."""
    if len(wtmp_boots) < 2 or len(db_boots) < 2:
        return len(wtmp_boots) == len(db_boots)
    a, b = wtmp_boots[-2], db_boots[-2]
    return a.end is b.end and -DEFAULT_MARGIN <= a.start - b.start <= MAX_USERSPACE_START_DELAY
