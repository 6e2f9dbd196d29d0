"""Finding a CNI plugin in the plugin dirs and running it with bounded time and output."""

from __future__ import annotations

import json
import os
import select
import stat
import time
from collections.abc import Callable, Mapping, Sequence

from cni_reaper.content import json_kind
from cni_reaper.netconf import NetworkList, go_field, go_object
from cni_reaper.record import Record
from cni_reaper.trust import resolve_trusted, trusted_uids, untrusted

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Protocol

    from cni_reaper.spawn import Child

MAX_STDOUT = 1 << 20
MAX_STDERR = 64 << 10
# How long to keep reading after the plugin exited, for a child that still holds its pipes.
EXIT_GRACE = 0.5


class PluginRefused(Exception):
    """A plugin that must not be run: a bad name, not found, or outside the plugin dirs."""


class PluginNotFound(PluginRefused):
    """No plugin of that name in the plugin dirs (or no dirs at all)."""


class PluginRun(Record):
    exit_status: int  # as subprocess reports it: negative for a signal
    stdout: bytes
    stderr: bytes
    timed_out: bool
    output_truncated: bool


class PluginStarted(OSError):
    """The plugin was started, then lost track of: it ran, whatever it did."""


class PluginError(Record):
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

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> PluginError:
        """An error as to_json() wrote it in a report's document."""
        return cls(
            str(doc["plugin"]),
            str(doc["msg"]),
            doc["code"],
            str(doc["details"]),
            doc["exit_status"],
            bool(doc["timed_out"]),
        )

    def reason(self) -> str:
        return f"{self.msg}; {self.details}" if self.details else self.msg

    def __str__(self) -> str:
        # The CNI error code says what kind of failure it is (11: try again later); with no
        # error JSON, the exit status is all there is.
        if self.code is not None:
            how = f" (CNI error {self.code})"
        elif self.exit_status is not None and self.exit_status > 0:
            how = f" (exit {self.exit_status})"
        else:
            how = ""
        return f"plugin type={self.plugin!r} failed{how}: {self.reason()}"


def error_texts(errors: Sequence[PluginError], ran: bool) -> list[str]:
    """Each error of a DEL as the text report and the journal say it: of a DEL no plugin of
    which ran (not ran), that it did not run, not that a plugin failed."""
    if ran:
        return [str(error) for error in errors]
    return [f"DEL not run: {error.reason()}" for error in errors]


def doc_error_texts(done: Mapping[str, Any]) -> list[str]:
    """error_texts() of a DEL as a report's document has it ("plugins_run", "plugin_errors")."""
    errors = [PluginError.from_json(e) for e in done.get("plugin_errors", ())]
    return error_texts(errors, bool(done.get("plugins_run")))


if TYPE_CHECKING:

    class PluginRunner(Protocol):
        def run(
            self, path: str, env: Mapping[str, str], stdin: bytes, timeout: float
        ) -> PluginRun: ...


class PluginDirs(Record):
    """The plugin dirs, vetted once per run: those plugins are looked up in and that make up
    CNI_PATH, in the order given, and those left out, with why."""

    trusted: tuple[str, ...]
    missing: tuple[str, ...] = ()  # not there: nothing to run from them, left out quietly
    refused: tuple[tuple[str, str], ...] = ()  # (dir, why it was left out)

    @property
    def cni_path(self) -> str:
        return ":".join(self.trusted)

    @property
    def problems(self) -> tuple[str, ...]:
        return tuple(f"plugin dir {d} left out of CNI_PATH: {why}" for d, why in self.refused)

    def to_json(self) -> dict[str, Any]:
        return {
            "cni_path": list(self.trusted),
            "missing": list(self.missing),
            "refused": [{"dir": d, "why": why} for d, why in self.refused],
        }


def vet_plugin_dirs(dirs: Sequence[str]) -> PluginDirs:
    """Which plugin dirs may be searched and handed to plugins in CNI_PATH.

    Plugins exec other plugins from CNI_PATH (bridge its IPAM plugin, chained ones theirs), so
    every dir in it must hold only what root could have put there: its path trusted
    (trust.resolve_trusted), every regular file in it that could be exec'd trusted, every
    symlink in it leading through trusted dirs only. A dir that fails is left out whole: the
    plugins that exec from it choose by name, not by what the reaper checked. Depends only on
    the dirs and what is on disk, so it is done once per run and the result handed on.
    """
    trusted: list[str] = []
    missing: list[str] = []
    refused: list[tuple[str, str]] = []
    seen: set[str] = set()
    for plugin_dir in dirs:
        if plugin_dir in seen:
            continue  # the first place in the order is the one that counts
        seen.add(plugin_dir)
        if ":" in plugin_dir or not plugin_dir:
            # CNI_PATH is split at ':' (filepath.SplitList): it would name other dirs.
            refused.append((plugin_dir, "its name cannot be put in CNI_PATH"))
            continue
        found = resolve_trusted(plugin_dir)
        if found.problem:
            refused.append((plugin_dir, found.problem))
        elif found.st is None:
            missing.append(plugin_dir)
        elif not stat.S_ISDIR(found.st.st_mode):
            refused.append((plugin_dir, f"{found.resolved} is not a directory"))
        else:
            problem = _untrusted_entry(found.resolved)
            if problem:
                refused.append((plugin_dir, problem))
            else:
                trusted.append(plugin_dir)
    return PluginDirs(tuple(trusted), tuple(missing), tuple(refused))


