"""Plugins run on the --root's CNI state: a private mount namespace for the threads that DEL.

A plugin looks where it always looks, whatever root the reaper was given: host-local keeps its
store in /var/lib/cni/networks unless its config names a dataDir, multus reads /etc/cni/net.d,
the dhcp plugin talks to its daemon under /run/cni. Run from a rescue machine on a node's disk
mounted at R, a DEL would release addresses in the rescue machine's own store. So with a root
other than /, the DELs run in a mount namespace of their own in which R's directories are
mounted over those paths. Only that namespace sees them; the caller's thread never enters it.

Kernel facts this rests on:
- unshare(2): CLONE_NEWNS moves only the calling thread into a new mount namespace, and implies
  CLONE_FS, so that thread also gets a root, working directory and umask of its own. Unlike
  CLONE_NEWUSER it does not require a single-threaded process. It needs CAP_SYS_ADMIN (EPERM).
- clone(2): a thread or process created without CLONE_NEWNS shares its creator's mount
  namespace, and a thread (CLONE_FS) its creator's working directory; fork, vfork and
  posix_spawn all create the child from the calling thread. So the threads `work` starts, and
  the plugins they spawn, are in the namespace.
- mount_namespaces(7): a new namespace starts as a copy of its creator's mounts, and a mount
  that was shared stays a peer of the original: mounts made under it would propagate back to
  the host. Hence / is made private, recursively, before anything is mounted.
- A mount namespace is freed, with its mounts, when its last task exits and nothing else holds
  it (an open /proc/<tid>/ns/mnt, a bind mount of one).
- mount(2) resolves the source of MS_BIND like any path, so /proc/self/fd/N names the very
  directory descriptor N was opened on: a symlink swapped into the path after the check is never
  followed. The source must be a mount of the caller's namespace (EINVAL otherwise), so the
  descriptors are opened after unshare.
- rmdir(2) of a directory that is a mount point in another namespace, but not in the caller's,
  succeeds and detaches that mount there (Linux 3.18 on). A mount point this run made on the
  host is such a directory for every other run that mounted on it: two runs on two roots at
  once must not remove one the other still stands on, or the other's plugins would find the
  host's directory there. Each run holds a shared flock(2) on every mount point it stands on,
  and removes one only under an exclusive lock it got without (much) waiting.
- The run that made a mount point may be done while another still stands on it, and must then
  leave it. So a run that is done marks each mount point it made, while it still stands on
  them, with an extended attribute in the trusted namespace (only CAP_SYS_ADMIN sets one, as
  only a run that can confine makes a mount point) naming this boot: left to the others. A
  run removes the mount points it made, and those of its targets, with their parents, that
  were left to the others while it stood there: the last of the runs that stood there then
  removes them, whoever made them. A mark a run found when it came is not its to act on:
  whoever stood there when it was made may have been killed since, and with that run's end
  nothing says that no one else (a service, in a namespace of its own) mounted there since.
  A run killed before it was done marks nothing. What no run may remove stays, empty, as does
  a mount point whose mark could not be kept (a file system without trusted attributes, no
  room for one): only its maker removes that.
- A flock keeps runs apart, not other mount namespaces: a service's (systemd's BindPaths=, an
  `unshare -m` tool), a container's, may mount on a mount point while a run stands on it. So
  before its rmdirs a run reads the mountinfo of one task of every mount namespace on the
  machine (/proc/PID/task/TID: a run's namespace is its confined thread's), and leaves what
  any of them has a mount on. A mount made after that look, a moment before the rmdir, is not
  seen: the one window left.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence

from cni_reaper.errors import RefusedError
from cni_reaper.node_root import PLUGIN_STATE_DIRS, bind_refusal, code_dir_refusal, lies_in
from cni_reaper.record import Record
from cni_reaper.unopened import DIR_FLAGS

TYPE_CHECKING = False
if TYPE_CHECKING:
    import ctypes
    from typing import TypeVar

    T = TypeVar("T")

ADVICE = "run with --root / on the node itself, or as root on a writable rescue system"

# <linux/sched.h>, <linux/mount.h>
CLONE_NEWNS = 0x00020000
MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000

EMPTY_FS_NAME = "cni-reaper-empty"  # the device name its tmpfs mounts show in mountinfo
MISSING = "is missing"  # a bind's source not in the root
CONFINED_THREAD_NAME = "cni-reaper-confined"
START_GRACE = 1.0  # seconds a started thread takes to run, at the very most
# A mount point another run is removing (it holds it exclusively for an rmdir) is held, or
# made again, within this many seconds.
MOUNT_POINT_WAIT = 5.0
# The extended attribute of a mount point a run made on the host and, done, left to the runs
# standing on it then: this boot's id.
LEFT_MARK = "trusted.cni-reaper.left"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"  # the host's own: mount points are the host's
PROC = "/proc"  # the machine's own, whatever the root: every mount namespace is listed there
# How long a run that is done waits for another run's exclusive lock on a mount point, which
# that run holds only while it removes it; one that stands on it holds it shared, for longer.
REMOVAL_WAIT = 0.2


class Bind(Record):
    target: str  # absolute path where plugins look
    source: str  # the directory inside the root that must appear there


class MadeDir(Record):
    """A directory a run made on the host, as it made it: only that very one is its own."""

    path: str
    dev: int
    ino: int


class ConfineError(RefusedError):
    """The plugins cannot be run on the root's state: the run must not go on."""


