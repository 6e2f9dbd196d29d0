"""What the text report tells an operator where an operator's review (2026-12-06) found it
misleading: a dry run's pre-runtime record, which it keeps nowhere; a node with no wtmp, whose
header said there was no earlier boot in it; reservations no record dates, counted as this
boot's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cni_reaper import cli
from cni_reaper.errors import ExitCode
from tests.crashed import Crashed
from tests.nodetree import CONTAINER_IDS


def test_a_dry_run_before_the_runtime_says_its_record_is_not_kept(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """It said "taken by this run", and an operator who dry-ran before starting the runtime
    believed the record was in place; the real runs after the runtime started then repaired
    nothing. Found by an operator's review."""
    crashed.add(CONTAINER_IDS[0]).write_bytes(b"")
    crashed.reboot()
    argv = ["--dry-run", *crashed.argv()]

    cli.run(argv, clock=lambda: crashed.t0 + 60, environ={})

    shown = capsys.readouterr().out
    assert "pre-runtime record taken by this dry run" in shown, shown
    assert "and not kept: a real run before the runtime starts must take it" in shown
    assert not (crashed.node.root / "run/cni-reaper").exists()


def test_a_node_with_no_wtmp_is_said_to_have_none(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """The header said "no earlier boot in wtmp" where no boot records were found at all."""
    crashed.reboot()
    (crashed.node.root / "var/log/wtmp").unlink()

    cli.run(["--dry-run", *crashed.argv()], clock=lambda: crashed.t0 + 60, environ={})

    (header,) = [
        line for line in capsys.readouterr().out.splitlines() if line.startswith("  boot ")
    ]
    assert header.endswith("; no wtmp or wtmpdb found"), header


def test_reservations_no_record_dates_are_left_as_unknown_not_current_boot(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """The runtime started before any run took the record: the crashed boot's reservations
    were counted as this boot's ("3 left (3 current-boot)"). Found by an operator's review."""
    crashed.add(CONTAINER_IDS[0]).write_bytes(b"")
    crashed.reboot()
    crashed.node.runtime_starts()

    code, report = crashed.run(capsys, "--force")

    (pool,) = report["pools"]
    assert pool["left_by_owner"] == {"unknown": 1}, pool
    assert code == ExitCode.DATA


def test_a_results_entry_that_is_a_symlink_says_where_it_points(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """It said "a symlink; never opened": where it points, and that libcni would read that,
    is what an operator needs before removing it by hand. Found by an operator's review."""
    crashed.node.results.mkdir(parents=True, exist_ok=True)
    link = crashed.node.results / f"hl-{CONTAINER_IDS[1]}-eth0"
    os.symlink("/etc/hostname\x1b[2J", link)
    crashed.reboot()

    code, report = crashed.run(capsys)

    (entry,) = report["entries"]
    assert entry["content_detail"] == (
        "a symlink to /etc/hostname\x1b[2J; never followed (libcni would read what it points to)"
    )
    assert (entry["action"], code) == ("report", ExitCode.DATA)
    assert os.readlink(link) == "/etc/hostname\x1b[2J"


def test_a_del_that_could_not_run_says_so_and_its_address_is_not_said_deleted(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """No plugin in the plugin dir: the DEL never started. The report said "plugin
    type='host-local' failed", and of the address it then released into the quarantine, that it
    was "still reserved after the DEL", a DEL that never was."""
    crashed.add(CONTAINER_IDS[0]).write_bytes(b"")
    crashed.reboot()
    empty = tmp_path / "no-plugins"
    empty.mkdir()
    argv = ["--root", str(crashed.node.root), "--bin-dir", str(empty)]

    code = cli.run(argv, clock=lambda: crashed.t0 + 60, environ={})

    shown = capsys.readouterr().out
    assert code == ExitCode.ACTION_FAILED
    missing = f"plugin 'host-local': failed to find plugin 'host-local' in path ['{empty}']"
    assert f"    error: DEL not run: {missing}\n" in shown, shown
    assert "plugin type=" not in shown
    why = "    why: still reserved: the DEL of its results entry failed or could not run\n"
    assert why in shown, shown
    assert crashed.ips() == {}  # released into the quarantine, as the policy says
