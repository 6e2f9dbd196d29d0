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

The same verdicts decide as for the results dir (plan.py), but the one change is a move.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable, Collection

from cni_reaper import cache
from cni_reaper.boot import Written, WrittenVerdict
from cni_reaper.cache import CacheEntry
from cni_reaper.content import Content
from cni_reaper.plan import Action, not_to_change
from cni_reaper.record import Record
from cni_reaper.trust import untrusted

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

SUBDIR = "multus"  # Multus's cacheDir, under libcni's cache dir
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

STALE_DAMAGE = (
    "left by an earlier boot; Multus's DEL of this delegate would abort on it (libcni 1.1.x): "
    "moved aside, libcni runs that DEL with no cached result"
)
READABLE = "libcni can read it: Multus's own DEL will use it"

# (network, container ID, ifname) -> where Multus cached that delegate's result, if it did
DelegateResults = Callable[[str, str, str], "str | None"]


class PlannedDelegate(Record):
    entry: CacheEntry
    written: WrittenVerdict
    action: Action  # keep, quarantine, leave or report
    reason: str


class MultusCache:
    """Multus's delegate results dir as this run found it, before anything moved: its names
    (for the reservations, judged after the moves) and its entries, judged as a results dir's.
    """

    def __init__(
        self,
        results_dir: str,
        fd: int | None,
        names: frozenset[str] = frozenset(),
        problem: str | None = None,
    ) -> None:
        self.results_dir = results_dir
        self.fd = fd  # None: no such dir, or one that cannot be looked at (problem); closed
        self.present = fd is not None  # as opened, whether closed since or not
        self._names = names  # the dir's, before this run moved any
        self.problem = problem

    @classmethod
    def open(cls, cache_dir: str) -> MultusCache:
        """<cache_dir>/multus/results, the cache dir as paths.py resolved it (inside --root),
        then each of the two steps below it without following a symlink: one would lead to
        another machine's files under --root, or back to the runtime's results dir. Neither
        may be writable by others, whose files could steer a move (cache.py's rule)."""
        results_dir = os.path.join(cache_dir, SUBDIR, "results")
        fd = None
        try:
            fd = os.open(cache_dir, _DIR_FLAGS & ~os.O_NOFOLLOW)
            for step in (SUBDIR, "results"):
                parent = fd
                fd = None
                try:
                    fd = os.open(step, _DIR_FLAGS, dir_fd=parent)
                finally:
                    os.close(parent)
                problem = untrusted(os.fstat(fd))
                if problem:
                    raise OSError(errno.EPERM, f"{step} {problem}")
            names = frozenset(os.listdir(fd))
        except FileNotFoundError:
            if fd is not None:
                os.close(fd)
            return cls(results_dir, None)
        except OSError as e:
            if fd is not None:
                os.close(fd)
            if e.errno in (errno.ELOOP, errno.ENOTDIR):
                why = "a symlink or not a directory on the way; refusing to inspect it"
            else:
                why = e.strerror or str(e)
            return cls(results_dir, None, problem=f"Multus's delegate results {results_dir}: {why}")
        return cls(results_dir, fd, names)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def entries(self, networks: Collection[str]) -> list[CacheEntry]:
        if self.fd is None:
            return []
        return list(cache.inventory(self.fd, networks))

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
        earlier = moved(self.results_dir) if self.problem is None else None
        if earlier is None:
            return lambda network, container_id, ifname: self.results_dir
        names, where = self._names | earlier, self.results_dir

        def cached(network: str, container_id: str, ifname: str) -> str | None:
            name = f"{network}-{container_id}-{ifname}"
            return os.path.join(where, name) if name in names else None

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
    held = not_to_change(entry, written, alive)
    if held is not None:
        return PlannedDelegate(entry, written, *held)
    return PlannedDelegate(entry, written, Action.QUARANTINE, STALE_DAMAGE)


def delegate_doc(
    planned: PlannedDelegate,
    results_dir: str,
    outcome: str,  # planned, done, failed or skipped
    quarantined_to: str | None = None,
    problem: str | None = None,
) -> dict[str, Any]:
    """One delegate result in the report, the journal and its sidecar."""
    entry, split = planned.entry, planned.entry.split
    return {
        "path": os.path.join(results_dir, entry.name),
        "network": split.network if split else None,
        "container_id": split.container_id if split else None,
        "ifname": split.ifname if split else None,
        "name_problem": entry.name_problem,
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


def held_back(planned: PlannedDelegate, veto: str) -> PlannedDelegate:
    """A move the whole plan's last look found against (pre_runtime.confirm): left instead."""
    if planned.action is not Action.QUARANTINE:
        return planned
    return planned._replace(
        action=Action.LEAVE,
        reason=f"not proven to predate this boot: {veto}",
        written=planned.written.restated(Written.UNKNOWN, f"{veto}; "),
    )
