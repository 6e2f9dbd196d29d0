"""host-local's reservation store: what each address is reserved to, read, never changed here.

host-local keeps one file per reserved address, `<dataDir>/<network>/<ip>`, holding
`<containerID>\\r\\n<ifname>` (since plugins v0.8.0; the container ID alone before), written
without fsync (shared/reference/node-state.md section 1). A crash leaves some of them empty or
NUL-filled: DEL releases by owner, so such a file is never released by anyone. What becomes of
each reservation is reservations.py's to decide, and release.py's to carry out.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from collections.abc import Iterable, Iterator

from cni_reaper import failpoint, multus
from cni_reaper.boot import BootContext, Written, WrittenVerdict
from cni_reaper.filestat import FileStat
from cni_reaper.netconf import (
    NetworkConfigs,
    NetworkList,
    PerChain,
    go_field,
    go_object,
    kinds_run,
)
from cni_reaper.node_root import (
    LeavesRoot,
    RootBinds,
    bind_refusal,
    host_path,
    resolve_inside,
)
from cni_reaper.plugin import PluginError
from cni_reaper.pool import ListedAddresses, listed
from cni_reaper.pre_runtime import Proof
from cni_reaper.record import Record
from cni_reaper.trust import untrusted
from cni_reaper.unopened import DIR_FLAGS, READ_FLAGS, NotRegularFile, refuse_unless_regular

DEFAULT_DATA_DIR = "/var/lib/cni/networks"
MAX_RESERVATION_BYTES = 4096
# A store listed by the inventory, none of it read yet: for a test, a runtime's write then.
STORE_LISTED = failpoint.declare("host-local.store-listed", step=False)
# What host-local's DEL needs besides the owner's container ID; an ID-only reservation (plugins
# before v0.8.0) does not say it, and host-local then releases by the ID alone whatever ifname
# comes (ReleaseByID's fallback). Kubernetes names the pod's interface eth0.
DEFAULT_IFNAME = "eth0"


class Owner(Record):
    container_id: str
    ifname: str | None  # None: an ID-only reservation

    def describe(self) -> str:
        return self.container_id if self.ifname is None else f"{self.container_id} {self.ifname}"


class Reservation(Record):
    network: str
    store: str  # the network's store dir
    ip: str
    number: int | None  # ip's pool.dotted_quad_number(), as listed() read it
    file: FileStat
    content: str  # valid, empty, zeroed, garbage
    owner: Owner | None  # of a valid one
    written: WrittenVerdict

    @property
    def path(self) -> str:
        return os.path.join(self.store, self.ip)


def _host_local_ipams(netlist: NetworkList) -> list[tuple[tuple[str, object], ...]]:
    """The IPAM config of each plugin of the chain that runs host-local: one whose ipam names
    it, host-local run as the plugin itself, which reads its ipam whatever type that names,
    and flannel, which hands its delegate its own ipam (_flannel_ipam)."""
    found = []
    for plugin in netlist.plugins:
        # host-local's own Net holds its IPAM config by pointer, flannel's as a map: a null
        # empties either.
        ipam = go_object(plugin, "ipam", null_resets=True)
        if go_field(plugin, "type") == "flannel":
            delegated = _flannel_ipam(ipam)
            if delegated is not None:
                found.append(delegated)
        elif isinstance(ipam, tuple) and "host-local" in (
            go_field(ipam, "type"),
            go_field(plugin, "type"),
        ):
            found.append(ipam)
    return found


def _flannel_ipam(ipam: object) -> tuple[tuple[str, object], ...] | None:
    """The IPAM config flannel's delegate runs, if host-local's: flannel's own ipam map, its
    type host-local where it has no key "type" (flannel-io/cni-plugin, getDelegateIPAM), as
    the delegate decodes it: marshalled from a Go map, so one member a key, keys in order."""
    if ipam is None:
        ipam = ()
    if not isinstance(ipam, tuple):
        return None  # flannel fails to decode its config: no DEL of it runs a delegate
    members = dict(ipam)  # a map's key given twice: the last wins
    if members.get("type", "host-local") != "host-local":
        return None
    return tuple(sorted(members.items()))


def _data_dirs(configs: NetworkConfigs) -> Iterator[tuple[str, str]]:
    """(network, host-local's dataDir as the node names it) of every network whose chain uses
    host-local: as the plugin, run from /, sees it, ".." never above "/". A chain that runs it
    more than once has no DEL (twice()); its first is read."""
    for name, netlist in sorted(configs.networks.items()):
        for ipam in _host_local_ipams(netlist)[:1]:
            data_dir = go_field(ipam, "dataDir")
            data_dir = data_dir if isinstance(data_dir, str) and data_dir else DEFAULT_DATA_DIR
            if "\0" in data_dir:
                continue  # no store host-local could ever make
            yield name, os.path.normpath("/" + data_dir.lstrip("/"))


def twice(netlist: NetworkList) -> str | None:
    """Why no DEL of a chain that runs host-local more than once may run: each keeps a store
    of its own, and this run reads one store a network, and binds one for a --root."""
    count = len(_host_local_ipams(netlist))
    if count < 2:
        return None
    return (
        f"the chain of {netlist.name} runs host-local {count} times, each keeping a store of "
        "its own: its DEL would release from stores this run does not read"
    )


def _store_node_paths(configs: NetworkConfigs) -> Iterator[tuple[str, str]]:
    """(network, its store as the node names it): <dataDir>/<network>."""
    for name, data_dir in _data_dirs(configs):
        if "/" in name or "\0" in name or name in (".", ".."):
            # Not a dir of the store, whatever a config says (libcni forbids a "/", and no
            # path holds a NUL: host-local could never make it).
            continue
        yield name, os.path.join(data_dir, name)


def stores(configs: NetworkConfigs, root: str) -> Iterator[tuple[str, str]]:
    """(network, store dir) of every network whose chain uses host-local, under root: as the
    node resolves it, its symlinks never leading out of the root. Then the stores in the
    default dataDir of networks no config names any more: their addresses stay reserved all
    the same, and an entry in the results cache may still carry their config."""
    configured = set()
    for name, node_path in _store_node_paths(configs):
        configured.add(name)
        if root == "/":
            yield name, node_path
            continue
        try:
            yield name, resolve_inside(root, node_path)
        except (LeavesRoot, OSError):
            continue  # no store of the node's there; store_problems() says why
    try:
        default = DEFAULT_DATA_DIR if root == "/" else resolve_inside(root, DEFAULT_DATA_DIR)
        if default != host_path(root, DEFAULT_DATA_DIR):
            return  # reached through a symlink: as store_problems() says, not for plugins
        with os.scandir(default) as listing:
            found = sorted(
                entry.name
                for entry in listing
                if entry.is_dir(follow_symlinks=False) and entry.name not in configured
            )
    except (LeavesRoot, OSError):
        return
    for name in found:
        yield name, os.path.join(default, name)


def store_of(netlist: NetworkList, root: str) -> str | None:
    """The store of the network this config's host-local keeps, under root, as stores() finds
    it; None if its chain uses no host-local, or the store is not to be reached."""
    for _, node_path in _store_node_paths(NetworkConfigs({netlist.name: netlist}, ())):
        if root == "/":
            return node_path
        try:
            return resolve_inside(root, node_path)
        except (LeavesRoot, OSError):
            return None
    return None


# Why no DEL runs through a Multus whose delegates cannot be read from its scratch file.
_UNREAD = (
    "its DEL would DEL the pod's networks the API server names, whose stores this run does "
    "not read, so no DEL through it runs (the runtime's DEL of a sandbox it knows runs it)"
)


class _DelegatesRead(Record):
    """What a run read of the delegates a DEL of one owner through one chain runs."""

    doubt: str | None  # why the DEL may not run: what it would release besides
    unread: str | None  # why no DEL runs: what it would release cannot be read
    # Those its Multus reads, and its DEL removes: each one's path, and the file as it was read
    # (its identity, device and inode, under any of its names)
    scratch_files: tuple[tuple[str, FileStat], ...]
    # Each delegate's store and the ifname it is DEL'd under (None: the DEL's own), where
    # the DEL may run: what it releases, to see after it that it did (Releases).
    releases: tuple[tuple[str, str | None], ...]


class StoreReads:
    """Each store a DEL runs through, read once: what else the DEL would release
    (StoreDoubts.against), and what it should have released, to check after it (Releases);
    for a DEL through Multus, the stores of the delegates its scratch file names, and which
    scratch files a DEL already planned claims (against_delegates, claim_delegates). The
    entries' reading comes before their first DEL, the orphans' after the entries' DELs."""

    def __init__(self, boot: BootContext, proof: Proof) -> None:
        self._boot, self._proof = boot, proof
        self._read: dict[str, StoreDoubts] = {}
        self._by_identity: dict[object, StoreDoubts] = {}
        self._runs_multus = PerChain()
        self._scratch = PerChain()  # (a Multus chain, owner) -> its scratch files' reading
        # (a Multus chain, owner) -> what was read of the delegates its DEL runs
        self._delegates = PerChain()
        # The stores only scratch files name this run has looked at, by identity: with why
        # one is not read (named_store_problem), None for one that is; MAX_NAMED_STORES.
        self._named: dict[object, str | None] = {}
        # Scratch files a DEL already planned will have Multus read, and then remove.
        # By identity (under any of its names): the attachment (network, ifname) whose DEL
        # claimed it.
        self._claimed: dict[tuple[int, int], tuple[str, str]] = {}

    def of(self, store: str) -> StoreDoubts:
        doubts = self._read.get(store)
        if doubts is None:
            # One reading of a dir however its path is spelled: a scratch file's delegates
            # may name one dir of a tenant's through a thousand symlinks to it.
            identity = store_identity(store)
            doubts = self._by_identity.get(identity)
            if doubts is None:
                doubts = self._by_identity[identity] = StoreDoubts(store, indexed=True)
                for _ in inventory("", store, self._boot, self._proof, None, doubts):
                    pass
            self._read[store] = doubts
        return doubts

    def against_delegates(
        self, netlist: NetworkList, container_id: str, stores: Iterable[str], root: str
    ) -> str | None:
        """Why a DEL of the container through netlist may not run for what its delegates
        would release, if it runs Multus: Multus's DEL DELs every delegate its scratch file
        names, each from its own network's store under an ifname of its own (net1, ...). Each
        of stores is held to the owner, whatever the ifname; so is the store of each delegate
        the scratch file names (a NetworkAttachmentDefinition's dataDir no conf names), and
        one that delegates again, or a file whose delegates cannot be told, leaves the DEL.
        One answer per chain and owner: every orphan of the owner asks again."""
        if not self._runs_multus.get(netlist, multus.runs_multus):
            return None

        def read(chain: NetworkList) -> _DelegatesRead:
            return self._delegates_read(chain, container_id, stores, root)

        known = self._delegates.get(netlist, read, container_id)
        return known.doubt

    def delegate_stores(self, netlist: NetworkList, container_id: str, root: str) -> list[str]:
        """The stores of the delegates Multus's scratch files name for a DEL of the container
        through netlist; none for a chain that runs no Multus. Only the DEL's check reads
        them (a NetworkAttachmentDefinition's dataDir no conf names): they go into this
        boot's pre-runtime record with the conf dirs' stores, to be judged as those are."""
        if not self._runs_multus.get(netlist, multus.runs_multus):
            return []
        reads = self._scratch_reads(netlist, container_id, root)
        return [store for store, _ in _delegates_stores(reads, root)]

    def _scratch_reads(
        self, netlist: NetworkList, container_id: str, root: str
    ) -> list[multus.ScratchRead]:
        """What each Multus of the chain's scratch file for the container holds, read once a
        run: the stores recorded for its DEL before the record is kept are the stores its
        check reads."""

        def read(chain: NetworkList) -> list[multus.ScratchRead]:
            return multus.scratch_delegates(chain, container_id, root)

        found: list[multus.ScratchRead] = self._scratch.get(netlist, read, container_id)
        return found

    def claim_delegates(
        self, netlist: NetworkList, container_id: str, attachment: tuple[str, str]
    ) -> str | None:
        """Why no DEL of the container through netlist may run, after against_delegates()
        found nothing against it; None: it is planned, and claims the scratch files its
        Multus will read. A Multus of it has no scratch file whose delegates can be read
        (none there, or a crash's damage, which this run moves away), or one a DEL planned
        before claimed (Multus's DEL removes it): its DEL would DEL the pod's networks the
        API server names, whose stores this run does not read. The runtime's DEL of a
        sandbox it knows runs Multus so. attachment (network, ifname) names the one DEL: the
        orphans of one attachment (a dual-stack pod's two addresses) are released by one DEL,
        and do not hold each other."""
        known: _DelegatesRead | None = self._delegates.known(netlist, container_id)
        if known is None:
            return None
        claimed = [
            path
            for path, seen in known.scratch_files
            if self._claimed.get((seen.device, seen.inode), attachment) != attachment
        ]
        if known.unread is None and claimed:
            return (
                f"a DEL of another attachment of the container through Multus, planned before, "
                f"removes its scratch file {claimed[0]}: {_UNREAD}"
            )
        self._claimed.update(
            ((seen.device, seen.inode), attachment) for _, seen in known.scratch_files
        )
        return known.unread

    def scratch_seen(
        self, netlist: NetworkList, container_id: str
    ) -> tuple[tuple[str, FileStat], ...]:
        """The scratch files the DEL of the container through netlist has its Multus read
        and remove, as they were read: its DEL runs only while each is still that file (one
        removed by a teardown beside the run would have Multus DEL what the API server
        names)."""
        known: _DelegatesRead | None = self._delegates.known(netlist, container_id)
        return () if known is None else known.scratch_files

    def _delegates_read(
        self, netlist: NetworkList, container_id: str, stores: Iterable[str], root: str
    ) -> _DelegatesRead:
        reads = self._scratch_reads(netlist, container_id, root)
        files = tuple((r.path, r.seen) for r in reads if r.seen is not None)
        doubt, unread = self._delegates_doubt(container_id, stores, root, reads)
        seen: set[tuple[int, int]] = set()
        for path, file in files:
            identity = (file.device, file.inode)
            if identity in seen and unread is None:
                # Two Multus of the chain read one file (a cniDir named twice, or otherwise,
                # or through a symlink): the first to run its DEL removes it.
                unread = (
                    f"two Multus of the chain read one scratch file, {path}, which the first "
                    f"to run its DEL removes: {_UNREAD}"
                )
            seen.add(identity)
        releases = tuple(_delegates_stores(reads, root)) if doubt is None else ()
        return _DelegatesRead(doubt, unread, files, releases)

    def delegates_release(
        self, netlist: NetworkList, container_id: str, ifname: str
    ) -> list[Held] | None:
        """What the DEL of the attachment through netlist has Multus's delegates release,
        each from its own store under its own ifname, as their stores were read before it;
        None for a chain that runs no Multus, or one whose scratch files were not all read
        (claim_delegates says why its DEL does not run)."""
        known: _DelegatesRead | None = self._delegates.known(netlist, container_id)
        if known is None or known.unread is not None:
            return None
        found = []
        # Two delegates of one store under one ifname release the same addresses: once.
        for store, named in dict.fromkeys((s, i or ifname) for s, i in known.releases):
            addresses = self.of(store).released_by(container_id, named)
            if addresses:
                found.append(Held(store, named, addresses))
        return found

    def _delegates_doubt(
        self,
        container_id: str,
        stores: Iterable[str],
        root: str,
        reads: list[multus.ScratchRead],
    ) -> tuple[str | None, str | None]:
        for store in stores:
            why = self.of(store).against_owner(container_id)
            if why is not None:
                return why, None
        unread = None
        for read in reads:
            runs = f"Multus's DEL runs the delegates its scratch file {read.path} names"
            if read.problem is not None:
                return f"{runs}, {read.problem}", None
            if read.unread:
                unread = unread or (
                    f"Multus has no scratch file {read.path} whose delegates can be read: {_UNREAD}"
                )
            for delegate in read.delegates:
                if not kinds_run(delegate).isdisjoint(multus.DELEGATING):
                    again = "one of which delegates again: what that would release is not read"
                    return f"{runs}, {again}", None
                why = twice(delegate)
                if why is not None:
                    return why, None
                if not _host_local_ipams(delegate):
                    continue
                kept = store_of(delegate, root)
                if kept is None:
                    return (
                        f"{runs}, one of which keeps a host-local store that cannot be reached",
                        None,
                    )
                why = self._named_store_refusal(kept, read.path)
                why = why or self.of(kept).against_owner(container_id)
                if why is not None:
                    return why, None
        return None, unread

    def _named_store_refusal(self, store: str, scratch_file: str) -> str | None:
        """Why a store a delegate keeps, not yet read (so no conf dir's: those are read
        first), is not read: named_store_problem(), or past the MAX_NAMED_STORES such stores
        a run reads. Looked at once under any spelling."""
        if store in self._read:
            return None
        identity = store_identity(store)
        if identity in self._by_identity:
            return None
        if identity in self._named:
            problem = self._named[identity]
        elif len(self._named) >= MAX_NAMED_STORES:
            problem = f"is past the {MAX_NAMED_STORES} such stores a run reads"
        else:
            problem = self._named[identity] = named_store_problem(store)
        if problem is None:
            return None
        return (
            f"the host-local store {store}, which a delegate in Multus's scratch file "
            f"{scratch_file} names and no conf does, {problem}: it is not read, and no DEL "
            "that may release from it runs"
        )


def store_problems(configs: NetworkConfigs, binds: RootBinds) -> dict[str, str]:
    """Networks whose DEL is not run, and why: a chain that runs host-local more than once
    (twice()), or Multus whose delegates' plugins would run from where this run has not
    checked them (multus.delegate_plugins_problem);
    under a root other than /, a chain that runs Multus (multus.confined_problem),
    a dataDir not bound (binds.refused), or a store reached through a symlink: the plugins
    run confined to the root's dirs (confine.py), but a symlink below them is followed there
    as on this machine, to this machine's files."""
    root = binds.root
    problems = {
        name: why
        for name, n in configs.networks.items()
        if (
            why := twice(n)
            or multus.confined_problem(n, root)
            or multus.delegate_plugins_problem(n, root)
        )
    }
    if not binds.confined:
        return problems
    for name, data_dir in _data_dirs(configs):
        if name not in problems and not binds.covers(data_dir):
            why = binds.refused.get(data_dir) or bind_refusal(data_dir)
            problems[name] = (
                f"host-local's dataDir is not bound for the plugins under {root}: {why}; "
                "no DEL of this network runs"
            )
    for name, node_path in _store_node_paths(configs):
        if name in problems:
            continue
        plain = host_path(root, node_path)
        try:
            resolved = resolve_inside(root, node_path)
        except (LeavesRoot, OSError) as e:
            resolved = str(e)
        if resolved != plain:
            problems[name] = (
                f"host-local's store {plain} is reached through a symlink in the root: a plugin "
                "would follow it to this machine's own files, so no DEL of this network runs"
            )
    return problems


def cached_config_problem(netlist: NetworkList, binds: RootBinds) -> str | None:
    """Why a config cached in a results entry, not in the conf dirs, may not run a DEL: it
    runs host-local more than once (twice()); or, under a root other than /, plugins run
    confined to binds made from the standard dirs and the conf dirs' dataDirs, so a dataDir
    only this config names is this machine's own there."""
    why = (
        twice(netlist)
        or multus.confined_problem(netlist, binds.root)
        or multus.delegate_plugins_problem(netlist, binds.root)
    )
    if why is not None or not binds.confined:
        return why
    alone = NetworkConfigs({netlist.name: netlist}, ())
    for _, data_dir in _data_dirs(alone):
        if not binds.covers(data_dir):
            return (
                f"its cached config's host-local dataDir {data_dir} is not one the plugins "
                f"see under {binds.root}: it would be this machine's own"
            )
    problems = store_problems(alone, binds)
    return next(iter(problems.values()), None)


# The stores Multus's scratch files name that a boot's first run records, at most: a tenant's
# NetworkAttachmentDefinitions name them, and past a few they are no node's layout.
MAX_NAMED_STORES = 64
# The names, subdirectories' too, one store only Multus's scratch files name may hold to be
# recorded by a boot's first run and read by a run's checks of DELs through Multus; with
# MAX_NAMED_STORES, what a run reads of them all. A NetworkAttachmentDefinition's dataDir may
# be any dir of the node (a tenant's emptyDir of a million files), which was listed whole
# into the record in /run and read by every run; a node's host-local store holds an address
# for each pod of the node at most, a few hundred.
MAX_NAMED_STORE_NAMES = 4096


def named_store_problem(store: str) -> str | None:
    """Why a store only Multus's scratch files name is neither recorded nor read: others than
    root may write it (a tenant's emptyDir; no check trusts what it holds), or it holds more
    than MAX_NAMED_STORE_NAMES names, its subdirectories' too as deep as a check reads them
    (_doubt_names), counted no further. None where it cannot be opened: inventory() finds
    nothing there either. Never through a symlink."""
    try:
        dir_fd = os.open(store, DIR_FLAGS)
    except (OSError, ValueError):  # ValueError: a NUL in the path, which names no dir
        return None
    try:
        if untrusted(os.fstat(dir_fd)):
            return "may be written by others than root"
        if _names_below(dir_fd, MAX_NAMED_STORE_NAMES + 1, 0) > MAX_NAMED_STORE_NAMES:
            return f"holds more than {MAX_NAMED_STORE_NAMES:,} names"
        return None
    except OSError:
        return "cannot be listed"
    finally:
        os.close(dir_fd)


def _names_below(dir_fd: int, at_most: int, depth: int) -> int:
    found = 0
    with os.scandir(dir_fd) as listing:
        for entry in listing:
            found += 1
            if found < at_most and depth < MAX_STORE_DEPTH and entry.is_dir(follow_symlinks=False):
                try:
                    below = os.open(entry.name, DIR_FLAGS, dir_fd=dir_fd)
                except OSError:
                    continue  # not read by the check either
                try:
                    found += _names_below(below, at_most - found, depth + 1)
                except OSError:
                    pass  # nor one that cannot be listed
                finally:
                    os.close(below)
            if found >= at_most:
                break
    return found


def distinct_stores(stores: Iterable[str], limit: int) -> tuple[list[str], int]:
    """Each dir of stores once, however its path is spelled (store_identity), up to limit;
    and how many more distinct ones there were. Unbounded, the spellings of one dir of a
    scratch file's delegates (symlinks to it) had the record list it once for each."""
    kept: list[str] = []
    seen: set[object] = set()
    past = 0
    for store in stores:
        identity = store_identity(store)
        if identity in seen:
            continue
        seen.add(identity)
        if len(kept) < limit:
            kept.append(store)
        else:
            past += 1
    return kept, past


def scratch_named_to_record(
    named: Iterable[str], recorded: Iterable[str]
) -> tuple[list[str], list[str]]:
    """Of the stores Multus's scratch files name, those a boot's first run records besides
    recorded (the conf dirs' stores and those cached configs name, recorded whole): each dir
    once, MAX_NAMED_STORES of them at most, none named_store_problem() refuses; and the
    warnings for the rest, whose DELs are left."""
    known = {store_identity(s) for s in recorded}
    stores, past = distinct_stores(
        (s for s in named if store_identity(s) not in known), MAX_NAMED_STORES
    )
    warnings = []
    if past:
        warnings.append(
            f"Multus's scratch files name {past} more host-local stores than the "
            f"{MAX_NAMED_STORES} this boot's pre-runtime record takes: the DELs that would "
            "release from them are left"
        )
    kept = []
    for store in stores:
        problem = named_store_problem(store)
        if problem is None:
            kept.append(store)
        else:
            warnings.append(
                f"the host-local store {store}, which Multus's scratch files name, {problem}: "
                "not in this boot's pre-runtime record; the DELs that would release from it "
                "are left"
            )
    return kept, warnings


def scratch_stores(netlist: NetworkList, owners: Iterable[str], root: str) -> Iterator[str]:
    """The host-local stores of the delegates the chain's Multus scratch files of owners name:
    those a DEL through it of each owner's orphan may release from. A boot's first run records
    them before the runtime starts, as it does those an entry's DEL would release from; a
    dataDir only a NetworkAttachmentDefinition names is found nowhere else."""
    for container_id in owners:
        reads = multus.scratch_delegates(netlist, container_id, root)
        yield from (store for store, _ in _delegates_stores(reads, root))


def owners_in(store: str) -> set[Owner]:
    """The owners the store's reservations name, as host-local's DEL matches them; never
    through a symlink."""
    try:
        dir_fd = os.open(store, DIR_FLAGS)
    except OSError:
        return set()
    found = set()
    try:
        with os.scandir(dir_fd) as listing:
            names = [entry.name for entry in listing if entry.is_file(follow_symlinks=False)]
        for name, _ in listed(names):
            read = read_reservation(name, dir_fd, listed_regular=True)
            owner = None if read is None else read_owner(read[1])[1]
            if owner is not None:
                found.add(owner)
    except OSError:
        pass  # what was read is recorded: the rest's DELs are left, unproven
    finally:
        os.close(dir_fd)
    return found


def _delegates_stores(
    reads: Iterable[multus.ScratchRead], root: str
) -> Iterator[tuple[str, str | None]]:
    """Each delegate's host-local store the scratch files name, with the ifname it is DEL'd
    under (None: the DEL's own)."""
    for read in reads:
        for delegate, ifname in zip(read.delegates, read.ifnames):
            store = store_of(delegate, root) if _host_local_ipams(delegate) else None
            if store is not None:
                yield store, ifname


class Held(Record):
    """Addresses a store held for an attachment (<id>, ifname) before a DEL that releases
    them."""

    store: str
    ifname: str
    addresses: tuple[str, ...]


class Releases:
    """What host-local held for each attachment before its DEL, to see after the DEL that it
    was released: the one effect of a DEL the reaper can check. A DEL that exits 0 and leaves
    an address reserved is a failure, never done. What it held is what the check before the
    DEL read (StoreReads): the same one reading of each store. A DEL through Multus releases
    its delegates' addresses, each from its own store under its own ifname."""

    def __init__(self, stores: Iterable[tuple[str, str]], reads: StoreReads) -> None:
        self._stores = dict(stores)  # network -> its store dir
        self._reads = reads

    def scratch_changed(self, netlist: NetworkList, container_id: str) -> str | None:
        """Why the DEL of the container through netlist may not run now: a scratch file its
        Multus reads changed since it was read (multus.scratch_changed)."""
        return multus.scratch_changed(self._reads.scratch_seen(netlist, container_id))

    def held_by(self, netlist: NetworkList, container_id: str, ifname: str) -> list[Held]:
        """What the DEL of this attachment through netlist releases, as the stores were
        before any DEL of their networks ran in this run: host-local's of the network's own
        store, and those of Multus's delegates."""
        found = self._reads.delegates_release(netlist, container_id, ifname) or []
        store = self._stores.get(netlist.name)
        if store is not None:
            own = self._reads.of(store).released_by(container_id, ifname)
            if own and not any(h.store == store and h.ifname == ifname for h in found):
                found.insert(0, Held(store, ifname, own))
        return found


def store_identity(store: str) -> object:
    """What tells two spellings of one store apart (a dataDir reached through a symlink): its
    (device, inode), or its path where it cannot be looked at. The stat follows the path, and
    nothing is done at what it finds."""
    try:
        return multus.identity_of(os.stat(store))
    except (OSError, ValueError):
        return store


def still_held(held: Held, container_id: str) -> list[str]:
    """Of the addresses held, those the store still holds for the attachment."""
    owner = (f"{container_id}\r\n{held.ifname}".encode(), container_id.encode())
    return [
        ip for ip in held.addresses if go_trim_space(_read_reservation(held.store, ip)) in owner
    ]


def seen_released(
    held: Iterable[Held], container_id: str, ifname: str, still: list[str]
) -> tuple[list[str], list[str]]:
    """After a DEL of (container_id, ifname) every plugin of which exited 0: of what held,
    the addresses released and those left; for each store that still holds any, a phrase
    added to still (its ifname said where it is not the DEL's own)."""
    released: list[str] = []
    left: list[str] = []
    for h in held:
        here = still_held(h, container_id)
        released += (ip for ip in h.addresses if ip not in here)
        if here:
            left += here
            named = "" if h.ifname == ifname else f" (ifname {h.ifname})"
            still.append(f"{h.store} still holds {', '.join(here)}{named}")
    return released, left


def unreleased(still: list[str]) -> PluginError:
    """The reaper's error for a DEL every plugin of which exited 0, after which the stores
    still hold what still says: a failure, never done."""
    return PluginError(
        "host-local", f"every plugin exited 0, but {'; '.join(still)} for this attachment"
    )


def _read_reservation(store: str, name: str) -> bytes:
    """A reservation's bytes, b"" if it is gone or no regular file."""
    found = read_reservation(os.path.join(store, name))
    return b"" if found is None else found[1]


def read_reservation(
    path: str, dir_fd: int | None = None, *, listed_regular: bool = False
) -> tuple[os.stat_result, bytes] | None:
    """The file at path (relative to dir_fd, if given) as it was read, and its bytes; None if
    it is gone, or is no regular file: host-local writes none but regular files, and a FIFO or
    a device named like an address is no reservation, never opened (unopened.py; its listing
    already said it is a regular file when listed_regular)."""
    try:
        if not listed_regular:
            refuse_unless_regular(path, dir_fd)
        fd = os.open(path, READ_FLAGS, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return None
        return st, os.read(fd, MAX_RESERVATION_BYTES)
    except OSError:
        return None
    finally:
        os.close(fd)


def content_of(data: bytes) -> str:
    if not data:
        return "empty"
    if not data.strip(b"\0"):
        return "zeroed"
    owner = go_trim_space(data).split(b"\r\n", 1)[0].split(b"\n", 1)[0]
    if b"\0" in data or not owner or not _PRINTABLE.fullmatch(owner):
        return "garbage"
    return "valid"


# What Go's unicode.IsSpace takes, and so strings.TrimSpace trims, by which host-local's DEL
# compares each file with its owner: ASCII's six, NEL, NBSP and Unicode's other spaces. Not
# str.isspace(), which also takes the separators \x1c to \x1f.
_GO_SPACE = (
    "\t\n\v\f\r \x85\xa0\u1680"
    + "".join(map(chr, range(0x2000, 0x200B)))
    + ("\u2028\u2029\u202f\u205f\u3000")
)
_ASCII_SPACE = b"\t\n\v\f\r "


def go_trim_space(data: bytes) -> bytes:
    """data as Go's strings.TrimSpace leaves it. Bytes that are not UTF-8 are no space to it,
    nor to this (each stays a byte of its own)."""
    if data.isascii():
        return data.strip(_ASCII_SPACE)
    text = data.decode("utf-8", "surrogateescape")
    return text.strip(_GO_SPACE).encode("utf-8", "surrogateescape")


_PRINTABLE = re.compile(rb"[\x21-\x7e]*")  # ASCII with no space or control


def data_dirs(configs: NetworkConfigs) -> set[str]:
    """Every host-local dataDir the network configs use, as absolute node paths."""
    return {data_dir for _, data_dir in _data_dirs(configs)}


class StoreDoubts:
    """What host-local's DEL of an owner would release that this run has not proven an earlier
    boot wrote. Its DEL reads every file under its store, subdirectories too (filepath.Walk;
    through a symlink to a file as well), and releases each whose content, trimmed as Go
    trims it, is '<id>\\r\\n<ifname>', or, if none is, the ID alone: whatever the reaper
    planned for the owner's one address. Filled in by inventory(); what it holds is what a
    DEL must not run past (nearly always nothing)."""

    def __init__(self, store: str, *, indexed: bool = False) -> None:
        self.store = store
        self._unknowable: str | None = None  # a file whose content this run cannot tell
        self._unproven: dict[str, list[tuple[str, str]]] = {}  # trimmed content -> (path, why)
        # trimmed content -> the addresses holding it, when indexed (a store's DELs of results
        # entries, checked after: Releases); the orphans' own reading keeps none of it
        self.indexed = indexed
        self._held: dict[str, list[str]] = {}
        # What is left to read of the store's files larger than a reservation (_doubt_large):
        # a store of them each just under MAX_DOUBTED_BYTES had a run read a mebibyte a name.
        self.large_bytes_left = MAX_DOUBTED_BYTES

    def unknowable(self, path: str, what: str) -> None:
        """path (in the store; "" for the store itself) is what it says: its content unread."""
        if self._unknowable is None:
            self._unknowable = f"{os.path.join(self.store, path) if path else 'it'} {what}"

    @property
    def cannot_tell(self) -> bool:
        """Whether some file's content cannot be told: then no DEL runs past the store, and
        nothing more read of it would change that."""
        return self._unknowable is not None

    def unproven(self, content: bytes, path: str, why: str) -> None:
        if content:
            key = content.decode("utf-8", "surrogateescape")
            self._unproven.setdefault(key, []).append((path, why))

    def held(self, content: bytes, ip: str) -> None:
        """ip, an address of the store, holds content, trimmed."""
        if content:
            self._held.setdefault(content.decode("utf-8", "surrogateescape"), []).append(ip)

    def released_by(self, container_id: str, ifname: str) -> tuple[str, ...]:
        """The addresses host-local's DEL of this attachment releases, of those indexed: each
        held for '<id>\\r\\n<ifname>', or, only if none is, each held for the ID alone."""
        held = self._held
        exact = held.get(f"{container_id}\r\n{ifname}")
        return tuple(exact if exact else held.get(container_id, []))

    def against(self, container_id: str, ifname: str) -> str | None:
        """Why host-local's DEL of this attachment may not run, if it may not."""
        if self._unknowable is not None:
            return self._cannot_tell()
        for key in (f"{container_id}\r\n{ifname}", container_id):
            for path, why in self._unproven.get(key, ()):
                return self._would_release(path, why)
        return None

    def against_owner(self, container_id: str) -> str | None:
        """against() for DELs of the container's attachments under any ifname: a delegating
        plugin's (Multus's), whose delegates' ifnames this run does not know."""
        if self._unknowable is not None:
            return self._cannot_tell()
        owned = f"{container_id}\r\n"
        for key, found in self._unproven.items():  # nearly always empty
            if key == container_id or key.startswith(owned):
                return self._would_release(*found[0])
        return None

    def _cannot_tell(self) -> str:
        return (
            f"host-local's DEL reads every file of {self.store}, and {self._unknowable}: "
            "what else it would release cannot be told"
        )

    def _would_release(self, path: str, why: str) -> str:
        return f"host-local's DEL would also release {os.path.join(self.store, path)}, which {why}"


# How deep a store's subdirectories are read for what host-local's DEL would release: below
# that, nothing can be told. host-local makes none.
MAX_STORE_DEPTH = 8


def inventory(
    network: str,
    store: str,
    boot: BootContext,
    proof: Proof,
    listing: ListedAddresses | None = None,
    doubts: StoreDoubts | None = None,
) -> Iterator[Reservation]:
    """Every reservation of one store, in name order; never through a symlink. When each was
    written is the pre-runtime record's to say (pre_runtime.py). Every address the store
    lists, whatever it holds, is also added to listing, when given: the pools' count of the
    store as this run saw it; and to doubts, when given, what else a DEL would release."""
    try:
        dir_fd = os.open(store, DIR_FLAGS)
    except OSError:
        return
    try:
        dir_st = os.fstat(dir_fd)
        if untrusted(dir_st):
            if doubts is not None:
                doubts.unknowable("", "may be written by others than root")
            return
        proof.open_dir(store, dir_st)
        every, special = _listing(dir_fd)
        others: list[str] | None = [] if doubts is not None else None
        names = listed(sorted(every), others)  # not lock, last_reserved_ip.N: into others
        del every
        failpoint.hit(STORE_LISTED)
        for name, number in names:
            if listing is not None:
                listing.add(name, number)
            found = read_reservation(name, dir_fd, listed_regular=name not in special)
            if found is None:
                continue
            st, data = found
            if st.st_size > MAX_RESERVATION_BYTES:
                if doubts is not None:
                    _doubt_large(dir_fd, name, name, doubts)
                continue
            content, owner = read_owner(data)
            file = FileStat.of(st)
            written = proof.written(store, name, file, boot)
            if doubts is not None:
                _doubt_address(doubts, name, data, written)
            yield Reservation(network, store, name, number, file, content, owner, written)
        if doubts is not None and others is not None:
            _doubt_names(dir_fd, "", [*others, *(special - set(others))], special, doubts, 0)
    finally:
        os.close(dir_fd)


def _doubt_address(doubts: StoreDoubts, ip: str, data: bytes, written: WrittenVerdict) -> None:
    unproven = written.written is not Written.PREVIOUS_BOOT
    if not unproven and not doubts.indexed:
        return  # nearly every reservation of an orphans' reading: nothing to keep of it
    trimmed = go_trim_space(data)
    if doubts.indexed:
        doubts.held(trimmed, ip)
    if unproven:
        why = written.evidence.partition("; clocks:")[0]
        doubts.unproven(trimmed, ip, f"was written {written.written.value}: {why}")


def _doubt_names(
    dir_fd: int,
    prefix: str,
    names: Iterable[str],
    special: set[str],
    doubts: StoreDoubts,
    depth: int,
) -> None:
    """Into doubts, what host-local's DEL reads of these names of a directory of the store
    (special: those that are no regular file) that the inventory does not judge: files that
    are no address's reservation, and subdirectories, whose files no pre-runtime record holds
    at all. Never through a symlink."""
    for name in names:
        path = prefix + name
        if name in special:
            try:
                st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            except OSError:
                continue  # gone
            if stat.S_ISLNK(st.st_mode):
                doubts.unknowable(path, "is a symlink")
            elif not stat.S_ISDIR(st.st_mode):
                doubts.unknowable(path, "is no regular file")
            elif depth >= MAX_STORE_DEPTH:
                doubts.unknowable(path, "lies too deep in the store to be read")
            else:
                _doubt_subdir(dir_fd, name, path, doubts, depth + 1)
            continue
        found = read_reservation(name, dir_fd, listed_regular=True)
        if found is None:
            continue
        st, data = found
        if st.st_size > MAX_RESERVATION_BYTES:
            _doubt_large(dir_fd, name, path, doubts)
            continue
        where = (
            "is no reservation of an address"
            if not prefix
            else "lies in a directory no pre-runtime record holds"
        )
        doubts.unproven(go_trim_space(data), path, where)


# A file larger than this in a store is not read whole for what host-local's DEL would make
# of it: whether it releases it then cannot be told. A reservation is some 70 bytes.
MAX_DOUBTED_BYTES = 1 << 20


def _doubt_large(dir_fd: int, name: str, path: str, doubts: StoreDoubts) -> None:
    """Into doubts, a file larger than a reservation ever is, if host-local's DEL could still
    take it for one: what is left of it once trimmed is as short as an owner. Such files are
    read to MAX_DOUBTED_BYTES in all, a store's whole (doubts.large_bytes_left)."""
    if doubts.cannot_tell:
        return
    try:
        refuse_unless_regular(name, dir_fd)  # a device swapped in is never opened
        fd = os.open(name, READ_FLAGS, dir_fd=dir_fd)
    except NotRegularFile:
        doubts.unknowable(path, "is no regular file")
        return
    except OSError:
        return  # gone, or a symlink swapped in (O_NOFOLLOW)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            doubts.unknowable(path, "is no regular file")
            return
        chunks, size, left = [], 0, doubts.large_bytes_left
        while size <= left:
            chunk = os.read(fd, min(1 << 16, left + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        doubts.unknowable(path, "cannot be read")
        return
    finally:
        os.close(fd)
    doubts.large_bytes_left -= min(size, left)
    if size > left:
        what = (
            f"holds more than {MAX_DOUBTED_BYTES} bytes"
            if left == MAX_DOUBTED_BYTES
            else f"takes what the store's files larger than a reservation hold past "
            f"{MAX_DOUBTED_BYTES} bytes in all"
        )
        doubts.unknowable(path, what)
        return
    trimmed = go_trim_space(b"".join(chunks))
    if len(trimmed) <= MAX_RESERVATION_BYTES:  # else longer than any owner a DEL names
        doubts.unproven(trimmed, path, f"holds {size} bytes, more than host-local writes")


def _doubt_subdir(parent_fd: int, name: str, path: str, doubts: StoreDoubts, depth: int) -> None:
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent_fd)
    except OSError:
        doubts.unknowable(path, "is a directory that cannot be read")
        return
    try:
        every, special = _listing(fd)
        _doubt_names(fd, path + "/", every, special, doubts, depth)
    finally:
        os.close(fd)


def _listing(dir_fd: int) -> tuple[list[str], set[str]]:
    """Every name of the store, and those of them that are no regular file, as the listing's
    own file types say (an lstat only where the file system gives none): nothing needs
    opening to be looked at, and a device's driver never runs. A look at each of 100,000
    names with O_PATH cost 2.3 us; the listing's types, next to nothing."""
    every: list[str] = []
    special: set[str] = set()
    with os.scandir(dir_fd) as entries:
        for entry in entries:
            every.append(entry.name)
            if not entry.is_file(follow_symlinks=False):
                special.add(entry.name)
    return every, special


def address_names(store: str) -> Iterator[tuple[str, int | None]]:
    """The addresses a store holds reserved, whatever their content, one at a time (no list
    of every name at once), each with its number as pool.listed() reads it."""
    try:
        with os.scandir(store) as listing:
            yield from listed(entry.name for entry in listing)
    except OSError:
        return


def read_owner(data: bytes) -> tuple[str, Owner | None]:
    """A reservation's content verdict, and its owner when it names one as host-local's DEL
    matches it: the trimmed content is '<id>\\r\\n<ifname>', or the ID alone."""
    # Nearly every reservation is '<id>\r\n<ifname>' with names libcni takes: one match tells
    # it, and says what the checks below say of it (tests/test_host_local.py holds the two
    # to each other over any bytes).
    plain = _PLAIN_OWNER.fullmatch(data)
    if plain is not None:
        container_id, ifname = plain.groups()
        if ifname not in (b".", b".."):
            return "valid", Owner(container_id.decode("ascii"), sys.intern(ifname.decode("ascii")))
    return _read_owner(data)


# An ID as libcni's ValidateContainerID takes it; an ifname of printable ASCII with no space,
# '/' or ':', at most MAX_IFNAME_BYTES, as its ValidateInterfaceName does ('.' and '..' aside).
_PLAIN_OWNER = re.compile(
    rb"([a-zA-Z0-9][a-zA-Z0-9_.\-]*)\r\n([\x21-\x2e\x30-\x39\x3b-\x7e]{1,15})"
)


def _read_owner(data: bytes) -> tuple[str, Owner | None]:
    """read_owner(), every case."""
    content = content_of(data)
    if content != "valid":
        return content, None
    container_id, separator, ifname = go_trim_space(data).partition(b"\r\n")
    if b"\n" in container_id or b"\r" in container_id or b"\n" in ifname or b"\r" in ifname:
        return "garbage", None  # lines no DEL of host-local's ever matches
    if separator and not ifname.strip():
        return "garbage", None
    owner = Owner(
        container_id.decode("ascii"),
        # one string for each ifname (nearly all eth0), not one per reservation kept
        sys.intern(ifname.decode("utf-8", "replace")) if separator else None,
    )
    if not _libcni_names(owner):
        return "garbage", None  # no ADD through libcni wrote it: no DEL is run with it
    return content, owner


# libcni's ValidateContainerID and ValidateInterfaceName (pkg/utils, v1.0 on), which every ADD
# passes before host-local writes what it was handed. Plugins join both into paths on DEL
# (flannel's and multus's scratch files, tuning's backups): a DEL is never run with others.
_CONTAINER_ID = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.\-]*\Z")
MAX_IFNAME_BYTES = 15


def _libcni_names(owner: Owner) -> bool:
    if not _CONTAINER_ID.match(owner.container_id):
        return False
    ifname = owner.ifname
    if ifname is None:
        return True
    return (
        0 < len(ifname.encode()) <= MAX_IFNAME_BYTES
        and ifname not in (".", "..")
        # U+FFFD: bytes that are not UTF-8, which the DEL could not hand on as they are
        and not any(c in "/:" or c.isspace() or c == "\ufffd" for c in ifname)
    )
