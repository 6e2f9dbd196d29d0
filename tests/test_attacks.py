"""Attacks on the safety layer, by someone with a local foothold and by an unlucky operator.

Every scenario tried is a test: what holds stays as a regression test; what is broken is a
strict xfail that asserts the safe behaviour, with the reason in one sentence. Real runs on a
--root (which mount and run plugins) run as root in a private mount and network namespace
(tests/attack_scenario.py), where the machine's /var/lib/cni, /etc/cni and /run are tmpfs.
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

from tests.attack_scenario import CONTAINER_ID, ENTRY, IP
from tests.nodetree import have_plugins
from tests.private_node import cannot_run, unshare

REPO = Path(__file__).resolve().parent.parent


def scenario(case: str, workdir: Path) -> dict[str, Any]:
    if os.geteuid() != 0:
        cannot_run("needs root to make a private mount namespace")
    if not have_plugins():
        cannot_run("needs Debian's containernetworking-plugins in /usr/lib/cni")
    missing = [tool for tool in ("unshare", "mount") if shutil.which(tool) is None]
    if missing:
        cannot_run(f"needs {', '.join(missing)}")
    argv = [*unshare(net=True), sys.executable, "-m", "tests.attack_scenario", case, str(workdir)]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def entries(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["path"]: e for e in run["report"]["entries"]}


# --root: paths that leave the root through the node's own absolute symlinks.


@pytest.mark.xfail(
    strict=True,
    reason="the results dir is opened by a host path under --root, so the node's absolute "
    "/var/lib/cni symlink leads to the rescue machine's own results, which are DEL'd and moved",
)
def test_a_results_dir_reached_through_a_symlink_out_of_the_root_is_not_touched(
    tmp_path: Path,
) -> None:
    seen = scenario("results-dir-symlinked-out", tmp_path)
    assert seen["host_results_after"] == [ENTRY]
    assert seen["host_store_after"] == [IP]
    assert seen["exit"] == 75 or not any(
        e["action"] == "del-and-quarantine" for e in seen["report"]["entries"]
    )


@pytest.mark.xfail(
    strict=True,
    reason="host-local's store under --root is a host path and the bound /var/lib/cni keeps the "
    "node's absolute symlinks, so the DEL and the reservation sweep act on the machine's store",
)
def test_a_store_reached_through_a_symlink_out_of_the_root_is_not_touched(
    tmp_path: Path,
) -> None:
    seen = scenario("store-symlinked-out", tmp_path)
    # The machine's own reservations: a live pod's, and one being written right now.
    assert seen["host_store_after"] == [IP, "10.22.0.6"]


# The pre-runtime record.


def test_a_reservation_written_after_the_record_is_left(tmp_path: Path) -> None:
    """The first run of a boot keeps its record before it DELs; a runtime that starts during
    the DELs and reserves an address leaves a file the record does not hold: it is left."""
    seen = scenario("record-kept", tmp_path)
    assert "10.22.0.9" in seen["store_after"]
    assert IP not in seen["store_after"]  # the damaged entry's DEL released its address
    (reservation,) = seen["report"]["host_local"]
    assert (reservation["ip"], reservation["action"], reservation["written"]) == (
        "10.22.0.9",
        "leave",
        "current-boot",
    )


@pytest.mark.xfail(
    strict=True,
    reason="when the record cannot be saved the proof stays 'taking' for the whole run, so the "
    "host-local sweep after the DELs counts a reservation written meanwhile as pre-runtime",
)
def test_a_reservation_written_during_the_dels_is_left_when_the_record_cannot_be_kept(
    tmp_path: Path,
) -> None:
    seen = scenario("record-cannot-be-kept", tmp_path)
    assert "cannot keep this boot's pre-runtime record" in json.dumps(seen["report"])
    assert "10.22.0.9" in seen["store_after"]


@pytest.mark.xfail(
    strict=True,
    reason="the boot id is used as a path component unchecked, so a boot id that is an "
    "absolute path names the quarantine dir and the damaged file is moved there",
)
def test_a_boot_id_that_is_not_a_uuid_moves_nothing_out_of_the_state_dir(tmp_path: Path) -> None:
    seen = scenario("boot-id-as-path", tmp_path)
    assert seen["elsewhere"] is None
    assert all(
        (e["quarantined_to"] or "").startswith(str(tmp_path / "root/var/lib/cni-reaper/"))
        for e in seen["report"]["entries"]
    )


# Plugins.


@pytest.mark.xfail(
    strict=True,
    reason="plugins inherit the operator's PATH unvetted, and the real firewall plugin runs "
    "iptables from it on DEL, so an untrusted PATH dir's binary runs as root",
)
def test_no_binary_from_an_untrusted_path_dir_runs(tmp_path: Path) -> None:
    seen = scenario("firewall-via-path", tmp_path)
    assert entries(seen)[f"fw-{CONTAINER_ID}-eth0"]["del"]["plugins_run"] == ["firewall"]
    assert seen["ran"] == []


# Liveness.


def test_forced_run_leaves_a_live_container_and_a_pinned_netns(tmp_path: Path) -> None:
    """A runtime answers: refused. With --force, entries of the record whose container has
    live task state or whose netns is still mounted are left; only the dead one is DEL'd."""
    from tests.nodetree import CONTAINER_IDS  # noqa: PLC0415

    seen = scenario("forced-with-live-container", tmp_path)
    assert seen["refused"]["exit"] == 75
    found = entries(seen["forced"])
    alive, pinned, dead = (f"hl-{cid}-eth0" for cid in CONTAINER_IDS[1:4])
    assert found[alive]["action"] == "leave"
    assert "live state" in found[alive]["reason"]
    assert found[pinned]["action"] == "leave"
    assert "still mounted" in found[pinned]["reason"]
    assert (found[dead]["action"], found[dead]["outcome"]) == ("del-and-quarantine", "done")
    assert alive in seen["results_after"]
    assert pinned in seen["results_after"]
    assert dead not in seen["results_after"]
