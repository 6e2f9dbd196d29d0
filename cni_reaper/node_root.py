"""The node's file system as seen from under --root, never left.

A "node path" is a path as the node itself names it ("/etc/containerd/config.toml"); under
--root /mnt/node it lives at /mnt/node/etc/containerd/config.toml. Symlinks met on the way are
resolved as the node would resolve them: an absolute target starts again at the root, so a
node's "/etc/x -> /usr/share/x" stays inside the node. A target that climbs above the root with
".." is refused rather than clamped, and the last component is opened with O_NOFOLLOW after it
has been looked at, so a symlink swapped in meanwhile fails the open instead of being followed.
"""

from __future__ import annotations

import errno
import os
import posixpath
import re
import stat
import sys
from collections import deque
from collections.abc import Callable, Iterable

from cni_reaper.unopened import DIR_FLAGS, READ_FLAGS, refuse_unless_regular_mode

# Where plugins look for the node's CNI state when their config does not say otherwise: under
# a root other than /, confine.py binds the root's own there.
PLUGIN_STATE_DIRS = (
    "/var/lib/cni",  # host-local's default dataDir (networks/), flannel's and multus's caches
    "/etc/cni",  # net.d: multus and other delegating plugins read it
    "/run/netns",  # named network namespaces
    "/run/cni",  # the dhcp plugin's daemon socket
)
# Where a dir that only a node's config names (host-local's dataDir) may be bound from a
# --root: a dir of CNI's own below the places of variable state (/var/lib/cni-ipam,
# /run/cni-ipam-state). Bound anywhere else, the node's files would stand for this machine's
# own in the namespace where the plugins and the reaper run as root: its /etc (ld.so.preload,
# which every dynamically linked plugin's loader reads), its libraries, a dir of the plugins'
# PATH (/usr/local/sbin is /var/usrlocal/sbin on an ostree system), the journal's socket
# (/run/systemd/journal), the user databases NSS reads (/var/lib/sss, /var/lib/misc).
STATE_PLACES = ("/var/lib", "/run")
CNI_PREFIX = "cni"


def bind_refusal(node_path: str) -> str | None:
    """Why the root's dir at node_path may not be bound over this machine's own dir of that
    name (confine.py), if it may not: it must lie below a dir of one of STATE_PLACES whose
    name begins with CNI_PREFIX, and neither hold nor lie in a dir this interpreter loads
    code from (code_dir_refusal), both as this machine resolves them."""
    resolved = os.path.realpath(node_path)
    for place in STATE_PLACES:
        below = _below(resolved, os.path.realpath(place))
        if below is not None and below.startswith(CNI_PREFIX):
            return code_dir_refusal(node_path)
    return (
        f"{node_path} is not in a dir of CNI's own below {' or '.join(STATE_PLACES)} "
        f"(named {CNI_PREFIX}...): bound there, the node's files would stand for this "
        "machine's own"
    )


def nesting_refusal(data_dir: str, data_dirs: Iterable[str]) -> str | None:
    """Why data_dir may not be bound because this machine's symlinks nest it otherwise than
    its name does: a plugin walks the machine's own path to a mount, then the root's dir
    below it, so a dataDir is the root's dir of its name only where it lies in a standard
    dir, or another dataDir, exactly when its resolved path does. /var/run/cni/x lies in the
    /run/cni mounted from the root, not in the root's /var/run/cni/x read for it; with the
    machine's /var/lib/cni -> /var/lib/cni-x, /var/lib/cni-x/a is the root's /var/lib/cni/a
    (confine.standard_binds leaves out a target nested so). Against another dataDir, only
    one a symlink of this machine's leads to is refused."""
    resolved = os.path.realpath(data_dir)
    for other in (*PLUGIN_STATE_DIRS, *data_dirs):
        if other == data_dir or (other not in PLUGIN_STATE_DIRS and resolved == data_dir):
            continue
        other_resolved = os.path.realpath(other)
        by_name = lies_in(data_dir, other) or lies_in(other, data_dir)
        if by_name != (lies_in(resolved, other_resolved) or lies_in(other_resolved, resolved)):
            return (
                f"{data_dir} and {other} nest otherwise on this machine ({resolved}, "
                f"{other_resolved}) than by name: the plugins would see another of the "
                "root's dirs there than the one read for it"
            )
    return None


