#!/usr/bin/python3
"""The scenario steps inside the booted guest, run by vmtest.service after multi-user.target.

The step comes from the kernel command line (vmtest.mode=...). Everything the host needs to
judge goes to /dev/console as lines "VMTEST-JSON <one JSON object>"; the console is written
synchronously, so what was said before a crash is in the serial log.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import json
import os
import random
import shutil
import sqlite3
import struct
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tests.cri import CriError, RuntimeClient

SOCKET = "/run/containerd/containerd.sock"
PAUSE = Path(__file__).with_name("pause.tar")
RESULTS = Path("/var/lib/cni/results")
STORE = Path("/var/lib/cni/networks/podnet")
# The crash campaign's networks: every pod on both (containerd-campaign.toml), as eth0 and eth1.
NETWORKS = ("podnet", "ptpnet")
CAMPAIGN = Path(__file__).with_name("campaign")
QUARANTINE = Path("/var/lib/cni-reaper/quarantine")
MARKER = Path("/var/lib/cni-reaper/clean-shutdown")
CGROUP_PARENT = "/vmtest-pods"
# The timing boot's extra results files (vmtest.results=N in boot 1), and the flag that lets
# vmtest-floor*.service run in the boots after it.
BULK_FLAG = Path("/var/lib/vmtest/bulk")
FLOOR_FILES = Path("/run/vmtest-floor-files")
TIMING_PROPS = (
    "LoadState,ActiveState,Result,ExecMainStatus,InactiveExitTimestampMonotonic,"
    "ExecMainStartTimestampMonotonic,ExecMainExitTimestampMonotonic,"
    "ActiveEnterTimestampMonotonic,CPUUsageNSec"
)


def say(kind: str, **facts: Any) -> None:
    line = "VMTEST-JSON " + json.dumps({"kind": kind, **facts}, sort_keys=True) + "\n"
    with open("/dev/console", "w") as console:
        console.write(line)
        console.flush()


def kernel_arg(name: str) -> str:
    for word in Path("/proc/cmdline").read_text().split():
        if word.startswith(f"vmtest.{name}="):
            return word.split("=", 1)[1]
    return ""


def mode() -> str:
    return kernel_arg("mode")


def client() -> RuntimeClient:
    deadline = time.monotonic() + 120
    runtime = RuntimeClient(SOCKET, timeout=120)
    while True:
        try:
            runtime.version()
            return runtime
        except CriError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def bulk_names() -> set[str]:
    """The extra results files of the timing boot, by name (none in other scenarios)."""
    if not BULK_FLAG.exists():
        return set()
    return set(BULK_FLAG.read_text().split())


def files(directory: Path) -> dict[str, int]:
    """Every file of the dir but the timing boot's extra results files (bulk(), on its own)."""
    if not directory.is_dir():
        return {}
    skip = bulk_names()
    return {
        p.name: p.stat().st_size
        for p in sorted(directory.iterdir())
        if p.is_file() and p.name not in skip
    }


def bulk() -> dict[str, Any]:
    """How many of the extra results files are there, and one digest of their names and bytes:
    equal before and after a boot when none was touched."""
    digest = hashlib.sha256()
    count = 0
    for name in sorted(bulk_names()):
        path = RESULTS / name
        if path.is_file():
            count += 1
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return {"count": count, "sha256": digest.hexdigest()}


