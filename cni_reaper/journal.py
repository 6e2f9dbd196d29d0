"""Events for the log: one structured journal record per action, one per warning of the run, and
one for the summary.

Under systemd, when stderr is the journal stream systemd named in $JOURNAL_STREAM and
systemd-python is there, records go to the journal natively with their fields; otherwise the
same facts go to stderr as plain lines where stderr is a log (cni_reaper/sinks.py says when).
systemd-python is imported only then, so a run by hand never loads it.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Mapping

from cni_reaper.choice import Choice
from cni_reaper.escape import is_printable, printable
from cni_reaper.plan import Action
from cni_reaper.plugin import doc_error_texts
from cni_reaper.repair.outcome import EntryResult, Outcome
from cni_reaper.reservations import del_failed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TextIO

    from cni_reaper.multus import MultusFile
    from cni_reaper.report import Report

SYSLOG_IDENTIFIER = "cni-reaper"


class Event(str, Choice):
    """One kind per MESSAGE_ID; the IDs never change, so journalctl MESSAGE_ID=... keeps working."""

    REPAIRED = "repaired"
    REPAIR_FAILED = "repair-failed"
    PLANNED = "planned"
    LEFT = "left"
    NEEDS_ATTENTION = "needs-attention"
    KEPT = "kept"
    WARNING = "warning"  # something the run could not read or use, and what it did instead
    MORE = "more"  # the records of one kind past RECORDS_PER_KIND, counted in one record
    SUMMARY = "summary"

    @property
    def message_id(self) -> str:
        return _MESSAGE_IDS[self]

    @property
    def priority(self) -> int:
        return _PRIORITIES[self]


_MESSAGE_IDS = {
    Event.REPAIRED: "8164ecb54e43456284ff4c2293564c06",
    Event.REPAIR_FAILED: "ec460304e4bd4f47b49c1480fb9bc381",
    Event.PLANNED: "599d6addddd248008d84e8aa1b4f47d9",
    Event.LEFT: "2555a316e595483ab986f58054267ae4",
    Event.NEEDS_ATTENTION: "53f32876435644e29b4cbec508b4c40c",
    Event.KEPT: "cba8cac8fd334944a069e83d9a34fe19",
    Event.WARNING: "e11d630a71f740d3be578689a342ba78",
    Event.MORE: "56ee09c1f831411289e89261cd26f4a4",
    Event.SUMMARY: "40d33e61a7024481a04d33a66d8dad96",
}
# syslog levels
ERR, WARNING, NOTICE, INFO = 3, 4, 5, 6
_PRIORITIES = {
    Event.REPAIRED: NOTICE,
    Event.REPAIR_FAILED: ERR,
    Event.PLANNED: NOTICE,
    Event.LEFT: WARNING,
    Event.NEEDS_ATTENTION: WARNING,
    Event.KEPT: INFO,
    Event.WARNING: WARNING,
    Event.MORE: WARNING,  # raised to its kind's where that is higher (err for repair-failed)
    Event.SUMMARY: NOTICE,
}

# Records of each kind (one Event but MORE and SUMMARY) sent per run; the rest of that kind
# is counted in one MORE record. journald drops what a unit sends past RateLimitBurst=
# (10,000) in RateLimitIntervalSec= (30 s), counted per unit and per priority class (err,
# warning, notice and info together), a burst it raises with the journal's free space but
# never lowers below 10,000. A run is one start of the unit: at 1,000 a kind, the kinds that
# share a class (repaired, planned, kept, their MORE records and the summary) make at most a
# few thousand records, so even three runs in one 30 s window (a restart, a run by hand
# under systemd-run) stay below the burst. And 1,000 records are plenty to read the causes
# from; the full list is in the JSON report and in the quarantine's sidecars.
RECORDS_PER_KIND = 1000
_UNBOUNDED = frozenset({Event.SUMMARY.value, Event.MORE.value})

Send = Callable[..., None]


def event_of(result: EntryResult) -> Event:
    outcome = result.outcome
    if outcome is Outcome.SKIPPED:
        action = result.planned.action
        if action is Action.KEEP:
            return Event.KEPT
        if action is Action.REPORT:
            return Event.NEEDS_ATTENTION
        return Event.LEFT  # a corrupt file that may be in flight, or one changed since the scan
    if outcome is Outcome.FAILED:
        return Event.REPAIR_FAILED
    if outcome is Outcome.PLANNED:
        return Event.PLANNED
    return Event.REPAIRED


def entry_fields(result: EntryResult, dry_run: bool) -> dict[str, str]:
    planned = result.planned
    entry = planned.entry
    split = entry.split
    event = event_of(result)
    name = entry.name
    content = entry.verdict.content.value
    written = planned.written.written.value
    action = planned.action.value
    outcome = result.outcome.value
    fields = {
        "MESSAGE": f"{name}: {content}, {written} -> {action} [{outcome}]: {planned.reason}",
        "MESSAGE_ID": event.message_id,
        "PRIORITY": str(event.priority),
        "SYSLOG_IDENTIFIER": SYSLOG_IDENTIFIER,
    }
    if split is not None:  # a name that does not split has none of them: left out, not empty
        fields["CNI_NETWORK"] = split.network
        fields["CNI_CONTAINERID"] = split.container_id
        fields["CNI_IFNAME"] = split.ifname
    fields["CNI_REAPER_FILE"] = name
    fields["CNI_REAPER_CONTENT"] = content
    fields["CNI_REAPER_WRITTEN"] = written
    fields["CNI_REAPER_ACTION"] = action
    fields["CNI_REAPER_OUTCOME"] = outcome
    fields["CNI_REAPER_EVENT"] = event.value
    fields["CNI_REAPER_DRY_RUN"] = "1" if dry_run else "0"
    if result.del_outcome is not None and result.del_outcome.errors:
        fields["CNI_REAPER_PLUGIN_ERRORS"] = "; ".join(result.del_outcome.error_texts())
    elif planned.config_problem is not None and result.outcome is Outcome.PLANNED:
        # A dry run's DEL that will fail says why where the real run's error will be.
        fields["CNI_REAPER_PLUGIN_ERRORS"] = f"DEL will fail: {planned.config_problem}"
    if result.problems:
        fields["CNI_REAPER_PROBLEMS"] = "; ".join(result.problems)
    if result.quarantined_to:
        fields["CNI_REAPER_QUARANTINED_TO"] = result.quarantined_to
    return fields


_BY_OUTCOME = {"done": Event.REPAIRED, "failed": Event.REPAIR_FAILED, "planned": Event.PLANNED}
_SKIPPED_BY_ACTION = {"keep": Event.KEPT, "report": Event.NEEDS_ATTENTION}


def _doc_event(doc: Mapping[str, Any]) -> Event:
    """The event of a report document (a reservation, a delegate result): by its outcome, and
    one that was skipped by its action; the rest were left. A reservation released into the
    quarantine because its DEL failed is a failed repair, as the run's exit code says."""
    if doc["outcome"] == "done" and del_failed(doc):
        return Event.REPAIR_FAILED
    by_outcome = _BY_OUTCOME.get(str(doc["outcome"]))
    return by_outcome or _SKIPPED_BY_ACTION.get(str(doc["action"]), Event.LEFT)


