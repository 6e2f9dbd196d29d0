"""DEL replay across networks at once, never two DELs of one network at once."""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path

import pytest

from cni_reaper import cli
from cni_reaper.errors import ExitCode
from cni_reaper.plugin import PluginRun
from tests.crashed import Crashed
from tests.nodetree import CONTAINER_IDS


def timed_plugin(crashed: Crashed, log: Path) -> Path:
    """A fake plugin that logs when each DEL of each network starts and ends; it stands for
    a slow real one, which no real plugin is on cue."""
    script = (
        'net=$(sed -n \'s/.*"name":"\\([^"]*\\)".*/\\1/p\')\n'
        f'echo "start $net $(date +%s.%N)" >> {log}\n'
        "sleep 0.3\n"
        f'echo "end $net $(date +%s.%N)" >> {log}\n'
    )
    for name in ("net-a", "net-b"):
        bin_dir = crashed.node.fake_plugin_network(name, "slow", script)
        for cid in CONTAINER_IDS[:3]:
            crashed.node.write_result(f"{name}-{cid}-eth0", b"")
    crashed.reboot()
    return bin_dir


def intervals(log: Path) -> dict[str, list[tuple[float, float]]]:
    started: dict[str, list[float]] = {}
    spans: dict[str, list[tuple[float, float]]] = {}
    for line in log.read_text().splitlines():
        what, net, when = line.split()
        if what == "start":
            started.setdefault(net, []).append(float(when))
        else:
            spans.setdefault(net, []).append((started[net].pop(0), float(when)))
    return spans


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


@pytest.mark.parametrize("parallel", ["1", "2"])
def test_networks_in_parallel_each_network_in_turn(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path, parallel: str
) -> None:
    log = tmp_path / "calls.log"
    bin_dir = timed_plugin(crashed, log)

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir), "--parallel", parallel)

    assert code == ExitCode.OK
    assert report["summary"]["outcome"] == {"done": 6}
    spans = intervals(log)
    assert sorted(spans) == ["net-a", "net-b"]
    for net_spans in spans.values():
        assert len(net_spans) == 3
        for i, first in enumerate(net_spans):
            for second in net_spans[i + 1 :]:
                assert not overlap(first, second)
    across = any(overlap(a, b) for a in spans["net-a"] for b in spans["net-b"])
    assert across is (parallel == "2")


def test_parallel_must_be_at_least_one(crashed: Crashed) -> None:
    assert crashed.run_main("--parallel", "0") == ExitCode.USAGE


class FailingRunner:
    """A runner with a bug on one network: what the threads must survive without a trace."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def run(self, path: str, env: Mapping[str, str], stdin: bytes, timeout: float) -> PluginRun:
        network = json.loads(stdin)["name"]
        self.calls.append(network)
        if network == "net-b":
            raise RuntimeError("a bug in the runner")
        return PluginRun(0, b"", b"", timed_out=False, output_truncated=False)


def test_a_bug_in_one_worker_ends_the_run_with_every_worker_joined(crashed: Crashed) -> None:
    bin_dir = timed_plugin(crashed, crashed.node.root / "unused.log")
    runner = FailingRunner()
    before = threading.active_count()

    with pytest.raises(RuntimeError, match="a bug in the runner"):
        cli.run(
            crashed.argv("--json", "--bin-dir", str(bin_dir), "--parallel", "2"),
            clock=lambda: crashed.t0 + 60,
            runner=runner,
            environ={},
        )

    assert threading.active_count() == before
    # net-b's worker stopped at its first DEL; net-a's went on to the end of its network.
    assert runner.calls.count("net-b") == 1
    assert runner.calls.count("net-a") == 3
