"""What a run found and did: the JSON document (schema 1), the text report, the exit code."""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence

from cni_reaper import __version__
from cni_reaper.boot import Boot, BootContext, BootEnd, WrittenVerdict, boot_began, iso, written_in
from cni_reaper.content import Content
from cni_reaper.errors import ExitCode
from cni_reaper.escape import printable_lines
from cni_reaper.multus import DELEGATE_RESULT, SCRATCH_FILE
from cni_reaper.paths import SourcedDir
from cni_reaper.plan import Action
from cni_reaper.plugin import doc_error_texts
from cni_reaper.pool import PoolHealth
from cni_reaper.pre_runtime import FOUND, Proof, no_record
from cni_reaper.repair.outcome import EntryResult, Outcome
from cni_reaper.reservations import del_failed

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol, TextIO

    from cni_reaper.evidence.fs_crash import FsCrashRecord
    from cni_reaper.runtime.config import LocatedPath

SCHEMA_VERSION = 1


if TYPE_CHECKING:

    class ReportWriter(Protocol):
        """Where the report goes while the run goes on: nothing is kept per entry but counts."""

        def entry(self, report: Report, result: EntryResult) -> None: ...

        def reservation(self, report: Report, doc: dict[str, Any]) -> None: ...

        def finish(self, report: Report) -> None: ...


