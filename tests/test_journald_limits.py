"""A node with 20,000 damaged files left alone, logged to a real systemd-journald that rate-limits
the reaper as the unit it runs as: every record the reaper sends arrives.

journald counts what a unit sends per priority class in RateLimitIntervalSec= (30 s) and drops
what comes past RateLimitBurst= (10,000), a burst it multiplies by (log2(free bytes) - 16) / 4
where the journal has more than 2 MiB free: by 2.5 on this scenario's 1 GiB journal tmpfs,
whose default room (10 %) is about 100 MiB. With its default burst journald would let 25,000
records through here, and no 20,000 would ever be cut: the scenario sets RateLimitBurst=4000,
which that factor makes the effective burst of 10,000 that the default gives a journal with
little room. The first test shows that burst cutting the reaper's records when it has no bound.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from cni_reaper.journal import RECORDS_PER_KIND, Event
from tests.journald_scenario import unified_cgroup_mount
from tests.nodetree import PLUGIN_DIR, NodeTree, host_local_conflist
from tests.private_node import cannot_run, reaper_command, unshare
from tests.test_journal import _why_no_journald

REPO = Path(__file__).resolve().parent.parent
LEFT_ALONE = 20_000
# The unit's burst journald applies here: see the module's docstring.
EFFECTIVE_BURST = 10_000
JOURNALD_CONF = "[Journal]\nRateLimitBurst=4000\n"
JOURNAL_SIZE = "1G"
# The reaper as it is, but with no bound: what the journal would get without one.
UNBOUNDED = (
    "import sys, cni_reaper.journal as journal; journal.RECORDS_PER_KIND = sys.maxsize; "
    "from cni_reaper.cli import main; sys.exit(main())"
)


@pytest.fixture(scope="module")
def left_alone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A node whose 20,000 damaged results files nothing proves older than this boot: they
    were written after this boot's pre-runtime record, with the runtime up; each is left."""
    reason = _why_no_journald()
    if reason:
        cannot_run(reason)
    if not (unified_cgroup_mount() / "cgroup.procs").is_file():
        cannot_run("needs the cgroup v2 hierarchy, where journald reads a sender's unit")
    node = NodeTree(tmp_path_factory.mktemp("left-alone"))
    node.write_conf("10-hl.conflist", host_local_conflist("hl", "10.1.0.0/16"))
    node.write_boot_world(btime=time.time() - 3600)
    node.results.mkdir(parents=True, mode=0o700)
    node.record_before_runtime(time.time() - 60)
    node.runtime_starts()
    for n in range(LEFT_ALONE):
        node.write_result(f"hl-{n:064x}-eth0", b"")
    return node.root


def in_rate_limited_journald(root: Path, out: Path, *command: str) -> dict[str, Any]:
    """command --root ROOT --json, run as a unit of its own by a private journald with the
    limits above; its exit code, its JSON report, its records and journald's own."""
    env = {
        **os.environ,
        "JOURNAL_UNIT": f"cni-reaper-test-{uuid.uuid4().hex[:12]}.service",
        "JOURNALD_CONF": JOURNALD_CONF,
        "JOURNAL_SIZE": JOURNAL_SIZE,
        "PYTHONPATH": str(REPO),  # this tree's reaper, whatever the venv has installed
    }
    scenario = [*unshare(pid=True), sys.executable, "-m", "tests.journald_scenario", str(out)]
    reaper = [*command, "--root", str(root), "--bin-dir", PLUGIN_DIR, "--json"]
    proc = subprocess.run(
        [*scenario, "--", *reaper],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(out.read_text())
    result["report"] = json.loads(result["stdout"])
    return result


def by_message_id(records: list[dict[str, str]]) -> Counter[str]:
    return Counter(r["MESSAGE_ID"] for r in records)


def test_without_the_bound_this_journald_cuts_the_left_records(
    left_alone: Path, tmp_path: Path
) -> None:
    """What makes the next test prove something: the same run with no bound loses records."""
    result = in_rate_limited_journald(
        left_alone, tmp_path / "journal.json", sys.executable, "-c", UNBOUNDED
    )
    assert result["exit"] == 65
    assert result["report"]["summary"]["action"] == {"leave": LEFT_ALONE}
    arrived = by_message_id(result["records"])
    # All 20,000 were sent, at warning; the burst let 10,000 of them in, silently: journald
    # says "Suppressed" only when the unit logs again after the 30 s.
    assert arrived[Event.LEFT.message_id] == EFFECTIVE_BURST
    assert arrived[Event.SUMMARY.message_id] == 1  # notice: a class of its own
    assert Event.MORE.message_id not in arrived


def test_twenty_thousand_left_alone_lose_no_record_to_the_rate_limit(
    left_alone: Path, tmp_path: Path
) -> None:
    result = in_rate_limited_journald(left_alone, tmp_path / "journal.json", *reaper_command())

    assert result["exit"] == 65
    report = result["report"]
    # The JSON report stays whole.
    assert len(report["entries"]) == LEFT_ALONE
    assert {e["action"] for e in report["entries"]} == {"leave"}
    # Every record the reaper sent is in the journal: the first of the left ones, the run's
    # warnings (the text report's, which a unit does not print), one MORE record for the rest
    # of the left ones, the summary.
    records = result["records"]
    assert by_message_id(records) == {
        Event.LEFT.message_id: RECORDS_PER_KIND,
        Event.WARNING.message_id: len(report["warnings"]),
        Event.MORE.message_id: 1,
        Event.SUMMARY.message_id: 1,
    }
    warned = [r for r in records if r["MESSAGE_ID"] == Event.WARNING.message_id]
    assert [r["MESSAGE"] for r in warned] == report["warnings"]
    (more,) = (r for r in records if r["MESSAGE_ID"] == Event.MORE.message_id)
    assert more["CNI_REAPER_MORE_OF"] == "left"
    assert int(more["CNI_REAPER_NOT_LOGGED"]) == LEFT_ALONE - RECORDS_PER_KIND
    assert more["CNI_REAPER_LOGGED"] == str(RECORDS_PER_KIND)
    assert more["PRIORITY"] == "4"  # as the left records it stands for
    assert "JSON report (--json) lists every one" in more["MESSAGE"]
    assert "CNI_REAPER_QUARANTINE_DIR" not in more  # nothing was moved
    summary = records[-1]
    assert summary["MESSAGE_ID"] == Event.SUMMARY.message_id
    assert summary["CNI_REAPER_ENTRIES"] == str(LEFT_ALONE)
    assert summary["CNI_REAPER_NOT_LOGGED"] == str(LEFT_ALONE - RECORDS_PER_KIND)
    # The unit was rate-limited as a unit, and nothing of it was suppressed.
    assert {r["_SYSTEMD_UNIT"] for r in records} == {records[0]["_SYSTEMD_UNIT"]}
    assert [m for m in result["journald"] if "Suppressed" in m] == []
