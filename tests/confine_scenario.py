"""run_confined with real mounts, inside a private mount namespace; run by test_confine.py.

Usage: unshare --mount --propagation private python -m tests.confine_scenario CASE WORKDIR

Before a case runs, the "host" CNI state (/var/lib/cni, /etc/cni, /run) is a tmpfs of this
namespace, holding decoys: whatever run_confined gets wrong lands there, never on the machine.
Each case prints what it saw as one JSON document on stdout, for the test to judge.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from cni_reaper.netconf import NetworkList
from cni_reaper.plugin import ProcessRunner
from cni_reaper.repair import confine
from cni_reaper.repair.replay import Attachment, DelOutcome, delete
from tests.nodetree import CONTAINER_IDS, PLUGIN_DIR, NodeTree

NETWORK = "confine-net"
IP = "10.99.0.7"
CONTAINER_ID = CONTAINER_IDS[0]
RESERVATION = f"{CONTAINER_ID}\r\neth0"
HOST_STORE = Path("/var/lib/cni/networks") / NETWORK
HOST_DECOYS = (
    HOST_STORE / IP,
    Path("/etc/cni/net.d/99-decoy.conflist"),
    Path("/run/netns/decoy"),
    Path("/run/cni/decoy"),
)
# host-local with no dataDir: its store is wherever /var/lib/cni/networks is.
HOST_LOCAL = NetworkList(
    name=NETWORK,
    cni_version="0.4.0",
    plugins=({"type": "host-local", "ipam": {"type": "host-local", "subnet": "10.99.0.0/24"}},),
    source="(test)",
)


def thread_namespace() -> str:
    """The mount namespace of the calling thread (/proc/self/ns is the process's main one)."""
    return os.readlink("/proc/thread-self/ns/mnt")


def thread_mounts() -> list[str]:
    with open("/proc/thread-self/mountinfo") as f:
        return f.read().splitlines()


def make_host_state() -> None:
    """The machine's CNI state as this namespace sees it: tmpfs, with a decoy everywhere a
    plugin could look, and the reservation a wrongly confined DEL would release."""
    from tests.private_node import private_tmpfs  # noqa: PLC0415 (imports pytest)

    for path in (Path("/var/lib/cni"), Path("/etc/cni"), Path("/run")):
        private_tmpfs(path)
    for decoy in HOST_DECOYS:
        decoy.parent.mkdir(parents=True, exist_ok=True)
        decoy.write_text(RESERVATION if decoy.parent == HOST_STORE else "host decoy")


def make_root(workdir: Path) -> Path:
    """A node's disk: the same reservation in its own store, and its config dir."""
    root = workdir / "root"
    store = root / "var/lib/cni/networks" / NETWORK
    store.mkdir(parents=True)
    (store / IP).write_text(RESERVATION)
    (root / "etc/cni/net.d").mkdir(parents=True)
    (root / "run/netns").mkdir(parents=True)
    return root


def listing(path: Path) -> list[str] | None:
    try:
        return sorted(os.listdir(path))
    except FileNotFoundError:
        return None


def host_digest() -> dict[str, str]:
    return {str(p): p.read_bytes().decode() if p.exists() else "(gone)" for p in HOST_DECOYS}


def del_in_a_thread() -> dict[str, Any]:
    """As apply's DEL workers do: a thread started inside the namespace runs the real plugin
    by posix_spawn, and lists the targets by a process it starts."""
    seen: dict[str, Any] = {}

    def replay() -> None:
        seen["namespace"] = thread_namespace()
        outcome: DelOutcome = delete(
            HOST_LOCAL, Attachment(CONTAINER_ID, "eth0"), ProcessRunner(), [PLUGIN_DIR], 10.0
        )
        seen["del_ok"] = outcome.ok
        seen["del_errors"] = [str(e) for e in outcome.errors]
        found = subprocess.run(
            ["find", "/var/lib/cni", "/etc/cni", "/run/netns", "/run/cni", "-mindepth", "1"],
            capture_output=True,
            text=True,
        )
        seen["plugin_view"] = sorted(found.stdout.split())
        write = subprocess.run(["touch", "/etc/cni/new-file"], capture_output=True, text=True)
        seen["write_etc_cni_ok"] = write.returncode == 0

    thread = threading.Thread(target=replay)
    thread.start()
    thread.join()
    return seen


def release_in_root(workdir: Path) -> dict[str, Any]:
    make_host_state()
    root = make_root(workdir)
    binds = confine.standard_binds(str(root))
    caller_before = (thread_namespace(), thread_mounts(), os.getcwd())
    host_before = host_digest()
    inside = threading.Event()
    observed = threading.Event()
    outside: dict[str, Any] = {}

    def observer() -> None:
        """A thread that existed before the namespace: it looks while work() is inside."""
        inside.wait(30)
        outside["namespace"] = thread_namespace()
        outside["store"] = listing(HOST_STORE)
        cat = subprocess.run(["cat", str(HOST_STORE / IP)], capture_output=True)
        outside["cat"] = cat.stdout.decode()
        observed.set()

    def work() -> dict[str, Any]:
        seen = {"work_namespace": thread_namespace(), "cwd": os.getcwd()}
        inside.set()
        observed.wait(30)
        return {**seen, **del_in_a_thread()}

    watcher = threading.Thread(target=observer)
    watcher.start()
    notes: list[str] = []
    seen = confine.run_confined(str(root), binds, work, on_note=notes.append)
    watcher.join()
    return {
        **seen,
        "outside": outside,
        "caller_namespace_before": caller_before[0],
        "caller_namespace_after": thread_namespace(),
        "caller_mounts_unchanged": thread_mounts() == caller_before[1],
        "caller_cwd_unchanged": os.getcwd() == caller_before[2] != "/",
        "root_store_after": listing(root / "var/lib/cni/networks" / NETWORK),
        "host_before": host_before,
        "host_after": host_digest(),
        "notes": notes,
        "root": str(root),
    }


def untrusted_sources(workdir: Path) -> dict[str, Any]:
    """Sources a plugin must not be shown: the root's /var/lib/cni a symlink to the host's,
    its /run a symlink to the host's /run (a component above the source), its /etc/cni a
    file. The caller made none of them tmpfs: run_confined must."""
    make_host_state()
    root = workdir / "root"
    (root / "var/lib").mkdir(parents=True)
    (root / "var/lib/cni").symlink_to("/var/lib/cni")
    (root / "run").symlink_to("/run")
    (root / "etc").mkdir()
    (root / "etc/cni").write_text("not a directory")
    binds = confine.standard_binds(str(root))
    host_before = host_digest()
    notes: list[str] = []
    seen = confine.run_confined(str(root), binds, del_in_a_thread, on_note=notes.append)
    return {**seen, "notes": notes, "host_before": host_before, "host_after": host_digest()}


def refused_when_unprivileged(workdir: Path) -> dict[str, Any]:
    """Run with no capabilities, as nobody: the namespace cannot be made."""
    root = workdir / "root"
    ran: list[bool] = []
    try:
        confine.run_confined(str(root), confine.standard_binds(str(root)), lambda: ran.append(True))
    except confine.ConfineError as e:
        return {"error": str(e), "work_ran": bool(ran), "uid": os.getuid()}
    return {"error": None, "work_ran": bool(ran), "uid": os.getuid()}


def as_nobody(workdir: Path) -> dict[str, Any]:
    """refused_when_unprivileged, run by setpriv as uid 65534 with no capabilities; first the
    interpreter is made reachable for it in this namespace."""
    reachable_for_everyone(Path(sys.base_prefix), workdir / "prefix")
    nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    argv = [*nobody, sys.executable, "-m", "tests.confine_scenario", "refused", str(workdir)]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    child = subprocess.run(argv, capture_output=True, text=True, env=env)
    if child.returncode != 0:
        raise RuntimeError(f"the unprivileged run failed: {child.stderr}")
    result: dict[str, Any] = json.loads(child.stdout)
    return result


def reachable_for_everyone(prefix: Path, holder: Path) -> None:
    """pyenv installs under /root (mode 0700): for this namespace only, a tmpfs over the first
    directory others cannot search, with prefix bound back in at its own path."""
    blocking = next((d for d in reversed(prefix.parents) if not os.stat(d).st_mode & 0o001), None)
    if blocking is None:
        return
    holder.mkdir()
    subprocess.run(["mount", "--bind", str(prefix), str(holder)], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(blocking)], check=True)
    prefix.mkdir(parents=True)
    subprocess.run(["mount", "--bind", str(holder), str(prefix)], check=True)


