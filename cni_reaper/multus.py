"""Multus's own cache of its delegates' results: what Multus's DEL needs, and what it releases.

Multus (k8snetworkplumbingwg/multus-cni) runs its delegates through libcni with its own cache
dir, /var/lib/cni/multus, so each delegate's result is cached in /var/lib/cni/multus/results as
<delegate's network>-<container ID>-<ifname>, in libcni's format, not in the runtime's results
dir, whose entry for the sandbox is Multus's own (multus-cni-network-<ID>-eth0 by default). The
runtime's DEL of that entry runs Multus's DEL, which DELs each delegate through libcni with
that cache (shared/reference/node-state.md section 4). So:

- a delegate's reservation with no entry of its own network in the results dir is no orphan:
  Multus's DEL releases it;
- a delegate's result the crash left damaged makes that DEL abort on libcni 1.1.x (Multus 4.0
  and 3.9: multus#948, #1447), as a damaged results entry makes the runtime's abort; moved
  away, libcni runs the delegate's DEL with no cached result, as it does for a missing file.
  The reaper runs no DEL of its own for it: the delegate's config is Multus's (its scratch
  file, the NetworkAttachmentDefinition), and Multus's DEL, which the runtime runs, uses it.

Multus also keeps, for each sandbox, a scratch file /var/lib/cni/multus/<container ID>: the
JSON list of the delegates' configs its ADD ran, which its DEL reads to know what to DEL. It is
written with no fsync, so the same crash damages it. A damaged one makes Multus 3.x fail the DEL
at every try, as libcni does, and Multus 4.x end it with success and no delegate's DEL, leaving
the file and leaking the delegates' addresses (multus-cni pkg/multus/multus.go, CmdDel, read in
v3.9.3, v4.0.0 to v4.2.0 and the main branch of 2026-08). A missing one makes either read the
delegates from the pod's networks through the API server, when it still has the pod, and DEL
them; without the pod, end the DEL with success, as for a damaged one. So a damaged scratch
file an earlier boot left is moved aside, as a damaged delegate result is.

The same verdicts decide as for the results dir (plan.py), but the one change is a move.

Where: Multus keeps all of it in its config's `cniDir`, /var/lib/cni/multus when it names none
(pkg/types/conf.go, defaultCNIDir). The thin plugin runs on the node, so a `cniDir` its config in
the conf dirs names is a node path, and is inspected as the default one is. The thick plugin's
shim hands its config to Multus's daemon, whose own config may override `cniDir` and which sees
the node's files through its pod's mounts: a `cniDir` other than the default there names no
place this reaper can find, and leaves the delegates' addresses in doubt.
"""

from __future__ import annotations

import errno
import os
import posixpath
import stat
from collections.abc import Callable, Collection, Iterable

from cni_reaper import cache, content, leaving, node_root
from cni_reaper.boot import Written, WrittenVerdict
from cni_reaper.cache import CacheEntry
from cni_reaper.content import Content, ContentVerdict
from cni_reaper.filestat import FileStat
from cni_reaper.netconf import (
    NetworkList,
    as_go_reads,
    configs_running,
    go_field,
    go_object,
    go_string,
    kinds_run,
    parse_conf_bytes,
)
from cni_reaper.plan import Action, held, not_to_change
from cni_reaper.plugin import vet_plugin_dirs
from cni_reaper.record import Record
from cni_reaper.trust import untrusted
from cni_reaper.unopened import DIR_FLAGS

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, TypeVar

    Planned = TypeVar("Planned", "PlannedDelegate", "PlannedScratch")

SUBDIR = "multus"  # Multus's cacheDir, under libcni's cache dir
DEFAULT_CNI_DIR = "/var/lib/cni/multus"  # the same, as Multus's own default names it
DEFAULT_BIN_DIR = "/opt/cni/bin"  # where Multus looks up its delegates' plugins first
# A scratch file holds a few delegates' configs, some KiB: past this, they are not read.
MAX_SCRATCH_BYTES = 1 << 20
QUARANTINE_SUBDIR = "multus"  # its files' box in a boot's quarantine dir
THIN_PLUGIN = "multus"  # the plugin type that runs Multus on the node itself
THICK_SHIM = "multus-shim"  # the one that hands the call to Multus's daemon
# Plugins whose DEL runs a config of their own keeping, not the one they are handed.
DELEGATING = frozenset({"flannel", THIN_PLUGIN, THICK_SHIM})
# The reaper's own dirs looked at, at most, to tell a cache dir from them: its state dir holds
# a quarantine dir per boot with a few subdirs, and nothing prunes it.
MAX_OWN_DIRS = 1_000_000
# Cache dirs other than the default that are inspected, at most (each holds two descriptors
# through the run); past them, every delegate's address counts as cached.
MAX_NAMED_DIRS = 16

