"""Where the container runtimes of a node keep their sockets and state, from their own config.

Every path is the node's: configs are read inside --root, and each path they name is taken
inside it too (node_root.py). Each located path says where it came from, and a default that a
config overrides is still watched: a runtime started before its config was edited keeps using
it until it restarts. A config that cannot be used (unreadable, not TOML, too large, a symlink
out of the root) is a warning naming the file, and the defaults; never an exception.

Facts this follows, from the runtimes' sources:
- containerd (cmd/containerd/server/config/config.go, services/server/config/config.go in 1.x):
  the main file is loaded first, then its `imports`, breadth first: each file's imports join
  the end of the queue and a path already loaded is skipped. An import is cleaned and, when
  relative, joined to the directory of the file naming it; it is globbed (Go filepath.Glob)
  only when it contains "*". Since 1.6.29 and 1.7.16 a relative glob is joined like any other
  import (before, it was left relative to containerd's working directory). Each file is merged
  over the ones before it: a non-empty scalar wins, and a `plugins` table replaces the earlier
  one of the same plugin whole. `root`, `state` and `[grpc] address` mean the same in config
  versions 1 to 3; version 4 (2.3 and later) moves the address to
  `[plugins."io.containerd.server.v1.grpc"] address`. The runc shim keeps runc's state in
  /run/containerd/runc unless the runtime's options set `Root`.
- containerd's CNI dirs (pkg/cri/config in 1.6 and 1.7, internal/cri/config and
  plugins/cri/runtime in 2.x): the CRI plugin's `cni` table, `conf_dir` (default
  /etc/cni/net.d) and `bin_dir`; 2.x reads `bin_dirs` (a list, default ["/opt/cni/bin"]) from
  `[plugins."io.containerd.cri.v1.runtime".cni]`, still takes `bin_dir` there (when `bin_dirs`
  is unset or the default; both set, it refuses to start) and migrates a version 1 or 2 file's
  `[plugins."io.containerd.grpc.v1.cri".cni]` into it, filling only the keys the file leaves
  unset. A runtime handler's `cni_conf_dir` is one more conf dir (for its pods). 1.6 and 1.7
  replace a plugin's whole table with a later file's; 2.0 and later merge the tables key by key
  (containerd PR #9982). `disabled_plugins` naming the CRI plugin means no pod networking.
- k3s and RKE2 start their containerd with `-a /run/k3s/containerd/containerd.sock --state
  /run/k3s/containerd --root <data-dir>/agent/containerd`; flags win over the generated config
  (k3s pkg/agent/containerd, rke2 pkg/agent config: both use /run/k3s/containerd). k3s writes
  the cni table only when it runs its own flannel (pkg/agent/templates): `conf_dir`
  <data-dir>/agent/etc/cni/net.d and `bin_dir` the dir it found host-local in,
  /var/lib/rancher/k3s/data/<hash>/bin (`data/current` links to the running one). RKE2 never
  runs k3s's flannel (its defaults set NoFlannel): its containerd keeps containerd's CNI dirs.
- CRI-O (docs/crio.conf.5.md, crio.conf.d.5.md, pkg/config): /etc/crio/crio.conf, then every
  file below /etc/crio/crio.conf.d (a filepath.Walk: lexical order, recursive, whatever the
  name), a later value winning. `[crio] runroot` and `root` default to containers/storage's
  storage.conf (/etc/containers/storage.conf, else /usr/share/containers/storage.conf,
  `[storage] runroot` and `graphroot`, built-in /run/containers/storage). Network namespaces
  are pinned in `[crio.runtime] namespaces_dir`/netns (default /var/run). The OCI runtime's
  state is in each `[crio.runtime.runtimes.<name>] runtime_root` (default /run/crun; /run/runc
  for runc before crun became the default). CNI: `[crio.network] network_dir` (default
  /etc/cni/net.d/) and `plugin_dirs` (default ["/opt/cni/bin/"]), the deprecated `plugin_dir`
  appended to them (pkg/config/config.go, config_unix.go).
- Debian's containerd (1.6 in bookworm, 1.7 in trixie) keeps upstream's compiled-in
  /opt/cni/bin (`containerd config default` prints it) and ships a config.toml that sets
  `bin_dir = "/usr/lib/cni"`, where its containernetworking-plugins installs. So the reaper
  takes a runtime's plugin dirs as its config gives them and adds no distribution dir of its
  own: a stock Debian node gets /usr/lib/cni from its config; one whose config was replaced
  (`containerd config default > config.toml`, as the Kubernetes docs suggest) runs plugins
  from /opt/cni/bin alone, so no pod there was set up by a plugin in /usr/lib/cni, and a DEL
  run from there would be a binary (Debian's older plugins, beside the cluster's own) that
  never did the ADD. --bin-dir names more dirs where an operator wants them.
"""

from __future__ import annotations

import os
import posixpath
import stat
import sys
from collections import deque
from collections.abc import Callable, Iterable

from cni_reaper.choice import Choice
from cni_reaper.node_root import (
    MAX_LISTED,
    BadPattern,
    LeavesRoot,
    canonical,
    exists_inside,
    glob_inside,
    host_path,
    listed,
    open_inside,
    resolve_inside,
)
from cni_reaper.record import Record
from cni_reaper.runtime import plain_toml, units

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MAX_CONFIG_BYTES = 1 << 20
# Per runtime, imports and drop-ins together; real nodes have a few.
MAX_CONFIG_FILES = 64
MAX_DROP_IN_DEPTH = 8

CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CRIO_CONFIG = "/etc/crio/crio.conf"
CRIO_DROP_IN_DIR = "/etc/crio/crio.conf.d"
STORAGE_CONFIGS = ("/etc/containers/storage.conf", "/usr/share/containers/storage.conf")
RANCHER_DIR = "/var/lib/rancher"
RANCHER_CONFIG_DIR = "/etc/rancher"
DATA_DIR_KEYS = ("data-dir", "d")  # k3s's and RKE2's flag and its short name

# The CRI plugin's name in config versions 1 and 2, and in 2.x the plugin that holds its
# runtime side, the cni table among it.
CRI_V1_PLUGIN = "cri"
CRI_V2_PLUGIN = "io.containerd.grpc.v1.cri"
CRI_RUNTIME_PLUGIN = "io.containerd.cri.v1.runtime"
CRI_PLUGINS = (CRI_V1_PLUGIN, CRI_V2_PLUGIN, CRI_RUNTIME_PLUGIN)
GRPC_PLUGIN = "io.containerd.server.v1.grpc"

CONTAINERD_ROOT = "/var/lib/containerd"
CONTAINERD_CONF_DIR = "/etc/cni/net.d"
CONTAINERD_BIN_DIRS = ("/opt/cni/bin",)
CRIO_STATE_DIR = "/var/lib/crio"  # CRI-O's own (clean.shutdown, version), not the storage's
CRIO_CLEAN_SHUTDOWN_FILE = f"{CRIO_STATE_DIR}/clean.shutdown"  # clean_shutdown_file's default
CRIO_NETWORK_DIR = "/etc/cni/net.d"
CRIO_PLUGIN_DIRS = ("/opt/cni/bin",)
# Where the reaper looks when a runtime's config cannot be read: the dirs the distributions'
# packages and upstream's tarballs install to.
FALLBACK_CONF_DIRS = ("/etc/cni/net.d",)
FALLBACK_BIN_DIRS = ("/opt/cni/bin", "/usr/lib/cni", "/usr/libexec/cni")


class Runtime(str, Choice):
    CONTAINERD = "containerd"
    K3S = "k3s"
    RKE2 = "rke2"
    CRIO = "cri-o"
    CRI_DOCKERD = "cri-dockerd"
    DOCKER = "docker"
    PODMAN = "podman"


