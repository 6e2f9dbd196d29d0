#!/usr/bin/python3
"""The scenario steps inside the booted guest, run by vmtest.service after multi-user.target.

The step comes from the kernel command line (vmtest.mode=...). Everything the host needs to
judge goes to /dev/console as lines "VMTEST-JSON <one JSON object>"; the console is written
synchronously, so what was said before a crash is in the serial log.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import struct
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tests.cri import CriError, RuntimeClient

SOCKET = "/run/containerd/containerd.sock"
PAUSE = Path(__file__).with_name("pause.tar")
RESULTS = Path("/var/lib/cni/results")
STORE = Path("/var/lib/cni/networks/podnet")
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
    "ActiveEnterTimestampMonotonic"
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


def kernel_message_at(text: str) -> float | None:
    """When (seconds since the kernel started) the kernel logged a message holding text."""
    shown = subprocess.run(["dmesg"], capture_output=True, text=True).stdout
    for line in shown.splitlines():
        if text in line and line.startswith("["):
            return float(line[1:].split("]", 1)[0])
    return None


def cold_run(argv: list[str]) -> dict[str, Any]:
    """One run of argv after the page cache is dropped, as the driver's clock sees it."""
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")
    start = time.monotonic()
    done = subprocess.run(argv, capture_output=True)
    return {"seconds": round(time.monotonic() - start, 3), "exit": done.returncode}


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


def main() -> None:
    step = mode()
    say("start", mode=step, uptime=Path("/proc/uptime").read_text().split()[0])
    # A clean step ends, and its unit's SuccessAction powers the node off the ordinary way,
    # every unit stopped in order (cni-reaper's ExecStop among them); a failed one is reported
    # and its unit's FailureAction ends the boot at once.
    try:
        {"setup-crash": setup_crash, "setup-clean": setup_clean, "check": check}[step]()
    except Exception as error:
        say("error", error=f"{type(error).__name__}: {error}")
        raise


if __name__ == "__main__":
    main()
