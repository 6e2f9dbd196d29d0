"""Carrying out a plan: the only stage that runs plugins or changes anything on disk."""

from __future__ import annotations

import os
import queue
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
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
    inherited_env: Mapping[str, str]  # for the plugins, taken once per run
    workers: int = 1  # DEL replays at once, each of a different network


def execute(plan: Iterable[PlannedEntry], executor: Executor) -> Iterator[EntryResult]:
    """Entries without a DEL are done (or skipped) in order as the plan streams by. DELs are
    gathered by network and, with more than one worker, replayed network by network in
    parallel: never two DELs of one network at once, as a runtime never runs them."""
    by_network: dict[str, list[PlannedEntry]] = defaultdict(list)
    for planned in plan:
        if planned.action is Action.DEL_AND_QUARANTINE and executor.workers > 1:
            by_network[planned.netlist.name if planned.netlist else ""].append(planned)
        elif planned.action.changes_things:
            yield _quarantine(planned, _replay(planned, executor), executor)
        else:
            yield EntryResult(planned, Outcome.SKIPPED)
    if by_network:
        yield from _replay_in_parallel(list(by_network.values()), executor)
    executor.quarantine.flush()


_Replayed = tuple[PlannedEntry, "EntryResult | DelOutcome | None"]
_WORKER_DONE = None


def _replay_in_parallel(
    groups: list[list[PlannedEntry]], executor: Executor
) -> Iterator[EntryResult]:
    """Worker threads replay the DELs, a network at a time each; this thread quarantines each
    file as its DEL returns. A worker goes straight on to its network's next DEL: the
    sidecar's fsync and the move never stand between two plugins."""
    pending: queue.SimpleQueue[list[PlannedEntry]] = queue.SimpleQueue()
    for group in groups:
        pending.put(group)
    replayed: queue.SimpleQueue[_Replayed | None] = queue.SimpleQueue()
    failures: list[BaseException] = []
    stop = threading.Event()  # set when this side gives up: workers start no further DEL

    def worker() -> None:
        try:
            while not stop.is_set():
                try:
                    group = pending.get_nowait()
                except queue.Empty:
                    return
                for planned in group:
                    if stop.is_set():
                        return
                    replayed.put((planned, _replay(planned, executor)))
        except BaseException as e:  # a bug: raised again below, once every worker is done
            failures.append(e)
        finally:
            replayed.put(_WORKER_DONE)

    threads = [
        threading.Thread(target=worker, name=f"del-{n}", daemon=True)
        for n in range(min(executor.workers, len(groups)))
    ]
    for thread in threads:
        thread.start()
    try:
        running = len(threads)
        while running:
            item = replayed.get()
            if item is _WORKER_DONE:
                running -= 1
                continue
            planned, done = item
            yield _quarantine(planned, done, executor)
    finally:
        # Also when the caller stops early or a move raised: no plugin may outlive the run.
        stop.set()
        for thread in threads:
            thread.join()
    if failures:
        raise failures[0]


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
    if planned.netlist is None:
        problem = planned.config_problem or "no network config"
        return DelOutcome((), (PluginError("", problem),))
    attachment = Attachment(split.container_id, split.ifname)
    return delete(
        planned.netlist, attachment, ex.runner, ex.bin_dirs, ex.plugin_timeout, ex.inherited_env
    )


def _quarantine(
    planned: PlannedEntry, replayed: EntryResult | DelOutcome | None, ex: Executor
) -> EntryResult:
    if isinstance(replayed, EntryResult):
        return replayed
    del_outcome = replayed
    outcome = Outcome.DONE if del_outcome is None or del_outcome.ok else Outcome.FAILED
    # Quarantine even when DEL failed: a missing file lets the runtime's own DEL run.
    name = planned.entry.name
    sha256 = sha256_of(ex.results_fd, name)
    sidecar = _sidecar(planned, outcome, del_outcome, sha256, ex.clock_now)
    try:
        dest = ex.quarantine.move(ex.results_fd, name, sidecar, sha256)
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
