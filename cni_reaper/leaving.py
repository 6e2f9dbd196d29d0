"""The last step of a move across file systems, and what a run killed in it leaves behind.

A file copied to the quarantine on another file system has to leave its dir by an unlink,
and unlink() takes a name, not an inode: checked by name and then unlinked, the original could
be replaced in between, and the unlink would take the newcomer (libcni writes without a lock).
So the original is renamed first to a hidden name beside it, which no one else writes, checked
there (quarantine.py), and only then unlinked; a file that proves to be another goes back under
its name by link(), which never replaces.

A run killed between that rename and the unlink leaves the hidden name: a regular file named
.<name>.<8 hex digits>.cni-reaper-leaving. Every scan of a dir sets such names aside (cache.py),
and the next real run settles them before it judges the dir:
- its name holds the same file again (a put-back was cut short): the hidden name goes;
- the quarantine holds a copy of it, with the same bytes and a sidecar naming it: the move was
  done but for the unlink, which is made. This boot's dir is looked in first, then every
  earlier boot's: a run killed in this step, then a power cut, leaves the copy in the dir of
  a boot that is over;
- otherwise it goes back under its name, when that is free, and is judged as any file is;
- with its name taken by another file and no copy of it, both are left, and said (exit 65).
A name is settled only when it could be the reaper's: one the scan of its dir would take under
its original name, and a file that predates every runtime of the boot (invariant 1): all do
while the first run of a boot takes its pre-runtime record; a later run settles only the file
that record holds under the original's name, whose inode, size and mtime the hiding rename
kept. The rest are left alone, and said (exit 65); one that cannot be removed or put back is a
failure (exit 73). A dry run says which of these a real run would do, and changes nothing.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import stat
from collections.abc import Callable, Sequence

from cni_reaper import nonce
from cni_reaper.read_only import read_only_noted
from cni_reaper.record import Record

SUFFIX = ".cni-reaper-leaving"
_TAG_DIGITS = 8
_MAX_NAME_BYTES = 255  # NAME_MAX of every Linux file system a results dir is on


def hidden_name(dir_fd: int, name: str) -> str | None:
    """A fresh hidden name for name, beside it in dir_fd, that no file holds (a leftover a run
    left alone is never renamed over); None when it would not fit in a file name."""
    while True:
        hidden = f".{name}.{nonce.tag(_TAG_DIGITS // 2)}{SUFFIX}"
        if len(os.fsencode(hidden)) > _MAX_NAME_BYTES:
            return None
        try:
            os.stat(hidden, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return hidden


def put_back(from_fd: int, name: str, to_fd: int, original: str) -> tuple[bool, OSError | None]:
    """The file at name (in from_fd) under original (in to_fd) again, never over a file that
    took original meanwhile (link() does not replace), then name unlinked: whether it is under
    original again, and what stopped the rest. The link's error leaves name as it was
    (FileExistsError: original is taken); the unlink's leaves both names to the file."""
    try:
        os.link(name, original, src_dir_fd=from_fd, dst_dir_fd=to_fd, follow_symlinks=False)
    except OSError as e:
        return False, e
    try:
        os.unlink(name, dir_fd=from_fd)
    except FileNotFoundError:
        pass
    except OSError as e:
        return True, e
    return True, None


def original_of(name: str) -> str | None:
    """The name a hidden name was made for, None if it is no such name."""
    if not (name.startswith(".") and name.endswith(SUFFIX)):
        return None
    original, dot, tag = name[1 : -len(SUFFIX)].rpartition(".")
    hex_tag = len(tag) == _TAG_DIGITS and all(c in "0123456789abcdef" for c in tag)
    return original if dot and original and hex_tag else None


def hidden_among(names: Sequence[str]) -> list[str]:
    """The hidden names of a sorted listing: all of them sort among the names that begin with
    '.', found by bisection, so that a listing of 100,000 names is not walked again for them."""
    start, end = bisect.bisect_left(names, "."), bisect.bisect_left(names, "/")
    return [name for name in names[start:end] if original_of(name) is not None]


