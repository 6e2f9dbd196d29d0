"""The proof: Debian's containerd 1.6 cannot tear down sandboxes whose cache files a crash damaged,
and can once cni-reaper has run before it; and with containerd run as k3s runs it, every address
a crash left reserved is owned by a sandbox containerd tears down, or freed by the reaper.

tests/runtime_scenario.py and tests/k3s_scenario.py do the work as root in a private net, mount
and PID namespace; these tests judge what they saw. Select them alone with `pytest -m runtime`.
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


def run_scenario(
    work: Path, dry_run_first: bool, module: str = "runtime_scenario", *args: str
) -> dict[str, Any]:
    reason = _why_not()
    if reason:
        cannot_run(reason)
    argv = [
        # Should the test time out, the scenario's PID 1 dies, and the kernel kills the rest.
        *unshare(net=True, pid=True),
        sys.executable,
        "-m",
        f"tests.{module}",
        str(work),
        *args,
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


# containerd run as k3s runs it (tests/k3s_scenario.py): pods whose results files were deleted
# outright, a pod held inside its CNI ADD by the crash, pods whose entries are whole, and a
# node found by the reaper at k3s's paths without a flag.

K3S_NETWORK = "cbr0"
K3S_SOCKET = "/run/k3s/containerd/containerd.sock"
CRI_CNI_TABLE = '[plugins."io.containerd.grpc.v1.cri".cni]'


# k3s's default data dir, and one its config.yaml or its unit's command line moves it to.
@pytest.fixture(
    scope="module",
    params=[
        ("/var/lib/rancher/k3s",),
        ("/var/lib/k3s-volume", "config.yaml"),
        ("/var/lib/k3s-elsewhere", "unit"),
    ],
    ids=["default", "config.yaml", "unit"],
)
def k3s(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("runtime-k3s")
    return run_scenario(work, False, "k3s_scenario", *request.param)


def pods_of(k3s: dict[str, Any], fate: str) -> list[dict[str, Any]]:
    found = [p for p in k3s["pods"] if p["fate"] == fate]
    assert found
    return found


def on_node(k3s: dict[str, Any], path: str) -> str:
    """Where the reaper, given --root, sees the node's path."""
    return str(Path(k3s["work"]) / "node" / path.lstrip("/"))


def reservation_doc(run: dict[str, Any], ip: str) -> dict[str, Any]:
    (doc,) = [r for r in run["report"]["host_local"] if r["ip"] == ip]
    return dict(doc)


def test_k3s_boot_1_ran_pods_and_the_crash_held_one_inside_its_add(k3s: dict[str, Any]) -> None:
    assert k3s["runtime"][0] == "containerd"
    assert k3s["runtime"][1].startswith("1.6.")
    for pod in k3s["pods"]:
        assert k3s["while_held"]["ips"][pod["ip"]] == f"{pod['id']}\r\neth0"
    (held,) = pods_of(k3s, "held")
    # The crash came while the ADD was held: RunPodSandbox never answered.
    assert k3s["held_run_pod_sandbox"]["error"].startswith("StatusCode.UNAVAILABLE")
    assert "id" not in k3s["held_run_pod_sandbox"]
    assert f"{K3S_NETWORK}-{held['id']}-eth0" not in k3s["while_held"]["results"]
    assert k3s["killed"] == [
        "/bin/busybox",
        "/usr/bin/containerd-shim-runc-v2",
        "containerd",
        "sleep",  # the hold plugin, inside the held ADD
    ]
    assert k3s["left_after_kill"] == {}
    # The reboot lost every mount the old boot made (netns pins, rootfs, shm).
    assert k3s["mounts_left"] == []