def read_only_host(workdir: Path) -> dict[str, Any]:
    """Two dataDirs missing on the host: the first mount point can be made, the second cannot
    (its parent is a read-only file system). The run is refused and the first is removed."""
    make_host_state()
    read_only = Path("/run/cni-read-only")
    read_only.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(read_only)], check=True)
    root = make_root(workdir)
    made_here = Path("/run/cni-made-here")
    binds = confine.standard_binds(str(root), [str(made_here / "ipam"), str(read_only / "ipam")])
    ran: list[bool] = []
    mounts_before = thread_mounts()
    try:
        confine.run_confined(str(root), binds, lambda: ran.append(True))
    except confine.ConfineError as e:
        error: str | None = str(e)
    else:
        error = None
    return {
        "binds": [list(b) for b in binds],
        "error": error,
        "work_ran": bool(ran),
        "caller_mounts_unchanged": thread_mounts() == mounts_before,
        "made_here_left": made_here.exists(),
    }


def work_raises(workdir: Path) -> dict[str, Any]:
    make_host_state()
    root = make_root(workdir)
    namespace_before = thread_namespace()

    def work() -> None:
        raise LookupError(f"raised in {thread_namespace()}")

    try:
        confine.run_confined(str(root), confine.standard_binds(str(root)), work)
    except LookupError as e:
        return {
            "raised": type(e).__name__,
            "message": str(e),
            "caller_namespace_before": namespace_before,
            "caller_namespace_after": thread_namespace(),
            "threads_left": [t.name for t in threading.enumerate()],
        }
    return {"raised": None}


def interrupted(workdir: Path) -> dict[str, Any]:
    """SIGINT while the caller waits: cancel is set, the work still finishes before the
    caller sees the KeyboardInterrupt."""
    make_host_state()
    root = make_root(workdir)
    cancel = threading.Event()
    started = threading.Event()
    times: dict[str, float] = {}

    def work() -> None:
        started.set()
        times["cancel_seen"] = time.monotonic() if cancel.wait(30) else -1.0
        time.sleep(0.3)  # a plugin that takes a while to return after the stop
        times["work_done"] = time.monotonic()

    def interrupter() -> None:
        started.wait(30)
        time.sleep(0.1)
        times["interrupt_sent"] = time.monotonic()
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    threading.Thread(target=interrupter).start()
    try:
        confine.run_confined(str(root), confine.standard_binds(str(root)), work, cancel=cancel)
    except KeyboardInterrupt:
        times["caught"] = time.monotonic()
        alive = [t.name for t in threading.enumerate()]
        return {"interrupted": True, "times": times, "threads_at_catch": alive}
    return {"interrupted": False, "times": times}


def rescued_disk(workdir: Path) -> dict[str, Any]:
    """cni-reaper --root on a node's disk from a rescue machine that has the same reservation
    in its own store: the root's is released, the machine's never."""
    make_host_state()
    root = make_root(workdir)
    node = NodeTree(root)
    conflist = {"cniVersion": "0.4.0", "name": NETWORK, "plugins": list(HOST_LOCAL.plugins)}
    node.write_conf("10-confine.conflist", json.dumps(conflist).encode())
    node.write_result(f"{NETWORK}-{CONTAINER_ID}-eth0", b"")
    node.boot(time.time() - 600)
    node.write_boot_world(btime=time.time() - 1)
    host_before = host_digest()
    proc = reaper(root)
    return {
        "exit": proc.returncode,
        "stderr": proc.stderr,
        "report": json.loads(proc.stdout),
        "root_store_after": listing(root / "var/lib/cni/networks" / NETWORK),
        "host_before": host_before,
        "host_after": host_digest(),
    }