STALE_DAMAGE = (
    "left by an earlier boot; Multus's DEL of this delegate would abort on it (libcni 1.1.x): "
    "moved aside, libcni runs that DEL with no cached result"
)
READABLE = "libcni can read it: Multus's own DEL will use it"
STALE_SCRATCH = (
    "left by an earlier boot; Multus's DEL cannot read the delegates from it (3.x fails that "
    "DEL at every try, 4.x ends it with no delegate's DEL and their addresses leak): moved "
    "aside, Multus's DEL reads them from the pod's networks, while the API server has the pod"
)
SCRATCH_READABLE = "whole JSON, no crash's damage: left for Multus's DEL"

# (network, container ID, ifname) -> that Multus cached that delegate's result, and where, or
# may have (and why it cannot be told); None if it did not
DelegateResults = Callable[[str, str, str], "str | None"]


class PlannedDelegate(Record):
    entry: CacheEntry
    written: WrittenVerdict
    action: Action  # keep, quarantine, leave or report
    reason: str


class MultusFile(Record):
    """A kind of Multus's files: what the text says of one, and its journal action's suffix."""

    called: str
    action_suffix: str


DELEGATE_RESULT = MultusFile("Multus delegate result", "delegate-result")
SCRATCH_FILE = MultusFile("Multus scratch file", "multus-scratch")


class ScratchFile(Record):
    """One of Multus's scratch files: its name is the sandbox's container ID."""

    name: str
    file: FileStat
    verdict: ContentVerdict

    @property
    def content(self) -> Content:
        return self.verdict.content


class PlannedScratch(Record):
    entry: ScratchFile
    written: WrittenVerdict
    action: Action  # keep, quarantine, leave or report
    reason: str


def scratch_verdict(data: bytes) -> ContentVerdict:
    """What a scratch file's bytes are to Multus's DEL, which decodes them with Go's
    encoding/json into a list of delegates: whole JSON that is no list is no crash's damage
    (a format this reaper does not know), never acted on."""
    doc = content.document(data)
    if type(doc) is ContentVerdict:
        return doc
    if type(doc) is list:
        return ContentVerdict(Content.VALID, f"a JSON list of {len(doc)} items")
    return ContentVerdict(
        Content.MISMATCHED, f"JSON {type(doc).__name__}, not Multus's list of delegates"
    )


def _vet(step: str, fd: int) -> None:
    problem = untrusted(os.fstat(fd))
    if problem:
        raise OSError(errno.EPERM, f"{step} {problem}")


def identity_of(st: os.stat_result) -> tuple[int, int]:
    """A dir's (device, inode): a bind mount shows the dir it mounts, whatever path it is
    reached by."""
    return st.st_dev, st.st_ino


def found_in(
    top: str, wanted: Collection[tuple[int, int]]
) -> tuple[frozenset[tuple[int, int]], str | None]:
    """Which of the wanted dir identities are top or a dir below it (no symlink followed,
    one walk, ended early once all are found): the reaper's own state dir, which no cache dir
    a config names may be. And why the walk was not whole (past MAX_OWN_DIRS dirs, one that
    cannot be read), None when it was; nothing is found in a top that does not exist."""
    limit = MAX_OWN_DIRS
    hits: set[tuple[int, int]] = set()
    pending, walked = [top], 0
    try:
        while pending and len(hits) < len(wanted):
            where = pending.pop()
            fd = os.open(where, DIR_FLAGS)
            try:
                here = identity_of(os.fstat(fd))
                if here in wanted:
                    hits.add(here)
                with os.scandir(fd) as listing:
                    for entry in listing:
                        if entry.is_dir(follow_symlinks=False):
                            pending.append(os.path.join(where, entry.name))
            finally:
                os.close(fd)
            walked += 1
            if walked > limit:
                return frozenset(hits), f"{top} holds more than {limit} dirs"
    except FileNotFoundError as e:
        if walked:  # a dir gone while walked: the walk is not whole
            return frozenset(hits), f"{e.filename}: {e.strerror}"
    except OSError as e:
        return frozenset(hits), f"{e.filename or top}: {e.strerror or e}"
    return frozenset(hits), None


