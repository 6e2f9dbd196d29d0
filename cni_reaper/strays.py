"""The processes plugins leave running outside their process groups: adopted, stopped, killed.

A plugin's process group dies with it (spawn.Child.kill_group), but a process it started may
have left the group (setsid, setpgid) and its parent: orphaned, it would go on running after
the run, next to the runtime, with nothing to end it (the unit remains active once the reaper
exits, so systemd kills nothing). So while plugins run, this process is its descendants'
subreaper, and once none runs, what they left is ended: each child of this process that it did
not have when the first plugin started and that is in a session not its own (each plugin
starts a session; its processes stay in it or start their own), every process below those,
and every process of their process groups, stopped first, then killed, then reaped.

The reaper, as its unit and its command run it, starts no process but plugins. A program that
runs it in its own process must not start a child in a session of its own while a DEL runs, nor
have a child leave one then: that child is taken for a plugin's.

Kernel facts this rests on:
- prctl(2) PR_SET_CHILD_SUBREAPER: a process orphaned below this one is reparented to it, not
  to init; no privilege needed (systemd's @system-service filter allows prctl). A process's
  children are reparented when it exits, not when it is reaped.
- A stopped process (SIGSTOP) runs no code: it forks no more. SIGKILL ends a process, stopped or
  not; one in uninterruptible sleep dies once its call returns.
- proc(5): /proc/PID/stat's state (field 3), ppid (4), process group (5), session (6) and start
  time (22: with the pid, a process for good); /proc/PID/task/TID/children, each thread's
  children (CONFIG_PROC_CHILDREN), which may leave one out while others exit (a zombie stays
  on it until reaped); every process's stat says its parent.
- pidfd_open(2) (Linux 5.3): a descriptor of one process, through which a signal never reaches
  another that took its pid since (pidfd_send_signal(2)).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable

from cni_reaper.record import Record
from cni_reaper.runtime.liveness import stat_fields

PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
# How long the strays are given to be stopped and to die: one stuck in the kernel is named as
# still there, not waited for.
GRACE = 1.0  # seconds
NAMED = 20  # strays named in the warning; the others counted


class _Process(Record):
    name: str
    state: str
    parent: int
    group: int
    session: int
    start: int  # clock ticks after boot


class Strays:
    """Counts the plugins starting or running; the first makes this process a subreaper and
    notes its children, the last to end has the strays ended (end())."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy = 0
        self._before: frozenset[tuple[int, int]] = frozenset()  # (pid, start)
        self._adopting = False

    def begin(self) -> str | None:
        """A plugin is about to be started. Why what it leaves cannot be ended, if so."""
        with self._lock:
            refused = None
            if self._busy == 0:
                refused = _subreaper(True)
                self._adopting = refused is None
                if self._adopting:
                    self._before = frozenset((pid, p.start) for pid, p in _children().items())
            self._busy += 1
            return refused

    def end(self) -> str | None:
        """A plugin begun has ended and been reaped, or never started. When it was the last
        and strays were ended: what to warn of."""
        with self._lock:
            self._busy -= 1
            if self._busy or not self._adopting:
                return None
            try:
                return _said(*_end_all(self._before))
            finally:
                _subreaper(False)
                self._adopting = False


STRAYS = Strays()


def _end_all(before: frozenset[tuple[int, int]]) -> tuple[dict[int, _Process], list[str]]:
    """Every stray, all below it and all in its process groups stopped, then killed, then
    reaped: those that were running, and those still there at the end of GRACE."""
    me, own_session, own_group = os.getpid(), os.getsid(0), os.getpgid(0)
    deadline = time.monotonic() + GRACE

    def strays(children: dict[int, _Process]) -> dict[int, _Process]:
        return {
            pid: p
            for pid, p in children.items()
            if p.session != own_session and (pid, p.start) not in before
        }

    # The kernel's list of children is cheap but may miss one while others exit; a stray that
    # ever exited stays on it, unreaped, so it shows whenever there are strays at all. Then
    # every process is looked at.
    if not strays(_children()):
        return {}, []
    found = strays(_children(listed=False))
    running = {pid: p for pid, p in found.items() if _running(pid, p)}
    groups: set[int] = set()
    moving = found
    # A process with a SIGSTOP pending makes no more: its fork starts over once the signal is
    # taken. So once a look, made after every process found was sent one, finds no new one,
    # all there will be are found.
    while True:
        for pid, p in moving.items():
            if p.group not in groups and p.group not in (own_group, 0, 1):
                groups.add(p.group)  # a zombie's too: its group may live on
                with contextlib.suppress(OSError):
                    os.killpg(p.group, signal.SIGSTOP)
            _send(pid, p.start, signal.SIGSTOP)
        table = _table(_all_pids())
        more = _below(table, found)
        more.update((pid, p) for pid, p in table.items() if p.group in groups)
        moving = {pid: p for pid, p in more.items() if pid not in found}
        found.update(moving)
        running.update((pid, p) for pid, p in moving.items() if _running(pid, p))
        if not moving or time.monotonic() >= deadline:
            break
    for group in groups:
        with contextlib.suppress(OSError):
            os.killpg(group, signal.SIGKILL)
    for pid, p in found.items():
        _send(pid, p.start, signal.SIGKILL)
    while True:  # each reaped once it is this process's child (its parent died before it)
        table = _table(_all_pids())
        left = {
            pid: now
            for pid, now in table.items()
            if pid in found
            and now.start == found[pid].start
            and (now.state not in "ZX" or now.parent == me)
        }
        for pid, now in left.items():
            if now.parent == me:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
        if not left or time.monotonic() >= deadline:
            break
        time.sleep(0.002)
    left = {pid: now for pid, now in left.items() if now.state not in "ZX"}
    stuck = [f"{pid} ({p.name}, still there after SIGKILL)" for pid, p in sorted(left.items())]
    return {pid: p for pid, p in running.items() if pid not in left}, stuck


