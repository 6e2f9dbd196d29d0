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
- k3s and RKE2 start their containerd with `-a /run/k3s/containerd/containerd.sock --state
  /run/k3s/containerd --root <data-dir>/agent/containerd`; flags win over the generated config
  (k3s pkg/agent/containerd, rke2 pkg/agent config: both use /run/k3s/containerd).
- CRI-O (docs/crio.conf.5.md, crio.conf.d.5.md, pkg/config): /etc/crio/crio.conf, then every
  file below /etc/crio/crio.conf.d (a filepath.Walk: lexical order, recursive, whatever the
  name), a later value winning. `[crio] runroot` and `root` default to containers/storage's
  storage.conf (/etc/containers/storage.conf, else /usr/share/containers/storage.conf,
  `[storage] runroot` and `graphroot`, built-in /run/containers/storage). Network namespaces
  are pinned in `[crio.runtime] namespaces_dir`/netns (default /var/run). The OCI runtime's
  state is in each `[crio.runtime.runtimes.<name>] runtime_root` (default /run/crun; /run/runc
  for runc before crun became the default).
"""

from __future__ import annotations

import os
import posixpath
import stat
import sys
from collections import deque
from collections.abc import Callable, Iterable
from enum import Enum
from typing import Any, NamedTuple

from cni_reaper.node_root import (
    BadPattern,
    LeavesRoot,
    canonical,
    exists_inside,
    glob_inside,
    host_path,
    listed,
    open_inside,
)

MAX_CONFIG_BYTES = 1 << 20
# Per runtime, imports and drop-ins together; real nodes have a few.
MAX_CONFIG_FILES = 64
MAX_DROP_IN_DEPTH = 8

CONTAINERD_CONFIG = "/etc/containerd/config.toml"
CRIO_CONFIG = "/etc/crio/crio.conf"
CRIO_DROP_IN_DIR = "/etc/crio/crio.conf.d"
STORAGE_CONFIGS = ("/etc/containers/storage.conf", "/usr/share/containers/storage.conf")
RANCHER_DIR = "/var/lib/rancher"

# The CRI plugin's name in config versions 1, 2 and 3.
CRI_PLUGINS = ("cri", "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime")
GRPC_PLUGIN = "io.containerd.server.v1.grpc"


class Runtime(str, Enum):
    CONTAINERD = "containerd"
    K3S = "k3s"
    RKE2 = "rke2"
    CRIO = "cri-o"
    CRI_DOCKERD = "cri-dockerd"
    DOCKER = "docker"
    PODMAN = "podman"


class PathKind(str, Enum):
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


class LocatedPath(NamedTuple):
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


class RuntimeConfigs(NamedTuple):
    sockets: tuple[LocatedPath, ...]
    activation_sockets: tuple[LocatedPath, ...]  # neither probe them nor count their existence
    live_state_dirs: tuple[LocatedPath, ...]  # under /run unless a config says otherwise
    start_markers: tuple[LocatedPath, ...]
    netns_dirs: tuple[LocatedPath, ...]
    persistent_roots: tuple[LocatedPath, ...]
    files_read: tuple[str, ...]
    warnings: tuple[str, ...]

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
        try:
            data = self._read_bytes(node_path)
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
        parse = _toml_parser()
        if parse is None:
            self.warnings.append(f"{where}: not read: TOML needs the tomli package before 3.11")
            return None
        try:
            doc = parse(data.decode("utf-8"))
        except UnicodeDecodeError:
            self.warnings.append(f"{where}: not UTF-8, so not TOML; not read")
            return None
        except (ValueError, RecursionError) as e:
            self.warnings.append(f"{where}: not valid TOML ({e}); not read")
            return None
        self.files_read.append(where)
        return doc

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
        return value, f"{self.path(node_path)}: {label}"


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


class _ContainerdSettings(NamedTuple):
    state: tuple[str, str] | None
    root: tuple[str, str] | None
    address: tuple[str, str] | None
    runc_roots: tuple[tuple[str, str], ...]


def _table(doc: Any, *keys: str) -> dict[str, Any]:
    """The table at keys; an empty one where a key is missing or names no table."""
    for key in keys:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc if isinstance(doc, dict) else {}


def _containerd_settings(files: _ConfigFiles, main: str) -> _ContainerdSettings:
    state = root = address = None
    cri_plugins: dict[str, tuple[str, dict[str, Any]]] = {}  # the last file's table wins whole
    for node_path, doc in _containerd_files(files, main):
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
    runc_roots = []
    for name, (node_path, doc) in cri_plugins.items():
        for handler in _table(doc, "plugins", name, "containerd", "runtimes"):
            keys = ("plugins", name, "containerd", "runtimes", handler, "options", "Root")
            found = files.string(doc, node_path, *keys)
            if found is not None:
                runc_roots.append(found)
    return _ContainerdSettings(state, root, address, tuple(runc_roots))


def _containerd(paths: _Collector, files: _ConfigFiles) -> None:
    found = _containerd_settings(files, CONTAINERD_CONFIG)
    runtime = Runtime.CONTAINERD
    paths.setting(runtime, PathKind.SOCKET, "/run/containerd/containerd.sock", found.address)
    paths.setting(runtime, PathKind.TASK_STATE, "/run/containerd", found.state)
    paths.setting(runtime, PathKind.PERSISTENT_ROOT, "/var/lib/containerd", found.root)
    paths.add(runtime, PathKind.NAMESPACED_OCI_ROOT, "/run/containerd/runc", "default")
    # go-cni pins each sandbox's netns in /var/run/netns.
    paths.add(runtime, PathKind.NETNS_DIR, "/run/netns", "default")
    for value, source in found.runc_roots:
        paths.add(runtime, PathKind.NAMESPACED_OCI_ROOT, value, source)


def _rancher(paths: _Collector, files: _ConfigFiles, runtime: Runtime) -> None:
    """k3s or RKE2: the command line they start containerd with wins over their config, whose
    values are kept as watched only."""
    data_dir = f"{RANCHER_DIR}/{runtime.value}/agent"
    found = _containerd_settings(files, f"{data_dir}/etc/containerd/config.toml")
    shared = "default (k3s and RKE2)"
    paths.add(runtime, PathKind.SOCKET, "/run/k3s/containerd/containerd.sock", shared)
    paths.add(runtime, PathKind.TASK_STATE, "/run/k3s/containerd", shared)
    paths.add(runtime, PathKind.SOCKET, "/run/k3s/cri-dockerd/cri-dockerd.sock", shared)
    paths.add(runtime, PathKind.PERSISTENT_ROOT, f"{data_dir}/containerd", "default")
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
    try:
        fd, _ = open_inside(files.root, node_dir, directory=True)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except (OSError, LeavesRoot) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        files.warnings.append(f"{files.path(node_dir)}: {reason}; its files not read")
        return []
    try:
        entries = sorted(listed(fd), key=lambda entry: os.fsencode(entry.name))
        found = []
        for entry in entries:
            path = f"{node_dir.rstrip('/')}/{entry.name}"
            if not entry.is_dir(follow_symlinks=False):
                found.append(path)
            elif depth < MAX_DROP_IN_DEPTH:
                found.extend(_crio_drop_ins(files, path, depth + 1))
            else:
                files.warnings.append(f"{files.path(path)}: nested too deep; not read")
        return found
    except OSError as e:
        files.warnings.append(f"{files.path(node_dir)}: {e.strerror or e}; its files not read")
        return []
    finally:
        os.close(fd)


def _crio(
    paths: _Collector,
    files: _ConfigFiles,
    storage_runroot: tuple[str, str],
    storage_graphroot: tuple[str, str],
) -> None:
    runtime = Runtime.CRIO
    listen = runroot = root = version_file = namespaces_dir = None
    oci_roots: dict[str, tuple[str, str]] = {}
    config_files = [CRIO_CONFIG, *_crio_drop_ins(files, CRIO_DROP_IN_DIR)]
    if len(config_files) > MAX_CONFIG_FILES:
        files.warnings.append(
            f"{files.path(CRIO_DROP_IN_DIR)}: more than {MAX_CONFIG_FILES} files; "
            f"only the first {MAX_CONFIG_FILES - 1} read"
        )
        del config_files[MAX_CONFIG_FILES:]
    for node_path in config_files:
        doc = files.read(node_path)
        if doc is None:
            continue
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
    paths.setting(runtime, PathKind.SOCKET, "/run/crio/crio.sock", listen)
    paths.add(runtime, PathKind.RUNTIME_DIR, "/run/crio", "default")
    paths.setting(
        runtime, PathKind.STORAGE_RUNROOT, storage_runroot[0], runroot, storage_runroot[1]
    )
    paths.setting(runtime, PathKind.START_MARKER, "/run/crio/version", version_file)
    netns = None if namespaces_dir is None else (f"{namespaces_dir[0]}/netns", namespaces_dir[1])
    paths.setting(runtime, PathKind.NETNS_DIR, "/run/netns", netns)
    paths.setting(
        runtime, PathKind.PERSISTENT_ROOT, storage_graphroot[0], root, storage_graphroot[1]
    )
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


def load(root: str) -> RuntimeConfigs:
    """Where the runtimes of the node at root keep their sockets and state."""
    root = os.path.abspath(root)
    files = _ConfigFiles(root)
    paths = _Collector(root)
    _containerd(paths, files)
    _rancher(paths, files, Runtime.K3S)
    _rancher(paths, files, Runtime.RKE2)
    storage_runroot, storage_graphroot = _storage_defaults(files)
    _crio(paths, files, storage_runroot, storage_graphroot)
    _without_config(paths, storage_runroot)
    return RuntimeConfigs(
        sockets=paths.of_kind(PathKind.SOCKET),
        activation_sockets=paths.of_kind(PathKind.ACTIVATION_SOCKET),
        live_state_dirs=paths.of_kind(*LIVE_STATE_KINDS),
        start_markers=paths.of_kind(PathKind.START_MARKER),
        netns_dirs=paths.of_kind(PathKind.NETNS_DIR),
        persistent_roots=paths.of_kind(PathKind.PERSISTENT_ROOT),
        files_read=tuple(files.files_read),
        warnings=tuple(files.warnings),
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