def _cannot(what: str, where: str, e: OSError) -> str:
    if e.errno in (errno.ELOOP, errno.ENOTDIR):
        why = "a symlink or not a directory on the way; refusing to inspect it"
    else:
        why = e.strerror or str(e)
    return f"Multus's {what} {where}: {why}"


def runs_multus(netlist: NetworkList) -> bool:
    """Whether the chain runs Multus, thin or thick, as a plugin or as one's IPAM plugin: its
    DEL DELs delegates whose configs (Multus's scratch file, the pod's networks) this run
    does not read."""
    return not kinds_run(netlist).isdisjoint((THIN_PLUGIN, THICK_SHIM))


class ScratchRead(Record):
    """What one Multus of a chain will DEL for a container, as its scratch file tells."""

    path: str  # the scratch file, as found from here
    delegates: tuple[NetworkList, ...]  # the configs its DEL hands its delegates
    problem: str | None  # why they cannot be told from the file, which is there
    # No file, or none that decodes to a list (a crash's damage, which this run moves away):
    # Multus's DEL then asks the API server for the pod's networks, which are not read here.
    unread: bool
    # The ifname each delegate is DEL'd under, None for the ifname of the DEL itself.
    ifnames: tuple[str | None, ...] = ()
    # The file as it was read, where there is one: the same file under another name (a
    # cniDir spelled otherwise, a symlink to it) is the same file, which one DEL removes.
    seen: FileStat | None = None


def scratch_delegates(netlist: NetworkList, container_id: str, root: str) -> list[ScratchRead]:
    """What the DEL of the container through this chain has each thin Multus plugin of it
    DEL, as its scratch file (<cniDir>/<container ID>) names the delegates: each one's config
    is its raw bytes ("Bytes"), a conflist where its ConfList has plugins, else one plugin's
    config (multus-cni: CmdDel, consumeScratchNetConf, delPlugins)."""
    found = []
    for plugin in configs_running(netlist, THIN_PLUGIN):
        value = go_field(plugin, "cniDir")
        cni_dir = value if isinstance(value, str) else DEFAULT_CNI_DIR
        node_path = posixpath.normpath("/" + posixpath.join(cni_dir, container_id).lstrip("/"))
        found.append(_scratch_read(root, node_path))
    return found


def scratch_changed(seen: Iterable[tuple[str, FileStat]]) -> str | None:
    """Why a DEL through Multus may not run now: a scratch file its Multus reads is no longer
    the one its plan read (seen: each one's path and the file as read). Removed by a teardown
    beside the run, Multus's DEL would DEL the networks the API server names, whose stores
    this run did not read; rewritten, it names delegates the plan did not read."""
    for path, file in seen:
        try:
            st = os.stat(path)  # its identity, under the name the plan found it by
        except FileNotFoundError:
            why: str | None = "gone since it was read"
        except OSError as e:
            why = f"cannot be looked at again: {e.strerror}"
        else:
            why = file.changes(st)
        if why is not None:
            return f"Multus's scratch file {path} {why}; the DEL is left for the next run"
    return None


def _scratch_read(root: str, node_path: str) -> ScratchRead:
    path = node_root.host_path(root, node_path)
    try:
        fd, _ = node_root.open_inside(root, node_path)
    except FileNotFoundError:
        return ScratchRead(path, (), None, True)
    except (node_root.LeavesRoot, OSError) as e:
        return ScratchRead(path, (), f"which cannot be opened here ({e})", False)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_SCRATCH_BYTES:
            why = f"which is no file of at most {MAX_SCRATCH_BYTES} bytes"
            return ScratchRead(path, (), why, False)
        seen = FileStat.of(st)
        data = os.read(fd, MAX_SCRATCH_BYTES + 1)
    except OSError as e:
        return ScratchRead(path, (), f"which cannot be read ({e.strerror})", False)
    finally:
        os.close(fd)
    import json  # noqa: PLC0415 (only a DEL through Multus reads its delegates)

    try:
        # As Go decodes it: each object's members in the file's order, a key in any case,
        # the last one given winning (go_field on pairs).
        doc = json.loads(
            as_go_reads(data), object_pairs_hook=tuple, parse_constant=content.no_constants
        )
    except (ValueError, RecursionError):
        return ScratchRead(path, (), None, True, seen=seen)
    if type(doc) is not list:
        return ScratchRead(path, (), None, True, seen=seen)
    delegates = _delegates_in(doc, path)
    if isinstance(delegates, str):
        return ScratchRead(path, (), delegates, False, seen=seen)
    configs = tuple(config for config, _ in delegates)
    ifnames = tuple(ifname for _, ifname in delegates)
    return ScratchRead(path, configs, None, False, ifnames, seen)