def write_bulk(count: int) -> None:
    """count more valid cache entries of podnet, for the next boot's reaper and floor program:
    more attachments (net1, net2, ...) of the sandboxes running now, each made from the entry
    the runtime's libcni wrote for the sandbox's eth0 (another ifname and address). Of sandboxes
    containerd has records of, so that the reaper keeps them; a sandbox it does not know would
    be forgotten (DEL and quarantine), which is not the clean boot measured here."""
    templates = [
        json.loads(p.read_bytes())
        for p in sorted(RESULTS.iterdir())
        if p.name.startswith("podnet-") and p.name.endswith("-eth0")
    ]
    names = []
    for n in range(count):
        doc = json.loads(json.dumps(templates[n % len(templates)]))
        ifname = f"net{1 + n // len(templates)}"
        doc["ifName"] = ifname
        for interface in doc["result"].get("interfaces", []):
            if interface.get("sandbox"):
                interface["name"] = ifname
        for ip in doc["result"].get("ips", []):
            ip["address"] = f"10.88.{1 + n // 250}.{2 + n % 250}/24"
        name = f"podnet-{doc['containerId']}-{ifname}"
        (RESULTS / name).write_bytes(json.dumps(doc, separators=(",", ":")).encode())
        names.append(name)
    BULK_FLAG.parent.mkdir(parents=True, exist_ok=True)
    BULK_FLAG.write_text("\n".join(names) + "\n")
    os.sync()


def quarantined() -> list[str]:
    if not QUARANTINE.is_dir():
        return []
    return sorted(str(p.relative_to(QUARANTINE)) for p in QUARANTINE.rglob("*") if p.is_file())


def reserved() -> dict[str, str]:
    if not STORE.is_dir():
        return {}
    return {p.name: p.read_text() for p in STORE.iterdir() if p.name[0].isdigit() and p.is_file()}


def run_pods(runtime: RuntimeClient, names: list[str], pods: list[dict[str, Any]]) -> None:
    for name in names:
        sandbox_id = runtime.run_pod_sandbox(name, str(uuid.uuid4()), CGROUP_PARENT, 0)
        status = runtime.pod_sandbox_status(sandbox_id)
        pods.append({"name": name, "id": sandbox_id, "ip": status.ip})


def import_pause_image() -> None:
    ctr = ["ctr", "--namespace", "k8s.io", "images", "import", str(PAUSE)]
    for _ in range(3):
        if subprocess.run(ctr, capture_output=True).returncode == 0:
            return
        time.sleep(1)
    raise RuntimeError("ctr images import failed")


def setup_crash() -> None:
    """Pods, some synced, some past the ext4 commit interval, some in flight: then a crash."""
    runtime = client()
    import_pause_image()
    pods: list[dict[str, Any]] = []
    run_pods(runtime, ["synced-0", "synced-1"], pods)
    os.sync()
    run_pods(runtime, ["committed-0", "committed-1"], pods)
    # Past the ext4 commit interval (5 s) and far from writeback (30 s): these cache files'
    # metadata is on disk, their data is not.
    time.sleep(8)
    say("pods", pods=pods, results=files(RESULTS), reserved=reserved())
    in_flight: list[dict[str, Any]] = []
    threading.Thread(
        target=run_pods,
        args=(runtime, ["flight-0", "flight-1", "flight-2"], in_flight),
        daemon=True,
    ).start()
    time.sleep(1.5)
    say("crashing", in_flight=[pod["name"] for pod in in_flight])
    # The serial console drains asynchronously: let the line out before the kernel dies.
    time.sleep(0.3)
    Path("/proc/sys/kernel/sysrq").write_text("1\n")
    Path("/proc/sysrq-trigger").write_text("c\n")


def setup_clean() -> None:
    runtime = client()
    import_pause_image()
    pods: list[dict[str, Any]] = []
    run_pods(runtime, ["clean-0", "clean-1", "clean-2"], pods)
    say("pods", pods=pods, results=files(RESULTS), reserved=reserved())
    # In the middle of the boot, an operator restarts the unit: its ExecStop runs, though the
    # boot goes on. The runtime answers, so the new run refuses and changes nothing.
    restart = subprocess.run(
        ["systemctl", "restart", "cni-reaper.service"], capture_output=True, text=True
    )
    say(
        "restarted",
        exit=restart.returncode,
        stderr=restart.stderr,
        reaper=unit("cni-reaper.service"),
        marker=MARKER.exists(),
        results=files(RESULTS),
        reserved=reserved(),
    )
    count = int(kernel_arg("results") or 0)
    if count:
        write_bulk(count)
        say("bulk", **bulk())


