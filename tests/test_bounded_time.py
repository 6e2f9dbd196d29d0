"""Bounded time: a plugin that keeps hanging is not started again, and no DEL starts after the
run's deadline; the run still quarantines per policy and ends with its summary, its metrics and
its exit code. (A fake plugin: no real plugin hangs on cue.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cni_reaper import cli
from cni_reaper.errors import ExitCode
from cni_reaper.repair import budget
from tests.crashed import Crashed
from tests.nodetree import CONTAINER_IDS

ENTRIES = 10


def hanging_network(crashed: Crashed, log: Path) -> list[str]:
    """A network whose plugin notes each start, then hangs; ten damaged files of it."""
    crashed.node.fake_plugin_network("hung", "hang", f'echo start >> "{log}"\nexec sleep 300\n')
    return [
        crashed.node.write_result(f"hung-{cid}-eth0", b"").name for cid in CONTAINER_IDS[:ENTRIES]
    ]


def run(crashed: Crashed, capsys: pytest.CaptureFixture[str], *extra: str) -> dict[str, Any]:
    crashed.reboot()
    bin_dir = str(crashed.node.root / "opt/cni/bin")
    code, report = crashed.run(capsys, "--bin-dir", bin_dir, *extra)
    assert code == ExitCode.ACTION_FAILED
    assert report["summary"]["exit_code"] == ExitCode.ACTION_FAILED
    return report


def test_a_plugin_that_keeps_timing_out_is_not_started_again(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = tmp_path / "starts"
    names = hanging_network(crashed, log)

    report = run(crashed, capsys, "--plugin-timeout", "0.3")

    assert log.read_text().split() == ["start"] * budget.TRIP_AFTER
    errors = [e["plugin_errors"][0] for e in report["entries"]]
    timed_out = [e for e in errors if e["timed_out"]]
    assert len(timed_out) == budget.TRIP_AFTER
    plugin = crashed.node.root / "opt/cni/bin/hang"
    skipped = [e["msg"] for e in errors if not e["timed_out"]]
    assert skipped == [
        f"{plugin} timed out {budget.TRIP_AFTER} times in this run, so not started again"
    ] * (ENTRIES - budget.TRIP_AFTER)
    # The policy holds for every one of them: quarantined, so the runtime's own DEL can run.
    assert [e["outcome"] for e in report["entries"]] == ["failed"] * ENTRIES
    assert sorted(
        p.name for p in crashed.node.quarantine.rglob("hung-*") if p.suffix != ".json"
    ) == (sorted(names))


def test_no_del_starts_after_the_deadline_and_the_run_still_ends_whole(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    log = tmp_path / "starts"
    hanging_network(crashed, log)
    metrics = tmp_path / "cni-reaper.prom"

    report = run(
        crashed,
        capsys,
        "--plugin-timeout",
        "30",
        "--deadline",
        "1",
        "--metrics-file",
        str(metrics),
    )

    # The one plugin that started was cut at the deadline, not at its own 30 s.
    assert log.read_text().split() == ["start"]
    first, *rest = (e["plugin_errors"][0] for e in report["entries"])
    assert (first["timed_out"], first["msg"]) == (
        True,
        "killed at the run's deadline (1 s, --deadline)",
    )
    assert {e["msg"] for e in rest} == {
        "the run's deadline (1 s, --deadline) passed before it started"
    }
    assert [e["outcome"] for e in report["entries"]] == ["failed"] * ENTRIES
    assert report["summary"]["outcome"] == {"failed": ENTRIES}
    assert "cni_reaper_exit_code 73" in metrics.read_text().splitlines()


def test_the_text_says_once_why_a_del_was_not_run(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The text report says why a DEL never started in one phrase, not "DEL not run: not
    attempted: ..." (found by an operator's review)."""
    hanging_network(crashed, tmp_path / "starts")
    crashed.reboot()
    bin_dir = str(crashed.node.root / "opt/cni/bin")
    argv = crashed.argv("--bin-dir", bin_dir, "--plugin-timeout", "30", "--deadline", "1")
    code = cli.run(argv, clock=lambda: crashed.t0 + 60, environ={})

    shown = capsys.readouterr().out
    assert code == ExitCode.ACTION_FAILED
    deadline = "the run's deadline (1 s, --deadline) passed before it started"
    assert shown.count(f"    error: DEL not run: {deadline}\n") == ENTRIES - 1, shown
    assert "not attempted:" not in shown


@pytest.mark.parametrize("value", ["0", "-1", "inf", "nan"])
def test_a_deadline_that_is_not_a_positive_number_is_a_usage_error(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    crashed.reboot()
    assert crashed.run_main("--deadline", value) == ExitCode.USAGE
    captured = capsys.readouterr()
    assert "--deadline must be a positive number of seconds" in captured.err
    doc = json.loads(captured.out)  # with --json, still one document naming the error
    assert doc["error"]["exit_code"] == ExitCode.USAGE
