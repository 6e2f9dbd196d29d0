"""A person at a terminal reads the report once; the per-event key=value lines are for logs.

Each run is the real `python -m cni_reaper` with its stdout and stderr on a real
pseudo-terminal, a pipe or a file, as an operator's shell or cron would connect them; what the
terminal shows is read from the pseudo-terminal's master side.
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, NamedTuple

import pytest

from cni_reaper import sinks
from cni_reaper.errors import ExitCode
from tests.nodetree import CONTAINER_IDS, NodeTree
from tests.private_node import cannot_run

REPO = Path(__file__).resolve().parent.parent
LOG_LINE = re.compile(r"\bcni_reaper_event=")
# A plugin whose DEL fails as a CNI plugin says so: its error JSON on stdout, exit 1.
FAILING_DEL = """cat >/dev/null
printf '{"cniVersion":"1.0.0","code":11,"msg":"pool store is gone"}'
exit 1
"""


@pytest.fixture(autouse=True)
def _root() -> None:
    if os.geteuid() != 0:
        # A dry run on a node's root still vets the plugins as root would run them, and a
        # real run runs them confined to the root (cni_reaper/repair/confine.py).
        cannot_run("needs root: the reaper runs plugins confined to the node's root")


class Node(NamedTuple):
    tree: NodeTree
    damaged: list[str]  # the damaged cache files' names

    def argv(self, *extra: str) -> list[str]:
        bin_dir = str(self.tree.root / "opt/cni/bin")
        return ["--root", str(self.tree.root), "--bin-dir", bin_dir, *extra]


def damaged_node(root: Path, files: int = 3) -> Node:
    """A node whose previous boot crashed and left damaged cache files of a network whose one
    plugin fails every DEL; this boot began a moment ago, and no runtime has started in it."""
    tree = NodeTree(root)
    now = time.time()
    tree.boot(now - 3600)
    tree.login(now - 3500)
    tree.fake_plugin_network("failing", "failing", FAILING_DEL)
    damaged = [tree.write_result(f"failing-{cid}-eth0", b"").name for cid in CONTAINER_IDS[:files]]
    tree.boot(now - 0.5)
    tree.write_boot_world(btime=now - 1)
    return Node(tree, damaged)


def _environ() -> dict[str, str]:
    """The test's environment, without what would name its own journal or service manager."""
    env = {k: v for k, v in os.environ.items() if k not in ("JOURNAL_STREAM", "NOTIFY_SOCKET")}
    env["PYTHONPATH"] = str(REPO)
    return env


def _read_all(master: int) -> str:
    """What the terminal shows until every writer has closed it, line ends as a file has them
    (the terminal turns each \\n into \\r\\n)."""
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError as e:  # EIO: the last process holding the other side is gone
            if e.errno != errno.EIO:
                raise
            break
        if not data:
            break
        chunks.append(data)
    return b"".join(chunks).decode().replace("\r\n", "\n")


class Seen(NamedTuple):
    code: int
    terminal: str  # what the pseudo-terminal showed
    other: str  # what went to the pipe or file, if one stream went there


@contextmanager
def _terminal() -> Iterator[tuple[int, int]]:
    master, slave = os.openpty()
    try:
        yield master, slave
    finally:
        os.close(master)


def reaper(argv: list[str], stdout: str, stderr: str, log: Path | None = None) -> Seen:
    """`python -m cni_reaper argv` with stdout and stderr each on "terminal", "pipe", "file"
    (log) or "stdout" (the same file or pipe as stdout, as `2>&1` does)."""
    with _terminal() as (master, slave):
        handles: dict[str, int | IO[bytes]] = {"terminal": slave}
        opened = []
        if "file" in (stdout, stderr):
            assert log is not None
            file = log.open("wb")
            opened.append(file)
            handles["file"] = file
        handles["pipe"] = subprocess.PIPE
        out = handles[stdout]
        err = out if stderr == "stdout" else handles[stderr]
        proc = subprocess.Popen(
            [sys.executable, "-m", "cni_reaper", *argv],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            cwd=REPO,
            env=_environ(),
        )
        os.close(slave)  # the child's copy is the only one left: EIO once it exits
        shown = _read_all(master)
        piped = ""
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                piped += stream.read().decode()
        code = proc.wait(timeout=120)
        for file in opened:
            file.close()
    if "file" in (stdout, stderr):
        assert log is not None
        piped = log.read_text()
    return Seen(code, shown, piped)


