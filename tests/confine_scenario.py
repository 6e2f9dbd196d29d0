"""run_confined with real mounts, inside a private mount namespace; run by test_confine.py.

Usage: unshare --mount --propagation private python -m tests.confine_scenario CASE WORKDIR

Before a case runs, the "host" CNI state (/var/lib/cni, /etc/cni, /run) is a tmpfs of this
namespace, holding decoys: whatever run_confined gets wrong lands there, never on the machine.
Each case prints what it saw as one JSON document on stdout, for the test to judge.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cni_reaper import confine
from cni_reaper.netconf import NetworkList
from cni_reaper.plugin import ProcessRunner
from cni_reaper.replay import Attachment, DelOutcome, delete
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
    read_only = Path("/run/read-only")
    read_only.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(read_only)], check=True)
    root = make_root(workdir)
    made_here = Path("/run/made-here")
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
SHARED_DATA_DIR = Path("/run/made-here/ipam")


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


CASES: dict[str, Callable[[Path], dict[str, Any]]] = {
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
