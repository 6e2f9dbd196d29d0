"""Releasing the addresses nobody else will: an orphan's DEL, then host-local's own lock and the
quarantine for what no DEL released. Part of the repair stage: only real runs come here.

An orphan's DEL runs through its network's config with its owner's container ID and ifname
and no cached result, as every DEL of this reaper does; its effect is checked in the store.
What a DEL leaves, or could not try, is moved to quarantine/<boot>/host-local/<network>/ with
a sidecar, under host-local's lock so that no plugin reserves while it moves.
"""

from __future__ import annotations

import errno
import fcntl
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator

from cni_reaper.host_local import (
    Reservation,
    read_owner,
    read_reservation,
    seen_released,
    store_identity,
    unreleased,
)
from cni_reaper.multus import scratch_changed
from cni_reaper.plugin import PluginError
from cni_reaper.read_only import read_only_noted
from cni_reaper.repair.budget import Budget
from cni_reaper.repair.parallel import in_parallel
from cni_reaper.repair.quarantine import (
    FileChanged,
    Move,
    Quarantine,
    failed_move,
    sidecar,
)
from cni_reaper.repair.replay import Attachment, DelOutcome, DelTools
from cni_reaper.reservations import (
    PlannedReservation,
    ReservationAction,
    Settled,
    ThroughMultus,
    handed_over,
    released_before_its_del,
)
from cni_reaper.unopened import DIR_FLAGS, NotRegularFile, open_lock

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

# How often a lock someone else holds is tried again.
LOCK_RETRY_SECONDS = 0.05


class StoreLock:
    """host-local's own lock on the store, so no plugin reserves while a file is moved; waited
    for until the run's deadline at most (a plugin stuck in an ADD may hold it for ever)."""

    def __init__(self, store: str, budget: Budget) -> None:
        try:
            # Made where missing, as host-local makes it.
            self._fd = open_lock(os.path.join(store, "lock"), os.O_RDONLY)
        except NotRegularFile as e:
            raise OSError(errno.EINVAL, f"its lock is a {e.kind}, not a regular file") from None
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if budget.seconds_left() <= 0:
                    os.close(self._fd)
                    raise OSError(
                        errno.EWOULDBLOCK, "host-local's lock is held until the run's deadline"
                    ) from None
                time.sleep(min(LOCK_RETRY_SECONDS, budget.seconds_left()))
        self.dir_fd = os.open(store, DIR_FLAGS)

    def close(self) -> None:
        os.close(self.dir_fd)
        os.close(self._fd)


_GONE = "gone since the scan"


def _changed(p: PlannedReservation) -> str | None:
    """Why the reservation may no longer be touched, if it changed since the inventory."""
    try:
        st = os.stat(p.reservation.path, follow_symlinks=False)
    except FileNotFoundError:
        return _GONE
    except OSError as e:
        return f"cannot look at it again: {e.strerror}"
    return p.reservation.file.changes(st)


_NO_MULTUS = ThroughMultus((), ())


def _through_multus(items: list[PlannedReservation]) -> ThroughMultus:
    """What the DEL of items through Multus was planned on, as its own orphans found it (not
    one riding on it, which holds none); nothing for a DEL that runs no Multus."""
    return next((p.through_multus for p in items if p.through_multus), _NO_MULTUS)


def _still_owned(p: PlannedReservation) -> bool:
    """Whether the store still holds this address for the same owner."""
    r = p.reservation
    found = read_reservation(r.path)
    return found is not None and read_owner(found[1])[1] == r.owner


def _del_doc(outcome: DelOutcome, released: Iterable[str]) -> dict[str, Any]:
    return {
        "plugins_run": list(outcome.plugins_run),
        "plugin_errors": [e.to_json() for e in outcome.errors],
        "released": sorted(released),
        "ok": outcome.ok,
    }


