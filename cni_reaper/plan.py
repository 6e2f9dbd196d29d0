"""The policy: what to do with each cache entry, decided from its verdicts alone.

The table is shared/DESIGN.md section Verdicts and policy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping

from cni_reaper.boot import BootContext, Written, WrittenVerdict
from cni_reaper.cache import CachedAttachment, CacheEntry
from cni_reaper.choice import Choice
from cni_reaper.content import Content
from cni_reaper.netconf import (
    BUILTIN_LOOPBACK,
    ConfigError,
    NetworkConfigs,
    NetworkList,
    builtin_loopback,
    parse_conf_bytes,
)
from cni_reaper.plugin import ChainCache, ChainResolution
from cni_reaper.pre_runtime import Proof
from cni_reaper.prev_result import Unconvertible, convert
from cni_reaper.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol

STALE_DAMAGE = "left by an earlier boot; the runtime's DEL would abort on it"
READABLE = "libcni can read it: the runtime's own DEL will use it"
FORGOTTEN = (
    "whole, but left by an earlier boot for a sandbox no runtime will know: nobody else will "
    "ever DEL it"
)


if TYPE_CHECKING:

    class SandboxRecords(Protocol):
        """What the runtimes' own records say of a sandbox (runtime/inventory.py)."""

        @property
        def records_found(self) -> bool:
            """Whether any runtime's records were found on the node at all."""

        def knows(self, sandbox_id: str) -> bool | None:
            """True: a runtime will know it after this boot and run its DEL; False: none will;
            None: the records cannot tell."""

        def describe(self, sandbox_id: str) -> str: ...


class Action(str, Choice):
    KEEP = "keep"
    DEL_AND_QUARANTINE = "del-and-quarantine"
    QUARANTINE = "quarantine"
    LEAVE = "leave"
    REPORT = "report"

    @property
    def changes_things(self) -> bool:
        return self in (Action.DEL_AND_QUARANTINE, Action.QUARANTINE)


_CHANGING = frozenset(action for action in Action if action.changes_things)