class Report:
    def __init__(
        self,
        boot: BootContext,
        dry_run: bool,
        results_dir: str,
        warnings: list[str],
        writer: ReportWriter | None = None,
        proof: Proof | None = None,
        runtime_records: list[str] | None = None,
        *,
        conf_dirs: Sequence[SourcedDir] = (),
        bin_dirs: Sequence[SourcedDir] = (),
        runtime_paths: Sequence[LocatedPath] = (),
        began: float | None = None,
    ) -> None:
        self.boot = boot
        self.proof = proof
        self.dry_run = dry_run
        self.results_dir = results_dir
        self.conf_dirs = conf_dirs  # each with what named it: a flag, a runtime's config, ...
        self.bin_dirs = bin_dirs
        # the runtimes' sockets, state dirs and roots, each with what named it
        self.runtime_paths = runtime_paths
        self.warnings = warnings
        self.writer = writer
        self.entries = 0
        # Counted by the members themselves; the strings are made once, for the summary.
        self._counts: dict[tuple[Content, Action, Outcome], int] = {}
        self.del_failures: Counter[str] = Counter()  # by plugin type
        self.plugin_errors = 0
        self.planned_to_fail = 0  # a dry run's DELs that cannot run as things are
        self._failed = False
        self._left_alone = False
        # host-local's: those acted on or left alone (with -v, those kept too), counted by
        # (action, outcome); each goes to the writer as it is decided, not kept: 10,000
        # orphans' docs were some 15 MB held to the end.
        self.reservations: Counter[tuple[str, str]] = Counter()
        # Reservations released into the quarantine because their DEL failed or cannot run:
        # what makes a run whose every reservation was done exit 73.
        self.reservation_dels_failed = 0
        # Entries whose DEL failed, moved to the quarantine all the same: the runtime's DEL no
        # longer aborts on them.
        self._failed_but_moved = 0
        # The DELs of reservations counted, by network, container ID, ifname: one DEL may
        # hold several addresses.
        self._dels_with_errors: set[tuple[str, str, str]] = set()
        self._failed_dels: set[tuple[str, str, str]] = set()
        self.pools: list[PoolHealth] = []  # set once the reservations are settled
        # Multus's delegate results and scratch files (multus.py): a few a pod on the nodes
        # that have them, kept whole and written out with the summary.
        self.delegates: list[dict[str, Any]] = []
        self.scratch: list[dict[str, Any]] = []
        # what the runtimes' own records say of the sandboxes they will know
        self.runtime_records = runtime_records if runtime_records is not None else []
        # Seconds from the run's start (time.monotonic() as it began, after the interpreter's
        # start and imports) until the whole plan was made and nothing yet changed (the DELs
        # begin then), and until the run was done: where a boot's wait for the runtime went.
        self._began = began
        self.to_plan: float | None = None
        self.in_all: float | None = None

    @property
    def file_system(self) -> FsCrashRecord | None:
        """What the file system holding the cache says of its last unmount: one of the boot's
        witnesses (evidence/fs_crash.py)."""
        return self.boot.file_system

    def add(self, result: EntryResult) -> None:
        planned = result.planned
        action, outcome = planned.action, result.outcome
        self.entries += 1
        key = (planned.entry.verdict.content, action, outcome)
        self._counts[key] = self._counts.get(key, 0) + 1
        if result.del_outcome is not None and result.del_outcome.errors:
            self.plugin_errors += len(result.del_outcome.errors)
            if outcome is Outcome.FAILED:
                for error in result.del_outcome.errors:
                    self.del_failures[error.plugin or "none"] += 1
        if outcome is Outcome.PLANNED and planned.config_problem is not None:
            # A dry run says so of a DEL that will fail, as the real run would fail it.
            self.planned_to_fail += 1
            self._failed = True
        elif outcome is Outcome.FAILED:
            self._failed = True
            if result.quarantined_to:
                self._failed_but_moved += 1
        elif outcome is Outcome.SKIPPED and action is not Action.KEEP:
            # Left as it is: to report, maybe in flight, or changed since the scan.
            self._left_alone = True
        if self.writer is not None:
            self.writer.entry(self, result)

    def _tally(self, field: int) -> dict[str, int]:
        """The counts by one of (content, action, outcome), in name order."""
        counts: Counter[str] = Counter()
        for key, n in self._counts.items():
            counts[key[field].value] += n
        return dict(sorted(counts.items()))

    @property
    def contents(self) -> dict[str, int]:
        return self._tally(0)

    @property
    def actions(self) -> Counter[tuple[str, str]]:
        counts: Counter[tuple[str, str]] = Counter()
        for (_, action, outcome), n in self._counts.items():
            counts[(action.value, outcome.value)] += n
        return counts

    def add_reservation(self, doc: dict[str, Any]) -> None:
        outcome = doc["outcome"]
        self.reservations[(str(doc["action"]), str(outcome))] += 1
        done = doc.get("del")
        if done and done.get("plugin_errors"):
            # Counted as an entry's are: its plugin errors whatever became of it, a failure
            # of its DEL when it was released into the quarantine all the same or failed; once
            # for each DEL, which may have held several addresses (both of a dual-stack one,
            # one of a delegate's riding on it): a DEL is its config's, not the store's.
            owner = doc.get("owner") or {}
            config = done.get("config") or doc["network"]
            key = (str(config), str(owner.get("container_id")), str(done.get("ifname")))
            if key not in self._dels_with_errors:
                self._dels_with_errors.add(key)
                self.plugin_errors += len(done["plugin_errors"])
            if outcome in ("done", "failed") and key not in self._failed_dels:
                self._failed_dels.add(key)
                for error in done["plugin_errors"]:
                    self.del_failures[error.get("plugin") or "none"] += 1
        if outcome == "failed":
            self._failed = True
        elif outcome in ("done", "planned") and del_failed(doc):
            # Released into the quarantine all the same, but a DEL failed or could not run,
            # as the exit codes say: the plugin or the config wants a look (a dry run says so
            # of a DEL that will not run).
            self._failed = True
            self.reservation_dels_failed += 1
        elif outcome == "skipped" and doc["action"] != "keep":
            # Left as it is: maybe in flight, or changed (after its DEL, too, as an entry).
            # One kept (shown with -v) is not.
            self._left_alone = True
        if self.writer is not None:
            self.writer.reservation(self, doc)

    def add_delegate(self, doc: dict[str, Any]) -> None:
        """One of Multus's delegate results, as multus.delegate_doc() has it."""
        self.delegates.append(doc)
        self._count_multus(doc)

    def add_scratch(self, doc: dict[str, Any]) -> None:
        """One of Multus's scratch files, as multus.scratch_doc() has it."""
        self.scratch.append(doc)
        self._count_multus(doc)

    def _count_multus(self, doc: dict[str, Any]) -> None:
        if doc["outcome"] == "failed":
            self._failed = True
        elif doc["outcome"] == "skipped" and doc["action"] != "keep":
            self._left_alone = True  # to report, maybe in flight, or changed since the scan

    def note_settled(self, outcome: str) -> None:
        """What became of a hidden name a move cut short left (leaving.Settled.outcome): one
        left for the operator is left alone, one that could not be settled a failure."""
        if outcome == "failed":
            self._failed = True
        elif outcome == "left":
            self._left_alone = True

    def mark_planned(self) -> None:
        if self._began is not None:
            self.to_plan = round(time.monotonic() - self._began, 3)

    def finish(self) -> None:
        if self._began is not None:
            self.in_all = round(time.monotonic() - self._began, 3)
        if self.writer is not None:
            self.writer.finish(self)

    @property
    def exit_code(self) -> ExitCode:
        if self._failed:
            return ExitCode.ACTION_FAILED
        if self._left_alone:
            return ExitCode.DATA
        return ExitCode.OK

    def summary(self) -> dict[str, Any]:
        return {
            "entries": self.entries,
            "content": self._tally(0),
            "action": self._tally(1),
            "outcome": self._tally(2),
            "plugin_errors": self.plugin_errors,
            "warnings": len(self.warnings),
            "host_local": dict(sorted((f"{a}/{o}", n) for (a, o), n in self.reservations.items())),
            "multus_results": self._tally_docs(self.delegates),
            "multus_scratch": self._tally_docs(self.scratch),
            "exit_code": int(self.exit_code),
            "seconds": {"to_plan": self.to_plan, "in_all": self.in_all},
        }

    @staticmethod
    def _tally_docs(docs: list[dict[str, Any]]) -> dict[str, int]:
        return dict(sorted(Counter(f"{d['action']}/{d['outcome']}" for d in docs).items()))

    def repairs(self) -> str:
        """What became of the repairs, in a few words for the summary line and the journal's
        summary record: how many failed is always said, even when none did."""
        done = failed = planned = left = 0
        for (_, action, outcome), n in self._counts.items():
            if outcome is Outcome.DONE:
                done += n
            elif outcome is Outcome.FAILED:
                failed += n
            elif outcome is Outcome.PLANNED:
                planned += n
            elif action is not Action.KEEP:
                left += n
        if self.dry_run:
            said = f"{planned} planned ({self.planned_to_fail} will fail)"
        else:
            said = f"{done} done, {failed} failed"
            if self._failed_but_moved:
                said += f" ({self._failed_but_moved} of them moved to the quarantine all the same)"
        said += f", {left} left alone"
        acted: Counter[str] = Counter()
        for (kind, result), n in self.reservations.items():
            if kind != "keep":
                acted[result] += n
        if acted:
            said += f"; host-local reservations: {self._outcomes(acted)}"
            failed_dels = self.reservation_dels_failed
            if failed_dels and self.dry_run:
                said += f" ({failed_dels} of them with a DEL that cannot run)"
            elif failed_dels:
                said += f" ({failed_dels} of them moved after a DEL that failed or could not run)"
        for what, docs in (("delegate results", self.delegates), ("scratch files", self.scratch)):
            moved = Counter(d["outcome"] for d in docs if d["action"] != "keep")
            if moved:
                said += f"; Multus {what}: {self._outcomes(moved)}"
        return said

    def _outcomes(self, outcomes: Counter[str]) -> str:
        """What became of the changes of one kind, counted by outcome."""
        if self.dry_run:
            counts = f"{outcomes['planned']} planned"
        else:
            counts = f"{outcomes['done']} done, {outcomes['failed']} failed"
        return f"{counts}, {outcomes['skipped']} left alone"

    def header(self) -> dict[str, Any]:
        boot = self.boot.to_json()
        boot["pre_runtime_record"] = self.proof.to_json() if self.proof is not None else None
        return {
            "schema": SCHEMA_VERSION,
            "version": __version__,
            "dry_run": self.dry_run,
            "results_dir": self.results_dir,
            "conf_dirs": [d.to_json() for d in self.conf_dirs],
            "bin_dirs": [d.to_json() for d in self.bin_dirs],
            "boot": boot,
            "warnings": list(self.warnings),
            "runtime_records": list(self.runtime_records),
            "file_system": self.file_system.to_json() if self.file_system else None,
            "runtime_paths": [
                {
                    "runtime": p.runtime.value,
                    "kind": p.kind.value,
                    "path": p.path,
                    "source": p.source,
                    "in_effect": p.in_effect,
                }
                for p in self.runtime_paths
            ],
        }