def needs_confinement(root: str) -> bool:
    """A root that is / (or resolves to it) is the host's own state: plugins run as they are."""
    return os.path.realpath(root) != "/"


def standard_binds(
    root: str, extra_targets: Iterable[str] = (), kept_paths: Iterable[str] = ()
) -> tuple[Bind, ...]:
    """The binds that put root's CNI state where plugins look: the standard targets plus
    extra_targets (absolute dataDirs a network config names, each one node_root.bind_refusal()
    lets be bound: ConfineError for any other), each from root + target.

    A target lying under another (on the host, symlinks resolved) is left out: the outer bind
    already shows the root's own directory there. Raises ConfineError for a layout the binds
    would break (see check_layout); kept_paths are the paths the reaper itself goes on using
    while confined (results, state and quarantine dirs, plugin dirs).
    """
    real_root = os.path.realpath(root)
    if real_root == "/":
        raise ValueError("root / is the host itself: there is nothing to confine to")
    extra = tuple(extra_targets)  # read twice: an iterator would pass the refusal below empty
    wanted: list[tuple[str, str]] = []  # (resolved on the host, as given)
    for given in (*PLUGIN_STATE_DIRS, *extra):
        if not os.path.isabs(given):
            raise ValueError(f"bind target {given!r} is not an absolute path")
        target = os.path.normpath(given)
        wanted.append((os.path.realpath(target), target))
    kept: list[tuple[str, str]] = []
    for resolved, target in sorted(wanted, key=lambda pair: (len(pair[0]), pair[0])):
        if not any(lies_in(resolved, outer) for outer, _ in kept):
            kept.append((resolved, target))
    binds = tuple(Bind(target, os.path.join(real_root, target.lstrip("/"))) for _, target in kept)
    check_layout(root, binds, kept_paths)
    for given in extra:
        # node_root.RootBinds leaves these out: a caller that did not.
        why = bind_refusal(given)
        if why is not None:
            raise ConfineError(f"cannot confine plugins to {root}: {why}")
    for bind in binds:
        why = code_dir_refusal(bind.target)
        if why is not None:
            raise ConfineError(
                f"cannot confine plugins to {root}: {why}; run it from another dir, or as "
                "the installed command"
            )
    return binds


def check_layout(root: str, binds: Sequence[Bind], kept_paths: Iterable[str] = ()) -> None:
    """ConfineError if a bind would hide what it must not (layout_problem)."""
    kept = tuple(kept_paths)
    for bind in binds:
        why = layout_problem(root, bind, kept)
        if why is not None:
            raise ConfineError(f"cannot confine plugins to {root}: {why}")


def layout_problem(root: str, bind: Bind, kept_paths: Iterable[str] = ()) -> str | None:
    """What bind would hide that it must not, if anything: the root or part of it (its target
    lies in the root), the root's own path (--root /var/lib/cni/x: the source would be looked
    up through the bind itself), or a path the reaper keeps using."""
    real_root = os.path.realpath(root)
    target = os.path.realpath(bind.target)
    if lies_in(target, real_root):
        return (
            f"{bind.target} lies in the root itself, and mounting over it would hide the "
            f"root's own files; {ADVICE}"
        )
    if lies_in(real_root, target):
        return (
            f"the root lies under {bind.target}, where the root's own {bind.source} must be "
            f"mounted; mount the node's disk somewhere outside {bind.target}"
        )
    for path in kept_paths:
        if lies_in(os.path.realpath(path), target):
            return (
                f"{path}, which the reaper itself uses, lies under {bind.target}, where the "
                f"root's {bind.source} must be mounted; name a path outside {bind.target}"
            )
    return None