_Key = tuple[str, str, str]  # network, container ID, ifname: one DEL each
_STILL_RESERVED_FAILED = "DEL failed, and the address is still reserved"
_STILL_RESERVED_NOT_RUN = "DEL not run, and the address is still reserved"
_STILL_RESERVED_RAN = "DEL ran, and the address is still reserved"


def settle(
    planned: Iterable[PlannedReservation],
    tools: DelTools,
    quarantine_dir: str,
    boot_id: str,
    now: float,
) -> Iterator[Settled]:
    """Each reservation that changes things settled: orphans DEL'd (an attachment at a time,
    networks in parallel), then whatever is still reserved moved to the quarantine."""
    to_move: list[Settled] = []
    attachments: dict[_Key, list[PlannedReservation]] = defaultdict(list)
    # Each config problem's DEL, made once, not once per reservation: as an entry's DEL that
    # cannot run (apply.py), one that failed with no plugin run.
    no_del: dict[str, dict[str, Any]] = {}
    for p in planned:
        if p.action is ReservationAction.QUARANTINE:
            to_move.append(Settled(p, "done"))
        elif p.config_problem is not None:
            doc = no_del.get(p.config_problem)
            if doc is None:
                failing = p.chain.failing if p.chain is not None else None
                error = PluginError(failing.kind if failing else "", p.config_problem)
                doc = no_del[p.config_problem] = _del_doc(DelOutcome((), (error,)), ())
            to_move.append(Settled(p, "done", del_doc=doc, problem=_STILL_RESERVED_NOT_RUN))
        else:
            r, netlist = p.reservation, p.netlist
            assert r.owner is not None and p.del_ifname is not None and netlist is not None
            # By the DEL's network, not the orphan's: one a delegating plugin's DEL releases
            # rides on it (reservations.claimed_or_riding).
            key = (netlist.name, r.owner.container_id, p.del_ifname)
            attachments[key].append(p)
    by_network: dict[str, list[tuple[_Key, list[PlannedReservation]]]] = defaultdict(list)
    for key, items in attachments.items():
        by_network[key[0]].append((key, items))

    witness = _Witness(attachments, tools.budget)
    # per DEL, its riders found gone before it ran, each with the DEL of this run that
    # released it (written by the DEL's own worker only)
    gone_before: dict[_Key, list[tuple[PlannedReservation, _Key]]] = {}

    def run_del(job: tuple[_Key, list[PlannedReservation]]) -> DelOutcome | str:
        key, items = job
        _, container_id, ifname = key
        for p in items:
            changed = _changed(p)
            if changed is None:
                continue
            if changed == _GONE and p.riding:
                # Released by another DEL of this run, or someone else is tearing the pod
                # down, and this DEL must not run now.
                by = witness.released_by(key, p.reservation)
                if by is not None:
                    gone_before.setdefault(key, []).append((p, by))
                    continue
            return f"{p.reservation.path} {changed}; left for the next run"
        moved = scratch_changed(_through_multus(items).scratch_seen)
        if moved is not None:
            return moved
        netlist, chain = items[0].netlist, items[0].chain
        assert netlist is not None
        witness.begin(key)
        done = False
        try:
            outcome = tools.delete(netlist, Attachment(container_id, ifname), chain)
            done = outcome.ok and outcome.attempted
        finally:
            witness.end(key, done)  # whatever happened: a DEL waiting on it goes on
        return outcome

    done = in_parallel(list(by_network.values()), run_del, tools.workers)
    docs: dict[_Key, dict[str, Any]] = {}  # each DEL's, as reported
    # Riders another DEL of this run released, reported as that DEL's once every DEL is
    # done, whatever became of the DEL they rode on.
    released_first: list[tuple[PlannedReservation, _Key]] = []
    for item in done:
        if item is None:
            continue
        (key, items), outcome = item
        gone = gone_before.get(key, [])
        released_first += gone
        present = [p for p in items if not any(p is g for g, _ in gone)]
        if isinstance(outcome, str):
            yield from (Settled(p, "skipped", problem=outcome) for p in present)
            continue
        left = [p for p in present if _still_owned(p)]
        released = [p.reservation.ip for p in present if p not in left]
        if outcome.ok:
            outcome = _checked(outcome, items, left, released, key[1])
        doc = docs[key] = _del_doc(outcome, released)
        for p in present:
            if p not in left:
                yield Settled(p, "done", del_doc=doc)
            elif not outcome.attempted:
                # The run's time was up: the next run DELs it, as this one would have. Why
                # is its DEL's error, said once.
                problem = "still reserved, left for the next run's DEL"
                yield Settled(p, "failed", del_doc=doc, problem=problem)
            else:
                # Its errors are in the DEL's own part of the report, and said once.
                if outcome.left:
                    problem = _STILL_RESERVED_RAN
                elif outcome.plugins_run:
                    problem = _STILL_RESERVED_FAILED
                else:
                    problem = _STILL_RESERVED_NOT_RUN
                to_move.append(Settled(p, "done", del_doc=doc, problem=problem))
    for p, by in released_first:
        # by's DEL ran to its end (the _Witness saw it), so its result was handed on
        held = released_before_its_del(p, attachments[by][0])
        yield Settled(held, "done", del_doc=docs[by])
    yield from _quarantine(to_move, quarantine_dir, boot_id, now, tools.budget)


