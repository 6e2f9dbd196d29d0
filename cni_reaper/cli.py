"""The cni-reaper command: wires the pipeline to the real world and maps failures to exit codes."""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence

from cni_reaper import (
    boot,
    cache,
    flannel,
    host_local,
    leaving,
    multus,
    netconf,
    options,
    pool,
    pre_runtime,
    sinks,
)
from cni_reaper.cache import CacheEntry
from cni_reaper.errors import (
    ExitCode,
    NoPermissionError,
    ReaperError,
    RefusedError,
    UnsafeInputError,
    UsageError,
)
from cni_reaper.escape import printable, printable_lines
from cni_reaper.evidence import shutdown_marker
from cni_reaper.journal import (
    ERR,
    NOTICE,
    WARNING,
    Event,
    EventLog,
    entry_fields,
    event_of,
    more_fields,
    multus_fields,
    reservation_fields,
    say,
    summary_fields,
    warning_fields,
)
from cni_reaper.lock import RunLock
from cni_reaper.node_root import LeavesRoot, RootBinds
from cni_reaper.node_root import canonical as node_path
from cni_reaper.notify import Notifier
from cni_reaper.options import Options
from cni_reaper.paths import NodePaths
from cni_reaper.plan import Action, PlannedEntry, Planner, cached_netlist, held_until, why_alive
from cni_reaper.plugin import ChainCache, PluginDirs, vet_plugin_dirs
from cni_reaper.record import Record
from cni_reaper.repair import outcome
from cni_reaper.repair.outcome import EntryResult, Outcome
from cni_reaper.report import JsonWriter, Report, TextWriter, bare_header
from cni_reaper.reservations import (
    CHANGING_RESERVATIONS,
    EntryFate,
    EntryFates,
    PlannedReservation,
    ReservationAction,
    ReservationPlanner,
    Settled,
    ThroughMultus,
    claimed_or_riding,
    handed_over,
)
from cni_reaper.runtime import config as runtime_config
from cni_reaper.runtime import liveness

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, NoReturn, TextIO, TypeVar

    from cni_reaper.content import ContentVerdict
    from cni_reaper.evidence.fs_crash import FsCrashRecord
    from cni_reaper.plugin import PluginRunner
    from cni_reaper.repair.apply import Executor
    from cni_reaper.repair.budget import Budget
    from cni_reaper.repair.quarantine import Quarantine
    from cni_reaper.repair.replay import DelTools
    from cni_reaper.report import ReportWriter
    from cni_reaper.runtime.inventory import SandboxInventory

    _Found = TypeVar("_Found", CacheEntry, multus.ScratchFile)  # a file of Multus's, as found
    _Plan = TypeVar("_Plan", multus.PlannedDelegate, multus.PlannedScratch)

EVENT_BLOCK = 64  # lines per write to stderr in a dry run

EXIT_FOR_ERROR: dict[type[BaseException], ExitCode] = {
    UsageError: ExitCode.USAGE,
    RefusedError: ExitCode.REFUSED,
    UnsafeInputError: ExitCode.DATA,
    NoPermissionError: ExitCode.NOPERM,
}


def run(
    argv: Sequence[str] | None = None,
    clock: boot.Clock = time.time,
    runner: PluginRunner | None = None,
    events: EventLog | None = None,
    environ: Mapping[str, str] | None = None,
    system_state: Callable[[], str] = shutdown_marker.system_state,
) -> ExitCode:
    started = time.time()
    began = time.monotonic()  # the report's durations count from here (clocks may step)
    env = os.environ if environ is None else environ
    argv = list(sys.argv[1:] if argv is None else argv)
    # Filled as it is read: a usage error after --metrics-file still finds it here.
    parsed = Options()
    try:
        args = options.read(argv, parsed)
        _refuse_early(args)
        # Resolved once, before anything is read: every part of a run (the scan, the
        # plugins' confinement, the dataDirs' binds, Multus's check, which asks whether it
        # is "/") works on that one directory, however it was named (//, a symlink, one
        # swapped for another while the run goes on).
        args.root = os.path.realpath(args.root)
    except (UsageError, NoPermissionError) as e:
        if "--json" in argv:
            _json_failure(JsonWriter(sys.stdout), None, bare_header("--dry-run" in argv, ""), e)
        _failure_metrics(parsed, e, started, env)
        raise
    writer: ReportWriter | None = None
    json_writer = JsonWriter(sys.stdout) if args.json else None
    # The runtimes' configs say which CNI dirs are the node's; a config that cannot be used is
    # a warning, never an exception. The ExecStop at shutdown needs none of it.
    runtimes = None if args.mark_clean_shutdown else runtime_config.load(args.root)
    try:
        paths = NodePaths.build(
            root=args.root,
            cache_dir=args.cache_dir,
            conf_dirs=args.conf_dirs,
            bin_dirs=args.bin_dirs,
            wtmp=args.wtmp,
            state_dir=args.state_dir,
            runtime_dirs=runtimes.cni_dirs if runtimes is not None else None,
        )
    except (LeavesRoot, OSError) as e:
        error = UnsafeInputError(f"cannot take the node's paths under {args.root}: {e}")
        if json_writer is not None:
            _json_failure(json_writer, None, bare_header(args.dry_run, ""), error)
        _failure_metrics(args, error, started, env)
        raise error from None
    if events is None:
        # A dry run runs no plugin: its lines can wait for a block. A repair's line goes out
        # when the repair is done.
        chosen = sinks.choose(env, sys.stdout, sys.stderr, EVENT_BLOCK if args.dry_run else 1)
        events, text_report = chosen.events, chosen.text_report
    else:
        # Natively, the journal already holds every fact of the text report, with its fields.
        text_report = not events.native
    if json_writer is not None:
        writer = json_writer
    elif text_report:
        writer = TextWriter(sys.stdout, verbose=args.verbose)
    made: list[Report] = []  # the report, once the run has one
    try:
        if args.mark_clean_shutdown:
            boot_id = boot.read_boot_id(paths.boot_id)
            if not boot_id:
                raise UnsafeInputError(f"no boot id in {paths.boot_id}: cannot name this boot")
            why_not = shutdown_marker.mark_clean_shutdown(paths, boot_id, clock(), system_state)
            if why_not is not None:
                # It quotes what systemctl printed: escaped, as all outside text.
                shown = printable(why_not)
                say(f"cni-reaper: no clean-shutdown marker written: {shown}", NOTICE, env)
            return ExitCode.OK
        assert runtimes is not None  # read for every run but the ExecStop's
        return _run(
            args, paths, runtimes, clock, runner, events, env, (started, began), writer, made
        )
    except (ReaperError, KeyboardInterrupt, Exception) as e:
        if json_writer is not None:
            header = bare_header(
                args.dry_run, paths.results_dir, paths.sourced_conf_dirs, paths.sourced_bin_dirs
            )
            _json_failure(json_writer, made[0] if made else None, header, e)
        _failure_metrics(args, e, started, env)
        raise
    finally:
        events.flush()