def boot_records() -> dict[str, Any]:
    """What the node's boot records hold: wtmp's BOOT_TIME records (x86_64: 384-byte records,
    ut_type first) and wtmpdb's rows, read here as facts to judge the reaper's account by."""
    wtmp = Path("/var/log/wtmp")
    boots = None
    if wtmp.is_file():
        data = wtmp.read_bytes()
        types = [struct.unpack_from("<h", data, i)[0] for i in range(0, len(data) - 383, 384)]
        boots = types.count(2)
    rows = None
    db = Path("/var/lib/wtmpdb/wtmp.db")
    if db.exists():
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            rows = [
                list(row)
                for row in conn.execute(
                    "SELECT ID, Type, User, Login, Logout FROM wtmp ORDER BY ID"
                )
            ]
    version = subprocess.run(["containerd", "--version"], capture_output=True, text=True)
    return {"wtmp_boot_records": boots, "wtmpdb_rows": rows, "containerd": version.stdout.strip()}


def unit(name: str, props: str = "") -> dict[str, str]:
    """systemd's properties of a unit (or, with name "", of the manager)."""
    if not props:
        props = "ActiveState,Result,ConditionResult,ExecMainStatus,"
        props += "ExecMainStartTimestampMonotonic,ExecMainExitTimestampMonotonic,"
        props += "ActiveEnterTimestampMonotonic"
    shown = subprocess.run(
        # "--": unit names such as -.mount are not options.
        ["systemctl", "show", "-p", props, "--", *([name] if name else [])],
        capture_output=True,
        text=True,
    ).stdout
    return dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)


def starting_beside(name: str) -> dict[str, str]:
    """The services that were starting while unit name ran (from its fork to its exit), each
    with the CPU systemd accounted to it in all (its CPUUsageNSec as shown), which for a
    daemon is mostly its start: what shared the machine with the unit at that point of the
    boot, as the floor's units, later, do not."""
    ran = unit(name, TIMING_PROPS)
    began = int(ran["ExecMainStartTimestampMonotonic"])
    ended = int(ran["ActiveEnterTimestampMonotonic"])
    props = "Id,InactiveExitTimestampMonotonic,ActiveEnterTimestampMonotonic,CPUUsageNSec"
    shown = subprocess.run(
        ["systemctl", "show", "-p", props, "--", "*.service"], capture_output=True, text=True
    ).stdout
    found = {}
    for block in shown.split("\n\n"):
        fields = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        start = int(fields.get("InactiveExitTimestampMonotonic") or 0)
        up = int(fields.get("ActiveEnterTimestampMonotonic") or 0)
        if fields.get("Id") == name or not start or start > ended or (up and up < began):
            continue
        found[fields["Id"]] = fields.get("CPUUsageNSec", "")
    return found


def kernel_message_at(text: str) -> float | None:
    """When (seconds since the kernel started) the kernel logged a message holding text."""
    shown = subprocess.run(["dmesg"], capture_output=True, text=True).stdout
    for line in shown.splitlines():
        if text in line and line.startswith("["):
            return float(line[1:].split("]", 1)[0])
    return None


