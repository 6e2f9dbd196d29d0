"""The wtmp reader against files written by util-linux utmpdump and by the project's own writer."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_reaper import boot
from cni_reaper.boot import BootEnd, Written, boots_from_records
from cni_reaper.evidence import wtmp
from cni_reaper.paths import NodePaths

needs_utmpdump = pytest.mark.skipif(
    shutil.which("utmpdump") is None or shutil.which("last") is None,
    reason="util-linux utmpdump and last are not installed",
)


def stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S,000000+00:00", time.gmtime(t))


def utmpdump_line(
    ut_type: int, pid: int, ut_id: str, user: str, line: str, host: str, t: float
) -> str:
    return (
        f"[{ut_type}] [{pid:05d}] [{ut_id:<4}] [{user:<8}] [{line:<12}] [{host:<20}] "
        f"[0.0.0.0        ] [{stamp(t)}]"
    )


BASE = 1_700_000_000.0  # 2023-11-14T22:13:20Z

# Boot A shuts down cleanly, boot B crashes (no shutdown before C), C is running.
SCENARIO = [
    (2, 0, "~~", "reboot", "~", "6.1.0-test", BASE),
    (7, 812, "ts/0", "admin", "pts/0", "10.0.0.9", BASE + 30),
    (8, 812, "ts/0", "", "pts/0", "", BASE + 60),
    (1, 0, "~~", "shutdown", "~", "6.1.0-test", BASE + 100),
    (2, 0, "~~", "reboot", "~", "6.1.0-test", BASE + 200),
    (7, 913, "ts/0", "admin", "pts/0", "10.0.0.9", BASE + 250),
    (2, 0, "~~", "reboot", "~", "6.1.0-test", BASE + 1000),
]


def write_with_utmpdump(path: Path, rows: list[tuple[int, int, str, str, str, str, float]]) -> None:
    text = "\n".join(utmpdump_line(*row) for row in rows) + "\n"
    subprocess.run(
        ["utmpdump", "--reverse", "--output", str(path)],
        input=text.encode(),
        check=True,
        capture_output=True,
    )


@needs_utmpdump
def test_reads_what_utmpdump_writes(tmp_path: Path) -> None:
    path = tmp_path / "wtmp"
    write_with_utmpdump(path, SCENARIO)
    assert path.stat().st_size == 384 * len(SCENARIO)
    records = list(wtmp.parse(path.read_bytes()))
    assert [(r.ut_type, r.user, r.line, r.time) for r in records] == [
        (row[0], row[3], row[4], row[6]) for row in SCENARIO
    ]
    boots = boots_from_records(records)
    assert [(b.start, b.end) for b in boots] == [
        (BASE, BootEnd.CLEAN),
        (BASE + 200, BootEnd.CRASHED),
        (BASE + 1000, BootEnd.RUNNING),
    ]
    assert boots[0].shutdown == BASE + 100
    assert boots[1].last_record == BASE + 250


@needs_utmpdump
def test_own_writer_matches_utmpdump_byte_for_byte(tmp_path: Path) -> None:
    path = tmp_path / "wtmp"
    write_with_utmpdump(path, SCENARIO)
    # utmpdump's text format pads ut_id to its 4 bytes with spaces.
    own = wtmp.encode_all(
        wtmp.WtmpRecord(t, pid, line, i.ljust(4), user, host, when)
        for t, pid, i, user, line, host, when in SCENARIO
    )
    theirs = path.read_bytes()
    # Compared up to ut_addr_v6, which utmpdump fills from its address column.
    for n in range(len(SCENARIO)):
        a, b = own[n * 384 : (n + 1) * 384], theirs[n * 384 : (n + 1) * 384]
        assert a[:348] == b[:348]


@needs_utmpdump
def test_boot_list_agrees_with_last(tmp_path: Path) -> None:
    path = tmp_path / "wtmp"
    path.write_bytes(
        wtmp.encode_all(
            wtmp.WtmpRecord(t, pid, line, i, user, host, when)
            for t, pid, i, user, line, host, when in SCENARIO
        )
    )
    out = subprocess.run(
        ["last", "-x", "-F", "-f", str(path)],
        capture_output=True,
        text=True,
        check=True,
        env={"TZ": "UTC", "LC_ALL": "C"},
    ).stdout
    last_boots = [line for line in out.splitlines() if line.startswith("reboot")]
    last_shutdowns = [line for line in out.splitlines() if line.startswith("shutdown")]
    ours = boots_from_records(list(wtmp.parse(path.read_bytes())))
    assert len(last_boots) == len(ours) == 3
    assert len(last_shutdowns) == sum(1 for b in ours if b.end is BootEnd.CLEAN) == 1
    # last prints newest first; each boot's start time appears in its line.
    for line, booted in zip(last_boots, reversed(ours)):
        assert (
            time.strftime("%a %b %d %H:%M:%S %Y", time.gmtime(booted.start)).replace(" 0", "  ")
            in line
            or time.strftime("%a %b %e %H:%M:%S %Y", time.gmtime(booted.start)) in line
        )


def test_400_byte_layout_and_torn_tail() -> None:
    records = [wtmp.boot_record(BASE), wtmp.shutdown_record(BASE + 5), wtmp.boot_record(BASE + 9)]
    data = wtmp.encode_all(records, wtmp.LAYOUT_400)
    torn = data + wtmp.encode(wtmp.boot_record(BASE + 20), wtmp.LAYOUT_400)[:123]
    parsed = list(wtmp.parse(torn, wtmp.pick_layout(torn, wtmp.LAYOUT_400)))
    assert [r.time for r in parsed] == [BASE, BASE + 5, BASE + 9]
    assert wtmp.pick_layout(data, wtmp.LAYOUT_400) is wtmp.LAYOUT_400


def test_zero_filled_tail_after_a_crash_is_skipped() -> None:
    data = wtmp.encode_all([wtmp.boot_record(BASE)]) + b"\0" * 384 * 3
    assert [r.time for r in wtmp.parse(data)] == [BASE]


def test_runlevel_0_record_counts_as_shutdown() -> None:
    sysv = wtmp.WtmpRecord(1, ord("0") | (ord("3") << 8), "~", "~~", "runlevel", "k", BASE + 5)
    boots = boots_from_records([wtmp.boot_record(BASE), sysv, wtmp.boot_record(BASE + 9)])
    assert boots[0].end is BootEnd.CLEAN


records_strategy = st.lists(
    st.builds(
        wtmp.WtmpRecord,
        ut_type=st.integers(1, 9),
        pid=st.integers(0, 2**31 - 1),
        line=st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=32),
        ut_id=st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=4),
        user=st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=32),
        host=st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=64),
        time=st.integers(0, 2**32 - 1).map(float),
    ),
    max_size=20,
)


@given(
    records_strategy, st.sampled_from([wtmp.LAYOUT_384, wtmp.LAYOUT_400]), st.binary(max_size=399)
)
def test_round_trip_with_any_torn_tail(
    records: list[wtmp.WtmpRecord], layout: object, tail: bytes
) -> None:
    assert isinstance(layout, type(wtmp.LAYOUT_384))
    data = wtmp.encode_all(records, layout) + tail[: layout.size - 1]
    assert list(wtmp.parse(data, layout)) == records


@given(st.binary(max_size=4000))
def test_parser_never_raises(data: bytes) -> None:
    for record in wtmp.parse(data):
        assert 1 <= record.ut_type <= 9


@needs_utmpdump
def test_boot_context_from_a_utmpdump_wtmp(tmp_path: Path) -> None:
    """The reaper's boot evidence from a file util-linux wrote, through --root as in production."""
    log = tmp_path / "var/log"
    log.mkdir(parents=True)
    write_with_utmpdump(log / "wtmp", SCENARIO)
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "stat").write_text(f"btime {int(BASE + 990)}\n")
    ctx = boot.load(NodePaths.build(root=str(tmp_path)), lambda: BASE + 2000)
    assert ctx.current_start == BASE + 990  # btime, before this boot's wtmp record
    assert [(b.start, b.end) for b in ctx.previous_boots] == [
        (BASE, BootEnd.CLEAN),
        (BASE + 200, BootEnd.CRASHED),
    ]
    verdict = ctx.classify(BASE + 260, BASE + 260)
    assert verdict.written is Written.PREVIOUS_BOOT
    assert verdict.writing_boot is not None
    assert verdict.writing_boot.start == BASE + 200
    assert "which crashed" in verdict.evidence