def _delegates_in(doc: list[Any], path: str) -> list[tuple[NetworkList, str | None]] | str:
    """Each delegate's config, and the ifname Multus's DEL gives it (multus-cni: getIfname):
    the one its ADD was asked for ("ifnameRequest"), else the DEL's own for the first (the
    master plugin), net<index> for the others."""
    import base64  # noqa: PLC0415 (only a DEL through Multus reads its delegates)

    delegates = []
    for index, item in enumerate(doc):
        try:
            if type(item) is not tuple:
                raise ValueError("no object")
            # One that is no string fails Go's decoding of the whole list, and Multus's DEL
            # then DELs no delegate.
            requested = go_string(item, "ifnameRequest")
            ifname = requested or (None if index == 0 else f"net{index}")
            # A null empties a slice, as Go decodes it: no config, no plugins.
            raw = go_field(item, "Bytes", null_resets=True)
            if type(raw) is not str:
                raise ValueError("no config")
            listed = go_object(item, "ConfList")
            plugins = (
                go_field(listed, "plugins", null_resets=True) if type(listed) is tuple else None
            )
            if plugins is not None and type(plugins) is not list:
                raise ValueError("its ConfList's plugins are no list")
            config = base64.b64decode(content.without_newlines(raw), validate=True)
            source = f"{path} (delegate {index})"
            delegates.append((parse_conf_bytes(config, source, not plugins), ifname))
        except (ValueError, TypeError) as e:
            return f"whose delegate {index} has no config that decodes here ({e})"
    return delegates


def delegate_plugins_problem(netlist: NetworkList, root: str) -> str | None:
    """Why no DEL through this chain may run, if Multus would run its delegates' plugins
    from where this run has not checked them: the thick plugin's daemon, from a binDir (and
    a cache dir) of its own config, which this run does not read; the thin plugin, from a
    binDir (its own default, /opt/cni/bin, where none is given) that fails the checks every
    dir of CNI_PATH passes (plugin.vet_plugin_dirs), since it looks there before CNI_PATH,
    whatever dirs this run was given (multus-cni: conflistDel, confDel). Run as a plugin's
    IPAM plugin, the thin one is handed that plugin's config, whose binDir it reads."""
    if THICK_SHIM in kinds_run(netlist):
        return (
            "Multus's daemon runs its delegates from a config, cache dir and binDir of its own, "
            "which this run does not read: no DEL through it runs (the runtime's DEL of a "
            "sandbox it knows runs it)"
        )
    for plugin in configs_running(netlist, THIN_PLUGIN):
        # Decoded over Multus's defaults: a null keeps /opt/cni/bin, a string replaces it;
        # Go joins a relative one to the plugin's working dir, which is /.
        value = go_field(plugin, "binDir")
        named = value if isinstance(value, str) else DEFAULT_BIN_DIR
        if "\0" in named:
            return f"Multus's binDir {named!r} names no dir it could search"
        node_path = posixpath.normpath("/" + named.lstrip("/"))
        vetted = vet_plugin_dirs([node_root.host_path(root, node_path)])
        for bin_dir, why in vetted.refused:
            return (
                f"Multus runs its delegates' plugins from its binDir {bin_dir} first, which "
                f"fails the checks of a plugin dir ({why}): no DEL through it runs"
            )
    return None