def times_named(text: str, name: str) -> int:
    """How many lines begin with the file's name: its entry, or a log line, names it so."""
    return sum(1 for line in text.splitlines() if line.startswith((name, f"cni-reaper: {name}")))


def summary_line(text: str) -> str:
    (line,) = [line for line in text.splitlines() if line.startswith("summary: ")]
    return line


def written_lines(text: str) -> dict[str, str]:
    """Each entry's evidence line, by the entry's file name."""
    found: dict[str, str] = {}
    name = ""
    for line in text.splitlines():
        if not line.startswith(" "):
            name = line.split(": ", 1)[0]
        elif line.startswith("    written: "):
            found[name] = line
    return found


def test_at_a_terminal_each_entry_is_said_once(tmp_path: Path) -> None:
    node = damaged_node(tmp_path / "node")

    seen = reaper(node.argv("--dry-run"), stdout="terminal", stderr="terminal")

    assert seen.code == ExitCode.OK, seen.terminal
    assert not LOG_LINE.search(seen.terminal), seen.terminal
    for name in node.damaged:
        assert times_named(seen.terminal, name) == 1, seen.terminal
    assert summary_line(seen.terminal).endswith("3 planned (0 will fail), 0 left alone; exit 0")


def test_json_at_a_terminal_is_the_document_alone(tmp_path: Path) -> None:
    node = damaged_node(tmp_path / "node")

    seen = reaper(node.argv("--dry-run", "--json"), stdout="terminal", stderr="terminal")

    document = json.loads(seen.terminal)  # nothing but the document: no line before or after
    assert sorted(e["path"] for e in document["entries"]) == sorted(node.damaged)
    assert document["summary"]["outcome"] == {"planned": 3}
    assert seen.code == document["summary"]["exit_code"] == ExitCode.OK


def test_piped_to_a_pager_the_terminal_shows_no_log_lines(tmp_path: Path) -> None:
    """`cni-reaper --dry-run | less`: the report goes to the pager, and nothing writes over it
    on the terminal the pager draws on."""
    node = damaged_node(tmp_path / "node")

    seen = reaper(node.argv("--dry-run"), stdout="pipe", stderr="terminal")

    assert seen.terminal == ""
    for name in node.damaged:
        assert times_named(seen.other, name) == 1, seen.other
    assert summary_line(seen.other)


def test_stderr_to_a_log_keeps_one_log_line_per_event(tmp_path: Path) -> None:
    """`cni-reaper 2>log`: the report on the terminal, the log lines in the log."""
    node = damaged_node(tmp_path / "node")

    seen = reaper(node.argv("--dry-run"), "terminal", "file", tmp_path / "log")

    assert not LOG_LINE.search(seen.terminal)
    for name in node.damaged:
        assert times_named(seen.terminal, name) == 1, seen.terminal
    lines = seen.other.splitlines()
    assert len(lines) == 4  # one per damaged file, then the summary
    for name in node.damaged:
        (line,) = [line for line in lines if name in line]
        assert "cni_reaper_event=planned" in line
    assert "cni_reaper_event=summary" in lines[-1]


@pytest.mark.parametrize("form", ["text", "json"])
def test_both_streams_to_one_file_say_it_once(tmp_path: Path, form: str) -> None:
    """`cni-reaper >>log 2>&1`, as cron runs it: the report once; with --json, a document that
    parses."""
    node = damaged_node(tmp_path / "node")
    extra = ["--json"] if form == "json" else []

    seen = reaper(node.argv("--dry-run", *extra), "file", "stdout", tmp_path / "log")

    assert seen.terminal == ""
    if form == "json":
        assert len(json.loads(seen.other)["entries"]) == 3
    else:
        assert not LOG_LINE.search(seen.other), seen.other
        for name in node.damaged:
            assert times_named(seen.other, name) == 1, seen.other