class PlannedEntry(Record):
    entry: CacheEntry
    written: WrittenVerdict
    action: Action
    reason: str
    netlist: NetworkList | None = None  # the config DEL runs with
    # Why the DEL will fail before any plugin runs: no config, a cniVersion libcni cannot
    # parse, a plugin of the chain missing or refused. The file is still quarantined.
    config_problem: str | None = None
    chain: ChainResolution | None = None  # every plugin the DEL would run, resolved
    # A whole entry's DEL inputs (its cached args and result), as libcni's GC hands them on;
    # None for damaged ones, whose DEL runs with no cached result.
    cached: CachedAttachment | None = None
    prev_result: dict[str, Any] | None = None  # the cached result at the config's cniVersion


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
        chains: ChainCache,  # every plugin a DEL through a config runs, resolved once per run
        live_containers: frozenset[str] | str,  # or why they cannot be known
        del_problems: Mapping[str, str] | None = None,  # network -> why no DEL of it may run
        sandboxes: SandboxRecords | None = None,  # None: whole entries are all kept
        read_cached: Callable[[CacheEntry], CachedAttachment | str] | None = None,
        # why a config cached in an entry may not run a DEL here (host_local.py)
        cached_config_problem: Callable[[NetworkList], str | None] | None = None,
        # the config a whole entry of a network cached, or why none may be used (cli.py)
        network_cached_config: Callable[[str], tuple[NetworkList | None, str | None]] | None = None,
    ) -> None:
        self._boot = boot
        self._configs = configs
        self._proof = proof
        self._results_dir = results_dir
        self._live = live_containers
        self._del_problems = del_problems or {}
        self._sandboxes = sandboxes
        self._read_cached = read_cached
        self._cached_config_problem = cached_config_problem
        self._keep_reasons: dict[str, str] = {}  # by what the records say: most say the same
        # With no runtime records on the node, the records say the same of every sandbox (they
        # cannot tell): the reason every whole entry is kept for, said once.
        self._none_known: str | None = None
        if sandboxes is not None and not sandboxes.records_found:
            self._none_known = f"{READABLE} ({sandboxes.describe('')})"
        self._network_cached_config = network_cached_config
        self._chain = chains

    def alive(self, container_id: str) -> str | None:
        """Why this container's attachments may be alive, if they may."""
        return why_alive(self._live, container_id)

    def __call__(self, entry: CacheEntry) -> PlannedEntry:
        written = self._proof.written(self._results_dir, entry.name, entry.file, self._boot)
        content = entry.verdict.content
        if content is Content.VALID or content is Content.LEGACY:  # what libcni can read
            if written.written is Written.PREVIOUS_BOOT and self._sandboxes is not None:
                if self._none_known is not None:  # what the records say of all of them
                    return PlannedEntry(entry, written, Action.KEEP, self._none_known)
                return self._whole(entry, written)
            return PlannedEntry(entry, written, Action.KEEP, READABLE)
        held = not_to_change(entry, written, self.alive)
        if held is not None:
            return PlannedEntry(entry, written, *held)
        assert entry.split is not None  # not_to_change holds back a name that does not split
        network = entry.split.network
        netlist = self._configs.get(network)
        if netlist is None and network == BUILTIN_LOOPBACK:
            netlist = builtin_loopback()
        cached_problem = None
        if netlist is None and self._network_cached_config is not None:
            # A network no conf dir names any more: the config a whole entry of it cached.
            netlist, cached_problem = self._network_cached_config(network)
        chain = None
        if netlist is None:
            problem: str | None = (
                cached_problem or f"no config for network {network!r} in the conf dirs"
            )
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
        elif cached_problem is not None:
            problem = cached_problem
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

    def _whole(self, entry: CacheEntry, written: WrittenVerdict) -> PlannedEntry:
        """A whole entry from an earlier boot: kept for the runtime that will DEL it, or, when
        no runtime will know its sandbox, DEL'd as libcni's GCNetworkList would: its cached
        result as prevResult, its cached args, the network's config from the conf dirs or
        else the one cached in the entry."""
        split = entry.split
        assert self._sandboxes is not None
        if split is None:
            return PlannedEntry(entry, written, Action.KEEP, READABLE)
        known = self._sandboxes.knows(split.container_id)
        if known is not False:
            said = self._sandboxes.describe(split.container_id)
            reason = self._keep_reasons.get(said)
            if reason is None:
                if len(self._keep_reasons) >= 256:
                    self._keep_reasons.clear()
                reason = self._keep_reasons[said] = f"{READABLE} ({said})"
            return PlannedEntry(entry, written, Action.KEEP, reason)
        alive = self.alive(split.container_id)
        if alive is not None:
            return PlannedEntry(entry, written, Action.LEAVE, f"may be alive: {alive}")
        cached = self._read_cached(entry) if self._read_cached else "not read"
        if isinstance(cached, str):
            return PlannedEntry(
                entry, written, Action.LEAVE, f"no runtime will know its sandbox, but {cached}"
            )
        network = split.network
        netlist = self._configs.get(network)
        if netlist is None and network == BUILTIN_LOOPBACK:
            netlist = builtin_loopback()
        problem: str | None = None
        if netlist is None and cached.config is not None:
            netlist, problem = cached_netlist(
                cached.config, entry.name, network, self._cached_config_problem
            )
        reason = f"{FORGOTTEN} ({self._sandboxes.describe(split.container_id)})"
        chain = None
        prev_result = None
        if netlist is None:
            problem = problem or f"no config for network {network!r}, in the conf dirs or cached"
        elif netlist.version_problem is not None:
            problem = netlist.version_problem
        elif problem is None:
            chain = self._chain(netlist)
            problem = self._del_problems.get(network) or chain.problem
            if netlist.reads_cached_result and cached.result is not None:
                try:
                    prev_result = convert(cached.result, netlist.cni_version)
                except Unconvertible as e:
                    reason = f"{reason}; its cached result is not sent: {e}"
        return PlannedEntry(
            entry,
            written,
            Action.DEL_AND_QUARANTINE,
            reason,
            netlist=netlist,
            config_problem=problem,
            chain=chain,
            cached=cached,
            prev_result=prev_result,
        )