def confined_problem(netlist: NetworkList, root: str) -> str | None:
    """Why no DEL through this chain may run under a root other than /, if it runs Multus:
    its DEL opens what its config names (its cniDir, its kubeconfig, the thick plugin's
    daemon socket) and asks the API server, none of which the plugins' confinement puts the
    root's in place of this machine's own."""
    if root == "/" or not runs_multus(netlist):
        return None
    return (
        f"under {root}, Multus's DEL would read and remove this machine's own files where its "
        "config names its cache dir, a kubeconfig or a daemon's socket, and ask the API "
        "server: no DEL through Multus runs under a --root (on the node, the runtime's DEL "
        "of a sandbox it knows runs it)"
    )


class NamedDir(Record):
    """A cache dir other than the default that a Multus config in the conf dirs names."""

    node_path: str | None  # as named, cleaned; None: it names none
    problem: str | None  # why where it is on this node cannot be told


def named_dirs(networks: Iterable[NetworkList]) -> list[NamedDir]:
    """The `cniDir`s the conf dirs' Multus configs name other than the default, in load
    order, each once. The runtime's DEL hands Multus the config from the conf dirs, so these
    are where Multus's DEL will look. A value Multus could not load (no string), or one that
    names no absolute path (Go joins a relative one to the plugin's working dir; Multus
    releases differ on an empty one), cannot be placed; nor can the thick plugin's, which
    Multus's daemon reads through its pod's mounts and may override. A placed one is cleaned
    as Go's filepath.Join cleans it, `..` taken lexically, and walked as named from the root:
    a /var/run that is a symlink to /run is followed as the node has it."""
    found: list[NamedDir] = []
    for netlist in networks:
        for plugin in netlist.plugins:
            kind = go_field(plugin, "type")
            if kind not in (THIN_PLUGIN, THICK_SHIM):
                continue
            # As Go reads it into Multus's NetConf: a key in any case, the last one winning,
            # a null leaving what came before.
            value = go_field(plugin, "cniDir")
            if value is None:
                continue
            named_by = f"the Multus config of network {netlist.name!r} ({netlist.source})"
            if type(value) is not str:
                named = NamedDir(None, f"{named_by} has a cniDir that is no string")
            elif not value.startswith("/"):
                named = NamedDir(None, f"{named_by} names cniDir {value!r}, no absolute path")
            elif (cleaned := "/" + posixpath.normpath(value).lstrip("/")) == DEFAULT_CNI_DIR:
                continue
            elif kind == THICK_SHIM:
                problem = (
                    f"{named_by} names cniDir {value!r} for Multus's daemon, which sees the "
                    "node through its pod's mounts: where that is on this node cannot be told"
                )
                named = NamedDir(cleaned, problem)
            else:
                named = NamedDir(cleaned, None)
            if named not in found:
                found.append(named)
    return found


