"""A crashed node repaired by cni-reaper with Debian's real bridge, ptp, host-local and portmap.

Everything runs as root in a private network and mount namespace with tmpfs over /var/lib/cni
and /run/netns (tests/netns_scenario.py), so the machine's own network and CNI state are never
touched. In CI (CI=true) a machine that cannot do this fails the test instead of skipping it.
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
from tests.private_node import cannot_run, unshare

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.netns


def _why_not() -> str | None:
    if os.geteuid() != 0:
        return "needs root for unshare --net --mount"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "needs util-linux unshare and iproute2 ip"
    if not have_plugins():
        return "needs Debian's containernetworking-plugins in /usr/lib/cni"
    return None


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    reason = _why_not()
    if reason:
        cannot_run(reason)
    work = tmp_path_factory.mktemp("netns")
    proc = subprocess.run(
        [
            *unshare(net=True),
            sys.executable,
            "-m",
            "tests.netns_scenario",
            str(work),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads((work / "result.json").read_text())
    return result


def damaged(scenario: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in scenario["pods"] if p["damage"] != "valid"]


def test_setup_really_reserved_ips_and_made_veths(scenario: dict[str, Any]) -> None:
    reserved = scenario["before_crash"]["ips"]
    for pod in scenario["pods"]:
        for ip in pod["ips"]:
            assert reserved[pod["network"]][ip] == f"{pod['container_id']}\r\neth0"
        assert pod["host_veth"] in scenario["before_crash"]["links"]


def test_reaper_repairs_and_exits_0(scenario: dict[str, Any]) -> None:
    run = scenario["run"]
    assert run["exit"] == 0, run["stderr"]
    outcomes = {e["path"]: (e["action"], e["outcome"]) for e in run["report"]["entries"]}
    for pod in scenario["pods"]:
        expected = (
            ("keep", "skipped") if pod["damage"] == "valid" else ("del-and-quarantine", "done")
        )
        assert outcomes[pod["file"]] == expected


def test_every_ip_of_a_damaged_attachment_is_released(scenario: dict[str, Any]) -> None:
    after = scenario["after"]["ips"]
    for pod in scenario["pods"]:
        for ip in pod["ips"]:
            if pod["damage"] == "valid":
                assert after[pod["network"]][ip] == f"{pod['container_id']}\r\neth0"
            else:
                assert ip not in after[pod["network"]]


def test_host_side_veths_are_gone(scenario: dict[str, Any]) -> None:
    links = scenario["after"]["links"]
    for pod in damaged(scenario):
        assert pod["host_veth"] not in links


def test_damaged_files_are_in_quarantine_with_sidecars(scenario: dict[str, Any]) -> None:
    quarantined = scenario["after"]["quarantine"]
    sidecars = scenario["after"]["sidecars"]
    names = {p.split("/", 1)[1] for p in quarantined}
    for pod in damaged(scenario):
        assert pod["file"] in names
        sidecar = sidecars[pod["file"] + ".json"]
        assert sidecar["content"] == pod["damage"]
        assert sidecar["del"]["ok"] is True
        assert sidecar["network"] == pod["network"]
    assert len(names) == 2 * len(damaged(scenario))
    # DEL ran the real plugins in reverse order.
    bridge = next(p for p in damaged(scenario) if p["network"] == "bridge-net")
    assert sidecars[bridge["file"] + ".json"]["del"]["plugins_run"] == ["portmap", "bridge"]


def test_valid_files_are_untouched_and_nothing_else_remains(scenario: dict[str, Any]) -> None:
    assert scenario["after"]["results"] == scenario["valid_bytes_before"]


def test_dry_run_changes_nothing(scenario: dict[str, Any]) -> None:
    dry = scenario["dry_run"]
    assert dry["exit"] == 0, dry["stderr"]
    assert dry["tree_unchanged"] is True
    planned = [e for e in dry["report"]["entries"] if e["outcome"] == "planned"]
    assert len(planned) == len(damaged(scenario))
