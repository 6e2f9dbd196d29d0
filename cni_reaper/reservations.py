"""The policy for host-local's reservations: which addresses nobody will ever release.

Decided after the results cache is done with, from what became of each attachment's entry:
- an entry kept (whole, for a sandbox a runtime will know): the runtime's own DEL releases the
  address; kept.
- an entry left alone (written in this boot, may be alive, cannot be read): left too.
- an entry DEL'd in this run whose address is still reserved: that DEL failed or left it; the
  address goes to the quarantine under host-local's lock.
- no entry of its network, but a delegate's result Multus cached for it, of a sandbox not
  proven forgotten (multus.py): Multus's DEL, when the runtime's DEL of its entry runs it,
  releases the address; kept.
- no entry at all, or one moved aside without a DEL (the node died between host-local's
  reservation and libcni's cache write; a peer deleted the results dir; a cniVersion below
  0.4.0): an orphan, whoever knows its sandbox. A runtime that knows it DELs through the
  networks it loads (containerd: the first of its conf dir), which need not be this one, and
  some releases skip that DEL for a record with no CNI result: DEL through its network's
  config with its owner's container ID and ifname and no cached result, which a later DEL of
  the runtime's finds done; if no DEL can run, or it leaves the address, the quarantine.
  One that another orphan's DEL through Multus releases as its delegate's rides on that DEL.
  One that the delegates of its owner's entry through Multus keep, where that entry's DEL was
  held back (left for a later run, which may never come: its scratch file's delegates
  doubted), is an orphan too, its reason saying so.
- damaged (empty, NUL-filled, garbage): no DEL can ever match it; the quarantine.
Every one of these acts only on a reservation the pre-runtime record proves an earlier boot
wrote (pre_runtime.py), whose owner nothing shows alive.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterable, Iterator, Mapping

from cni_reaper.boot import Written, iso
from cni_reaper.choice import Choice
from cni_reaper.filestat import FileStat
from cni_reaper.host_local import DEFAULT_IFNAME, Held, Reservation
from cni_reaper.netconf import NetworkList
from cni_reaper.plugin import ChainCache, ChainResolution
from cni_reaper.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TypeVar

    from cni_reaper.multus import DelegateResults

_CONTAINER_ID = re.compile(r"[0-9a-f]{64}")


class EntryFate(str, Choice):
    """What became of a results entry in this run, as the reservations' policy needs it."""

    KEPT = "kept"  # whole; the runtime will DEL it
    DELETED = "deleted"  # its DEL ran (or, in a dry run, would)
    DEL_FAILED = "del-failed"  # its DEL failed, or could not run
    LEFT = "left"  # left alone or only reported
    MOVED = "moved"  # moved aside with no DEL: as if there were none


class ReservationAction(str, Choice):
    KEEP = "keep"
    LEAVE = "leave"
    DEL = "del"  # an orphan: DEL, then the quarantine if it is still reserved
    QUARANTINE = "quarantine"

    @property
    def changes_things(self) -> bool:
        return self in CHANGING_RESERVATIONS


# The actions that change things, for a loop over every reservation: a set, not a property.
CHANGING_RESERVATIONS = frozenset((ReservationAction.DEL, ReservationAction.QUARANTINE))


class ThroughMultus(Record):
    """What an orphan's DEL through Multus was planned on: what Multus's delegates release
    besides, to see after it, and the scratch files Multus reads, as they were read, to check
    again just before it."""

    hold: tuple[Held, ...]
    scratch_seen: tuple[tuple[str, FileStat], ...]