class MultusCache:
    """Multus's cache dir as this run found it, before anything moved: its delegate results
    dir's names (for the reservations, judged after the moves) and entries, judged as a
    results dir's, and its scratch files."""

    def __init__(
        self,
        scratch_dir: str,
        fd: int | None,
        names: frozenset[str] = frozenset(),
        problem: str | None = None,
        scratch_fd: int | None = None,
        said: str | None = None,
    ) -> None:
        self.scratch_dir = scratch_dir
        self.results_dir = os.path.join(scratch_dir, "results")
        self.fd = fd  # the results dir's; None: none, or one that cannot be looked at (problem)
        self.present = fd is not None  # as opened, whether closed since or not
        self._names = names  # the dir's, before this run moved any
        self.problem = problem
        self.scratch_fd = scratch_fd  # None: no Multus dir, or one that cannot be looked at
        # where a delegate's result counts as cached, in a reason
        self.said = said or self.results_dir

    @classmethod
    def open(cls, cache_dir: str) -> MultusCache:
        """<cache_dir>/multus, the default place, and its results dir, the cache dir as
        paths.py resolved it (inside --root), then each of the two steps below it without
        following a symlink: one would lead to another machine's files under --root, or back
        to the runtime's results dir."""
        scratch_dir = os.path.join(cache_dir, SUBDIR)
        try:
            top = os.open(cache_dir, DIR_FLAGS & ~os.O_NOFOLLOW)
            try:
                fd = os.open(SUBDIR, DIR_FLAGS, dir_fd=top)
            finally:
                os.close(top)
        except FileNotFoundError:
            return cls(scratch_dir, None)
        except OSError as e:
            return cls(scratch_dir, None, problem=_cannot("cache", scratch_dir, e))
        return cls._below(scratch_dir, fd)

    @classmethod
    def named(cls, root: str, node_path: str) -> MultusCache:
        """The dir a Multus config names, as the node resolves it inside root (node_root.py:
        a symlink on the way is followed as the node would, never out of root), and its
        results dir below it without following a symlink."""
        where = node_root.host_path(root, node_path)
        try:
            fd, resolved = node_root.open_inside(root, node_path, directory=True)
        except FileNotFoundError:
            return cls(where, None)
        except node_root.LeavesRoot as e:
            return cls(where, None, problem=f"Multus's cache {where}: {e}")
        except OSError as e:
            return cls(where, None, problem=_cannot("cache", where, e))
        return cls._below(node_root.host_path(root, resolved), fd)

    @classmethod
    def _below(cls, scratch_dir: str, scratch_fd: int) -> MultusCache:
        """The cache whose dir is open at scratch_fd (now this cache's), and the results dir
        below it. Neither may be writable by others, whose files could steer a move (cache.py's
        rule); a problem with either leaves both alone."""
        results_dir = os.path.join(scratch_dir, "results")
        opened = [scratch_fd]
        where = scratch_dir
        try:
            _vet(os.path.basename(scratch_dir), scratch_fd)
            where = results_dir
            try:
                opened.append(os.open("results", DIR_FLAGS, dir_fd=scratch_fd))
            except FileNotFoundError:
                return cls(scratch_dir, None, scratch_fd=scratch_fd)  # scratch files alone
            _vet("results", opened[1])
            # A file a move cut short hid (leaving.py) is still cached, under its own name.
            names = frozenset(leaving.original_of(n) or n for n in os.listdir(opened[1]))
        except OSError as e:
            for fd in opened:
                os.close(fd)
            what = "delegate results" if where == results_dir else "cache"
            return cls(scratch_dir, None, problem=_cannot(what, where, e))
        return cls(scratch_dir, opened[1], names, scratch_fd=scratch_fd)

    @classmethod
    def unknown(cls, named: str | None, problem: str, why: str = "not looked at") -> MultusCache:
        """A cache not inspected as Multus's (named: its dir as its config names it, if it
        names one; why: in a reservation's reason): every delegate's address counts as cached
        there (delegate_results)."""
        said = (
            f"{os.path.join(named, 'results')}, as a Multus config names it; {why}"
            if named
            else f"in a cache dir a Multus config names; {why}"
        )
        return cls(named or "", None, problem=problem, said=said)

    def identities(self) -> frozenset[tuple[int, int]]:
        """Its dir's and its results dir's identity_of, those open."""
        return frozenset(
            identity_of(os.fstat(fd)) for fd in (self.scratch_fd, self.fd) if fd is not None
        )

    def identity(self) -> tuple[int, int] | None:
        """Its dir's (device, inode), when it is open."""
        return None if self.scratch_fd is None else identity_of(os.fstat(self.scratch_fd))

    def close(self) -> None:
        for fd in (self.fd, self.scratch_fd):
            if fd is not None:
                os.close(fd)
        self.fd = self.scratch_fd = None

    def scratch_files(self, settle: cache.Settle | None = None) -> list[ScratchFile]:
        """The scratch files, in name order: the files named by a container ID; nothing
        else in the dir is Multus's scratch (its results dir is judged apart)."""
        if self.scratch_fd is None:
            return []
        found = []
        for name, file, verdict in cache.inspect_all(
            self.scratch_fd, scratch_verdict, cache.is_container_id, settle
        ):
            assert isinstance(verdict, ContentVerdict)  # what scratch_verdict makes
            found.append(ScratchFile(name, file, verdict))
        return found

    def entries(
        self, networks: Collection[str], settle: cache.Settle | None = None
    ) -> list[CacheEntry]:
        if self.fd is None:
            return []
        return list(cache.inventory(self.fd, networks, settle))

    def delegate_results(
        self, moved: Callable[[str], frozenset[str] | None]
    ) -> DelegateResults | None:
        """Where Multus cached a delegate's result, if it did, as the dir was before this run
        moved anything, or a run moved it aside since (moved(results_dir): those names, None
        when that cannot be told): Multus's DEL still comes for them, with no cached result.
        None when Multus keeps no cache on the node, as on most nodes, which then pay nothing
        per reservation. What cannot be looked at counts as cached: a reservation kept is the
        side doubt may err on."""
        if not self.present and self.problem is None:
            return None
        if self.problem is not None:
            doubt = f"Multus may have cached it as a delegate's ({self.said})"
            return lambda network, container_id, ifname: doubt
        earlier = moved(self.results_dir)
        if earlier is None:
            doubt = (
                f"Multus may have cached it as a delegate's ({self.said}, or runs may have "
                "moved it from there: the quarantine's record of those cannot be read)"
            )
            return lambda network, container_id, ifname: doubt
        names, where = self._names | earlier, self.results_dir

        def cached(network: str, container_id: str, ifname: str) -> str | None:
            name = f"{network}-{container_id}-{ifname}"
            if name not in names:
                return None
            return f"Multus cached it as a delegate's ({os.path.join(where, name)})"

        return cached