def test_the_summary_says_how_many_repairs_failed(tmp_path: Path) -> None:
    """A real run whose every DEL fails: the terminal says so in the summary line, and the
    journal's summary message (here the log line on stderr) says it as well."""
    node = damaged_node(tmp_path / "node", files=2)
    argv = node.argv("--plugin-timeout", "10")

    seen = reaper(argv, "terminal", "file", tmp_path / "log")

    assert seen.code == ExitCode.ACTION_FAILED
    # Moved all the same, so the runtime's DEL no longer aborts on them; said so.
    failed = "0 done, 2 failed (2 of them moved to the quarantine all the same), 0 left alone"
    assert summary_line(seen.terminal).endswith(f"{failed}; exit 73")
    for name in node.damaged:
        assert times_named(seen.terminal, name) == 1, seen.terminal
    assert seen.terminal.count("pool store is gone") == 2
    summary = seen.other.splitlines()[-1]
    assert f"; {failed}; " in summary
    assert "cni_reaper_failed=2" in summary


def test_one_earlier_boots_proof_is_said_once(tmp_path: Path) -> None:
    """Files written in the previous boot and in the one before it: each boot's part of the
    evidence is said once, each file's line names it in a few words; the JSON report keeps
    every file's evidence whole."""
    tree = NodeTree(tmp_path / "node")
    tree.fake_plugin_network("failing", "failing", FAILING_DEL)
    tree.boot(time.time() - 3600)
    older = [tree.write_result(f"failing-{c}-eth0", b"").name for c in CONTAINER_IDS[:3]]
    time.sleep(1.1)  # the next boot's record after those files' ctime, which cannot be set
    tree.boot(time.time())
    time.sleep(0.1)
    newer = [tree.write_result(f"failing-{c}-eth1", b"").name for c in CONTAINER_IDS[3:6]]
    # This boot begins clearly later than every file: more than the reaper's 2 s margin.
    time.sleep(3.5)
    now = time.time()
    tree.boot(now - 0.5)
    tree.write_boot_world(btime=now)
    node = Node(tree, older + newer)

    text = reaper(node.argv("--dry-run", "-v"), "terminal", "terminal").terminal
    document = json.loads(reaper(node.argv("--dry-run", "--json"), "pipe", "terminal").other)

    assert "written in the boot that began" not in text, text
    (legend,) = [line for line in text.splitlines() if line.startswith("    boot -2 (wtmp)")]
    assert legend.endswith("crashed (no shutdown record before the next boot)")
    (boot_line,) = [line for line in text.splitlines() if "previous boot began" in line]
    assert "crashed" in boot_line
    assert "this boot began" not in text  # the header's boot line says when
    evidence = written_lines(text)
    for name in older:
        assert "; in boot -2, " in evidence[name], evidence[name]
    for name in newer:
        assert "; in the previous boot, " in evidence[name], evidence[name]
    for line in evidence.values():
        assert line.startswith("    written: in the pre-runtime record this run took; clocks:")
        assert "before this boot's start" in line
    for entry in document["entries"]:
        assert "written in the boot that began" in entry["evidence"]
        assert "this boot began" in entry["evidence"]


def test_under_systemd_without_systemd_python_the_journal_gets_lines_and_no_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The unit on a node without systemd-python: stderr is the stream systemd named in
    $JOURNAL_STREAM (a file stands for journald's socket here); each event is a line there, and
    the text report, which would say it all again in the same journal, is not printed."""
    monkeypatch.setitem(sys.modules, "systemd._journal", None)  # the import fails, as there
    with (tmp_path / "stream").open("w") as stream, (tmp_path / "stdout").open("w") as out:
        st = os.fstat(stream.fileno())
        named = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        chosen = sinks.choose(named, out, stream)
        assert not chosen.events.native
        assert not chosen.text_report
        chosen.events.emit({"MESSAGE": "m", "CNI_REAPER_EVENT": "planned"})
        chosen.events.flush()
        # Not named: a file is a log, and the report goes to stdout.
        unnamed = sinks.choose({}, out, stream)
        assert unnamed.text_report
        unnamed.events.emit({"MESSAGE": "n", "CNI_REAPER_EVENT": "planned"})
        unnamed.events.flush()
    assert (tmp_path / "stream").read_text().splitlines() == [
        "cni-reaper: m (cni_reaper_event=planned)",
        "cni-reaper: n (cni_reaper_event=planned)",
    ]