def cold_run(argv: list[str]) -> dict[str, Any]:
    """One run of argv after the page cache is dropped, as the driver's clock sees it, and
    the CPU (user and system) it used: the rest of its time it waited, for the disk mostly."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    before = os.times()
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True)
    wall = time.monotonic() - start
    after = os.times()
    cpu = after.children_user - before.children_user
    cpu += after.children_system - before.children_system
    return {"seconds": round(wall, 3), "cpu": round(cpu, 3), "exit": done.returncode}


def breakdown() -> dict[str, Any]:
    """Where the reaper's time goes, roughly: each run from a dropped page cache (but the
    interpreter's own binary stays cached, mapped by this driver), in this boot after the
    runtime started: the interpreter alone, the reaper's imports, a dry run over the same dir,
    the floor program."""
    python = "/usr/bin/python3"
    return {
        "interpreter": cold_run([python, "-c", "pass"]),
        "imports": cold_run([python, "-c", "import cni_reaper.cli"]),
        "dry_run": cold_run([python, "/usr/bin/cni-reaper", "--dry-run", "--json"]),
        "floor": cold_run([python, str(Path(__file__).with_name("floor.py")), str(RESULTS)]),
    }


def timing() -> dict[str, Any]:
    """systemd's own timestamps for this boot: the manager's, the reaper's and those of the
    units it is ordered after, the floor program's units, containerd's; and what the floor
    program was given to read."""
    after = unit("cni-reaper.service", "After")["After"].split()
    names = ["cni-reaper.service", "vmtest-floor.service", "vmtest-floor-warm.service"]
    names += ["vmtest-floor-hardened.service", "vmtest-floor-first.service"]
    names += ["containerd.service", *after]
    # Its unit listed the dir just before it ran: the names, not the 80 kB, go to the console.
    floor_files = None
    if FLOOR_FILES.exists():
        listed = set(FLOOR_FILES.read_text().split())
        floor_files = {
            "count": len(listed),
            "missing_bulk": len(bulk_names() - listed),
            "same_as_now": listed == {p.name for p in RESULTS.iterdir()},
        }
    return {
        "manager": unit(
            "",
            "KernelTimestampMonotonic,InitRDTimestampMonotonic,UserspaceTimestampMonotonic",
        ),
        "run_init": kernel_message_at("Run /init as init process"),
        "after": after,
        "units": {name: unit(name, TIMING_PROPS) for name in names},
        "interpreter": Path("/usr/bin/cni-reaper").read_text().splitlines()[0],
        "floor_files": floor_files,
        "bulk": bulk(),
        "beside_reaper": starting_beside("cni-reaper.service"),
    }


def reaper_journal() -> list[dict[str, Any]]:
    shown = subprocess.run(
        ["journalctl", "-b", "-o", "json", "SYSLOG_IDENTIFIER=cni-reaper"],
        capture_output=True,
        text=True,
    ).stdout
    keep = ("MESSAGE", "MESSAGE_ID", "PRIORITY", "_SYSTEMD_UNIT", "__MONOTONIC_TIMESTAMP")
    records = []
    for line in shown.splitlines():
        record = json.loads(line)
        records.append({k: v for k, v in record.items() if k.startswith("CNI_") or k in keep})
    return records


def check() -> None:
    """After the reboot: what the reaper did, then every sandbox torn down by the runtime."""
    say(
        "boot",
        reaper=unit("cni-reaper.service"),
        containerd=unit("containerd.service"),
        journal=reaper_journal(),
        results=files(RESULTS),
        quarantine=quarantined(),
        reserved=reserved(),
        cmdline=Path("/proc/cmdline").read_text().strip(),
        records=boot_records(),
    )
    if bulk_names():
        say("timing", **timing())
        say("breakdown", **breakdown())
    runtime = client()
    teardown: dict[str, dict[str, str | None]] = {}
    for sandbox_id in runtime.list_pod_sandbox():
        outcome: dict[str, str | None] = {"stop": None, "remove": None}
        try:
            runtime.stop_pod_sandbox(sandbox_id)
            try:
                runtime.remove_pod_sandbox(sandbox_id)
            except CriError as error:
                outcome["remove"] = error.details
        except CriError as error:
            outcome["stop"] = error.details
        teardown[sandbox_id] = outcome
    say(
        "teardown",
        teardown=teardown,
        left=runtime.list_pod_sandbox(),
        results=files(RESULTS),
        reserved=reserved(),
    )


# --- the crash campaign (tests/vm/campaign.py) ------------------------------------------------


def kmsg(kind: str, **facts: Any) -> None:
    """A report through the kernel's log: a panic flushes it to the console, so the lines said
    just before the crash are not lost in the serial port's buffer (as /dev/console's may be).
    One record holds about 1 kB: keep these short."""
    line = "VMTEST-JSON " + json.dumps(
        {"kind": kind, **facts}, sort_keys=True, separators=(",", ":")
    )
    fd = os.open("/dev/kmsg", os.O_WRONLY)
    try:
        os.write(fd, b"<5>" + line.encode())
    finally:
        os.close(fd)


def stores() -> dict[str, dict[str, str]]:
    """Every network's host-local reservations: address -> what the file holds."""
    held = {}
    for network in NETWORKS:
        store = Path("/var/lib/cni/networks") / network
        if store.is_dir():
            held[network] = {
                p.name: p.read_text(errors="replace")
                for p in store.iterdir()
                if p.name[0].isdigit() and p.is_file()
            }
        else:
            held[network] = {}
    return held


