"""Where everything the reaper reads and writes lives, all relative to one root."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from cni_reaper.node_root import resolve_inside
from cni_reaper.record import Record
from cni_reaper.runtime.config import FALLBACK_BIN_DIRS, FALLBACK_CONF_DIRS, CniDir, CniDirs

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DEFAULT_CACHE_DIR = "var/lib/cni"
# With no runtime found on the node: where distributions and upstream's tarballs install.
DEFAULT_CONF_DIRS = tuple(d.lstrip("/") for d in FALLBACK_CONF_DIRS)
DEFAULT_BIN_DIRS = tuple(d.lstrip("/") for d in FALLBACK_BIN_DIRS)
DEFAULT_WTMP = "var/log/wtmp"
# wtmpdb upstream's path; Debian 13 makes it a symlink to /var/log/wtmp.db, whose rotated
# files (logrotate's wtmp.db.1 ...) lie beside the link's target
DEFAULT_WTMPDB_PATH = "/var/lib/wtmpdb/wtmp.db"
DEFAULT_STATE_DIR = "var/lib/cni-reaper"


class SourcedDir(Record):
    """A CNI config or plugin dir the reaper uses, and what named it."""

    path: str  # from here
    # "flag --conf-dir", "default", or what named it on the node: "<runtime>: default",
    # "<runtime>: <config file>: <key>"; several when several runtimes use it
    sources: tuple[str, ...]

    def describe(self) -> str:
        return f"{self.path} ({'; '.join(self.sources)})"

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "sources": list(self.sources)}


class NodePaths(Record):
    root: str
    cache_dir: str
    sourced_conf_dirs: tuple[SourcedDir, ...]
    sourced_bin_dirs: tuple[SourcedDir, ...]
    wtmp_files: tuple[str, ...]  # oldest first: the rotated file, then the live one
    state_dir: str
    proc_stat: str
    boot_id: str
    run_dir: str
    wtmpdb_node_path: str = DEFAULT_WTMPDB_PATH  # as the node names it: read inside root

    @property
    def conf_dirs(self) -> tuple[str, ...]:
        return tuple(d.path for d in self.sourced_conf_dirs)

    @property
    def bin_dirs(self) -> tuple[str, ...]:
        return tuple(d.path for d in self.sourced_bin_dirs)

    @property
    def results_dir(self) -> str:
        return os.path.join(self.cache_dir, "results")

    @property
    def quarantine_dir(self) -> str:
        return os.path.join(self.state_dir, "quarantine")

    @property
    def lock_file(self) -> str:
        return os.path.join(self.run_dir, "cni-reaper.lock")

    @classmethod
    def build(
        cls,
        *,
        root: str = "/",
        cache_dir: str | None = None,
        conf_dirs: Sequence[str] | None = None,
        bin_dirs: Sequence[str] | None = None,
        wtmp: str | None = None,
        state_dir: str | None = None,
        runtime_dirs: CniDirs | None = None,
    ) -> NodePaths:
        """Defaults are joined to root; an explicit path is taken as given, like tmpfiles --root.
        Every path is made absolute: a repair runs from / (see spawn.py), and CNI_PATH is
        handed to plugins as it is.

        The CNI conf and plugin dirs: those given (--conf-dir, --bin-dir) win; else those of
        the runtimes found on the node (runtime_dirs, from runtime/config.py), each dir once,
        in their order; else, with no runtime found, the defaults: every place the
        distributions and upstream install to.

        Under a root other than /, a default is resolved as the node resolves it: a node's
        /var/lib/cni may be an absolute symlink to its data disk, which, followed from here,
        would name this machine's own state; it starts again at the root instead. Raises
        LeavesRoot when a ".." climbs above the root."""
        root = os.path.abspath(root)
        absolute = os.path.abspath

        def under(rel: str) -> str:
            if root == "/":
                return os.path.join(root, rel)
            return resolve_inside(root, rel)

        proc = under("proc")
        if not os.path.exists(os.path.join(proc, "stat")):
            # A tree prepared by a test or an image builder may carry no /proc: the kernel's is
            # still the truth about the running boot.
            proc = "/proc"
        if wtmp is None:
            wtmp_files: tuple[str, ...] = (under(DEFAULT_WTMP + ".1"), under(DEFAULT_WTMP))
        else:
            wtmp = absolute(wtmp)
            wtmp_files = (wtmp + ".1", wtmp)
        return cls(
            root=root,
            cache_dir=absolute(cache_dir) if cache_dir is not None else under(DEFAULT_CACHE_DIR),
            sourced_conf_dirs=_chosen(
                conf_dirs,
                "--conf-dir",
                runtime_dirs.conf_dirs if runtime_dirs is not None else (),
                lambda: tuple(map(under, DEFAULT_CONF_DIRS)),
            ),
            sourced_bin_dirs=_chosen(
                bin_dirs,
                "--bin-dir",
                runtime_dirs.bin_dirs if runtime_dirs is not None else (),
                lambda: tuple(map(under, DEFAULT_BIN_DIRS)),
            ),
            wtmp_files=wtmp_files,
            state_dir=absolute(state_dir) if state_dir is not None else under(DEFAULT_STATE_DIR),
            proc_stat=os.path.join(proc, "stat"),
            boot_id=os.path.join(proc, "sys/kernel/random/boot_id"),
            run_dir=under("run"),
        )


def _chosen(
    given: Sequence[str] | None,
    flag: str,
    found: Sequence[CniDir],
    defaults: Callable[[], Sequence[str]],
) -> tuple[SourcedDir, ...]:
    """The dirs given by flag, else those found, else the defaults; each dir once, in its
    first place, with every source that named it. The defaults are resolved only when taken:
    one that the node's symlinks lead out of the root (LeavesRoot) stops no run given others."""
    named: list[tuple[str, str]]
    if given:
        named = [(os.path.abspath(d), f"flag {flag}") for d in given]
    elif found:
        named = [(d.path, d.describe()) for d in found]
    else:
        named = [(d, "default") for d in defaults()]
    sources: dict[str, list[str]] = {}
    for path, source in named:
        known = sources.setdefault(path, [])
        if source not in known:
            known.append(source)
    return tuple(SourcedDir(path, tuple(known)) for path, known in sources.items())
