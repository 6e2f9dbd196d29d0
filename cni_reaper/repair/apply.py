"""Carrying out a plan: the only stage that runs plugins or changes anything on disk."""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator

from cni_reaper.content import same_damage
from cni_reaper.host_local import Releases, seen_released, unreleased
from cni_reaper.plan import Action, PlannedEntry
from cni_reaper.plugin import PluginError
from cni_reaper.record import Record
from cni_reaper.repair.outcome import EntryResult, Outcome
from cni_reaper.repair.parallel import TICK_SECONDS, in_parallel
from cni_reaper.repair.quarantine import FileChanged, Move, Quarantine, failed_move, sidecar_text
from cni_reaper.repair.replay import Attachment, DelOutcome, DelTools


class Executor(Record):
    results_fd: int
    quarantine: Quarantine
    clock_now: float
    releases: Releases  # what host-local holds, to check that a DEL released it
    tools: DelTools


def execute(plan: Iterable[PlannedEntry], executor: Executor) -> Iterator[EntryResult]:
    """Entries without a DEL are done (or skipped) in order as the plan streams by. DELs are
    gathered by network and, with more than one worker, replayed network by network in
    parallel: never two DELs of one network at once, as a runtime never runs them. A DEL the
    plan knows fails before any plugin runs (no config, a plugin missing) is not gathered: it
    is done in order, and its file quarantined as the plan streams by, not held in memory
    with the others until the scan is over. Files are quarantined in batches (see
    _in_batches)."""
    by_network: dict[str, list[PlannedEntry]] = defaultdict(list)

    def in_order() -> Iterator[_Replayed]:
        for planned in plan:
            if (
                planned.action is Action.DEL_AND_QUARANTINE
                and executor.tools.workers > 1
                and planned.netlist is not None
                and planned.config_problem is None
            ):
                by_network[planned.netlist.name if planned.netlist else ""].append(planned)
            elif planned.action.changes_things:
                yield planned, _replay(planned, executor)
            else:
                yield planned, EntryResult(planned, Outcome.SKIPPED)

    yield from _in_batches(in_order(), executor)
    if by_network:
        replayed = in_parallel(
            list(by_network.values()),
            lambda planned: _replay(planned, executor),
            executor.tools.workers,
        )
        yield from _in_batches(replayed, executor)
    executor.quarantine.flush()


_Replayed = tuple[PlannedEntry, "EntryResult | DelOutcome | None"]

# Files are quarantined in batches, their sidecars fsynced together: one at a time, every
# file cost a journal commit. A batch closes at this many files, or this long after its first
# DEL returned, so that results still come in while DELs go on.
BATCH_FILES = 64


def _in_batches(replayed: Iterable[_Replayed | None], executor: Executor) -> Iterator[EntryResult]:
    """The results of replayed entries, quarantined a batch at a time. None from replayed is
    a tick: nothing new, but a batch that has waited long enough is closed."""
    batch: list[_Replayed] = []
    opened = 0.0
    for item in replayed:
        if item is not None:
            if not batch:
                opened = time.monotonic()
            batch.append(item)
        if batch and (len(batch) >= BATCH_FILES or time.monotonic() - opened >= TICK_SECONDS):
            yield from _quarantine(batch, executor)
            batch = []
    yield from _quarantine(batch, executor)


def _unchanged(planned: PlannedEntry, results_fd: int) -> str | None:
    """Why the file may no longer be touched, if it changed since the inventory."""
    try:
        st = os.stat(planned.entry.name, dir_fd=results_fd, follow_symlinks=False)
    except FileNotFoundError:
        return "gone since the scan"
    if not planned.entry.file.same_file(st):
        return "changed since the scan; left for the next run"
    return None