class PathKind(str, Choice):
    """What a located path is, and so how liveness.py reads it."""

    # a socket the runtime makes when it starts: probed, and its existence is evidence
    SOCKET = "socket"
    # a socket a systemd socket unit listens on from early boot (docker.socket,
    # cri-docker.socket): connecting would start the runtime, and it exists before it runs
    ACTIVATION_SOCKET = "activation-socket"
    # <dir>/io.containerd.runtime.v2.task/<namespace>/<id> (and runtime.v1.linux)
    TASK_STATE = "task-state-dir"
    # <dir>/<namespace>/<id>: runc's state as containerd's shims keep it
    NAMESPACED_OCI_ROOT = "namespaced-oci-root"
    # <dir>/<id>: runc's or crun's state as CRI-O runs them
    OCI_ROOT = "oci-root"
    # <dir>/<driver>-containers/<id>: containers/storage's run root
    STORAGE_RUNROOT = "storage-runroot"
    # made by the runtime when it starts; nothing inside is read
    RUNTIME_DIR = "runtime-dir"
    # a file the runtime writes when it starts (CRI-O's version file)
    START_MARKER = "start-marker"
    NETNS_DIR = "netns-dir"
    # persistent state (containerd's root, the storage graph root): not evidence of this boot
    PERSISTENT_ROOT = "persistent-root"


LIVE_STATE_KINDS = frozenset(
    {
        PathKind.TASK_STATE,
        PathKind.NAMESPACED_OCI_ROOT,
        PathKind.OCI_ROOT,
        PathKind.STORAGE_RUNROOT,
        PathKind.RUNTIME_DIR,
    }
)


class LocatedPath(Record):
    runtime: Runtime
    kind: PathKind
    node_path: str  # as the node names it, /var/run taken as /run
    path: str  # where it is from here: under the root
    source: str  # "default", or "<config file>: <key>"
    # False for a default the config overrides, or a config value the runtime's command line
    # overrides: still watched, since a runtime may be running with it.
    in_effect: bool = True

    def describe(self) -> str:
        watched = "" if self.in_effect else ", not in effect"
        return f"{self.runtime.value} {self.kind.value} {self.path} ({self.source}{watched})"


class CniDir(Record):
    """A CNI config or plugin dir a runtime of the node uses, and where that was read."""

    runtime: Runtime
    node_path: str  # as the node names it
    path: str  # where it is from here: resolved inside the root, as the node resolves it
    source: str  # "default", "<config file>: <key>", ...

    def describe(self) -> str:
        return f"{self.runtime.value}: {self.source}"


class CniDirs(Record):
    """The CNI config and plugin dirs of the runtimes found on the node (see _runtime_found),
    each runtime's in the order it searches them, the runtimes in a fixed order: containerd,
    k3s, RKE2, CRI-O, as load reads them. The order only matters where two runtimes are found
    and name different dirs holding a network or a plugin of the same name: the first wins, as
    within one runtime's own list. Empty when no runtime is found: the reaper's defaults then
    stand (paths.py)."""

    conf_dirs: tuple[CniDir, ...] = ()
    bin_dirs: tuple[CniDir, ...] = ()
    found: tuple[tuple[Runtime, str], ...] = ()  # the runtimes counted, and why


class RuntimeConfigs(Record):
    sockets: tuple[LocatedPath, ...]
    activation_sockets: tuple[LocatedPath, ...]  # neither probe them nor count their existence
    live_state_dirs: tuple[LocatedPath, ...]  # under /run unless a config says otherwise
    start_markers: tuple[LocatedPath, ...]
    netns_dirs: tuple[LocatedPath, ...]
    persistent_roots: tuple[LocatedPath, ...]
    files_read: tuple[str, ...]
    warnings: tuple[str, ...]
    cni_dirs: CniDirs = CniDirs()
    # Runtimes on the node whose config could not be read whole: where they keep their sandbox
    # records is not known, so no sandbox may be called one they dropped (inventory.py).
    records_in_doubt: tuple[str, ...] = ()

    @property
    def all_paths(self) -> tuple[LocatedPath, ...]:
        return (
            self.sockets
            + self.activation_sockets
            + self.live_state_dirs
            + self.start_markers
            + self.netns_dirs
            + self.persistent_roots
        )


def _toml_parser() -> Callable[[str], dict[str, Any]] | None:
    """Imported only when a config exists: tomli is optional below 3.11."""
    if sys.version_info >= (3, 11):
        import tomllib  # noqa: PLC0415

        return tomllib.loads
    else:  # an else, not a fall-through: mypy then checks only the branch of its own Python
        try:
            import tomli  # noqa: PLC0415
        except ImportError:
            return None
        return tomli.loads