def bind_problem(root: str, target: str, kept_paths: Iterable[str] = ()) -> str | None:
    """Why a bind of root's dir at target, a dataDir's, over this machine's dir of that name
    would refuse the whole run, as far as can be told before it is tried: its layout
    (layout_problem), or a mount point that cannot be made or held, this machine's file in
    its way (mount_point_problem). Told so, a run leaves that network's DELs alone instead."""
    bind = Bind(target, os.path.join(os.path.realpath(root), target.lstrip("/")))
    return layout_problem(root, bind, kept_paths) or mount_point_problem(target)


def mount_point_problem(target: str) -> str | None:
    """Why _hold_mount_point() could not hold a directory at target on this machine, as far as
    its state now tells: a file, or a symbolic link to nothing, where it or a parent must be
    a directory, or missing dirs that cannot be made in the one found (read-only, immutable)."""
    path = target
    while not os.path.lexists(path):
        path = os.path.dirname(path)
    if _dangling(path):
        return f"the mount point {target} cannot be made: {path} is a symbolic link to nothing"
    if not os.path.isdir(path):
        return f"the mount point {target} cannot be made: {path} is no directory"
    if path != target and not os.access(path, os.W_OK):
        return f"the mount point {target} cannot be made: {path} cannot be written"
    longest = max(len(os.fsencode(name)) for name in target.split("/"))
    try:
        name_max, path_max = os.pathconf(path, "PC_NAME_MAX"), os.pathconf(path, "PC_PATH_MAX")
    except (OSError, ValueError):
        name_max, path_max = 255, 4096  # Linux's NAME_MAX and PATH_MAX
    if longest > name_max or len(os.fsencode(target)) >= path_max:
        return f"the mount point {target} cannot be made: its name is longer than {path} takes"
    return None


def run_confined(
    root: str,
    binds: Sequence[Bind],
    work: Callable[[], T],
    *,
    cancel: threading.Event | None = None,
    on_note: Callable[[str], None] | None = None,
) -> T:
    """work() run in a thread of its own, in a private mount namespace with binds mounted;
    its return value, or its exception raised again here. The calling thread never enters
    the namespace; threads that work() starts, and processes they spawn, are in it.

    A source that is not a directory, or reached through a symlink (which could point back
    into the host), is replaced by an empty read-only tmpfs on its target; one that is missing
    by an empty writable one, as the node would make it; on_note is called with a sentence
    saying so, from the confined thread, before work() starts.
    Mount points missing on the host are made, and removed again by the last run that stands
    on them, once its thread is done.

    On KeyboardInterrupt while waiting, cancel is set (work should watch it and stop early),
    the thread is still waited for, and then the interrupt is raised again: nothing work
    started outlives the call. ConfineError if the namespace cannot be made; work() then
    never runs. Call it from the main thread: only there does Python raise KeyboardInterrupt.
    """
    real_root = os.path.realpath(root)
    for bind in binds:
        for path in bind:
            if not os.path.isabs(path) or os.path.normpath(path) != path:
                raise ValueError(f"bind path {path!r} is not absolute and normalized")
        if not lies_in(bind.source, real_root):
            raise ValueError(f"bind source {bind.source!r} is not under the root {real_root!r}")
    check_layout(root, binds)
    note = on_note or _ignore
    made: list[MadeDir] = []  # mount points made on the host, outermost first
    held: list[int] = []  # a descriptor of each mount point stood on, shared-locked
    found_left: set[str] = set()  # on the way to a target, left to the others before it came
    returned: list[T] = []
    raised: list[BaseException] = []
    entered = threading.Event()  # the thread runs
    finished = threading.Event()  # work() is over, and with it every use of the namespace
    namespace: list[tuple[int, int]] = []  # the namespace's device and inode, once made

    def confined() -> None:
        entered.set()
        try:
            _enter_namespace(root, binds, made, held, found_left, namespace, note)
            returned.append(work())
        except BaseException as e:  # handed to the caller, who raises it again
            raised.append(e)
        finally:
            finished.set()

    # Not a daemon: should the caller be interrupted inside start(), before it could wait,
    # the interpreter still waits for this thread at exit rather than cutting work() short.
    thread = threading.Thread(target=confined, name=CONFINED_THREAD_NAME)
    try:
        thread.start()
        finished.wait()
        thread.join()
    except KeyboardInterrupt:
        if cancel is not None:
            cancel.set()
        _wait_through_interrupts(thread, entered, finished)
        raise
    finally:
        if finished.is_set():
            # Only then: rmdir of a mount point that another namespace still uses would
            # detach that mount there (Linux 3.18 on).
            _wait_gone(namespace)
            _let_go(made, held, [bind.target for bind in binds], found_left, namespace)
    if raised:
        raise raised[0]
    return returned[0]