_NOTHING_FOUND = {
    "entries": 0,
    "content": {},
    "action": {},
    "outcome": {},
    "plugin_errors": 0,
    "warnings": 0,
    "host_local": {},
    "multus_results": {},
    "seconds": {"to_plan": None, "in_all": None},
}


def bare_header(
    dry_run: bool,
    results_dir: str,
    conf_dirs: Sequence[SourcedDir] | None = None,
    bin_dirs: Sequence[SourcedDir] | None = None,
) -> dict[str, Any]:
    """The header of a run that ended before it knew anything of the boot: the dirs are null
    where it ended before it knew them too."""
    return {
        "schema": SCHEMA_VERSION,
        "version": __version__,
        "dry_run": dry_run,
        "results_dir": results_dir,
        "conf_dirs": None if conf_dirs is None else [d.to_json() for d in conf_dirs],
        "bin_dirs": None if bin_dirs is None else [d.to_json() for d in bin_dirs],
        "boot": None,
        "warnings": [],
    }


class JsonWriter:
    """The schema-1 document, written as the run goes: header, one entry per line, summary.
    Entries go out in blocks: one write per entry would be a system call per entry wherever
    the stream is unbuffered (PYTHONUNBUFFERED=1, a pipe set to write through)."""

    BLOCK = 64  # entries per write

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._started = False
        self._finished = False
        self._pending: list[str] = []
        self._separator = "\n"
        self._reservation_separator: str | None = None  # once the host_local list is begun
        self._warned = 0  # how many of the run's warnings the header holds

    def _start(self, report: Report | None, header: dict[str, Any] | None = None) -> None:
        if not self._started:
            self._started = True
            if report is not None:
                header = report.header()
            assert header is not None
            self._warned = len(header["warnings"])
            head = json.dumps(header, indent=2)
            self._out.write(head[: head.rindex("}")].rstrip() + ',\n  "entries": [')

    def entry(self, report: Report, result: EntryResult) -> None:
        if not self._started:
            self._start(report)
        pending = self._pending
        pending.append(self._separator)
        pending.append(result.json_text())
        self._separator = ",\n"
        if len(pending) >= 2 * self.BLOCK:
            self._out.write("".join(pending))
            pending.clear()

    def reservation(self, report: Report, doc: dict[str, Any]) -> None:
        """A host-local reservation, as it is decided: every entry is written by then."""
        self._start(report)
        pending = self._pending
        self._begin_reservations()
        pending.append(self._reservation_separator or "")
        pending.append(json.dumps(doc))
        self._reservation_separator = ", "
        if len(pending) >= 2 * self.BLOCK:
            self._out.write("".join(pending))
            pending.clear()

    def _begin_reservations(self) -> None:
        """The entries list ended and the host_local one begun, once: what json.dumps of the
        list of every reservation writes, a reservation at a time."""
        if self._reservation_separator is None:
            self._pending.append('\n  ],\n  "host_local": [')
            self._reservation_separator = ""

    def finish(self, report: Report) -> None:
        self._start(report)
        self._end(None, report.summary(), report)

    def fail(
        self, report: Report | None, header: dict[str, Any], message: str, exit_code: int
    ) -> None:
        """End the document of a run cut short by an error: what it found until then, the
        error, and the exit code it ends with. Nothing if the document is already whole."""
        if self._finished:
            return
        self._start(report, header)
        summary = report.summary() if report is not None else dict(_NOTHING_FOUND)
        summary["exit_code"] = exit_code
        error = {"message": message, "exit_code": exit_code}
        self._end(error, summary, report)

    def _end(
        self, error: dict[str, Any] | None, summary: dict[str, Any], report: Report | None
    ) -> None:
        failed = f'  "error": {json.dumps(error)},\n' if error is not None else ""
        delegates = report.delegates if report is not None else []
        scratch = report.scratch if report is not None else []
        pools = report.pools if report is not None else []
        later = report.warnings[self._warned :] if report is not None else []
        pending = self._pending
        self._begin_reservations()  # the reservations themselves written as each was decided
        pending.append(
            f'],\n  "multus_results": {json.dumps(delegates)},'
            f'\n  "multus_scratch": {json.dumps(scratch)},'
            f'\n  "pools": {json.dumps([p.to_json() for p in pools])},'
            f'\n  "later_warnings": {json.dumps(later)},\n{failed}'
            f'  "summary": {json.dumps(summary)}\n}}\n'
        )
        self._out.write("".join(pending))
        self._out.flush()
        pending.clear()
        self._finished = True