def code_dir_refusal(node_path: str) -> str | None:
    """Why this machine's dir at node_path may not have another dir bound over it, if it may
    not: it holds or lies in a dir this interpreter finds modules in, or its own install, as
    this machine resolves them (a `python -m` run from /var/lib/cni imports from there)."""
    resolved = os.path.realpath(node_path)
    for code in _code_dirs():
        if code != "/" and (lies_in(code, resolved) or lies_in(resolved, code)):
            return f"{node_path} holds or lies in {code}, where this program loads its code from"
    return None


class RootBinds:
    """The node's dirs a run binds where the plugins look (repair/confine.py), decided once a
    run, before it: under a root other than /, the standard ones (PLUGIN_STATE_DIRS) and each
    host-local dataDir the conf dirs name that bind_refusal() lets be bound and whose own bind
    cannot_bind() finds nothing against (its mount point cannot be made: a file in its way).
    A dataDir refused keeps the network from running a DEL, not the run from running; the
    dry run and the real one decide it alike. Under / the plugins see the node as it is."""

    def __init__(
        self,
        root: str,
        data_dirs: Iterable[str] = (),
        cannot_bind: Callable[[str], str | None] = lambda _: None,
    ) -> None:
        self.root = root
        self.confined = root != "/"
        self.refused: dict[str, str] = {}  # dataDir -> why it is not bound
        bound: list[str] = []
        if self.confined:
            given = sorted(set(data_dirs), key=lambda d: (len(d), d))
            for data_dir in given:
                why = bind_refusal(data_dir) or nesting_refusal(data_dir, given)
                outer = (*PLUGIN_STATE_DIRS, *bound)
                if why is None and not any(lies_in(data_dir, d) for d in outer):
                    why = cannot_bind(data_dir)  # a bind of its own, not in an outer one
                if why is None:
                    bound.append(data_dir)
                else:
                    self.refused[data_dir] = why
        self.data_dirs = tuple(bound)  # the dataDirs bound, outer ones first

    def covers(self, node_path: str) -> bool:
        """A plugin run under the root sees the root's own node_path, symlinks aside: it lies
        in a dir bound there, or the root is /."""
        dirs = (*PLUGIN_STATE_DIRS, *self.data_dirs)
        return not self.confined or any(lies_in(node_path, d) for d in dirs)


def lies_in(path: str, directory: str) -> bool:
    """path is directory or lies below it; both absolute and normalized."""
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _below(path: str, dir_path: str) -> str | None:
    """path relative to dir_path, if path lies strictly below it."""
    prefix = dir_path.rstrip("/") + "/"
    return path[len(prefix) :] if path.startswith(prefix) else None


def _code_dirs() -> set[str]:
    """The dirs this interpreter finds modules in, and its own install."""
    found = {*sys.path, sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix}
    found.add(os.path.dirname(sys.executable))
    return {os.path.realpath(d) for d in found if d}


# What Linux allows in one path walk (MAXSYMLINKS); beyond it a loop is assumed.
MAX_SYMLINKS = 40
# A directory listed to expand a glob; config dirs hold a handful of files.
MAX_LISTED = 4096


class LeavesRoot(Exception):
    """A symlink whose target climbs above the root."""


class BadPattern(ValueError):
    """A glob pattern Go's filepath.Match would reject (ErrBadPattern)."""


def canonical(path: str) -> str:
    """A path named by a config, as a clean absolute node path. /var/run is taken as /run: on
    every systemd distribution it is a symlink to /run, and following a node's absolute
    /var/run -> /run from a rescue system would land in the rescue system's /run."""
    path = posixpath.normpath("/" + path)
    if path.startswith("//"):
        path = "/" + path.lstrip("/")  # normpath keeps a leading "//" (POSIX leaves it open)
    if path == "/var/run" or path.startswith("/var/run/"):
        path = "/run" + path[len("/var/run") :]
    return path