def not_to_change(
    entry: CacheEntry, written: WrittenVerdict, alive: Callable[[str], str | None]
) -> tuple[Action, str] | None:
    """Of a file libcni cannot read: the action and reason that hold it back (report, leave),
    or None when it is damage an earlier boot left, whose name says whose it is, of an
    attachment not alive: the only damage anything is done to, wherever it lies."""
    split = entry.split
    owner = split.container_id if split is not None else None
    return held(entry.verdict.content, owner, entry.name_problem, written, alive)


def held(
    content: Content,
    container_id: str | None,
    why_unowned: str | None,
    written: WrittenVerdict,
    alive: Callable[[str], str | None],
) -> tuple[Action, str] | None:
    """not_to_change() for any file a container owns by its name (container_id; None, and
    why_unowned, when the name does not tell)."""
    if not content.is_corrupt:
        return Action.REPORT, f"{content.value}: never touched"
    if container_id is None:
        return Action.REPORT, f"cannot tell whose it is: {why_unowned}"
    if written.written is not Written.PREVIOUS_BOOT:
        return Action.LEAVE, f"written {written.written.value}: may be a write still in flight"
    living = alive(container_id)
    if living is not None:
        return Action.LEAVE, f"may be alive: {living}"
    return None


def why_alive(live_containers: frozenset[str] | str, container_id: str) -> str | None:
    """Why this container's attachments may be alive, if they may: a runtime's live state
    under /run names it, or which containers have live state cannot be told."""
    if isinstance(live_containers, str):
        return f"cannot tell which containers are alive: {live_containers}"
    if container_id in live_containers:
        return "a runtime keeps live state for this container under /run"
    return None


def cached_netlist(
    config: bytes,
    entry_name: str,
    network: str,
    problem_of: Callable[[NetworkList], str | None] | None = None,
) -> tuple[NetworkList | None, str | None]:
    """The config an entry cached, for a DEL of network that no conf dir names: None with why
    when it does not parse or names another network; else with what problem_of finds against
    running it here (host_local.cached_config_problem)."""
    try:
        netlist = parse_conf_bytes(config, f"the config cached in {entry_name}", None)
    except ConfigError as e:
        return None, f"no config for network {network!r} in the conf dirs; {entry_name}'s: {e}"
    if netlist.name != network:
        return None, f"the config {entry_name} cached names network {netlist.name!r}"
    return netlist, problem_of(netlist) if problem_of is not None else None


def held_until(
    plan: Iterable[PlannedEntry],
    ready: Callable[[list[PlannedEntry]], str | None],
    alive: Callable[[PlannedEntry], str | None] | None = None,
    doubted: Callable[[PlannedEntry], str | None] | None = None,
    no_del: Callable[[PlannedEntry], str | None] | None = None,
) -> Iterator[PlannedEntry]:
    """The plan, with every entry that would change something held back until the whole plan
    is made and ready(those entries) finds nothing against acting; if it does, they are left
    instead, for its reason. alive() then says of each whether the whole plan showed it may
    be alive, and doubted() why else its DEL may not run (what it would release besides);
    no_del(), asked after it, why the entry is quarantined with no DEL (what the DEL would
    release cannot be read, and the runtime's own DEL will run it)."""
    held = []
    for planned in plan:
        if planned.action in _CHANGING:  # changes_things, without a call per entry
            held.append(planned)
        else:
            yield planned
    veto = ready(held)
    for planned in held:
        living = alive(planned) if alive is not None and veto is None else None
        doubt = None
        if living is None and doubted is not None and veto is None:
            doubt = doubted(planned)
        if living is not None:
            yield planned._replace(action=Action.LEAVE, reason=f"may be alive: {living}")
        elif doubt is not None:
            yield planned._replace(action=Action.LEAVE, reason=doubt)
        elif veto is None:
            unread = no_del(planned) if no_del is not None else None
            yield planned if unread is None else planned._replace(config_problem=unread)
        else:
            yield planned._replace(
                action=Action.LEAVE,
                reason=f"not proven to predate this boot: {veto}",
                written=planned.written.restated(Written.UNKNOWN, f"{veto}; "),
            )