def reaper(root: Path, *prefix: str) -> subprocess.CompletedProcess[str]:
    from tests.private_node import reaper_command  # noqa: PLC0415 (imports pytest)

    argv = [*prefix, *reaper_command(), "--root", str(root), "--json", "--bin-dir", PLUGIN_DIR]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def rescued_disk_without_sys_admin(workdir: Path) -> dict[str, Any]:
    """The same run by root without CAP_SYS_ADMIN (dropped from the bounding set, as a
    container's root runs): no mount namespace can be made, so it is refused, nothing
    changed. (Not root at all is refused before this: tests/test_refusals.py.)"""
    make_host_state()
    root = make_root(workdir)
    node = NodeTree(root)
    node.write_result(f"{NETWORK}-{CONTAINER_ID}-eth0", b"")
    node.boot(time.time() - 600)
    node.write_boot_world(btime=time.time() - 1)
    proc = reaper(root, "setpriv", "--bounding-set=-sys_admin", "--inh-caps=-sys_admin")
    return {
        "exit": proc.returncode,
        "stderr": proc.stderr,
        "report": json.loads(proc.stdout) if proc.stdout.strip() else None,
        "results_after": listing(root / "var/lib/cni/results"),
        "root_store_after": listing(root / "var/lib/cni/networks" / NETWORK),
    }


# A dataDir missing on the host: each run makes it as a mount point, or finds it made.
SHARED_DATA_DIR = Path("/run/cni-made-here/ipam")


def two_runs_one_mount_point(workdir: Path) -> dict[str, Any]:
    """Two runs at once, on two roots whose network keeps its store in a dataDir missing on
    the host: the first makes the mount point, the second mounts on it while the first is
    still in, and the first is done first. Only then does the second run its DEL: the real
    host-local, in a thread of its namespace, as apply's workers do."""
    make_host_state()
    ipam = {"type": "host-local", "subnet": "10.99.0.0/24", "dataDir": str(SHARED_DATA_DIR)}
    netlist = HOST_LOCAL._replace(plugins=({"type": "host-local", "ipam": ipam},))
    roots = {name: workdir / name for name in ("first", "second")}
    for root in roots.values():
        store = root / SHARED_DATA_DIR.relative_to("/") / NETWORK
        store.mkdir(parents=True)
        (store / IP).write_text(RESERVATION)
    first_in, second_in, first_done = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, Any] = {}

    def binds(root: Path) -> tuple[confine.Bind, ...]:
        return confine.standard_binds(str(root), [str(SHARED_DATA_DIR)])

    def first_work() -> None:
        first_in.set()
        second_in.wait(30)

    def first_run() -> None:
        try:
            confine.run_confined(str(roots["first"]), binds(roots["first"]), first_work)
        finally:
            first_done.set()

    def second_work() -> None:
        second_in.set()
        first_done.wait(30)
        seen["first_done_first"] = first_done.is_set()

        def replay() -> None:
            outcome = delete(
                netlist, Attachment(CONTAINER_ID, "eth0"), ProcessRunner(), [PLUGIN_DIR], 10.0
            )
            seen["del_ok"], seen["del_errors"] = outcome.ok, [str(e) for e in outcome.errors]
            found = subprocess.run(
                ["ls", "-A", str(SHARED_DATA_DIR / NETWORK)], text=True, capture_output=True
            )
            seen["plugin_view"] = sorted(found.stdout.split())

        thread = threading.Thread(target=replay)
        thread.start()
        thread.join()

    first = threading.Thread(target=first_run)
    first.start()
    seen["first_in"] = first_in.wait(30)
    confine.run_confined(str(roots["second"]), binds(roots["second"]), second_work)
    first.join()
    return {
        **seen,
        "first_store_after": listing(roots["first"] / SHARED_DATA_DIR.relative_to("/") / NETWORK),
        "second_store_after": listing(roots["second"] / SHARED_DATA_DIR.relative_to("/") / NETWORK),
        "host_data_dir_after": listing(SHARED_DATA_DIR),
    }


# Attacks on the shared mount points: several runs at once, as a rescue box repairing several
# disks would start them. Every mount point made lies under /run, a tmpfs of this namespace.
MADE_HERE = Path("/run/cni-made-here")


def netlist_for(data_dir: Path) -> NetworkList:
    ipam = {"type": "host-local", "subnet": "10.99.0.0/24", "dataDir": str(data_dir)}
    return HOST_LOCAL._replace(plugins=({"type": "host-local", "ipam": ipam},))


def root_with_stores(workdir: Path, name: str, data_dirs: list[Path]) -> Path:
    """A node's disk holding the reservation in each of data_dirs (its own copies)."""
    root = workdir / name
    for data_dir in data_dirs:
        store = root / data_dir.relative_to("/") / NETWORK
        store.mkdir(parents=True, exist_ok=True)
        (store / IP).write_text(RESERVATION)
    root.mkdir(parents=True, exist_ok=True)
    return root


def store_of(root: Path, data_dir: Path) -> list[str] | None:
    return listing(root / data_dir.relative_to("/") / NETWORK)


def del_with_data_dir(data_dir: Path) -> dict[str, Any]:
    """The real host-local DEL with dataDir, in a thread of the namespace (as apply's workers)."""
    seen: dict[str, Any] = {}

    def replay() -> None:
        outcome = delete(
            netlist_for(data_dir),
            Attachment(CONTAINER_ID, "eth0"),
            ProcessRunner(),
            [PLUGIN_DIR],
            10.0,
        )
        seen["del_ok"], seen["del_errors"] = outcome.ok, [str(e) for e in outcome.errors]
        seen["plugin_view"] = listing(data_dir / NETWORK)

    thread = threading.Thread(target=replay)
    thread.start()
    thread.join()
    return seen


class StagedRun:
    """One run_confined in a thread of the caller's, whose work() waits to be let go: the
    scenario decides who is in, who does its DEL and who is done, in which order."""

    def __init__(
        self,
        root: Path,
        data_dirs: list[Path],
        del_in: Path | None = None,
        raises: BaseException | None = None,
    ) -> None:
        self.root, self.data_dirs, self.del_in, self.raises = root, data_dirs, del_in, raises
        self.inside, self.release = threading.Event(), threading.Event()
        self.done = threading.Event()
        self.seen: dict[str, Any] = {}
        self.error: str | None = None
        self.thread = threading.Thread(target=self.run)

    def binds(self) -> tuple[confine.Bind, ...]:
        return confine.standard_binds(str(self.root), [str(d) for d in self.data_dirs])

    def work(self) -> None:
        self.seen["ident"] = threading.get_ident()
        self.inside.set()
        self.seen["released"] = self.release.wait(30)
        if self.del_in is not None:
            self.seen.update(del_with_data_dir(self.del_in))
        if self.raises is not None:
            raise self.raises

    def run(self) -> None:
        try:
            confine.run_confined(str(self.root), self.binds(), self.work)
        except BaseException as e:  # judged by the test
            self.error = f"{type(e).__name__}: {e}"
        finally:
            self.done.set()

    def enter(self) -> bool:
        self.thread.start()
        return self.inside.wait(30)

    def finish(self) -> bool:
        self.release.set()
        self.thread.join(60)
        return self.done.is_set()

    def report(self) -> dict[str, Any]:
        return {
            **{k: v for k, v in self.seen.items() if k != "ident"},
            "error": self.error,
            "store_after": store_of(self.root, self.del_in) if self.del_in else None,
        }