def _wait_through_interrupts(
    thread: threading.Thread, entered: threading.Event, finished: threading.Event
) -> None:
    """Wait for the thread to finish, whatever further interrupts come: it is what stops
    work() and its plugins cleanly. Waiting is on an event, not Thread.join(): an interrupted
    join (CPython 3.9 to 3.12) can take a thread that still runs for stopped. A thread that
    has not run START_GRACE seconds after an interrupted start() was never started."""
    while True:
        try:
            if entered.wait(START_GRACE):
                finished.wait()
                thread.join()
            return
        except KeyboardInterrupt:
            continue


def _enter_namespace(
    root: str,
    binds: Sequence[Bind],
    made: list[MadeDir],
    held: list[int],
    found_left: set[str],
    namespace: list[tuple[int, int]],
    note: Callable[[str], None],
) -> None:
    import ctypes  # noqa: PLC0415 (only runs that confine load it)

    libc = ctypes.CDLL(None, use_errno=True)
    libc.unshare.argtypes = [ctypes.c_int]
    libc.mount.argtypes = [
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_ulong,
        ctypes.c_char_p,
    ]
    if libc.unshare(CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise ConfineError(
            f"cannot confine plugins to {root}: cannot make a private mount namespace "
            f"(unshare: {os.strerror(err)}; it needs root with CAP_SYS_ADMIN); {ADVICE}"
        )
    made_ns = _namespace_of(f"{PROC}/thread-self")
    if made_ns is not None:
        namespace.append(made_ns)
    _mount(libc, root, None, "/", None, MS_REC | MS_PRIVATE)
    for bind in binds:
        target_fd = _hold_mount_point(root, bind.target, made)
        held.append(target_fd)
        found_left.update(_left_on_the_way(bind.target, _boot_id()))
        # Mounted on the very directory held: not on whatever the path names by then.
        target = f"/proc/self/fd/{target_fd}"
        source_fd, problem = _open_source(bind.source)
        if source_fd is None:
            flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
            if problem.startswith(MISSING):
                # As the node has it: a plugin makes what it needs there (a store with nothing
                # to release), and what it writes goes with the namespace.
                seen = f"an empty {bind.target}, whose writes are dropped"
            else:
                # The node's own is elsewhere, where no plugin may write in its place: its DEL
                # fails, and says so, where it would have released something there.
                flags |= MS_RDONLY
                seen = f"an empty, read-only {bind.target}"
            _mount(libc, root, EMPTY_FS_NAME, target, "tmpfs", flags, "mode=0755", bind.target)
            note(f"{bind.source} {problem}: plugins see {seen}")
            continue
        try:
            source = f"/proc/self/fd/{source_fd}"
            _mount(libc, root, source, target, None, MS_BIND | MS_REC, None, bind.target)
        finally:
            os.close(source_fd)
    # Plugins start in this thread's working directory (spawn.py), now its own: if that was a
    # target, it would still be the host's directory under the mount.
    os.chdir("/")


def _mount(
    libc: ctypes.CDLL,
    root: str,
    source: str | None,
    target: str,
    fstype: str | None,
    flags: int,
    data: str | None = None,
    target_name: str | None = None,  # target's path, where target is a descriptor's
) -> None:
    import ctypes  # noqa: PLC0415

    def c(text: str | None) -> bytes | None:
        return None if text is None else os.fsencode(text)

    if libc.mount(c(source), c(target), c(fstype), flags, c(data)) != 0:
        err = ctypes.get_errno()
        named = target_name or target
        what = f"mount {source} on {named}" if source else f"make {named} a private mount"
        raise ConfineError(
            f"cannot confine plugins to {root}: cannot {what}: {os.strerror(err)}; {ADVICE}"
        )


def _hold_mount_point(root: str, target: str, made: list[MadeDir]) -> int:
    """A descriptor of the directory target, shared-locked (flock) for as long as this run
    stands on it; target, and its missing parents, made where missing (listed in made).
    Another run removing it holds it exclusively for a moment: it is then made again."""
    import fcntl  # noqa: PLC0415 (only runs that confine load it)

    deadline = time.monotonic() + MOUNT_POINT_WAIT
    while True:
        locked = False  # the last try found it held exclusively, not gone
        _make_missing(root, target, made)
        try:
            fd = os.open(target, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            if _dangling(target):
                raise ConfineError(
                    f"cannot confine plugins to {root}: the mount point {target} is a "
                    f"symbolic link to a missing directory; {ADVICE}"
                ) from None
            fd = -1  # removed since it was made or found: make it again
        except OSError as e:
            raise ConfineError(
                f"cannot confine plugins to {root}: cannot open the mount point {target}: "
                f"{e.strerror}; {ADVICE}"
            ) from None
        if fd >= 0:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                locked = True  # another run is removing it
            except OSError as e:
                os.close(fd)
                raise ConfineError(
                    f"cannot confine plugins to {root}: cannot lock the mount point "
                    f"{target}: {e.strerror}; {ADVICE}"
                ) from None
            else:
                # The host's own symlinks on the way are followed, as a mount on the path is.
                if _same_file(os.fstat(fd), target, follow_symlinks=True):
                    return fd
            os.close(fd)
        if time.monotonic() > deadline:
            why = (
                f"another process held it exclusively (flock) for {MOUNT_POINT_WAIT:g} s"
                if locked
                else "it kept being removed while this run made it"
            )
            raise ConfineError(
                f"cannot confine plugins to {root}: cannot hold the mount point {target}: "
                f"{why}; {ADVICE}"
            )
        time.sleep(0.01)


def _make_missing(root: str, target: str, made: list[MadeDir]) -> None:
    missing: list[str] = []
    path = target
    while not os.path.lexists(path):
        missing.append(path)
        path = os.path.dirname(path)
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o755)
        except FileNotFoundError:
            parent = os.path.dirname(path)
            if _dangling(parent):
                raise ConfineError(
                    f"cannot confine plugins to {root}: cannot make the mount point {path}: "
                    f"{parent} is a symbolic link to a missing directory; {ADVICE}"
                ) from None
            return  # another run removed a parent: the caller looks again
        except FileExistsError:
            return  # another run made it: the caller looks again
        except OSError as e:
            raise ConfineError(
                f"cannot confine plugins to {root}: cannot make the mount point {path}: "
                f"{e.strerror}; {ADVICE}"
            ) from None
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            return  # another run removed it already: the caller looks again
        made.append(MadeDir(path, st.st_dev, st.st_ino))


def _dangling(path: str) -> bool:
    """A symbolic link to nothing: no run can make a mount point through it, so none waits."""
    return os.path.islink(path) and not os.path.exists(path)


def _same_file(st: os.stat_result, path: str, follow_symlinks: bool = False) -> bool:
    """Whether path still names the file st is of (it was not removed, nor replaced)."""
    try:
        now = os.stat(path, follow_symlinks=follow_symlinks)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)


