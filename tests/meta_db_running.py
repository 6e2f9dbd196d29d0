"""containerd's meta.db as a running containerd holds it, for the tests of its reading
(test_meta_db_commits.py, test_meta_db_attacks.py): the flock its bbolt holds, commits landing
in place, and a read of the inventory made meanwhile."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from pathlib import Path

from cni_reaper.runtime import config, inventory
from cni_reaper.runtime.inventory import SandboxInventory

META_DB = "var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db"
HELD = "the lock bbolt's readers take is held (a running containerd holds it)"
# How a records line ends when read beside a running containerd.
RUNNING = f"; {HELD}: read between two commits"

# The after_each_read fixture (conftest.py): has an action run after each read of meta.db,
# given the read's number (from 1); returns the list of the reads' numbers made.
Interfere = Callable[[Callable[[int], None]], list[int]]


def inventory_of(root: Path) -> SandboxInventory:
    return inventory.load(str(root), config.load(str(root)))


def held_by_containerd(path: Path) -> int:
    """A descriptor holding the flock a running containerd's bbolt holds on its meta.db."""
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    return fd


def lands(path: Path, state: bytes) -> None:
    """A commit landing in the file in place, as a running bbolt writes it (the same inode)."""
    with open(path, "r+b") as f:
        f.write(state)


def read_while_held(
    root: Path, after_each_read: Interfere, action: Callable[[int], None] = lambda _: None
) -> tuple[list[int], SandboxInventory]:
    """The inventory of root read while a running containerd holds its meta.db, with action
    after each read of it: the reads made, and what was found."""
    fd = held_by_containerd(root / META_DB)
    try:
        reads = after_each_read(action)
        return reads, inventory_of(root)
    finally:
        os.close(fd)