class TextWriter:
    """The report for people: the boot, warnings, every entry that is not simply kept."""

    def __init__(self, out: TextIO, verbose: bool = False) -> None:
        self._out = out
        self._verbose = verbose
        self._started = False
        self._shorthand: Shorthand | None = None
        self._warned = 0  # how many of the run's warnings the head of the report says

    def _write(self, lines: list[str]) -> None:
        """Every line the report writes goes through here: file names, plugin errors, config
        strings and paths are outside text, escaped here so that no field can forget it."""
        self._out.write(printable_lines(lines))

    def _start(self, report: Report) -> None:
        if not self._started:
            self._started = True
            self._shorthand = Shorthand(report.boot, report.proof)
            self._warned = len(report.warnings)
            mode = "dry run, nothing changed" if report.dry_run else "run"
            proof = [f"  {report.proof.summary}"] if report.proof is not None else []
            self._write(
                [
                    f"cni-reaper {__version__} ({mode}): {report.results_dir}",
                    f"  {boot_line(report.boot)}",
                    *witness_lines(report.boot),
                    *proof,
                    *(f"  conf dir {d.describe()}" for d in report.conf_dirs),
                    *(f"  plugin dir {d.describe()}" for d in report.bin_dirs),
                    *(f"  runtime records: {line}" for line in report.runtime_records),
                    *(
                        f"  runtime path: {p.describe()}"
                        for p in (report.runtime_paths if self._verbose else ())
                    ),
                    *(f"  warning: {warning}" for warning in report.warnings),
                ]
            )

    def entry(self, report: Report, result: EntryResult) -> None:
        self._start(report)
        if result.planned.action is not Action.KEEP or self._verbose:
            self._write(entry_lines(result, self._verbose, self._shorthand))

    def reservation(self, report: Report, r: dict[str, Any]) -> None:
        """A host-local reservation, as it is decided: after every entry, before the pools."""
        self._start(report)
        lines: list[str] = []
        owner = r.get("owner")
        whose = f" of {owner['container_id']} {owner['ifname'] or ''}".rstrip() if owner else ""
        lines.append(
            f"{r['path']}: host-local reservation {r['content']}{whose}, "
            f"{r['written']} -> {r['action']} [{r['outcome']}]"
        )
        lines.append(f"    why: {r['reason']}")
        done = r.get("del")
        if done:
            source = f"from {done['config']}" if done["config"] else "with no config"
            line = f"    DEL {r['network']} as {done['ifname']} {source}"
            if "plugins_run" in done:  # it ran, or was tried
                line += f": {', '.join(done['plugins_run']) or 'no plugin run'}"
            lines.append(line)
            if r["outcome"] == "planned" and done["config_problem"]:
                lines.append(f"    DEL will fail: {done['config_problem']}")
            lines.extend(f"    error: {error}" for error in doc_error_texts(done))
        if r.get("problem"):
            lines.append(f"    problem: {r['problem']}")
        if r["quarantined_to"]:
            lines.append(f"    moved to {r['quarantined_to']}")
        self._write(lines)

    def finish(self, report: Report) -> None:
        self._start(report)
        lines = []
        multus = [(DELEGATE_RESULT, d) for d in report.delegates]
        multus.extend((SCRATCH_FILE, d) for d in report.scratch)
        for kind, d in multus:
            if d["action"] == "keep" and not self._verbose:
                continue
            lines.append(
                f"{d['path']}: {kind.called} {d['content']}, {d['written']} -> "
                f"{d['action']} [{d['outcome']}]"
            )
            lines.append(f"    why: {d['reason']}")
            if d["problem"]:
                lines.append(f"    problem: {d['problem']}")
            if d["quarantined_to"]:
                lines.append(f"    moved to {d['quarantined_to']}")
        # Warnings of the stages after the head was written (the pools' read of their configs).
        lines.extend(f"warning: {warning}" for warning in report.warnings[self._warned :])
        ranged = {p.network for p in report.pools if p.range_set.number >= 0}
        lines.extend(pool_line(p, report.dry_run, p.network in ranged) for p in report.pools)
        s = report.summary()
        counts = ", ".join(f"{n} {k}" for k, n in s["content"].items()) or "none"
        actions = ", ".join(f"{n} {k}" for k, n in s["action"].items()) or "nothing to do"
        if report.in_all is not None:
            lines.append(f"took {report.in_all:.3f} s, {plan_phrase(report)}")
        lines.append(
            f"summary: {s['entries']} entries ({counts}); {actions}; {report.repairs()}; "
            f"exit {s['exit_code']}"
        )
        self._write(lines)