def _open_source(source: str) -> tuple[int | None, str]:
    """An O_PATH descriptor of the directory source, reached from / one component at a time
    without following any symlink; else None and what is wrong with it."""
    flags = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    reached = "/"
    try:
        for name in source.strip("/").split("/"):
            reached = os.path.join(reached, name)
            try:
                next_fd = os.open(name, flags, dir_fd=fd)
            except FileNotFoundError:
                return None, MISSING if reached == source else f"{MISSING} ({reached})"
            except OSError as e:
                return None, f"cannot be opened ({reached}: {e.strerror})"
            os.close(fd)
            fd = next_fd
            mode = os.fstat(fd).st_mode
            if stat.S_ISLNK(mode):
                where = "" if reached == source else f" ({reached})"
                return None, f"is reached through a symbolic link{where}"
            if not stat.S_ISDIR(mode):
                where = "" if reached == source else f" ({reached})"
                return None, f"is not a directory{where}"
        opened, fd = fd, -1
        return opened, ""
    finally:
        if fd >= 0:
            os.close(fd)


def _wait_gone(namespace: list[tuple[int, int]]) -> None:
    """Until no thread of this process is in the namespace (the confined one, the DEL workers
    it started): join() returns once a thread's Python is done, a moment before the kernel lets
    go of it, and until then its mounts are still to be seen in /proc (_mounted_elsewhere)."""
    deadline = time.monotonic() + START_GRACE
    while namespace and time.monotonic() < deadline:
        try:
            tids = os.listdir(f"{PROC}/self/task")
        except OSError:
            return
        if not any(_namespace_of(f"{PROC}/self/task/{tid}") in namespace for tid in tids):
            return
        time.sleep(0.001)