INOTIFY_KINDS = {0x8: "written", 0x80: "moved-in", 0x100: "created", 0x200: "deleted"}


class FileEvents:
    """inotify over dirs (libc through ctypes: the guest has no inotify module): each file
    created, written and closed, or deleted in them, as [dir, name, what]."""

    def __init__(self, dirs: list[Path]) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.fd = libc.inotify_init1(0)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.dirs: dict[int, str] = {}
        for directory in dirs:
            # As host-local and libcni make them (MkdirAll, 0755), so that they can be watched
            # from the first pod on.
            directory.mkdir(parents=True, exist_ok=True)
            wd = libc.inotify_add_watch(self.fd, str(directory).encode(), sum(INOTIFY_KINDS))
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {directory}")
            self.dirs[wd] = directory.name

    def __iter__(self) -> Iterator[list[str]]:
        header = struct.Struct("iIII")
        while True:
            data = os.read(self.fd, 65536)
            offset = 0
            while offset < len(data):
                wd, mask, _cookie, size = header.unpack_from(data, offset)
                start = offset + header.size
                name = data[start : start + size].rstrip(b"\0").decode(errors="replace")
                offset = start + size
                what = next((k for bit, k in INOTIFY_KINDS.items() if mask & bit), hex(mask))
                yield [self.dirs.get(wd, "?"), name, what]