def plan_phrase(report: Report) -> str:
    if report.to_plan is None:
        return "never reaching a whole plan"
    return f"{report.to_plan:.3f} s of it until the plan was made, before any change"


def pool_line(p: PoolHealth, dry_run: bool = False, ranged: bool = True) -> str:
    """A dry run releases nothing: its count is of the addresses a real run would release.
    ranged: whether any range of the network is known (a config of it with host-local's
    ranges was read; the run's warnings say why not)."""
    if p.range_set.number >= 0:
        which = f"range set {p.range_set.number}: {p.capacity} addresses,"
    elif ranged:
        which = "outside every range:"
    else:
        which = "of no range known:"
    owners = ", ".join(f"{n} {state}" for state, n in sorted(p.left.items()))
    released = "to release" if dry_run else "released"
    return (
        f"pool {p.network} {which} {p.reserved_before} reserved before, "
        f"{p.released} {released}, {p.left_total} left{f' ({owners})' if owners else ''}"
    )


def boot_line(boot: BootContext) -> str:
    start = iso(boot.current_start) if boot.current_start else "unknown"
    line = f"boot {boot.boot_id or '?'} began {start} ({boot.current_start_source})"
    prev = boot.previous_boot
    verdict = boot.previous_boot_verdict
    ended = {None: "ended unknown", True: "crashed", False: "shut down cleanly"}[verdict.crashed]
    said = f", as the {verdict.decided_by} says" if verdict.decided_by else ""
    # Only the boot records name previous boots; the other witnesses say how one ended.
    records = " or ".join(
        s for s, says in boot.witnesses if says != "not found" and s in ("wtmp", "wtmpdb")
    )
    if prev is None:
        if verdict.crashed is None:
            found = f"no earlier boot in {records}" if records else "no wtmp or wtmpdb found"
            return f"{line}; {found}"
        return line + f"; previous boot {ended}{said}"
    return line + f"; previous boot began {iso(prev.start)} ({boot.boots_source}) and {ended}{said}"