def _running(pid: int, p: _Process) -> bool:
    """Whether it had not exited: a zombie whose main thread alone has exited runs on in its
    other threads."""
    if p.state not in "ZX":
        return True
    try:
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


def _said(ended: dict[int, _Process], stuck: list[str]) -> str | None:
    if not ended and not stuck:
        return None
    named = [f"{pid} ({p.name})" for pid, p in sorted(ended.items())] + stuck
    more = f" and {len(named) - NAMED} more" if len(named) > NAMED else ""
    return (
        f"killed {len(ended) + len(stuck)} process(es) plugins left running outside their "
        f"process groups, after the last plugin ended: {', '.join(named[:NAMED])}{more}"
    )


def _below(table: dict[int, _Process], tops: dict[int, _Process]) -> dict[int, _Process]:
    """tops that are still there (the same processes), and every process below them."""
    kids: dict[int, list[int]] = {}
    for pid, p in table.items():
        kids.setdefault(p.parent, []).append(pid)
    found: dict[int, _Process] = {}
    pending = [pid for pid, p in tops.items() if pid in table and table[pid].start == p.start]
    while pending:
        pid = pending.pop()
        if pid not in found:
            found[pid] = table[pid]
            pending.extend(kids.get(pid, ()))
    return found


def _send(pid: int, start: int, signum: int) -> None:
    """signum to the process pid names if it is still the one that started at start."""
    pidfd_open = getattr(os, "pidfd_open", None)
    fd = None
    try:
        if pidfd_open is not None:
            fd = pidfd_open(pid)
        now = _table([pid]).get(pid)
        if now is None or now.start != start:
            return
        if fd is not None:
            signal.pidfd_send_signal(fd, signum)
        else:
            os.kill(pid, signum)
    except OSError:
        pass  # gone
    finally:
        if fd is not None:
            os.close(fd)


def _subreaper(on: bool) -> str | None:
    """Make this process its descendants' subreaper (on), or no longer; why not, if refused."""
    prctl, errno_now = _prctl()
    if prctl(PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) == 0:
        return None
    return f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(errno_now())}"


@functools.cache
def _prctl() -> tuple[Callable[..., int], Callable[[], int]]:
    import ctypes  # noqa: PLC0415 (only runs that start a plugin)

    prctl: Callable[..., int] = ctypes.CDLL(None, use_errno=True).prctl
    return prctl, ctypes.get_errno


def _children(listed: bool = True) -> dict[int, _Process]:
    """This process's children: from the kernel's list of each thread's (where there is one,
    and listed), else from every process's stat."""
    pids: list[int] = []
    if listed and os.path.exists(f"/proc/self/task/{threading.get_native_id()}/children"):
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/children", "rb") as f:
                    pids.extend(int(pid) for pid in f.read().split())
            except FileNotFoundError:
                continue  # a thread that ended: its children went to another one
    else:
        pids = _all_pids()
    me = os.getpid()
    return {pid: p for pid, p in _table(pids).items() if p.parent == me}


def _all_pids() -> list[int]:
    try:
        with os.scandir("/proc") as listing:
            return [int(entry.name) for entry in listing if entry.name.isdigit()]
    except OSError:
        return []


def _table(pids: Iterable[int]) -> dict[int, _Process]:
    """What /proc/PID/stat says of each pid still there."""
    found: dict[int, _Process] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat", "rb") as f:
                line = f.read(2048)
        except OSError:
            continue
        parsed = stat_fields(line, 20)
        if parsed is None or len(parsed[1]) < 20:
            continue
        name, fields = parsed  # fields from the state on: field 3 is fields[0]
        state = fields[0].decode("ascii", "replace")
        parent, group, session, start = (int(fields[i]) for i in (1, 2, 3, 19))
        found[pid] = _Process(name.decode("utf-8", "replace"), state, parent, group, session, start)
    return found