def _refuse_early(args: Options) -> None:
    """What argv alone, or the root and who runs it, rule out: refused before anything on the
    node is read or made. A usage error ends with the usage, as argparse's own do."""
    if not 0 < args.plugin_timeout < math.inf:  # nan too
        raise options.usage_error("--plugin-timeout must be a positive number of seconds")
    if not 0 < args.deadline < math.inf:
        raise options.usage_error("--deadline must be a positive number of seconds")
    if args.parallel < 1:
        raise options.usage_error("--parallel must be at least 1")
    if args.mark_clean_shutdown and args.dry_run:
        raise options.usage_error(
            "--mark-clean-shutdown writes the marker: it cannot be a --dry-run"
        )
    if args.mark_clean_shutdown and args.json:
        # Silence on stdout is no document: a script reading it would fail on the empty text.
        raise options.usage_error(
            "--mark-clean-shutdown writes the marker and no report: --json has nothing to print"
        )
    try:
        root_is_dir = stat.S_ISDIR(os.stat(args.root).st_mode)
    except FileNotFoundError:
        raise options.usage_error(f"--root {args.root}: no such directory") from None
    except (OSError, ValueError) as e:  # EACCES on the way, ELOOP, a NUL in the path
        why = getattr(e, "strerror", None) or e
        raise options.usage_error(f"--root {args.root}: {why}") from None
    if not root_is_dir:
        raise options.usage_error(f"--root {args.root}: not a directory")
    named = [("--root", [args.root]), ("--cache-dir", [args.cache_dir] if args.cache_dir else [])]
    named += [("--conf-dir", args.conf_dirs or []), ("--bin-dir", args.bin_dirs or [])]
    named += [("--state-dir", [args.state_dir] if args.state_dir else [])]
    named += [("--wtmp", [args.wtmp] if args.wtmp else [])]
    for option, paths in named:
        for path in paths:
            resolved = _resolves_elsewhere(path)
            if resolved is not None:
                raise options.usage_error(
                    f"{option} {path}: its path resolves to {resolved}, which is another file "
                    "here (a /proc link into another mount namespace); mount the node's file "
                    "system at a path of this one and name that"
                )
    _given_dirs_exist(args)
    if not args.dry_run and os.geteuid() != 0:
        what = "--mark-clean-shutdown" if args.mark_clean_shutdown else "a real run"
        raise NoPermissionError(
            f"{what} needs root: it takes the node's lock and writes its CNI state"
            + ("" if args.mark_clean_shutdown else "; --dry-run shows the plan as any user")
        )


def _runtime_running_refusal(paths: NodePaths, running: str) -> str:
    """Why a run refuses beside a running runtime, and what would help: stopping it helps
    only where this boot's first run took the pre-runtime record before the runtime started;
    without one, no run of this boot can tell an earlier boot's damage from a write in flight."""
    boot_id = boot.read_boot_id(paths.boot_id)
    loaded = pre_runtime.load(paths.run_dir, boot_id)[0] if boot_id else None
    if loaded is not None:
        return f"a container runtime is running ({running}): stop it first, or use --force"
    return (
        f"a container runtime is running ({running}), and it started before any run of "
        "cni-reaper in this boot took the record of the CNI state from before it: no run in "
        "this boot can tell an earlier boot's damage from a write in flight, with --force or "
        "with the runtime stopped; the next boot's run, ordered before the runtime, repairs it"
    )


def _resolves_elsewhere(path: str) -> str | None:
    """What path resolves to, if that names another file here than path does (of a path not
    there yet, its nearest parent that is): a link of /proc (/proc/<pid>/root, .../fd/<n>)
    into a file system this mount namespace does not reach reads as a path of this machine's
    ("/" for another namespace's root), and every part of a run that resolves a path (the
    plugins' confinement, the dataDirs' binds, a DEL's check of its store) would take this
    machine's file for the node's."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and probe != "/":
        probe = os.path.dirname(probe)
    resolved = os.path.realpath(probe)
    try:
        same = os.path.samestat(os.stat(probe), os.stat(resolved))
    except (OSError, ValueError):
        same = False
    return None if same else resolved


def _given_dirs_exist(args: Options) -> None:
    """A dir the operator named that is not there is a typo, not a node: a --cache-dir that
    does not exist would make every host-local reservation an orphan (no results entry names
    it), and conf or plugin dirs none of which exists, every DEL one that cannot run. Of
    several conf or plugin dirs, some may be missing on this node, as the defaults are. A
    --state-dir not yet there is made by the run."""
    named = [("--cache-dir", [args.cache_dir] if args.cache_dir is not None else [])]
    named += [("--conf-dir", args.conf_dirs or []), ("--bin-dir", args.bin_dirs or [])]
    for option, dirs in named:
        if dirs and not any(os.path.isdir(d) for d in dirs):
            given = " ".join(f"{option} {d}" for d in dirs)
            raise options.usage_error(f"{given}: no such directory")
    state_dir = args.state_dir
    if state_dir is not None and os.path.lexists(state_dir) and not os.path.isdir(state_dir):
        # Found only when the first move failed, after the DELs had run, every damaged file
        # then left for the runtime's DEL to fail on again.
        raise options.usage_error(f"--state-dir {state_dir}: not a directory")


def _failure_metrics(
    args: Options, error: BaseException, started: float, env: Mapping[str, str]
) -> None:
    """With --metrics-file, a run that refuses or fails still says so there: its exit code and
    when it ended. Not for the ExecStop's --mark-clean-shutdown, which is no run of the repair."""
    path = getattr(args, "metrics_file", None)
    if path and not getattr(args, "mark_clean_shutdown", False):
        from cni_reaper import metrics  # noqa: PLC0415 (only when asked for)

        text = metrics.render_failure(
            int(exit_code_for(error)), bool(getattr(args, "dry_run", False)), started, time.time()
        )
        _write_metrics(path, text, env)


def _metrics_dir_missing(path: str) -> str | None:
    """The directory the metrics file goes in, if it does not exist: node_exporter's textfile
    directory exists only where node_exporter is installed, and the unit names it on every
    node. Nothing is written then, and the report says so."""
    directory = os.path.dirname(os.path.abspath(path))
    return None if os.path.isdir(directory) else directory


def _write_metrics(path: str, text: str, env: Mapping[str, str]) -> None:
    """The metrics are one more report of the run: failing to write them is said, and changes
    neither what the run did nor its exit code."""
    if _metrics_dir_missing(path):
        return
    from cni_reaper import metrics  # noqa: PLC0415 (only when asked for)

    try:
        metrics.write(path, text)
    except (OSError, ValueError) as e:  # ValueError: a NUL in the name
        shown, why = printable(path), getattr(e, "strerror", None) or str(e)
        say(f"cni-reaper: metrics not written to {shown}: {why}", WARNING, env)


def _json_failure(
    writer: JsonWriter, report: Report | None, header: dict[str, Any], error: BaseException
) -> None:
    """With --json, a run that refuses or fails still ends its one document: the error and the
    exit code it ends with."""
    code = exit_code_for(error)
    if isinstance(error, ReaperError):
        message = str(error)
        if isinstance(error, UsageError):
            message = options.split_usage(message)[0]  # the usage is no fact of the run
        error.in_json_report = True
    elif isinstance(error, KeyboardInterrupt):
        message = "interrupted"
    else:
        message = f"internal error (a bug): {type(error).__name__}: {error}"
    writer.fail(report, header, message, int(code))


def exit_code_for(error: BaseException) -> ExitCode:
    if isinstance(error, KeyboardInterrupt):
        return ExitCode.INTERRUPTED
    for kind in type(error).__mro__:
        if kind in EXIT_FOR_ERROR:
            return EXIT_FOR_ERROR[kind]
    return ExitCode.INTERNAL


class _Run(Record):
    """One run's inputs, from argv and the node, taken once."""

    args: Options
    paths: NodePaths
    clock: boot.Clock
    runner: PluginRunner | None
    configs: netconf.NetworkConfigs
    binds: RootBinds  # what the plugins see of the root's dirs
    runtimes: runtime_config.RuntimeConfigs
    plugin_dirs: PluginDirs
    budget: Budget | None  # a real run's; a dry run runs nothing to bound
    warnings: list[str]
    events: EventLog
    notifier: Notifier
    writer: ReportWriter | None
    made: list[Report]  # the report, once the run has one

    # The runtime processes found as the run began: the first look uses them, later looks
    # scan /proc again.
    first_scan: list[list[liveness.RuntimeProcess]]
    sources: list[str]  # what each runtime's records said of its sandboxes, for the report
    began: float  # time.monotonic() as the run began

    def runtime_started(self) -> list[str]:
        """What /run and /proc say of a runtime having started in this boot."""
        processes = self.first_scan.pop() if self.first_scan else None
        return liveness.started_this_boot(self.paths.root, self.runtimes, processes=processes)


