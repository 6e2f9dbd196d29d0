"""The journal's boot list: the boots a persistent journal knows, their first and last entries,
and whether each reached a clean shutdown. A witness only: it describes, it decides nothing.

Read with systemd-python's C reader (journal_files.py; imported only when the witness is read),
from <root>/var/log/journal, never from this machine's /run/log/journal: under --root the root's
persistent journal is the only one that speaks of the root's boots. With no persistent journal
the journal is volatile and keeps no earlier boot: the witness is skipped with a note.

A boot reached a clean shutdown when one of its entries is one systemd writes only on the way
down (IDs from systemd's src/systemd/sd-messages.h and its catalog):
- SD_MESSAGE_SHUTDOWN 98268866d1d54a499c4e98921d93bc40, logind's "System is powering down." /
  "System is rebooting." when a shutdown is carried out;
- SD_MESSAGE_JOURNAL_STOP d93fb3c9c24d451a97cea615ce59c00b, journald's "Journal stopped" when it
  is told to exit (SIGTERM), which reaches /var/log/journal only if journald still writes there.
A boot with neither is named crashed; its end cannot be known when the read was cut short.

Bounded: the boot ids come from the _BOOT_ID field's data objects (no walk over entries); each
boot's first and last entries and its shutdown entries are found through the journal's entry
arrays for that boot (seeks, not scans); at most MAX_BOOTS boots are examined, the newest first,
and the whole read stops at a deadline. One libsystemd call cannot be interrupted: the deadline
is checked between calls.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Sequence

from cni_reaper.evidence.journal_files import Journal, JournalUnavailable, open_journal
from cni_reaper.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Callable

JOURNAL_DIR = "var/log/journal"
SHUTDOWN_MESSAGES = {
    "98268866d1d54a499c4e98921d93bc40": "systemd's shutdown message (System is powering down)",
    "d93fb3c9c24d451a97cea615ce59c00b": "journald's Journal stopped",
}
# Boots examined: the previous boot matters most, a few before it say whether crashes repeat.
MAX_BOOTS = 8
# The whole read, in seconds.
DEADLINE = 2.0

CLEAN = "clean"
CRASHED = "crashed"
UNKNOWN = "unknown"
RUNNING = "running"  # the boot this run belongs to

if TYPE_CHECKING:
    Clock = Callable[[], float]


class JournalBoot(Record):
    boot_id: str
    first: float  # seconds since the epoch, of its first entry
    last: float | None  # of its last entry; None when not read in time
    ended: str  # clean, crashed, unknown, or running (this boot)
    shutdown: str = ""  # which shutdown entry made it clean

    def to_json(self) -> dict[str, object]:
        return {
            "boot_id": self.boot_id,
            "first": iso(self.first),
            "last": iso(self.last) if self.last is not None else None,
            "ended": self.ended,
            "shutdown": self.shutdown or None,
        }


class JournalWitness(Record):
    consulted: bool  # whether a persistent journal was read at all
    says: str
    boots: tuple[JournalBoot, ...] = ()  # oldest first, at most MAX_BOOTS
    previous: JournalBoot | None = None  # the newest boot that is not this one
    warnings: tuple[str, ...] = ()
    seconds: float = 0.0  # how long the read took

    @property
    def previous_boot_crashed(self) -> bool | None:
        if self.previous is None or self.previous.ended == UNKNOWN:
            return None
        return self.previous.ended == CRASHED

    def to_json(self) -> dict[str, object]:
        return {
            "says": self.says,
            "boots": [b.to_json() for b in self.boots],
            "previous_boot": self.previous.to_json() if self.previous else None,
            "previous_boot_crashed": self.previous_boot_crashed,
            "seconds": round(self.seconds, 3),
            "warnings": list(self.warnings),
        }


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


class _Late(Exception):
    pass


def read(
    root: str,
    current_boot_id: str,
    *,
    deadline: float = DEADLINE,
    max_boots: int = MAX_BOOTS,
    clock: Clock = time.monotonic,
    directory: str | None = None,
) -> JournalWitness:
    """The journal witness of the node at root. Never raises: a failure is a warning.

    directory: the journal directory to read instead of <root>/var/log/journal (tests)."""
    started = clock()
    current_boot_id = current_boot_id.replace("-", "")  # the journal's form: 32 hex digits
    path = directory if directory is not None else os.path.join(root, JOURNAL_DIR)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if root == "/" and directory is None:
            note = (
                "skipped: the journal is volatile (no /var/log/journal), it keeps no earlier boot"
            )
        else:
            note = f"skipped: no persistent journal at {path}"
        return JournalWitness(False, note)
    except OSError as e:
        return JournalWitness(False, f"not read: {path}: {e.strerror}")
    if not stat.S_ISDIR(st.st_mode):
        return JournalWitness(False, f"not read: {path} is not a directory (symlinks are refused)")
    try:
        journal = open_journal(path)
    except JournalUnavailable as e:
        return JournalWitness(False, f"not read: {e}")
    except (OSError, ValueError) as e:
        return JournalWitness(False, f"not read: cannot open the journal at {path}: {e}")
    try:
        boots, warnings = _boots(journal, current_boot_id, started + deadline, max_boots, clock)
    finally:
        journal.close()
    seconds = clock() - started
    ids = [b.boot_id for b in boots]
    # The boot before this one; the newest boot when the journal does not know this one.
    before = boots[: ids.index(current_boot_id)] if current_boot_id in ids else boots
    previous = before[-1] if before else None
    return JournalWitness(
        True,
        _says(boots, previous, seconds),
        tuple(boots),
        previous,
        tuple(warnings),
        seconds,
    )


def _boots(
    journal: Journal, current: str, until: float, max_boots: int, clock: Clock
) -> tuple[list[JournalBoot], list[str]]:
    warnings: list[str] = []

    def in_time() -> None:
        if clock() > until:
            raise _Late

    firsts: list[tuple[float, str]] = []
    try:
        ids = journal.boot_ids()
        in_time()
        for boot_id in ids:
            journal.flush_matches()
            journal.match("_BOOT_ID", boot_id)
            if journal.first():
                firsts.append((journal.realtime(), boot_id))
            in_time()
    except _Late:
        warnings.append(
            f"the journal's boot list was cut short at the deadline: {len(firsts)} boot(s) found"
        )
    except OSError as e:
        warnings.append(f"the journal's boot list could not be read: {e}")
    firsts.sort()
    if len(firsts) > max_boots:
        warnings.append(f"{len(firsts)} boots in the journal: only the newest {max_boots} examined")
        firsts = firsts[-max_boots:]
    boots: list[JournalBoot] = []
    late = False
    for first, boot_id in reversed(firsts):  # the newest, and so the previous boot, first
        if late:
            boots.append(JournalBoot(boot_id, first, None, UNKNOWN))
            continue
        try:
            in_time()
            boots.append(_examine(journal, boot_id, first, boot_id == current, in_time))
        except _Late:
            late = True
            warnings.append("the journal's read stopped at its deadline: some boots' ends unknown")
            boots.append(JournalBoot(boot_id, first, None, UNKNOWN))
        except OSError as e:
            warnings.append(f"the journal's boot {boot_id} could not be read: {e}")
            boots.append(JournalBoot(boot_id, first, None, UNKNOWN))
    boots.reverse()
    return boots, warnings


def _examine(
    journal: Journal, boot_id: str, first: float, running: bool, in_time: Callable[[], None]
) -> JournalBoot:
    journal.flush_matches()
    journal.match("_BOOT_ID", boot_id)
    last = journal.realtime() if journal.last() else None
    if running:
        return JournalBoot(boot_id, first, last, RUNNING)
    in_time()
    # One boot AND (one shutdown message OR the other): matches on one field are ORed.
    for message_id in SHUTDOWN_MESSAGES:
        journal.match("MESSAGE_ID", message_id)
    if journal.last():
        message_id = (journal.field("MESSAGE_ID") or b"").decode("ascii", "replace")
        return JournalBoot(
            boot_id,
            first,
            last,
            CLEAN,
            SHUTDOWN_MESSAGES.get(message_id, "a shutdown message"),
        )
    return JournalBoot(boot_id, first, last, CRASHED)


def _says(boots: Sequence[JournalBoot], previous: JournalBoot | None, seconds: float) -> str:
    if not boots:
        return f"no boots (read in {seconds:.3f} s)"
    if previous is None:
        return f"{len(boots)} boot(s), none before this one (read in {seconds:.3f} s)"
    how = previous.ended + (f": {previous.shutdown}" if previous.shutdown else "")
    return (
        f"{len(boots)} boot(s); the previous boot {previous.boot_id} began {iso(previous.first)}, "
        f"{how} (read in {seconds:.3f} s)"
    )
