"""What the reaper tells the log and the service manager: journal records, stderr lines, STATUS."""

from __future__ import annotations

import io
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from cni_reaper import cli
from cni_reaper.journal import Event, EventLog, journal_send, more_fields
from tests.crashed import Crashed
from tests.journald_scenario import reaper_in_journald
from tests.nodetree import CONTAINER_IDS
from tests.notify_socket import status_lines
from tests.private_node import cannot_run

REPO = Path(__file__).resolve().parent.parent
ENTRY_FIELDS = {"CNI_REAPER_FILE", "CNI_REAPER_CONTENT", "CNI_REAPER_ACTION", "CNI_REAPER_OUTCOME"}
# What a file's name says; a name that does not split says none of it.
SPLIT_FIELDS = {"CNI_NETWORK", "CNI_CONTAINERID", "CNI_IFNAME"}
UNSPLITTABLE = "no-way-to-split"


class Recorder:
    """Stands where systemd.journal.send stands, and keeps what would have been sent."""

    def __init__(self) -> None:
        self.sent: list[dict[str, str]] = []

    def __call__(self, **fields: str) -> None:
        self.sent.append(fields)


def mixed_node(
    crashed: Crashed, wall_clock: bool = False, every_kind: bool = False
) -> dict[str, str]:
    """A repaired, a kept, a left and a reported entry; returns file name -> expected event.

    wall_clock: the reaper will run with the real clock, so the reboot must really come after
    the damaged file's last change.
    every_kind: also an entry whose repair fails (its network has no config) and an address
    whose results entry is gone (an orphan reservation, released by a DEL): with -v, and a
    dry run, a run then makes a record of every MESSAGE_ID.
    """
    kept = crashed.add(CONTAINER_IDS[0])
    repaired = crashed.add(CONTAINER_IDS[1])
    repaired.write_bytes(b"")
    odd = crashed.node.write_result(UNSPLITTABLE, b"")
    expected = {}
    if every_kind:
        failed = crashed.node.write_result(f"gone-net-{CONTAINER_IDS[3]}-eth0", b"")
        crashed.add(CONTAINER_IDS[4]).unlink()
        expected[failed.name] = "repair-failed"
    if wall_clock:
        time.sleep(3.2)
        crashed.reboot_now()
    else:
        crashed.reboot()
    # The boot's first run recorded the state; then the runtime started and set up a pod
    # whose cache file is not yet written: it may be a write in flight.
    # It records host-local's store too, as a real first run does: a DEL releases from it.
    crashed.node.record_before_runtime(crashed.t0 + 20, crashed.ipam / "hl")
    crashed.node.runtime_starts()
    fresh = crashed.add(CONTAINER_IDS[2])
    fresh.write_bytes(b"")
    return {
        kept.name: "kept",
        repaired.name: "repaired",
        fresh.name: "left",
        odd.name: "needs-attention",
        **expected,
    }