def test_k3s_sandbox_never_persisted_what_containerd_1_6_leaves(k3s: dict[str, Any]) -> None:
    """What containerd 1.6 (Debian's 1.6.20) leaves of a sandbox whose CNI ADD a crash cut
    short, as seen here: RunPodSandbox writes the sandbox's container record before it sets up
    the network, so containerd has not forgotten the sandbox: the record is in meta.db
    (io.cri-containerd.kind=sandbox), its CRI metadata naming the netns and holding no CNI
    result (null). The sandbox dir holds hostname, hosts and resolv.conf; no shim was started
    (the task comes after the network). libcni wrote no results file for the pod network (it
    writes one when the whole chain has returned), but the loopback network's ADD had finished:
    its cni-loopback file is whole. host-local, inside bridge, had reserved the pod's address.
    cni-reaper's inventory calls the sandbox unsaved: containerd 1.6.37 and later skip the DEL
    of a record without a CNI result (the crash campaign saw trixie's 1.7.24 leave such a
    sandbox's cni-loopback entry for good), the 1.6.20 here runs it; so the reaper DELs the
    whole cni-loopback entry itself and moves it away."""
    (held,) = pods_of(k3s, "held")
    record = k3s["held_record"]
    assert record["labels"]["io.cri-containerd.kind"] == "sandbox"
    assert record["has_metadata"] is True
    assert record["net_ns_path"].startswith("/var/run/netns/cni-")
    assert record["cni_result"] is None
    assert k3s["held_sandbox_dir"] == ["hostname", "hosts", "resolv.conf"]
    shims = [line for line in k3s["others_before_crash"] if "containerd-shim" in line]
    assert len(shims) == len(k3s["pods"]) - 1
    assert not [line for line in shims if held["id"] in line]
    crashed = k3s["after_crash"]
    assert f"{K3S_NETWORK}-{held['id']}-eth0" not in crashed["results"]
    assert f"cni-loopback-{held['id']}-lo" in crashed["results"]
    assert crashed["ips"][held["ip"]] == f"{held['id']}\r\neth0"
    inventory = k3s["inventory_after_crash"]
    assert (inventory["undecided"], inventory["unsaved"]) == ([], [held["id"]])
    entry = {e["path"]: e for e in k3s["reaper"]["report"]["entries"]}[
        f"cni-loopback-{held['id']}-lo"
    ]
    assert (entry["action"], entry["outcome"]) == ("del-and-quarantine", "done"), entry
    assert entry["del"]["plugins_run"] == ["loopback"], entry["del"]
    assert f"cni-loopback-{held['id']}-lo" not in k3s["after_reaper"]["results"]
    assert inventory["known"] == sorted(p["id"] for p in k3s["pods"] if p["fate"] != "held")
    assert inventory["unreadable"] == []


def test_k3s_the_held_sandboxs_address_is_released_as_an_orphan(k3s: dict[str, Any]) -> None:
    """No results entry owns the held sandbox's address: the reaper DELs it through the
    network's config with the owner's ID and ifname, and it is gone before containerd starts;
    containerd's own StopPodSandbox and RemovePodSandbox of the sandbox then succeed.

    The 1.6.20 here would free it too when kubelet stops the sandbox: its StopPodSandbox runs
    the DEL of a record without a CNI result (with no cached result, which host-local takes).
    The releases that skip that DEL (1.6.37 and later 1.6, 1.7.23 to 1.7.30, ...) would leave
    it reserved for good; which release starts next is not on disk, so the reaper frees it."""
    (held,) = pods_of(k3s, "held")
    doc = reservation_doc(k3s["reaper"], held["ip"])
    assert (doc["action"], doc["outcome"]) == ("del", "done")
    assert doc["owner"] == {"container_id": held["id"], "ifname": "eth0"}
    assert doc["reason"].startswith("an orphan")
    assert doc["del"]["released"] == [held["ip"]]
    assert held["ip"] not in k3s["after_reaper"]["ips"]
    assert held["id"] in k3s["listed_after_reboot"]
    outcome = k3s["teardown"][held["id"]]
    assert (outcome["stop"], outcome["remove"]) == (None, None)


def test_k3s_deleted_results_files_leave_no_address_reserved(k3s: dict[str, Any]) -> None:
    """Results files deleted outright, as the rm -rf peers delete them all: their owners'
    reservations are orphans, DEL'd by the reaper and gone before containerd starts;
    containerd then stops and removes the sandboxes (its DEL runs with no cached result, which
    works: containerd 1.6.20 would have freed these addresses at StopPodSandbox on its own, as
    its records hold the CNI result) and no address is left."""
    for pod in pods_of(k3s, "deleted"):
        assert not [name for name in k3s["after_crash"]["results"] if pod["id"] in name]
        assert k3s["after_crash"]["ips"][pod["ip"]] == f"{pod['id']}\r\neth0"
        doc = reservation_doc(k3s["reaper"], pod["ip"])
        assert (doc["action"], doc["outcome"]) == ("del", "done")
        assert doc["del"]["released"] == [pod["ip"]]
        assert pod["ip"] not in k3s["after_reaper"]["ips"]
        assert (k3s["teardown"][pod["id"]]["stop"], k3s["teardown"][pod["id"]]["remove"]) == (
            None,
            None,
        )
    assert k3s["final"]["ips"] == {}


