"""Where everything the reaper reads and writes lives, all relative to one root."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import NamedTuple

from cni_reaper.node_root import resolve_inside

DEFAULT_CACHE_DIR = "var/lib/cni"
DEFAULT_CONF_DIRS = ("etc/cni/net.d",)
DEFAULT_BIN_DIRS = ("opt/cni/bin", "usr/lib/cni", "usr/libexec/cni")
DEFAULT_WTMP = "var/log/wtmp"
DEFAULT_STATE_DIR = "var/lib/cni-reaper"


class NodePaths(NamedTuple):
    root: str
    cache_dir: str
    conf_dirs: tuple[str, ...]
    bin_dirs: tuple[str, ...]
    wtmp_files: tuple[str, ...]  # oldest first: the rotated file, then the live one
    state_dir: str
    proc_stat: str
    boot_id: str
    run_dir: str

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
    ) -> NodePaths:
        """Defaults are joined to root; an explicit path is taken as given, like tmpfiles --root.
        Every path is made absolute: a repair runs from / (see spawn.py), and CNI_PATH is
        handed to plugins as it is.

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
            conf_dirs=tuple(map(absolute, conf_dirs or ())) or tuple(map(under, DEFAULT_CONF_DIRS)),
            bin_dirs=tuple(map(absolute, bin_dirs or ())) or tuple(map(under, DEFAULT_BIN_DIRS)),
            wtmp_files=wtmp_files,
            state_dir=absolute(state_dir) if state_dir is not None else under(DEFAULT_STATE_DIR),
            proc_stat=os.path.join(proc, "stat"),
            boot_id=os.path.join(proc, "sys/kernel/random/boot_id"),
            run_dir=under("run"),
        )