def _run(
    args: Options,
    paths: NodePaths,
    runtimes: runtime_config.RuntimeConfigs,
    clock: boot.Clock,
    runner: PluginRunner | None,
    events: EventLog,
    env: Mapping[str, str],
    start_times: tuple[float, float],  # the run's start by the wall clock and the monotonic one
    writer: ReportWriter | None,
    made: list[Report],
) -> ExitCode:
    started, began_monotonic = start_times
    budget = None
    if not args.dry_run:
        from cni_reaper.repair.budget import Budget  # noqa: PLC0415 (threading: real runs only)

        budget = Budget(args.deadline)  # counted from here: the scan takes its share
    notifier = Notifier(env)
    notifier.status(f"scanning {paths.results_dir}")
    warnings: list[str] = []
    warnings.extend(runtimes.warnings)
    no_metrics_dir = args.metrics_file and _metrics_dir_missing(args.metrics_file)
    # The unit names node_exporter's dir on every node, and not every node runs it: said, in
    # the journal only as a notice, not at every boot as a warning.
    no_metrics = f"no metrics written: no directory {no_metrics_dir}" if no_metrics_dir else None
    if no_metrics:
        warnings.append(no_metrics)
    first_scan: list[list[liveness.RuntimeProcess]] = []
    running = _runtime_running(paths.root, runtimes, first_scan)
    if running:
        if not (args.force or args.dry_run):
            raise RefusedError(_runtime_running_refusal(paths, running))
        warnings.append(f"a container runtime is running ({running})")
    configs = netconf.load_conf_dirs(paths.conf_dirs)
    binds = _root_binds(paths, configs)
    plugin_dirs = vet_plugin_dirs(paths.bin_dirs)
    warnings.extend(plugin_dirs.problems)
    run = _Run(
        args,
        paths,
        clock,
        runner,
        configs,
        binds,
        runtimes,
        plugin_dirs,
        budget,
        warnings,
        events,
        notifier,
        writer,
        made,
        first_scan,
        [],
        began_monotonic,
    )
    if args.dry_run:
        report = _pipeline(run)  # runs no plugin, so has no need to be confined
    else:
        _keep_exit_statuses()
        with RunLock(paths.lock_file), _from_root_dir():
            from cni_reaper.repair import confine  # noqa: PLC0415 (threading: real runs only)

            if confine.needs_confinement(paths.root):
                # Plugins must work on the root's CNI state, never this machine's: the whole
                # run goes on in a thread of its own, in a mount namespace where they see it.
                report = confine.run_confined(
                    paths.root,
                    confine.standard_binds(paths.root, binds.data_dirs, _kept_paths(paths)),
                    lambda: _pipeline(run),
                    cancel=budget.cancel if budget is not None else None,
                    on_note=warnings.append,
                )
            else:
                report = _pipeline(run)
    report.finish()
    for warning in report.warnings:
        priority = NOTICE if warning == no_metrics else WARNING
        events.emit(warning_fields(warning, len(report.warnings), args.dry_run, priority))
    _emit_more(args, paths, report, events)
    summary = summary_fields(report, sum(events.cut.values()))
    events.emit(summary)
    notifier.status(f"done: {summary['MESSAGE']}")
    if args.metrics_file:
        from cni_reaper import metrics  # noqa: PLC0415 (only when asked for)

        _write_metrics(args.metrics_file, metrics.render(report, started, time.time()), env)
    return report.exit_code


def _root_binds(paths: NodePaths, configs: netconf.NetworkConfigs) -> RootBinds:
    """What a run binds for the plugins under paths.root, a dry run as a real one: a dataDir
    whose bind would refuse the run is refused alone, and with it that network's DELs."""

    def cannot_bind(data_dir: str) -> str | None:
        # Asked only of a dataDir outside the standard dirs, which most nodes have none of:
        # the dry run of one loads no threading.
        from cni_reaper.repair import confine  # noqa: PLC0415

        return confine.bind_problem(paths.root, data_dir, _kept_paths(paths))

    return RootBinds(paths.root, host_local.data_dirs(configs), cannot_bind)


def _kept_paths(paths: NodePaths) -> tuple[str, ...]:
    """The paths the reaper itself goes on using while its plugins run confined."""
    return (
        paths.results_dir,
        paths.state_dir,
        paths.quarantine_dir,
        paths.lock_file,
        *paths.bin_dirs,
    )


def _emit_more(args: Options, paths: NodePaths, report: Report, events: EventLog) -> None:
    """One record for each kind past the journal's bound, before the summary."""
    moved_to = os.path.join(paths.quarantine_dir, report.boot.boot_id or "unknown-boot")
    for kind, more in events.cut.items():
        moved = not args.dry_run and kind in (Event.REPAIRED, Event.REPAIR_FAILED)
        quarantine = moved_to if moved else None
        events.emit(more_fields(kind, events.bound, more, args.dry_run, args.json, quarantine))


def _runtime_running(
    root: str, runtimes: runtime_config.RuntimeConfigs, found: list[list[liveness.RuntimeProcess]]
) -> str | None:
    """A runtime that answers on a socket its config names, or whose process runs on this
    root: either may be setting up a pod right now. The processes go into found."""
    socket = liveness.answering_socket(s.path for s in runtimes.sockets)
    if socket:
        return f"it answers on {socket}"
    try:
        processes = liveness.runtime_processes(root)
    except (liveness.EvidenceUnreadable, OSError) as e:
        return f"cannot tell which runtimes run: {e}"
    found.append(processes)
    if processes:
        return "; ".join(p.describe() for p in processes[:3])
    return None


@contextlib.contextmanager
def _from_root_dir() -> Iterator[None]:
    """A repair runs from /, as a runtime under systemd does: the plugins start in this
    process's working directory (see spawn.py). The caller's is given back after."""
    try:
        caller: int | None = os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        caller = None
    os.chdir("/")
    try:
        yield
    finally:
        if caller is not None:
            os.fchdir(caller)
            os.close(caller)


def _live_containers(run: _Run) -> frozenset[str] | str:
    try:
        return liveness.live_container_ids(run.paths.root, run.runtimes)
    except (liveness.EvidenceUnreadable, OSError) as e:
        return str(e)


def _pinned_netns(run: _Run) -> frozenset[str] | str:
    try:
        netns_dirs = [d.node_path for d in run.runtimes.netns_dirs] or liveness.DEFAULT_NETNS_DIRS
        return liveness.netns_pins(run.paths.root, netns_dirs=netns_dirs)
    except (liveness.EvidenceUnreadable, OSError) as e:
        return str(e)


def _keep_exit_statuses() -> None:
    """SIGCHLD ignored by whatever started this process (systemd resets it for a unit; a
    shell's parent may not) makes the kernel reap every plugin as it exits: its exit status
    lost, each DEL would fail. A real run sets it back to the default before it starts any
    thread, where Python may (the main thread); elsewhere it stays, and each DEL says that it
    lost track of its plugin."""
    import signal  # noqa: PLC0415 (real runs only)

    if signal.getsignal(signal.SIGCHLD) is signal.SIG_IGN:
        with contextlib.suppress(ValueError):
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)