def a_done_first(a: StagedRun, b: StagedRun) -> dict[str, Any]:
    """A in, then B; A done while B stands in; then B done. What each saw, and what the host
    holds of /run/cni-made-here while B is still in and after."""
    entered = [a.enter(), b.enter()]
    finished = [a.finish()]
    left_while_b_in = host_made_here()
    finished.append(b.finish())
    return {
        "entered": entered,
        "finished": finished,
        "a": a.report(),
        "b": b.report(),
        "left_while_b_in": left_while_b_in,
        "made_here_left": host_made_here(),
    }


def shared_run(workdir: Path, name: str) -> StagedRun:
    """A StagedRun on a root of its own whose one dataDir, SHARED_DATA_DIR, is missing on the
    host, its DEL done there."""
    root = root_with_stores(workdir, name, [SHARED_DATA_DIR])
    return StagedRun(root, [SHARED_DATA_DIR], del_in=SHARED_DATA_DIR)


def host_made_here() -> list[str]:
    """Every path left under /run/cni-made-here on the host, it included."""
    if not MADE_HERE.exists():
        return []
    return sorted([str(MADE_HERE)] + [str(p) for p in MADE_HERE.rglob("*")])


def three_runs_one_mount_point(workdir: Path) -> dict[str, Any]:
    """A makes the dataDir, B and C mount on it; A is done first, then B, then C: each DEL is
    run after every run before it was done, and must release in its own root."""
    make_host_state()
    runs = {
        name: StagedRun(
            root_with_stores(workdir, name, [SHARED_DATA_DIR]),
            [SHARED_DATA_DIR],
            del_in=SHARED_DATA_DIR,
        )
        for name in ("a", "b", "c")
    }
    entered = [runs[name].enter() for name in ("a", "b", "c")]
    finished = [runs[name].finish() for name in ("a", "b", "c")]
    return {
        "entered": entered,
        "finished": finished,
        "runs": {name: run.report() for name, run in runs.items()},
        "host_data_dir_after": listing(SHARED_DATA_DIR),
        "made_here_left": host_made_here(),
        "host_after": host_digest(),
    }


def maker_outlives_the_other(workdir: Path) -> dict[str, Any]:
    """A makes the dataDir, B mounts on it and is done first; A's DEL comes after, and A,
    done last, stood alone on what it made: nothing is left on the host."""
    make_host_state()
    a = StagedRun(
        root_with_stores(workdir, "a", [SHARED_DATA_DIR]), [SHARED_DATA_DIR], del_in=SHARED_DATA_DIR
    )
    b = shared_run(workdir, "b")
    entered = [a.enter(), b.enter()]
    finished = [b.finish(), a.finish()]
    return {
        "entered": entered,
        "finished": finished,
        "a": a.report(),
        "b": b.report(),
        "made_here_left": host_made_here(),
    }


INNER_DATA_DIR = MADE_HERE / "ipam"  # = SHARED_DATA_DIR


def nested(workdir: Path, outer_first: bool) -> dict[str, Any]:
    """One run's dataDir is a parent of the other's: /run/cni-made-here and /run/cni-made-here/ipam,
    both missing on the host. The one in first makes what it needs; the one in first is done
    first, and only then does the other run its DEL."""
    make_host_state()
    outer = StagedRun(
        root_with_stores(workdir, "outer", [MADE_HERE]), [MADE_HERE], del_in=MADE_HERE
    )
    inner = StagedRun(
        root_with_stores(workdir, "inner", [INNER_DATA_DIR]),
        [INNER_DATA_DIR],
        del_in=INNER_DATA_DIR,
    )
    first, second = (outer, inner) if outer_first else (inner, outer)
    entered = [first.enter(), second.enter()]
    finished = [first.finish()]
    left_while_second_in = host_made_here()
    finished.append(second.finish())
    return {
        "entered": entered,
        "finished": finished,
        "outer": outer.report(),
        "inner": inner.report(),
        "left_while_second_in": left_while_second_in,
        "made_here_left": host_made_here(),
    }


def nested_outer_first(workdir: Path) -> dict[str, Any]:
    return nested(workdir, outer_first=True)


def nested_inner_first(workdir: Path) -> dict[str, Any]:
    return nested(workdir, outer_first=False)


def work_raises_while_another_stands(workdir: Path) -> dict[str, Any]:
    """The run that made the mount point fails (work raises) while another stands on it."""
    make_host_state()
    a = StagedRun(
        root_with_stores(workdir, "a", [SHARED_DATA_DIR]),
        [SHARED_DATA_DIR],
        raises=LookupError("work failed"),
    )
    b = shared_run(workdir, "b")
    return a_done_first(a, b)


def interrupted_while_another_stands(workdir: Path) -> dict[str, Any]:
    """The maker runs in the main thread and is interrupted (SIGINT) while another run stands
    on what it made; the other's DEL comes after the maker's KeyboardInterrupt."""
    make_host_state()
    root_a = root_with_stores(workdir, "a", [SHARED_DATA_DIR])
    b = shared_run(workdir, "b")
    cancel, a_in, b_in = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, Any] = {}

    def starter() -> None:
        """B is started from a thread of the caller's: one started by A's work would be in A's
        namespace, and B's would be a copy of it."""
        if a_in.wait(30):
            seen["b_entered"] = b.enter()
        b_in.set()

    def a_work() -> None:
        a_in.set()
        b_in.wait(30)
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)
        seen["cancel_seen"] = cancel.wait(30)

    threading.Thread(target=starter).start()

    binds = confine.standard_binds(str(root_a), [str(SHARED_DATA_DIR)])
    try:
        confine.run_confined(str(root_a), binds, a_work, cancel=cancel)
    except KeyboardInterrupt:
        seen["a_interrupted"] = True
    seen["left_while_b_in"] = host_made_here()
    seen["b_finished"] = b.finish()
    return {**seen, "b": b.report(), "made_here_left": host_made_here()}