class _ConfigFiles:
    """Reads one node's TOML config files, keeping a warning for each that cannot be used."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.warnings: list[str] = []
        self.files_read: list[str] = []

    def path(self, node_path: str) -> str:
        return host_path(self.root, node_path)

    def read(self, node_path: str, *, missing_ok: bool = True) -> dict[str, Any] | None:
        where = self.path(node_path)
        text = self.text(node_path, "TOML", missing_ok=missing_ok)
        if text is None:
            return None
        # Most configs are plain TOML, read without tomllib's import (plain_toml.py).
        doc = plain_toml.loads(text)
        if doc is None:
            parse = _toml_parser()
            if parse is None:
                self.warnings.append(f"{where}: not read: TOML needs the tomli package before 3.11")
                return None
            try:
                doc = parse(text)
            except (ValueError, RecursionError) as e:
                self.warnings.append(f"{where}: not valid TOML ({e}); not read")
                return None
        self.files_read.append(where)
        return doc

    def lstat_in(self, node_dir: str, names: Iterable[str]) -> dict[str, str] | None:
        """Which of names a dir of the node holds, each with its symlink's target ("" for
        anything else), from one open of the dir; {} when the dir does not exist, None when it
        cannot be read (reading a path in it then says why)."""

        def lstat_names(fd: int) -> dict[str, str]:
            found = {}
            for name in names:
                try:
                    st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                except (FileNotFoundError, NotADirectoryError):
                    continue
                found[name] = os.readlink(name, dir_fd=fd) if stat.S_ISLNK(st.st_mode) else ""
            return found

        return self._in_dir(node_dir, lstat_names)

    def links(self, node_dir: str) -> dict[str, str] | None:
        """The symlinks of a dir of the node, by name, each with its target, from one listing
        (file types from the dir entries); {} when the dir does not exist, None when it cannot
        be listed whole."""
        return self._in_dir(
            node_dir,
            lambda fd: {
                e.name: os.readlink(e.name, dir_fd=fd) for e in listed(fd) if e.is_symlink()
            },
        )

    def _in_dir(
        self, node_dir: str, read: Callable[[int], dict[str, str]]
    ) -> dict[str, str] | None:
        """read on an open dir of the node; {} when the dir does not exist, None when it or
        read fails."""
        try:
            fd, _ = open_inside(self.root, node_dir, directory=True)
        except (FileNotFoundError, NotADirectoryError):
            return {}
        except (OSError, LeavesRoot):
            return None
        try:
            return read(fd)
        except OSError:
            return None
        finally:
            os.close(fd)

    def listing(self, node_dir: str, limit: int = MAX_LISTED) -> list[tuple[str, bool]]:
        """Each entry of a dir of the node, by name in byte order, and whether it is a
        directory (a symlink is not); none when it does not exist, none with a warning when it
        cannot be listed."""
        try:
            fd, _ = open_inside(self.root, node_dir, directory=True)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except (OSError, LeavesRoot) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            self.warnings.append(f"{self.path(node_dir)}: {reason}; its files not read")
            return []
        try:
            entries = [(e.name, e.is_dir(follow_symlinks=False)) for e in listed(fd, limit)]
        except OSError as e:
            self.warnings.append(f"{self.path(node_dir)}: {e.strerror or e}; its files not read")
            return []
        finally:
            os.close(fd)
        return sorted(entries, key=lambda entry: os.fsencode(entry[0]))

    def text(self, node_path: str, language: str, *, missing_ok: bool = True) -> str | None:
        """The file's text, or None with a warning (none for a missing file if missing_ok)."""
        data = self.data(node_path, missing_ok=missing_ok)
        if data is None:
            return None
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            self.warnings.append(f"{self.path(node_path)}: not UTF-8, so not {language}; not read")
            return None

    def data(self, node_path: str, *, missing_ok: bool = True) -> bytes | None:
        """The file's bytes, or None with a warning (none for a missing file if missing_ok)."""
        where = self.path(node_path)
        try:
            return self._read_bytes(node_path)
        except FileNotFoundError:
            try:
                dangling = exists_inside(self.root, node_path)
            except (OSError, LeavesRoot):
                dangling = False
            if dangling:
                self.warnings.append(
                    f"{where}: a symlink whose target does not exist inside {self.root} "
                    "(an absolute target is the node's own path); not read"
                )
            elif not missing_ok:
                self.warnings.append(f"{where}: does not exist")
            return None
        except LeavesRoot:
            self.warnings.append(f"{where}: a symlink that leads out of {self.root}; not read")
            return None
        except _Unusable as e:
            self.warnings.append(f"{where}: {e}; not read")
            return None
        except OSError as e:
            self.warnings.append(f"{where}: {e.strerror or e}; not read")
            return None

    def _read_bytes(self, node_path: str) -> bytes:
        fd, _ = open_inside(self.root, node_path)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise _Unusable("not a regular file")
            if st.st_size > MAX_CONFIG_BYTES:
                raise _Unusable(f"larger than {MAX_CONFIG_BYTES} bytes")
        except BaseException:
            os.close(fd)
            raise
        with os.fdopen(fd, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise _Unusable(f"larger than {MAX_CONFIG_BYTES} bytes")
        return data

    def string(self, doc: dict[str, Any], node_path: str, *keys: str) -> tuple[str, str] | None:
        """A non-empty string at keys, with its source; a value of another type is a warning."""
        value: Any = doc
        for key in keys:
            if not isinstance(value, dict):
                return None
            value = value.get(key)
        if value is None or value == "":
            return None
        label = _key_label(keys)
        if not isinstance(value, str):
            self.warnings.append(f"{self.path(node_path)}: {label} is not a string; ignored")
            return None
        if "\0" in value:  # TOML's \u0000: no path holds it, and os calls raise ValueError
            self.warnings.append(f"{self.path(node_path)}: {label} holds a NUL; ignored")
            return None
        return value, f"{self.path(node_path)}: {label}"

    def strings(
        self, doc: dict[str, Any], node_path: str, *keys: str
    ) -> tuple[tuple[str, ...], str] | None:
        """A list of strings at keys, its empty ones left out, with its source; None when
        nothing is left. A value of another type is a warning."""
        value: Any = doc
        for key in keys:
            if not isinstance(value, dict):
                return None
            value = value.get(key)
        if value is None:
            return None
        label = _key_label(keys)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            self.warnings.append(
                f"{self.path(node_path)}: {label} is not a list of strings; ignored"
            )
            return None
        if any("\0" in v for v in value):
            self.warnings.append(f"{self.path(node_path)}: {label} holds a NUL; ignored")
            return None
        given = tuple(v for v in value if v)
        return (given, f"{self.path(node_path)}: {label}") if given else None

    def version(self, doc: dict[str, Any], node_path: str) -> int:
        """containerd's config version; 0 where the file sets none."""
        value = doc.get("version", 0)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        self.warnings.append(f"{self.path(node_path)}: version is not an integer; ignored")
        return 0

    def exists(self, node_path: str) -> bool:
        """Whether node_path exists on the node; one that cannot be looked at does not."""
        try:
            return exists_inside(self.root, node_path)
        except (OSError, LeavesRoot):
            return False


class _Unusable(Exception):
    """A config file that exists but is not one the reaper reads."""


def _key_label(keys: Iterable[str]) -> str:
    """How a key reads in the file: [crio.api] listen, [plugins."io.containerd..."] address."""
    *tables, key = keys
    if not tables:
        return key
    quoted = [t if t.replace("_", "").replace("-", "").isalnum() else f'"{t}"' for t in tables]
    return f"[{'.'.join(quoted)}] {key}"


class _Collector:
    """The located paths found so far, each (kind, path) once: the first to name it keeps it,
    unless it was only watched and a later one puts it in effect."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.paths: dict[tuple[PathKind, str], LocatedPath] = {}
        self.in_doubt: list[str] = []  # RuntimeConfigs.records_in_doubt

    def add(
        self, runtime: Runtime, kind: PathKind, path: str, source: str, in_effect: bool = True
    ) -> None:
        node_path = canonical(path.removeprefix("unix://"))  # an address, as gRPC clients write it
        key = (kind, node_path)
        known = self.paths.get(key)
        if known is None or (in_effect and not known.in_effect):
            self.paths[key] = LocatedPath(
                runtime, kind, node_path, host_path(self.root, node_path), source, in_effect
            )

    def setting(
        self,
        runtime: Runtime,
        kind: PathKind,
        default: str,
        configured: tuple[str, str] | None,
        default_source: str = "default",
    ) -> None:
        """A value the config may set: what it sets is in effect, the default still watched."""
        if configured is not None and canonical(configured[0]) != canonical(default):
            self.add(runtime, kind, configured[0], configured[1])
            self.add(runtime, kind, default, default_source, in_effect=False)
        else:
            self.add(runtime, kind, default, default_source)

    def flagged(
        self,
        runtime: Runtime,
        kind: PathKind,
        default: str,
        configured: tuple[str, str] | None,
        flagged: tuple[str, str] | None,
        default_source: str = "default",
    ) -> None:
        """A value the config may set and the unit's command line may set over it: the flag's
        is in effect, the others still watched."""
        if flagged is None:
            self.setting(runtime, kind, default, configured, default_source)
            return
        self.add(runtime, kind, *flagged)
        if configured is not None:
            source = f"{configured[1]} (the unit's flag wins)"
            self.add(runtime, kind, configured[0], source, in_effect=False)
        self.add(runtime, kind, default, default_source, in_effect=False)

    def of_kind(self, *kinds: PathKind) -> tuple[LocatedPath, ...]:
        return tuple(p for p in self.paths.values() if p.kind in kinds)


def _containerd_files(files: _ConfigFiles, main: str) -> list[tuple[str, dict[str, Any]]]:
    """The main config and its imports, in containerd's load order."""
    loaded: set[str] = set()
    pending = deque([main])
    docs = []
    while pending:
        node_path = pending.popleft()
        if node_path in loaded:
            continue
        if len(loaded) == MAX_CONFIG_FILES:
            files.warnings.append(
                f"{files.path(main)}: more than {MAX_CONFIG_FILES} files with its imports; "
                f"{files.path(node_path)} and the rest not read"
            )
            break
        loaded.add(node_path)
        doc = files.read(node_path, missing_ok=node_path == main)
        if doc is None:
            continue
        docs.append((node_path, doc))
        pending.extend(_imports(files, node_path, doc))
    return docs


def _imports(files: _ConfigFiles, node_path: str, doc: dict[str, Any]) -> list[str]:
    imports = doc.get("imports", [])
    if not isinstance(imports, list) or not all(isinstance(i, str) for i in imports):
        files.warnings.append(f"{files.path(node_path)}: imports is not a list of strings")
        return []
    resolved = []
    for name in imports:
        path = posixpath.normpath(name) if name else "."
        if not path.startswith("/"):
            path = posixpath.join(posixpath.dirname(node_path), path)
        path = canonical(path)
        if "*" not in path:
            resolved.append(path)
            continue
        try:
            resolved.extend(glob_inside(files.root, path))
        except BadPattern:
            files.warnings.append(f"{files.path(node_path)}: imports: bad pattern {name!r}")
    return resolved


class _RuntimeCni(Record):
    """One runtime's CNI dirs, each as its config names it, with its source, in the order the
    runtime searches them."""

    conf_dirs: tuple[tuple[str, str], ...]
    bin_dirs: tuple[tuple[str, str], ...]


class _ContainerdSettings(Record):
    state: tuple[str, str] | None
    root: tuple[str, str] | None
    address: tuple[str, str] | None
    runc_roots: tuple[tuple[str, str], ...]
    files_read: int  # the main config and its imports that could be read
    # None when a file's disabled_plugins turns the CRI plugin off: no pod networking at all
    cni: _RuntimeCni | None
    # A file that could not be read, or a CNI key that could not be read as containerd reads
    # it (each a warning): what containerd takes from there is unknown.
    cni_unread: bool
    # A file that could not be read, or its root, state or address key: where containerd
    # keeps its records is unknown.
    settings_unread: bool = False


def _table(doc: Any, *keys: str) -> dict[str, Any]:
    """The table at keys; an empty one where a key is missing or names no table."""
    for key in keys:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc if isinstance(doc, dict) else {}


def _containerd_settings(files: _ConfigFiles, main: str) -> _ContainerdSettings:
    state = root = address = None
    cri_plugins: dict[str, tuple[str, dict[str, Any]]] = {}  # the last file's table wins whole
    at_start = warned = len(files.warnings)
    docs = _containerd_files(files, main)
    unread = len(files.warnings) > warned
    for node_path, doc in docs:
        state = files.string(doc, node_path, "state") or state
        root = files.string(doc, node_path, "root") or root
        address = (
            files.string(doc, node_path, "plugins", GRPC_PLUGIN, "address")
            or files.string(doc, node_path, "grpc", "address")
            or address
        )
        for name in CRI_PLUGINS:
            if _table(doc, "plugins", name):
                cri_plugins[name] = (node_path, doc)
    settings_unread = len(files.warnings) > at_start
    runc_roots = []
    for name, (node_path, doc) in cri_plugins.items():
        for handler in _table(doc, "plugins", name, "containerd", "runtimes"):
            keys = ("plugins", name, "containerd", "runtimes", handler, "options", "Root")
            found = files.string(doc, node_path, *keys)
            if found is not None:
                runc_roots.append(found)
    warned = len(files.warnings)
    cni = _containerd_cni(files, docs)
    unread = unread or len(files.warnings) > warned
    return _ContainerdSettings(
        state, root, address, tuple(runc_roots), len(docs), cni, unread, settings_unread
    )


class _CriCni(Record):
    """The CNI keys of one CRI plugin table, or of several merged, each (value, source)."""

    conf_dir: tuple[str, str] | None = None
    bin_dir: tuple[str, str] | None = None
    bin_dirs: tuple[tuple[str, ...], str] | None = None
    # (runtime handler, (its cni_conf_dir, source)), in the order the tables give them
    handler_conf_dirs: tuple[tuple[str, tuple[str, str]], ...] = ()

    def over(self, earlier: _CriCni) -> _CriCni:
        """Key by key, what is set here winning: containerd 2.x's merge of a later file, and
        its migration of a file's version 1 or 2 table into the runtime plugin's."""
        handlers = dict(earlier.handler_conf_dirs)
        handlers.update(self.handler_conf_dirs)
        return _CriCni(
            self.conf_dir or earlier.conf_dir,
            self.bin_dir or earlier.bin_dir,
            self.bin_dirs or earlier.bin_dirs,
            tuple(handlers.items()),
        )

    def migrated(self) -> _CriCni:
        """A version 1 or 2 table as containerd 2.x moves it: bin_dir becomes bin_dirs."""
        if self.bin_dir is None or self.bin_dirs is not None:
            return self._replace(bin_dir=None)
        value, source = self.bin_dir
        return self._replace(bin_dir=None, bin_dirs=((value,), source))


def _cri_cni(files: _ConfigFiles, node_path: str, doc: dict[str, Any], plugin: str) -> _CriCni:
    cni = ("plugins", plugin, "cni")
    handlers = []
    for handler in _table(doc, "plugins", plugin, "containerd", "runtimes"):
        keys = ("plugins", plugin, "containerd", "runtimes", handler, "cni_conf_dir")
        found = files.string(doc, node_path, *keys)
        if found is not None:
            handlers.append((handler, found))
    return _CriCni(
        files.string(doc, node_path, *cni, "conf_dir"),
        files.string(doc, node_path, *cni, "bin_dir"),
        files.strings(doc, node_path, *cni, "bin_dirs"),
        tuple(handlers),
    )


def _containerd_cni(
    files: _ConfigFiles, docs: list[tuple[str, dict[str, Any]]]
) -> _RuntimeCni | None:
    """The CNI dirs of a containerd that loads docs, as it reads them.

    The config does not say which containerd reads it, and 1.6/1.7 and 2.x read some configs
    differently: they merge files differently, and only 2.x knows the runtime plugin's table.
    A config of version 3 or later is read by 2.x alone; an earlier one may be read by either,
    and where the two readings differ, both are used, 1.6/1.7's first (their configs are the
    version 2 ones; 2.x warns at every start that it migrates them)."""
    version = 0
    tables: list[tuple[int, dict[str, _CriCni]]] = []  # per file: its version, its CRI tables
    for node_path, doc in docs:
        disabled = files.strings(doc, node_path, "disabled_plugins")
        if disabled is not None and set(disabled[0]) & set(CRI_PLUGINS):
            return None
        file_version = files.version(doc, node_path)
        version = file_version or version  # as the merge takes it: a later non-zero one wins
        present = {
            name: _cri_cni(files, node_path, doc, name)
            for name in CRI_PLUGINS
            if _table(doc, "plugins", name)
        }
        tables.append((file_version, present))

    readings = []
    if version <= 2:
        legacy = CRI_V2_PLUGIN if version == 2 else CRI_V1_PLUGIN
        last = next((t[legacy] for _, t in reversed(tables) if legacy in t), _CriCni())
        bin_dirs = None if last.bin_dir is None else ((last.bin_dir[0],), last.bin_dir[1])
        readings.append(("containerd 1.6/1.7", _containerd_dirs(last.conf_dir, bin_dirs, last)))
    merged = _CriCni()
    for file_version, present in tables:
        in_file = present.get(CRI_RUNTIME_PLUGIN, _CriCni())
        if file_version <= 2:
            legacy = CRI_V2_PLUGIN if file_version == 2 else CRI_V1_PLUGIN
            in_file = in_file.over(present.get(legacy, _CriCni()).migrated())
        merged = in_file.over(merged)
    readings.append(
        ("containerd 2.x", _containerd_dirs(merged.conf_dir, _bin_dirs(files, merged), merged))
    )

    if len(readings) == 1 or readings[0][1] == readings[1][1]:
        return readings[0][1]
    return _RuntimeCni(
        tuple((d, f"{s} (as {reader} reads it)") for reader, r in readings for d, s in r.conf_dirs),
        tuple((d, f"{s} (as {reader} reads it)") for reader, r in readings for d, s in r.bin_dirs),
    )


def _bin_dirs(files: _ConfigFiles, cni: _CriCni) -> tuple[tuple[str, ...], str] | None:
    """bin_dirs as containerd 2.x validates them: a bin_dir replaces bin_dirs left at their
    default; the two set otherwise stop it from starting."""
    if cni.bin_dir is None:
        return cni.bin_dirs
    if cni.bin_dirs is None or cni.bin_dirs[0] == CONTAINERD_BIN_DIRS:
        return (cni.bin_dir[0],), cni.bin_dir[1]
    files.warnings.append(
        f"{cni.bin_dirs[1]} and {cni.bin_dir[1]} are both set: containerd 2.x refuses to start "
        "with both; bin_dirs taken"
    )
    return cni.bin_dirs


def _containerd_dirs(
    conf_dir: tuple[str, str] | None,
    bin_dirs: tuple[tuple[str, ...], str] | None,
    cni: _CriCni,
) -> _RuntimeCni:
    conf_dirs = [conf_dir or (CONTAINERD_CONF_DIR, "default")]
    conf_dirs.extend(found for _, found in cni.handler_conf_dirs)
    if bin_dirs is None:
        bins = tuple((d, "default") for d in CONTAINERD_BIN_DIRS)
    else:
        bins = tuple((d, bin_dirs[1]) for d in bin_dirs[0])
    return _RuntimeCni(tuple(conf_dirs), bins)


class _CniCollector:
    """The CNI dirs of the runtimes found, taken inside the root, in the order added."""

    def __init__(self, files: _ConfigFiles) -> None:
        self.files = files
        self.conf_dirs: list[CniDir] = []
        self.bin_dirs: list[CniDir] = []
        self.found: list[tuple[Runtime, str]] = []

    def add(self, runtime: Runtime, why: str, dirs: _RuntimeCni, unread: bool) -> None:
        """A runtime found, and its dirs. unread: a file of its config, or one of its CNI
        keys, could not be read (a warning names it), so where the runtime really looks is
        unknown: the fallback dirs are added after the ones read."""
        self.found.append((runtime, why))
        conf_dirs, bin_dirs = list(dirs.conf_dirs), list(dirs.bin_dirs)
        if unread:
            source = "default (its config could not all be read)"
            conf_dirs.extend((d, source) for d in FALLBACK_CONF_DIRS)
            bin_dirs.extend((d, source) for d in FALLBACK_BIN_DIRS)
        self.conf_dirs.extend(self._taken(runtime, conf_dirs))
        self.bin_dirs.extend(self._taken(runtime, bin_dirs))

    def _taken(self, runtime: Runtime, dirs: list[tuple[str, str]]) -> list[CniDir]:
        root = self.files.root
        taken = []
        for value, source in dirs:
            node_path = canonical(value)
            try:
                # As paths.py takes its defaults: a symlink on the way is followed as the node
                # follows it, an absolute target starting again at the root.
                path = node_path if root == "/" else resolve_inside(root, node_path)
            except LeavesRoot as e:
                self.files.warnings.append(f"{source} names {value}: {e}; not used")
                continue
            except OSError as e:
                self.files.warnings.append(f"{source} names {value}: {e.strerror}; not used")
                continue
            taken.append(CniDir(runtime, node_path, path, source))
        return taken

    def result(self) -> CniDirs:
        return CniDirs(tuple(self.conf_dirs), tuple(self.bin_dirs), tuple(self.found))


def _runtime_found(files: _ConfigFiles, *evidence: str) -> str | None:
    """Why a runtime counts on this node: the first of evidence (its config files, then its
    persistent root) that exists, or None.

    Both are what a runtime needs before it can have set up a single pod: its root is made at
    its first start and holds its sandboxes for good, and its config is what the operator set
    up for it. Both are a few lstat calls, and both are there while the runtime is stopped, as
    it is when the reaper runs at boot. Binaries are no evidence (k3s carries its own
    containerd, Docker installs one whose CRI plugin is off), nor are units (enabled says
    nothing of the pods it ran), nor processes (none runs yet at boot). CRI-O's storage root
    is shared with podman, so CRI-O's own /var/lib/crio stands for it."""
    for node_path in evidence:
        if files.exists(node_path):
            return f"{files.path(node_path)} exists"
    return None


def _containerd(
    paths: _Collector, files: _ConfigFiles, cni: _CniCollector, unit: units.UnitFlags
) -> None:
    """containerd's config, where its unit's --config puts it; what its unit's command line
    sets wins over the config, which wins over the default (both still watched)."""
    runtime = Runtime.CONTAINERD
    named = _flag(unit, "config", "c")
    config = canonical(named[0]) if named is not None else CONTAINERD_CONFIG
    found = _containerd_settings(files, config)
    # Doubts of containerd's own, beside its units' (already warnings, by _runtime_units).
    doubts = []
    if named is not None and not files.exists(config):
        doubts.append(f"{named[1]}: {config} does not exist, and containerd does not start so")
    root = (_flag(unit, "root") or found.root or (CONTAINERD_ROOT, ""))[0]
    for kind, default, configured, flags in (
        (PathKind.SOCKET, "/run/containerd/containerd.sock", found.address, ("address", "a")),
        (PathKind.TASK_STATE, "/run/containerd", found.state, ("state",)),
        (PathKind.PERSISTENT_ROOT, CONTAINERD_ROOT, found.root, ("root",)),
    ):
        paths.flagged(runtime, kind, default, configured, _flag(unit, *flags))
    paths.add(runtime, PathKind.NAMESPACED_OCI_ROOT, "/run/containerd/runc", "default")
    # go-cni pins each sandbox's netns in /var/run/netns.
    paths.add(runtime, PathKind.NETNS_DIR, "/run/netns", "default")
    for value, source in found.runc_roots:
        paths.add(runtime, PathKind.NAMESPACED_OCI_ROOT, value, source)
    why = _runtime_found(files, config, CONTAINERD_ROOT)
    if why is not None and found.settings_unread:
        paths.in_doubt.append(f"containerd: {_NOT_READ_WHOLE}")
    doubts.extend(_root_missing(files, unit, root))
    files.warnings.extend(doubts)
    if unit.doubts or doubts:
        paths.in_doubt.append(f"containerd: {_UNIT_NOT_FOLLOWED}")
    if why is not None and found.cni is not None:
        cni.add(runtime, why, found.cni, found.cni_unread)


def _root_missing(files: _ConfigFiles, unit: units.UnitFlags, root: str) -> list[str]:
    """A runtime its units start, whose records' root is not there: on a volume not mounted
    yet, its records are not known."""
    if unit.started and not files.exists(root):
        return [f"{', '.join(unit.started)}: {files.path(root)} does not exist (not mounted yet?)"]
    return []


_UNIT_NOT_FOLLOWED = (
    "its unit's command line may move its records in a way not followed (see the warnings): "
    "none is taken as one it dropped"
)
_NOT_READ_WHOLE = (
    "its config could not be read whole (see the warnings): where it keeps its sandbox records "
    "is not known, so none is taken as one it dropped"
)


def _yaml_drop_ins(files: _ConfigFiles, node_dir: str) -> list[str]:
    """k3s's config.yaml.d: each entry that is not a directory and whose name ends in .yaml or
    .yml in any case, in name order."""
    return [
        f"{node_dir}/{name}"
        for name, is_dir in files.listing(node_dir, MAX_CONFIG_FILES)
        if name.lower().endswith((".yaml", ".yml")) and not is_dir
    ]


def _rancher_data_dir(
    files: _ConfigFiles, runtime: Runtime, unit: units.UnitFlags
) -> tuple[str, str] | None:
    """The data dir k3s or RKE2 starts with: its unit's command line's, else what its own
    config sets (config.yaml, then config.yaml.d), with where; None for the default. Raises
    _Unusable when a file that may set it cannot be read.

    k3s turns each key of its config into a flag, in the order the keys first appear across
    the files, the last value of a key winning, a "+" key appending, and puts them before its
    command line's own flags; the last of these wins. Both forms, --data-dir and -d, anywhere
    among them, and it does not start."""
    main = f"{RANCHER_CONFIG_DIR}/{runtime.value}/config.yaml"
    warned = len(files.warnings)
    order: list[str] = []
    values: dict[str, list[tuple[str, str]]] = {}
    read = 0
    for node_path in (main, *_yaml_drop_ins(files, f"{main}.d")):
        text = files.text(node_path, "YAML")
        if text is None:
            continue
        read += len(text)
        if read > MAX_CONFIG_BYTES:  # a few hundred bytes on a real node
            where = files.path(node_path)
            files.warnings.append(
                f"{where}: over {MAX_CONFIG_BYTES} bytes of YAML in all; not read"
            )
            break
        # Loaded only on a node with such a file: every other boot skips its import.
        from cni_reaper.runtime import plain_yaml  # noqa: PLC0415

        where = files.path(node_path)
        try:
            found = plain_yaml.settings(text, DATA_DIR_KEYS)
        except plain_yaml.Unreadable as e:
            files.warnings.append(f"{where}: {e}; its data-dir not read")
            continue
        files.files_read.append(where)
        for setting in found:
            flag = plain_yaml.k3s_flag(setting.key)
            said = (setting.value, f"{where}: {setting.key} (line {setting.line})")
            if flag not in values:
                order.append(flag)
            if setting.key != flag and flag in values:
                values[flag].append(said)
            else:
                values[flag] = [said]
    if len(files.warnings) > warned:
        raise _Unusable(f"{runtime.value}: its data-dir may be set where it could not be read")
    for flag, value, where in unit.values:
        if flag not in values:
            order.append(flag)
        values.setdefault(flag, []).append((value, where))
    if len(order) > 1:
        # urfave/cli refuses both forms of one flag: k3s does not start, and whatever file
        # is mended decides.
        first, second = (values[flag][-1][1] for flag in order)
        files.warnings.append(
            f"{first}, {second}: both forms of one flag; {runtime.value} fails so"
        )
        raise _Unusable(f"{runtime.value}: its data-dir is set twice over")
    last = None
    for flag in order:
        last = values[flag][-1]
    flagged = _flag(unit, *DATA_DIR_KEYS)
    if flagged is not None:
        last = flagged  # the command line's flags come after the config's
    if last is None:
        return None
    value, source = last
    if not value.startswith("/"):
        files.warnings.append(f"{source}: {value!r} is not an absolute path; not used")
        raise _Unusable(f"{runtime.value}: its data-dir is not an absolute path")
    return canonical(value), source


def _rancher(
    paths: _Collector,
    files: _ConfigFiles,
    runtime: Runtime,
    cni: _CniCollector,
    unit: units.UnitFlags,
) -> None:
    """k3s or RKE2: the command line they start containerd with wins over their config, whose
    values are kept as watched only. Their CNI dirs are their generated config's; without one
    (never generated, or unreadable), those k3s's flannel uses, and containerd's for RKE2. All
    of it lies in their data dir, which their unit's command line or their own config.yaml
    may move."""
    default_dir = f"{RANCHER_DIR}/{runtime.value}"
    doubt = f"{runtime.value}: its unit may move its data dir" if unit.doubts else None
    try:
        moved = _rancher_data_dir(files, runtime, unit)
    except _Unusable as e:
        moved, doubt = None, doubt or str(e)
    data_dir = moved[0] if moved is not None else default_dir
    agent_dir = f"{data_dir}/agent"
    config = f"{agent_dir}/etc/containerd/config.toml"
    found = _containerd_settings(files, config)
    shared = "default (k3s and RKE2)"
    paths.add(runtime, PathKind.SOCKET, "/run/k3s/containerd/containerd.sock", shared)
    paths.add(runtime, PathKind.TASK_STATE, "/run/k3s/containerd", shared)
    paths.add(runtime, PathKind.SOCKET, "/run/k3s/cri-dockerd/cri-dockerd.sock", shared)
    in_data_dir = (
        (f"{agent_dir}/containerd", f"{moved[1]} (<data-dir>/agent/containerd)")
        if moved is not None
        else None
    )
    paths.setting(runtime, PathKind.PERSISTENT_ROOT, f"{default_dir}/agent/containerd", in_data_dir)
    overridden = (
        (PathKind.SOCKET, found.address, "-a"),
        (PathKind.TASK_STATE, found.state, "--state"),
        (PathKind.PERSISTENT_ROOT, found.root, "--root"),
    )
    for kind, setting, flag in overridden:
        if setting is not None:
            value, source = setting
            note = f"{source} ({runtime.value} starts containerd with {flag}, which wins)"
            paths.add(runtime, kind, value, note, in_effect=False)
    for value, source in found.runc_roots:
        paths.add(runtime, PathKind.NAMESPACED_OCI_ROOT, value, source)
    main_config = f"{RANCHER_CONFIG_DIR}/{runtime.value}/config.yaml"
    evidence = (config, f"{agent_dir}/containerd", main_config, f"{main_config}.d")
    why = _runtime_found(files, *evidence)
    missing = _root_missing(files, unit, f"{agent_dir}/containerd")
    if missing:
        files.warnings.extend(missing)
        doubt = doubt or f"{runtime.value}: its records' root is not there"
    if (why is not None or unit.doubts or missing) and doubt is not None:
        paths.in_doubt.append(
            f"{doubt} (see the warnings): where it keeps its sandbox records is not known, "
            "so none is taken as one it dropped"
        )
    if why is not None and found.cni is not None:
        dirs = found.cni
        if not found.files_read:
            if runtime is Runtime.K3S:
                source = "default (k3s with its own flannel)"
                conf = f"{agent_dir}/etc/cni/net.d"
                dirs = _RuntimeCni(((conf, source),), ((f"{data_dir}/data/current/bin", source),))
            else:
                source = "default (RKE2 leaves them to containerd)"
                conf_dirs = ((CONTAINERD_CONF_DIR, source),)
                dirs = _RuntimeCni(conf_dirs, tuple((d, source) for d in CONTAINERD_BIN_DIRS))
        cni.add(runtime, why, dirs, found.cni_unread)


def _storage_defaults(files: _ConfigFiles) -> tuple[tuple[str, str], tuple[str, str]]:
    """containers/storage's run root and graph root, with their sources."""
    runroot = ("/run/containers/storage", "default")
    graphroot = ("/var/lib/containers/storage", "default")
    for node_path in STORAGE_CONFIGS:
        try:
            present = exists_inside(files.root, node_path)
        except (OSError, LeavesRoot):
            present = True  # read it, so that the warning says why it cannot be
        if not present:
            continue
        doc = files.read(node_path)
        if doc is not None:
            runroot = files.string(doc, node_path, "storage", "runroot") or runroot
            graphroot = files.string(doc, node_path, "storage", "graphroot") or graphroot
        break
    return runroot, graphroot


def _crio_drop_ins(files: _ConfigFiles, node_dir: str, depth: int = 0) -> list[str]:
    """Every file below the drop-in dir in filepath.Walk's order."""
    found = []
    for name, is_dir in files.listing(node_dir):
        path = f"{node_dir.rstrip('/')}/{name}"
        if not is_dir:
            found.append(path)
        elif depth < MAX_DROP_IN_DEPTH:
            found.extend(_crio_drop_ins(files, path, depth + 1))
        else:
            files.warnings.append(f"{files.path(path)}: nested too deep; not read")
    return found


def _crio(
    paths: _Collector,
    files: _ConfigFiles,
    storage_runroot: tuple[str, str],
    storage_graphroot: tuple[str, str],
    cni: _CniCollector,
    unit: units.UnitFlags,
    storage_unread: bool = False,  # containers/storage's config, which may set the graph root
) -> None:
    """CRI-O's config, crio.conf and its drop-ins; what its unit's command line sets (its
    root, run root and socket) wins over them, which win over containers/storage's."""
    runtime = Runtime.CRIO
    listen = runroot = root = version_file = namespaces_dir = None
    network_dir = plugin_dir = plugin_dirs = None
    oci_roots: dict[str, tuple[str, str]] = {}
    at_start = warned = len(files.warnings)
    config_files = [CRIO_CONFIG, *_crio_drop_ins(files, CRIO_DROP_IN_DIR)]
    if len(config_files) > MAX_CONFIG_FILES:
        files.warnings.append(
            f"{files.path(CRIO_DROP_IN_DIR)}: more than {MAX_CONFIG_FILES} files; "
            f"only the first {MAX_CONFIG_FILES - 1} read"
        )
        del config_files[MAX_CONFIG_FILES:]
    docs = [(p, doc) for p in config_files if (doc := files.read(p)) is not None]
    unread = len(files.warnings) > warned
    for node_path, doc in docs:
        listen = files.string(doc, node_path, "crio", "api", "listen") or listen
        runroot = files.string(doc, node_path, "crio", "runroot") or runroot
        root = files.string(doc, node_path, "crio", "root") or root
        version_file = files.string(doc, node_path, "crio", "version_file") or version_file
        namespaces_dir = (
            files.string(doc, node_path, "crio", "runtime", "namespaces_dir") or namespaces_dir
        )
        for handler in _table(doc, "crio", "runtime", "runtimes"):
            keys = ("crio", "runtime", "runtimes", handler, "runtime_root")
            found = files.string(doc, node_path, *keys)
            if found is not None:
                oci_roots[handler] = found
    settings_unread = len(files.warnings) > at_start or (storage_unread and root is None)
    warned = len(files.warnings)
    network = ("crio", "network")
    for node_path, doc in docs:
        network_dir = files.string(doc, node_path, *network, "network_dir") or network_dir
        plugin_dirs = files.strings(doc, node_path, *network, "plugin_dirs") or plugin_dirs
        plugin_dir = files.string(doc, node_path, *network, "plugin_dir") or plugin_dir
    unread = unread or len(files.warnings) > warned
    why = _runtime_found(files, CRIO_CONFIG, *config_files[1:2], CRIO_STATE_DIR)
    if why is not None and settings_unread:
        paths.in_doubt.append(f"cri-o: {_NOT_READ_WHOLE}")
    if why is not None:
        bin_dirs = [(d, "default") for d in CRIO_PLUGIN_DIRS]
        if plugin_dirs is not None:
            bin_dirs = [(d, plugin_dirs[1]) for d in plugin_dirs[0]]
        if plugin_dir is not None:  # deprecated, and appended by CRI-O to plugin_dirs
            bin_dirs.append(plugin_dir)
        conf_dirs = (network_dir or (CRIO_NETWORK_DIR, "default"),)
        cni.add(runtime, why, _RuntimeCni(conf_dirs, tuple(bin_dirs)), unread)
    socket = _flag(unit, "listen")
    paths.flagged(runtime, PathKind.SOCKET, "/run/crio/crio.sock", listen, socket)
    paths.add(runtime, PathKind.RUNTIME_DIR, "/run/crio", "default")
    run_root, source = storage_runroot
    kind = PathKind.STORAGE_RUNROOT
    paths.flagged(runtime, kind, run_root, runroot, _flag(unit, "runroot"), source)
    paths.setting(runtime, PathKind.START_MARKER, "/run/crio/version", version_file)
    netns = None if namespaces_dir is None else (f"{namespaces_dir[0]}/netns", namespaces_dir[1])
    paths.setting(runtime, PathKind.NETNS_DIR, "/run/netns", netns)
    flagged = _flag(unit, "root", "r")
    graphroot, source = storage_graphroot
    paths.flagged(runtime, PathKind.PERSISTENT_ROOT, graphroot, root, flagged, source)
    # A root not there is one on a volume not mounted yet only where CRI-O has run: at every
    # start it makes its clean-shutdown file's dir (cmd/crio/main.go). An installed CRI-O never
    # started (an image with both runtimes, containerd's in use) has neither.
    clean_file = CRIO_CLEAN_SHUTDOWN_FILE
    for _, doc in docs:
        clean_file = _table(doc, "crio").get("clean_shutdown_file", clean_file)
    has_run = (
        not isinstance(clean_file, str)
        or not clean_file.startswith("/")  # none ("") or not usable: as if it had
        or files.exists(posixpath.dirname(canonical(clean_file)))
    )
    in_effect = (flagged or root or storage_graphroot)[0]
    missing = _root_missing(files, unit, in_effect) if has_run else []
    files.warnings.extend(missing)
    if unit.doubts or missing:
        paths.in_doubt.append(f"cri-o: {_UNIT_NOT_FOLLOWED}")
    for default in ("/run/crun", "/run/runc"):
        paths.add(runtime, PathKind.OCI_ROOT, default, "default")
    for value, source in oci_roots.values():
        paths.add(runtime, PathKind.OCI_ROOT, value, source)


def _without_config(paths: _Collector, storage_runroot: tuple[str, str]) -> None:
    """Runtimes whose paths are taken as their defaults."""
    activation = "default (systemd socket unit)"
    paths.add(Runtime.CRI_DOCKERD, PathKind.ACTIVATION_SOCKET, "/run/cri-dockerd.sock", activation)
    docker = Runtime.DOCKER
    paths.add(docker, PathKind.ACTIVATION_SOCKET, "/run/docker.sock", activation)
    paths.add(docker, PathKind.RUNTIME_DIR, "/run/docker", "default")
    # The containerd dockerd starts itself when no system containerd is configured.
    paths.add(docker, PathKind.SOCKET, "/run/docker/containerd/containerd.sock", "default")
    paths.add(docker, PathKind.TASK_STATE, "/run/docker/containerd/daemon", "default")
    paths.add(docker, PathKind.PERSISTENT_ROOT, "/var/lib/docker", "default")
    podman = Runtime.PODMAN
    paths.add(podman, PathKind.RUNTIME_DIR, "/run/libpod", "default")
    paths.add(podman, PathKind.STORAGE_RUNROOT, storage_runroot[0], storage_runroot[1])


# CRI-O's packaged crio.service (contrib/systemd, Fedora's) runs `crio` with these, each set
# in /etc/sysconfig/crio, or not at all.
CRIO_UNIT_VARIABLES = tuple(
    f"CRIO_{part}_OPTIONS" for part in ("CONFIG", "RUNTIME", "STORAGE", "NETWORK", "METRICS")
)
CRIO_UNITS = units.RuntimeUnits(
    units=("crio.service",),
    binary="crio",
    subcommands=(),
    followed=("root", "r", "runroot", "listen"),
    forms=(("root", "r"),),
    # What else moves what the reaper reads of CRI-O (internal/criocli/criocli.go): its
    # configs, its version and clean-shutdown files and wipes (inventory.py's fate), its
    # namespaces dir and OCI runtimes' roots (liveness), its CNI dirs.
    doubted=(
        "config",
        "c",
        "config-dir",
        "d",
        "version-file",
        "version-file-persist",
        "clean-shutdown-file",
        "internal-wipe",
        "internal-repair",
        "namespaces-dir",
        "runtimes",
        "cni-config-dir",
        "cni-plugin-dir",
        "cni-default-network",
    ),
    # urfave/cli reads each of those flags also from a variable; containers/storage its
    # config's path from CONTAINERS_STORAGE_CONF. Each name stands for those it begins.
    variables=(
        "CONTAINER_CONFIG",
        "CONTAINER_LISTEN",
        "CONTAINER_ROOT",
        "CONTAINER_RUNROOT",
        "CONTAINER_VERSION_FILE",
        "CONTAINER_CLEAN_SHUTDOWN_FILE",
        "CONTAINER_INTERNAL_",
        "CONTAINER_NAMESPACES_DIR",
        "CONTAINER_RUNTIMES",
        "CONTAINER_CNI_",
        "CONTAINERS_STORAGE_CONF",
    ),
    expanded=CRIO_UNIT_VARIABLES,
    # Common flags of CRI-O's own, each of one type in every release read (criocli.go,
    # BoolFlag or not), often set in $CRIO_RUNTIME_OPTIONS, which comes before the storage's.
    bools=("selinux", "enable-metrics", "log-journald", "profile", "enable-tracing", "no-pivot"),
    valued=(
        "log-level",
        "l",
        "log-format",
        "log",
        "log-dir",
        "log-filter",
        "cgroup-manager",
        "conmon",
        "conmon-cgroup",
        "pause-image",
        "stream-address",
        "stream-port",
        "metrics-port",
        "metrics-host",
        "storage-driver",
        "s",
        "storage-opt",
        "default-runtime",
        "pids-limit",
    ),
)


# Common flags of k3s's own (pkg/cli/cmds/server.go and agent.go, urfave/cli v1), each of
# one type since they came: bools, and those that take the next word (a string or a list).
K3S_BOOLS = (
    "cluster-init",
    "cluster-reset",
    "disable-scheduler",
    "disable-cloud-controller",
    "disable-kube-proxy",
    "disable-network-policy",
    "disable-helm-controller",
    "disable-agent",
    "secrets-encryption",
    "selinux",
    "protect-kernel-defaults",
    "rootless",
    "prefer-bundled-bin",
    "flannel-ipv6-masq",
    "flannel-external-ip",
    "etcd-expose-metrics",
    "etcd-disable-snapshots",
    "embedded-registry",
    "with-node-id",
    "docker",
    "debug",
)
K3S_VALUED = (
    "log",
    "l",
    "token",
    "t",
    "token-file",
    "agent-token",
    "server",
    "s",
    "write-kubeconfig",
    "o",
    "write-kubeconfig-mode",
    "tls-san",
    "disable",
    "node-name",
    "node-label",
    "node-taint",
    "node-ip",
    "i",
    "node-external-ip",
    "flannel-backend",
    "flannel-iface",
    "cluster-cidr",
    "service-cidr",
    "cluster-dns",
    "cluster-domain",
    "kubelet-arg",
    "kube-apiserver-arg",
    "kube-controller-manager-arg",
    "kube-scheduler-arg",
    "kube-proxy-arg",
    "datastore-endpoint",
    "advertise-address",
    "bind-address",
    "https-listen-port",
    "snapshotter",
    "pause-image",
    "private-registry",
    "system-default-registry",
    "resolv-conf",
    "default-local-storage-path",
    "egress-selector-mode",
    "etcd-snapshot-schedule-cron",
    "etcd-snapshot-retention",
    "etcd-snapshot-dir",
)


# How systemd starts each runtime, and what of its command line the reaper reads (units.py).
RUNTIME_UNITS = {
    Runtime.CONTAINERD: units.RuntimeUnits(
        units=("containerd.service",),
        binary="containerd",
        subcommands=(),
        followed=("root", "config", "c", "state", "address", "a"),
        forms=(("config", "c"), ("address", "a")),
        doubted=(),
        variables=(),
    ),
    **{
        runtime: units.RuntimeUnits(
            units=names,
            binary=runtime.value,
            subcommands=("server", "agent"),
            followed=("data-dir", "d"),
            forms=(("data-dir", "d"),),
            doubted=("config", "c"),
            variables=(f"{runtime.value.upper()}_CONFIG_FILE", f"{runtime.value.upper()}_DATA_DIR"),
            bools=K3S_BOOLS if runtime is Runtime.K3S else (),
            valued=K3S_VALUED if runtime is Runtime.K3S else (),
        )
        for runtime, names in (
            (Runtime.K3S, ("k3s.service", "k3s-agent.service")),
            (Runtime.RKE2, ("rke2-server.service", "rke2-agent.service")),
        )
    },
    Runtime.CRIO: CRIO_UNITS,
}


def _runtime_units(files: _ConfigFiles) -> dict[Runtime, units.UnitFlags]:
    """What each runtime's units pass on its command line; a doubt is also a warning."""
    installed = units.with_installed_units(files, list(RUNTIME_UNITS.values()))
    runtimes = dict(zip(RUNTIME_UNITS, installed))
    paths_by_unit = units.unit_files(files, installed)
    reader = units.Reader(files)
    said = {}
    for runtime, how in runtimes.items():
        found = units.runtime_flags(reader, how, paths_by_unit)
        files.warnings.extend(
            f"{doubt}, which the reaper does not follow" for doubt in found.doubts
        )
        said[runtime] = found
    return said


def _flag(said: units.UnitFlags, *names: str) -> tuple[str, str] | None:
    """The value the last of names on the command line sets, with where."""
    last = None
    for flag, value, where in said.values:
        if flag in names:
            last = (value, where)
    return last


def load(root: str) -> RuntimeConfigs:
    """Where the runtimes of the node at root keep their sockets and state, and which CNI
    config and plugin dirs they use."""
    root = os.path.abspath(root)
    files = _ConfigFiles(root)
    paths = _Collector(root)
    cni = _CniCollector(files)
    said = _runtime_units(files)
    _containerd(paths, files, cni, said[Runtime.CONTAINERD])
    _rancher(paths, files, Runtime.K3S, cni, said[Runtime.K3S])
    _rancher(paths, files, Runtime.RKE2, cni, said[Runtime.RKE2])
    warned = len(files.warnings)
    storage_runroot, storage_graphroot = _storage_defaults(files)
    storage_unread = len(files.warnings) > warned
    _crio(paths, files, storage_runroot, storage_graphroot, cni, said[Runtime.CRIO], storage_unread)
    _without_config(paths, storage_runroot)
    cni_dirs = cni.result()
    return RuntimeConfigs(
        sockets=paths.of_kind(PathKind.SOCKET),
        activation_sockets=paths.of_kind(PathKind.ACTIVATION_SOCKET),
        live_state_dirs=paths.of_kind(*LIVE_STATE_KINDS),
        start_markers=paths.of_kind(PathKind.START_MARKER),
        netns_dirs=paths.of_kind(PathKind.NETNS_DIR),
        persistent_roots=paths.of_kind(PathKind.PERSISTENT_ROOT),
        files_read=tuple(files.files_read),
        warnings=tuple(files.warnings),
        cni_dirs=cni_dirs,
        records_in_doubt=tuple(paths.in_doubt),
    )


def crio_settings(root: str) -> dict[str, tuple[Any, str]]:
    """The keys of CRI-O's [crio] table as its config files leave them (crio.conf, then the
    drop-ins, a later file winning), each with the file that set it. Files that cannot be used
    are skipped: load() warns about them."""
    files = _ConfigFiles(os.path.abspath(root))
    settings: dict[str, tuple[Any, str]] = {}
    for node_path in [CRIO_CONFIG, *_crio_drop_ins(files, CRIO_DROP_IN_DIR)][:MAX_CONFIG_FILES]:
        for key, value in _table(files.read(node_path), "crio").items():
            settings[key] = (value, files.path(node_path))
    return settings