def _namespace_of(task: str) -> tuple[int, int] | None:
    try:
        st = os.stat(f"{task}/ns/mnt")
    except OSError:
        return None
    return st.st_dev, st.st_ino


def _let_go(
    made: list[MadeDir],
    held: list[int],
    targets: list[str],
    found_left: set[str],
    namespace: list[tuple[int, int]],
) -> None:
    """Leave what this run made to the runs still standing on it (marked while this run still
    stands there too: a run done after it sees the mark), stop standing on its mount points,
    and remove what no run stands on any more. Each step may be done again: an interrupt (a
    second Ctrl-C) is held until all are done, since cut short, a mark could outlive them."""
    interrupted: KeyboardInterrupt | None = None
    marked: set[str] | None = None
    while True:
        try:
            if marked is None:
                marked = _leave_to_others(made)
            while held:
                os.close(held.pop())
            _remove_mount_points(made, targets, marked, found_left, namespace)
            break
        except KeyboardInterrupt as e:
            interrupted = e
    if interrupted is not None:
        raise interrupted


def _remove_mount_points(
    made: list[MadeDir],
    targets: Iterable[str],
    marked: set[str],
    found_left: set[str],
    own: Iterable[tuple[int, int]] = (),
) -> None:
    """The mount points this run made, and those of its targets, with their parents, left to
    the others while this run stood there (not in found_left), innermost first. One something
    else has since put a file in stays, and so does one another run still stands on (it holds
    it shared): empty, it shows a plugin nothing, and removing it would detach that run's
    mount; the last run to stand on it removes it. marked: what this run left to the others;
    own: this run's namespace, whose work is over (a thread of it that has not quite gone by
    then uses none of its mounts)."""
    boot = _boot_id()
    mine = {made_dir.path: (made_dir.dev, made_dir.ino) for made_dir in made}
    found = set(mine)
    for target in targets:
        path = target
        while path not in found_left and _left_in(path, boot):
            found.add(path)
            parent = os.path.dirname(path)
            if parent == path:
                break
            path = parent
    # Not one another mount namespace has a mount on: a service's (BindPaths=, `unshare -m`),
    # a container's, another run's. The flock keeps runs apart; this sees the rest, as far as
    # the moment of the look (a mount made after it is not seen).
    found -= _mounted_elsewhere(found, own)
    # Each is tried: one that stays (another run stands on it, or something was put in it)
    # keeps its parents too, whose rmdir then fails (ENOTEMPTY) on the host's file system.
    removed = [
        path
        for path in sorted(found, key=lambda path: (path.count("/"), path), reverse=True)
        if _remove_one(path, mine.get(path), path in marked, boot)
    ]
    # A run done at the same moment may have left a parent of these to the others only now,
    # after this run looked, and failed to remove it while this run's dir was still in it.
    later: set[str] = set()
    looked_at = found | found_left
    for path in removed:
        parent = os.path.dirname(path)
        while (
            parent not in looked_at and parent != os.path.dirname(parent) and _left_in(parent, boot)
        ):
            later.add(parent)
            parent = os.path.dirname(parent)
    later -= _mounted_elsewhere(later, own)
    for path in sorted(later, key=lambda path: (path.count("/"), path), reverse=True):
        _remove_one(path, None, False, boot)


