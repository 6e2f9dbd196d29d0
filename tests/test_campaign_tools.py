"""The crash campaign's host side without a VM: branches of one disk state (real qemu-img
layers), and how a policy boot's reports become its figures and breaches."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.private_node import cannot_run
from tests.vm import campaign, crash_state
from tests.vm.machine import Boot, Image, Node, _said


def backing_chain(layer: Path) -> list[str]:
    shown = subprocess.run(
        ["qemu-img", "info", "--backing-chain", "--output=json", str(layer)],
        capture_output=True,
        text=True,
        check=True,
    )
    return [Path(doc["filename"]).name for doc in json.loads(shown.stdout)]


def test_two_branches_of_a_crashed_layer_each_stand_on_it_alone(tmp_path: Path) -> None:
    if shutil.which("qemu-img") is None:
        cannot_run("needs qemu-img (Debian package qemu-utils)")
    image = Image(tmp_path / "image")
    image.dir.mkdir()
    subprocess.run(["truncate", "-s", "16M", str(image.disk)], check=True)
    crashed = Node(image, tmp_path / "crash")
    crashed.work.mkdir()
    crashed.overlay = crashed._layer("boot-1-churn")
    first = crashed.branch(tmp_path / "reaper")._layer("boot-2-campaign-check")
    second = crashed.branch(tmp_path / "none")._layer("boot-2-campaign-check")
    assert first != second
    for layer in (first, second):
        assert backing_chain(layer) == [
            "boot-2-campaign-check.qcow2",
            "boot-1-churn.qcow2",
            "disk.img",
        ]
    # Making the second branch's layer left the first branch's as it was.
    assert first.is_file() and second.is_file()


def test_a_crashed_disks_node_state_is_kept_with_its_modes_and_times(tmp_path: Path) -> None:
    for tool in ("qemu-img", "mkfs.ext4", "debugfs", "e2fsck"):
        if shutil.which(tool) is None:
            cannot_run(f"needs {tool} (Debian packages qemu-utils, e2fsprogs)")
    made = tmp_path / "made"
    results = made / "var/lib/cni/results"
    results.mkdir(parents=True)
    entry = results / "podnet-abc-eth0"
    entry.write_bytes(b"")  # what a crash leaves of an unsynced write
    entry.chmod(0o600)
    os.utime(entry, (1796094679, 1796094679))
    (made / "etc/cni/net.d").mkdir(parents=True)
    (made / "etc/cni/net.d/10-podnet.conflist").write_text("{}")
    (made / "var/log/journal").mkdir(parents=True)  # not node state: left out
    (made / "var/log/journal/system.journal").write_bytes(b"x" * 4096)
    raw = tmp_path / "disk.raw"
    subprocess.run(["truncate", "-s", "32M", str(raw)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-d", str(made), str(raw)], check=True)
    churn = tmp_path / "crash-7/churn"
    churn.mkdir(parents=True)
    layer = churn / "boot-1-churn.qcow2"
    subprocess.run(["qemu-img", "convert", "-O", "qcow2", str(raw), str(layer)], check=True)

    out = tmp_path / "state.tar.xz"
    kept = crash_state.keep(crash_state.crashed_layer(tmp_path / "crash-7"), out)

    assert kept == ["etc/cni/net.d/10-podnet.conflist", "var/lib/cni/results/podnet-abc-eth0"]
    # No containerd records on this disk: a replay of it would be told so.
    assert crash_state.missing(kept) == [
        "var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db"
    ]
    with tarfile.open(out) as archive:
        member = archive.getmember("var/lib/cni/results/podnet-abc-eth0")
    assert (member.size, member.mode, member.mtime) == (0, 0o600, 1796094679)


def report(kind: str, **facts: object) -> str:
    return "VMTEST-JSON " + json.dumps({"kind": kind, **facts}) + "\n"


UNITS = {
    "cni-reaper.service": {
        "ActiveState": "active",
        "Result": "success",
        "ExecMainStatus": "0",
        "InactiveExitTimestampMonotonic": "9000000",
        "ExecMainStartTimestampMonotonic": "8999000",
        "ActiveEnterTimestampMonotonic": "11500000",
    },
    "vmtest-rm-results.service": {"ActiveEnterTimestampMonotonic": "0"},
    "containerd.service": {},
}


def policy_boot(tmp_path: Path, teardown: dict[str, object], quarantine: list[str]) -> Boot:
    boot_id = "b0"
    serial = report(
        "boot",
        policy="reaper",
        units=UNITS,
        journal=[
            {
                "CNI_REAPER_EVENT": "repaired",
                "CNI_REAPER_QUARANTINED_TO": f"{campaign.QUARANTINE}{boot_id}/podnet-a-eth0",
            },
            {
                "CNI_REAPER_EVENT": "summary",
                "CNI_REAPER_SECONDS": "1.250",
                "CNI_REAPER_SECONDS_TO_PLAN": "0.750",
                # as journald stamped it: 1.25 s after the run began, 0.2 s after the fork
                "__MONOTONIC_TIMESTAMP": "10449000",
            },
        ],
        results={},
        quarantine=quarantine,
        reserved={},
        boot_id=boot_id,
        cmdline="",
    ) + report("teardown", **teardown)
    (tmp_path / "boot-2-campaign-check-1.log").write_text(serial)
    return Boot(serial, 60.0, _said(serial))


def pod(**changes: object) -> dict[str, object]:
    """The new pod's network as the guest reports it, whole unless changed."""
    network: dict[str, object] = {
        "ready": True,
        "ip": "10.88.0.9",
        "results": {"cni-loopback-l-lo": "5e6f", "podnet-l-eth0": "1f2e", "ptpnet-l-eth1": "3c4d"},
        "reserved": {"podnet": ["10.88.0.9"], "ptpnet": ["10.99.0.9"]},
        "routes": ["10.88.0.9 dev cni0", "10.99.0.9 dev veth1a2b"],
        "inside": ["eth0 10.88.0.9/24", "eth1 10.99.0.9/24"],
        "nat_rules": 6,
    }
    network.update(changes)
    return network


