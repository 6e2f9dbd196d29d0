"""Starting a plugin process by posix_spawn, with pipes for its stdin, stdout and stderr.

Not subprocess: on Python 3.9 (Amazon Linux 2023, RHEL 9) Popen forks this whole process, its
threads' memory included, for every plugin when asked for a new session or a working directory;
posix_spawn never copies it. The hygiene Popen gave is kept: a new session (so the plugin's whole
process group can be killed), default SIGPIPE and SIGXFSZ and an empty signal mask, and no
descriptor of this process but the three pipes. The plugin starts in this process's working
directory: the CLI runs repairs from /, as a runtime under systemd runs its plugins.

A plugin's process group dies with it (Child.kill_group), but a process it started may have
left the group (setsid, setpgid) and its parent: orphaned, it would go on running after this
run, next to the runtime, with nothing to end it (the unit remains active after it exits, so
systemd kills nothing). While plugins run, this process is its descendants' subreaper
(prctl(2) PR_SET_CHILD_SUBREAPER): such an orphan becomes its child rather than init's, and once
no plugin runs, every child it did not spawn and did not have before is killed (Strays).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import os
import select
import signal
import threading
import time
from collections.abc import Callable

# Popen(restore_signals=True) puts these back to their defaults; Python ignores both.
DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)
PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
# How long strays killed are waited for: their children become this process's, to be killed
# in turn, only once they are gone.
STRAY_GRACE = 1.0  # seconds


def inherited_fds() -> tuple[int, ...]:
    """Descriptors above stdio a spawned program would inherit. Python opens its own with
    close-on-exec, so these came from whoever started this process: each plugin closes them,
    as Popen(close_fds=True) did."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return ()
    found = []
    for name in names:
        fd = int(name)
        if fd > 2:
            try:
                if os.get_inheritable(fd):
                    found.append(fd)
            except OSError:
                pass  # the listing's own descriptor, closed by now
    return tuple(sorted(found))


class Child:
    """A spawned program: its pid, this side's ends of its pipes, its exit status once reaped."""

    def __init__(self, pid: int, stdin_fd: int, stdout_fd: int, stderr_fd: int) -> None:
        self.pid = pid
        self.stdin_fd = stdin_fd
        self.stdout_fd = stdout_fd
        self.stderr_fd = stderr_fd
        self.returncode: int | None = None  # as subprocess has it: negative for a signal
        # Readable once the program exits, so that its exit wakes a poll(); None where the
        # kernel (before 5.3) or Python has no pidfd, and callers poll with a timeout.
        self.exit_fd = _pidfd(pid)

    @classmethod
    def spawn(cls, path: str, env: dict[str, str], close_fds: tuple[int, ...]) -> Child:
        """path, run in a session of its own, its stdio our pipes, close_fds closed."""
        stdin_r, stdin_w = _pipe()
        stdout_r, stdout_w = _pipe()
        stderr_r, stderr_w = _pipe()
        theirs = (stdin_r, stdout_w, stderr_w)
        ours = (stdin_w, stdout_r, stderr_r)
        # dup2 first: a descriptor to close may since have been reused for one of the pipes.
        actions: list[tuple[int, ...]] = [
            (os.POSIX_SPAWN_DUP2, fd, number) for number, fd in enumerate(theirs)
        ]
        actions += [(os.POSIX_SPAWN_CLOSE, fd) for fd in close_fds]
        try:
            pid = os.posix_spawn(
                path,
                [path],
                env,
                file_actions=actions,
                setsid=True,
                setsigmask=(),
                setsigdef=DEFAULT_SIGNALS,
            )
        except BaseException:
            for fd in ours:
                os.close(fd)
            raise
        finally:
            for fd in theirs:
                os.close(fd)
        return cls(pid, *ours)

    def poll(self) -> int | None:
        """The exit status if it has exited (and is now reaped), else None."""
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait_until(self, deadline: float) -> int | None:
        """Wait for the exit until deadline (time.monotonic()); None if still running."""
        exits = select.poll()
        if self.exit_fd is not None:
            exits.register(self.exit_fd, select.POLLIN)
        while self.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            step = left if self.exit_fd is not None else min(left, 0.005)
            exits.poll(step * 1000)  # with no pidfd to watch, just a sleep
        return self.returncode

    def kill_group(self) -> None:
        """SIGKILL to its whole process group: the program and whatever it started there."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError as e:
            if e.errno not in (errno.ESRCH, errno.EPERM):
                raise

    def close_stdin(self) -> None:
        if self.stdin_fd >= 0:
            os.close(self.stdin_fd)
            self.stdin_fd = -1

    def close(self) -> None:
        """Close this side's descriptors: the pipes and the pidfd (the exit status stays)."""
        self.close_stdin()
        for fd in (self.stdout_fd, self.stderr_fd, self.exit_fd):
            if fd is not None and fd >= 0:
                os.close(fd)
        self.stdout_fd = self.stderr_fd = -1
        self.exit_fd = None