class Churn:
    """Pod churn as kubelet makes it, from two workers, each with its own seeded random source:
    RunPodSandbox, then later StopPodSandbox and RemovePodSandbox (sometimes apart, as kubelet
    stops a pod before its garbage collection removes it). Every CNI call (Run, Stop) is
    counted, and so is every file created, written or deleted in the results dir and the
    host-local stores (inotify). The plan says which count triggers the crash: "call", the
    kernel crashed a planned delay (up to seconds: a RunPodSandbox takes that long under TCG)
    after the n-th CNI call started; "write", a delay of at most 50 ms after the n-th file event,
    which lands in or right after libcni's or host-local's writes. The workers go on meanwhile.
    delay after that call started, while both workers go on."""

    def __init__(self, trigger: str, crash_at: int, crash_delay: float) -> None:
        self.crash_call = crash_at if trigger == "call" else 0
        self.crash_write = crash_at if trigger == "write" else 0
        self.crash_delay = crash_delay
        self.writes = 0
        self.lock = threading.Lock()
        self.cni_calls = 0
        self.running: dict[str, str] = {}  # name -> sandbox id, RunPodSandbox returned
        self.stopped: dict[str, str] = {}  # StopPodSandbox returned, not yet removed
        self.in_flight: dict[str, tuple[str, str, float]] = {}  # worker -> call, pod, start
        self.host_port = 20000

    def call(self, worker: str, what: str, name: str, run: Any) -> Any:
        with self.lock:
            start = time.monotonic()
            self.in_flight[worker] = (what, name, start)
            number = 0
            if what in ("run", "stop"):
                self.cni_calls += 1
                number = self.cni_calls
        kmsg("op", w=worker, call=what, pod=name, n=number)
        # number 0: a Remove, never counted (and crash_call is 0 when a file event is planned).
        if number and number == self.crash_call:
            threading.Thread(target=self.crash, args=(start, [what, name]), daemon=True).start()
        error = None
        result = None
        try:
            result = run()
        except CriError as failed:
            error = failed.details[:300]
        took = round(time.monotonic() - start, 3)
        with self.lock:
            del self.in_flight[worker]
        kmsg("done", w=worker, call=what, pod=name, s=took, error=error)
        return result, error

    def worker(self, worker: str, rng: random.Random, runtime: RuntimeClient) -> None:
        mine: list[str] = []
        for count in range(400):
            running = [n for n in mine if n in self.running]
            stopped = [n for n in mine if n in self.stopped]
            if stopped and rng.random() < 0.3:
                name = rng.choice(stopped)
                sandbox_id = self.stopped[name]
                _, error = self.call(
                    worker,
                    "remove",
                    name,
                    functools.partial(runtime.remove_pod_sandbox, sandbox_id),
                )
                if error is None:
                    with self.lock:
                        del self.stopped[name]
                    mine.remove(name)
            elif len(running) < 2 or (len(running) < 6 and rng.random() < 0.5):
                name = f"{worker}-{count}"
                with self.lock:
                    self.host_port += 1
                    port = self.host_port
                sandbox_id, error = self.call(
                    worker,
                    "run",
                    name,
                    functools.partial(
                        runtime.run_pod_sandbox, name, str(uuid.uuid4()), CGROUP_PARENT, port
                    ),
                )
                if error is None:
                    with self.lock:
                        self.running[name] = sandbox_id
                    mine.append(name)
            else:
                name = rng.choice(running)
                sandbox_id = self.running[name]
                _, error = self.call(
                    worker, "stop", name, functools.partial(runtime.stop_pod_sandbox, sandbox_id)
                )
                if error is None:
                    with self.lock:
                        self.stopped[name] = self.running.pop(name)
            time.sleep(rng.uniform(0, 0.4))

    def watch(self, events: FileEvents) -> None:
        """Count the CNI dirs' file events; start the crash at the planned one."""
        for event in events:
            self.writes += 1
            if self.writes == self.crash_write:
                start = time.monotonic()
                threading.Thread(target=self.crash, args=(start, event), daemon=True).start()

    def crash(self, start: float, cause: list[str]) -> None:
        time.sleep(max(0.0, start + self.crash_delay - time.monotonic()))
        now = time.monotonic()
        with self.lock:
            flight = {w: [c, n, round(now - s, 3)] for w, (c, n, s) in self.in_flight.items()}
            kmsg(
                "crash",
                cause=cause,
                calls=self.cni_calls,
                writes=self.writes,
                after=round(now - start, 3),
                running=sorted(self.running),
                stopped=sorted(self.stopped),
                in_flight=flight,
            )
            # No sync, no unmount: the kernel stops here, as a node that loses power.
            Path("/proc/sysrq-trigger").write_text("c\n")


def churn() -> None:
    """The crash campaign's first boot: both networks set up, then churn until the crash."""
    seed = int(kernel_arg("seed") or 0)
    rng = random.Random(seed)  # noqa: S311 (repeatable from its seed, not secret)
    trigger = rng.choice(["call", "write"])
    if trigger == "call":
        crash_at = rng.randint(3, 24)
        crash_delay = round(rng.uniform(0, float(kernel_arg("crash_window") or 8.0)), 3)
    else:
        # About a dozen file events per RunPodSandbox (a results file and a reservation per
        # network, each created then written), a few per StopPodSandbox (deleted).
        crash_at = rng.randint(1, 120)
        crash_delay = round(rng.uniform(0, 0.05), 3)
    # Both networks in this boot and the boots from its disk: the second conflist, and
    # containerd told to attach every pod to both; then synced, so the crash keeps them.
    shutil.copy(CAMPAIGN / "20-ptpnet.conflist", "/etc/cni/net.d/20-ptpnet.conflist")
    shutil.copy(CAMPAIGN / "containerd-campaign.toml", "/etc/containerd/config.toml")
    subprocess.run(["systemctl", "restart", "containerd.service"], check=True)
    runtime = client()
    import_pause_image()
    os.sync()
    Path("/proc/sys/kernel/sysrq").write_text("1\n")
    # Every line through /dev/kmsg, none dropped by its rate limit.
    Path("/proc/sys/kernel/printk_devkmsg").write_text("on\n")
    version = subprocess.run(["containerd", "--version"], capture_output=True, text=True)
    say(
        "plan",
        seed=seed,
        trigger=trigger,
        crash_at=crash_at,
        crash_delay=crash_delay,
        containerd=version.stdout.strip(),
    )
    state = Churn(trigger, crash_at, crash_delay)
    watched = [RESULTS, *(Path("/var/lib/cni/networks") / network for network in NETWORKS)]
    threading.Thread(target=state.watch, args=(FileEvents(watched),), daemon=True).start()
    workers = [
        threading.Thread(
            target=state.worker,
            args=(
                f"w{n}",
                random.Random(rng.getrandbits(64)),  # noqa: S311 (as above)
                RuntimeClient(SOCKET, timeout=120),
            ),
            daemon=True,
        )
        for n in range(2)
    ]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    # Both workers ran out of calls and the crash never came: say so (the host fails the run).
    say("no-crash", cni_calls=state.cni_calls, writes=state.writes)
    runtime.close()