def reservation_fields(doc: Mapping[str, Any], dry_run: bool) -> dict[str, str]:
    """A host-local reservation the reaper acted on, or left, as one record."""
    event = _doc_event(doc)
    message = (
        f"{doc['path']}: host-local reservation {doc['content']}, "
        f"{doc['written']} -> {doc['action']} [{doc['outcome']}]: {doc['reason']}"
    )
    fields = {
        "MESSAGE": message,
        "MESSAGE_ID": event.message_id,
        "PRIORITY": str(event.priority),
        "SYSLOG_IDENTIFIER": SYSLOG_IDENTIFIER,
        "CNI_NETWORK": str(doc["network"]),
    }
    owner = doc.get("owner")
    if owner:  # an ID-only reservation names no ifname: that field is then left out
        fields["CNI_CONTAINERID"] = str(owner["container_id"])
        fields["CNI_IFNAME"] = str(owner["ifname"] or "")
    fields |= {
        "CNI_REAPER_FILE": str(doc["path"]),
        "CNI_REAPER_CONTENT": str(doc["content"]),
        "CNI_REAPER_WRITTEN": str(doc["written"]),
        "CNI_REAPER_ACTION": f"{doc['action']}-reservation",
        "CNI_REAPER_OUTCOME": str(doc["outcome"]),
        "CNI_REAPER_EVENT": event.value,
        "CNI_REAPER_DRY_RUN": "1" if dry_run else "0",
    }
    done = doc.get("del")
    if done and done.get("plugin_errors"):
        fields["CNI_REAPER_PLUGIN_ERRORS"] = "; ".join(doc_error_texts(done))
    elif done and done.get("config_problem"):
        # A dry run's DEL that cannot run (a real run's has it as its error): in the field an
        # entry's has it.
        fields["CNI_REAPER_PLUGIN_ERRORS"] = f"DEL will fail: {done['config_problem']}"
    if doc.get("quarantined_to"):
        fields["CNI_REAPER_QUARANTINED_TO"] = str(doc["quarantined_to"])
    if doc.get("problem"):
        fields["CNI_REAPER_PROBLEMS"] = str(doc["problem"])
    return _without_empty(fields)