# (hidden name, its original's name) -> where the quarantine holds a copy of its bytes made
# from that original, or None; and what kept it from looking everywhere, or ""
CopyOf = Callable[[str, str], "tuple[str | None, str]"]
# (a hidden file's stat, its original's name) -> why it may not be taken for the file that name
# held before any runtime of this boot started, or None
Predates = Callable[[os.stat_result, str], "str | None"]

DONE, PLANNED, LEFT, FAILED = "done", "planned", "left", "failed"  # what became of each


class Settled(Record):
    """One hidden name settled, or said: its outcome (DONE, PLANNED in a dry run, LEFT for the
    operator, FAILED), and the line the report's warnings hold."""

    outcome: str
    line: str


def settle(
    dir_fd: int,
    where: str,
    hidden: Sequence[str],
    copy_of: CopyOf,
    predates: Predates,
    dry_run: bool,
) -> tuple[list[str], list[Settled]]:
    """Each hidden name of the dir at where (open at dir_fd) settled, or said (a dry run):
    the names put back, for the scan to judge, and what became of each hidden name. Only a
    file that predates every runtime of this boot is touched (invariant 1): a later run of the
    boot settles only what its record holds, under the original's name."""
    put_back: list[str] = []
    said: list[Settled] = []
    changed = False
    for name in hidden:
        original = original_of(name)
        assert original is not None  # hidden_among() found it
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        at = f"{os.path.join(where, name)}: left by a move cut short before its last step"
        if not stat.S_ISREG(st.st_mode):
            said.append(Settled(LEFT, f"{at}, but not a regular file: left alone"))
            continue
        why_not = predates(st, original)
        if why_not is not None:
            said.append(Settled(LEFT, f"{at}; {why_not}: left alone"))
            continue
        try:
            now = os.stat(original, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            now = None
        unsure = ""  # what kept the look for a copy from looking everywhere
        if now is not None and (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino):
            why, drop = f"{original} holds the same file again", True
        else:
            copy, unsure = copy_of(name, original)
            why, drop = f"its bytes are in {copy}", copy is not None
        note = f" ({unsure})" if unsure else ""
        if drop:
            if dry_run:
                said.append(Settled(PLANNED, f"{at}; {why}: a real run removes it"))
                continue
            try:
                os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                continue
            except OSError as e:
                said.append(Settled(FAILED, _noted(f"{at}; {why}: cannot remove it", e)))
                continue
            said.append(Settled(DONE, f"{at}; {why}: removed it"))
            changed = True
        elif now is not None:
            said.append(
                Settled(
                    LEFT,
                    f"{at}; {original} is another file now, and no boot's quarantine holds "
                    f"a copy of it{note}: both left; compare them by hand",
                )
            )
        elif dry_run:
            said.append(
                Settled(
                    PLANNED,
                    f"{at}; no copy of it in the quarantine{note}: a real run puts it back",
                )
            )
        else:
            done = _put_back(dir_fd, name, original, f"{at}; no copy of it in the quarantine{note}")
            if done.outcome == DONE:
                put_back.append(original)
            changed = changed or done.outcome != LEFT
            said.append(done)
    if changed:
        # Undone by a power cut, a step is settled again by the next run: each is idempotent.
        with contextlib.suppress(OSError):
            os.fsync(dir_fd)
    return put_back, said


def _put_back(dir_fd: int, name: str, original: str, at: str) -> Settled:
    """name under original again (put_back), and what became of it."""
    back, error = put_back(dir_fd, name, dir_fd, original)
    if error is None:
        return Settled(DONE, f"{at}: put back as {original}")
    if back:
        # Both names hold the file: the next run, finding its name holds it again, drops this.
        return Settled(FAILED, _noted(f"{at}; put back as {original}, but cannot remove it", error))
    if isinstance(error, FileExistsError):
        return Settled(
            LEFT, f"{at}; {original} appeared meanwhile: both left; compare them by hand"
        )
    return Settled(FAILED, _noted(f"{at}; cannot put it back as {original}", error))


def _noted(problem: str, error: OSError) -> str:
    """problem, the system's words, and where the file system is read-only, the unit's."""
    return read_only_noted(f"{problem}: {error.strerror or error}; left", error)