def _untrusted_entry(plugin_dir: str) -> str | None:
    """Why something in a trusted plugin dir could run what root did not put there."""
    try:
        entries = sorted(os.scandir(plugin_dir), key=lambda e: os.fsencode(e.name))
    except OSError as e:
        return f"{plugin_dir}: {e.strerror or e}"
    for entry in entries:
        path = os.path.join(plugin_dir, entry.name)
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError as e:
            return f"{path}: {e.strerror or e}"
        if stat.S_ISLNK(st.st_mode):
            # A dangling link is fine only where nobody else can create its target: the walk
            # refuses one that ends in a sticky shared dir such as /tmp.
            problem = resolve_trusted(path).problem
            if problem:
                return f"{path} is a symlink, and {problem}"
        elif stat.S_ISREG(st.st_mode) and _could_be_executed(st):
            problem = untrusted(st)
            if problem:
                return f"{path} {problem}"
        # Dirs, fifos, sockets and devices cannot be exec'd, and a plugin name has no '/'.
    return None


def _could_be_executed(st: os.stat_result) -> bool:
    """A file with an exec bit, or whose owner could give it one."""
    return bool(st.st_mode & 0o111) or st.st_uid not in trusted_uids()


def find_plugin(kind: str, bin_dirs: Sequence[str]) -> str:
    """The executable for a plugin type, as libcni's FindInPath, but never leaving the dirs.

    The first dir holding the name wins, as in FindInPath; the name is then walked as the
    kernel resolves it (trust.resolve_trusted), and refused if anything on the way, or the
    file, is not trusted. A symlink is accepted only when it resolves to a regular file inside
    one of the plugin dirs (distros link /opt/cni/bin to /usr/lib/cni); it is run by its
    resolved path, never through a link the kernel would resolve from / (under --root, the
    wrong machine's). Except one link to a file of its own dir: that is how a multi-call binary
    is laid out (k3s's `cni`, every plugin a link to it, which acts as the plugin its argv[0]
    names), and it is run by the link's path, as libcni runs it: the kernel's resolution of a
    bare name stays in the dir, which only root can write.
    """
    if not kind or "/" in kind or "\0" in kind or kind in (".", ".."):
        raise PluginRefused(f"invalid plugin name: {kind!r}")
    if not bin_dirs:
        raise PluginNotFound("no plugin dirs")
    resolved_dirs: set[str] | None = None
    for bin_dir in bin_dirs:
        candidate = os.path.join(bin_dir, kind)
        found = resolve_trusted(candidate)
        if found.problem:
            raise PluginRefused(f"{found.problem}; {candidate} not run")
        if found.st is None:
            continue
        if resolved_dirs is None:
            resolved_dirs = {resolve_trusted(d).resolved for d in bin_dirs}
        if os.path.dirname(found.resolved) not in resolved_dirs:
            raise PluginRefused(f"{candidate} links outside the plugin dirs, to {found.resolved}")
        if stat.S_ISREG(found.st.st_mode):
            return candidate if _links_within_its_dir(candidate, found.resolved) else found.resolved
    raise PluginNotFound(f"failed to find plugin {kind!r} in path {list(bin_dirs)}")


def _links_within_its_dir(candidate: str, resolved: str) -> bool:
    """Whether candidate is a link, by a bare name, to a regular file beside it."""
    try:
        target = os.readlink(candidate)
    except OSError:
        return False
    if "/" in target or target in (".", ".."):
        return False
    beside = os.path.join(os.path.dirname(candidate), target)
    try:
        st = os.lstat(beside)
    except OSError:
        return False
    same_dir = os.path.dirname(resolve_trusted(candidate).resolved) == os.path.dirname(resolved)
    return stat.S_ISREG(st.st_mode) and same_dir and os.path.basename(resolved) == target


class ChainPlugin(Record):
    """One plugin a DEL would run, and the executable it resolves to."""

    kind: str
    conf_index: int  # which plugin of the list has the config it runs with
    path: str | None  # None when it cannot be resolved
    problem: str | None
    ipam_of: str | None = None  # the plugin that execs it as its IPAM plugin

    def __str__(self) -> str:
        if self.ipam_of is not None:
            return f"ipam plugin {self.kind!r} of {self.ipam_of!r}"
        return f"plugin {self.kind!r}"

    def to_json(self) -> dict[str, Any]:
        return {
            "type": self.kind,
            "ipam_of": self.ipam_of,
            "path": self.path,
            "problem": self.problem,
        }