def racing_mkdir(workdir: Path) -> dict[str, Any]:
    """Two runs make the same missing mount points at the same moment: each os.mkdir of
    /run/cni-made-here and of /run/cni-made-here/ipam waits for the other run's, so one of the two
    gets FileExistsError. Then one is done (DEL after DEL), then the other."""
    make_host_state()
    real_mkdir = os.mkdir
    barriers = {str(MADE_HERE): threading.Barrier(2), str(SHARED_DATA_DIR): threading.Barrier(2)}
    waited: set[tuple[int, str]] = set()
    calls: list[tuple[int, str, str]] = []
    lock = threading.Lock()

    def racing(path: Any, *args: Any, **kwargs: Any) -> None:
        key = (threading.get_ident(), str(path))
        with lock:
            first_time = key not in waited and str(path) in barriers
            waited.add(key)
        if first_time:
            with contextlib.suppress(threading.BrokenBarrierError):
                barriers[str(path)].wait(5)
        try:
            real_mkdir(path, *args, **kwargs)
        except OSError as e:
            calls.append((threading.get_ident(), str(path), type(e).__name__))
            raise
        calls.append((threading.get_ident(), str(path), "made"))

    os.mkdir = racing
    try:
        a = shared_run(workdir, "a")
        b = shared_run(workdir, "b")
        a.thread.start()
        b.thread.start()
        entered = [a.inside.wait(30), b.inside.wait(30)]
        finished = [a.finish()]
        left_while_b_in = host_made_here()
        finished.append(b.finish())
    finally:
        os.mkdir = real_mkdir
    names = {a.seen.get("ident"): "a", b.seen.get("ident"): "b"}
    return {
        "entered": entered,
        "finished": finished,
        "a": a.report(),
        "b": b.report(),
        "mkdir": [
            (names.get(ident, "?"), path, what)
            for ident, path, what in calls
            if path.startswith(str(MADE_HERE))
        ],
        "left_while_b_in": left_while_b_in,
        "made_here_left": host_made_here(),
    }


def split_chain(workdir: Path) -> dict[str, Any]:
    """The race of racing_mkdir, made to come out one way: A makes /run/cni-made-here, B makes
    /run/cni-made-here/ipam in it just before A would (A's mkdir: FileExistsError). A is done
    first (B stands on ipam), then B: no run stands anywhere any more."""
    make_host_state()
    real_mkdir = os.mkdir
    a_ident: list[int] = []
    a_at_ipam, b_made_ipam = threading.Event(), threading.Event()
    calls: list[tuple[str, str, str]] = []

    def ordered(path: Any, *args: Any, **kwargs: Any) -> None:
        me = threading.get_ident()
        if str(path) == str(MADE_HERE) and not a_ident:
            a_ident.append(me)
        who = "a" if a_ident and me == a_ident[0] else "b"
        if str(path) == str(SHARED_DATA_DIR) and who == "a" and not a_at_ipam.is_set():
            a_at_ipam.set()
            b_made_ipam.wait(10)
        try:
            real_mkdir(path, *args, **kwargs)
        except OSError as e:
            if str(path).startswith(str(MADE_HERE)):
                calls.append((who, str(path), type(e).__name__))
            raise
        if str(path).startswith(str(MADE_HERE)):
            calls.append((who, str(path), "made"))
        if str(path) == str(SHARED_DATA_DIR) and who == "b":
            b_made_ipam.set()

    os.mkdir = ordered
    try:
        a = shared_run(workdir, "a")
        b = shared_run(workdir, "b")
        a.thread.start()
        a_at_ipam.wait(30)
        entered = [b.enter(), a.inside.wait(30)]
        finished = [a.finish()]
        left_while_b_in = host_made_here()
        finished.append(b.finish())
    finally:
        os.mkdir = real_mkdir
    return {
        "entered": entered,
        "finished": finished,
        "a": a.report(),
        "b": b.report(),
        "mkdir": calls,
        "left_while_b_in": left_while_b_in,
        "made_here_left": host_made_here(),
    }


def symlinked_host_paths(workdir: Path) -> dict[str, Any]:
    """The host's own symlinks: a dataDir that is a symlink to a directory holding a decoy
    reservation, and a missing dataDir under a symlinked parent. Plugins must see the root's
    store at both (as before the fix, when the mount went through the symlink), the host's
    decoy stays, and the directory made through the symlink is removed again."""
    make_host_state()
    real, linked = Path("/run/cni-real-data"), Path("/run/cni-linked-data")
    (real / NETWORK).mkdir(parents=True)
    (real / NETWORK / IP).write_text(RESERVATION)
    linked.symlink_to(real)
    real_parent, linked_parent = Path("/run/cni-real-parent"), Path("/run/cni-linked-parent")
    real_parent.mkdir()
    linked_parent.symlink_to(real_parent)
    under_link = linked_parent / "ipam"
    results: dict[str, Any] = {}
    for name, data_dir in (("linked", linked), ("under_link", under_link)):
        root = root_with_stores(workdir, name, [data_dir])
        run = StagedRun(root, [data_dir], del_in=data_dir)
        run.release.set()
        run.run()
        results[name] = run.report()
    return {
        **results,
        "host_decoy": (real / NETWORK / IP).read_text(),
        "real_parent_after": listing(real_parent),
        "linked_is_symlink": linked.is_symlink() and linked_parent.is_symlink(),
    }


def host_mount_point_target(workdir: Path) -> dict[str, Any]:
    """A dataDir that is a mount point on the host itself (a tmpfs, with a decoy)."""
    make_host_state()
    mounted = Path("/run/cni-mounted-data")
    mounted.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mounted)], check=True)
    (mounted / NETWORK).mkdir()
    (mounted / NETWORK / IP).write_text(RESERVATION)
    run = StagedRun(root_with_stores(workdir, "a", [mounted]), [mounted], del_in=mounted)
    run.release.set()
    run.run()
    still = subprocess.run(["findmnt", "-n", str(mounted)], capture_output=True, text=True)
    return {
        "run": run.report(),
        "host_decoy": (mounted / NETWORK / IP).read_text(),
        "still_mounted": bool(still.stdout.strip()),
    }