class PlannedReservation(Record):
    reservation: Reservation
    action: ReservationAction
    reason: str
    owner_state: str  # what holds the address if it stays: for pool health
    netlist: NetworkList | None = None  # the config an orphan's DEL runs with
    chain: ChainResolution | None = None
    config_problem: str | None = None  # why no DEL can run: quarantined instead
    del_ifname: str | None = None
    # None: its DEL runs no Multus whose delegates were read
    through_multus: ThroughMultus | None = None
    riding: bool = False  # released by another orphan's DEL, as its delegate's (netlist's)

    def to_json(
        self,
        outcome: str,
        quarantined_to: str | None = None,
        del_doc: Mapping[str, Any] | None = None,
        problem: str | None = None,
    ) -> dict[str, Any]:
        r = self.reservation
        owner = r.owner
        doc: dict[str, Any] = {
            "network": r.network,
            "path": r.path,
            "ip": r.ip,
            "size": r.file.size,
            "mtime": iso(r.file.mtime),
            "ctime": iso(r.file.ctime),
            "content": r.content,
            "owner": None
            if owner is None
            else {"container_id": owner.container_id, "ifname": owner.ifname},
            "written": r.written.written.value,
            "evidence": r.written.evidence,
            "action": self.action.value,
            "reason": self.reason,
            "del": None,
            "outcome": outcome,
            "quarantined_to": quarantined_to,
        }
        if self.action is ReservationAction.DEL:
            doc["del"] = {
                "config": self.netlist.source if self.netlist is not None else None,
                "config_problem": self.config_problem,
                "ifname": self.del_ifname,
                **(del_doc or {}),
            }
        if problem:
            doc["problem"] = problem
        return doc


def del_failed(doc: Mapping[str, Any]) -> bool:
    """Whether a reservation's document says its DEL failed or cannot run: then it is released
    into the quarantine all the same, and the run exits 73."""
    done = doc.get("del")
    return done is not None and bool(done.get("config_problem") or done.get("ok") is False)


class Settled(Record):
    planned: PlannedReservation
    outcome: str  # done, failed, skipped, planned
    quarantined_to: str | None = None
    del_doc: dict[str, Any] | None = None
    problem: str | None = None

    def to_json(self) -> dict[str, Any]:
        return self.planned.to_json(self.outcome, self.quarantined_to, self.del_doc, self.problem)


class EntryFates:
    """What became of each results entry, as the reservations' policy asks it. Kept entries,
    nearly all of a large cache, are not noted one by one: an entry still in the results dir
    that was noted as nothing else was kept. Entries that appeared since the scan count as
    kept too: their address is left for whoever wrote them."""

    def __init__(
        self,
        present: Callable[[str], bool] = lambda _: False,
        names: Callable[[], Iterable[str]] = tuple,
    ) -> None:
        self.present = present  # whether the results dir holds a file of this name
        self.names = names  # the results dir's names, listed only for ID-only reservations
        self._noted: dict[tuple[str, str], dict[str, EntryFate]] = {}
        # container -> the network of an entry of its whose DEL through Multus was held back
        self._left_delegating: dict[str, str] = {}
        self._by_container: dict[str, list[str]] | None = None
        self._sorted: list[str] | None = None  # the names, for IDs that are not 64 hex

    def note(
        self,
        network: str,
        container_id: str,
        ifname: str,
        fate: EntryFate,
        runs_multus: bool = False,
    ) -> None:
        if fate is not EntryFate.KEPT:
            self._noted.setdefault((network, container_id), {})[ifname] = fate
        if runs_multus and fate is EntryFate.LEFT:
            self._left_delegating.setdefault(container_id, network)

    def left_through_multus(self, container_id: str) -> str | None:
        """The network of an entry of the container whose DEL through Multus was held back:
        the addresses its delegates keep in other networks' stores (or in its own, under
        their ifnames) are ones that DEL releases, when a later run makes it."""
        return self._left_delegating.get(container_id) if self._left_delegating else None

    def _fate(self, network: str, container_id: str, ifname: str) -> EntryFate | None:
        if self._noted:  # nearly every entry was kept: nothing noted
            fate = self._noted.get((network, container_id), {}).get(ifname)
            if fate is not None:
                return fate
        return EntryFate.KEPT if self.present(f"{network}-{container_id}-{ifname}") else None

    def _ifnames(self, network: str, container_id: str) -> set[str]:
        """Every ifname an entry of the container in the network names."""
        prefix = f"{network}-{container_id}-"
        names: Iterable[str]
        if _CONTAINER_ID.fullmatch(container_id):
            if self._by_container is None:
                self._by_container = {}
                for name in self.names():
                    for match in _CONTAINER_ID.finditer(name):
                        self._by_container.setdefault(match.group(), []).append(name)
            names = self._by_container.get(container_id, ())
        else:
            # An ID no Kubernetes runtime makes (cnitool, a script): libcni takes any of
            # letters, digits, '_', '.' and '-', so no name splits into its parts for an
            # index. Its names are found by prefix in the names sorted once.
            if self._sorted is None:
                self._sorted = sorted(self.names())
            ordered = self._sorted
            start = end = bisect.bisect_left(ordered, prefix)
            while end < len(ordered) and ordered[end].startswith(prefix):
                end += 1
            names = ordered[start:end]
        found = {n[len(prefix) :] for n in names if n.startswith(prefix)}
        return found | set(self._noted.get((network, container_id), {}))

    def has_entry(self, network: str, container_id: str, ifname: str) -> bool:
        """Whether the results dir holds, or held, this attachment's entry, as of() finds it:
        its address in the network's store is no orphan."""
        return self._fate(network, container_id, ifname) is not None

    def of(self, r: Reservation) -> tuple[EntryFate | None, str | None]:
        """What became of the owner's entry, and its ifname: for an ID-only reservation, that
        of any entry of the container in the network, the one that keeps most winning."""
        assert r.owner is not None
        network, container_id = r.network, r.owner.container_id
        if r.owner.ifname is not None:
            return self._fate(network, container_id, r.owner.ifname), r.owner.ifname
        ifnames = sorted(self._ifnames(network, container_id))
        fates = {i: self._fate(network, container_id, i) for i in ifnames}
        for fate in (
            EntryFate.KEPT,
            EntryFate.LEFT,
            EntryFate.DELETED,
            EntryFate.DEL_FAILED,
            EntryFate.MOVED,
        ):
            for ifname in ifnames:
                if fates[ifname] is fate:
                    return fate, ifname
        return None, None