class _Witness:
    """Which DEL through Multus of this run released a rider's address, as that DEL saw it:
    there when it began, gone once every plugin of it exited 0. A DEL under way when a rider
    is found gone is waited for, until the run's deadline at most: only a DEL not yet begun
    waits, so no two wait for each other. Nothing to see where no orphan rides."""

    def __init__(self, attachments: dict[_Key, list[PlannedReservation]], budget: Budget) -> None:
        self._budget = budget
        # each DEL's held addresses, (store identity, address, path), and each address's DELs
        self._holds: dict[_Key, list[tuple[object, str, str]]] = {}
        self._holders: dict[tuple[object, str], list[_Key]] = defaultdict(list)
        if any(p.riding for items in attachments.values() for p in items):
            for key, items in attachments.items():
                for h in _through_multus(items).hold:
                    identity = store_identity(h.store)
                    for ip in h.addresses:
                        self._holds.setdefault(key, []).append(
                            (identity, ip, os.path.join(h.store, ip))
                        )
                        self._holders[identity, ip].append(key)
        self._ended = {key: threading.Event() for key in self._holds}
        self._present: dict[_Key, list[tuple[object, str, str]]] = {}
        self._released: dict[tuple[object, str], _Key] = {}

    def begin(self, key: _Key) -> None:
        if key in self._holds:
            self._present[key] = [h for h in self._holds[key] if os.path.lexists(h[2])]

    def end(self, key: _Key, done: bool) -> None:
        if key not in self._holds:
            return
        if done:
            for identity, ip, path in self._present.get(key, ()):
                if not os.path.lexists(path):
                    self._released.setdefault((identity, ip), key)
        self._ended[key].set()

    def released_by(self, key: _Key, r: Reservation) -> _Key | None:
        at = (store_identity(r.store), r.ip)
        for other in self._holders.get(at, ()):
            if other != key and other in self._present:
                self._ended[other].wait(max(0.0, self._budget.seconds_left()))
        return self._released.get(at)