def _pipeline(run: _Run) -> Report:
    args, paths, warnings, events = run.args, run.paths, run.warnings, run.events
    boot_id = boot.read_boot_id(paths.boot_id)
    loaded, record_problem = pre_runtime.load(paths.run_dir, boot_id) if boot_id else (None, None)
    boot_ctx = boot.load(
        paths,
        run.clock,
        first=loaded.first if loaded is not None else None,
        file_system=lambda boot_id: _file_system_record(paths, boot_id),
    )
    if record_problem:
        warnings.append(record_problem)
    proof = pre_runtime.establish(
        boot_ctx.boot_id,
        boot_ctx.now,
        boot_ctx.first,
        loaded,
        record_problem,
        run.runtime_started,
        run_dir=None if args.dry_run else paths.run_dir,  # a dry run keeps no record
    )
    if not args.dry_run and boot_ctx.boot_id and boot_ctx.shutdown is not None:
        try:
            shutdown_marker.consume(paths, boot_ctx.boot_id, boot_ctx.shutdown, boot_ctx.now)
        except OSError as e:
            # Boot evidence for the next run; the repair itself does not depend on it.
            warnings.append(f"cannot record this boot's evidence in {paths.state_dir}: {e}")
    warnings.extend(boot_ctx.warnings)
    warnings.extend(f"config skipped: {p}" for p in run.configs.problems)
    report = Report(
        boot_ctx,
        args.dry_run,
        paths.results_dir,
        warnings,
        run.writer,
        proof,
        run.sources,
        conf_dirs=paths.sourced_conf_dirs,
        bin_dirs=paths.sourced_bin_dirs,
        runtime_paths=run.runtimes.all_paths,
        began=run.began,
    )
    run.made.append(report)
    stores = list(host_local.stores(run.configs, paths.root))
    # Every address reserved before any DEL: the pools' "before" (pool.py), kept compact. A
    # dry run changes no store: the listing its inventory takes is its before and its after.
    reserved_before = {
        network: pool.ListedAddresses(host_local.address_names(store))
        for network, store in (() if args.dry_run else stores)
    }
    delegates = _Delegates(run, boot_ctx, proof, report)
    fates = EntryFates()  # what became of each entry; told of the results dir once it is open
    chains = ChainCache(run.plugin_dirs)  # each config's plugins, resolved once for every DEL
    cached_configs = _CachedConfigs(run)

    def orphans_delegate_stores() -> Iterator[str]:
        """The stores the DEL of an orphan through Multus may release from: its network's
        config (or the one an entry cached) runs the thin Multus plugin, whose scratch files
        of the orphans' owners name them. An owner with a results entry of the network has
        no orphan there; under a --root no DEL through Multus runs."""
        for network, store in stores:
            netlist = run.configs.get(network) or cached_configs(network)[0]
            if netlist is None or multus.confined_problem(netlist, run.binds.root):
                continue
            if not any(True for _ in netconf.configs_running(netlist, multus.THIN_PLUGIN)):
                continue  # the thick plugin's DEL does not run: nothing to record for it
            # An ID-only reservation's entries, under any ifname, are not looked for this early.
            orphans = sorted(
                {
                    o.container_id
                    for o in host_local.owners_in(store)
                    if o.ifname is None or not fates.has_entry(network, o.container_id, o.ifname)
                }
            )
            yield from host_local.scratch_stores(netlist, orphans, paths.root)

    def ready(
        alive: Callable[[str], str | None],
        pins: frozenset[str] | str,
        delegate_stores: Iterable[str] = (),
    ) -> str | None:
        """Once the rest of the plan is made: Multus's delegate results judged (alive: why a
        container's attachments may be alive, pins the netns mounted now); then, before
        anything changes, the pre-runtime record completed (those and the host-local stores
        too), checked and kept for later runs; the configs cached for networks no conf dir
        names read before their entries may move; the stores of the delegates Multus's DELs
        would release from (delegate_stores) recorded too. Then the first changes: Multus's
        damaged delegate results moved, before any DEL."""
        delegates.judge(alive, pins)
        cached_configs.read_all()
        network_stores = [s for _, s in stores]
        cached_stores = list(cached_configs.stores())
        # Only the boot's first run (which takes the record, or, dry, would) needs the
        # delegates' stores now: a later one reads them for its check alone.
        from_delegates: list[str] = []
        if proof.taking:
            named = (*delegate_stores, *orphans_delegate_stores())
            from_delegates, past = host_local.scratch_named_to_record(
                named, (*network_stores, *cached_stores)
            )
            warnings.extend(past)
        recorded = (*network_stores, *cached_stores, *from_delegates)
        for store in dict.fromkeys(recorded):
            pre_runtime.record_dir(proof, store)
        veto = pre_runtime.confirm(proof, run.runtime_started)
        if veto is None and not args.dry_run:
            try:
                pre_runtime.save(proof)
            except OSError as e:
                warnings.append(f"cannot keep this boot's pre-runtime record: {e}")
        elif veto is None:
            proof.seal()
        report.mark_planned()
        delegates.settle(veto)
        return veto

    try:
        results_fd = cache.open_results_dir(paths.results_dir)
    except cache.ResultsDirError as e:
        raise UnsafeInputError(str(e.strerror)) from None
    if results_fd is None:
        warnings.append(f"no results dir at {paths.results_dir}")
        delegates.open(None)
        # What is alive is asked only of a node with something it could stop a change to.
        needed = bool(stores) or delegates.present
        live = _live_containers(run) if needed else frozenset()
        pins = _pinned_netns(run) if needed else frozenset()
        ready(lambda container_id: why_alive(live, container_id), pins)
        no_del = host_local.store_problems(run.configs, run.binds)
        warnings.extend(no_del.values())
        _reservations(
            run,
            boot_ctx,
            proof,
            stores,
            reserved_before,
            fates,
            cached_configs,
            chains,
            report,
            # a peer deleted the dir: every reservation is an orphan, but what is alive
            # stays so
            alive=lambda container_id: why_alive(live, container_id),
            pins=pins,
            del_problems=no_del,
            cached_by_multus=delegates.cached_by() if stores else None,
        )
        return report
    quarantines: list[Quarantine] = []  # the one a real run opens, if it changes anything
    cached_configs.results_fd = results_fd
    try:
        delegates.open(results_fd)
        proof.open_dir(paths.results_dir, os.fstat(results_fd))
        fates.present = lambda name: _regular_in(results_fd, name)
        fates.names = lambda: os.listdir(results_fd)
        del_problems = host_local.store_problems(run.configs, run.binds)

        def cached_problem(netlist: netconf.NetworkList) -> str | None:
            return host_local.cached_config_problem(netlist, run.binds)

        warnings.extend(del_problems.values())
        sandboxes = _sandbox_records(run)
        planner = Planner(
            boot_ctx,
            run.configs,
            proof,
            paths.results_dir,
            chains,
            _live_containers(run),
            del_problems,
            sandboxes=sandboxes,
            read_cached=lambda entry: cache.read_cached(results_fd, entry),
            cached_config_problem=cached_problem,
            network_cached_config=cached_configs,
        )
        pins = _pinned_netns(run)
        listed: list[str] = []  # the results dir's names, listed once, if a pin needs them

        def mounted(container_id: str) -> str | None:
            """A namespace still mounted that a whole entry of the container names (libcni
            1.2 on caches it): the whole plan is known by now, every sibling entry with it."""
            if pins and not isinstance(pins, str) and not listed:
                listed.extend(os.listdir(results_fd))
            return _netns_mounted(pins, results_fd, listed, container_id)

        def alive(planned: PlannedEntry) -> str | None:
            split = planned.entry.split
            return mounted(split.container_id) if split is not None else None

        def delegate_alive(container_id: str) -> str | None:
            return planner.alive(container_id) or mounted(container_id)

        reads = host_local.StoreReads(boot_ctx, proof)
        network_stores = dict(stores)
        chain_stores, runs_flannel = netconf.PerChain(), netconf.PerChain()

        def store_named(netlist: netconf.NetworkList) -> str | None:
            return host_local.store_of(netlist, paths.root)

        def doubted(planned: PlannedEntry) -> str | None:
            """Why the DEL of an entry may not run, if host-local's store holds an address for
            its attachment that this run cannot prove an earlier boot reserved."""
            split, netlist = planned.entry.split, planned.netlist
            if planned.action is not Action.DEL_AND_QUARANTINE or split is None or not netlist:
                return None
            # The store its config names, and the one this run found for the network by name
            # (a delegating plugin's, whose delegate's IPAM its config may not say).
            named = (
                chain_stores.get(netlist, store_named),
                network_stores.get(netlist.name),
            )
            read_stores = list(dict.fromkeys(s for s in named if s is not None))
            for store in read_stores:
                why = reads.of(store).against(split.container_id, split.ifname)
                if why is not None:
                    return why
            why = reads.against_delegates(
                netlist, split.container_id, network_stores.values(), paths.root
            )
            if why is not None or not runs_flannel.get(netlist, flannel.runs):
                return why
            return flannel.scratch_problem(netlist, split.container_id, run.binds, read_stores)

        settle = _settling(run, report, proof, results_fd, paths.results_dir, boot_ctx.boot_id)
        entries = cached_configs.noting(
            cache.inventory(results_fd, run.configs.networks.keys(), settle)
        )

        def unread(planned: PlannedEntry) -> str | None:
            """Why the DEL is not run, the entry quarantined all the same, if doubted()
            found what it would release through Multus not to be read."""
            split, netlist = planned.entry.split, planned.netlist
            if planned.action is not Action.DEL_AND_QUARANTINE or split is None or not netlist:
                return None
            if planned.config_problem is not None:
                return None  # no DEL runs anyway: it claims nothing
            return reads.claim_delegates(netlist, split.container_id, (netlist.name, split.ifname))

        def delegate_stores(held: list[PlannedEntry]) -> Iterator[str]:
            for planned in held:
                split, netlist = planned.entry.split, planned.netlist
                if planned.action is Action.DEL_AND_QUARANTINE and split and netlist:
                    yield from reads.delegate_stores(netlist, split.container_id, paths.root)

        plan = held_until(
            map(planner, entries),
            lambda held: ready(delegate_alive, pins, delegate_stores(held)),
            alive,
            doubted,
            unread,
        )
        if args.dry_run:
            results = outcome.dry_run(plan)
        else:

            def executor() -> Executor:
                # Plugins, quarantine and hashing are loaded only by runs that use them.
                from cni_reaper.repair.apply import Executor  # noqa: PLC0415
                from cni_reaper.repair.quarantine import Quarantine  # noqa: PLC0415

                quarantines.append(Quarantine(paths.quarantine_dir, boot_ctx.boot_id))
                return Executor(
                    results_fd=results_fd,
                    quarantine=quarantines[0],
                    clock_now=boot_ctx.now,
                    releases=host_local.Releases(stores, reads),
                    tools=_del_tools(run),
                )

            results = _carried_out(plan, executor)
        log_kept, dry_run, notify = args.verbose, args.dry_run, run.notifier.enabled
        for result in results:
            report.add(result)
            kept = result.outcome is Outcome.SKIPPED and result.planned.action is Action.KEEP
            if kept and not log_kept:
                continue  # nearly every entry: no fate to note (_note_fate), nothing to log or say
            _note_fate(result, fates)
            kind = event_of(result)
            if (log_kept or kind is not Event.KEPT) and not events.counted_as_cut(kind):
                events.emit(entry_fields(result, dry_run))
            if notify and result.planned.action.changes_things:
                run.notifier.status(f"{result.outcome.value}: {result.planned.entry.name}")
        _reservations(
            run,
            boot_ctx,
            proof,
            stores,
            reserved_before,
            fates,
            cached_configs,
            chains,
            report,
            planner.alive,
            pins,
            del_problems,
            sandboxes.knows,
            delegates.cached_by() if stores else None,
        )
    finally:
        for quarantine in quarantines:
            quarantine.close()
        delegates.close()
        os.close(results_fd)
    return report


