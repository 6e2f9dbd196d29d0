"""Moving Multus's damaged delegate results and scratch files aside (multus.py says why): the
repair stage's part for them, real runs only, once the whole plan is made and kept and before
any DEL, so that the reaper's own DEL of a Multus entry, which runs Multus, finds them gone too.

Each goes to quarantine/<boot>/multus/ beside its sidecar, through a results entry's checks
(quarantine.py): still the file the plan judged (inode, size, mtime, ctime), still the same
damage, and the same again once it has arrived; one that changed stays where it is.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence

from cni_reaper.content import ContentVerdict, same_damage
from cni_reaper.multus import QUARANTINE_SUBDIR
from cni_reaper.plan import Action
from cni_reaper.repair.quarantine import (
    NO_DIR_THERE,
    SIDECAR_SUFFIX,
    FileChanged,
    Move,
    Quarantine,
    failed_move,
    open_box,
    open_quarantine,
    sidecar,
)
from cni_reaper.unopened import open_regular

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cni_reaper.multus import Planned

# Sidecars read for moved_earlier(), at most: past them, every delegate counts as moved.
MAX_SIDECARS = 100_000
_SIDECAR_BYTES = 1 << 16


class _TooMany(Exception):
    """More sidecars than are read, or one that cannot be: which names were moved is unknown."""


def moved_earlier(
    quarantine_dir: str, on_doubt: Callable[[str], None] | None = None
) -> dict[str, frozenset[str]] | None:
    """The names of the files that runs before this one moved aside, in this boot or an
    earlier one, by the dir they were in (their sidecars in <quarantine>/<boot>/multus/ say
    where each came from): Multus's DEL still comes for them, with no cached result. None when
    that cannot be told (too many, a sidecar or a quarantine that cannot be read): every one
    then counts as moved; on_doubt, when given, is told why."""
    names: dict[str, set[str]] = {}
    read = 0
    try:
        top = open_quarantine(quarantine_dir)
    except FileNotFoundError:
        return {}
    except OSError as e:
        if on_doubt is not None:
            on_doubt(f"{quarantine_dir}: {e.strerror or e}")
        return None
    try:
        for boot in os.listdir(top):
            try:
                # Never through a symlink, nor in a dir others may write: as the moves'.
                sub, _ = open_box(top, quarantine_dir, boot, QUARANTINE_SUBDIR)
            except OSError as e:
                if e.errno in NO_DIR_THERE:
                    continue
                raise
            try:
                for name in os.listdir(sub):
                    if not name.endswith(SIDECAR_SUFFIX):
                        continue
                    read += 1
                    if read > MAX_SIDECARS:
                        raise _TooMany
                    path = _original(sub, name)
                    if path is None:
                        # Whose file it describes cannot be told: it may be any delegate's.
                        raise _TooMany
                    names.setdefault(os.path.dirname(path), set()).add(os.path.basename(path))
            finally:
                os.close(sub)
    except OSError as e:
        if on_doubt is not None:
            on_doubt(f"{e.filename or quarantine_dir}: {e.strerror or e}")
        return None
    except _TooMany:
        if on_doubt is not None:
            on_doubt(f"{quarantine_dir}: over {MAX_SIDECARS} sidecars, or one naming no file")
        return None
    finally:
        os.close(top)
    return {where: frozenset(found) for where, found in names.items()}


def _original(dir_fd: int, name: str) -> str | None:
    """Where the file a sidecar describes was: its record's path."""
    try:
        fd = open_regular(name, dir_fd)
    except OSError:
        return None
    try:
        data = os.read(fd, _SIDECAR_BYTES)
    finally:
        os.close(fd)
    try:
        path = json.loads(data).get("path")
    except (ValueError, RecursionError, AttributeError):
        return None
    return path if isinstance(path, str) else None


def carry_out(
    plan: Sequence[Planned],
    dir_fd: int | None,
    where: str,
    doc: Callable[[Planned, str, str, str | None, str | None], dict[str, Any]],
    verdict: Callable[[bytes], ContentVerdict] | None,
    quarantine_dir: str,
    boot_id: str,
    now: float,
) -> list[dict[str, Any]]:
    """The plan's moves made, of the files of one dir (where, open at dir_fd): every file's
    record (doc: multus.delegate_doc or scratch_doc), in the plan's order. verdict: what the
    files' bytes are judged by (a results entry's classify() unless said)."""
    docs = [doc(p, where, "skipped", None, None) for p in plan]
    moving = [i for i, p in enumerate(plan) if p.action is Action.QUARANTINE]
    if not moving:
        return docs
    assert dir_fd is not None  # a plan is made only of a dir that is open

    def record_of(planned: Planned) -> Callable[[str, str], dict[str, Any]]:
        def record(dest: str, sha256: str) -> dict[str, Any]:
            return sidecar(doc(planned, where, "done", dest, None), sha256, now)

        return record

    moves = []
    for i in moving:
        planned, entry = plan[i], plan[i].entry
        vet = same_damage(entry.content, verdict)
        moves.append(Move(dir_fd, entry.name, entry.file, record_of(planned), vet))
    place = Quarantine(quarantine_dir, boot_id, QUARANTINE_SUBDIR)
    unsynced = None
    try:
        moved = place.move_all(moves)
    finally:
        try:
            place.close()
        except OSError as e:
            # Moved all the same: a power cut may undo it, and the next run would move it again.
            unsynced = f"its move not made durable: {e.strerror or e}"
    for i, dest in zip(moving, moved):
        planned = plan[i]
        if isinstance(dest, FileChanged):
            changed = f"changed: {dest}; left for the next run"
            docs[i] = doc(planned, where, "skipped", None, changed)
        elif isinstance(dest, OSError):
            docs[i] = doc(planned, where, "failed", None, failed_move(dest))
        else:
            docs[i] = doc(planned, where, "done", os.path.join(place.dir, dest), unsynced)
    return docs