def multus_fields(doc: Mapping[str, Any], dry_run: bool, kind: MultusFile) -> dict[str, str]:
    """One of Multus's delegate results or scratch files (multus.delegate_doc(),
    scratch_doc()) as one record."""
    outcome, action = str(doc["outcome"]), str(doc["action"])
    event = _doc_event(doc)
    fields = {
        "MESSAGE": f"{doc['path']}: {kind.called} {doc['content']}, {doc['written']} -> "
        f"{action} [{outcome}]: {doc['reason']}",
        "MESSAGE_ID": event.message_id,
        "PRIORITY": str(event.priority),
        "SYSLOG_IDENTIFIER": SYSLOG_IDENTIFIER,
        "CNI_NETWORK": str(doc.get("network") or ""),
        "CNI_CONTAINERID": str(doc["container_id"] or ""),
        "CNI_IFNAME": str(doc.get("ifname") or ""),
        "CNI_REAPER_FILE": str(doc["path"]),
        "CNI_REAPER_CONTENT": str(doc["content"]),
        "CNI_REAPER_WRITTEN": str(doc["written"]),
        "CNI_REAPER_ACTION": f"{action}-{kind.action_suffix}",
        "CNI_REAPER_OUTCOME": outcome,
        "CNI_REAPER_EVENT": event.value,
        "CNI_REAPER_DRY_RUN": "1" if dry_run else "0",
        "CNI_REAPER_QUARANTINED_TO": str(doc["quarantined_to"] or ""),
        "CNI_REAPER_PROBLEMS": str(doc["problem"] or ""),
    }
    return _without_empty(fields)


def warning_fields(
    warning: str, warnings: int, dry_run: bool, priority: int = WARNING
) -> dict[str, str]:
    """A warning of the run as one record, with how many the run had. Under the unit no text
    report is printed, so this record is where the journal learns what the run could not read
    or use (a config, a boot record, a plugin dir), and so why it kept what it kept; priority:
    lower (notice) for what is expected on many nodes."""
    return {
        "MESSAGE": warning,
        "MESSAGE_ID": Event.WARNING.message_id,
        "PRIORITY": str(priority),
        "SYSLOG_IDENTIFIER": SYSLOG_IDENTIFIER,
        "CNI_REAPER_EVENT": Event.WARNING.value,
        "CNI_REAPER_WARNINGS": str(warnings),
        "CNI_REAPER_DRY_RUN": "1" if dry_run else "0",
    }


def _seconds(value: float | None) -> str:
    return "" if value is None else f"{value:.3f}"


