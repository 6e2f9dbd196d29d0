"""The proof: Debian's containerd 1.6 cannot tear down sandboxes whose cache files a crash damaged,
and can once cni-reaper has run before it.

tests/runtime_scenario.py does the work as root in a private net, mount and PID namespace; these
tests judge what it saw. Select them alone with `pytest -m runtime`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.nodetree import have_plugins
from tests.pause_image import BUSYBOX
from tests.private_node import cannot_run, unshare

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.runtime

NETWORK = "podnet"
SEED_ERROR = (
    f'failed to get network "{NETWORK}" cached result: decoding version from network config'
)


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root for unshare --net --mount --pid and for containerd"
    for tool in (
        "unshare",
        "ip",
        "iptables",
        "containerd",
        "containerd-shim-runc-v2",
        "ctr",
        "runc",
    ):
        if shutil.which(tool) is None:
            return f"needs {tool} (Debian packages containerd, runc, iproute2, iptables)"
    if not BUSYBOX.is_file():
        return f"needs {BUSYBOX} (Debian package busybox-static) for the pause image"
    if not have_plugins():
        return "needs Debian's containernetworking-plugins in /usr/lib/cni"
    return None


def processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes on the machine that name text (our work dir)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if text.encode() in cmdline:
                found.append(cmdline.decode(errors="replace"))
    return found


def run_scenario(work: Path, dry_run_first: bool) -> dict[str, Any]:
    reason = _why_not()
    if reason:
        cannot_run(reason)
    argv = [
        # Should the test time out, the scenario's PID 1 dies, and the kernel kills the rest.
        *unshare(net=True, pid=True),
        sys.executable,
        "-m",
        "tests.runtime_scenario",
        str(work),
    ]
    if dry_run_first:
        argv.append("--dry-run-first")
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, f"{proc.stderr}\ncontainerd log: {work / 'containerd.log'}"
    result: dict[str, Any] = json.loads((work / "result.json").read_text())
    result["work"] = str(work)
    return result


@pytest.fixture(scope="module")
def dry_run_first(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_scenario(tmp_path_factory.mktemp("runtime-dry-run-first"), dry_run_first=True)


@pytest.fixture(scope="module")
def reaper_only(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return run_scenario(tmp_path_factory.mktemp("runtime-reaper"), dry_run_first=False)


@pytest.fixture(params=["reaper-only", "dry-run-first"])
def scenario(request: pytest.FixtureRequest) -> Any:
    """Both variants tell the same story; the dry run must not change its ending."""
    return request.getfixturevalue(request.param.replace("-", "_"))


def net_file(pod: dict[str, Any]) -> str:
    return f"{NETWORK}-{pod['id']}-eth0"


def stuck_pods(scenario: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in scenario["pods"] if p["files"][net_file(p)] != "valid"]


def damaged_files(scenario: dict[str, Any]) -> set[str]:
    return {name for p in scenario["pods"] for name, how in p["files"].items() if how != "valid"}


def test_boot_1_ran_real_sandboxes_with_reserved_ips(scenario: dict[str, Any]) -> None:
    assert scenario["runtime"] == ["containerd", scenario["runtime"][1]]
    assert scenario["runtime"][1].startswith("1.6.")
    reserved = scenario["boot1"]["ips"]
    for pod in scenario["pods"]:
        assert pod["ready"] is True
        assert reserved[pod["ip"]] == f"{pod['id']}\r\neth0"
        for name in pod["files"]:
            assert name in scenario["boot1"]["results"]


def test_the_crash_killed_runtime_shims_and_sandboxes(scenario: dict[str, Any]) -> None:
    """The crash comes once every sandbox's process runs the pause command: right after
    RunPodSandbox returns it can still be runc's init, which then shows as `runc` here."""
    assert scenario["killed"] == ["/bin/busybox", "/usr/bin/containerd-shim-runc-v2", "containerd"]
    assert scenario["left_after_kill"] == {}