def policy_units() -> dict[str, dict[str, str]]:
    names = ["cni-reaper.service", "vmtest-rm-results.service", "containerd.service"]
    return {name: unit(name, TIMING_PROPS + ",ConditionResult") for name in names}


def pod_network(runtime: RuntimeClient, sandbox_id: str) -> dict[str, Any]:
    """What a running pod's network is made of, as its owner would check it: the runtime's
    view, its results files (by content), its reservations in each store, the addresses inside
    its network namespace, and the NAT rules portmap made for it."""
    status = runtime.pod_sandbox_status(sandbox_id)
    results: dict[str, str] = {}
    namespaces: set[str] = set()
    for path in sorted(RESULTS.iterdir()) if RESULTS.is_dir() else []:
        if sandbox_id not in path.name:
            continue
        data = path.read_bytes()
        results[path.name] = hashlib.sha256(data).hexdigest()[:16]
        try:
            cached = json.loads(data)
            for interface in cached["result"].get("interfaces") or []:
                if interface.get("sandbox"):
                    namespaces.add(interface["sandbox"])
        except (ValueError, KeyError, TypeError, AttributeError):
            pass
    inside: list[str] = []
    for namespace in sorted(namespaces):
        shown = subprocess.run(
            ["nsenter", f"--net={namespace}", "ip", "-j", "-4", "addr", "show"],
            capture_output=True,
            text=True,
        )
        for link in json.loads(shown.stdout or "[]"):
            inside += [
                f"{link['ifname']} {a['local']}/{a['prefixlen']}"
                for a in link.get("addr_info", [])
                if link["ifname"] != "lo"
            ]
    nat = subprocess.run(["iptables-save", "-t", "nat"], capture_output=True, text=True).stdout
    reserved = {
        network: sorted(a for a, text in held.items() if text.split("\n")[0] == sandbox_id)
        for network, held in stores().items()
    }
    # The host's way to each of its addresses: bridge's cni0, ptp's host-side veth.
    routes = []
    for address in sorted(a for held in reserved.values() for a in held):
        shown = subprocess.run(
            ["ip", "-j", "route", "get", address], capture_output=True, text=True
        )
        routes += [f"{address} dev {r.get('dev')}" for r in json.loads(shown.stdout or "[]")]
    return {
        "ready": status.ready,
        "ip": status.ip,
        "results": results,
        "reserved": reserved,
        "routes": routes,
        "inside": sorted(inside),
        "nat_rules": sum(1 for line in nat.splitlines() if sandbox_id in line),
    }


def read_pod_network(
    runtime: RuntimeClient, sandbox_id: str
) -> tuple[dict[str, Any] | None, str | None]:
    """pod_network, or why it could not be read (the pod gone among the reasons)."""
    try:
        return pod_network(runtime, sandbox_id), None
    except (CriError, OSError, ValueError) as error:
        return None, f"{type(error).__name__}: {error}"[:300]