def summary_fields(report: Report, not_logged: int = 0) -> dict[str, str]:
    """The run in one record: counts, exit code, and what the previous boot was and why;
    not_logged: the records cut at the bound (each kind's MORE record says which)."""
    summary = report.summary()
    actions, outcomes = summary["action"], summary["outcome"]
    counts = ", ".join(f"{n} {k}" for k, n in actions.items()) or "nothing to do"
    boot = report.boot
    previous = boot.previous_boot
    pools = [p for p in report.pools if p.range_set.number >= 0]
    released = sum(p.released for p in report.pools)
    fullest = max(pools, key=lambda p: p.left_total / p.capacity if p.capacity else 1, default=None)
    fields = {
        "MESSAGE": f"{summary['entries']} entries; {counts}; {report.repairs()}; "
        f"{released} addresses {'to release' if report.dry_run else 'released'}; "
        f"exit {summary['exit_code']}",
        "MESSAGE_ID": Event.SUMMARY.message_id,
        "PRIORITY": str(Event.SUMMARY.priority),
        "SYSLOG_IDENTIFIER": SYSLOG_IDENTIFIER,
        "CNI_REAPER_EVENT": Event.SUMMARY.value,
        "CNI_REAPER_ENTRIES": str(summary["entries"]),
        "CNI_REAPER_DONE": str(outcomes.get("done", 0)),
        "CNI_REAPER_FAILED": str(outcomes.get("failed", 0)),
        "CNI_REAPER_PLANNED": str(outcomes.get("planned", 0)),
        "CNI_REAPER_EXIT_CODE": str(summary["exit_code"]),
        "CNI_REAPER_PREVIOUS_BOOT_CRASHED": {None: "unknown", True: "1", False: "0"}[
            boot.previous_boot_crashed
        ],
        "CNI_REAPER_SHUTDOWN_MARKER": boot.shutdown.state.value if boot.shutdown else "unknown",
        "CNI_REAPER_WTMP_PREVIOUS_BOOT": previous.end.value if previous else "none",
        "CNI_REAPER_DRY_RUN": "1" if report.dry_run else "0",
        # What lets a run act, or why it acts on nothing: the unit's journal has no text report.
        "CNI_REAPER_PRE_RUNTIME_RECORD": report.proof.summary if report.proof else "",
        "CNI_REAPER_ADDRESSES_RELEASED": str(released),
        "CNI_REAPER_FS_JOURNAL": report.file_system.verdict.value
        if report.file_system
        else "unknown",
        "CNI_REAPER_ADDRESSES_LEFT": str(sum(p.left_total for p in report.pools)),
        "CNI_REAPER_NOT_LOGGED": str(not_logged) if not_logged else "",
        "CNI_REAPER_WARNINGS": str(len(report.warnings)) if report.warnings else "",
        "CNI_REAPER_SECONDS": _seconds(report.in_all),
        "CNI_REAPER_SECONDS_TO_PLAN": _seconds(report.to_plan),
    }
    verdict = boot.previous_boot_verdict
    for account in verdict.accounts:
        key = "CNI_REAPER_WITNESS_" + account.witness.upper().replace(" ", "_")
        fields[key] = account.ended if account.consulted else "not-consulted"
    if verdict.decided_by:
        fields["CNI_REAPER_PREVIOUS_BOOT_DECIDED_BY"] = verdict.decided_by
    if verdict.disagreement:
        fields["CNI_REAPER_WITNESSES_DISAGREE"] = verdict.disagreement
    if pools:
        # One field per run, not per pool: "<network>/<set>=<left>/<capacity>" each.
        fields["CNI_REAPER_POOLS"] = " ".join(
            f"{p.network}/{p.range_set.number}={p.left_total}/{p.capacity}" for p in pools
        )
    if fullest is not None:
        fields["CNI_REAPER_FULLEST_POOL"] = f"{fullest.network}/{fullest.range_set.number}"
    return _without_empty(fields)


