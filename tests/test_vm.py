"""The whole story on a booted node: a Debian bookworm image under qemu, systemd as PID 1, the
cni-reaper package installed and its unit enabled as an image builder does it, containerd
running pods; a real kernel crash while pods are set up; a real boot after it.

The image is built in the test run (tests/vm/build_image.sh, from packages .ci/run fetched);
each scenario boots its own copy-on-write layer of it. The driver in the guest
(tests/vm/guest/driver.py) runs each boot's steps and reports on the serial console. Select
these tests alone with `pytest -m vm`.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.private_node import cannot_run
from tests.vm.machine import Boot, Image, Node, have_tools

REPO = Path(__file__).resolve().parent.parent
DEBS = Path(os.environ.get("CNI_REAPER_VM_DEBS", REPO / ".test-cache/vm-debs.tgz"))
SEED_ERROR = 'failed to get network "podnet" cached result: decoding version from network config'
pytestmark = pytest.mark.vm


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Image:
    if os.geteuid() != 0:
        cannot_run("needs root to build the image (debootstrap, chroot)")
    reason = have_tools()
    if reason:
        cannot_run(reason)
    if not DEBS.is_file():
        cannot_run(f"no packages at {DEBS}: run tests/vm/build_image.sh debs {DEBS}")
    work = tmp_path_factory.mktemp("vm-image")
    built = subprocess.run(
        [str(REPO / "packaging/build-deb.sh"), str(work)], capture_output=True, text=True
    )
    assert built.returncode == 0, built.stderr[-3000:]
    deb = built.stdout.strip().splitlines()[-1]
    made = subprocess.run(
        [str(REPO / "tests/vm/build_image.sh"), "image", str(DEBS), deb, str(work / "image")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert made.returncode == 0, made.stdout[-3000:] + made.stderr[-3000:]
    return Image(work / "image")


def scenario(image: Image, work: Path, first: str, cmdline: str = "") -> tuple[Node, Boot, Boot]:
    node = Node(image, work)
    return node, node.boot(first), node.boot("check", cmdline)


@pytest.fixture(scope="module")
def crash(image: Image, tmp_path_factory: pytest.TempPathFactory) -> tuple[Node, Boot, Boot]:
    return scenario(image, tmp_path_factory.mktemp("vm-crash"), "setup-crash")


@pytest.fixture(scope="module")
def crash_disabled(
    image: Image, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Node, Boot, Boot]:
    return scenario(
        image, tmp_path_factory.mktemp("vm-disabled"), "setup-crash", "cni-reaper.disable"
    )


@pytest.fixture(scope="module")
def clean(image: Image, tmp_path_factory: pytest.TempPathFactory) -> tuple[Node, Boot, Boot]:
    return scenario(image, tmp_path_factory.mktemp("vm-clean"), "setup-clean")


def reaper_records(boot: Boot) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = boot.one("boot")["journal"]
    return records


def summary(boot: Boot) -> dict[str, Any]:
    found = [r for r in reaper_records(boot) if r.get("CNI_REAPER_EVENT") == "summary"]
    assert len(found) == 1, boot.serial[-3000:]
    return found[0]


def podnet_files(sizes: dict[str, int]) -> dict[str, int]:
    return {name: size for name, size in sizes.items() if name.startswith("podnet-")}


# --- a crash during pod setup, cni-reaper in its place in the boot -----------------------------


def test_boot_1_ran_pods_and_crashed_while_more_were_set_up(
    crash: tuple[Node, Boot, Boot],
) -> None:
    _, first, _ = crash
    pods = first.one("pods")["pods"]
    assert [p["name"] for p in pods] == ["synced-0", "synced-1", "committed-0", "committed-1"]
    assert all(p["ip"].startswith("10.88.0.") for p in pods)
    first.one("crashing")
    assert "Kernel panic" in first.serial or "sysrq: Trigger a crash" in first.serial


def test_boot_2_ran_the_reaper_before_containerd(crash: tuple[Node, Boot, Boot]) -> None:
    _, _, second = crash
    facts = second.one("boot")
    reaper, containerd = facts["reaper"], facts["containerd"]
    assert (reaper["Result"], reaper["ActiveState"], reaper["ExecMainStatus"]) == (
        "success",
        "active",
        "0",
    )
    reaper_done = int(reaper["ExecMainExitTimestampMonotonic"])
    assert 0 < reaper_done < int(containerd["ExecMainStartTimestampMonotonic"])
    print(
        f"reaper exited at {reaper_done / 1e6:.2f} s, containerd started at "
        f"{int(containerd['ExecMainStartTimestampMonotonic']) / 1e6:.2f} s of uptime"
    )


def test_the_reaper_named_the_crash_replayed_del_and_quarantined(
    crash: tuple[Node, Boot, Boot],
) -> None:
    _, _, second = crash
    assert summary(second)["CNI_REAPER_PREVIOUS_BOOT_CRASHED"] == "1"
    # Both kinds of evidence agree: boot 1 started the reaper but never stopped it, and wtmp
    # has its boot record (written well before the crash) with no shutdown after it.
    assert summary(second)["CNI_REAPER_SHUTDOWN_MARKER"] == "unclean"
    assert summary(second)["CNI_REAPER_WTMP_PREVIOUS_BOOT"] == "crashed"
    assert summary(second)["CNI_REAPER_EXIT_CODE"] == "0"
    repaired = [
        r
        for r in reaper_records(second)
        if r.get("CNI_REAPER_EVENT") == "repaired"
        and r["CNI_REAPER_ACTION"] == "del-and-quarantine"
    ]
    # The crash left at least one podnet cache file of boot 1 empty: the bug is reproduced,
    # and its DEL ran with the real plugins under the hardened unit.
    assert repaired, reaper_records(second)
    quarantined = {Path(p).name for p in second.one("boot")["quarantine"]}
    for record in repaired:
        assert record["CNI_REAPER_CONTENT"] in ("empty", "zeroed", "truncated")
        assert record["CNI_REAPER_WRITTEN"] == "previous-boot"
        assert record["CNI_REAPER_OUTCOME"] == "done"
        assert record["CNI_REAPER_FILE"] in quarantined
        assert record["CNI_REAPER_FILE"] + ".json" in quarantined
    assert not any(r.get("CNI_REAPER_EVENT") == "repair-failed" for r in reaper_records(second))


def test_then_containerd_tears_every_sandbox_down_and_no_ip_is_left(
    crash: tuple[Node, Boot, Boot],
) -> None:
    node, first, second = crash
    teardown = second.one("teardown")
    boot_1_ids = {p["id"] for p in first.one("pods")["pods"]}
    assert boot_1_ids <= set(teardown["teardown"])
    for outcome in teardown["teardown"].values():
        assert outcome == {"stop": None, "remove": None}
    assert teardown["left"] == []
    assert teardown["reserved"] == {}
    assert teardown["results"] == {}
    # The same, read from the disk afterwards.
    shown = node.read_disk("ls /var/lib/cni/results", "ls /var/lib/cni/networks/podnet")
    assert "podnet-" not in shown and "10.88.0." not in shown


# --- the same crash with cni-reaper switched off on the kernel command line ---------------------


def test_switched_off_the_runtime_is_stuck_on_the_seed_error(
    crash_disabled: tuple[Node, Boot, Boot],
) -> None:
    _, _, second = crash_disabled
    facts = second.one("boot")
    assert "cni-reaper.disable" in facts["cmdline"]
    assert facts["reaper"]["ConditionResult"] == "no"
    assert reaper_records(second) == []
    empty = {
        name.split("-", 1)[1].rsplit("-", 1)[0]
        for name, size in podnet_files(facts["results"]).items()
        if size == 0
    }
    assert empty, facts["results"]
    teardown = second.one("teardown")["teardown"]
    for sandbox_id in empty:
        assert SEED_ERROR in (teardown[sandbox_id]["stop"] or "")


# --- a clean reboot --------------------------------------------------------------------------


def test_a_restart_in_the_middle_of_a_boot_writes_no_marker_and_changes_nothing(
    clean: tuple[Node, Boot, Boot],
) -> None:
    _, first, _ = clean
    restarted = first.one("restarted")
    assert restarted["exit"] == 0, restarted["stderr"]
    # ExecStop ran, but systemd was not stopping: no marker. The new run refused (75), which
    # leaves the unit active, so its ExecStop still runs at the real shutdown.
    assert restarted["marker"] is False
    reaper = restarted["reaper"]
    assert (reaper["ActiveState"], reaper["Result"], reaper["ExecMainStatus"]) == (
        "active",
        "success",
        "75",
    )
    pods = first.one("pods")
    assert (restarted["results"], restarted["reserved"]) == (pods["results"], pods["reserved"])


def test_after_a_clean_shutdown_the_reaper_touches_nothing(
    clean: tuple[Node, Boot, Boot],
) -> None:
    _, first, second = clean
    facts = second.one("boot")
    record = summary(second)
    assert record["CNI_REAPER_PREVIOUS_BOOT_CRASHED"] == "0"
    assert record["CNI_REAPER_SHUTDOWN_MARKER"] == "clean"
    assert record["CNI_REAPER_WTMP_PREVIOUS_BOOT"] == "clean"
    assert record["CNI_REAPER_EXIT_CODE"] == "0"
    assert facts["quarantine"] == []
    assert podnet_files(facts["results"]) == podnet_files(first.one("pods")["results"])
    assert not [r for r in reaper_records(second) if r.get("CNI_REAPER_EVENT") != "summary"]
    assert "reboot: Power down" in first.serial
