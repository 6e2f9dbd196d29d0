"""Finding a CNI plugin in the plugin dirs and running it with bounded time and output."""

from __future__ import annotations

import json
import os
import select
import signal
import stat
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol

from cni_reaper.spawn import Child, inherited_fds
from cni_reaper.trust import untrusted

MAX_STDOUT = 1 << 20
MAX_STDERR = 64 << 10
# How long to keep reading after the plugin exited, for a child that still holds its pipes.
EXIT_GRACE = 0.5


class PluginRefused(Exception):
    """A plugin that must not be run: a bad name, not found, or outside the plugin dirs."""


class PluginRun(NamedTuple):
    exit_status: int  # as subprocess reports it: negative for a signal
    stdout: bytes
    stderr: bytes
    timed_out: bool
    output_truncated: bool


class PluginError(NamedTuple):
    plugin: str
    msg: str
    code: int | None = None
    details: str = ""
    exit_status: int | None = None
    timed_out: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "plugin": self.plugin,
            "code": self.code,
            "msg": self.msg,
            "details": self.details,
            "exit_status": self.exit_status,
            "timed_out": self.timed_out,
        }

    def __str__(self) -> str:
        text = f"plugin type={self.plugin!r} failed: {self.msg}"
        if self.details:
            text += f"; {self.details}"
        return text


class PluginRunner(Protocol):
    def run(self, path: str, env: Mapping[str, str], stdin: bytes, timeout: float) -> PluginRun: ...


def find_plugin(kind: str, bin_dirs: Sequence[str]) -> str:
    """The executable for a plugin type, as libcni's FindInPath, but never leaving the dirs.

    A symlink is accepted only when it resolves to a regular file inside one of the plugin
    dirs (distros link /opt/cni/bin to /usr/lib/cni); it is run by its resolved path.
    """
    if not kind or "/" in kind or "\0" in kind or kind in (".", ".."):
        raise PluginRefused(f"invalid plugin name: {kind!r}")
    if not bin_dirs:
        raise PluginRefused("no plugin dirs")
    for bin_dir in bin_dirs:
        candidate = os.path.join(bin_dir, kind)
        try:
            st = os.lstat(candidate)
        except OSError:
            continue
        if stat.S_ISLNK(st.st_mode):
            target = os.path.realpath(candidate)
            if os.path.dirname(target) not in {os.path.realpath(d) for d in bin_dirs}:
                raise PluginRefused(f"{candidate} links outside the plugin dirs, to {target}")
            try:
                st = os.lstat(target)
            except OSError:
                continue
            candidate = target
        if stat.S_ISREG(st.st_mode):
            _refuse_untrusted(candidate, st)
            return candidate
    raise PluginRefused(f"failed to find plugin {kind!r} in path {list(bin_dirs)}")


def _refuse_untrusted(path: str, st: os.stat_result) -> None:
    """A plugin anyone else could have replaced, or sitting in a dir anyone else could write
    to, is never run as root."""
    problem = untrusted(st)
    if problem:
        raise PluginRefused(f"{path} {problem}; not run")
    directory = os.path.dirname(path)
    problem = untrusted(os.stat(directory))
    if problem:
        raise PluginRefused(f"plugin dir {directory} {problem}; {path} not run")


class ProcessRunner:
    """Runs a plugin in a session and process group of its own; the whole group dies at the
    timeout. Made once per run: it notes the descriptors this process inherited, which no
    plugin gets."""

    def __init__(self) -> None:
        self._close_fds = inherited_fds()

    def run(self, path: str, env: Mapping[str, str], stdin: bytes, timeout: float) -> PluginRun:
        child = Child.spawn(path, dict(env), self._close_fds)
        try:
            return self._communicate(child, stdin, timeout)
        finally:
            child.kill_group()
            child.wait()
            child.close()

    def _communicate(self, child: Child, stdin: bytes, timeout: float) -> PluginRun:
        limits = {child.stdout_fd: MAX_STDOUT, child.stderr_fd: MAX_STDERR}
        buffers: dict[int, bytearray] = {fd: bytearray() for fd in limits}
        truncated = False
        pending = memoryview(stdin)
        deadline = time.monotonic() + timeout
        exited_at: float | None = None
        stdin_fd = child.stdin_fd
        # The plugin's exit wakes the loop through its pidfd: polling for it, as waiting with a
        # timeout does, cost up to a millisecond per plugin, more than a DEL takes the shell.
        exit_fd = child.exit_fd
        poller = select.poll()
        watched: set[int] = set()

        def watch(fd: int, events: int) -> None:
            poller.register(fd, events)
            watched.add(fd)

        def unwatch(fd: int) -> None:
            poller.unregister(fd)
            watched.discard(fd)

        if exit_fd is not None:
            watch(exit_fd, select.POLLIN)
        for fd in limits:
            # poll says when a read will not block: the pipes may stay blocking.
            watch(fd, select.POLLIN)
        if pending:
            os.set_blocking(stdin_fd, False)
            watch(stdin_fd, select.POLLOUT)
        else:
            child.close_stdin()
        while watched:
            now = time.monotonic()
            if exited_at is None and child.poll() is not None:
                exited_at = now
            limit = deadline if exited_at is None else min(deadline, exited_at + EXIT_GRACE)
            if now >= limit:
                break
            for fd, _ in poller.poll(min(limit - now, 0.1) * 1000):
                if fd == exit_fd:
                    unwatch(fd)  # the next round's poll() reaps it
                    continue
                if fd == stdin_fd:
                    try:
                        written = os.write(fd, pending[: 1 << 16])
                    except (BrokenPipeError, OSError):
                        written = len(pending)
                    pending = pending[written:]
                    if not pending:
                        unwatch(fd)
                        child.close_stdin()
                    continue
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    unwatch(fd)
                    continue
                room = limits[fd] - len(buffers[fd])
                if len(chunk) > room:
                    truncated = True
                buffers[fd] += chunk[: max(room, 0)]
        # Both pipes closed but the plugin has not exited: it still gets its full time.
        timed_out = child.wait_until(deadline) is None
        if timed_out:
            child.kill_group()
        status = child.wait()
        return PluginRun(
            exit_status=status,
            stdout=bytes(buffers[child.stdout_fd]),
            stderr=bytes(buffers[child.stderr_fd]),
            timed_out=timed_out,
            output_truncated=truncated,
        )


def error_from_run(kind: str, run: PluginRun, timeout: float) -> PluginError | None:
    """None when the plugin succeeded; else what it said, CNI error JSON first."""
    if run.timed_out:
        return PluginError(kind, f"killed after the {timeout:g} s timeout", timed_out=True)
    if run.exit_status == 0:
        return None
    if run.exit_status < 0:
        try:
            name = signal.Signals(-run.exit_status).name
        except ValueError:
            name = f"signal {-run.exit_status}"
        return PluginError(kind, f"killed by {name}", exit_status=run.exit_status)
    try:
        doc = json.loads(run.stdout)
    except (ValueError, RecursionError):
        doc = None
    if isinstance(doc, dict) and ("msg" in doc or "code" in doc):
        code = doc.get("code")
        return PluginError(
            kind,
            str(doc.get("msg", "")),
            code=code if isinstance(code, int) else None,
            details=str(doc.get("details", "")),
            exit_status=run.exit_status,
        )
    stderr = run.stderr.decode("utf-8", "replace").strip()
    msg = f"netplugin failed: {stderr!r}" if stderr else "netplugin failed with no error message"
    return PluginError(kind, msg, exit_status=run.exit_status)