def records_of_every_kind(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> list[dict[str, str]]:
    """What real runs send for every kind of record (entries, reservations, the summary, the
    records past the bound) and every MESSAGE_ID: a run with -v and a dry run over the
    every_kind node, before and after, and a dry run with a bound of one record a kind."""
    mixed_node(crashed, every_kind=True)
    recorder = Recorder()
    crashed.run(capsys, "-v", "--dry-run", events=EventLog(send=recorder))
    crashed.run(capsys, "-v", "--dry-run", events=EventLog(send=recorder, bound=1))
    crashed.run(capsys, "-v", events=EventLog(send=recorder))
    return recorder.sent


def test_every_action_is_one_structured_record_plus_a_summary(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = mixed_node(crashed)
    recorder = Recorder()
    code, report = crashed.run(capsys, events=EventLog(send=recorder))

    *records, summary = recorder.sent
    entries = [r for r in records if r["CNI_REAPER_EVENT"] != "warning"]
    # Under the unit no text report is printed: each of its warnings is a record of its own,
    # after the entries', counted in the summary.
    warnings = records[len(entries) :]
    assert report["warnings"], "the node is one the reaper warns about"
    assert [r["MESSAGE"] for r in warnings] == report["warnings"]
    for record in warnings:
        assert record["MESSAGE_ID"] == Event.WARNING.message_id
        assert (record["PRIORITY"], record["CNI_REAPER_DRY_RUN"]) == ("4", "0")
        assert record["CNI_REAPER_WARNINGS"] == str(len(warnings))
    assert summary["CNI_REAPER_WARNINGS"] == str(len(warnings))
    # Kept entries are not actions: they are logged only with -v.
    assert {r["CNI_REAPER_FILE"]: r["CNI_REAPER_EVENT"] for r in entries} == {
        name: event for name, event in expected.items() if event != "kept"
    }
    for record in entries:
        assert record["SYSLOG_IDENTIFIER"] == "cni-reaper"
        assert record.keys() >= ENTRY_FIELDS
        # Left out, never sent empty, when the name does not say them.
        has_split = record["CNI_REAPER_FILE"] != UNSPLITTABLE
        assert (record.keys() & SPLIT_FIELDS) == (SPLIT_FIELDS if has_split else set())
        assert record["MESSAGE_ID"] == Event(record["CNI_REAPER_EVENT"]).message_id
    repaired = next(r for r in entries if r["CNI_REAPER_EVENT"] == "repaired")
    assert repaired["CNI_NETWORK"] == "hl"
    assert repaired["CNI_CONTAINERID"] == CONTAINER_IDS[1]
    assert repaired["CNI_IFNAME"] == "eth0"
    assert (repaired["CNI_REAPER_CONTENT"], repaired["CNI_REAPER_ACTION"]) == (
        "empty",
        "del-and-quarantine",
    )
    assert repaired["CNI_REAPER_OUTCOME"] == "done"
    assert repaired["PRIORITY"] == "5"
    assert repaired["CNI_REAPER_QUARANTINED_TO"].endswith(repaired["CNI_REAPER_FILE"])
    assert summary["MESSAGE_ID"] == Event.SUMMARY.message_id
    assert summary["CNI_REAPER_EXIT_CODE"] == str(code) == str(report["summary"]["exit_code"])
    assert summary["CNI_REAPER_PREVIOUS_BOOT_CRASHED"] == "1"
    assert summary["CNI_REAPER_DONE"] == "1"


def test_verbose_also_logs_kept_entries(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    mixed_node(crashed)
    recorder = Recorder()
    crashed.run(capsys, "-v", events=EventLog(send=recorder))
    kept = [r for r in recorder.sent if r.get("CNI_REAPER_EVENT") == "kept"]
    assert [r["CNI_REAPER_ACTION"] for r in kept] == ["keep", *["keep-reservation"] * 2]
    assert {r["PRIORITY"] for r in kept} == {"6"}


def test_message_ids_never_change() -> None:
    # journalctl MESSAGE_ID=... filters and alerts in the field depend on these.
    assert {e.value: e.message_id for e in Event} == {
        "repaired": "8164ecb54e43456284ff4c2293564c06",
        "repair-failed": "ec460304e4bd4f47b49c1480fb9bc381",
        "planned": "599d6addddd248008d84e8aa1b4f47d9",
        "left": "2555a316e595483ab986f58054267ae4",
        "needs-attention": "53f32876435644e29b4cbec508b4c40c",
        "kept": "cba8cac8fd334944a069e83d9a34fe19",
        "warning": "e11d630a71f740d3be578689a342ba78",
        "more": "56ee09c1f831411289e89261cd26f4a4",
        "summary": "40d33e61a7024481a04d33a66d8dad96",
    }


def test_without_the_journal_the_same_facts_go_to_stderr_as_lines(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    expected = mixed_node(crashed)
    stream = io.StringIO()
    crashed.run(capsys, events=EventLog(stream=stream))
    lines = stream.getvalue().splitlines()
    repaired = next(name for name, event in expected.items() if event == "repaired")
    line = next(line for line in lines if line.startswith(f"cni-reaper: {repaired}: empty"))
    for fact in (
        "cni_network=hl",
        f"cni_containerid={CONTAINER_IDS[1]}",
        "cni_ifname=eth0",
        "cni_reaper_content=empty",
        "cni_reaper_action=del-and-quarantine",
        "cni_reaper_outcome=done",
    ):
        assert fact in line
    assert lines[-1].startswith("cni-reaper: 4 entries;")
    warned = [line for line in lines if "(cni_reaper_event=warning " in line]
    assert warned[0].endswith(f"cni_reaper_warnings={len(warned)} cni_reaper_dry_run=0)")
    assert len(lines) == 4 + len(warned)  # three actions, the warnings and the summary


def a_native_socket(where: Path) -> Path:
    """A datagram socket bound where journald's would be (only its presence is looked at)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as bound:
        bound.bind(str(where))
    return where


def test_native_logging_is_chosen_only_for_the_stream_systemd_named(tmp_path: Path) -> None:
    native = str(a_native_socket(tmp_path / "socket"))
    with (tmp_path / "stream").open("w") as stream:
        st = os.fstat(stream.fileno())
        named = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert journal_send({}, stream.fileno(), native) is None
        assert journal_send({"JOURNAL_STREAM": "1:2"}, stream.fileno(), native) is None
        assert journal_send({"JOURNAL_STREAM": "garbage"}, stream.fileno(), native) is None
        chosen = journal_send(named, stream.fileno(), native)
    try:
        from systemd import journal  # noqa: PLC0415
    except ImportError:
        assert chosen is None
    else:
        assert chosen is not None
        assert chosen is not journal.send  # whose CODE_* would name our own send call


def test_with_no_native_socket_the_records_stay_lines_on_the_stream(tmp_path: Path) -> None:
    """systemd-python's sendv reports no error when nothing listens on journald's socket: a
    run whose JOURNAL_STREAM named its stderr, where no journald was, lost every record."""
    pytest.importorskip("systemd._journal")
    with (tmp_path / "stream").open("w") as stream:
        st = os.fstat(stream.fileno())
        named = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}

        chosen = journal_send(named, stream.fileno(), str(tmp_path / "no-journald"))

    assert chosen is None


def test_the_send_under_systemd_loads_no_python_layer(tmp_path: Path) -> None:
    """At boot every module comes from a cold disk: sendv is taken from systemd-python's C
    module, never through systemd.journal, which loads logging, uuid and traceback."""
    pytest.importorskip("systemd._journal")
    code = (
        "import json, os, sys\n"
        "from cni_reaper.journal import journal_send\n"
        f"fd = os.open({str(tmp_path / 'stream')!r}, os.O_WRONLY | os.O_CREAT)\n"
        "st = os.fstat(fd)\n"
        "send = journal_send({'JOURNAL_STREAM': f'{st.st_dev}:{st.st_ino}'}, fd, "
        f"{str(a_native_socket(tmp_path / 'socket'))!r})\n"
        "heavy = ('systemd.journal', 'logging', 'uuid', 'traceback')\n"
        "print(json.dumps([send is not None, [m for m in heavy if m in sys.modules]]))\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert json.loads(ran.stdout) == [True, []]


def test_status_lines_reach_the_notify_socket(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    mixed_node(crashed)
    address = tmp_path / "notify"
    with status_lines(address) as sent:
        crashed.run(
            capsys, events=EventLog(stream=io.StringIO()), environ={"NOTIFY_SOCKET": str(address)}
        )
    assert sent[0] == f"STATUS=scanning {crashed.node.results}"
    assert f"STATUS=done: hl-{CONTAINER_IDS[1]}-eth0" in sent
    assert sent[-1].startswith("STATUS=done: 4 entries;")


def test_natively_logged_runs_print_no_text_report(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    mixed_node(crashed)
    cli.run(
        crashed.argv(), clock=lambda: crashed.t0 + 60, events=EventLog(send=Recorder()), environ={}
    )
    assert capsys.readouterr().out == ""


def _why_no_journald() -> str | None:
    if os.geteuid() != 0:
        return "needs root to run systemd-journald in a private mount namespace"
    if not Path("/lib/systemd/systemd-journald").exists() or shutil.which("journalctl") is None:
        return "needs systemd-journald and journalctl (Debian package systemd)"
    try:
        import systemd.journal  # noqa: F401, PLC0415
    except ImportError:
        return "needs systemd-python (pip install -e '.[systemd]', libsystemd-dev to build)"
    return None


def test_records_arrive_in_a_real_journald(crashed: Crashed, tmp_path: Path) -> None:
    reason = _why_no_journald()
    if reason:
        cannot_run(reason)
    expected = mixed_node(crashed, wall_clock=True)
    result = reaper_in_journald(crashed.node.root, tmp_path / "journal.json")
    assert result["exit"] == 65  # the in-flight and the unsplittable entries are left
    assert result["stdout"] == ""  # the journal has it all
    records = result["records"]
    by_file = {r["CNI_REAPER_FILE"]: r for r in records if "CNI_REAPER_FILE" in r}
    assert {name: r["CNI_REAPER_EVENT"] for name, r in by_file.items()} == {
        name: event for name, event in expected.items() if event != "kept"
    }
    repaired = by_file[f"hl-{CONTAINER_IDS[1]}-eth0"]
    assert repaired["MESSAGE_ID"] == Event.REPAIRED.message_id
    assert repaired["CNI_CONTAINERID"] == CONTAINER_IDS[1]
    assert repaired["CNI_REAPER_OUTCOME"] == "done"
    summary = [r for r in records if r.get("CNI_REAPER_EVENT") == "summary"]
    assert len(summary) == 1
    assert summary[0]["MESSAGE_ID"] == Event.SUMMARY.message_id
    # As journald stored them: no empty field, none of what a name that does not split
    # cannot say, and no code location (systemd-python's would be our own send call).
    for record in records:
        assert [name for name, value in record.items() if value in ("", None)] == []
        assert [name for name in record if name.startswith("CODE_")] == []
    assert not SPLIT_FIELDS & by_file[UNSPLITTABLE].keys()


def test_a_run_that_ends_early_says_why_in_the_journal_at_its_priority(
    crashed: Crashed, tmp_path: Path
) -> None:
    """No summary is logged then: the one line is all the journal learns, and `journalctl -p`
    must find it. A refusal is a warning (the runtime is up: nothing to do now), the rest err,
    every line of it."""
    reason = _why_no_journald()
    if reason:
        cannot_run(reason)
    mixed_node(crashed, wall_clock=True)
    before = sorted(p.name for p in crashed.node.results.iterdir())

    with crashed.containerd_answering():
        refused = reaper_in_journald(crashed.node.root, tmp_path / "refused.json")
    usage = reaper_in_journald(crashed.node.root, tmp_path / "usage.json", "--parallel", "0")

    assert refused["exit"] == 75
    (line,) = refused["records"]
    assert line["MESSAGE"].startswith("cni-reaper: a container runtime is running (it answers")
    assert line["PRIORITY"] == "4"
    assert usage["exit"] == 2
    lines = usage["records"]
    assert lines[0]["MESSAGE"] == "cni-reaper: --parallel must be at least 1"
    assert lines[1]["MESSAGE"].startswith("usage: cni-reaper ")
    assert {r["PRIORITY"] for r in lines} == {"3"}
    assert sorted(p.name for p in crashed.node.results.iterdir()) == before


def test_no_record_of_any_kind_has_an_empty_field(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    records = records_of_every_kind(crashed, capsys)
    assert {r["MESSAGE_ID"] for r in records} == {e.message_id for e in Event}
    kinds = {"entry", "reservation", "warning", "more", "summary"}
    seen = {
        r["CNI_REAPER_EVENT"]
        if r["CNI_REAPER_EVENT"] in kinds
        else "reservation"
        if r["CNI_REAPER_ACTION"].endswith("-reservation")
        else "entry"
        for r in records
    }
    assert seen == kinds
    for record in records:
        assert [name for name, value in record.items() if not value] == [], record["MESSAGE"]
    # A reservation names its owner's container and interface, as its file says them.
    released = next(
        r
        for r in records
        if r.get("CNI_REAPER_ACTION") == "del-reservation" and r["CNI_REAPER_OUTCOME"] == "done"
    )
    assert (released["CNI_CONTAINERID"], released["CNI_IFNAME"]) == (CONTAINER_IDS[4], "eth0")


def test_a_dry_run_writes_every_line_though_in_blocks(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """More damaged files than one block holds: every line still arrives, the summary last."""
    damaged = {crashed.node.write_result(f"hl-{n:064x}-eth0", b"").name for n in range(150)}
    crashed.reboot()

    code = cli.main(crashed.argv("--dry-run"), clock=lambda: crashed.t0 + 60, environ={})

    lines = capsys.readouterr().err.splitlines()
    assert code == 0
    assert len(damaged) > 2 * cli.EVENT_BLOCK
    assert len(lines) == 151  # 150 planned repairs, then the summary
    planned = {line.split(":")[1].strip() for line in lines[:-1]}
    assert planned == damaged
    assert lines[-1].startswith("cni-reaper: 150 entries;")


def test_past_the_bound_a_kind_is_counted_in_one_record_and_the_report_stays_whole(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """As lines (a log file fed to a collector has journald's problem too): of each kind the
    first `bound`, then one MORE record naming how many more and where they all are."""
    repaired = [crashed.add(f"{n:064x}") for n in range(5)]
    for path in repaired:
        path.write_bytes(b"")
    crashed.reboot()
    crashed.node.record_before_runtime(crashed.t0 + 20, crashed.ipam / "hl")
    crashed.node.runtime_starts()
    left = [crashed.node.write_result(f"hl-{n + 100:064x}-eth0", b"") for n in range(4)]
    for n in range(3):  # each a warning naming it, beside the run's own
        crashed.node.write_conf(f"{n}-broken.conflist", b"{")
    stream = io.StringIO()

    code, report = crashed.run(capsys, events=EventLog(stream=stream, bound=2))

    assert code == 65
    assert len(report["entries"]) == len(repaired) + len(left)  # the report has them all
    assert len(report["warnings"]) >= 5
    lines = stream.getvalue().splitlines()
    events = [line.split("cni_reaper_event=")[1].split()[0].rstrip(")") for line in lines]
    assert Counter(events) == {"repaired": 2, "left": 2, "warning": 2, "more": 3, "summary": 1}
    assert [line for line in lines if "cni_reaper_event=warning" in line] == [
        f"cni-reaper: {warning} (cni_reaper_event=warning "
        f"cni_reaper_warnings={len(report['warnings'])} cni_reaper_dry_run=0)"
        for warning in report["warnings"][:2]
    ]
    more = {line.split("cni_reaper_more_of=")[1].split()[0]: line for line in lines[-4:-1]}
    assert more["warning"].startswith(
        f"cni-reaper: {len(report['warnings']) - 2} more warning records not logged (2 logged"
    )
    assert f"cni_reaper_warnings={len(report['warnings'])} " in lines[-1]
    quarantine = crashed.node.quarantine / "11111111-2222-3333-4444-555555555555"
    assert more["repaired"].startswith(
        "cni-reaper: 3 more repaired records not logged (2 logged, at most 2 of a kind per "
        "run): this run's JSON report (--json) lists every one; moved files are in "
        f"{quarantine}, each beside its JSON sidecar ("
    )
    assert "cni_reaper_not_logged=3 " in more["repaired"]
    assert "cni_reaper_not_logged=2 " in more["left"]
    assert "quarantine" not in more["left"]  # left files stay where they are
    # The summary counts them all.
    assert f"cni_reaper_not_logged={5 + len(report['warnings']) - 2} " in lines[-1]


def test_the_records_for_cut_failures_keep_their_priority() -> None:
    recorder = Recorder()
    events = EventLog(send=recorder, bound=1)
    failed = {"MESSAGE": "x", "MESSAGE_ID": Event.REPAIR_FAILED.message_id, "PRIORITY": "3"}
    for _ in range(3):
        events.emit({**failed, "CNI_REAPER_EVENT": "repair-failed"})
    assert events.cut == {Event.REPAIR_FAILED: 2}
    assert len(recorder.sent) == 1
    fields = more_fields(Event.REPAIR_FAILED, 1, 2, False, False, "/q/boot")
    assert fields["PRIORITY"] == "3"  # err: journalctl -p err shows that failures were cut
    assert more_fields(Event.KEPT, 1, 2, False, False, None)["PRIORITY"] == "4"
    assert "cni-reaper --dry-run --json" not in fields["MESSAGE"]
    assert "a dry run, those still there" in fields["MESSAGE"]