if TYPE_CHECKING:
    Item = TypeVar("Item")


def handed_over(items: list[Item]) -> Iterator[Item]:
    """Each of items in order, the list letting go of it as it is taken: at 10,000 orphans,
    whoever takes them (the report, the quarantine) decides how long each is kept, not the
    list it came in."""
    items.reverse()
    while items:
        yield items.pop()


# The reasons of every orphan, made once: a string made per orphan was 2 MB at 10,000 of them.
_ORPHAN = "an orphan: no results entry for it, so no runtime will ever DEL it"
_ORPHAN_NO_DEL = f"{_ORPHAN}; no DEL can run, so it is released into the quarantine"


def _left_through(network: str, del_runs: bool) -> str:
    """An orphan's reason where its owner's entry of network, whose DEL through Multus would
    release it, was left (not "no results entry for it": one is there)."""
    reason = (
        f"no results entry of its network names it, and its owner's results entry of "
        f"{network}, whose DEL through Multus releases it, was left for a later run: "
        "released as an orphan now, which that DEL finds done"
    )
    return reason if del_runs else f"{reason}; no DEL can run, so it goes to the quarantine"


def _del_of(p: PlannedReservation) -> tuple[str | None, str, str | None]:
    """The one DEL an orphan's release runs: its config's network (None: no DEL can run),
    owner and ifname."""
    assert p.reservation.owner is not None
    network = p.netlist.name if p.netlist is not None and p.config_problem is None else None
    return network, p.reservation.owner.container_id, p.del_ifname


