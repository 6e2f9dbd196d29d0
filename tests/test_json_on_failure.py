"""With --json, a run that refuses or fails early still prints one schema-1 document, naming the
error and the exit code; the message also goes to stderr, as without --json, but where stderr
is the file stdout goes to (cron's >>log 2>&1), which then holds one document that parses."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cni_reaper import cli
from cni_reaper.errors import ExitCode
from cni_reaper.lock import RunLock
from cni_reaper.paths import NodePaths
from tests.crashed import Crashed

REPO = Path(__file__).resolve().parent.parent
SCHEMA_KEYS = {
    "schema",
    "version",
    "dry_run",
    "results_dir",
    "conf_dirs",
    "bin_dirs",
    "boot",
    "warnings",
    "entries",
}


def one_document(out: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(out)  # one document, nothing after it
    assert SCHEMA_KEYS | {"host_local", "error", "summary"} <= set(doc)
    assert doc["schema"] == 1
    assert doc["summary"]["exit_code"] == doc["error"]["exit_code"]
    return doc


def test_another_run_holds_the_lock(crashed: Crashed, capsys: pytest.CaptureFixture[str]) -> None:
    crashed.reboot()
    with RunLock(NodePaths.build(root=str(crashed.node.root)).lock_file):
        assert crashed.run_main() == ExitCode.REFUSED
    captured = capsys.readouterr()
    doc = one_document(captured.out)
    assert doc["error"]["exit_code"] == ExitCode.REFUSED
    assert "another cni-reaper holds" in doc["error"]["message"]
    assert "another cni-reaper holds" in captured.err


def test_a_runtime_answers(crashed: Crashed, capsys: pytest.CaptureFixture[str]) -> None:
    crashed.reboot()
    with crashed.containerd_answering():
        assert crashed.run_main() == ExitCode.REFUSED
    doc = one_document(capsys.readouterr().out)
    assert doc["error"]["message"].startswith("a container runtime is running (it answers on")
    assert doc["entries"] == [] and doc["boot"] is None


def test_the_results_dir_is_a_symlink(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    crashed.results_dir_links_to(tmp_path / "elsewhere")
    assert crashed.run_main("--dry-run") == ExitCode.DATA
    doc = one_document(capsys.readouterr().out)
    assert doc["error"]["exit_code"] == ExitCode.DATA
    assert "symlink" in doc["error"]["message"]
    # It got as far as knowing the boot: the document says what it knew.
    assert doc["boot"]["boot_id"] == "11111111-2222-3333-4444-555555555555"


@pytest.mark.parametrize(
    "argv",
    [["--json", "--parallel", "0"], ["--json", "--plugin-timeout", "soon"], ["--json", "--nope"]],
)
def test_a_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(argv) == ExitCode.USAGE
    doc = one_document(capsys.readouterr().out)
    assert doc["error"]["exit_code"] == ExitCode.USAGE


@pytest.mark.parametrize(
    "argv",
    [["--root", "/no-such-node"], ["--root", "/", "--plugin-timeout", "0"]],
    ids=["refused root", "bad value"],
)
def test_both_streams_to_one_log_get_one_document_that_parses(
    tmp_path: Path, argv: list[str]
) -> None:
    """They got the document, then the message and the usage after it: no JSON that parses.
    The message in the document is the error's, without argparse's usage. Found by an
    operator's review."""
    log = tmp_path / "log"
    with log.open("w") as both:
        done = subprocess.run(
            [sys.executable, "-m", "cni_reaper", "--dry-run", "--json", *argv],
            stdout=both,
            stderr=both,
            cwd=REPO,
        )

    doc = one_document(log.read_text())
    assert done.returncode == doc["error"]["exit_code"] == ExitCode.USAGE
    assert "usage:" not in doc["error"]["message"]