def aim_at_lowest_free(network: str) -> str | None:
    """Make host-local hand out the lowest free address of the network's /24 next (it goes on
    after last_reserved_ip.0): the address, or None when none is free."""
    store = Path("/var/lib/cni/networks") / network
    prefix = {"podnet": "10.88.0.", "ptpnet": "10.99.0."}[network]
    held = set(os.listdir(store)) if store.is_dir() else set()
    for last in range(2, 255):
        if f"{prefix}{last}" not in held:
            store.mkdir(parents=True, exist_ok=True)
            (store / "last_reserved_ip.0").write_text(f"{prefix}{last - 1}")
            return f"{prefix}{last}"
    return None


def stop_and_remove(runtime: RuntimeClient, sandbox_id: str) -> dict[str, str | None]:
    """Stop, then remove, each call tried twice as kubelet retries; None where a step worked."""
    outcome: dict[str, str | None] = {"stop": None, "remove": None}
    for step, call in (
        ("stop", runtime.stop_pod_sandbox),
        ("remove", runtime.remove_pod_sandbox),
    ):
        for _attempt in (1, 2):
            try:
                call(sandbox_id)
                outcome[step] = None
                break
            except CriError as error:
                outcome[step] = error.details
                time.sleep(1)
        if outcome[step] is not None:
            break
    return outcome


def campaign_check() -> None:
    """After the crash, under the boot policy of the command line (vmtest.policy=): what the
    boot found and did before the runtime; then a pod of this boot started, as kubelet starts
    new pods while it cleans up; a kubelet-like teardown of every sandbox of the crashed boot;
    the new pod's network compared with what it was before that teardown; and what is left
    once the new pod is gone too."""
    results = RESULTS
    quarantine = (
        sorted(str(p) for p in QUARANTINE.rglob("*") if p.is_file()) if QUARANTINE.is_dir() else []
    )
    say(
        "boot",
        policy=kernel_arg("policy"),
        units=policy_units(),
        journal=reaper_journal(),
        results=files(results),
        quarantine=quarantine,
        reserved=stores(),
        boot_id=Path("/proc/sys/kernel/random/boot_id").read_text().strip(),
        cmdline=Path("/proc/cmdline").read_text().strip(),
    )
    runtime = client()
    earlier = runtime.list_pod_sandbox()
    live: dict[str, Any] = {"id": None, "error": None, "before": None, "after": None}
    # The new pod takes the lowest address free in each store: one an earlier pod held, maybe
    # one the policy released, so that the crashed boot's teardown works beside its reuse.
    live["aimed_at"] = {network: aim_at_lowest_free(network) for network in NETWORKS}
    try:
        live["id"] = runtime.run_pod_sandbox("live-0", str(uuid.uuid4()), CGROUP_PARENT, 30000)
    except CriError as error:
        live["error"] = f"RunPodSandbox: {error.details[:300]}"
    if live["id"] is not None:
        live["before"], live["error"] = read_pod_network(runtime, live["id"])
    teardown: dict[str, dict[str, str | None]] = {}
    for sandbox_id in earlier:
        name = runtime.pod_sandbox_status(sandbox_id).name
        teardown[sandbox_id] = {"name": name, **stop_and_remove(runtime, sandbox_id)}
    if live["id"] is not None:
        live["after"], live["after_error"] = read_pod_network(runtime, live["id"])
        live["teardown"] = stop_and_remove(runtime, live["id"])
    say(
        "teardown",
        teardown=teardown,
        live=live,
        left=runtime.list_pod_sandbox(),
        results=files(results),
        reserved=stores(),
    )


def main() -> None:
    step = mode()
    say("start", mode=step, uptime=Path("/proc/uptime").read_text().split()[0])
    # A clean step ends, and its unit's SuccessAction powers the node off the ordinary way,
    # every unit stopped in order (cni-reaper's ExecStop among them); a failed one is reported
    # and its unit's FailureAction ends the boot at once.
    try:
        {
            "setup-crash": setup_crash,
            "setup-clean": setup_clean,
            "check": check,
            "churn": churn,
            "campaign-check": campaign_check,
        }[step]()
    except Exception as error:
        say("error", error=f"{type(error).__name__}: {error}")
        raise


if __name__ == "__main__":
    main()