def test_k3s_whole_entries_of_known_sandboxes_are_kept_for_containerd(
    k3s: dict[str, Any],
) -> None:
    """Entries containerd's records name, whole: the reaper leaves them and their reservations
    exactly as they were (bytes, inode, size, mtime, ctime), and containerd's own
    StopPodSandbox frees each address."""
    kept = pods_of(k3s, "kept")
    assert k3s["kept_after_reaper"] == k3s["kept_after_crash"]
    assert len(k3s["kept_after_crash"]) == 3 * len(kept)
    assert None not in k3s["kept_after_crash"].values()
    entries = {e["path"]: e for e in k3s["reaper"]["report"]["entries"]}
    known = "k3s: a sandbox container in namespace k8s.io: containerd loads it at start"
    reserved = k3s["after_reaper"]["ips"]
    for pod in kept:
        for name in (f"{K3S_NETWORK}-{pod['id']}-eth0", f"cni-loopback-{pod['id']}-lo"):
            assert (entries[name]["action"], entries[name]["outcome"]) == ("keep", "skipped")
            assert known in entries[name]["reason"]
        assert reserved[pod["ip"]] == f"{pod['id']}\r\neth0"
        assert not [r for r in k3s["reaper"]["report"]["host_local"] if r["ip"] == pod["ip"]]
    (pool,) = k3s["reaper"]["report"]["pools"]
    assert (pool["left"], pool["left_by_owner"]) == (len(kept), {"runtime": len(kept)})
    # containerd's StopPodSandbox of each frees its address and its entries, and only those.
    for pod in kept:
        after_stop = k3s["teardown"][pod["id"]]["after_stop"]
        assert pod["ip"] not in after_stop["ips"]
        assert not [name for name in after_stop["results"] if pod["id"] in name]
    first, second = kept
    assert k3s["teardown"][first["id"]]["after_stop"]["ips"] == {
        second["ip"]: f"{second['id']}\r\neth0"
    }


def test_k3s_damaged_entry_is_repaired_with_k3s_dirs(k3s: dict[str, Any]) -> None:
    (pod,) = pods_of(k3s, "damaged")
    name = f"{K3S_NETWORK}-{pod['id']}-eth0"
    entries = {e["path"]: e for e in k3s["reaper"]["report"]["entries"]}
    assert (entries[name]["content"], entries[name]["action"], entries[name]["outcome"]) == (
        "empty",
        "del-and-quarantine",
        "done",
    )
    assert pod["ip"] not in k3s["after_reaper"]["ips"]
    # Beside it, the held sandbox's whole cni-loopback entry (its ADD never saved its result).
    (held,) = pods_of(k3s, "held")
    loopback = f"cni-loopback-{held['id']}-lo"
    assert sorted(Path(p).name for p in k3s["quarantine"]) == sorted(
        [name, name + ".json", loopback, loopback + ".json"]
    )


def test_k3s_node_is_found_without_flags(k3s: dict[str, Any]) -> None:
    """Given only --root, the reaper finds k3s's generated containerd config, takes the conf
    and plugin dirs it names, reads k3s's containerd records, and DELs with k3s's plugins
    (`hold` is only there); run while that containerd answers on k3s's socket, it refuses."""
    run = k3s["reaper"]
    assert run["exit"] == 0, run["stderr"]
    assert run["argv"][-3:] == ["--root", str(Path(k3s["work"]) / "node"), "--json"]
    report = run["report"]
    data_dir = k3s["data_dir"]
    config = on_node(k3s, f"{data_dir}/agent/etc/containerd/config.toml")
    conf_dir = f"{data_dir}/agent/etc/cni/net.d"
    assert report["conf_dirs"] == [
        {"path": on_node(k3s, conf_dir), "sources": [f"k3s: {config}: {CRI_CNI_TABLE} conf_dir"]}
    ]
    (bin_dir,) = report["bin_dirs"]
    assert bin_dir["path"].startswith(on_node(k3s, f"{data_dir}/data/"))
    assert bin_dir["path"].endswith("/bin")
    assert bin_dir["sources"] == [f"k3s: {config}: {CRI_CNI_TABLE} bin_dir"]
    records = [line for line in report["runtime_records"] if line.startswith("k3s: ")]
    assert records == [
        f"k3s: {on_node(k3s, f'{data_dir}/agent/containerd')}"
        "/io.containerd.metadata.v1.bolt/meta.db: 6 sandboxes (namespace k8s.io: 6), 1 whose "
        "CNI ADD never saved its result"
    ]
    for doc in report["host_local"]:
        assert doc["del"]["config"] == on_node(k3s, conf_dir + "/10-cbr0.conflist")
        assert doc["del"]["plugins_run"] == ["portmap", "hold", "bridge"]
    assert report["boot"]["previous_boot_crashed"] is True
    up = k3s["reaper_while_runtime_up"]
    assert up["exit"] == 75
    assert (
        f"a container runtime is running (it answers on {on_node(k3s, K3S_SOCKET)})"
        in (up["stderr"])
    )
    assert up["tree_unchanged"] is True


def test_k3s_every_sandbox_stops_and_no_address_or_entry_is_left(k3s: dict[str, Any]) -> None:
    assert sorted(k3s["listed_after_reboot"]) == sorted(p["id"] for p in k3s["pods"])
    for pod in k3s["pods"]:
        outcome = k3s["teardown"][pod["id"]]
        assert (outcome["stop"], outcome["remove"]) == (None, None)
    assert k3s["listed_after_teardown"] == []
    assert k3s["final"] == {"results": [], "ips": {}}
    final = k3s["inventory_final"]
    assert (final["known"], final["undecided"], final["unreadable"]) == ([], [], [])
    assert k3s["containerd_stop_exit"] == 0
    assert processes_mentioning(k3s["work"]) == []
    assert k3s["cgroups_left"] == []
