"""The reaper run on the node itself (--root /), the node being a test's tree.

Usage: unshare --mount --net --pid --fork --propagation private \
           python -m tests.node_itself TREE CLOCK [DIR...] -- [ARGV...]

With DIRs (node paths) and no ARGV: what this boot's first run records of the results dir and
each DIR before any runtime starts, taken at CLOCK (NodeTree.record_before_runtime, as the
node sees it: the record names the paths a run at / reads).

The tests' other runs all name a --root, under which the plugins run confined to the tree's
dirs (cni_reaper/repair/confine.py) and some DELs (Multus's) run not at all. A run at / is the
node's own: no confinement, every path the node's. Here the tree is made this process's root
directory (chroot) in a mount namespace of its own, with this machine's /usr (its programs,
Debian's plugins in /usr/lib/cni), a few device nodes and the interpreter's and the package's
dirs mounted read-only into it: whatever such a run gets wrong lands in the tree, never on the
machine. Its /proc is the PID namespace's own, which lists no process of the machine (none is
seen as a runtime), with the tree's proc files (btime, boot id) mounted over the kernel's. No
/sys or journal socket is there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

DEVICES = ("null", "zero", "random", "urandom")
PROC_FILES = ("stat", "sys/kernel/random/boot_id")  # the tree's, as NodeTree writes them
# Debian's merged /usr: the top-level links a program's paths go through.
USR_LINKS = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}


def _bind_read_only(source: str, tree: Path) -> None:
    target = tree / source.lstrip("/")
    if Path(source).is_dir():
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
    _mount("--bind", source, str(target))
    _mount("-o", "remount,bind,ro", str(target))


def _code_dirs() -> list[str]:
    """/usr, the interpreter's install and venv, and the package's checkout, outer first."""
    repo = str(Path(__file__).resolve().parent.parent)
    found = {"/usr", os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix), repo}
    outer: list[str] = []
    for path in sorted(found, key=len):
        if not any(path == o or path.startswith(o + "/") for o in outer):
            outer.append(path)
    return outer


def _mount(*argv: str) -> None:
    subprocess.run(["mount", *argv], check=True)


def enter(tree: Path) -> None:
    for source in _code_dirs():
        _bind_read_only(source, tree)
    (tree / "dev").mkdir(exist_ok=True)
    _mount("-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(tree / "dev"))
    for device in DEVICES:
        _bind_read_only(f"/dev/{device}", tree)
    proc_files = {
        name: (tree / "proc" / name).read_bytes()
        for name in PROC_FILES
        if (tree / "proc" / name).is_file()
    }
    (tree / "proc").mkdir(exist_ok=True)
    _mount("-t", "proc", "proc", str(tree / "proc"))
    for name, data in proc_files.items():
        kept = tree / "dev" / name.replace("/", "-")
        kept.write_bytes(data)
        _mount("--bind", str(kept), str(tree / "proc" / name))
    for name, to in USR_LINKS.items():
        if os.path.islink(f"/{name}") and not os.path.lexists(tree / name):
            (tree / name).symlink_to(to)
    os.chroot(tree)
    os.chdir("/")


if __name__ == "__main__":
    split = sys.argv.index("--")
    enter(Path(sys.argv[1]))
    now = float(sys.argv[2])
    # Imported from inside the tree, as on a node.
    from cni_reaper import cli
    from tests.nodetree import NodeTree

    if not sys.argv[split + 1 :]:
        NodeTree(Path("/")).record_before_runtime(now, *map(Path, sys.argv[3:split]))
        sys.exit(0)
    sys.exit(cli.main(sys.argv[split + 1 :], clock=lambda: now))