def parent_removed_while_making(workdir: Path) -> dict[str, Any]:
    """Someone removes /run/cni-made-here just as the run is making /run/cni-made-here/ipam in it:
    once (the run makes both again and goes on), then every time (refused, in bounded time)."""
    make_host_state()
    confine.MOUNT_POINT_WAIT = 1.0
    real_mkdir = os.mkdir
    removals = {"left": 1}

    def removing(path: Any, *args: Any, **kwargs: Any) -> None:
        if str(path) == str(SHARED_DATA_DIR) and removals["left"] != 0:
            removals["left"] -= 1
            os.rmdir(MADE_HERE)
        real_mkdir(path, *args, **kwargs)

    os.mkdir = removing
    out: dict[str, Any] = {}
    try:
        once = shared_run(workdir, "once")
        once.release.set()
        once.run()
        out["once"] = once.report()
        out["left_after_once"] = host_made_here()
        removals["left"] = -1  # every time
        fds_before = sorted(os.listdir("/proc/self/fd"))
        always = shared_run(workdir, "always")
        always.release.set()
        started = time.monotonic()
        always.run()
        out["always_seconds"] = time.monotonic() - started
        out["always"] = always.report()
        out["always_work_ran"] = "released" in always.seen
        out["fds_leaked"] = sorted(set(os.listdir("/proc/self/fd")) - set(fds_before))
        out["left_after_always"] = host_made_here()
    finally:
        os.mkdir = real_mkdir
    return out


def my_locks() -> list[str]:
    with open("/proc/locks") as f:
        return [line for line in f.read().splitlines() if f" {os.getpid()} " in line]


