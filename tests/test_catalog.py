"""The journal's message catalog, systemd/cni-reaper.catalog, as systemd's own journalctl reads
it: compiled into a root's catalog database (`journalctl --root=ROOT --update-catalog`, which
is what the packages' triggers run), listed, and shown under real records by `journalctl -x`."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from cni_reaper.journal import Event
from tests.crashed import Crashed
from tests.journald_scenario import reaper_in_journald
from tests.private_node import cannot_run, unshare
from tests.test_journal import _why_no_journald, mixed_node, records_of_every_kind

REPO = Path(__file__).resolve().parent.parent
CATALOG = REPO / "systemd/cni-reaper.catalog"
SUBSTITUTION = re.compile(r"@([A-Za-z0-9_]+)@")


def journalctl(*args: str, prefix: tuple[str, ...] = ()) -> str:
    tool = shutil.which("journalctl")
    if tool is None:
        cannot_run("needs journalctl (Debian package systemd)")
    shown = subprocess.run([*prefix, tool, "--no-pager", *args], capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    return shown.stdout


def catalog_root(root: Path) -> Path:
    """root with the catalog where the packages install it, and its database built."""
    catalog_dir = root / "usr/lib/systemd/catalog"
    catalog_dir.mkdir(parents=True)
    shutil.copy(CATALOG, catalog_dir)
    journalctl(f"--root={root}", "--update-catalog")
    assert (root / "var/lib/systemd/catalog/database").is_file()
    return root


def dumped_entries(root: Path) -> dict[str, str]:
    """Each entry as journalctl keeps it in the database: message ID -> its text."""
    dump = journalctl(f"--root={root}", "--dump-catalog")
    parts = re.split(r"^-- ([0-9a-f]{32})\n", dump, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2]))


def test_every_message_id_is_listed_with_its_subject_and_no_other(tmp_path: Path) -> None:
    root = catalog_root(tmp_path)

    listed = journalctl(f"--root={root}", "--list-catalog").splitlines()

    by_id = dict(line.split(" ", 1) for line in listed)
    assert sorted(by_id) == sorted(event.message_id for event in Event)
    assert len(listed) == len(by_id)  # one entry per ID
    for message_id, text in dumped_entries(root).items():
        subject = re.search(r"^Subject: (.+)$", text, flags=re.MULTILINE)
        assert subject is not None, message_id
        assert by_id[message_id] == f"cni-reaper: {subject.group(1)}"
        assert "Documentation: man:cni-reaper(8)" in text
        # Prose for a text console: lines of at most 76 characters.
        assert max(len(line) for line in text.splitlines()) <= 76, message_id


def test_every_substituted_field_is_one_every_record_of_its_id_carries(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """journalctl shows a field a record lacks as its bare name: each @FIELD@ must be there."""
    records = records_of_every_kind(crashed, capsys)
    entries = dumped_entries(catalog_root(tmp_path / "root"))
    for message_id, text in entries.items():
        named = set(SUBSTITUTION.findall(text))
        assert named, f"{message_id} says nothing of the record it explains"
        of_id = [r for r in records if r["MESSAGE_ID"] == message_id]
        assert of_id, message_id
        for record in of_id:
            assert named - record.keys() == set(), record["MESSAGE"]


def test_journalctl_x_explains_real_records_with_their_values(
    crashed: Crashed, tmp_path: Path
) -> None:
    reason = _why_no_journald()
    if reason:
        cannot_run(reason)
    expected = mixed_node(crashed, wall_clock=True)
    root = catalog_root(tmp_path / "root")
    reaper_in_journald(
        crashed.node.root, tmp_path / "journal.json", journal_copy=root / "var/log/journal"
    )

    # --root finds the journal and --list-catalog the database under the root, but -x looks
    # entries up through sd_journal_get_catalog, which reads the machine's own database: the
    # root's is mounted over it, in a mount namespace of this command's own.
    database_dir = "/var/lib/systemd/catalog"
    in_namespace = (
        *unshare(),
        "sh",
        "-c",
        'mount --bind "$1" "$2" && shift 2 && exec "$@"',
        "sh",
        str(root / database_dir.lstrip("/")),
        database_dir,
    )
    shown = journalctl(
        f"--root={root}", "-x", "-o", "short", "SYSLOG_IDENTIFIER=cni-reaper", prefix=in_namespace
    )

    explained = "\n".join(line for line in shown.splitlines() if line.startswith("░░ "))
    repaired = next(name for name, event in expected.items() if event == "repaired")
    assert "cni-reaper carried out del-and-quarantine on a file" in explained
    assert f"░░ {repaired} (empty)." in explained
    assert "░░ Subject: A run finished: what it found, did and left" in explained
    assert "A run of cni-reaper ended with exit code 65." in explained
    assert "Results entries: 4" in explained
    # Every substitution was made: no field name shows bare.
    for name in set(SUBSTITUTION.findall(CATALOG.read_text())):
        assert name not in explained
