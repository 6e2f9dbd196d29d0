"""What a run found and did: the JSON document (schema 1), the text report, the exit code."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, TextIO

from cni_reaper import __version__
from cni_reaper.boot import BootContext, iso
from cni_reaper.cache import printable
from cni_reaper.errors import ExitCode
from cni_reaper.outcome import EntryResult, Outcome
from cni_reaper.plan import Action
from cni_reaper.shutdown_marker import ShutdownState

SCHEMA_VERSION = 1


@dataclass
class Report:
    boot: BootContext
    dry_run: bool
    results_dir: str
    warnings: list[str] = field(default_factory=list)
    results: list[EntryResult] = field(default_factory=list)

    @property
    def exit_code(self) -> ExitCode:
        if any(r.outcome is Outcome.FAILED for r in self.results):
            return ExitCode.ACTION_FAILED
        for r in self.results:
            if r.planned.action in (Action.LEAVE, Action.REPORT):
                return ExitCode.DATA
            if r.planned.action.changes_things and r.outcome is Outcome.SKIPPED:
                return ExitCode.DATA
        return ExitCode.OK

    def summary(self) -> dict[str, Any]:
        return {
            "entries": len(self.results),
            "content": dict(
                sorted(Counter(r.planned.entry.content.value for r in self.results).items())
            ),
            "action": dict(sorted(Counter(r.planned.action.value for r in self.results).items())),
            "outcome": dict(sorted(Counter(r.outcome.value for r in self.results).items())),
            "plugin_errors": sum(len(r.plugin_errors) for r in self.results),
            "exit_code": int(self.exit_code),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_VERSION,
            "version": __version__,
            "dry_run": self.dry_run,
            "results_dir": self.results_dir,
            "boot": self.boot.to_json(),
            "warnings": list(self.warnings),
            "entries": [r.to_json() for r in self.results],
            "summary": self.summary(),
        }

    def write_json(self, out: TextIO) -> None:
        json.dump(self.to_json(), out, indent=2)
        out.write("\n")

    def write_text(self, out: TextIO, verbose: bool = False) -> None:
        mode = "dry run, nothing changed" if self.dry_run else "run"
        out.write(f"cni-reaper {__version__} ({mode}): {self.results_dir}\n")
        out.write(f"  {boot_line(self.boot)}\n")
        for warning in self.warnings:
            out.write(f"  warning: {printable(warning)}\n")
        for result in self.results:
            if result.planned.action is Action.KEEP and not verbose:
                continue
            out.write(entry_text(result, verbose))
        s = self.summary()
        counts = ", ".join(f"{n} {k}" for k, n in s["content"].items()) or "none"
        actions = ", ".join(f"{n} {k}" for k, n in s["action"].items()) or "nothing to do"
        out.write(f"summary: {s['entries']} entries ({counts}); {actions}; exit {s['exit_code']}\n")


def boot_line(boot: BootContext) -> str:
    start = iso(boot.current_start) if boot.current_start else "unknown"
    line = f"boot {boot.boot_id or '?'} began {start} ({boot.current_start_source})"
    prev = boot.previous_boot
    crashed = boot.previous_boot_crashed
    ended = {None: "ended unknown", True: "crashed", False: "shut down cleanly"}[crashed]
    marker = boot.shutdown
    source = ""
    if marker is not None and marker.state is not ShutdownState.UNKNOWN:
        source = f" (clean-shutdown marker: {marker.state.value} for boot {marker.boot_id})"
    if prev is None:
        if crashed is None:
            return line + "; no earlier boot in wtmp"
        return line + f"; previous boot {ended}{source}"
    return line + f"; previous boot began {iso(prev.start)} and {ended}{source}"


def entry_text(result: EntryResult, verbose: bool) -> str:
    planned = result.planned
    entry = planned.entry
    lines = [
        f"{entry.shown_name}: {entry.content.value} ({entry.verdict.detail}), "
        f"{planned.written.written.value} -> {planned.action.value} [{result.outcome.value}]"
    ]
    lines.append(f"    why: {printable(planned.reason)}")
    if verbose or planned.action.changes_things:
        lines.append(f"    written: {planned.written.evidence}")
    if planned.action is Action.DEL_AND_QUARANTINE:
        netlist = planned.netlist
        if netlist is not None:
            order = ", ".join(reversed(netlist.plugin_types))
            lines.append(f"    DEL {printable(netlist.name)} from {netlist.source}: {order}")
        elif planned.config_problem:
            lines.append(f"    DEL impossible: {printable(planned.config_problem)}")
    lines.extend(f"    error: {printable(str(error))}" for error in result.plugin_errors)
    lines.extend(f"    problem: {printable(problem)}" for problem in result.problems)
    if result.quarantined_to:
        lines.append(f"    moved to {printable(result.quarantined_to)}")
    return "".join(line + "\n" for line in lines)