def _checked(
    outcome: DelOutcome,
    items: list[PlannedReservation],
    left: list[PlannedReservation],
    released: list[str],
    container_id: str,
) -> DelOutcome:
    """The effect the reaper can see, as for an entry's DEL (apply.py): the plugins said
    done, and host-local's stores must agree: the orphans' own, and those of the delegates a
    DEL through Multus has release besides (whose addresses released are added to released).
    """
    still: list[str] = []
    held = [p.reservation.ip for p in left]
    # by store, and by ifname where an orphan that rides on the DEL is held under its own
    by_store: dict[tuple[str, str], list[str]] = defaultdict(list)
    for p in left:
        r = p.reservation
        ifname = r.owner.ifname if r.owner else None
        named = "" if ifname in (None, p.del_ifname) else f" (ifname {ifname})"
        by_store[r.store, named].append(r.ip)
    # the DEL's own ifname first, as an entry's DEL says them
    by_ifname = sorted(by_store.items(), key=lambda item: bool(item[0][1]))
    still += (f"{store} still holds {', '.join(ips)}{named}" for (store, named), ips in by_ifname)
    # The delegates' addresses besides the orphans' own, which _still_owned() looked at.
    hold = _through_multus(items).hold
    more_left: list[str] = []
    if hold:
        # by identity: a rider's store may be spelled otherwise in the hold (a symlinked
        # dataDir)
        own = {(store_identity(p.reservation.store), p.reservation.ip) for p in items}
        others = [
            h._replace(addresses=tuple(ip for ip in h.addresses if (identity, ip) not in own))
            for h, identity in ((h, store_identity(h.store)) for h in hold)
        ]
        more, more_left = seen_released(others, container_id, "", still)
        released += more
    if not still:
        return outcome
    return outcome._replace(errors=(unreleased(still),), left=(*held, *more_left))


# Reservations moved at once, their sidecars fsynced together (quarantine.py): one fsync per
# file made 60,000 of them take 39 s.
BATCH_FILES = 64


def _move(s: Settled, dir_fd: int, now: float) -> Move:
    """The move of one reservation out of its store: vetted as the inventory judged it."""
    r = s.planned.reservation

    def record(dest: str, sha256: str) -> dict[str, Any]:
        return sidecar(s._replace(quarantined_to=dest).to_json(), sha256, now)

    def vet(data: bytes) -> str | None:
        found = read_owner(data)[0]
        return None if found == r.content else f"now {found}, was {r.content}"

    return Move(dir_fd, r.ip, r.file, record, vet)


def _quarantine(
    settled: list[Settled], quarantine_dir: str, boot_id: str, now: float, budget: Budget
) -> Iterator[Settled]:
    # Each reservation let go of as it is reported, not held to the end: 10,000 orphans whole
    # are some 12 MB. Batches taken from the end of the reversed list, in the order they came.
    by_store: dict[str, list[Settled]] = defaultdict(list)
    for s in handed_over(settled):
        by_store[s.planned.reservation.store].append(s)
    for store, items in by_store.items():
        network = items[0].planned.reservation.network
        place = Quarantine(quarantine_dir, boot_id, "host-local", network, owner_locks=True)
        try:
            lock = StoreLock(store, budget)
        except OSError as e:
            for s in items:
                problem = read_only_noted(f"cannot lock {store}: {e.strerror}", e)
                yield s._replace(outcome="failed", problem=problem)
            continue
        items.reverse()
        try:
            while items:
                batch = [items.pop() for _ in range(min(BATCH_FILES, len(items)))]
                if budget.seconds_left() <= 0:
                    # Bounded time: what is left stays reserved for the next run to release.
                    why = f"not moved: the run's deadline ({budget.seconds:g} s) passed"
                    for s in batch:
                        yield s._replace(outcome="failed", problem=f"{why}; left for the next run")
                    continue
                moves = [_move(s, lock.dir_fd, now) for s in batch]
                for s, dest in zip(batch, place.move_all(moves)):
                    if isinstance(dest, FileChanged):
                        problem = f"changed: {dest}; left for the next run"
                        yield s._replace(outcome="skipped", problem=problem)
                    elif isinstance(dest, OSError):
                        problem = failed_move(dest)
                        yield s._replace(outcome="failed", problem=problem)
                    else:
                        yield s._replace(quarantined_to=dest)
        finally:
            place.close()
            lock.close()
