"""What the reaper, running as root, trusts on disk: what only root (or whoever runs it) could
have written, reached by a way only they could have laid.

A trusted file in a directory others may write to is worth nothing: they rename the directory
away and put their own in its place. So a path is trusted only when every directory the kernel
passes through to reach it is trusted too, every symlink on the way is resolved by the walk
itself (never by the kernel), and the object at the end is trusted.

Why what the walk found stays true until it is used (the path is exec'd or read by name, not by
the walk's descriptors): everything it checked can be changed only by root or the user running
the reaper. An entry of a trusted directory is renamed, replaced or removed only by someone who
may write that directory; a file's mode and owner are changed only by its owner or root; an
entry of a sticky directory is renamed or removed only by its owner, the directory's owner or
root, and the walk requires both to be root or the reaper's user. What remains is a race with
those same principals (a package upgrade replacing a plugin between check and exec), which is
not an attack: they could run anything as root anyway.
"""

from __future__ import annotations

import errno
import os
import stat

from cni_reaper.record import Record

# The kernel's MAXSYMLINKS: a path that takes more symlinks than this fails with ELOOP.
MAX_SYMLINKS = 40

# O_PATH opens a name without reading it, O_NOFOLLOW opens a symlink as itself: the walk then
# looks at exactly the inode it will pass through, and the next name is looked up in that
# inode, not in whatever the path names by then.
_OPEN_WHERE = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


def trusted_uids() -> tuple[int, ...]:
    return (0, os.geteuid())


def untrusted(st: os.stat_result) -> str | None:
    """Why a file or dir is not trusted: writable by group or others, or owned by someone
    other than root or the user running the reaper. A POSIX ACL that lets another user write
    shows in the group bits (they hold the ACL mask), so it is caught too."""
    if st.st_uid not in trusted_uids():
        return f"is owned by uid {st.st_uid}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _sticky_and_shared(st: os.stat_result) -> bool:
    """A directory like /tmp: others may add entries, but not rename or remove others' ones."""
    return bool(st.st_mode & stat.S_ISVTX) and bool(st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))


class ResolvedPath(Record):
    """Where a path leads, walked as the kernel resolves it, and whether the way is trusted."""

    path: str  # as asked
    resolved: str  # with every symlink resolved, as far as the walk got
    st: os.stat_result | None  # what is at the end (never a symlink); None: nothing there
    problem: str | None  # why the path is not trusted; None also when nothing is there

    @property
    def exists(self) -> bool:
        return self.st is not None


class _Dir(Record):
    path: str
    fd: int
    st: os.stat_result


def resolve_trusted(path: str) -> ResolvedPath:
    """Walk path from / a component at a time, resolving symlinks (absolute and relative, with
    `..`) itself, at most MAX_SYMLINKS of them. The answer has a problem when a directory passed
    through is not trusted (a sticky one such as /tmp is, if its next component is owned by
    root or the reaper's user), when a component that must be a directory is not one, or when
    the object at the end is not trusted. Nothing there is not a problem, unless it is a name
    in a sticky shared directory, where anyone could create it later."""
    if not os.path.isabs(path):
        return ResolvedPath(path, path, None, f"{path!r} is not an absolute path")
    if "\0" in path:
        return ResolvedPath(path, path, None, f"{path!r} contains a NUL byte")
    # Components still to walk, the next one last.
    todo = [c for c in reversed(path.split("/")) if c not in ("", ".")]
    dirs: list[_Dir] = []
    try:
        root_fd = os.open("/", _OPEN_WHERE | os.O_DIRECTORY)
        dirs.append(_Dir("/", root_fd, os.fstat(root_fd)))
        return _walk(path, todo, dirs)
    except OSError as e:
        return ResolvedPath(path, path, None, f"{path}: {e.strerror or e}")
    finally:
        for d in dirs:
            os.close(d.fd)


def untrusted_path(path: str) -> str | None:
    """Why path cannot be trusted, or is not there (a short sentence naming the offending
    path); None when it leads to a trusted object through trusted directories only."""
    found = resolve_trusted(path)
    if found.problem:
        return found.problem
    if found.st is None:
        return f"{found.resolved} does not exist"
    return None


def _walk(path: str, todo: list[str], dirs: list[_Dir]) -> ResolvedPath:
    hops = 0
    while todo:
        name = todo.pop()
        if name == "..":
            if len(dirs) > 1:  # as in the kernel, /.. is /
                os.close(dirs.pop().fd)
            continue
        parent = dirs[-1]
        here = os.path.join(parent.path, name)
        try:
            fd = os.open(name, _OPEN_WHERE, dir_fd=parent.fd)
        except FileNotFoundError:
            where = os.path.join(here, *reversed(todo))
            if _sticky_and_shared(parent.st):
                why = f"{here} does not exist in sticky dir {parent.path}, where anyone could "
                return ResolvedPath(path, where, None, why + "create it")
            return ResolvedPath(path, where, None, None)
        kept = False
        try:
            st = os.fstat(fd)
            if _sticky_and_shared(parent.st) and st.st_uid not in trusted_uids():
                why = f"{here} is owned by uid {st.st_uid} in sticky dir {parent.path}"
                return ResolvedPath(path, here, None, why)
            if stat.S_ISLNK(st.st_mode):
                hops += 1
                if hops > MAX_SYMLINKS:
                    why = f"{path}: {os.strerror(errno.ELOOP).lower()}"
                    return ResolvedPath(path, here, None, why)
                # Read from the link opened above: the inode just checked.
                target = os.readlink("", dir_fd=fd)
                if not target:
                    return ResolvedPath(path, here, None, None)  # the kernel says ENOENT
                if target.startswith("/"):
                    while len(dirs) > 1:
                        os.close(dirs.pop().fd)
                todo.extend(c for c in reversed(target.split("/")) if c not in ("", "."))
                continue
            if not todo:
                problem = untrusted(st)
                return ResolvedPath(path, here, st, f"{here} {problem}" if problem else None)
            if not stat.S_ISDIR(st.st_mode):
                return ResolvedPath(path, here, None, f"{here} is not a directory")
            if _sticky_and_shared(st):
                # Its entries are checked as they are passed: their owner, above.
                if st.st_uid not in trusted_uids():
                    why = f"sticky dir {here} is owned by uid {st.st_uid}"
                    return ResolvedPath(path, here, None, why)
            else:
                problem = untrusted(st)
                if problem:
                    return ResolvedPath(path, here, None, f"{here} {problem}")
            dirs.append(_Dir(here, fd, st))
            kept = True
        finally:
            if not kept:
                os.close(fd)
    # The path ended on a directory already walked through ("/", "..", a link to "/" or
    # "."): it is the object asked for, and must be trusted as one, sticky or not.
    end = dirs[-1]
    problem = untrusted(end.st)
    return ResolvedPath(path, end.path, end.st, f"{end.path} {problem}" if problem else None)