def more_fields(
    kind: Event, logged: int, more: int, dry_run: bool, json_report: bool, quarantine: str | None
) -> dict[str, str]:
    """The records of one kind past the bound, as one: how many, and where each one is.

    quarantine: the dir this run moved files to, for the kinds whose files it moved."""
    listed = (
        "this run's JSON report (--json) lists every one"
        if json_report
        else "the JSON report (cni-reaper --json) lists every one; a dry run, those still there"
    )
    where = f"; moved files are in {quarantine}, each beside its JSON sidecar" if quarantine else ""
    fields = {
        "MESSAGE": f"{more} more {kind.value} records not logged ({logged} logged, "
        f"at most {logged} of a kind per run): {listed}{where}",
        "MESSAGE_ID": Event.MORE.message_id,
        # Never less urgent than the records it stands for: a filter by priority
        # (journalctl -p err) still finds that failures were cut.
        "PRIORITY": str(min(Event.MORE.priority, kind.priority)),
        "SYSLOG_IDENTIFIER": SYSLOG_IDENTIFIER,
        "CNI_REAPER_EVENT": Event.MORE.value,
        "CNI_REAPER_MORE_OF": kind.value,
        "CNI_REAPER_NOT_LOGGED": str(more),
        "CNI_REAPER_LOGGED": str(logged),
        "CNI_REAPER_DRY_RUN": "1" if dry_run else "0",
    }
    if quarantine:
        fields["CNI_REAPER_QUARANTINE_DIR"] = quarantine
    return fields


def _without_empty(fields: dict[str, str]) -> dict[str, str]:
    """A field with no value is left out: journald would keep it as a bare FIELD=, which
    says nothing, and a catalog entry's @FIELD@ shows its name where the value is missing.
    For the records whose values come from the report's documents (reservations, the
    summary); entry_fields, which runs per file, leaves its optional fields out as it goes."""
    return {name: value for name, value in fields.items() if value}


class EventLog:
    """Where events go: the journal's send function, or plain lines on a text stream.

    Lines are written as they come, or, with block > 1, that many at a time and at flush():
    a dry run over a crashed node may report tens of thousands of files at once, and a write
    per line would be a system call per line.

    Of each kind but the summary and MORE, at most `bound` records (RECORDS_PER_KIND) go out,
    in the journal and as lines alike: a log file fed to a collector meets the same limits.
    The others are counted (cut), for one MORE record each kind.
    """

    def __init__(
        self,
        send: Send | None = None,
        stream: TextIO | None = None,
        block: int = 1,
        *,
        discard: bool = False,
        bound: int | None = None,
    ) -> None:
        self._send = send
        self._stream = stream if stream is not None else sys.stderr
        self._block = block
        self._lines: list[str] = []
        # Nothing is written: the person the lines would reach reads the report already.
        self._discard = discard
        self.bound = RECORDS_PER_KIND if bound is None else bound
        self._counts: dict[str, int] = {}  # records of each kind so far, sent or not

    @property
    def native(self) -> bool:
        return self._send is not None

    def counted_as_cut(self, kind: Event) -> bool:
        """Whether the bound of this kind is reached: the record is then only counted, and
        the caller need not build it (a run may leave tens of thousands of one kind)."""
        count = self._counts.get(kind.value, 0)
        if count < self.bound:
            return False
        self._counts[kind.value] = count + 1
        return True

    @property
    def cut(self) -> dict[Event, int]:
        """The kinds past the bound, and how many of each were not sent."""
        return {
            Event(kind): count - self.bound
            for kind, count in self._counts.items()
            if count > self.bound
        }

    def emit(self, fields: Mapping[str, str]) -> None:
        """One record. Every value may hold outside text (file names, plugin errors, config
        strings): it is escaped here, where it leaves, so that no field can forget it and no
        value can end a record or a line early. Nearly every record is printable as it is,
        which one check over all its text finds."""
        if self._discard:
            return
        kind = fields.get("CNI_REAPER_EVENT", "")
        if kind not in _UNBOUNDED:
            count = self._counts.get(kind, 0) + 1
            self._counts[kind] = count
            if count > self.bound:
                return
        if self._send is not None:
            if not is_printable("".join(fields.values())):
                fields = _printable_fields(fields)
            self._send(**fields)
            return
        line = _line(fields)
        if not is_printable(line):
            line = _line(_printable_fields(fields))
        self._lines.append(line + "\n")
        if len(self._lines) >= self._block:
            self.flush()

    def flush(self) -> None:
        if self._lines:
            self._stream.write("".join(self._lines))
            self._lines.clear()
            self._stream.flush()


