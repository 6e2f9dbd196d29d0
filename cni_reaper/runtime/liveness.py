"""Whether anything of a container runtime is alive, from evidence no clock can move.

/run is a tmpfs made anew at every boot, so whatever a runtime made there, it made in this boot;
/proc lists what runs now; the mount table lists the network namespaces pinned now. Everything
here only reads, and takes its inputs (the node's root, a /proc, a mountinfo file) as
parameters. Where something that exists cannot be read, EvidenceUnreadable is raised: not
knowing whether something is alive must never read as "nothing is alive".
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
from collections.abc import Callable, Iterable, Iterator, Sequence

from cni_reaper.choice import Choice
from cni_reaper.node_root import (
    LeavesRoot,
    canonical,
    exists_inside,
    host_path,
    listed,
    open_inside,
)
from cni_reaper.record import Record
from cni_reaper.runtime.config import LocatedPath, PathKind, RuntimeConfigs
from cni_reaper.unopened import DIR_FLAGS

# What the processes that run containers or call CNI plugins are called: comm (at most 15
# characters), or the base name of their executable or of argv[0]. k3s re-executes itself as
# k3s-server or k3s-agent and starts containerd as a child; RKE2 runs rke2, containerd and
# kubelet. The shims (containerd-shim-runc-v2, comm "containerd-shim") and conmon keep
# containers running but are no runtime, and match none of these.
RUNTIME_PROCESS_NAMES = frozenset(
    {
        "containerd",
        "crio",
        "cri-dockerd",
        "dockerd",
        "k3s",
        "k3s-server",
        "k3s-agent",
        "rke2",
        "kubelet",
    }
)
# Beyond these the scan gives up rather than answer from part of the system.
MAX_PROCESSES = 1 << 17
MAX_MOUNTS = 1 << 20
MAX_STATE_ENTRIES = 1 << 16
_STAT_BYTES = 4096  # /proc/PID/stat is a few hundred bytes; comm is at most 64
_CMDLINE_BYTES = 4096  # enough for argv[0]
_DEAD_STATES = frozenset("ZXx")  # zombie, dead: a runtime that has exited
# stat's flags (field 9, the 7th after the name): a kernel thread, with no executable or
# argv to read (include/linux/sched.h); most of a booting node's processes are such.
_PF_KTHREAD = 0x00200000

# containerd's shim v2 and v1 task dirs: <state>/<dir>/<namespace>/<id>
TASK_DIRS = frozenset({"io.containerd.runtime.v2.task", "io.containerd.runtime.v1.linux"})
DEFAULT_NETNS_DIRS = ("/run/netns",)


class EvidenceUnreadable(Exception):
    """Something that would say whether a runtime is alive exists but could not be read."""


class RootCheck(str, Choice):
    SAME = "same-root"
    # /proc/PID/root could not be looked at (EACCES without CAP_SYS_PTRACE): counted as alive
    UNREADABLE = "root-unreadable"


class RuntimeProcess(Record):
    pid: int
    name: str  # the runtime name it matched
    exe: str  # /proc/PID/exe, "" when it cannot be read
    root: RootCheck

    def describe(self) -> str:
        exe = f", {self.exe}" if self.exe else ""
        return f"{self.name} is running (pid {self.pid}{exe}, {self.root.value})"


def answering_socket(paths: Iterable[str], timeout: float = 1.0) -> str | None:
    """The first runtime socket that accepts a connection; a stale socket file does not count."""
    for path in paths:
        try:
            if not stat.S_ISSOCK(os.lstat(path).st_mode):
                continue
        except OSError:
            continue
        import socket  # noqa: PLC0415 (at boot there is normally no socket to probe)

        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(timeout)
            try:
                probe.connect(path)
            except OSError:
                continue
            return path
    return None


def _read_head(path: str, limit: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, limit)
    finally:
        os.close(fd)


def stat_fields(line: bytes, count: int) -> tuple[bytes, list[bytes]] | None:
    """A /proc/PID/stat line's command name and at least count of the fields after it (the
    state, field 3, first); None for a line without the name in parentheses. The name may
    hold blanks and parentheses: it ends at the last ")"."""
    open_paren, close_paren = line.find(b"("), line.rfind(b")")
    if open_paren < 0 or close_paren < 0:
        return None
    return line[open_paren + 1 : close_paren], line[close_paren + 2 :].split(None, count)


def _process_names(proc: str, pid: str) -> tuple[list[str], str] | None:
    """The names a process goes by (comm, its executable's, argv[0]'s) and its executable;
    None for a zombie or a kernel thread."""
    parsed = stat_fields(_read_head(f"{proc}/{pid}/stat", _STAT_BYTES), 7)
    if parsed is None:
        return None
    comm, after_name = parsed
    if after_name and after_name[0][:1].decode("ascii", "replace") in _DEAD_STATES:
        return None
    if len(after_name) > 6 and after_name[6].isdigit() and int(after_name[6]) & _PF_KTHREAD:
        return None
    names = [os.fsdecode(comm)]
    try:
        # After a package upgrade the running binary reads "/usr/bin/containerd (deleted)".
        exe = os.readlink(f"{proc}/{pid}/exe").removesuffix(" (deleted)")
        names.append(posixpath.basename(exe))
    except (PermissionError, FileNotFoundError):
        exe = ""  # EACCES without CAP_SYS_PTRACE; ENOENT for kernel threads
    argv0 = _read_head(f"{proc}/{pid}/cmdline", _CMDLINE_BYTES).split(b"\0", 1)[0]
    names.append(posixpath.basename(os.fsdecode(argv0)))
    return names, exe


def runtime_processes(root: str, proc: str = "/proc") -> list[RuntimeProcess]:
    """Running container runtimes and CNI-calling daemons whose root directory is root.

    A process in another root (a rescue system's own containerd under --root /mnt/node) does
    not count; one whose root cannot be looked at does. Raises EvidenceUnreadable when proc
    cannot be listed, lists nothing, or lists more than MAX_PROCESSES."""
    root_st = os.stat(root)
    try:
        with os.scandir(proc) as listing:
            pids = [entry.name for entry in listing if entry.name.isdigit()]
    except OSError as e:
        raise EvidenceUnreadable(f"{proc}: {e.strerror or e}") from e
    if not pids:
        raise EvidenceUnreadable(f"{proc} lists no process: no proc file system mounted there")
    if len(pids) > MAX_PROCESSES:
        raise EvidenceUnreadable(f"{proc} lists more than {MAX_PROCESSES} processes")
    found = []
    for pid in pids:
        try:
            seen = _process_names(proc, pid)
        except (FileNotFoundError, ProcessLookupError):
            continue  # it exited meanwhile
        except OSError as e:
            raise EvidenceUnreadable(f"{proc}/{pid}: {e.strerror or e}") from e
        if seen is None:
            continue
        names, exe = seen
        name = next((n for n in names if n in RUNTIME_PROCESS_NAMES), None)
        if name is None:
            continue
        try:
            st = os.stat(f"{proc}/{pid}/root")
        except (FileNotFoundError, ProcessLookupError):
            continue
        except OSError:
            check = RootCheck.UNREADABLE
        else:
            if (st.st_dev, st.st_ino) != (root_st.st_dev, root_st.st_ino):
                continue
            check = RootCheck.SAME
        found.append(RuntimeProcess(int(pid), name, exe, check))
    return sorted(found)


def _any_name(_: str) -> bool:
    return True


def _storage_containers_dir(name: str) -> bool:
    return name.endswith("-containers")  # overlay-containers, vfs-containers, ...


# The directory levels between a live state dir and its container IDs, each a test of the
# entry's name; entries that fail it are not the runtime's container state.
_LAYOUTS: dict[PathKind, tuple[Callable[[str], bool], ...]] = {
    PathKind.TASK_STATE: (TASK_DIRS.__contains__, _any_name),
    PathKind.NAMESPACED_OCI_ROOT: (_any_name,),
    PathKind.OCI_ROOT: (),
    PathKind.STORAGE_RUNROOT: (_storage_containers_dir,),
}


def _ids_below(dir_fd: int, levels: Sequence[Callable[[str], bool]], where: str) -> Iterator[str]:
    try:
        entries = listed(dir_fd, MAX_STATE_ENTRIES)
    except OSError as e:
        raise EvidenceUnreadable(f"{where}: {e.strerror or e}") from e
    if not levels:
        # An ID is a directory; a symlink in its place is not followed, but still counts.
        yield from (e.name for e in entries if e.is_dir(follow_symlinks=False) or e.is_symlink())
        return
    for entry in entries:
        if not levels[0](entry.name):
            continue
        path = f"{where}/{entry.name}"
        if entry.is_symlink():
            raise EvidenceUnreadable(f"{path}: a symlink where a directory belongs; not followed")
        if not entry.is_dir(follow_symlinks=False):
            continue
        try:
            fd = os.open(entry.name, DIR_FLAGS, dir_fd=dir_fd)
        except OSError as e:
            raise EvidenceUnreadable(f"{path}: {e.strerror or e}") from e
        try:
            yield from _ids_below(fd, levels[1:], path)
        finally:
            os.close(fd)


def live_container_ids(root: str, configs: RuntimeConfigs) -> frozenset[str]:
    """IDs of the containers and sandboxes some runtime keeps live state for: containerd's task
    dirs, the OCI runtimes' state dirs, containers/storage's run root. Symlinks are never
    followed below a configured dir. Raises EvidenceUnreadable for a dir that exists but
    cannot be read."""
    ids: set[str] = set()
    for located in configs.live_state_dirs:
        levels = _LAYOUTS.get(located.kind)
        if levels is None:
            continue
        try:
            fd, _ = open_inside(root, located.node_path, directory=True)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except (OSError, LeavesRoot) as e:
            raise EvidenceUnreadable(f"{located.describe()}: {_reason(e)}") from e
        try:
            ids.update(_ids_below(fd, levels, located.path))
        finally:
            os.close(fd)
    return frozenset(ids)


_OCTAL_ESCAPE = re.compile(rb"\\([0-7]{3})")


def unescape_mount_field(field: bytes) -> bytes:
    """A mountinfo path field as it is: the kernel writes space, tab, newline and backslash
    as three-digit octal escapes (\\040, \\011, \\012, \\134)."""
    return _OCTAL_ESCAPE.sub(lambda m: bytes([int(m.group(1), 8) & 0xFF]), field)


def _pin_dirs(root: str, netns_dirs: Iterable[str]) -> dict[bytes, str]:
    """Each netns dir as mountinfo names it (resolved, from /), to the node dir it stands for."""
    real_root = os.path.realpath(root).rstrip("/")
    dirs: dict[bytes, str] = {}
    for named in netns_dirs:
        node_dir = canonical(named)
        # A tree whose /var/run is a directory rather than the usual symlink to /run.
        aliases = [node_dir, "/var" + node_dir] if node_dir.startswith("/run/") else [node_dir]
        for alias in aliases:
            try:
                fd, resolved = open_inside(root, alias, directory=True)
            except (FileNotFoundError, NotADirectoryError):
                continue  # nothing can be mounted in a dir that does not exist
            except (OSError, LeavesRoot) as e:
                raise EvidenceUnreadable(f"{host_path(root, alias)}: {_reason(e)}") from e
            os.close(fd)
            dirs[os.fsencode(real_root + resolved)] = canonical(resolved)
    return dirs


def netns_pins(
    root: str,
    mountinfo: str = "/proc/self/mountinfo",
    netns_dirs: Iterable[str] = DEFAULT_NETNS_DIRS,
) -> frozenset[str]:
    """The network namespaces pinned (nsfs mounts) in the node's netns dirs, as node paths
    with /var/run taken as /run ("/run/netns/cni-1234"). Raises EvidenceUnreadable when
    mountinfo cannot be read."""
    dirs = _pin_dirs(root, netns_dirs)
    pins: set[str] = set()
    try:
        with open(mountinfo, "rb") as table:
            for count, line in enumerate(table):
                if count == MAX_MOUNTS:
                    raise EvidenceUnreadable(f"{mountinfo}: more than {MAX_MOUNTS} mounts")
                fields = line.rstrip(b"\n").split(b" ")
                # id parent dev root mount-point options [optional...] - fstype source super
                try:
                    separator = fields.index(b"-", 6)
                except ValueError:
                    continue
                if fields[separator + 1 : separator + 2] != [b"nsfs"]:
                    continue
                parent, _, name = unescape_mount_field(fields[4]).rpartition(b"/")
                node_dir = dirs.get(parent)
                if node_dir is not None and name:
                    pins.add(f"{node_dir}/{os.fsdecode(name)}")
    except OSError as e:
        raise EvidenceUnreadable(f"{mountinfo}: {e.strerror or e}") from e
    return frozenset(pins)


def _reason(e: Exception) -> str:
    return e.strerror if isinstance(e, OSError) and e.strerror else str(e)


def _in_run(located: LocatedPath) -> bool:
    """Only /run is made anew at boot: elsewhere, existing says nothing about this boot."""
    return located.node_path == "/run" or located.node_path.startswith("/run/")


def started_this_boot(
    root: str,
    configs: RuntimeConfigs,
    proc: str = "/proc",
    mountinfo: str = "/proc/self/mountinfo",
    processes: list[RuntimeProcess] | None = None,
) -> list[str]:
    """Evidence that some runtime has started in this boot, one human-readable line each: a
    runtime socket, live state dir or start marker under /run that exists (existing is enough;
    activation sockets, which systemd makes before any runtime, do not count), a pinned netns,
    a runtime process (processes: a scan of them just made, not made again). Anything that
    could not be read is evidence too. An empty list means: as far as /run and /proc tell, no
    runtime has started since this boot began."""
    evidence = []
    for located in configs.sockets + configs.live_state_dirs + configs.start_markers:
        if not _in_run(located):
            continue
        try:
            if exists_inside(root, located.node_path):
                evidence.append(f"{located.describe()} exists")
        except (OSError, LeavesRoot) as e:
            evidence.append(f"{located.describe()} cannot be looked at: {_reason(e)}")
    try:
        netns_dirs = [d.node_path for d in configs.netns_dirs] or DEFAULT_NETNS_DIRS
        for pin in sorted(netns_pins(root, mountinfo, netns_dirs)):
            evidence.append(f"network namespace {host_path(root, pin)} is pinned")
    except EvidenceUnreadable as e:
        evidence.append(f"cannot tell which network namespaces are pinned: {e}")
    try:
        found = runtime_processes(root, proc) if processes is None else processes
        evidence.extend(p.describe() for p in found)
    except (EvidenceUnreadable, OSError) as e:
        evidence.append(f"cannot tell which runtimes are running: {_reason(e)}")
    return evidence