class ChainResolution(Record):
    """Every plugin a DEL of a network list would run, in the order a DEL execs them: the list's
    plugins in reverse, as libcni runs them, each followed by the IPAM plugin it delegates to."""

    plugins: tuple[ChainPlugin, ...]

    @property
    def failing(self) -> ChainPlugin | None:
        return next((p for p in self.plugins if p.problem is not None), None)

    @property
    def problem(self) -> str | None:
        """The first plugin that cannot be resolved, and why."""
        failing = self.failing
        return None if failing is None else f"{failing}: {failing.problem}"

    def to_json(self) -> dict[str, Any]:
        return {"plugins": [p.to_json() for p in self.plugins], "problem": self.problem}


def resolve_chain(netlist: NetworkList, plugin_dirs: PluginDirs) -> ChainResolution:
    """Each plugin of a network list, and each IPAM plugin they delegate to, resolved in the
    vetted dirs. The IPAM plugin is the config's "ipam": {"type": ...}: bridge, ptp, macvlan,
    ipvlan, host-device and vlan exec it from CNI_PATH on DEL (ipam.ExecDel), and a plugin that
    does not would not look at it. Only the vetted dirs are searched: a plugin found in no
    trusted dir is not run, whichever dirs were given."""
    plugins: list[ChainPlugin] = []
    for index in reversed(range(len(netlist.plugins))):
        conf = netlist.plugins[index]
        kind = go_field(conf, "type")
        plugins.append(_resolve(str(kind) if isinstance(kind, str) else "", index, plugin_dirs))
        ipam = go_object(conf, "ipam")
        if ipam is None:
            continue
        if not isinstance(ipam, tuple):
            problem = "its 'ipam' is not an object"
            plugins.append(ChainPlugin(str(kind), index, None, problem))
            continue
        ipam_kind = go_field(ipam, "type")
        ipam_kind = "" if ipam_kind is None else ipam_kind
        if not isinstance(ipam_kind, str):
            shown = json_kind(ipam_kind) if isinstance(ipam_kind, (list, dict)) else repr(ipam_kind)
            problem = f"invalid plugin name: {shown}"
            plugins.append(ChainPlugin(shown, index, None, problem, ipam_of=str(kind)))
        elif ipam_kind:  # an empty type: no IPAM (bridge's isLayer3 is false)
            plugins.append(_resolve(ipam_kind, index, plugin_dirs)._replace(ipam_of=str(kind)))
    return ChainResolution(tuple(plugins))


def _resolve(kind: str, conf_index: int, plugin_dirs: PluginDirs) -> ChainPlugin:
    try:
        path = find_plugin(kind, plugin_dirs.trusted)
    except PluginNotFound as e:
        # It may well be in a dir left out: say which were, and why; and which were not there.
        missing = f"not there: {', '.join(plugin_dirs.missing)}" if plugin_dirs.missing else ""
        problem = "; ".join(filter(None, (str(e), *plugin_dirs.problems, missing)))
        return ChainPlugin(kind, conf_index, None, problem)
    except PluginRefused as e:
        return ChainPlugin(kind, conf_index, None, str(e))
    return ChainPlugin(kind, conf_index, path, None)


class ProcessRunner:
    """Runs a plugin in a session and process group of its own; the whole group dies at the
    timeout. Made once per run: it notes the descriptors this process inherited, which no
    plugin gets."""

    def __init__(self, note: Callable[[str], None] = lambda _: None) -> None:
        # Only a run that starts a plugin loads the spawning; finding one needs none of it.
        from cni_reaper import spawn, strays  # noqa: PLC0415

        self._spawn = spawn.Child.spawn
        self._strays = strays.STRAYS
        self._close_fds = spawn.inherited_fds()
        self._note = note  # told of the processes plugins left running, once killed
        self._refusal_noted = False

    def run(self, path: str, env: Mapping[str, str], stdin: bytes, timeout: float) -> PluginRun:
        refused = self._strays.begin()
        if refused and not self._refusal_noted:
            self._refusal_noted = True
            self._note(
                f"processes plugins leave running outside their process groups cannot be "
                f"ended ({refused}): they may run on beside the runtime"
            )
        try:
            child = self._spawn(path, dict(env), self._close_fds)
            try:
                try:
                    return self._communicate(child, stdin, timeout)
                finally:
                    try:
                        child.kill_group()
                        child.wait()
                    finally:
                        child.close()
            except OSError as e:
                raise PluginStarted(e.errno, e.strerror or str(e)) from e
        finally:
            ended = self._strays.end()
            if ended:
                self._note(ended)

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
        import signal  # noqa: PLC0415 (a plugin killed by a signal is rare)

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


class ChainCache:
    """Each config's chain resolved once per run, for every path that DELs through it (damaged
    and forgotten entries, orphaned reservations). Kept by the config itself: two configs of
    one name (the conf dirs', and one an entry cached) may name different plugins."""

    def __init__(self, plugin_dirs: PluginDirs) -> None:
        self.plugin_dirs = plugin_dirs
        self._chains: dict[int, tuple[NetworkList, ChainResolution]] = {}

    def __call__(self, netlist: NetworkList) -> ChainResolution:
        held = self._chains.get(id(netlist))
        if held is None or held[0] is not netlist:
            held = self._chains[id(netlist)] = (netlist, resolve_chain(netlist, self.plugin_dirs))
        return held[1]