def plan_delegate(
    entry: CacheEntry, written: WrittenVerdict, alive: Callable[[str], str | None]
) -> PlannedDelegate:
    """The policy for one of Multus's delegate results, when it was written as the pre-runtime
    record says (pre_runtime.py): the results dir's, with a move where that one has a DEL and
    a move."""
    content = entry.verdict.content
    if content is Content.VALID or content is Content.LEGACY:
        return PlannedDelegate(entry, written, Action.KEEP, READABLE)
    holding = not_to_change(entry, written, alive)
    if holding is not None:
        return PlannedDelegate(entry, written, *holding)
    return PlannedDelegate(entry, written, Action.QUARANTINE, STALE_DAMAGE)


def plan_scratch(
    entry: ScratchFile, written: WrittenVerdict, alive: Callable[[str], str | None]
) -> PlannedScratch:
    """The policy for one of Multus's scratch files: a delegate result's."""
    if entry.content is Content.VALID:
        return PlannedScratch(entry, written, Action.KEEP, SCRATCH_READABLE)
    holding = held(entry.content, entry.name, None, written, alive)
    if holding is not None:
        return PlannedScratch(entry, written, *holding)
    return PlannedScratch(entry, written, Action.QUARANTINE, STALE_SCRATCH)


def delegate_doc(
    planned: PlannedDelegate,
    results_dir: str,
    outcome: str,  # planned, done, failed or skipped
    quarantined_to: str | None = None,
    problem: str | None = None,
) -> dict[str, Any]:
    """One delegate result in the report, the journal and its sidecar."""
    entry, split = planned.entry, planned.entry.split
    names = {
        "network": split.network if split else None,
        "container_id": split.container_id if split else None,
        "ifname": split.ifname if split else None,
        "name_problem": entry.name_problem,
    }
    return _doc(planned, results_dir, names, outcome, quarantined_to, problem)


def scratch_doc(
    planned: PlannedScratch,
    scratch_dir: str,
    outcome: str,  # planned, done, failed or skipped
    quarantined_to: str | None = None,
    problem: str | None = None,
) -> dict[str, Any]:
    """One scratch file in the report, the journal and its sidecar."""
    names = {"container_id": planned.entry.name}
    return _doc(planned, scratch_dir, names, outcome, quarantined_to, problem)


def _doc(
    planned: Planned,
    where: str,
    names: dict[str, Any],  # whose the file is, as its name says
    outcome: str,
    quarantined_to: str | None,
    problem: str | None,
) -> dict[str, Any]:
    entry = planned.entry
    return {
        "path": os.path.join(where, entry.name),
        **names,
        "file": {"kind": entry.file.kind, "size": entry.file.size},
        "content": entry.content.value,
        "content_detail": entry.verdict.detail,
        "written": planned.written.written.value,
        "evidence": planned.written.evidence,
        "action": planned.action.value,
        "reason": planned.reason,
        "outcome": outcome,
        "quarantined_to": quarantined_to,
        "problem": problem,
    }


def held_back(planned: Planned, veto: str) -> Planned:
    """A move the whole plan's last look found against (pre_runtime.confirm): left instead."""
    if planned.action is not Action.QUARANTINE:
        return planned
    return planned._replace(
        action=Action.LEAVE,
        reason=f"not proven to predate this boot: {veto}",
        written=planned.written.restated(Written.UNKNOWN, f"{veto}; "),
    )
