"""Which boot wrote a file, from wtmp, btime and the file's own times."""

from __future__ import annotations

from pathlib import Path

from cni_reaper import boot
from cni_reaper.boot import BootEnd, Written
from cni_reaper.evidence import wtmp
from cni_reaper.paths import NodePaths
from tests.nodetree import NodeTree

T = 1_790_000_000.0


def context(node: NodeTree, now: float, btime: float) -> boot.BootContext:
    node.write_boot_world(btime)
    return boot.load(NodePaths.build(root=str(node.root)), lambda: now)


def crashed_world(node: NodeTree) -> boot.BootContext:
    node.boot(T - 7200)
    node.shutdown(T - 3700)
    node.boot(T - 3600)  # crashes: no shutdown record before the next boot
    node.login(T - 3000)
    node.boot(T + 12)  # this boot's record, 12 s after btime
    return context(node, now=T + 100, btime=T)


def test_previous_boot_crashed_and_this_boot_began_at_the_earliest_estimate(
    node: NodeTree,
) -> None:
    ctx = crashed_world(node)
    # btime and this boot's wtmp record 12 s later both say when it began: the earlier wins,
    # so that a file written between the two is never taken for the previous boot's.
    assert ctx.current_start == T
    assert ctx.current_start_source == "/proc/stat btime"
    assert ctx.previous_boot is not None
    assert ctx.previous_boot.start == T - 3600
    assert ctx.previous_boot.end is BootEnd.CRASHED
    assert [b.end for b in ctx.previous_boots] == [BootEnd.CLEAN, BootEnd.CRASHED]


def test_file_of_the_crashed_boot_names_it(node: NodeTree) -> None:
    verdict = crashed_world(node).classify(T - 2990, T - 2990)
    assert verdict.written is Written.PREVIOUS_BOOT
    assert verdict.writing_boot is not None
    assert verdict.writing_boot.start == T - 3600
    assert verdict.seconds_before_last_record == -10
    assert "which crashed" in verdict.evidence
    assert "10 s after that boot's last wtmp record" in verdict.evidence


def test_file_of_a_clean_boot(node: NodeTree) -> None:
    verdict = crashed_world(node).classify(T - 3760, T - 3760)
    assert verdict.written is Written.PREVIOUS_BOOT
    assert "shut down cleanly" in verdict.evidence
    assert verdict.seconds_before_last_record == 60


def test_near_the_boundary_is_unknown(node: NodeTree) -> None:
    ctx = crashed_world(node)
    assert ctx.classify(T - 1, T - 1).written is Written.UNKNOWN
    assert ctx.classify(T + 1.5, T + 1.5).written is Written.UNKNOWN


def test_between_btime_and_the_boot_record_is_this_boot(node: NodeTree) -> None:
    """The hole the latest estimate left: written after btime, before the wtmp record."""
    assert crashed_world(node).classify(T + 5, T + 5).written is Written.CURRENT_BOOT


def test_a_stepped_clock_keeps_the_first_reading(node: NodeTree) -> None:
    """An hour after the first run read btime T and its wtmp record, NTP stepped the clock:
    btime now reads T + 3600. The first reading keeps the wtmp record this boot's, and the
    earlier btime the boundary."""
    crashed_world(node)
    node.write_boot_world(T + 3600)
    ctx = boot.load(
        NodePaths.build(root=str(node.root)),
        lambda: T + 7300,
        first=boot.FirstReading(T, T + 12),
    )
    assert ctx.current_start == T
    assert ctx.previous_boot is not None and ctx.previous_boot.start == T - 3600
    without = boot.load(NodePaths.build(root=str(node.root)), lambda: T + 7300)
    assert without.previous_boot is not None and without.previous_boot.start == T + 12


def test_after_the_boot_is_current(node: NodeTree) -> None:
    assert crashed_world(node).classify(T + 50, T + 50).written is Written.CURRENT_BOOT


def test_old_mtime_with_a_new_ctime_is_unknown(node: NodeTree) -> None:
    """A copied or chmod'ed file: only ctime cannot be forged, and it says 'this boot'."""
    assert crashed_world(node).classify(T - 3000, T + 50).written is Written.UNKNOWN


def test_clock_earlier_than_the_boot_trusts_nothing(node: NodeTree) -> None:
    node.boot(T)
    ctx = context(node, now=T - 500, btime=T)
    verdict = ctx.classify(T - 3000, T - 3000)
    assert verdict.written is Written.UNKNOWN
    assert "cannot be trusted" in verdict.evidence


def test_boot_record_not_yet_written_uses_btime(node: NodeTree) -> None:
    """Run before systemd-update-utmp: the last boot in wtmp is the previous one, and it crashed."""
    node.boot(T - 3600)
    ctx = context(node, now=T + 30, btime=T)
    assert ctx.current_start == T
    assert ctx.current_start_source == "/proc/stat btime"
    assert ctx.previous_boot is not None
    assert ctx.previous_boot.end is BootEnd.CRASHED


def test_missing_wtmp_is_a_warning_not_a_failure(tmp_path: Path) -> None:
    node = NodeTree(tmp_path)
    node.write_boot_world(T)
    (node.root / "var/log/wtmp").unlink()
    ctx = boot.load(NodePaths.build(root=str(node.root)), lambda: T + 10)
    assert any("no wtmp" in w for w in ctx.warnings)
    assert ctx.classify(T - 100, T - 100).written is Written.PREVIOUS_BOOT


def test_rotated_wtmp_is_read_first_as_one_stream(node: NodeTree) -> None:
    """logrotate moved the crashed boot's record to wtmp.1; this boot's is in the new wtmp."""
    node.boot(T - 3600)
    node.write_boot_world(T)
    log = node.root / "var/log"
    (log / "wtmp").rename(log / "wtmp.1")
    (log / "wtmp").write_bytes(wtmp.encode(wtmp.boot_record(T + 5)))
    ctx = boot.load(NodePaths.build(root=str(node.root)), lambda: T + 100)
    assert ctx.current_start == T
    assert [(b.start, b.end) for b in ctx.previous_boots] == [(T - 3600, BootEnd.CRASHED)]
