"""DEL replay across networks at once, never two DELs of one network at once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cni_reaper.errors import ExitCode
from tests.crashed import Crashed
from tests.nodetree import CONTAINER_IDS


def timed_plugin(crashed: Crashed, log: Path) -> Path:
    """A fake plugin that logs when each DEL of each network starts and ends; it stands for
    a slow real one, which no real plugin is on cue."""
    bin_dir = crashed.node.root / "opt/cni/bin"
    bin_dir.mkdir(parents=True)
    plugin = bin_dir / "slow"
    plugin.write_text(
        "#!/bin/sh\n"
        'net=$(sed -n \'s/.*"name":"\\([^"]*\\)".*/\\1/p\')\n'
        f'echo "start $net $(date +%s.%N)" >> {log}\n'
        "sleep 0.3\n"
        f'echo "end $net $(date +%s.%N)" >> {log}\n'
    )
    plugin.chmod(0o755)
    for name in ("net-a", "net-b"):
        conf = {"cniVersion": "1.0.0", "name": name, "plugins": [{"type": "slow"}]}
        crashed.node.write_conf(f"80-{name}.conflist", json.dumps(conf).encode())
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
