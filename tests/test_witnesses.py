"""One verdict on the previous boot from several witnesses (evidence/previous_boot.py): each
one's account in the report, the order in which they decide, what is said when they disagree,
what is not consulted under --root, and that the verdict moves no file."""

from __future__ import annotations

import importlib
import io
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from cni_reaper import boot, cli
from cni_reaper.evidence.previous_boot import CLEAN, CRASHED, UNKNOWN, Account, combine
from cni_reaper.journal import EventLog
from cni_reaper.paths import NodePaths
from tests import journal_files
from tests.nodetree import NodeTree, host_local_conflist
from tests.private_node import cannot_run

T0 = 1_790_000_000.0  # this boot began here
PREVIOUS = "aaaaaaaa-bbbb-cccc-dddd-000000000001"
CURRENT = "aaaaaaaa-bbbb-cccc-dddd-000000000002"
SHUTDOWN_MESSAGE = "98268866d1d54a499c4e98921d93bc40"  # SD_MESSAGE_SHUTDOWN


def test_the_first_witness_that_knows_decides_and_the_others_are_named() -> None:
    accounts = [
        Account("shutdown marker", True, UNKNOWN, "no clean-shutdown marker and no earlier run"),
        Account("file system", False, UNKNOWN, "not consulted: the root is /x"),
        Account("wtmp", True, CLEAN, "the boot begun ... shut down at ..."),
        Account("wtmpdb", True, CRASHED, "the boot begun ... has no shutdown record"),
        Account("journal", True, CRASHED, "..."),
    ]
    verdict = combine(accounts)
    assert (verdict.crashed, verdict.decided_by) == (False, "wtmp")
    assert verdict.disagreement == (
        "the wtmpdb, the journal say the previous boot crashed; the wtmp says it shut down "
        "cleanly, and its account is used"
    )
    assert [a.witness for a in verdict.not_consulted] == ["file system"]
    nobody = combine([Account("wtmp", False, UNKNOWN, "not found")])
    assert (nobody.crashed, nobody.decided_by, nobody.disagreement) == (None, None, None)


def _journal(root: Path, previous_clean: bool) -> None:
    """The root's persistent journal: the previous boot, with or without systemd's shutdown
    message at its end, and this boot."""
    prev, this = PREVIOUS.replace("-", ""), CURRENT.replace("-", "")
    said: list[tuple[str, float, dict[str, str]]] = [
        (prev, T0 - 3500, {"MESSAGE": "Started the previous boot"}),
        *(
            [(prev, T0 - 60, {"MESSAGE_ID": SHUTDOWN_MESSAGE, "MESSAGE": "down"})]
            if previous_clean
            else []
        ),
        (prev, T0 - 50, {"MESSAGE": "last words"}),
        (this, T0 + 2, {"MESSAGE": "this boot"}),
    ]
    journal_files.write_journal(
        root / "var/log/journal",
        [
            {
                "__REALTIME_TIMESTAMP": str(int(at * 1e6)),
                "__MONOTONIC_TIMESTAMP": str(n + 1),
                "_BOOT_ID": boot,
                "_TRANSPORT": "journal",
                **fields,
            }
            for n, (boot, at, fields) in enumerate(said)
        ],
    )


def _node(
    tmp_path: Path, *, marker: str | None, wtmpdb_crashed: bool | None, journal: bool | None
) -> NodeTree:
    """An earlier boot's empty cache file, and the witnesses asked for: the marker ("clean":
    the previous boot wrote it; "unclean": the reaper ran in it and it did not; None: the
    first boot after install), wtmpdb rows, the root's journal."""
    node = NodeTree(tmp_path)
    node.write_conf("10-hl.conflist", host_local_conflist("hl", "10.22.0.0/24"))
    node.write_result(f"hl-{uuid.uuid4().hex * 2}-eth0", b"")
    if wtmpdb_crashed is not None:
        node.wtmpdb_boot(T0 - 3600)
        if not wtmpdb_crashed:
            node.wtmpdb_shutdown(T0 - 30)
        node.wtmpdb_boot(T0)
    if journal is not None:
        if journal_files.why_not():
            cannot_run(str(journal_files.why_not()))
        _journal(tmp_path, previous_clean=journal)
    state = tmp_path / "var/lib/cni-reaper"
    state.mkdir(parents=True)
    if marker is not None:
        (state / "last-run").write_text(json.dumps({"boot_id": PREVIOUS, "time": T0 - 3000}))
    if marker == "clean":
        (state / "clean-shutdown").write_text(json.dumps({"boot_id": PREVIOUS, "time": T0 - 40}))
    node.write_boot_world(btime=T0, boot_id=CURRENT)
    # The wtmp file write_boot_world leaves is empty: no boot records, as on Debian 13.
    return node


def _run(
    node: NodeTree, capsys: pytest.CaptureFixture[str], *extra: str
) -> tuple[str, list[dict[str, str]]]:
    """The text report, and the records a second run sends to the journal."""
    argv = ["--root", str(node.root), "--dry-run", *extra]
    cli.run(argv, clock=lambda: T0 + 60, events=EventLog(stream=io.StringIO()), environ={})
    text = capsys.readouterr().out
    sent: list[dict[str, str]] = []
    events = EventLog(send=lambda **fields: sent.append(fields))
    cli.run(argv, clock=lambda: T0 + 60, events=events, environ={})
    capsys.readouterr()
    return text, sent


