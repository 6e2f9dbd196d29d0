#!/usr/bin/python3
"""The scenario steps inside the booted guest, run by vmtest.service after multi-user.target.

The step comes from the kernel command line (vmtest.mode=...). Everything the host needs to
judge goes to /dev/console as lines "VMTEST-JSON <one JSON object>"; the console is written
synchronously, so what was said before a crash is in the serial log.
"""

from __future__ import annotations

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


def say(kind: str, **facts: Any) -> None:
    line = "VMTEST-JSON " + json.dumps({"kind": kind, **facts}, sort_keys=True) + "\n"
    with open("/dev/console", "w") as console:
        console.write(line)
        console.flush()


def mode() -> str:
    for word in Path("/proc/cmdline").read_text().split():
        if word.startswith("vmtest.mode="):
            return word.split("=", 1)[1]
    return ""


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


def files(directory: Path) -> dict[str, int]:
    if not directory.is_dir():
        return {}
    return {p.name: p.stat().st_size for p in sorted(directory.iterdir()) if p.is_file()}


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


def unit(name: str) -> dict[str, str]:
    props = "ActiveState,Result,ConditionResult,ExecMainStatus,ExecMainStartTimestampMonotonic,"
    props += "ExecMainExitTimestampMonotonic,ActiveEnterTimestampMonotonic"
    shown = subprocess.run(
        ["systemctl", "show", name, "-p", props], capture_output=True, text=True
    ).stdout
    return dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)


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