def host_path(root: str, node_path: str) -> str:
    """Where node_path is from here, without resolving anything."""
    return os.path.join(root, node_path.lstrip("/")) if node_path.strip("/") else root


def _components(path: str) -> list[str]:
    return [part for part in path.split("/") if part not in ("", ".")]


def open_inside(root: str, node_path: str, *, directory: bool = False) -> tuple[int, str]:
    """Open node_path of the node at root; return the fd and the node path it resolved to.

    Raises OSError (FileNotFoundError, ELOOP, EINVAL for a NUL in the path, ...) and
    LeavesRoot. A file is opened read-only and non-blocking (a FIFO does not hang the caller),
    a directory with O_DIRECTORY."""
    _no_nul(node_path)
    walked = [os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)]
    names: list[str] = []
    pending = deque(_components(node_path))
    hops = 0
    try:
        while pending:
            name = pending.popleft()
            if name == "..":
                if len(walked) == 1:
                    raise LeavesRoot(f"{host_path(root, node_path)} leads out of {root}")
                os.close(walked.pop())
                names.pop()
                continue
            st = os.stat(name, dir_fd=walked[-1], follow_symlinks=False)
            if stat.S_ISLNK(st.st_mode):
                hops += 1
                if hops > MAX_SYMLINKS:
                    raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), host_path(root, node_path))
                target = os.readlink(name, dir_fd=walked[-1])
                if target.startswith("/"):
                    while len(walked) > 1:
                        os.close(walked.pop())
                    names.clear()
                pending.extendleft(reversed(_components(target)))
                continue
            if pending:
                walked.append(os.open(name, DIR_FLAGS, dir_fd=walked[-1]))
                names.append(name)
                continue
            if not directory:
                refuse_unless_regular_mode(st.st_mode, host_path(root, node_path))
            fd = os.open(name, DIR_FLAGS if directory else READ_FLAGS, dir_fd=walked[-1])
            return fd, "/" + "/".join([*names, name])
        if not directory:
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), root)
        return os.dup(walked[-1]), "/" + "/".join(names)
    finally:
        for fd in walked:
            os.close(fd)


def _no_nul(node_path: str) -> None:
    """A path from a config may hold a NUL (TOML's \\u0000): no file has it in its name, and
    the os functions raise ValueError for it, which is no OSError."""
    if "\0" in node_path:
        raise OSError(errno.EINVAL, "a NUL in the path", node_path.replace("\0", "\\0"))


def resolve_inside(root: str, node_path: str) -> str:
    """Where node_path is, from here, as the node resolves it: each symlink met on the way is
    followed, an absolute target starting again at the root. Components that do not exist
    (yet) are taken as they are. Raises LeavesRoot for a ".." above the root, OSError (ELOOP)
    for a loop, EINVAL for a NUL in the path)."""
    _no_nul(node_path)
    names: list[str] = []
    pending = deque(_components(node_path))
    hops = 0
    while pending:
        name = pending.popleft()
        if name == "..":
            if not names:
                raise LeavesRoot(f"{host_path(root, node_path)} leads out of {root}")
            names.pop()
            continue
        here = os.path.join(root, *names, name)
        try:
            st = os.lstat(here)
        except (FileNotFoundError, NotADirectoryError):
            return os.path.join(root, *names, name, *pending)
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > MAX_SYMLINKS:
                raise OSError(errno.ELOOP, os.strerror(errno.ELOOP), host_path(root, node_path))
            target = os.readlink(here)
            if target.startswith("/"):
                names.clear()
            pending.extendleft(reversed(_components(target)))
            continue
        names.append(name)
    return os.path.join(root, *names)


