"""The clean-shutdown marker across boots: written at stop, read and consumed by the next boot."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from cni_reaper import cli
from cni_reaper.errors import ExitCode
from tests.crashed import Crashed

BOOT_A = "aaaaaaaa-0000-4000-8000-000000000001"
BOOT_B = "bbbbbbbb-0000-4000-8000-000000000002"
BOOT_C = "cccccccc-0000-4000-8000-000000000003"


class Node:
    """Boots of one node: each with its own boot id; wtmp optional (Debian 13 has none)."""

    def __init__(self, crashed: Crashed, capsys: pytest.CaptureFixture[str], wtmp: bool) -> None:
        self.crashed = crashed
        self.capsys = capsys
        self.wtmp = wtmp
        self.state = crashed.node.root / "var/lib/cni-reaper"
        self.clock = crashed.t0

    def boot(self, boot_id: str, at: float, clean_before: bool = False) -> None:
        """Boot at `at`; clean_before writes wtmp's shutdown record for the boot before."""
        node = self.crashed.node
        if clean_before:
            node.shutdown(at - 5)
        node.boot(at)
        node.write_boot_world(btime=at - 1, boot_id=boot_id)
        if not self.wtmp:
            (node.root / "var/log/wtmp").unlink()
        self.clock = at + 30

    def run(self, *extra: str) -> tuple[int, dict[str, Any]]:
        code = cli.run(self.crashed.argv("--json", *extra), clock=lambda: self.clock, environ={})
        return int(code), json.loads(self.capsys.readouterr().out)

    def ran_and_shut_down(self, boot_id: str, at: float) -> None:
        """A boot in which the unit ran at start, and its ExecStop at a clean shutdown."""
        self.boot(boot_id, at)
        self.run()
        self.stop()

    def stop(self, system: str = "stopping") -> int:
        """The unit's ExecStop: at a clean shutdown, systemd says the system is stopping."""
        self.clock += 60
        code = cli.run(
            self.crashed.argv("--mark-clean-shutdown"),
            clock=lambda: self.clock,
            system_state=lambda: system,
        )
        return int(code)

    def marker(self) -> dict[str, Any] | None:
        path = self.state / "clean-shutdown"
        return json.loads(path.read_text()) if path.exists() else None


@pytest.fixture(params=[True, False], ids=["wtmp", "no-wtmp"])
def boots(crashed: Crashed, capsys: pytest.CaptureFixture[str], request: Any) -> Node:
    return Node(crashed, capsys, wtmp=request.param)


def test_exec_stop_writes_a_durable_marker_naming_this_boot(boots: Node) -> None:
    node = boots
    node.boot(BOOT_A, node.crashed.t0)
    assert node.stop() == ExitCode.OK
    assert node.marker() == {"boot_id": BOOT_A, "time": node.clock}
    assert (node.state / "clean-shutdown").stat().st_mode & 0o777 == 0o600
    assert sorted(os.listdir(node.state)) == ["clean-shutdown"]  # no temp file left