def _mounted_elsewhere(paths: set[str], own: Iterable[tuple[int, int]] = ()) -> set[str]:
    """Those of paths that a mount namespace of this machine, other than own, has a mount
    on, by the mountinfo of one task in each (a run's namespace is its confined thread's, not
    its process's). Tasks that end while they are read are passed by."""
    from cni_reaper.runtime.liveness import unescape_mount_field  # noqa: PLC0415

    if not paths:
        return set()
    wanted = {os.fsencode(path) for path in paths}
    found: set[str] = set()
    namespaces: set[tuple[int, int]] = set(own)
    try:
        pids = [name for name in os.listdir(PROC) if name.isdigit()]
    except OSError:
        return set(paths)  # nothing seen is not nothing there: keep them all
    for pid in pids:
        try:
            tids = os.listdir(f"{PROC}/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            task = f"{PROC}/{pid}/task/{tid}"
            ns = _namespace_of(task)
            if ns is None or ns in namespaces:
                continue
            try:
                with open(f"{task}/mountinfo", "rb") as table:
                    points = [line.split(b" ", 5)[4:5] for line in table]
            except OSError:
                continue
            namespaces.add(ns)
            for point in points:
                if point and unescape_mount_field(point[0]) in wanted:
                    found.add(os.fsdecode(unescape_mount_field(point[0])))
    return found


def _remove_one(path: str, made: tuple[int, int] | None, marked: bool, boot: bytes | None) -> bool:
    """rmdir of path, if no run stands on it and it is the directory this run made (made:
    its device and inode; marked: this run left it to the others, and it must still say so,
    as a new directory with a reused inode number would not) or one left to the others. The
    name is removed from its parent, held open, as the directory checked: never what the
    path names by then (a host symlink on the way swapped). Whether it was removed."""
    import fcntl  # noqa: PLC0415

    parent_path, name = os.path.split(path)
    if not name:
        return False
    try:
        parent = os.open(parent_path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=parent)
    except OSError:
        os.close(parent)
        return False
    try:
        deadline = time.monotonic() + REMOVAL_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:  # another run stands on it, or is removing it
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.005)
        st = os.fstat(fd)
        if made is not None and made != (st.st_dev, st.st_ino):
            return False  # not the directory this run made: whoever put it there keeps it
        if (made is None or marked) and not _left_in(fd, boot):
            return False
        now = os.stat(name, dir_fd=parent, follow_symlinks=False)
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            return False  # renamed or replaced since it was opened
        os.rmdir(name, dir_fd=parent)
    except OSError:
        return False
    finally:
        os.close(fd)
        os.close(parent)
    return True


def _leave_to_others(made: list[MadeDir]) -> set[str]:
    """Mark the mount points this run made as left to the runs standing on them now (see
    the module's docstring): the paths so marked. One whose mark cannot be kept (no trusted
    attributes, no room) is only this run's to remove."""
    boot = _boot_id()
    marked: set[str] = set()
    if boot is None:
        return marked
    for made_dir in made:
        with contextlib.suppress(OSError):
            fd = os.open(made_dir.path, DIR_FLAGS)
            try:
                st = os.fstat(fd)
                if (st.st_dev, st.st_ino) == (made_dir.dev, made_dir.ino):
                    os.setxattr(fd, LEFT_MARK, boot)
                    marked.add(made_dir.path)
            finally:
                os.close(fd)
    return marked


def _left_on_the_way(target: str, boot: bytes | None) -> Iterator[str]:
    """target and each of its parents that was left to the others already."""
    path = target
    while True:
        if _left_in(path, boot):
            yield path
        parent = os.path.dirname(path)
        if parent == path:
            return
        path = parent


def _left_in(path: str | int, boot: bytes | None) -> bool:
    """Whether the directory path (or descriptor) was left to the others in boot."""
    if boot is None:
        return False
    try:
        if isinstance(path, int):
            return os.getxattr(path, LEFT_MARK) == boot
        return os.getxattr(path, LEFT_MARK, follow_symlinks=False) == boot
    except OSError:
        return False


def _boot_id() -> bytes | None:
    try:
        with open(BOOT_ID_PATH, "rb") as f:
            found = f.read(64).strip()
    except OSError:
        return None
    return found or None


def _ignore(_note: str) -> None:
    pass