class _LineNames(dict[str, str]):
    """How a line on stderr names a field: the CNI_* ones in lower case; the others, and the
    file (which begins the message), as "" and so left out. Looked up as a dict, so that only
    a field's first use costs a call."""

    def __missing__(self, field: str) -> str:
        name = "" if not field.startswith("CNI_") or field == "CNI_REAPER_FILE" else field.lower()
        self[field] = name
        return name


_LINE_NAMES = _LineNames()


def _line(fields: Mapping[str, str]) -> str:
    """A record as a line on stderr, without its newline."""
    names = _LINE_NAMES
    extra = " ".join(
        [f"{name}={value}" for key, value in fields.items() if value and (name := names[key])]
    )
    return f"cni-reaper: {fields['MESSAGE']} ({extra})"


def _printable_fields(fields: Mapping[str, str]) -> dict[str, str]:
    return {key: printable(value) for key, value in fields.items()}


def say(text: str, priority: int, environ: Mapping[str, str] | None = None) -> None:
    """A message of the run's own (an error that ends it, a file it could not write) on
    stderr. Under the unit that is journald's stream, which takes a leading <N> as the line's
    syslog priority (SyslogLevelPrefix=, on unless a unit turns it off): each line gets it,
    so that `journalctl -p err` shows a run that failed, traceback and all; elsewhere the
    text is written as it is."""
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, ValueError, OSError):  # replaced by something without one
        fd = -1
    if fd >= 0 and is_journal_stream(os.environ if environ is None else environ, fd):
        text = "".join(f"<{priority}>{line}\n" for line in text.splitlines())
    else:
        text += "\n"
    sys.stderr.write(text)
    sys.stderr.flush()


def is_journal_stream(environ: Mapping[str, str], stderr_fd: int = 2) -> bool:
    """Whether stderr is the journal stream systemd set up for us and named in $JOURNAL_STREAM."""
    stream = environ.get("JOURNAL_STREAM", "")
    try:
        device, inode = (int(part) for part in stream.split(":"))
        st = os.fstat(stderr_fd)
    except (ValueError, OSError):
        return False
    return (st.st_dev, st.st_ino) == (device, inode)


NATIVE_SOCKET = "/run/systemd/journal/socket"  # where libsystemd's sendv sends, always


def journal_send(
    environ: Mapping[str, str], stderr_fd: int = 2, native_socket: str = NATIVE_SOCKET
) -> Send | None:
    """systemd-python's send, if stderr is the journal stream systemd set up for us and
    journald's native socket is there."""
    if not is_journal_stream(environ, stderr_fd):
        return None
    if not os.path.exists(native_socket):
        # sendv reports no error when nothing listens there: every record would be lost.
        # Lines on stderr, which is journald's stream, still reach the journal.
        return None
    try:
        # Loaded only here, under systemd; by name, since the source tree's systemd/ unit dir
        # would otherwise pass for the package when type-checking. The C module that has
        # sendv, not systemd.journal around it, whose imports (logging, uuid, traceback,
        # datetime) a boot would read from a cold disk for nothing the records use.
        journal = importlib.import_module("systemd._journal")
    except ImportError:
        return None
    return _send_without_code_location(journal.sendv)


def _send_without_code_location(sendv: Callable[..., None]) -> Send:
    """A send for the records' fields alone. systemd-python's own send adds CODE_FILE,
    CODE_LINE and CODE_FUNC of its caller, found on the stack: that caller is EventLog.emit,
    the same line for every record. No other line says more: a record is written from the
    report once the stage that decided it is done, and its MESSAGE_ID and CNI_REAPER_*
    fields say what happened. So they are left out, through the native protocol's sendv,
    which sends exactly the fields it is given (and skips reading the stack per record)."""

    def send(**fields: str) -> None:
        sendv(*[f"{name}={value}" for name, value in fields.items()])

    return send
