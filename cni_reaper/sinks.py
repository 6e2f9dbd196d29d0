"""Where a run's report and its per-event log go, chosen from what stdout and stderr are.

A person reads the report once; a log gets one record per event. The rules, also in the README
and the man page:

- stderr is the journal stream systemd named in $JOURNAL_STREAM (the unit): the journal gets one
  record per event, with its fields when systemd-python is there, else as a key=value line. No
  text report is printed: those records hold its facts. --json still prints its document.
- Otherwise stdout gets the report (text, or JSON with --json), and stderr gets the key=value
  lines only when it is a log: not a terminal, where a person already reads the report, and not
  the very file or pipe stdout goes to (`>out 2>&1`, cron's mail), where the report already says
  it all and the lines would break a JSON document.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from cni_reaper.journal import EventLog, is_journal_stream, journal_send
from cni_reaper.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import TextIO


class Sinks(Record):
    events: EventLog
    text_report: bool  # whether stdout gets the text report (when --json does not ask for JSON)


def choose(environ: Mapping[str, str], stdout: TextIO, stderr: TextIO, block: int = 1) -> Sinks:
    err = _fd(stderr)
    if err is not None and is_journal_stream(environ, err):
        return Sinks(EventLog(journal_send(environ, err), stderr, block), text_report=False)
    return Sinks(
        EventLog(stream=stderr, block=block, discard=not _is_a_log(err, _fd(stdout))),
        text_report=True,
    )


def _is_a_log(err: int | None, out: int | None) -> bool:
    """Whether stderr is a place for log lines: not a terminal, not where the report goes. A
    stream with no file descriptor (a test's capture) counts as a log."""
    if err is None:
        return True
    try:
        if os.isatty(err):
            return False
        st = os.fstat(err)
        if out is None:
            return True
        report = os.fstat(out)
    except OSError:
        return True
    return (st.st_dev, st.st_ino) != (report.st_dev, report.st_ino)


def _fd(stream: TextIO) -> int | None:
    try:
        return stream.fileno()
    except (OSError, ValueError):  # io.UnsupportedOperation is both; a closed stream is one
        return None