class Strays:
    """The processes plugins left running outside their process groups, adopted and killed.

    The plugins starting or running are counted. The first makes this process a subreaper
    and notes the children it has already (a program embedding the reaper may have some);
    once none is left, every other child in a session not this process's (each plugin starts
    a session, and its processes stay in it or start their own) is killed, with its own
    children as they come, and the subreaper is given up."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy = 0  # plugins starting or running
        self._before: frozenset[int] = frozenset()
        self._adopting = False

    def begin(self) -> None:
        """A plugin is about to be started."""
        with self._lock:
            if self._busy == 0:
                self._adopting = _subreaper(True)
                self._before = frozenset(_children()) if self._adopting else frozenset()
            self._busy += 1

    def end(self) -> list[str]:
        """A plugin begun has ended and been reaped, or never started. When it was the last:
        the strays killed ("PID (NAME)"), else none."""
        with self._lock:
            self._busy -= 1
            if self._busy or not self._adopting:
                return []
            try:
                return self._kill_all()
            finally:
                _subreaper(False)
                self._adopting = False

    def _kill_all(self) -> list[str]:
        """SIGKILL to every stray, and to their children as they become this process's, each
        reaped; until none is left, or for STRAY_GRACE (one stuck in the kernel cannot die
        before its call returns: it is named as such, not waited for)."""
        killed: dict[int, str] = {}
        own_session = os.getsid(0)
        deadline = time.monotonic() + STRAY_GRACE
        while True:
            strays = {
                pid: (name, state)
                for pid, (name, state, session) in _children().items()
                if pid not in self._before and session != own_session
            }
            for pid, (name, state) in strays.items():
                if pid not in killed:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                    # One that had exited already is only reaped.
                    killed[pid] = "" if state == "Z" else f"{pid} ({name})"
                with contextlib.suppress(ChildProcessError):
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        continue  # gone; its children are this process's now
                if time.monotonic() >= deadline:
                    killed[pid] = f"{pid} ({name}, still there after SIGKILL)"
                    strays = {}
                    break
            if not strays:
                return [said for said in killed.values() if said]
            time.sleep(0.005)


STRAYS = Strays()


def _subreaper(on: bool) -> bool:
    """Whether this process is now (on) or no longer its descendants' subreaper."""
    return bool(_prctl()(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0)


@functools.cache
def _prctl() -> Callable[..., int]:
    import ctypes  # noqa: PLC0415 (only runs that start a plugin)

    prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    return prctl


def _children() -> dict[int, tuple[str, str, int]]:
    """This process's children: pid to (name, state, session id). Each thread's are listed in
    /proc/self/task/TID/children (where the kernel has them: CONFIG_PROC_CHILDREN); else every
    process's stat is read for its parent."""
    pids: set[int] = set()
    me = os.getpid()
    if os.path.exists(f"/proc/self/task/{threading.get_native_id()}/children"):
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/children", "rb") as f:
                    pids.update(int(pid) for pid in f.read().split())
            except FileNotFoundError:
                continue  # a thread that ended: its children went to another one
    else:
        with contextlib.suppress(OSError), os.scandir("/proc") as listing:
            pids.update(int(entry.name) for entry in listing if entry.name.isdigit())
    found: dict[int, tuple[str, str, int]] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                line = f.read(1024)
        except OSError:
            continue
        close_paren = line.rfind(b")")
        # state, ppid, pgrp, session: the fields after the name (proc(5): 3 to 6)
        fields = line[close_paren + 2 :].split()
        if len(fields) >= 4 and int(fields[1]) == me:
            name = line[line.find(b"(") + 1 : close_paren].decode("utf-8", "replace")
            found[pid] = (name, fields[0].decode("ascii", "replace"), int(fields[3]))
    return found


def _pidfd(pid: int) -> int | None:
    pidfd_open = getattr(os, "pidfd_open", None)
    if pidfd_open is None:
        return None
    try:
        fd: int = pidfd_open(pid)
    except OSError:
        return None
    return fd


def _pipe() -> tuple[int, int]:
    """A close-on-exec pipe whose ends are not 0, 1 or 2: dup2 onto a program's stdio would
    otherwise move one of them onto another (a process started with stdio closed)."""
    read, write = os.pipe()
    return _above_stdio(read), _above_stdio(write)


def _above_stdio(fd: int) -> int:
    if fd > 2:
        return fd
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return moved