def test_without_reaper_the_runtime_is_stuck_on_the_seed_error(scenario: dict[str, Any]) -> None:
    stuck = stuck_pods(scenario)
    assert len(stuck) == 3
    assert sorted(scenario["listed_after_reboot"]) == sorted(p["id"] for p in scenario["pods"])
    for pod in stuck:
        assert SEED_ERROR in scenario["stuck"][pod["id"]]
        # No plugin ran DEL, so the IP leaks.
        assert scenario["still_reserved"]["ips"][pod["ip"]] == f"{pod['id']}\r\neth0"


def test_the_inventory_reads_the_sandboxes_containerd_lists(scenario: dict[str, Any]) -> None:
    """From containerd 1.6's own meta.db, containerd stopped: exactly the sandboxes it listed,
    each with its CNI result saved; none once they are removed."""
    stopped = scenario["inventory_stopped"]
    assert stopped["known"] == sorted(scenario["listed_after_reboot"])
    assert (stopped["undecided"], stopped["unreadable"]) == ([], [])
    assert stopped["sources"][0].endswith(": 6 sandboxes (namespace k8s.io: 6)")
    final = scenario["inventory_final"]
    assert (final["known"], final["undecided"], final["unreadable"]) == ([], [], [])


def test_reaper_refuses_while_the_runtime_answers(scenario: dict[str, Any]) -> None:
    early = scenario["reaper_while_runtime_up"]
    assert early["exit"] == 75
    assert "a container runtime is running (it answers on" in early["stderr"]
    assert early["tree_unchanged"] is True


def test_in_a_boot_the_runtime_started_in_first_nothing_is_touched(
    scenario: dict[str, Any],
) -> None:
    """The runtime stopped, by hand: but it ran in this boot before any record was taken, so
    no file is proven to be an earlier boot's; the next boot's run will repair them."""
    run = scenario["reaper_same_boot"]
    assert run["exit"] == 65, run["stderr"]
    assert run["tree_unchanged"] is True
    assert run["quarantined"] is False
    assert run["report"]["boot"]["pre_runtime_record"]["state"] == "missing"
    entries = {e["path"]: e for e in run["report"]["entries"]}
    for name in damaged_files(scenario):
        assert (entries[name]["written"], entries[name]["action"]) == ("unknown", "leave")
        assert "a runtime has started in this boot" in entries[name]["evidence"]


def test_reaper_replays_del_and_quarantines_what_the_crash_damaged(
    scenario: dict[str, Any],
) -> None:
    run = scenario["reaper"]
    assert run["exit"] == 0, run["stderr"]
    entries = {e["path"]: e for e in run["report"]["entries"]}
    assert run["report"]["boot"]["previous_boot_crashed"] is True
    for pod in scenario["pods"]:
        name = net_file(pod)
        if name in damaged_files(scenario):
            assert (entries[name]["action"], entries[name]["outcome"]) == (
                "del-and-quarantine",
                "done",
            )
        else:
            assert entries[name]["action"] == "keep"


def test_after_reaper_every_sandbox_stops_and_is_removed(scenario: dict[str, Any]) -> None:
    for pod in scenario["pods"]:
        assert scenario["teardown"][pod["id"]] == {"stop": None, "remove": None}
    assert scenario["listed_after_teardown"] == []


def test_no_ip_stays_reserved_and_no_results_file_is_left(scenario: dict[str, Any]) -> None:
    assert scenario["final"] == {"results": [], "ips": {}}


def test_quarantine_holds_exactly_the_damaged_files(scenario: dict[str, Any]) -> None:
    quarantined = {Path(p).name for p in scenario["quarantine"]}
    damaged = damaged_files(scenario)
    assert quarantined == damaged | {name + ".json" for name in damaged}
    assert len({Path(p).parent for p in scenario["quarantine"]}) == 1


def test_dry_run_first_changes_nothing(dry_run_first: dict[str, Any]) -> None:
    dry = dry_run_first["dry_run"]
    assert dry["exit"] == 0, dry["stderr"]
    assert dry["tree_unchanged"] is True
    planned = {e["path"] for e in dry["report"]["entries"] if e["outcome"] == "planned"}
    assert planned == damaged_files(dry_run_first)


def test_every_process_and_cgroup_it_started_is_gone(scenario: dict[str, Any]) -> None:
    assert processes_mentioning(scenario["work"]) == []
    assert scenario["cgroups_left"] == []
