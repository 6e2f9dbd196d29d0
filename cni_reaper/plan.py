"""The policy: what to do with each cache entry, decided from its verdicts alone.

The table is shared/DESIGN.md section Verdicts and policy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from enum import Enum
from typing import NamedTuple

from cni_reaper.boot import BootContext, Written, WrittenVerdict
from cni_reaper.cache import CacheEntry
from cni_reaper.content import Content
from cni_reaper.netconf import BUILTIN_LOOPBACK, NetworkConfigs, NetworkList, builtin_loopback
from cni_reaper.pre_runtime import Proof

STALE_DAMAGE = "left by an earlier boot; the runtime's DEL would abort on it"
READABLE = "libcni can read it: the runtime's own DEL will use it"


class Action(str, Enum):
    KEEP = "keep"
    DEL_AND_QUARANTINE = "del-and-quarantine"
    QUARANTINE = "quarantine"
    LEAVE = "leave"
    REPORT = "report"

    @property
    def changes_things(self) -> bool:
        return self in (Action.DEL_AND_QUARANTINE, Action.QUARANTINE)


class PlannedEntry(NamedTuple):
    entry: CacheEntry
    written: WrittenVerdict
    action: Action
    reason: str
    netlist: NetworkList | None = None  # the config DEL runs with
    config_problem: str | None = None  # why DEL cannot run, for del-and-quarantine


def plan_entry(
    entry: CacheEntry, boot: BootContext, configs: NetworkConfigs, proof: Proof, results_dir: str
) -> PlannedEntry:
    """What to do with one entry. When it was written is the pre-runtime record's to say (see
    pre_runtime.py); the clocks only describe it."""
    file = entry.file
    written = proof.written(results_dir, entry.name, file, boot.classify(file.mtime, file.ctime))
    content = entry.verdict.content
    if content is Content.VALID or content is Content.LEGACY:  # what libcni can read
        return PlannedEntry(entry, written, Action.KEEP, READABLE)
    if not content.is_corrupt:
        return PlannedEntry(entry, written, Action.REPORT, f"{content.value}: never touched")
    if entry.split is None:
        return PlannedEntry(
            entry, written, Action.REPORT, f"cannot tell whose it is: {entry.name_problem}"
        )
    if written.written is not Written.PREVIOUS_BOOT:
        return PlannedEntry(
            entry,
            written,
            Action.LEAVE,
            f"written {written.written.value}: may be a write still in flight",
        )
    network = entry.split.network
    netlist = configs.get(network)
    if netlist is None and network == BUILTIN_LOOPBACK:
        netlist = builtin_loopback()
    if netlist is None:
        return PlannedEntry(
            entry,
            written,
            Action.DEL_AND_QUARANTINE,
            STALE_DAMAGE,
            config_problem=f"no config for network {network!r} in the conf dirs",
        )
    if not netlist.reads_cached_result:
        return PlannedEntry(
            entry,
            written,
            Action.QUARANTINE,
            f"cniVersion {netlist.cni_version!r} < 0.4.0: libcni does not read the cache on "
            "DEL, so the runtime's own DEL works; moved aside for the record",
            netlist=netlist,
        )
    return PlannedEntry(
        entry,
        written,
        Action.DEL_AND_QUARANTINE,
        "left by an earlier boot; the runtime's DEL would abort on it",
        netlist=netlist,
    )


def held_until(
    plan: Iterable[PlannedEntry], ready: Callable[[], str | None]
) -> Iterator[PlannedEntry]:
    """The plan, with every entry that would change something held back until the whole plan
    is made and ready() finds nothing against acting; if it does, they are left instead, for
    its reason."""
    held = []
    for planned in plan:
        if planned.action.changes_things:
            held.append(planned)
        else:
            yield planned
    veto = ready()
    for planned in held:
        if veto is None:
            yield planned
        else:
            written = planned.written
            yield planned._replace(
                action=Action.LEAVE,
                reason=f"not proven to predate this boot: {veto}",
                written=written._replace(
                    written=Written.UNKNOWN, evidence=f"{veto}; {written.evidence}"
                ),
            )