KEPT = {
    "id": "l",
    "error": None,
    "aimed_at": {"podnet": "10.88.0.9", "ptpnet": "10.99.0.2"},
    "before": pod(),
    "after": pod(),
    "teardown": {},
}


def test_a_clean_teardown_breaks_nothing_and_the_hold_is_systemds(tmp_path: Path) -> None:
    q = f"{campaign.QUARANTINE}b0/podnet-a-eth0"
    boot = policy_boot(
        tmp_path,
        {
            "teardown": {"a": {"name": "w0-1", "stop": None, "remove": None}},
            "live": {**KEPT, "teardown": {"stop": None, "remove": None}},
            "left": [],
            "results": {},
            "reserved": {"podnet": {}, "ptpnet": {}},
        },
        [q, q + ".json"],
    )
    outcome = campaign.judge("reaper", boot, tmp_path)
    assert campaign.breaches(outcome) == []
    # It got the lowest free address it was aimed at on podnet; ptpnet gave it another.
    assert outcome["live"]["reused"] == ["podnet"]
    # From its fork (ExecMainStart, before InactiveExit) until it was up: 2.501 s.
    assert outcome["held_back"] == 2.501
    assert outcome["serial"] == [str(tmp_path / "boot-2-campaign-check-1.log")]
    # Of the 2.501 s, the reaper's run timed itself at 1.25 s, 0.75 s of it to the plan; it
    # began 0.2 s after the fork.
    assert outcome["reaper_seconds"] == {"to_plan": 0.75, "in_all": 1.25, "before_start": 0.2}
    assert campaign.reaper_account([{"policies": {"reaper": outcome}}]) == (
        "reaper, 1 boots (medians): held containerd back 2.50 s; its run 1.25 s from its "
        "start, 0.75 s of it until the plan was made; the rest 1.25 s, 0.20 s of it from the "
        "unit's fork until the run's start (systemd's sandbox, the interpreter's start, the "
        "imports)"
    )