def witness_lines(boot: BootContext) -> list[str]:
    """Each witness of how the previous boot ended, and what it says; those not consulted
    here say why."""
    verdict = boot.previous_boot_verdict
    lines = [
        f"  witness {a.witness}: {a.ended if a.consulted else 'not consulted'} ({a.says})"
        for a in verdict.accounts
    ]
    if verdict.disagreement:
        lines.append(f"  witnesses disagree: {verdict.disagreement}")
    return lines


class Shorthand:
    """A file's written evidence as the text report shows it: what every file of the run, or
    of one earlier boot, has in its evidence is said once, and each file's line names it in a
    few words. The header says this boot's start and its pre-runtime record; an earlier boot is
    said at the first file it wrote, the previous one in the header already. The JSON report
    and the sidecars keep every file's evidence whole."""

    def __init__(self, boot: BootContext, proof: Proof | None) -> None:
        self._boots = boot.previous_boots
        # (as the evidence says it, as a line says it), for what the header says
        self._run_wide: list[tuple[str, str]] = []
        if boot.current_start is not None:
            began = boot_began(boot.current_start, boot.current_start_source)
            self._run_wide.append((began, "this boot's start"))
        if proof is not None:
            if proof.record is not None:
                # Only the run that takes the record says FOUND; by the time a real run
                # reports, the record is saved, and the header says when it was taken.
                self._run_wide.append((FOUND, "in the pre-runtime record this run took"))
            else:
                self._run_wide.append((no_record(proof.why_missing), "no pre-runtime record"))
        self._named: dict[Boot, str] = {}

    def evidence(self, written: WrittenVerdict) -> list[str]:
        """The evidence line, and before it, the first time an earlier boot is named, what
        that boot was."""
        text = written.evidence
        for phrase, short in self._run_wide:
            text = text.replace(phrase, short)
        lines: list[str] = []
        boot = written.writing_boot
        if boot is not None:
            phrase = written_in(boot)
            if phrase in text:
                name = self._named.get(boot)
                if name is None:
                    name = self._named[boot] = self._name(boot, lines)
                text = text.replace(phrase, f"in {name}")
        lines.append(f"    written: {text}")
        return lines

    def _name(self, boot: Boot, lines: list[str]) -> str:
        back = len(self._boots) - self._boots.index(boot)
        if back == 1:
            return "the previous boot"  # the header's boot line says what it was
        if boot.end is BootEnd.CRASHED:
            ended = "crashed (no shutdown record before the next boot)"
        else:
            ended = f"shut down cleanly at {iso(boot.shutdown or boot.last_record)}"
        lines.append(f"    boot -{back} ({boot.source}): began {iso(boot.start)}, {ended}")
        return f"boot -{back}"


