"""What became of one cache entry: the per-entry record the report and the sidecars share."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Iterator

from cni_reaper.boot import Boot, BootEnd, iso
from cni_reaper.choice import Choice
from cni_reaper.plan import Action, PlannedEntry
from cni_reaper.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cni_reaper.netconf import NetworkList

    # Only real runs replay DEL; a dry run never loads the plugin machinery.
    from cni_reaper.plugin import ChainResolution, PluginError
    from cni_reaper.repair.replay import DelOutcome


class Outcome(str, Choice):
    DONE = "done"
    PLANNED = "planned"
    FAILED = "failed"
    SKIPPED = "skipped"


class EntryResult(Record):
    planned: PlannedEntry
    outcome: Outcome
    del_outcome: DelOutcome | None = None
    quarantined_to: str | None = None
    problems: tuple[str, ...] = ()

    @property
    def plugin_errors(self) -> tuple[PluginError, ...]:
        return self.del_outcome.errors if self.del_outcome else ()

    def to_json(self) -> dict[str, Any]:
        """One entry of the JSON report (schema 1), as the sidecars hold it."""
        doc: dict[str, Any] = json.loads(self.json_text())
        return doc

    def json_text(self) -> str:
        """One entry of the JSON report (schema 1), compact, on one line.

        The schema is written here once, as text with its keys already quoted: a run writes
        one per cache file, and building a dict for the generic encoder took as long as
        reading and decoding the file did.
        """
        planned = self.planned
        entry = planned.entry
        file = entry.file
        split = entry.split
        written = planned.written
        evidence, writing_boot, seconds_before_last_record = written.said()
        if split is None:
            names = '"network":null,"container_id":null,"ifname":null'
        else:
            names = (
                f'"network":{_string(split.network)},"container_id":{_string(split.container_id)},'
                f'"ifname":{_string(split.ifname)}'
            )
        if writing_boot is None:
            boot = "null"
        else:
            boot = f"{_boot_json(writing_boot)}{seconds_before_last_record!r}}}"
        if self.del_outcome is None and self.quarantined_to is None and not self.problems:
            done = '"plugin_errors":[],"quarantined_to":null,"problems":[]}'
        else:
            done = (
                f'"plugin_errors":{_quote([e.to_json() for e in self.plugin_errors])},'
                f'"quarantined_to":{_json(self.quarantined_to)},'
                f'"problems":{_quote(self.problems)}}}'
            )
        return (
            f'{{"path":{_string(entry.name)},{names},"name_problem":{_json(entry.name_problem)},'
            f'"file":{{"kind":"{file.kind}","size":{file.size},"mtime":"{iso(file.mtime)}",'
            f'"ctime":"{iso(file.ctime)}"}},"content":"{entry.verdict.content.value}",'
            f'"content_detail":{_string(entry.verdict.detail)},'
            f'"written":"{written.written.value}","evidence":{_string(evidence)},'
            f'"writing_boot":{boot},"action":"{planned.action.value}",'
            f'"reason":{_string(planned.reason)},'
            f'"del":{"null" if planned.action is not Action.DEL_AND_QUARANTINE else self._del()},'
            f'"outcome":"{self.outcome.value}",{done}'
        )

    def _del(self) -> str:
        planned = self.planned
        del_outcome = self.del_outcome
        if del_outcome is None:
            ran = '"plugins_run":[],"released":[],"ok":null}'
        else:
            ok = "true" if del_outcome.ok else "false"
            ran = (
                f'"plugins_run":{_quote(del_outcome.plugins_run)},'
                f'"released":{_quote(del_outcome.released)},"ok":{ok}}}'
            )
        return _del_config(planned.netlist, planned.config_problem, planned.chain) + ran


_DEL_CONFIGS: dict[
    tuple[int, int, str | None], tuple[NetworkList | None, ChainResolution | None, str]
] = {}


def _del_config(
    netlist: NetworkList | None, problem: str | None, chain: ChainResolution | None
) -> str:
    """The opening of an entry's "del" object, up to what ran: the same for every file of a
    network, and quoting its config anew for each cost as much as the rest of the entry. Kept
    by the identity of the config and its chain, with both, so that no other reuses it."""
    key = (id(netlist), id(chain), problem)
    cached = _DEL_CONFIGS.get(key)
    if cached is not None and cached[0] is netlist and cached[1] is chain:
        return cached[2]
    config = {
        "config": netlist.source if netlist else None,
        "config_problem": problem,
        "plugins": list(reversed(netlist.plugin_types)) if netlist else [],
        "chain": chain.to_json()["plugins"] if chain is not None else [],
    }
    text = _quote(config)[:-1] + ","
    if len(_DEL_CONFIGS) >= 256:
        _DEL_CONFIGS.clear()
    _DEL_CONFIGS[key] = (netlist, chain, text)
    return text


# Compact and ASCII-only, as the whole report is. A string is quoted by the function the
# encoder itself calls for one (its own call is the slower part of quoting a short name).
_quote = json.JSONEncoder(separators=(",", ":")).encode
_string = json.encoder.encode_basestring_ascii


@functools.lru_cache(maxsize=64)
def _boot_json(boot: Boot) -> str:
    """A writing boot's object, open at its last value: the same few boots write most files."""
    crashed = "true" if boot.end is BootEnd.CRASHED else "false"
    return f'{{"start":"{iso(boot.start)}","crashed":{crashed},"seconds_before_last_record":'


def _json(value: str | None) -> str:
    # None skips the generic encoder's set-up, which costs more than quoting a string.
    return "null" if value is None else _string(value)


def dry_run(plan: Iterable[PlannedEntry]) -> Iterator[EntryResult]:
    """The plan as a dry run reports it: what would change is `planned`, the rest `skipped`."""
    return map(_dry_run_result, plan)


def _dry_run_result(planned: PlannedEntry) -> EntryResult:
    return EntryResult(planned, _DRY_RUN_OUTCOMES[planned.action])


_DRY_RUN_OUTCOMES = {
    action: Outcome.PLANNED if action.changes_things else Outcome.SKIPPED for action in Action
}
