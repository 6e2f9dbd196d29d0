"""The journal witness against persistent journals written by a real systemd-journald
(tests/journal_boots_scenario.py): one boot that crashed, one that shut down, and the boot the
reaper runs in; then the journals a node can hold instead (none, volatile, a symlink) and a read
cut short by its deadline."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni_reaper import boot
from cni_reaper.evidence import journal
from cni_reaper.paths import NodePaths
from tests.nodetree import NodeTree
from tests.private_node import cannot_run, unshare

REPO = Path(__file__).resolve().parent.parent
CRASHED = "0a0a0a0a-1111-4222-8333-444444444444"
CLEAN = "0b0b0b0b-1111-4222-8333-444444444444"
CURRENT = "11111111-2222-3333-4444-555555555555"  # NodeTree's boot id
T = 1_790_000_000.0


def compact(boot_id: str) -> str:
    return boot_id.replace("-", "")


@pytest.fixture(scope="module")
def journal_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if os.geteuid() != 0 or not Path("/lib/systemd/systemd-journald").exists():
        cannot_run("needs root and systemd-journald")
    pytest.importorskip("systemd._reader")
    out = tmp_path_factory.mktemp("journal")
    proc = subprocess.run(
        [
            *unshare(pid=True),
            sys.executable,
            "-m",
            "tests.journal_boots_scenario",
            str(out),
            f"{CRASHED}:crash",
            f"{CLEAN}:clean",
            f"{CURRENT}:crash",  # still running when the reaper reads: its end is not written
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    yield out


def test_the_boots_a_real_journal_knows_and_how_each_ended(journal_dir: Path) -> None:
    w = journal.read("/", CURRENT, directory=str(journal_dir))
    assert w.consulted and w.warnings == ()
    assert [(b.boot_id, b.ended) for b in w.boots] == [
        (compact(CRASHED), "crashed"),
        (compact(CLEAN), "clean"),
        (compact(CURRENT), "running"),
    ]
    assert w.boots[1].shutdown == "journald's Journal stopped"
    for b in w.boots:
        assert b.last is not None and b.first <= b.last
    assert [b.first for b in w.boots] == sorted(b.first for b in w.boots)
    assert w.previous == w.boots[1]
    assert w.previous_boot_crashed is False
    assert f"the previous boot {compact(CLEAN)}" in w.says and "clean" in w.says
    assert w.seconds < journal.DEADLINE


def test_the_journal_is_read_without_the_python_layer_and_its_imports(journal_dir: Path) -> None:
    """At boot every module comes from a cold disk: both readers of the journal (this witness
    and the file system's kernel log) use systemd-python's C reader alone, never
    systemd.journal, which converts every field and loads logging, uuid and traceback."""
    code = (
        "import json, sys\n"
        "from cni_reaper.evidence import fs_crash, journal\n"
        f"w = journal.read('/', {CURRENT!r}, directory={str(journal_dir)!r})\n"
        f"fs_crash.journal_kernel_log({CURRENT!r}, directory={str(journal_dir)!r})\n"
        "heavy = ('systemd.journal', 'logging', 'uuid', 'traceback')\n"
        "print(json.dumps([w.consulted, [m for m in heavy if m in sys.modules]]))\n"
    )
    ran = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert json.loads(ran.stdout) == [True, []]


def test_the_previous_boot_is_the_one_before_this_one(journal_dir: Path) -> None:
    w = journal.read("/", CLEAN, directory=str(journal_dir))
    assert w.previous is not None and w.previous.boot_id == compact(CRASHED)
    assert w.previous_boot_crashed is True
    assert w.boots[1].ended == "running"
    # A boot the journal does not know (a volatile journal this boot): the newest it knows.
    w = journal.read("/", "99999999-1111-4222-8333-444444444444", directory=str(journal_dir))
    assert w.previous is not None and w.previous.boot_id == compact(CURRENT)
    assert w.previous.ended == "crashed"


def test_boots_examined_are_capped_to_the_newest(journal_dir: Path) -> None:
    w = journal.read("/", CURRENT, directory=str(journal_dir), max_boots=2)
    assert [b.boot_id for b in w.boots] == [compact(CLEAN), compact(CURRENT)]
    assert w.warnings == ("3 boots in the journal: only the newest 2 examined",)


def test_a_read_past_its_deadline_stops_and_says_so(journal_dir: Path) -> None:
    ticks = iter(range(10**6))

    def slow_clock() -> float:  # each look at the clock: a second later
        return float(next(ticks))

    w = journal.read("/", CURRENT, directory=str(journal_dir), clock=slow_clock, deadline=2.5)
    assert w.consulted
    assert any("deadline" in warning for warning in w.warnings)
    assert all(b.ended == "unknown" for b in w.boots)
    assert w.previous_boot_crashed is None


def test_no_persistent_journal_is_skipped_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = journal.read(str(tmp_path), CURRENT)
    assert (w.consulted, w.says) == (
        False,
        f"skipped: no persistent journal at {tmp_path}/var/log/journal",
    )
    # On the machine itself: the journal is volatile, it keeps no earlier boot.
    monkeypatch.setattr(journal, "JOURNAL_DIR", "var/log/no-such-journal-dir")
    w = journal.read("/", CURRENT)
    assert not w.consulted
    assert w.says.startswith("skipped: the journal is volatile")


def test_a_symlinked_journal_dir_is_refused(tmp_path: Path, journal_dir: Path) -> None:
    (tmp_path / "var/log").mkdir(parents=True)
    (tmp_path / "var/log/journal").symlink_to(journal_dir)
    w = journal.read(str(tmp_path), CURRENT)
    assert not w.consulted and "symlinks are refused" in w.says


def test_without_systemd_python_the_witness_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "var/log/journal").mkdir(parents=True)

    monkeypatch.setitem(sys.modules, "systemd._reader", None)  # its import fails
    w = journal.read(str(tmp_path), CURRENT)
    assert (w.consulted, w.says) == (False, "not read: systemd-python not installed")


def test_load_reports_the_roots_journal_and_decides_nothing_from_it(
    tmp_path: Path, journal_dir: Path
) -> None:
    """Under --root the root's journal is read; the previous boot's verdict is still wtmp's."""
    node = NodeTree(tmp_path)
    node.boot(T)
    node.shutdown(T + 500)
    node.boot(T + 1010)
    node.write_boot_world(btime=T + 1000, boot_id=CURRENT)
    shutil.copytree(journal_dir, tmp_path / "var/log/journal")
    ctx = boot.load(NodePaths.build(root=str(tmp_path)), lambda: T + 1100)

    says = dict(ctx.witnesses)["journal"]
    assert f"the previous boot {compact(CLEAN)}" in says
    assert ctx.journal is not None and ctx.journal.previous_boot_crashed is False
    shown = ctx.to_json()
    assert {"source": "journal", "says": says} in shown["boot_records"]  # type: ignore[operator]
    assert shown["journal"]["previous_boot"]["ended"] == "clean"  # type: ignore[index]
    assert ctx.boots_source == "wtmp" and ctx.previous_boot_crashed is False

    # A root without a journal: the witness says so, and the rest reads as before.
    shutil.rmtree(tmp_path / "var/log/journal")
    ctx = boot.load(NodePaths.build(root=str(tmp_path)), lambda: T + 1100)
    assert dict(ctx.witnesses)["journal"].startswith("skipped: no persistent journal at ")
    assert ctx.journal is None and ctx.to_json()["journal"] is None