def exists_inside(root: str, node_path: str) -> bool:
    """Whether node_path exists on the node, as lstat sees it: a last component that is a
    symlink, a socket or anything else exists; it is never followed. Raises what open_inside
    raises for the parent, except FileNotFoundError and NotADirectoryError."""
    parent, name = posixpath.split(canonical(node_path))
    try:
        fd, _ = open_inside(root, parent, directory=True)
    except (FileNotFoundError, NotADirectoryError):
        return False
    try:
        os.stat(name or ".", dir_fd=fd, follow_symlinks=False)
    except (FileNotFoundError, NotADirectoryError):
        return False
    finally:
        os.close(fd)
    return True


def listed(dir_fd: int, limit: int = MAX_LISTED) -> list[os.DirEntry[str]]:
    """The entries of an open directory, at most limit of them (OSError E2BIG beyond)."""
    entries: list[os.DirEntry[str]] = []
    with os.scandir(dir_fd) as listing:
        for entry in listing:
            if len(entries) == limit:
                raise OSError(errno.E2BIG, f"more than {limit} entries")
            entries.append(entry)
    return entries


# Go's filepath.Match: "*" any run of non-separators, "?" one non-separator, "[...]" a class
# ("^" negates, "a-z" ranges), "\\" escapes the next character.
_GO_META = re.compile(r"[*?\[\\]")


def go_has_meta(part: str) -> bool:
    return _GO_META.search(part) is not None


def _class_char(part: str, i: int) -> tuple[str, int]:
    """One character of a class at part[i] (an escape taken whole); Go rejects a bare ']' or
    '-' where a character is expected."""
    if i >= len(part) or part[i] in "-]":
        raise BadPattern(part)
    if part[i] == "\\":
        i += 1
        if i >= len(part):
            raise BadPattern(part)
    return part[i], i + 1


def go_pattern(part: str) -> re.Pattern[str]:
    """A regular expression for one path element of a Go filepath.Match pattern."""
    regex = []
    i = 0
    while i < len(part):
        c = part[i]
        if c == "*":
            regex.append("[^/]*")
            i += 1
        elif c == "?":
            regex.append("[^/]")
            i += 1
        elif c == "\\":
            if i + 1 >= len(part):
                raise BadPattern(part)
            regex.append(re.escape(part[i + 1]))
            i += 2
        elif c == "[":
            i += 1
            negated = i < len(part) and part[i] == "^"
            if negated:
                i += 1
            ranges: list[str] = []
            while True:
                if i < len(part) and part[i] == "]" and ranges:
                    i += 1
                    break
                low, i = _class_char(part, i)
                high = low
                if i < len(part) and part[i] == "-":
                    high, i = _class_char(part, i + 1)
                # Go tests lo <= c <= hi: an inverted range matches nothing, it is no error.
                ranges.append(f"[{re.escape(low)}-{re.escape(high)}]" if low <= high else "(?!)")
            alternatives = "|".join(ranges)
            regex.append(f"(?!{alternatives})[^/]" if negated else f"(?:{alternatives})")
        else:
            regex.append(re.escape(c))
            i += 1
    return re.compile("".join(regex))


def glob_inside(root: str, pattern: str) -> list[str]:
    """The node paths matching an absolute Go-style glob pattern, as filepath.Glob orders them:
    each directory's matches in byte order. As in Go, unreadable directories are skipped and a
    pattern component without metacharacters after the first one with them must exist."""
    parts = _components(pattern)
    # As in Go, a bad pattern fails before anything is listed.
    regexes = [go_pattern(part) if go_has_meta(part) else None for part in parts]
    matched = [""]
    globbing = False
    for part, regex in zip(parts, regexes):
        globbing = globbing or regex is not None
        if not globbing:
            matched = [f"{prefix}/{part}" for prefix in matched]
            continue
        found = []
        for prefix in matched:
            try:
                fd, _ = open_inside(root, prefix or "/", directory=True)
            except (OSError, LeavesRoot):
                continue
            try:
                names = [entry.name for entry in listed(fd)]
            except OSError:
                continue
            finally:
                os.close(fd)
            for name in sorted(names, key=os.fsencode):
                if name == part if regex is None else regex.fullmatch(name):
                    found.append(f"{prefix}/{name}")
        matched = found
    return matched