def _replay(planned: PlannedEntry, ex: Executor) -> EntryResult | DelOutcome | None:
    """The DEL, if the plan has one: its outcome; a result already if the file changed since
    the scan and is not to be touched."""
    changed = _unchanged(planned, ex.results_fd)
    if changed:
        return EntryResult(planned, Outcome.SKIPPED, problems=(changed,))
    if planned.action is not Action.DEL_AND_QUARANTINE:
        return None
    split = planned.entry.split
    assert split is not None
    if planned.netlist is None or planned.config_problem is not None:
        # The plan knows this DEL fails, and how: the real run fails it as the dry run said.
        problem = planned.config_problem or "no network config"
        failing = planned.chain.failing if planned.chain is not None else None
        return DelOutcome((), (PluginError(failing.kind if failing else "", problem),))
    cached = planned.cached
    attachment = Attachment(
        split.container_id,
        split.ifname,
        cached.cni_args if cached is not None else (),
        cached.capability_args if cached is not None else None,
    )
    moved = ex.releases.scratch_changed(planned.netlist, split.container_id)
    if moved is not None:
        return EntryResult(planned, Outcome.SKIPPED, problems=(moved,))
    held = ex.releases.held_by(planned.netlist, split.container_id, split.ifname)
    outcome = ex.tools.delete(planned.netlist, attachment, planned.chain, planned.prev_result)
    if not outcome.ok or not held:
        return outcome
    # The effect the reaper can see: the plugins said done; host-local's stores must agree.
    still: list[str] = []
    released, left = seen_released(held, split.container_id, split.ifname, still)
    if left:
        errors = (unreleased(still),)
        return outcome._replace(errors=errors, released=tuple(released), left=tuple(left))
    return outcome._replace(released=tuple(released))


def _quarantine(batch: list[_Replayed], ex: Executor) -> list[EntryResult]:
    """Each file of the batch moved to the quarantine, whatever its DEL's outcome: a missing
    file lets the runtime's own DEL run. Entries already done pass through; a file that is no
    longer what the scan saw stays where it is."""
    results: list[EntryResult] = []
    moves: list[tuple[int, Move]] = []  # (index in results, the move)
    for planned, replayed in batch:
        if isinstance(replayed, EntryResult):
            results.append(replayed)
            continue
        outcome = Outcome.DONE if replayed is None or replayed.ok else Outcome.FAILED
        if replayed is not None and not replayed.attempted and planned.cached is not None:
            # A whole entry blocks no runtime's DEL; moved, it would take with it the cached
            # result, args and config that the DEL nobody else will run needs.
            results.append(EntryResult(planned, outcome, replayed, problems=(UNATTEMPTED,)))
            continue
        entry = planned.entry
        sidecar = _sidecar(planned, outcome, replayed, ex.clock_now)
        moves.append(
            (
                len(results),
                Move(ex.results_fd, entry.name, entry.file, sidecar, same_damage(entry.content)),
            )
        )
        results.append(EntryResult(planned, outcome, replayed))
    moved = ex.quarantine.move_all([move for _, move in moves])
    for (index, _), dest in zip(moves, moved):
        if isinstance(dest, FileChanged):
            results[index] = results[index]._replace(
                outcome=Outcome.SKIPPED, problems=(f"changed: {dest}; left for the next run",)
            )
        elif isinstance(dest, OSError):
            problem = failed_move(dest)
            results[index] = results[index]._replace(outcome=Outcome.FAILED, problems=(problem,))
        else:
            results[index] = results[index]._replace(quarantined_to=dest)
    return results


UNATTEMPTED = "its DEL was not attempted: left where it is, whole, for the next run's DEL"


def _sidecar(
    planned: PlannedEntry, outcome: Outcome, del_outcome: DelOutcome | None, now: float
) -> Callable[[str, str], str]:
    """The sidecar for a file about to be moved to dest: its report entry, plus the digest
    of the bytes that move, written from the entry's own text."""

    def for_dest(dest: str, sha256: str) -> str:
        entry = EntryResult(planned, outcome, del_outcome, dest).json_text()
        return sidecar_text(entry, sha256, now)

    return for_dest
