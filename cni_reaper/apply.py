"""Carrying out a plan: the only stage that runs plugins or changes anything on disk."""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, NamedTuple

from cni_reaper.outcome import EntryResult, Outcome
from cni_reaper.plan import Action, PlannedEntry
from cni_reaper.plugin import PluginError, PluginRunner
from cni_reaper.quarantine import Quarantine, QuarantineError, sha256_of, sidecar
from cni_reaper.replay import Attachment, DelOutcome, delete


class Executor(NamedTuple):
    results_fd: int
    runner: PluginRunner
    bin_dirs: Sequence[str]
    plugin_timeout: float
    quarantine: Quarantine
    clock_now: float
    workers: int = 1  # DEL replays at once, each of a different network
    inherited_env: Mapping[str, str] | None = None  # for the plugins; None: taken per DEL


def execute(plan: Iterable[PlannedEntry], executor: Executor) -> Iterator[EntryResult]:
    """Entries without a DEL are done (or skipped) in order as the plan streams by. DELs are
    gathered by network and, with more than one worker, replayed network by network in
    parallel: never two DELs of one network at once, as a runtime never runs them."""
    by_network: dict[str, list[PlannedEntry]] = defaultdict(list)
    for planned in plan:
        if planned.action is Action.DEL_AND_QUARANTINE and executor.workers > 1:
            by_network[planned.netlist.name if planned.netlist else ""].append(planned)
        elif planned.action.changes_things:
            yield _repair(planned, executor)
        else:
            yield EntryResult(planned, Outcome.SKIPPED)
    if by_network:
        yield from _replay_in_parallel(by_network, executor)
    executor.quarantine.flush()


def _replay_in_parallel(
    by_network: dict[str, list[PlannedEntry]], executor: Executor
) -> Iterator[EntryResult]:
    executor.quarantine.open()  # once, before the threads share it

    def replay(group: list[PlannedEntry]) -> list[EntryResult]:
        return [_repair(planned, executor) for planned in group]

    workers = min(executor.workers, len(by_network))
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="del") as pool:
        for done in as_completed([pool.submit(replay, g) for g in by_network.values()]):
            yield from done.result()


def _unchanged(planned: PlannedEntry, results_fd: int) -> str | None:
    """Why the file may no longer be touched, if it changed since the inventory."""
    try:
        st = os.stat(planned.entry.name, dir_fd=results_fd, follow_symlinks=False)
    except FileNotFoundError:
        return "gone since the scan"
    if not planned.entry.file.same_file(st):
        return "changed since the scan; left for the next run"
    return None


def _repair(planned: PlannedEntry, ex: Executor) -> EntryResult:
    entry = planned.entry
    changed = _unchanged(planned, ex.results_fd)
    if changed:
        return EntryResult(planned, Outcome.SKIPPED, problems=(changed,))
    del_outcome: DelOutcome | None = None
    if planned.action is Action.DEL_AND_QUARANTINE:
        assert entry.split is not None
        if planned.netlist is None:
            problem = planned.config_problem or "no network config"
            del_outcome = DelOutcome((), (PluginError("", problem),))
        else:
            attachment = Attachment(entry.split.container_id, entry.split.ifname)
            del_outcome = delete(
                planned.netlist,
                attachment,
                ex.runner,
                ex.bin_dirs,
                ex.plugin_timeout,
                ex.inherited_env,
            )
    outcome = Outcome.DONE if del_outcome is None or del_outcome.ok else Outcome.FAILED
    # Quarantine even when DEL failed: a missing file lets the runtime's own DEL run.
    sha256 = sha256_of(ex.results_fd, entry.name)
    sidecar = _sidecar(planned, outcome, del_outcome, sha256, ex.clock_now)
    try:
        dest = ex.quarantine.move(ex.results_fd, entry.name, sidecar, sha256)
    except (QuarantineError, OSError) as e:
        return EntryResult(
            planned, Outcome.FAILED, del_outcome, problems=(f"quarantine: {e.strerror or e}",)
        )
    return EntryResult(planned, outcome, del_outcome, dest)


def _sidecar(
    planned: PlannedEntry,
    outcome: Outcome,
    del_outcome: DelOutcome | None,
    sha256: str | None,
    now: float,
) -> Callable[[str], dict[str, Any]]:
    """The sidecar for a file about to be moved to dest: its report entry, plus its digest."""

    def for_dest(dest: str) -> dict[str, Any]:
        return sidecar(EntryResult(planned, outcome, del_outcome, dest).to_json(), sha256, now)

    return for_dest