def no_fd_or_lock_left(workdir: Path) -> dict[str, Any]:
    """Descriptors of this process and flocks it holds, before and after runs that succeed,
    whose work raises, that are refused while making a mount point, that find a mount point
    exclusively held: none is left, and every mount point can be locked exclusively after."""
    make_host_state()
    confine.MOUNT_POINT_WAIT = 0.5
    read_only = Path("/run/cni-read-only")
    read_only.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(read_only)], check=True)
    held = MADE_HERE / "held"
    held.mkdir(parents=True)
    import fcntl  # noqa: PLC0415

    blocker = os.open(held, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(blocker, fcntl.LOCK_EX)
    fds_before = sorted(os.listdir("/proc/self/fd"))
    locks_before = my_locks()
    outcomes: dict[str, str | None] = {}
    cases = {
        "ok": ([SHARED_DATA_DIR], None),
        "raises": ([SHARED_DATA_DIR], LookupError("boom")),
        "read_only": ([SHARED_DATA_DIR, read_only / "ipam"], None),
        "held_exclusively": ([SHARED_DATA_DIR, held], None),
    }
    seconds: dict[str, float] = {}
    for name, (data_dirs, raises) in cases.items():
        run = StagedRun(root_with_stores(workdir, name, data_dirs), data_dirs, raises=raises)
        run.release.set()
        started = time.monotonic()
        run.run()
        seconds[name] = time.monotonic() - started
        outcomes[name] = run.error
    fds_after = sorted(os.listdir("/proc/self/fd"))
    locks_after = my_locks()
    os.close(blocker)
    lockable: dict[str, bool] = {}
    for path in ("/var/lib/cni", "/etc/cni", "/run/netns", "/run/cni", str(held)):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            lockable[path] = True
        except BlockingIOError:
            lockable[path] = False
        finally:
            os.close(fd)
    return {
        "outcomes": outcomes,
        "seconds": seconds,
        "fds_leaked": sorted(set(fds_after) - set(fds_before)),
        "locks_before": locks_before,
        "locks_after": locks_after,
        "lockable_after": lockable,
        "made_here_left": host_made_here(),
    }


def dangling_symlink_target(workdir: Path) -> dict[str, Any]:
    """A dataDir that is a dangling symlink on the host, and one under a dangling symlink:
    refused with ConfineError, and in bounded time."""
    make_host_state()
    dangling = Path("/run/cni-dangling")
    dangling.symlink_to("/run/cni-nowhere")
    out: dict[str, Any] = {"wait": confine.MOUNT_POINT_WAIT}
    for name, data_dir in (("dangling", dangling), ("under_dangling", dangling / "ipam")):
        run = StagedRun(root_with_stores(workdir, name, [data_dir]), [data_dir], del_in=data_dir)
        run.release.set()
        started = time.monotonic()
        run.run()
        out[name] = {
            "seconds": time.monotonic() - started,
            "error": run.error,
            "work_ran": "released" in run.seen,
        }
    out["nowhere_made"] = os.path.lexists("/run/cni-nowhere")
    return out


def left_behind_when_none_stands(workdir: Path) -> dict[str, Any]:
    """A has two dataDirs, /run/cni-made-here/a and /run/cni-made-here/b, both missing; B has only
    /run/cni-made-here/b. A makes both, B mounts on b, A is done first: b stays for B, but no run
    ever stands on a again, and it must not be left on the host."""
    make_host_state()
    only_a, shared = MADE_HERE / "a", MADE_HERE / "b"
    a = StagedRun(root_with_stores(workdir, "a", [only_a, shared]), [only_a, shared], del_in=only_a)
    b = StagedRun(root_with_stores(workdir, "b", [shared]), [shared], del_in=shared)
    return a_done_first(a, b)


def many_runs_at_random(workdir: Path) -> dict[str, Any]:
    """Six runs, five rounds each, on one missing dataDir, in and out at random moments, each
    DEL at a random moment inside: every DEL releases in its own root, nothing else happens."""
    import random  # noqa: PLC0415

    make_host_state()
    rng = random.Random(3300)  # noqa: S311 (the runs' timing, not a secret)
    failures: list[str] = []
    lock = threading.Lock()

    def one(name: str, delays: list[float]) -> None:
        for round_ in range(5):
            root = workdir / f"{name}-{round_}"
            root_with_stores(workdir, root.name, [SHARED_DATA_DIR])

            def work(
                before: float = delays[2 * round_], after: float = delays[2 * round_ + 1]
            ) -> dict[str, Any]:
                time.sleep(before)
                seen = del_with_data_dir(SHARED_DATA_DIR)
                time.sleep(after)
                return seen

            try:
                binds = confine.standard_binds(str(root), [str(SHARED_DATA_DIR)])
                seen = confine.run_confined(str(root), binds, work)
            except BaseException as e:
                with lock:
                    failures.append(f"{root.name}: {type(e).__name__}: {e}")
                continue
            after = store_of(root, SHARED_DATA_DIR)
            if not seen["del_ok"] or after != ["lock"]:
                with lock:
                    failures.append(f"{root.name}: del_ok={seen['del_ok']} store_after={after}")

    threads = [
        threading.Thread(target=one, args=(f"r{n}", [rng.uniform(0, 0.03) for _ in range(10)]))
        for n in range(6)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return {
        "failures": failures,
        "host_data_dir_after": listing(SHARED_DATA_DIR),
        "made_here_left": host_made_here(),
        "host_after": host_digest(),
        "host_before": {
            str(p): RESERVATION if p.parent == HOST_STORE else "host decoy" for p in HOST_DECOYS
        },
    }


def marked_in_another_boot(workdir: Path) -> dict[str, Any]:
    """/run/cni-made-here/ipam is on the host already, left to the others by a run, but in another
    boot (a persistent file system keeps the mark, and what it names may be anyone's since). A
    run stands on it and is done: it made neither, and the mark is not this boot's: both stay."""
    make_host_state()
    SHARED_DATA_DIR.mkdir(parents=True)
    for path in (MADE_HERE, SHARED_DATA_DIR):
        os.setxattr(path, confine.LEFT_MARK, b"00000000-another-boot", follow_symlinks=False)
    run = shared_run(workdir, "a")
    entered, finished = run.enter(), run.finish()
    return {
        "entered": entered,
        "finished": finished,
        "a": run.report(),
        "made_here_left": host_made_here(),
    }


UNMARKABLE = Path("/run/cni-no-marks")  # a ramfs: it keeps no extended attribute


def unmarkable_mount_points(workdir: Path) -> dict[str, Any]:
    """The shared dataDir's parent keeps no extended attributes (a ramfs): A makes the mount
    points, B stands on them, A is done first, then B. Unmarked, they are only A's to remove,
    and A could not while B stood on them: they stay, empty, as before marks."""
    make_host_state()
    UNMARKABLE.mkdir()
    subprocess.run(["mount", "-t", "ramfs", "ramfs", str(UNMARKABLE)], check=True)
    data_dir = UNMARKABLE / "made/ipam"
    a, b = (
        StagedRun(root_with_stores(workdir, name, [data_dir]), [data_dir], del_in=data_dir)
        for name in ("a", "b")
    )
    entered = [a.enter(), b.enter()]
    finished = [a.finish(), b.finish()]
    return {
        "entered": entered,
        "finished": finished,
        "a": a.report(),
        "b": b.report(),
        "left": sorted(str(p) for p in UNMARKABLE.rglob("*")),
    }


@contextlib.contextmanager
def service_mounted_on(path: Path) -> Iterator[tuple[str, Callable[[], str]]]:
    """A service that mounts a tmpfs on path in a mount namespace of its own and writes
    "live" in it: what it said once up, and what it sees there when asked; killed after."""
    service = subprocess.Popen(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f"mount -t tmpfs service {path} && echo live > {path}/service"
            " && echo up && exec sleep 60",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )

    def sees() -> str:
        found = subprocess.run(
            ["nsenter", "-t", str(service.pid), "-m", "cat", f"{path}/service"],
            capture_output=True,
            text=True,
        )
        return found.stdout.strip()

    try:
        yield (service.stdout.readline().strip() if service.stdout else ""), sees
    finally:
        service.kill()
        service.wait()


def crashed_maker_not_adopted(workdir: Path) -> dict[str, Any]:
    """A run is killed (SIGKILL) while it stands on /run/cni-made-here/ipam, which it made: the
    dir stays on the host, empty. A service then mounts on it in a mount namespace of its own
    (as systemd's BindPaths= or an `unshare -m` tool would). A later run on another root
    stands on it and is done: it must not remove it, which would detach the service's mount."""
    make_host_state()
    crashed = root_with_stores(workdir, "crashed", [SHARED_DATA_DIR])
    code = (
        "import os, signal\n"
        "from cni_reaper.repair import confine\n"
        f"binds = confine.standard_binds({str(crashed)!r}, [{str(SHARED_DATA_DIR)!r}])\n"
        f"confine.run_confined({str(crashed)!r}, binds, "
        "lambda: os.kill(os.getpid(), signal.SIGKILL))\n"
    )
    killed = subprocess.run([sys.executable, "-c", code], cwd=Path.cwd(), check=False)
    left_by_the_crash = host_made_here()
    with service_mounted_on(SHARED_DATA_DIR) as (up, service_sees):
        later = shared_run(workdir, "later")
        entered, finished = later.enter(), later.finish()
        sees = service_sees()
    return {
        "killed_status": killed.returncode,
        "left_by_the_crash": left_by_the_crash,
        "service_up": up,
        "entered": entered,
        "finished": finished,
        "later": later.report(),
        "service_sees": sees,
        "made_here_left": host_made_here(),
    }


def killed_stander_not_adopted(workdir: Path) -> dict[str, Any]:
    """A makes /run/cni-made-here/ipam; B, a process of its own, stands on it; A is done: it
    leaves the dir to B (marked), which it cannot remove while B stands there. B is killed
    (SIGKILL). A service then mounts on the dir in a mount namespace of its own; a later run,
    C, stands on it and is done. The mark was there before C came: not C's to act on."""
    make_host_state()
    a = shared_run(workdir, "a")
    b_root = root_with_stores(workdir, "b", [SHARED_DATA_DIR])
    go = workdir / "kill-b"
    code = (
        "import os, signal, time\n"
        "from cni_reaper.repair import confine\n"
        f"binds = confine.standard_binds({str(b_root)!r}, [{str(SHARED_DATA_DIR)!r}])\n"
        "def work():\n"
        "    print('in', flush=True)\n"
        f"    while not os.path.exists({str(go)!r}):\n"
        "        time.sleep(0.01)\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        f"confine.run_confined({str(b_root)!r}, binds, work)\n"
    )
    seen: dict[str, Any] = {"a_in": a.enter()}
    b = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    seen["b_in"] = b.stdout.readline().strip() if b.stdout else ""
    seen["a_finished"] = a.finish()
    seen["a"] = a.report()
    seen["left_after_a"] = host_made_here()
    go.touch()
    seen["b_status"] = b.wait(30)
    with service_mounted_on(SHARED_DATA_DIR) as (up, service_sees):
        seen["service_up"] = up
        c = shared_run(workdir, "c")
        seen["c_in"], seen["c_finished"] = c.enter(), c.finish()
        seen["c"] = c.report()
        seen["service_sees"] = service_sees()
    return {**seen, "made_here_left": host_made_here()}


def service_mounts_while_a_run_stands(workdir: Path) -> dict[str, Any]:
    """A run makes /run/cni-made-here/ipam and stands on it; a service mounts on it meanwhile, in
    a mount namespace of its own. The run is done: the rmdir would detach the service's mount
    there, so the dir stays, and the service keeps its mount."""
    make_host_state()
    run = shared_run(workdir, "a")
    seen: dict[str, Any] = {"entered": run.enter()}
    with service_mounted_on(SHARED_DATA_DIR) as (up, service_sees):
        seen["service_up"] = up
        seen["finished"] = run.finish()
        seen["a"] = run.report()
        seen["service_sees"] = service_sees()
    return {**seen, "made_here_left": host_made_here()}


def finishing_together(workdir: Path) -> dict[str, Any]:
    """A's dataDir is /run/cni-made-here/a, B's /run/cni-made-here/b; A made
    /run/cni-made-here. A is done first: it removes a, and its rmdir of /run/cni-made-here
    fails (b is in it) while it holds that dir exclusively; B is done just then, removes b
    and finds /run/cni-made-here held. B waits for A's moment to pass, and removes it:
    nothing is left."""
    make_host_state()
    a_dir, b_dir = MADE_HERE / "a", MADE_HERE / "b"
    a = StagedRun(root_with_stores(workdir, "a", [a_dir]), [a_dir], del_in=a_dir)
    b = StagedRun(root_with_stores(workdir, "b", [b_dir]), [b_dir], del_in=b_dir)
    real_rmdir = os.rmdir
    a_failed = threading.Event()

    def held_a_moment(path: Any, *args: Any, **kwargs: Any) -> None:
        dir_fd = kwargs.get("dir_fd")
        where = os.readlink(f"/proc/self/fd/{dir_fd}") if dir_fd is not None else ""
        try:
            real_rmdir(path, *args, **kwargs)
        except OSError:
            if threading.current_thread() is a.thread and os.path.join(where, path) == str(
                MADE_HERE
            ):
                a_failed.set()
                time.sleep(confine.REMOVAL_WAIT / 2)  # still holding /run/cni-made-here
            raise

    os.rmdir = held_a_moment
    try:
        entered = [a.enter(), b.enter()]
        a.release.set()
        a_failed_in_time = a_failed.wait(30)
        finished = [b.finish(), a.finish()]
    finally:
        os.rmdir = real_rmdir
    return {
        "entered": entered,
        "finished": finished,
        "a_failed_in_time": a_failed_in_time,
        "a": a.report(),
        "b": b.report(),
        "made_here_left": host_made_here(),
    }


def symlink_swapped_before_rmdir(workdir: Path) -> dict[str, Any]:
    """The dataDir is reached through a host symlink, /run/cni-made-here/link -> real1, followed
    as every host symlink on a mount point's way is. The run makes real1/ipam; when it
    removes it, the link has just been turned to real2, which holds the admin's own empty
    ipam: the run removes the dir it made, never the admin's."""
    make_host_state()
    (MADE_HERE / "real1").mkdir(parents=True)
    (MADE_HERE / "real2/ipam").mkdir(parents=True)
    link = MADE_HERE / "link"
    link.symlink_to("real1")
    data_dir = link / "ipam"
    run = StagedRun(root_with_stores(workdir, "a", [data_dir]), [data_dir], del_in=data_dir)
    real_rmdir = os.rmdir
    swapped: list[str] = []

    def swapping(path: Any, *args: Any, **kwargs: Any) -> None:
        if not swapped and str(path).endswith("ipam"):
            link.unlink()
            link.symlink_to("real2")
            swapped.append(str(path))
        real_rmdir(path, *args, **kwargs)

    os.rmdir = swapping
    try:
        entered, finished = run.enter(), run.finish()
    finally:
        os.rmdir = real_rmdir
    return {
        "entered": entered,
        "finished": finished,
        "swapped": swapped,
        "a": run.report(),
        "made_here_left": host_made_here(),
    }


CASES: dict[str, Callable[[Path], dict[str, Any]]] = {
    "crashed-maker-not-adopted": crashed_maker_not_adopted,
    "killed-stander-not-adopted": killed_stander_not_adopted,
    "service-mounts-while-a-run-stands": service_mounts_while_a_run_stands,
    "finishing-together": finishing_together,
    "symlink-swapped-before-rmdir": symlink_swapped_before_rmdir,
    "marked-in-another-boot": marked_in_another_boot,
    "unmarkable-mount-points": unmarkable_mount_points,
    "three-runs-one-mount-point": three_runs_one_mount_point,
    "maker-outlives-the-other": maker_outlives_the_other,
    "nested-outer-first": nested_outer_first,
    "nested-inner-first": nested_inner_first,
    "work-raises-while-another-stands": work_raises_while_another_stands,
    "interrupted-while-another-stands": interrupted_while_another_stands,
    "racing-mkdir": racing_mkdir,
    "split-chain": split_chain,
    "symlinked-host-paths": symlinked_host_paths,
    "host-mount-point-target": host_mount_point_target,
    "parent-removed-while-making": parent_removed_while_making,
    "no-fd-or-lock-left": no_fd_or_lock_left,
    "dangling-symlink-target": dangling_symlink_target,
    "left-behind-when-none-stands": left_behind_when_none_stands,
    "many-runs-at-random": many_runs_at_random,
    "two-runs-one-mount-point": two_runs_one_mount_point,
    "rescued-disk": rescued_disk,
    "rescued-disk-without-sys-admin": rescued_disk_without_sys_admin,
    "release-in-root": release_in_root,
    "untrusted-sources": untrusted_sources,
    "unprivileged": as_nobody,
    "refused": refused_when_unprivileged,
    "read-only-host": read_only_host,
    "work-raises": work_raises,
    "interrupted": interrupted,
}


if __name__ == "__main__":
    case, workdir = sys.argv[1], Path(sys.argv[2])
    print(json.dumps(CASES[case](workdir)))