def _settling(
    run: _Run,
    report: Report,
    proof: pre_runtime.Proof,
    dir_fd: int,
    where: str,
    boot_id: str,
    box: str | None = None,
    path_of: Callable[[str], str] = lambda name: name,
) -> cache.Settle:
    """What a scan of the dir at where (open at dir_fd) hands the names a move cut short hid
    (leaving.py): settled against the quarantine that move was for, in this boot's dir or an
    earlier boot's (quarantine.copy_finder: box, path_of), if proof holds it as its original;
    said in a dry run. Each is a warning, and counts as the report's entries do."""

    def settle(hidden: list[str]) -> list[str]:
        from cni_reaper.repair.quarantine import copy_finder  # noqa: PLC0415 (a run was cut short)

        copy_of = copy_finder(run.paths.quarantine_dir, boot_id, box, dir_fd, path_of)
        dir_st = os.fstat(dir_fd)

        def predates(st: os.stat_result, original: str) -> str | None:
            return proof.held_before(where, dir_st, original, st)

        args = (dir_fd, where, hidden, copy_of, predates, run.args.dry_run)
        put_back, said = leaving.settle(*args)
        for settled in said:
            run.warnings.append(settled.line)
            report.note_settled(settled.outcome)
        return put_back

    return settle


def _carried_out(
    plan: Iterable[PlannedEntry], executor: Callable[[], Executor]
) -> Iterator[EntryResult]:
    """The plan carried out. An entry that changes nothing is skipped, as apply.execute
    skips it; from the first that changes something on (held_until holds those back to the
    end of the plan), apply.execute does the rest, with the executor made then. So a boot with
    nothing to repair, the common one, never reads the plugin runner, the quarantine or the
    DEL replay from a cold disk."""
    entries = iter(plan)
    for planned in entries:
        if planned.action.changes_things:
            from cni_reaper.repair.apply import execute  # noqa: PLC0415

            yield from execute(itertools.chain((planned,), entries), executor())
            return
        yield EntryResult(planned, Outcome.SKIPPED)


def _file_system_record(paths: NodePaths, boot_id: str) -> FsCrashRecord:
    """What the file system holding the cache says of its last unmount: a journal replayed at
    this boot's mount proves it was not unmounted cleanly, without a clock."""
    from cni_reaper.evidence import fs_crash  # noqa: PLC0415 (udev and the kernel log)

    held = paths.results_dir if os.path.isdir(paths.results_dir) else paths.cache_dir
    return fs_crash.crash_record(held, root=paths.root, boot_id=boot_id)


def _del_tools(run: _Run) -> DelTools:
    from cni_reaper.plugin import ProcessRunner  # noqa: PLC0415 (real runs only)
    from cni_reaper.repair.replay import DelTools, base_env  # noqa: PLC0415

    assert run.budget is not None  # every real run has one
    return DelTools(
        runner=run.runner or ProcessRunner(run.warnings.append),
        plugin_dirs=run.plugin_dirs,
        plugin_timeout=run.args.plugin_timeout,
        base_env=base_env(),
        budget=run.budget,
        workers=run.args.parallel,
    )


_FATES = {
    Action.KEEP: EntryFate.KEPT,
    Action.DEL_AND_QUARANTINE: EntryFate.DELETED,
    Action.QUARANTINE: EntryFate.MOVED,
    Action.LEAVE: EntryFate.LEFT,
    Action.REPORT: EntryFate.LEFT,
}


