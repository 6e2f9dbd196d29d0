"""Starting a plugin process by posix_spawn, with pipes for its stdin, stdout and stderr.

Not subprocess: on Python 3.9 (Amazon Linux 2023, RHEL 9) Popen forks this whole process, its
threads' memory included, for every plugin when asked for a new session or a working directory;
posix_spawn never copies it. The hygiene Popen gave is kept: a new session (so the plugin's whole
process group can be killed), default SIGPIPE and SIGXFSZ and an empty signal mask, and no
descriptor of this process but the three pipes. The plugin starts in this process's working
directory: the CLI runs repairs from /, as a runtime under systemd runs its plugins. What a
plugin leaves running outside its group is strays.py's.
"""

from __future__ import annotations

import errno
import fcntl
import os
import select
import signal
import time

# Popen(restore_signals=True) puts these back to their defaults; Python ignores both.
DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)


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
