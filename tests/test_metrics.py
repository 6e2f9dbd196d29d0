"""--metrics-file, read back with prometheus_client's own parser, as node_exporter would read it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from cni_reaper.content import Content
from tests.crashed import Crashed
from tests.nodetree import CONTAINER_IDS


def samples(path: Path) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(path.read_text()):
        assert family.type == "gauge"
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_metrics_file_holds_the_run_figures(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    crashed.add(CONTAINER_IDS[0])
    crashed.add(CONTAINER_IDS[1]).write_bytes(b"")
    crashed.node.write_result(f"gone-net-{CONTAINER_IDS[2]}-eth0", b"")
    crashed.reboot()
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    prom = textfile / "cni-reaper.prom"

    code, _ = crashed.run(capsys, "--metrics-file", str(prom))

    found = samples(prom)
    assert found[("cni_reaper_entries", (("content", "valid"),))] == 1
    assert found[("cni_reaper_entries", (("content", "empty"),))] == 2
    # Every verdict has its series, zero or not.
    for content in Content:
        assert ("cni_reaper_entries", (("content", content.value),)) in found
    assert (
        found[("cni_reaper_actions", (("action", "del-and-quarantine"), ("outcome", "done")))] == 1
    )
    assert (
        found[("cni_reaper_actions", (("action", "del-and-quarantine"), ("outcome", "failed")))]
        == 1
    )
    assert found[("cni_reaper_actions", (("action", "keep"), ("outcome", "skipped")))] == 1
    # The network with no config fails before any plugin runs.
    assert found[("cni_reaper_del_failures", (("plugin", "none"),))] == 1
    assert found[("cni_reaper_previous_boot_crashed", ())] == 1
    assert found[("cni_reaper_exit_code", ())] == code == 73
    assert found[("cni_reaper_dry_run", ())] == 0
    assert 0 <= found[("cni_reaper_run_duration_seconds", ())] < 60
    assert abs(found[("cni_reaper_last_run_timestamp_seconds", ())] - crashed.t0) < 600
    # Written through a temp file in the same dir and renamed: nothing else is left there.
    assert os.listdir(textfile) == ["cni-reaper.prom"]


def test_plugin_failures_are_counted_by_plugin_type(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bin_dir = crashed.node.fake_plugin_network(
        "f", "failing", 'echo \'{"code": 11, "msg": "store locked"}\'\nexit 1\n'
    )
    for cid in CONTAINER_IDS[:2]:
        crashed.node.write_result(f"f-{cid}-eth0", b"")
    crashed.reboot()
    prom = tmp_path / "cni-reaper.prom"

    code, _ = crashed.run(capsys, "--bin-dir", str(bin_dir), "--metrics-file", str(prom))

    assert code == 73
    assert samples(prom)[("cni_reaper_del_failures", (("plugin", "failing"),))] == 2


def test_metrics_of_a_dry_run_say_so(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    crashed.reboot()
    prom = tmp_path / "cni-reaper.prom"
    crashed.run(capsys, "--dry-run", "--metrics-file", str(prom))
    assert samples(prom)[("cni_reaper_dry_run", ())] == 1
