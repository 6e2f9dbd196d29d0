"""How the previous boot ended, from every witness: what each one says, the verdict, and where
they disagree.

The witnesses, in the order in which the first that knows decides:
1. the clean-shutdown marker: written by the unit's ExecStop once the runtime has stopped, so
   it speaks of the CNI state itself; it counts only when it speaks of the previous boot;
2. the file system's crash record: its journal replayed at this boot's mount, read without a
   clock (only when the root is `/`);
3. the boot records, wtmp then wtmpdb: a boot without its shutdown record before the next boot;
4. the journal's boot list: a boot with no shutdown message. Last, because a journal whose last
   entries did not reach the disk before the power went reads as a crash.

The verdict is reported (text, JSON, journal, metrics); it moves no file. Whether a file was
written before this boot is proven by the pre-runtime record alone (pre_runtime.py): damage
found before any runtime of this boot started is an earlier boot's however that boot ended, and
a node without these witnesses (the first boot after installing the package, a minimal image
without wtmpdb) must still be repaired.
"""

from __future__ import annotations

from collections.abc import Sequence

from cni_reaper.record import Record

CRASHED = "crashed"
CLEAN = "clean"
UNKNOWN = "unknown"


class Account(Record):
    witness: str  # "shutdown marker", "file system", "wtmp", "wtmpdb", "journal"
    consulted: bool  # False: it could not be read here, and says why
    ended: str  # what it says of the previous boot: crashed, clean or unknown
    says: str

    def to_json(self) -> dict[str, object]:
        return self._asdict()


class PreviousBootVerdict(Record):
    crashed: bool | None
    decided_by: str | None  # the witness whose account is the verdict
    accounts: tuple[Account, ...]
    disagreement: str | None  # who says otherwise than the verdict

    @property
    def not_consulted(self) -> tuple[Account, ...]:
        return tuple(a for a in self.accounts if not a.consulted)

    def to_json(self) -> dict[str, object]:
        return {
            "crashed": self.crashed,
            "decided_by": self.decided_by,
            "witnesses": [a.to_json() for a in self.accounts],
            "disagreement": self.disagreement,
        }


def combine(accounts: Sequence[Account]) -> PreviousBootVerdict:
    """accounts in the order of precedence above."""
    knowing = [a for a in accounts if a.consulted and a.ended in (CRASHED, CLEAN)]
    if not knowing:
        return PreviousBootVerdict(None, None, tuple(accounts), None)
    first = knowing[0]
    others = [a for a in knowing if a.ended != first.ended]
    disagreement = None
    if others:
        names = ", ".join(f"the {a.witness}" for a in others)
        disagreement = (
            f"{names} {'say' if len(others) > 1 else 'says'} the previous boot "
            f"{_ended(others[0].ended)}; the {first.witness} says it {_ended(first.ended)}, "
            "and its account is used"
        )
    return PreviousBootVerdict(first.ended == CRASHED, first.witness, tuple(accounts), disagreement)


def _ended(ended: str) -> str:
    return "crashed" if ended == CRASHED else "shut down cleanly"
