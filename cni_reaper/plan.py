"""The policy: what to do with each cache entry, decided from its verdicts alone.

The table is shared/DESIGN.md section Verdicts and policy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from enum import Enum
from typing import NamedTuple

from cni_reaper.boot import BootContext, Written, WrittenVerdict
from cni_reaper.cache import CacheEntry
from cni_reaper.content import Content
from cni_reaper.netconf import BUILTIN_LOOPBACK, NetworkConfigs, NetworkList, builtin_loopback
from cni_reaper.plugin import ChainResolution, PluginDirs, resolve_chain
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
    # Why the DEL will fail before any plugin runs: no config, a cniVersion libcni cannot
    # parse, a plugin of the chain missing or refused. The file is still quarantined.
    config_problem: str | None = None
    chain: ChainResolution | None = None  # every plugin the DEL would run, resolved


class Planner:
    """The policy table, one entry at a time. When an entry was written is the pre-runtime
    record's to say (pre_runtime.py; the clocks only describe it); whether its attachment may
    be alive, the runtimes' live state under /run (runtime/liveness.py)."""

    def __init__(
        self,
        boot: BootContext,
        configs: NetworkConfigs,
        proof: Proof,
        results_dir: str,
        plugin_dirs: PluginDirs,
        live_containers: frozenset[str] | str,  # or why they cannot be known
        del_problems: Mapping[str, str] | None = None,  # network -> why no DEL of it may run
    ) -> None:
        self._boot = boot
        self._configs = configs
        self._proof = proof
        self._results_dir = results_dir
        self._plugin_dirs = plugin_dirs
        self._live = live_containers
        self._del_problems = del_problems or {}
        self._chains: dict[str, ChainResolution] = {}  # by network

    def _chain(self, netlist: NetworkList) -> ChainResolution:
        chain = self._chains.get(netlist.name)
        if chain is None:
            chain = self._chains[netlist.name] = resolve_chain(netlist, self._plugin_dirs)
        return chain

    def alive(self, container_id: str) -> str | None:
        """Why this container's attachments may be alive, if they may."""
        if isinstance(self._live, str):
            return f"cannot tell which containers are alive: {self._live}"
        if container_id in self._live:
            return "a runtime keeps live state for this container under /run"
        return None

    def __call__(self, entry: CacheEntry) -> PlannedEntry:
        file = entry.file
        written = self._proof.written(
            self._results_dir, entry.name, file, self._boot.classify(file.mtime, file.ctime)
        )
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
        alive = self.alive(entry.split.container_id)
        if alive is not None:
            return PlannedEntry(entry, written, Action.LEAVE, f"may be alive: {alive}")
        network = entry.split.network
        netlist = self._configs.get(network)
        if netlist is None and network == BUILTIN_LOOPBACK:
            netlist = builtin_loopback()
        chain = None
        if netlist is None:
            problem: str | None = f"no config for network {network!r} in the conf dirs"
        elif netlist.version_problem is not None:
            # libcni's DelNetworkList fails on it before it runs a plugin: so does the replay.
            problem = netlist.version_problem
        elif not netlist.reads_cached_result:
            return PlannedEntry(
                entry,
                written,
                Action.QUARANTINE,
                f"cniVersion {netlist.cni_version!r} < 0.4.0: libcni does not read the cache on "
                "DEL, so the runtime's own DEL works; moved aside for the record",
                netlist=netlist,
            )
        else:
            chain = self._chain(netlist)
            problem = self._del_problems.get(network) or chain.problem
        return PlannedEntry(
            entry,
            written,
            Action.DEL_AND_QUARANTINE,
            STALE_DAMAGE,
            netlist=netlist,
            config_problem=problem,
            chain=chain,
        )


def held_until(
    plan: Iterable[PlannedEntry],
    ready: Callable[[], str | None],
    alive: Callable[[PlannedEntry], str | None] | None = None,
) -> Iterator[PlannedEntry]:
    """The plan, with every entry that would change something held back until the whole plan
    is made and ready() finds nothing against acting; if it does, they are left instead, for
    its reason. alive() then says of each whether the whole plan showed it may be alive."""
    held = []
    for planned in plan:
        if planned.action.changes_things:
            held.append(planned)
        else:
            yield planned
    veto = ready()
    for planned in held:
        living = alive(planned) if alive is not None and veto is None else None
        if living is not None:
            yield planned._replace(action=Action.LEAVE, reason=f"may be alive: {living}")
        elif veto is None:
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