def _regular_in(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _note_fate(result: EntryResult, fates: EntryFates) -> None:
    """What became of an entry, for the reservations of its attachment."""
    planned = result.planned
    split = planned.entry.split
    if split is None:
        return
    if planned.action is Action.KEEP:  # most entries: kept ones are told by their presence
        return
    fate = _FATES[planned.action]
    if result.outcome is Outcome.SKIPPED and planned.action.changes_things:
        fate = EntryFate.LEFT  # changed since the scan: left where it is
    elif result.outcome is Outcome.FAILED and planned.cached and not result.quarantined_to:
        fate = EntryFate.LEFT  # a whole entry whose DEL did not run: for the next run's
    elif result.del_outcome is not None and not result.del_outcome.ok:
        # Every plugin exited 0 and the store still holds it: the DEL ran, and left it.
        fate = EntryFate.DELETED if result.del_outcome.left else EntryFate.DEL_FAILED
    # Asked of an entry left only: at 10,000 damaged entries, no walk of each one's chain.
    delegating = (
        fate is EntryFate.LEFT
        and planned.netlist is not None
        and multus.runs_multus(planned.netlist)
    )
    fates.note(split.network, split.container_id, split.ifname, fate, delegating)


class _CachedConfigs:
    """For a network no conf dir names any more: the config a whole entry of it cached (the
    first in name order, read again), or why none may be used; for its damaged entries and its
    orphaned reservations. Read once per network, when first asked for and at the latest
    before anything moves (read_all): a forgotten sandbox's entry goes to the quarantine."""

    def __init__(self, run: _Run) -> None:
        self._run = run
        self.results_fd: int | None = None
        self._unconfigured: set[str] = set()  # networks of entries no conf dir names
        self._found: dict[str, tuple[netconf.NetworkList | None, str | None]] = {}

    def noting(self, entries: Iterable[CacheEntry]) -> Iterator[CacheEntry]:
        configured = self._run.configs.networks
        builtin = netconf.BUILTIN_LOOPBACK  # containerd's loopback needs no config
        for entry in entries:
            split = entry.split
            if split is not None and split.network != builtin and split.network not in configured:
                self._unconfigured.add(split.network)
            yield entry

    def read_all(self) -> None:
        for network in sorted(self._unconfigured):
            self(network)

    def stores(self) -> list[str]:
        """The host-local store each config read keeps: its files are judged as the conf
        dirs' stores' are, so they go into this boot's pre-runtime record with them."""
        root = self._run.paths.root
        netlists = (netlist for netlist, _ in self._found.values() if netlist is not None)
        return sorted({s for s in (host_local.store_of(n, root) for n in netlists) if s})

    def __call__(self, network: str) -> tuple[netconf.NetworkList | None, str | None]:
        found = self._found.get(network)
        if found is None:
            found = self._found[network] = self._read(network)
        return found

    def _read(self, network: str) -> tuple[netconf.NetworkList | None, str | None]:
        problem = f"no config for network {network!r}, in the conf dirs or cached"
        if self.results_fd is None:
            return None, problem
        run = self._run
        try:
            for entry in cache.whole_entries(self.results_fd, network, run.configs.networks):
                cached = cache.read_cached(self.results_fd, entry)
                if isinstance(cached, str) or cached.config is None:
                    continue
                netlist, why_not = cached_netlist(
                    cached.config,
                    entry.name,
                    network,
                    lambda n: host_local.cached_config_problem(n, run.binds),
                )
                if netlist is not None:
                    return netlist, why_not
                problem = why_not or problem
        except OSError as e:
            return None, f"{problem}: {e.strerror}"
        return None, problem


def _netns_mounted(
    pins: frozenset[str] | str, dir_fd: int | None, names: Sequence[str], container_id: str
) -> str | None:
    """Why the container's attachments may be alive: a netns that a whole entry of it among
    names (of the dir at dir_fd, if any) caches is mounted now (pins), or that cannot be told."""
    if isinstance(pins, str):
        return f"cannot tell which network namespaces are mounted: {pins}"
    if not pins or dir_fd is None:
        return None
    for netns in cache.cached_netns(dir_fd, names, container_id):
        if node_path(netns) in pins:
            return f"its network namespace {netns} is still mounted"
    return None


class _Delegates:
    """Multus's delegate results and scratch files through a run (multus.py): judged with the
    rest of the plan, before the pre-runtime record is kept; the damaged ones moved once it
    is, before any DEL, one of which may be Multus's own and need them gone too. In the
    default cache dir and in every other one the conf dirs' Multus configs name."""

    def __init__(
        self, run: _Run, boot_ctx: boot.BootContext, proof: pre_runtime.Proof, report: Report
    ) -> None:
        self._run, self._boot, self._proof, self._report = run, boot_ctx, proof, report
        self._found: list[multus.MultusCache] = []
        # each cache's plan: its delegate results', its scratch files'
        self._plans: list[tuple[list[multus.PlannedDelegate], list[multus.PlannedScratch]]] = []

    def open(self, results_fd: int | None) -> None:
        """The dirs as they are before anything moves; before the report is begun, which says
        the run's warnings first. A dir named twice (a symlink, another spelling) is inspected
        once. One that is, or holds, the runtime's results dir or another cache's dir, or is
        one of the reaper's own (its quarantine), is not inspected as Multus's, nor are those
        past the first MAX_NAMED_DIRS opened: the delegates' addresses are then left to
        Multus."""
        run = self._run
        found = [multus.MultusCache.open(run.paths.cache_dir)]
        # the dirs inspected so far, by (device, inode): theirs, and those below them
        seen = {mine for mine in [found[0].identity()] if mine is not None}
        taken = set(found[0].identities())
        if results_fd is not None:
            taken.add(multus.identity_of(os.fstat(results_fd)))
        placed: list[tuple[multus.MultusCache, str]] = []  # opened, with the path as named
        past = 0
        for named in multus.named_dirs(run.configs.networks.values()):
            if named.problem is not None or named.node_path is None:
                why = "not looked at" if named.node_path else "where it is cannot be told"
                problem = named.problem or "a cniDir that cannot be placed"
                found.append(multus.MultusCache.unknown(named.node_path, problem, why))
                continue
            cache_here = multus.MultusCache.named(run.paths.root, named.node_path)
            mine = cache_here.identity()
            if mine is not None and mine in seen:
                cache_here.close()
                continue
            if mine is not None and len(placed) == multus.MAX_NAMED_DIRS:
                cache_here.close()
                past += 1
                continue
            if cache_here.identities() & taken:
                why = "it is or holds a dir this run inspects as the runtime's or another cache's"
                found.append(self._not_inspected(cache_here, named.node_path, why))
            elif mine is None:
                found.append(cache_here)  # none there, or one that cannot be looked at
            else:
                placed.append((cache_here, named.node_path))
                seen.add(mine)
                taken |= cache_here.identities()
        found += self._outside_own_dirs(placed)
        if past:
            problem = (
                f"Multus configs name more than {multus.MAX_NAMED_DIRS} cache dirs that exist; "
                f"the {past} past the first {multus.MAX_NAMED_DIRS} are not inspected"
            )
            why = f"past the first {multus.MAX_NAMED_DIRS} such dirs, not looked at"
            found.append(multus.MultusCache.unknown(None, problem, why))
        self._found = found
        for cache_here in found:
            if cache_here.problem:
                run.warnings.append(cache_here.problem)

    def _outside_own_dirs(
        self, placed: list[tuple[multus.MultusCache, str]]
    ) -> list[multus.MultusCache]:
        """The caches, but those of the reaper's own state dir (its quarantine), found by
        identity in one walk of it, and all when that walk cannot be whole."""
        state_dir = self._run.paths.state_dir
        wanted = frozenset().union(*(c.identities() for c, _ in placed))
        hits, problem = multus.found_in(state_dir, wanted) if placed else (frozenset(), None)
        kept = []
        for cache_here, as_named in placed:
            if cache_here.identities() & hits:
                why = f"it is in the reaper's own state dir {state_dir}"
            elif problem is not None:
                why = f"whether it is in the reaper's own state dir cannot be told ({problem})"
            else:
                kept.append(cache_here)
                continue
            kept.append(self._not_inspected(cache_here, as_named, why))
        return kept

    @staticmethod
    def _not_inspected(
        cache_here: multus.MultusCache, node_path: str, why: str
    ) -> multus.MultusCache:
        where = cache_here.scratch_dir
        cache_here.close()
        problem = f"Multus's cache {where}, which a Multus config names: {why}"
        return multus.MultusCache.unknown(node_path, problem, why)

    @property
    def present(self) -> bool:
        """Whether Multus keeps a cache dir on the node, usable or not."""
        return any(
            found.present or found.scratch_fd is not None or found.problem is not None
            for found in self._found
        )

    def cached_by(self) -> multus.DelegateResults | None:
        """Where Multus cached a delegate's result (reservations.py), as found before any
        move, with what runs moved since; asked only by a run with host-local stores."""
        quarantine_dir = self._run.paths.quarantine_dir
        read: list[Mapping[str, frozenset[str]] | None] = []  # the quarantine's, read once

        def doubted(why: str) -> None:
            self._run.warnings.append(
                f"which Multus files earlier runs moved cannot be told ({why}): an address no "
                "results entry names is kept as one Multus may have cached for a delegate, "
                "unless no runtime knows its sandbox"
            )

        def moved(results_dir: str) -> frozenset[str] | None:
            from cni_reaper.repair import multus_repair  # noqa: PLC0415 (Multus's nodes only)

            if not read:
                read.append(multus_repair.moved_earlier(quarantine_dir, doubted))
            by_dir = read[0]
            return None if by_dir is None else by_dir.get(results_dir, frozenset())

        lookups = [
            lookup
            for lookup in (found.delegate_results(moved) for found in self._found)
            if lookup is not None
        ]
        if len(lookups) < 2:
            return lookups[0] if lookups else None

        def in_any(network: str, container_id: str, ifname: str) -> str | None:
            for lookup in lookups:
                cached = lookup(network, container_id, ifname)
                if cached is not None:
                    return cached
            return None

        return in_any

    def close(self) -> None:
        for found in self._found:
            found.close()

    def judge(self, alive: Callable[[str], str | None], pins: frozenset[str] | str) -> None:
        """alive: why a container's attachments may be alive, from the runtimes' live state
        and the results dir's entries; a whole delegate result of it, in any of the caches,
        may name a netns too."""
        run, proof, at = self._run, self._proof, self._boot

        def settle(fd: int | None, where: str) -> cache.Settle | None:
            if fd is None:
                return None
            path_of = functools.partial(os.path.join, where)
            box = multus.QUARANTINE_SUBDIR
            return _settling(run, self._report, proof, fd, where, at.boot_id, box, path_of)

        entries = [
            found.entries(run.configs.networks.keys(), settle(found.fd, found.results_dir))
            for found in self._found
        ]
        named = [(f.fd, [e.name for e in listed]) for f, listed in zip(self._found, entries)]

        def alive_here(container_id: str) -> str | None:
            why = alive(container_id)
            for fd, names in named:
                why = why or _netns_mounted(pins, fd, names, container_id)
            return why

        def planned(
            fd: int | None,
            where: str,
            files: Sequence[_Found],
            policy: Callable[[_Found, boot.WrittenVerdict, Callable[[str], str | None]], _Plan],
        ) -> list[_Plan]:
            if not files or fd is None:
                return []
            proof.open_dir(where, os.fstat(fd))
            return [policy(f, proof.written(where, f.name, f.file, at), alive_here) for f in files]

        self._plans = [
            (
                planned(found.fd, found.results_dir, listed, multus.plan_delegate),
                planned(
                    found.scratch_fd,
                    found.scratch_dir,
                    found.scratch_files(settle(found.scratch_fd, found.scratch_dir)),
                    multus.plan_scratch,
                ),
            )
            for found, listed in zip(self._found, entries)
        ]

    def settle(self, veto: str | None) -> None:
        """The plan carried out (a real run) or said (a dry run); veto: why nothing may change
        after all (pre_runtime.confirm)."""
        run = self._run
        docs: list[dict[str, Any]] = []
        scratch_docs: list[dict[str, Any]] = []
        try:
            for found, (planned, scratch_planned) in zip(self._found, self._plans):
                plan, scratch = planned, scratch_planned
                if veto is not None:
                    plan = [multus.held_back(p, veto) for p in plan]
                    scratch = [multus.held_back(p, veto) for p in scratch]
                docs += self._carry_out(
                    plan, found.fd, found.results_dir, multus.delegate_doc, None
                )
                scratch_docs += self._carry_out(
                    scratch,
                    found.scratch_fd,
                    found.scratch_dir,
                    multus.scratch_doc,
                    multus.scratch_verdict,
                )
        finally:
            self.close()
        verbose, dry_run = run.args.verbose, run.args.dry_run
        for doc in docs:
            self._report.add_delegate(doc)
            if doc["action"] != "keep" or verbose:
                run.events.emit(multus_fields(doc, dry_run, multus.DELEGATE_RESULT))
        for doc in scratch_docs:
            self._report.add_scratch(doc)
            if doc["action"] != "keep" or verbose:
                run.events.emit(multus_fields(doc, dry_run, multus.SCRATCH_FILE))

    def _carry_out(
        self,
        plan: Sequence[multus.Planned],
        fd: int | None,
        where: str,
        doc: Callable[[multus.Planned, str, str, str | None, str | None], dict[str, Any]],
        verdict: Callable[[bytes], ContentVerdict] | None,
    ) -> list[dict[str, Any]]:
        """One dir's plan carried out (a real run) or said (a dry run)."""
        run = self._run
        if run.args.dry_run or not plan:
            return [
                doc(p, where, "planned" if p.action.changes_things else "skipped", None, None)
                for p in plan
            ]
        from cni_reaper.repair import multus_repair  # noqa: PLC0415 (real runs with them only)

        boot_ctx = self._boot
        quarantine_dir = run.paths.quarantine_dir
        return multus_repair.carry_out(
            plan, fd, where, doc, verdict, quarantine_dir, boot_ctx.boot_id, boot_ctx.now
        )


def _sandbox_records(run: _Run) -> SandboxInventory:
    """What the runtimes' records on disk say of the sandboxes they will still know."""
    from cni_reaper.runtime import inventory  # noqa: PLC0415 (only with a results dir)

    sandboxes = inventory.load(run.paths.root, run.runtimes)
    run.warnings.extend(sandboxes.unreadable)
    run.sources.extend(sandboxes.sources)
    return sandboxes


def _reservations(
    run: _Run,
    boot_ctx: boot.BootContext,
    proof: pre_runtime.Proof,
    stores: list[tuple[str, str]],
    reserved_before: Mapping[str, pool.ListedAddresses],
    fates: EntryFates,
    cached_configs: Callable[[str], tuple[netconf.NetworkList | None, str | None]],
    chains: ChainCache,
    report: Report,
    alive: Callable[[str], str | None] | None = None,
    pins: frozenset[str] | str = frozenset(),
    del_problems: Mapping[str, str] | None = None,
    knows: Callable[[str], bool | None] | None = None,  # SandboxInventory.knows
    cached_by_multus: multus.DelegateResults | None = None,  # as found before any move
) -> None:
    """After every DEL of the results cache has run: the addresses nobody else will release,
    then how full each pool is left."""
    args = run.args

    owner_alive = _owner_alive(pins, alive)
    delegated = None
    if cached_by_multus is not None:

        def delegated(network: str, container_id: str, ifname: str) -> str | None:
            # A sandbox no runtime will tear down had its Multus entry DEL'd by this run: what
            # that DEL left is an orphan like any other.
            if knows is not None and knows(container_id) is False:
                return None
            return cached_by_multus(network, container_id, ifname)

    def config_for(network: str) -> tuple[netconf.NetworkList | None, str | None]:
        netlist = run.configs.get(network)
        if netlist is not None:
            return netlist, None
        return cached_configs(network)

    planner = ReservationPlanner(
        fates,
        owner_alive,
        config_for,
        chains,
        del_problems or {},
        args.dry_run,
        delegated,
    )
    # Only what changes things or is shown is kept whole; of the rest (at 100,000 reservations
    # nearly all kept, at about 1.7 KiB each whole) only what the pools count.
    changing: list[PlannedReservation] = []
    left: list[PlannedReservation] = []
    kept: list[PlannedReservation] = []
    # store -> address -> its owner's state, and whether it is planned to be released
    states: dict[str, pool.AddressStates] = {}
    # A dry run's stores as its inventory listed them (reserved_before holds none).
    listings: dict[str, pool.ListedAddresses] = {}
    verbose = args.verbose
    delegate_reads = host_local.StoreReads(boot_ctx, proof)
    all_stores = [store for _, store in stores]
    chain_stores, runs_flannel = netconf.PerChain(), netconf.PerChain()

    def store_named(netlist: netconf.NetworkList) -> str | None:
        return host_local.store_of(netlist, run.paths.root)

    for network, store in stores:
        add = states.setdefault(store, pool.AddressStates()).add_listed
        listing = pool.ListedAddresses() if args.dry_run else None
        if listing is not None:
            listings[network] = listing
        doubts = host_local.StoreDoubts(store)
        orphans: list[PlannedReservation] = []  # their DELs, once the whole store is read
        for r in host_local.inventory(network, store, boot_ctx, proof, listing, doubts):
            p = planner(r)
            action = p.action
            if action is ReservationAction.DEL:
                orphans.append(p)
                continue
            if action in CHANGING_RESERVATIONS:
                add(r.ip, r.number, p.owner_state, True)
                changing.append(p)
                continue
            add(r.ip, r.number, p.owner_state, p.owner_state == "entry-del")
            if action is ReservationAction.LEAVE:
                left.append(p)
            elif verbose and action is ReservationAction.KEEP:
                kept.append(p)
        for p in handed_over(orphans):
            r = p.reservation
            assert r.owner is not None  # an orphan's DEL is by its owner
            owner = r.owner.container_id
            ifname = p.del_ifname or host_local.DEFAULT_IFNAME
            doubt = doubts.against(owner, ifname)
            netlist = p.netlist
            if doubt is None and netlist is not None:
                # Read now, after the entries' DELs: what they released is gone. The store
                # the DEL's config keeps, where that is not the one the orphan was found in
                # (a config an entry cached, naming a dataDir of its own), is read as well.
                named = chain_stores.get(netlist, store_named)
                if named is not None and named != store:
                    doubt = delegate_reads.of(named).against(owner, ifname)
                doubt = doubt or delegate_reads.against_delegates(
                    netlist, owner, all_stores, run.paths.root
                )
                if doubt is None and runs_flannel.get(netlist, flannel.runs):
                    doubt = flannel.scratch_problem(netlist, owner, run.binds, (store,))
            if doubt is None and netlist is not None and p.config_problem is None:
                # What its Multus's delegates release, for claimed_or_riding() to settle.
                hold = delegate_reads.delegates_release(netlist, owner, ifname)
                if hold is not None:
                    seen = delegate_reads.scratch_seen(netlist, owner)
                    through = ThroughMultus(tuple(hold), seen)
                    p = p._replace(through_multus=through)  # noqa: PLW2901 (as planned)
            if doubt is None:
                add(r.ip, r.number, p.owner_state, True)
                changing.append(p)
            else:
                left.append(p._replace(action=ReservationAction.LEAVE, reason=doubt))
                add(r.ip, r.number, "left", False)

    def claim(p: PlannedReservation) -> str | None:
        # Last, for a DEL that is to run: it claims the scratch files its Multus reads.
        r = p.reservation
        assert p.netlist is not None and r.owner is not None and p.del_ifname is not None
        attachment = (r.network, p.del_ifname)
        return delegate_reads.claim_delegates(p.netlist, r.owner.container_id, attachment)

    identities: dict[str, object] = {}

    def dir_of(store: str) -> object:
        found = identities.get(store)
        if found is None:
            found = identities[store] = host_local.store_identity(store)
        return found

    claimed_or_riding(changing, claim, dir_of)
    settled: Iterable[Settled]
    if args.dry_run:
        settled = (Settled(p, "planned") for p in handed_over(changing))
    elif changing:
        from cni_reaper.repair import release  # noqa: PLC0415 (real runs only)

        settled = release.settle(
            handed_over(changing),
            _del_tools(run),
            run.paths.quarantine_dir,
            boot_ctx.boot_id or "unknown-boot",
            boot_ctx.now,
        )
    else:
        settled = ()
    shown = [Settled(p, "skipped") for p in (*left, *kept)]
    for s in itertools.chain(shown, settled):  # as each is settled, none kept after
        doc = s.to_json()
        report.add_reservation(doc)
        run.events.emit(reservation_fields(doc, args.dry_run))
    del settled, shown, left, kept  # every reservation reported: only the counts are left
    report.pools = _pool_health(run, stores, {**reserved_before, **listings}, states)


def _owner_alive(
    pins: frozenset[str] | str, alive: Callable[[str], str | None] | None
) -> Callable[[str], str | None]:
    """Why a reservation's owner may be alive, if it may: while namespaces are mounted (or
    which are cannot be told), no reservation says whose they are, so the same holds for
    every owner; else, what alive() says of it."""
    if isinstance(pins, str):
        why = f"cannot tell which network namespaces are mounted: {pins}"
    elif pins:
        why = "network namespaces are still mounted, and no results entry says whose"
    else:
        return alive if alive is not None else lambda _: None
    return lambda _: why


def _pool_health(
    run: _Run,
    stores: list[tuple[str, str]],
    reserved_before: Mapping[str, pool.ListedAddresses],
    states: Mapping[str, pool.AddressStates],
) -> list[pool.PoolHealth]:
    """Each host-local range set: capacity, reserved before, released, and what is left and
    why (states: each store's addresses' owners' states). A dry run counts what it plans
    (planned away) as released."""
    pools = []
    for network, store in stores:
        netlist = run.configs.get(network)
        sets: tuple[pool.RangeSet, ...] = ()
        if netlist is not None:
            for plugin in netlist.plugins:
                ipam = netconf.go_object(plugin, "ipam", null_resets=True)  # as host-local's
                if isinstance(ipam, tuple) and netconf.go_field(ipam, "type") == "host-local":
                    sets, problem = pool.range_sets(ipam)
                    if problem:
                        run.warnings.append(f"pool of {network}: {problem}")
                    break
        dry_run = run.args.dry_run
        before = reserved_before.get(network) or pool.ListedAddresses()
        if dry_run and not before:
            # A store the inventory did not list (gone, or refused as untrusted) is counted as
            # a real run counts it.
            before = pool.ListedAddresses(host_local.address_names(store))
        # A dry run changed nothing since it listed the store: that listing is what the store
        # holds now, and what it released is what it plans, not what a runtime released since.
        now = before.items() if dry_run else host_local.address_names(store)
        after = _held_now(states.get(store), now, dry_run)
        if sets or before or after:
            pools.extend(pool.health(network, sets, before, after))
    return pools


def _held_now(
    state: pool.AddressStates | None,
    now: Iterable[tuple[str, int | None]],
    dry_run: bool,
) -> pool.AddressStates:
    """Each address the store holds now (as pool.listed() gives them) -> its owner's state
    ("unknown" if the inventory saw no such reservation); a dry run's planned away are counted
    as released."""
    known = pool.AddressStates() if state is None else state
    return known.held_now(now, away_released=dry_run)


def console(argv: Sequence[str] | None = None, clock: boot.Clock = time.time) -> NoReturn:
    """The installed command and `python -m cni_reaper`: main(), then out at once, without
    the interpreter's teardown. By then every file is closed or synced, every plugin reaped,
    every thread joined; the teardown would only free, module by module, memory the kernel
    frees whole: about a tenth of a run's CPU over 1,000 entries, and at boot, under the
    unit, time the runtime waits for."""
    code = main(argv, clock=clock)
    # A stream that cannot be flushed raises here, and the interpreter ends as it would.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _one_log_file(stdout: TextIO, stderr: TextIO) -> bool:
    """Whether both streams go to one file or pipe that is no terminal (cron's >>log 2>&1):
    the --json document that holds the error is then all it gets, and parses."""
    try:
        out, err = os.fstat(stdout.fileno()), os.fstat(stderr.fileno())
        return (out.st_dev, out.st_ino) == (err.st_dev, err.st_ino) and not os.isatty(
            stderr.fileno()
        )
    except (OSError, ValueError):  # a stream with no descriptor: a test's capture
        return False


def main(
    argv: Sequence[str] | None = None,
    clock: boot.Clock = time.time,
    environ: Mapping[str, str] | None = None,
) -> int:
    try:
        return int(run(argv, clock=clock, environ=environ))
    except ReaperError as e:
        # Its message may quote a path, an argument or a config string: escaped, on one line.
        # A usage error's message ends with the usage, which is ours and keeps its lines.
        message, usage = options.split_usage(str(e)) if isinstance(e, UsageError) else (str(e), "")
        code = exit_code_for(e)
        if not (e.in_json_report and _one_log_file(sys.stdout, sys.stderr)):
            say(
                f"cni-reaper: {printable(message)}{usage}",
                WARNING if code is ExitCode.REFUSED else ERR,
                environ,
            )
        return int(code)
    except KeyboardInterrupt:
        say("cni-reaper: interrupted", WARNING, environ)
        return int(ExitCode.INTERRUPTED)
    except Exception:
        import traceback  # noqa: PLC0415 (only for a bug)

        # A traceback quotes values too (a file name in an exception): escaped like the rest.
        traceback_lines = printable_lines(traceback.format_exc().splitlines())
        say(
            f"{traceback_lines}cni-reaper: internal error (a bug): see the traceback above",
            ERR,
            environ,
        )
        return int(ExitCode.INTERNAL)