def test_a_stuck_sandbox_a_leaked_address_and_a_stray_file_are_each_named(
    tmp_path: Path,
) -> None:
    stray = f"{campaign.QUARANTINE}b0/ptpnet-b-eth1"
    boot = policy_boot(
        tmp_path,
        {
            "teardown": {
                "b": {"name": "w1-2", "stop": "failed to destroy network", "remove": None}
            },
            "live": KEPT,
            "left": ["b"],
            "results": {"ptpnet-b-eth1": 0},
            "reserved": {"podnet": {}, "ptpnet": {"10.99.0.7": "b\r\neth1"}},
        },
        [stray],
    )
    outcome = campaign.judge("reaper", boot, tmp_path)
    assert campaign.breaches(outcome) == [
        "1 sandboxes stuck",
        "1 addresses leaked",
        "1 results files left",
        "1 quarantined files unaccounted for",
    ]
    assert outcome["leaked"] == {"ptpnet": ["10.99.0.7"]}
    table = campaign.table([{"policies": {"reaper": outcome}}], ["reaper"])
    # The stuck sandbox, still listed, is counted once.
    assert table.splitlines()[1].split()[:6] == ["reaper", "1", "1/1", "1/1", "1/1", "1"]


@pytest.mark.parametrize(
    ("live", "breach"),
    [
        (
            {**KEPT, "after": pod(reserved={"podnet": [], "ptpnet": ["10.99.0.9"]})},
            "a new pod's network changed under the teardown: reserved",
        ),
        (
            {**KEPT, "after": pod(inside=["eth1 10.99.0.9/24"], nat_rules=0)},
            "a new pod's network changed under the teardown: inside, nat_rules",
        ),
        (
            {
                **KEPT,
                "before": pod(results={"podnet-l-eth0": "1f2e"}),
                "after": pod(results={"podnet-l-eth0": "1f2e"}),
            },
            "a new pod started without ptpnet's results file",
        ),
        (
            {**KEPT, "after": pod(routes=["10.88.0.9 dev cni0"])},
            "a new pod's network changed under the teardown: routes",
        ),
        (
            {**KEPT, "after": None, "after_error": "CriError: sandbox not found"},
            "a new pod's network was lost: CriError: sandbox not found",
        ),
        (
            {"id": None, "error": "failed to setup network", "before": None, "after": None},
            "a new pod could not start: failed to setup network",
        ),
    ],
)
def test_a_new_pod_that_lost_its_network_is_a_breach(
    tmp_path: Path, live: dict[str, object], breach: str
) -> None:
    boot = policy_boot(
        tmp_path,
        {
            "teardown": {"a": {"name": "w0-1", "stop": None, "remove": None}},
            "live": live,
            "left": [],
            "results": {},
            "reserved": {"podnet": {}, "ptpnet": {}},
        },
        [],
    )
    outcome = campaign.judge("none", boot, tmp_path)
    assert campaign.breaches(outcome) == [breach]
    table = campaign.table([{"policies": {"none": outcome}}], ["none"])
    assert table.splitlines()[1].split()[5:7] == ["0", "1"]


def test_a_new_pod_whose_own_teardown_failed_is_stuck(tmp_path: Path) -> None:
    live = {**KEPT, "teardown": {"stop": None, "remove": "failed to remove sandbox"}}
    boot = policy_boot(
        tmp_path,
        {"teardown": {}, "live": live, "left": [], "results": {}, "reserved": {}},
        [],
    )
    outcome = campaign.judge("none", boot, tmp_path)
    assert campaign.breaches(outcome) == ["1 sandboxes stuck"]


def test_a_seed_run_again_replaces_its_entry_in_the_record(tmp_path: Path) -> None:
    path = tmp_path / "campaign.json"
    for crash in ({"seed": 5, "run": 1}, {"seed": 4, "run": 1}, {"seed": 5, "run": 2}):
        campaign.record(path, crash)
    assert json.loads(path.read_text()) == [{"seed": 4, "run": 1}, {"seed": 5, "run": 2}]


def test_a_boot_that_never_reported_its_teardown_is_a_breach(tmp_path: Path) -> None:
    serial = report("error", error="CriError: Version: deadline exceeded")
    outcome = campaign.judge("reaper", Boot(serial, 1.0, _said(serial)), tmp_path)
    assert campaign.breaches(outcome) == ["no report: CriError: Version: deadline exceeded"]


@pytest.mark.parametrize("policy", sorted(campaign.POLICIES))
def test_only_the_reaper_policy_leaves_the_reaper_switched_on(policy: str) -> None:
    line = campaign.POLICIES[policy]
    assert f"vmtest.policy={policy}" in line.split()
    assert ("cni-reaper.disable" in line.split()) == (policy != "reaper")