def claimed_or_riding(
    changing: list[PlannedReservation],
    claim: Callable[[PlannedReservation], str | None],
    dir_of: Callable[[str], object],
) -> None:
    """The orphans' DELs that are to run, settled in changing once every store is read.

    An orphan rides on another orphan's DEL through a delegating plugin (Multus) that
    releases it as one of its delegates', from its own store (dir_of: a store's identity,
    however its path is spelled) under its own ifname. That is the DEL the runtime would
    have run for the pod; the rider is then seen released, or quarantined, with that DEL's
    own orphans, not DEL'd a second time through its own network's config beside it, nor
    quarantined for want of one (before, its own DEL or move found the address gone since
    the scan: left alone, exit 65). Any other orphan whose DEL can run claims what its
    Multus would read (claim: why its DEL may not run after all, as
    StoreReads.claim_delegates says), in the order planned, those no other DEL would
    release first: Multus's own attachment before a delegate's address in Multus's store
    under net1. A DEL through Multus that would not release its own orphan (its scratch file
    names no delegate keeping it: another Multus's, sharing the cniDir) does not run.
    Whenever a DEL is claimed, the orphans it releases ride on it, wherever they were."""
    to_settle = [
        i
        for i, p in enumerate(changing)
        if p.action is ReservationAction.DEL and p.reservation.owner is not None
    ]

    def held(store: str, ip: str, p: PlannedReservation) -> tuple[object, str, str]:
        assert p.reservation.owner is not None
        return dir_of(store), ip, p.reservation.owner.container_id

    def own(p: PlannedReservation) -> tuple[object, str, str]:
        return held(p.reservation.store, p.reservation.ip, p)

    def holds(p: PlannedReservation) -> set[tuple[object, str, str]]:
        hold = p.through_multus.hold if p.through_multus is not None else ()
        return {held(h.store, ip, p) for h in hold for ip in h.addresses}

    # What each DEL that may run (through Multus, releasing its own orphan) would release.
    held_by: dict[tuple[object, str, str], set[tuple[str | None, str, str | None]]] = {}
    for i in to_settle:
        p = changing[i]
        if p.through_multus is not None and p.config_problem is None:
            released = holds(p)
            if own(p) not in released:
                reason = (
                    "its DEL through Multus would not release it: Multus's scratch file "
                    "names no delegate that keeps it in its store under its ifname"
                )
                changing[i] = p._replace(config_problem=reason, through_multus=None)
                continue
            for key in released:
                held_by.setdefault(key, set()).add(_del_of(p))
    # Each orphan by the address it is, for the DELs claimed to find; none without a DEL
    # through Multus (nearly every node: no orphan's address looked at again).
    waiting: dict[tuple[object, str, str], list[int]] = {}
    if held_by:
        for i in to_settle:
            waiting.setdefault(own(changing[i]), []).append(i)

        def by_another(i: int) -> bool:
            p = changing[i]
            return any(d != _del_of(p) for d in held_by.get(own(p), ()))

        to_settle.sort(key=by_another)  # stable: in the order planned otherwise
    settled: set[int] = set()
    for i in to_settle:
        p = changing[i]
        if p.riding or p.config_problem is not None or p.netlist is None:
            continue  # a rider, or no DEL of its own: one claimed later may still take it
        problem = claim(p)
        if problem is not None:
            # No DEL of its own, as one with no config: one claimed later may still take it.
            changing[i] = p._replace(config_problem=problem, through_multus=None)
            continue
        settled.add(i)
        for key in holds(p):
            for j in waiting.pop(key, ()):
                if j not in settled and _del_of(changing[j]) != _del_of(p):
                    changing[j] = _released_by(changing[j], p, ", whose delegate keeps it")


def _released_by(p: PlannedReservation, by: PlannedReservation, how: str) -> PlannedReservation:
    """The orphan p as released by by's DEL through Multus: reported as that DEL's."""
    assert by.netlist is not None
    reason = (
        f"{_ORPHAN}; released by its owner's DEL through network {by.netlist.name} (ifname "
        f"{by.del_ifname}){how}"
    )
    return p._replace(
        reason=reason,
        netlist=by.netlist,
        chain=by.chain,
        config_problem=None,
        del_ifname=by.del_ifname,
        through_multus=None,
        riding=True,
    )


def released_before_its_del(p: PlannedReservation, by: PlannedReservation) -> PlannedReservation:
    """A rider found gone before the DEL it rides on ran, released by by's DEL (another
    Multus's, whose delegate it is too)."""
    return _released_by(p, by, " before the one it rode on ran")


