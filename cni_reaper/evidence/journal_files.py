"""The journal's files, read through systemd-python's C reader (systemd._reader._Reader).

Its Python layer, systemd.journal.Reader, is not used: it converts every field of every entry
it returns (times to datetimes, IDs to UUIDs), where the witnesses want one or two fields of a
few entries, and it imports logging, uuid, traceback and datetime, some 20 to 30 modules, which
a boot reads from a cold disk before the runtime may start. _Reader is the documented
low-level interface; its underscored methods (_next, _previous, _get, _get_realtime) are the
ones systemd-python's own Reader is built on, each field fetched alone and given as bytes.
"""

from __future__ import annotations

import importlib

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class JournalUnavailable(Exception):
    """No reader: systemd-python is not installed."""


class Journal:
    """One open journal: matches, a position, the fields of the entry there."""

    def __init__(self, reader: Any) -> None:
        self._reader = reader

    def boot_ids(self) -> list[str]:
        """Every _BOOT_ID the journal's data objects hold (no walk over entries)."""
        return sorted(_text(v) for v in self._reader.query_unique("_BOOT_ID"))

    def match(self, field: str, value: str) -> None:
        """Entries of one field's several values are ORed; of different fields, ANDed."""
        self._reader.add_match(f"{field}={value}")

    def flush_matches(self) -> None:
        self._reader.flush_matches()

    def first(self) -> bool:
        """To the first entry that matches; False when none does."""
        self._reader.seek_head()
        return bool(self._reader._next())

    def last(self) -> bool:
        """To the last entry that matches; False when none does."""
        self._reader.seek_tail()
        return bool(self._reader._previous())

    def next(self) -> bool:
        """To the next entry that matches (the first, on a journal just opened)."""
        return bool(self._reader._next())

    def realtime(self) -> float:
        """The entry's wall-clock time, in seconds since the epoch."""
        microseconds: int = self._reader._get_realtime()
        return microseconds / 1e6

    def field(self, name: str) -> bytes | None:
        """The entry's field, as the journal holds it; None when it has none."""
        try:
            value: bytes = self._reader._get(name)
        except KeyError:
            return None
        return value

    def close(self) -> None:
        self._reader.close()


def open_journal(directory: str | None = None) -> Journal:
    """The journal files of directory; without one, this machine's system journal (runtime
    and persistent), local only. Raises JournalUnavailable without systemd-python, and
    OSError or ValueError when it cannot be opened."""
    try:
        # By name: the source tree's systemd/ unit dir would otherwise pass for the package.
        reader_module = importlib.import_module("systemd._reader")
    except ImportError:
        raise JournalUnavailable("systemd-python not installed") from None
    if directory is None:
        flags = reader_module.LOCAL_ONLY | reader_module.SYSTEM_ONLY
        return Journal(reader_module._Reader(flags))
    return Journal(reader_module._Reader(0, directory))


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("ascii", "replace")
    return str(value)