def _report(node: NodeTree, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    out, _ = _run(node, capsys, "--json")
    doc: dict[str, Any] = json.loads(out)
    return doc


def _said(report: dict[str, Any]) -> dict[str, tuple[bool, str]]:
    return {
        w["witness"]: (w["consulted"], w["ended"])
        for w in report["boot"]["previous_boot"]["witnesses"]
    }


def test_each_witness_is_listed_with_what_it_says_and_the_marker_decides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = _node(tmp_path, marker="clean", wtmpdb_crashed=True, journal=False)

    report = _report(node, capsys)

    verdict = report["boot"]["previous_boot"]
    assert (verdict["crashed"], verdict["decided_by"]) == (False, "shutdown marker")
    assert _said(report) == {
        "shutdown marker": (True, CLEAN),
        "file system": (False, UNKNOWN),
        "wtmp": (True, UNKNOWN),
        "wtmpdb": (True, CRASHED),
        "journal": (True, CRASHED),
    }
    assert verdict["disagreement"].startswith("the wtmpdb, the journal say the previous boot")
    assert report["boot"]["previous_boot_crashed"] is False

    text, log = _run(node, capsys)
    assert (
        "previous boot began 2026-09-21T13:13:20Z (wtmpdb) and shut down cleanly, as the "
        "shutdown marker says"
    ) in text
    assert "  witness wtmpdb: crashed (the boot begun 2026-09-21T13:13:20Z has no shutdown " in text
    assert "  witness file system: not consulted (the root is " in text
    assert "  witnesses disagree: the wtmpdb, the journal say the previous boot crashed" in text
    [summary] = [r for r in log if r.get("CNI_REAPER_EVENT") == "summary"]
    assert {k: v for k, v in summary.items() if k.startswith("CNI_REAPER_WITNESS_")} == {
        "CNI_REAPER_WITNESS_SHUTDOWN_MARKER": "clean",
        "CNI_REAPER_WITNESS_FILE_SYSTEM": "not-consulted",
        "CNI_REAPER_WITNESS_WTMP": "unknown",
        "CNI_REAPER_WITNESS_WTMPDB": "crashed",
        "CNI_REAPER_WITNESS_JOURNAL": "crashed",
    }
    assert summary["CNI_REAPER_PREVIOUS_BOOT_DECIDED_BY"] == "shutdown marker"
    assert summary["CNI_REAPER_WITNESSES_DISAGREE"] == verdict["disagreement"]


def test_on_the_first_boot_after_install_the_boot_records_decide(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    node = _node(tmp_path, marker=None, wtmpdb_crashed=True, journal=True)

    report = _report(node, capsys)

    verdict = report["boot"]["previous_boot"]
    assert (verdict["crashed"], verdict["decided_by"]) == (True, "wtmpdb")
    assert _said(report)["shutdown marker"] == (True, UNKNOWN)
    assert "the journal says the previous boot shut down cleanly" in verdict["disagreement"]


@pytest.mark.parametrize(
    ("marker", "wtmpdb_crashed", "journal"),
    [("unclean", True, False), ("clean", False, True), (None, None, None)],
)
def test_the_verdict_moves_no_file(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    marker: str | None,
    wtmpdb_crashed: bool | None,
    journal: bool | None,
) -> None:
    """Crashed, clean, or no witness at all (a minimal image, the first boot after install):
    the earlier boot's empty cache file found before any runtime started is planned for the
    same repair, because the pre-runtime record alone proves which boot wrote it."""
    node = _node(tmp_path, marker=marker, wtmpdb_crashed=wtmpdb_crashed, journal=journal)

    report = _report(node, capsys)

    expected = {None: None, "unclean": True, "clean": False}[marker]
    assert report["boot"]["previous_boot"]["crashed"] is expected
    [entry] = report["entries"]
    assert (entry["written"], entry["action"]) == ("previous-boot", "del-and-quarantine")


def test_without_systemd_python_and_pyudev_the_run_is_the_same_and_says_what_it_lacks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    node = _node(tmp_path, marker="unclean", wtmpdb_crashed=True, journal=True)
    with_all = _report(node, capsys)
    real_import = importlib.import_module

    def lacking(name: str, package: str | None = None) -> Any:
        if name.startswith(("systemd", "pyudev")):
            raise ImportError(f"No module named {name!r}")
        return real_import(name, package)

    monkeypatch.setattr(importlib, "import_module", lacking)

    report = _report(node, capsys)
    text, _ = _run(node, capsys)

    assert "  witness journal: not consulted (not read: systemd-python not installed)" in text
    assert _said(report)["journal"] == (False, UNKNOWN)
    assert (
        report["boot"]["previous_boot"]["crashed"],
        report["boot"]["previous_boot"]["decided_by"],
    ) == (True, "shutdown marker")
    assert [(e["written"], e["action"]) for e in report["entries"]] == [
        (e["written"], e["action"]) for e in with_all["entries"]
    ]


def test_this_boots_own_row_is_never_the_previous_boot(tmp_path: Path) -> None:
    """wtmpdb's row for this boot says the boot's start in µs, btime in whole seconds: a row
    within the margin of this boot's start is this boot's, still open, never a crash."""
    node = NodeTree(tmp_path)
    node.wtmpdb_boot(T0 - 3600)
    node.wtmpdb_shutdown(T0 - 30)
    node.wtmpdb_boot(T0 - 0.5)  # a clock read a moment apart from btime's
    node.write_boot_world(btime=T0, boot_id=CURRENT)

    ctx = boot.load(NodePaths.build(root=str(tmp_path)), lambda: T0 + 60)

    [wtmpdb] = [a for a in ctx.previous_boot_verdict.accounts if a.witness == "wtmpdb"]
    assert (wtmpdb.consulted, wtmpdb.ended) == (True, CLEAN), wtmpdb