@pytest.mark.parametrize("system", ["running", "degraded", "starting", "unknown (no systemd)"])
def test_exec_stop_in_the_middle_of_a_boot_writes_no_marker(
    boots: Node, system: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """systemctl restart cni-reaper runs ExecStop while the node goes on: its boot has not
    ended, cleanly or not."""
    node = boots
    node.boot(BOOT_A, node.crashed.t0)
    assert node.stop(system) == ExitCode.OK
    assert node.marker() is None
    assert f"not shutting down (systemctl is-system-running: {system})" in capsys.readouterr().err
    # At the real shutdown later, it is written; the next boot reads the boot as clean.
    assert node.stop() == ExitCode.OK
    assert node.marker() == {"boot_id": BOOT_A, "time": node.clock}


def test_the_real_systemctl_is_asked(crashed: Crashed, capsys: pytest.CaptureFixture[str]) -> None:
    """Without a system state given, systemd itself is asked: here, not shutting down."""
    crashed.reboot()
    assert cli.main(crashed.argv("--mark-clean-shutdown")) == ExitCode.OK
    assert not (crashed.node.root / "var/lib/cni-reaper/clean-shutdown").exists()
    assert "no clean-shutdown marker written" in capsys.readouterr().err


def test_clean_shutdown_is_read_then_consumed(boots: Node) -> None:
    node = boots
    t0 = node.crashed.t0
    node.ran_and_shut_down(BOOT_A, t0)
    node.boot(BOOT_B, t0 + 1000, clean_before=True)

    code, report = node.run()

    assert code == ExitCode.OK
    marker = report["boot"]["shutdown_marker"]
    assert (marker["state"], marker["boot_id"]) == ("clean", BOOT_A)
    assert report["boot"]["previous_boot_crashed"] is False
    assert node.marker() is None
    last_run = json.loads((node.state / "last-run").read_text())
    assert last_run["boot_id"] == BOOT_B


def test_a_later_run_of_the_boot_says_its_reading_is_the_first_runs(boots: Node) -> None:
    """The first run consumed the marker: a run after it (by hand, after a crash of the
    reaper) reports the reading that run kept, and says whose it is, once."""
    node = boots
    t0 = node.crashed.t0
    node.ran_and_shut_down(BOOT_A, t0)
    node.boot(BOOT_B, t0 + 1000, clean_before=True)
    _, first = node.run()
    assert node.marker() is None

    later = [node.run()[1]["boot"]["shutdown_marker"] for _ in range(2)]

    said = first["boot"]["shutdown_marker"]
    assert said["detail"] == "clean-shutdown marker written at stop"
    for marker in later:
        assert (marker["state"], marker["boot_id"], marker["time"]) == (
            "clean",
            BOOT_A,
            said["time"],
        )
        assert (
            marker["detail"] == said["detail"] + "; as this boot's first real run read the markers"
        )


def test_a_boot_that_ran_the_reaper_but_never_stopped_it_crashed(boots: Node) -> None:
    node = boots
    t0 = node.crashed.t0
    node.boot(BOOT_A, t0)
    node.run()
    # No ExecStop: power cut. wtmp would even be fooled by a shutdown record written
    # before the last cache writes; the marker is written only after the runtime stopped.
    node.boot(BOOT_B, t0 + 1000)

    _, report = node.run()

    marker = report["boot"]["shutdown_marker"]
    assert (marker["state"], marker["boot_id"]) == ("unclean", BOOT_A)
    assert report["boot"]["previous_boot_crashed"] is True


def test_marker_of_an_older_boot_does_not_speak_for_the_previous_one(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    # Only wtmp can show a boot in which the reaper did not run.
    node = Node(crashed, capsys, wtmp=True)
    t0 = node.crashed.t0
    node.ran_and_shut_down(BOOT_A, t0)
    # Boot B ran with the kill switch on (no run, no stop) and crashed.
    node.boot(BOOT_B, t0 + 1000, clean_before=True)
    node.boot(BOOT_C, t0 + 2000)

    _, report = node.run()

    assert report["boot"]["shutdown_marker"]["boot_id"] == BOOT_A
    assert report["boot"]["previous_boot_crashed"] is True  # wtmp: B has no shutdown record


def test_dry_run_reads_the_marker_but_leaves_it(boots: Node) -> None:
    node = boots
    t0 = node.crashed.t0
    node.ran_and_shut_down(BOOT_A, t0)
    node.boot(BOOT_B, t0 + 1000, clean_before=True)
    before = node.marker()

    _, report = node.run("--dry-run")

    assert report["boot"]["shutdown_marker"]["state"] == "clean"
    assert node.marker() == before
    assert json.loads((node.state / "last-run").read_text())["boot_id"] == BOOT_A


def test_later_runs_in_the_same_boot_see_what_the_first_saw(boots: Node) -> None:
    node = boots
    t0 = node.crashed.t0
    node.ran_and_shut_down(BOOT_A, t0)
    node.boot(BOOT_B, t0 + 1000, clean_before=True)
    node.run()
    # This boot's own stop, then a run by hand: neither changes what is known of boot A.
    node.stop()

    _, report = node.run()

    marker = report["boot"]["shutdown_marker"]
    assert (marker["state"], marker["boot_id"]) == ("clean", BOOT_A)
    assert node.marker() is not None and node.marker() == {"boot_id": BOOT_B, "time": node.clock}


def test_first_boot_ever_knows_nothing_from_markers(boots: Node) -> None:
    node = boots
    node.boot(BOOT_A, node.crashed.t0)
    _, report = node.run()
    assert report["boot"]["shutdown_marker"]["state"] == "unknown"


def test_a_symlinked_marker_is_not_followed(boots: Node, tmp_path: Path) -> None:
    node = boots
    t0 = node.crashed.t0
    node.boot(BOOT_A, t0)
    node.run()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text(json.dumps({"boot_id": BOOT_A, "time": t0 + 40}))
    (node.state / "clean-shutdown").symlink_to(elsewhere)
    node.boot(BOOT_B, t0 + 1000)

    _, report = node.run()

    assert report["boot"]["shutdown_marker"]["state"] == "unclean"


@pytest.mark.parametrize(
    ("marker", "then"),
    [("clean-shutdown", "unclean"), ("last-run", "clean")],
)
def test_a_marker_nested_past_the_decoders_depth_reads_as_no_marker(
    boots: Node, marker: str, then: str
) -> None:
    """4,096 bytes of brackets (the most a marker is read) nest deeper than 3.9 to 3.11 decode:
    that marker says nothing, the other speaks, and the run goes on (it was an internal error).
    """
    node = boots
    t0 = node.crashed.t0
    node.ran_and_shut_down(BOOT_A, t0)
    (node.state / marker).write_text("[" * 2000 + "]" * 2000)
    node.boot(BOOT_B, t0 + 1000)

    code, report = node.run()

    assert code == ExitCode.OK
    assert report["boot"]["shutdown_marker"]["state"] == then