class ReservationPlanner:
    def __init__(
        self,
        fates: EntryFates,
        alive: Callable[[str], str | None],
        config_for: Callable[[str], tuple[NetworkList | None, str | None]],
        chains: ChainCache,
        del_problems: Mapping[str, str],
        dry_run: bool = False,
        # where Multus cached a delegate's result, if it did and its DEL is still to come
        delegated: DelegateResults | None = None,
    ) -> None:
        self._fates = fates
        self._delegated = delegated
        self._alive = alive
        self._config_for = config_for
        self._chain = chains
        self._del_problems = del_problems
        self._dry_run = dry_run

    def __call__(self, r: Reservation) -> PlannedReservation:
        plan = PlannedReservation
        written = r.written.written
        if r.owner is None:  # damaged: no DEL will ever match it
            if written is Written.PREVIOUS_BOOT:
                reason = "no owner to release it, and every sandbox of that boot is gone"
                return plan(r, ReservationAction.QUARANTINE, reason, "damaged")
            reason = f"written {written.value}: may be a reservation in flight"
            return plan(r, ReservationAction.LEAVE, reason, "damaged")
        if written is not Written.PREVIOUS_BOOT:
            # Unknown where no record says which boot wrote it: an earlier one's, as likely.
            owner = "current-boot" if written is Written.CURRENT_BOOT else "unknown"
            return plan(r, ReservationAction.KEEP, f"written {written.value}", owner)
        alive = self._alive(r.owner.container_id)
        if alive is not None:
            return plan(r, ReservationAction.LEAVE, f"may be alive: {alive}", "alive")
        fate, ifname = self._fates.of(r)
        if fate is EntryFate.KEPT:
            reason = "its results entry is whole: the runtime's own DEL releases it"
            return plan(r, ReservationAction.KEEP, reason, "runtime")
        if fate is EntryFate.LEFT:
            reason = "its results entry was left alone, so is it"
            return plan(r, ReservationAction.LEAVE, reason, "left")
        if fate is EntryFate.DELETED and self._dry_run:
            reason = "the DEL planned for its results entry releases it (if not, the quarantine)"
            return plan(r, ReservationAction.KEEP, reason, "entry-del")
        if fate is EntryFate.DELETED:
            reason = "still reserved after the DEL of its results entry"
            return plan(r, ReservationAction.QUARANTINE, reason, "failed")
        if fate is EntryFate.DEL_FAILED:
            reason = "still reserved: the DEL of its results entry failed or could not run"
            return plan(r, ReservationAction.QUARANTINE, reason, "failed")
        if fate is None and self._delegated is not None and r.owner.ifname is not None:
            cached = self._delegated(r.network, r.owner.container_id, r.owner.ifname)
            if cached is not None:
                reason = (
                    f"{cached}: Multus's DEL releases it when the runtime tears the sandbox down"
                )
                return plan(r, ReservationAction.KEEP, reason, "runtime")
        through = self._fates.left_through_multus(r.owner.container_id) if fate is None else None
        return self._orphan(r, ifname, through)

    def _orphan(
        self, r: Reservation, ifname: str | None, through: str | None = None
    ) -> PlannedReservation:
        """No results entry tells a runtime to DEL it: its network's DEL, or the quarantine.
        Where its owner's entry of the network through (Multus's), whose delegates keep it,
        had its DEL held back, the reason says so."""
        assert r.owner is not None
        netlist, problem = self._config_for(r.network)
        chain = None
        if netlist is not None:
            problem = problem or self._del_problems.get(r.network) or netlist.version_problem
            if problem is None:
                chain = self._chain(netlist)
                problem = chain.problem
        reason = _ORPHAN if problem is None else _ORPHAN_NO_DEL
        if through is not None:
            reason = _left_through(through, problem is None)
        return PlannedReservation(
            r,
            ReservationAction.DEL,
            reason,
            "failed",
            netlist,
            chain,
            problem,
            ifname or r.owner.ifname or DEFAULT_IFNAME,
        )
