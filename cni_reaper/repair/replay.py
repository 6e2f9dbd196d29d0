"""CNI DEL for one attachment, as libcni's DelNetworkList runs it: with no prevResult for a
damaged entry or an orphaned reservation, with the cached one for a whole entry.

Plugin order, environment and stdin: shared/reference/libcni-cache.md section 4.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from cni_reaper import failpoint, go_marshal
from cni_reaper.netconf import NetworkList, go_object
from cni_reaper.plugin import (
    ChainResolution,
    PluginDirs,
    PluginError,
    PluginStarted,
    error_from_run,
    error_texts,
    resolve_chain,
    vet_plugin_dirs,
)
from cni_reaper.record import Record
from cni_reaper.repair.budget import Budget
from cni_reaper.trust import untrusted_path

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from cni_reaper.plugin import PluginRunner

BEFORE_PLUGIN = failpoint.declare("del.before-plugin")
AFTER_PLUGIN = failpoint.declare("del.after-plugin")


class Attachment(Record):
    container_id: str
    ifname: str
    cni_args: tuple[tuple[str, str], ...] = ()
    capability_args: Mapping[str, Any] | None = None

    def cni_args_string(self) -> str:
        args = self.cni_args or (
            ("IgnoreUnknown", "1"),
            ("K8S_POD_INFRA_CONTAINER_ID", self.container_id),
        )
        return ";".join(f"{k}={v}" for k, v in args)


class DelOutcome(Record):
    plugins_run: tuple[str, ...]
    errors: tuple[PluginError, ...]
    released: tuple[str, ...] = ()  # addresses seen released from host-local's store
    # addresses host-local's store still held for the attachment after every plugin exited 0
    # (the one error then is the reaper's, saying so)
    left: tuple[str, ...] = ()
    # False: the run's time was up (the deadline, an interruption, a plugin that keeps timing
    # out) before it could start; nothing says it would fail next time
    attempted: bool = True

    @property
    def ok(self) -> bool:
        return not self.errors

    def error_texts(self) -> list[str]:
        return error_texts(self.errors, bool(self.plugins_run))


def plugin_stdin(
    netlist: NetworkList,
    plugin: Mapping[str, Any],
    capability_args: Mapping[str, Any] | None,
    prev_result: Mapping[str, Any] | None = None,
) -> bytes:
    """The plugin's config with name, cniVersion and prevResult injected, written as libcni
    writes it (go_marshal.py)."""
    conf = dict(plugin)
    conf["name"] = netlist.name
    conf["cniVersion"] = netlist.cni_version
    if prev_result is not None:
        conf["prevResult"] = prev_result
    # types.NetConf's map, as libcni decodes it from the plugin's config
    capabilities = go_object(plugin, "capabilities", null_resets=True)
    capabilities = dict(capabilities) if isinstance(capabilities, tuple) else None
    if capability_args and isinstance(capabilities, dict):
        runtime = {
            cap: capability_args[cap]
            for cap, enabled in capabilities.items()
            if enabled is True and cap in capability_args
        }
        if runtime:
            conf["runtimeConfig"] = runtime
    return go_marshal.marshal(conf).encode()


# systemd's default PATH for services: what a runtime started by systemd hands its plugins.
SERVICE_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")


def base_env() -> dict[str, str]:
    """The environment every plugin starts from: a PATH of trusted dirs only, and nothing else.

    Not the reaper's own environment: run by hand (sudo -E), it may carry a PATH with a dir
    others can write first (Debian's firewall plugin runs iptables from PATH on DEL), or
    LD_PRELOAD and LD_LIBRARY_PATH, which every dynamically linked plugin would obey as root.
    A runtime under systemd hands its plugins the service default. Taken once per run."""
    return {"PATH": ":".join(d for d in SERVICE_PATH if untrusted_path(d) is None)}


def as_vetted(plugin_dirs: PluginDirs | Sequence[str]) -> PluginDirs:
    """Vetted dirs as they are; plain dirs vetted here, for a caller that has not vetted them
    once for the run: never a dir in CNI_PATH that was not vetted."""
    if isinstance(plugin_dirs, PluginDirs):
        return plugin_dirs
    return vet_plugin_dirs(plugin_dirs)


def plugin_env(
    attachment: Attachment,
    plugin_dirs: PluginDirs | Sequence[str],
    inherited: Mapping[str, str] | None = None,
) -> dict[str, str]:
    env = dict(base_env() if inherited is None else inherited)
    env.update(
        CNI_COMMAND="DEL",
        CNI_CONTAINERID=attachment.container_id,
        CNI_NETNS="",  # the network namespace died with the boot that made it
        CNI_IFNAME=attachment.ifname,
        CNI_ARGS=attachment.cni_args_string(),
        # Only vetted dirs: plugins exec other plugins (IPAM, delegates) from it.
        CNI_PATH=as_vetted(plugin_dirs).cni_path,
    )
    return env


def delete(
    netlist: NetworkList,
    attachment: Attachment,
    runner: PluginRunner,
    plugin_dirs: PluginDirs | Sequence[str],
    timeout: float,
    inherited: Mapping[str, str] | None = None,
    budget: Budget | None = None,
    chain: ChainResolution | None = None,
    prev_result: Mapping[str, Any] | None = None,
) -> DelOutcome:
    """Plugins in reverse order, stopping at the first failure, as libcni does.

    Before any plugin runs, as in DelNetworkList, a cniVersion libcni cannot parse fails the
    DEL; then every plugin the DEL would run, delegated IPAM plugins included, is resolved in
    the vetted dirs (plugin.resolve_chain), and if one cannot be, none runs: a chain cut short
    after some of its plugins ran is worse than none, and a dry run showing the resolution
    then fails just as the real run does. With a budget, no DEL starts past the run's deadline
    or through a plugin that keeps timing out, and no plugin runs past the deadline.
    """
    version_problem = netlist.version_problem
    if version_problem is not None:
        return DelOutcome((), (PluginError("", version_problem),))
    vetted = as_vetted(plugin_dirs)
    if chain is None:  # else resolved in the same vetted dirs when the run was planned
        chain = resolve_chain(netlist, vetted)
    failing = chain.failing
    if failing is not None:
        return DelOutcome((), (PluginError(failing.kind, str(chain.problem)),))
    if budget is not None:
        refusal = budget.refusal(str(link.path) for link in chain.plugins)
        if refusal is not None:
            return DelOutcome((), (PluginError(chain.plugins[0].kind, refusal),), attempted=False)
    # Every plugin's stdin before the first runs: one that cannot be encoded stops the DEL
    # before any plugin ran, not midway. An IPAM plugin is run by its plugin, not from here.
    stdins: list[tuple[str, str, bytes]] = []
    for link in chain.plugins:
        if link.ipam_of is not None:
            continue
        assert link.path is not None
        conf = netlist.plugins[link.conf_index]
        try:
            stdin = plugin_stdin(netlist, conf, attachment.capability_args, prev_result)
        except ValueError as e:  # a number no float64 holds, which libcni could not decode
            return DelOutcome((), (PluginError(link.kind, f"its config cannot be written: {e}"),))
        stdins.append((link.kind, link.path, stdin))
    env = plugin_env(attachment, vetted, inherited)
    ran: list[str] = []
    for kind, path, stdin in stdins:
        allowed = budget.plugin_time(timeout) if budget is not None else timeout
        failpoint.hit(BEFORE_PLUGIN)
        try:
            run = runner.run(path, env, stdin, allowed)
        except PluginStarted as e:
            lost = PluginError(kind, f"lost track of {path} once started: {e.strerror}")
            return DelOutcome((*ran, kind), (lost,))
        except OSError as e:
            return DelOutcome(tuple(ran), (PluginError(kind, f"cannot run {path}: {e}"),))
        failpoint.hit(AFTER_PLUGIN)
        ran.append(kind)
        error = error_from_run(kind, run, allowed)
        if run.timed_out and budget is not None:
            if allowed < timeout:
                # Cut at the run's deadline: no strike against the plugin, nor a time it
                # was never given.
                assert error is not None
                cut = f"killed at the run's deadline ({budget.seconds:g} s, --deadline)"
                error = error._replace(msg=cut)
            else:
                budget.timed_out(path)
        if error is not None:
            return DelOutcome(tuple(ran), (error,))
    return DelOutcome(tuple(ran), ())


class DelTools(Record):
    """What every DEL of a real run runs with, taken once for the run."""

    runner: PluginRunner
    plugin_dirs: PluginDirs  # vetted once for the run: the only dirs in CNI_PATH
    plugin_timeout: float
    base_env: Mapping[str, str]  # every plugin's environment but its CNI_*
    budget: Budget  # the run's deadline and the plugins that keep timing out
    workers: int = 1  # DELs at once, each of a different network

    def delete(
        self,
        netlist: NetworkList,
        attachment: Attachment,
        chain: ChainResolution | None,
        prev_result: Mapping[str, Any] | None = None,
    ) -> DelOutcome:
        return delete(
            netlist,
            attachment,
            self.runner,
            self.plugin_dirs,
            self.plugin_timeout,
            self.base_env,
            self.budget,
            chain,
            prev_result,
        )
