"""What became of one cache entry: the per-entry record the report and the sidecars share."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from enum import Enum
from typing import TYPE_CHECKING, Any, NamedTuple

from cni_reaper.boot import BootEnd, iso
from cni_reaper.plan import Action, PlannedEntry

if TYPE_CHECKING:
    # Only real runs replay DEL; a dry run never loads the plugin machinery.
    from cni_reaper.plugin import PluginError
    from cni_reaper.replay import DelOutcome


class Outcome(str, Enum):
    DONE = "done"
    PLANNED = "planned"
    FAILED = "failed"
    SKIPPED = "skipped"


class EntryResult(NamedTuple):
    planned: PlannedEntry
    outcome: Outcome
    del_outcome: DelOutcome | None = None
    quarantined_to: str | None = None
    problems: tuple[str, ...] = ()

    @property
    def plugin_errors(self) -> tuple[PluginError, ...]:
        return self.del_outcome.errors if self.del_outcome else ()

    def to_json(self) -> dict[str, Any]:
        """One entry of the JSON report (schema 1)."""
        planned = self.planned
        entry = planned.entry
        split = entry.split
        written = planned.written
        netlist = planned.netlist
        writing_boot = written.writing_boot
        return {
            "path": entry.name,
            "network": split.network if split else None,
            "container_id": split.container_id if split else None,
            "ifname": split.ifname if split else None,
            "name_problem": entry.name_problem,
            "file": {
                "kind": entry.file.kind,
                "size": entry.file.size,
                "mtime": iso(entry.file.mtime),
                "ctime": iso(entry.file.ctime),
            },
            "content": entry.content.value,
            "content_detail": entry.verdict.detail,
            "written": written.written.value,
            "evidence": written.evidence,
            "writing_boot": None
            if writing_boot is None
            else {
                "start": iso(writing_boot.start),
                "crashed": writing_boot.end is BootEnd.CRASHED,
                "seconds_before_last_record": written.seconds_before_last_record,
            },
            "action": planned.action.value,
            "reason": planned.reason,
            "del": None
            if planned.action is not Action.DEL_AND_QUARANTINE
            else {
                "config": netlist.source if netlist else None,
                "config_problem": planned.config_problem,
                "plugins": list(reversed(netlist.plugin_types)) if netlist else [],
                "plugins_run": list(self.del_outcome.plugins_run) if self.del_outcome else [],
                "ok": self.del_outcome.ok if self.del_outcome else None,
            },
            "outcome": self.outcome.value,
            "plugin_errors": [e.to_json() for e in self.plugin_errors],
            "quarantined_to": self.quarantined_to,
            "problems": list(self.problems),
        }


def dry_run(plan: Iterable[PlannedEntry]) -> Iterator[EntryResult]:
    """The plan as a dry run reports it: what would change is `planned`, the rest `skipped`."""
    for planned in plan:
        outcome = Outcome.PLANNED if planned.action.changes_things else Outcome.SKIPPED
        yield EntryResult(planned, outcome)