def entry_lines(
    result: EntryResult, verbose: bool, shorthand: Shorthand | None = None
) -> list[str]:
    """An entry in the text report, its lines unescaped: the writer escapes them."""
    planned = result.planned
    entry = planned.entry
    lines = [
        f"{entry.name}: {entry.content.value} ({entry.verdict.detail}), "
        f"{planned.written.written.value} -> {planned.action.value} [{result.outcome.value}]"
    ]
    lines.append(f"    why: {planned.reason}")
    if verbose or planned.action.changes_things:
        if shorthand is not None:
            lines.extend(shorthand.evidence(planned.written))
        else:
            lines.append(f"    written: {planned.written.evidence}")
    if planned.action is Action.DEL_AND_QUARANTINE:
        netlist, chain = planned.netlist, planned.chain
        if netlist is not None:
            if chain is not None:
                order = ", ".join(p.kind if p.path else f"{p.kind} (none)" for p in chain.plugins)
            else:
                order = ", ".join(reversed(netlist.plugin_types))
            done = result.del_outcome
            if result.outcome is Outcome.PLANNED:
                ran = ""
            elif done is None:
                ran = " (not run)"  # the file changed since the scan, or the run was cut short
            else:
                ran = f" (ran: {', '.join(done.plugins_run) or 'none'}"
                ran += f"; released {', '.join(done.released)})" if done.released else ")"
            lines.append(f"    DEL {netlist.name} from {netlist.source}: {order}{ran}")
        if planned.config_problem and result.outcome is Outcome.PLANNED:
            # Once run, the DEL's error line says it.
            lines.append(f"    DEL will fail: {planned.config_problem}")
    if result.del_outcome is not None:
        lines.extend(f"    error: {error}" for error in result.del_outcome.error_texts())
    lines.extend(f"    problem: {problem}" for problem in result.problems)
    if result.quarantined_to:
        lines.append(f"    moved to {result.quarantined_to}")
    return lines
