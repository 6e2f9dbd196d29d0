"""options.plain() reads a plain command line as argparse reads it, and leaves every other one
to argparse: the two held to each other over generated command lines, the unit's own among
them; and a run on a plain command line never imports argparse."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_reaper import options
from cni_reaper.errors import UsageError
from tests.nodetree import NodeTree

REPO = Path(__file__).resolve().parent.parent
UNIT = REPO / "systemd/cni-reaper.service"

NAMES = [name for option in options.OPTIONS for name in option.names]
# What an operator's fingers make of a command line, and what argparse reads its own way.
ODD_WORDS = [
    "--dry", "--ro", "--bin", "--pa", "--verb", "--json=", "--root=", "--dry-run=1", "-v=1",
    "-vv", "-h", "--help", "--version", "--", "-", "", "x", "--frob", "-x", "--root=-x",
]  # fmt: skip
VALUES = [
    "/tmp", "/", "a b", "a=b", "=", "-1", "0", "1", "4", " 4 ", "4.5", "1e3", "1_0", "nan",
    "inf", "-inf", "Infinity", "0x10", "many", "é", "\udcff", "\u0664", "\uff14", "--x", "-",
    "\u22124", "\u2013v", "\u00a04\u00a0", "\u30004", " -4", "a=b=c", "9" * 4300, "9" * 4301,
]  # fmt: skip
WORD = st.sampled_from(NAMES + ODD_WORDS + VALUES)
# An option and the word after it, the most of any command line, or one word, or name=value.
PHRASE = (
    st.tuples(st.sampled_from(NAMES), st.sampled_from(VALUES + ODD_WORDS))
    | st.tuples(WORD)
    | st.tuples(st.builds("{}={}".format, st.sampled_from(NAMES), st.sampled_from(VALUES)))
)
COMMAND_LINE = st.lists(PHRASE, max_size=6).map(lambda phrases: [w for p in phrases for w in p])


def by_argparse(argv: list[str]) -> dict[str, object] | None:
    """What argparse reads, None where it refuses argv or prints (help, version) and exits."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            return vars(options.parse(argv, options.Options()))
    except (UsageError, SystemExit):
        return None


def same(read: options.Options, parsed: dict[str, object] | None) -> bool:
    """Every option read alike, a NaN as a NaN (which equals nothing, itself included)."""
    mine = vars(read)
    return (
        parsed is not None
        and mine.keys() == parsed.keys()
        and all(mine[k] == parsed[k] or (is_nan(mine[k]) and is_nan(parsed[k])) for k in mine)
    )


def is_nan(value: object) -> bool:
    return value != value  # noqa: PLR0124


@given(COMMAND_LINE)
def test_what_plain_reads_argparse_reads_the_same(argv: list[str]) -> None:
    read = options.plain(argv)
    if read is not None:
        assert same(read, by_argparse(argv)), argv


def unit_command_lines() -> list[list[str]]:
    lines = re.findall(r"^Exec(?:Start|Stop)=/usr/bin/cni-reaper(.*)$", UNIT.read_text(), re.M)
    assert len(lines) == 2
    return [line.split() for line in lines]


@pytest.mark.parametrize(
    "argv",
    [
        *unit_command_lines(),
        [],
        ["--dry-run"],
        ["--dry-run", "--json", "-v"],
        ["--root", "/mnt/node", "--dry-run"],
        ["--root=/mnt/node", "--state-dir=/mnt/state", "--wtmp", "/mnt/wtmp"],
        ["--conf-dir", "/a", "--conf-dir=/b", "--bin-dir", "/c", "--cache-dir", "/d"],
        ["--plugin-timeout", "5", "--deadline=60.5", "--parallel", "8", "--force"],
    ],
)
def test_the_command_lines_of_the_unit_and_the_manual_are_plain(argv: list[str]) -> None:
    read = options.plain(argv)
    assert read is not None
    assert vars(read) == by_argparse(argv)


def test_a_repeated_option_reads_as_argparse_reads_it() -> None:
    argv = ["--root", "/a", "--root", "/b", "--conf-dir", "/x", "--conf-dir", "/y", "-v", "-v"]
    read = options.plain(argv)
    assert read is not None
    assert (read.root, read.conf_dirs, read.verbose) == ("/b", ["/x", "/y"], True)
    assert vars(read) == by_argparse(argv)


def loads_argparse(argv: list[str], root: Path) -> tuple[int, bool]:
    """A dry run over root in a fresh interpreter: its exit code, and whether argparse was
    imported."""
    code = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "from cni_reaper import cli\n"
        f"code = cli.main({[*argv, '--root', str(root), '--dry-run']!r})\n"
        "print(json.dumps([code, 'argparse' in sys.modules]))\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("JOURNAL_STREAM", "NOTIFY_SOCKET")}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    found = json.loads(done.stdout.splitlines()[-1])
    return found[0], found[1]


def test_a_plain_command_line_runs_without_argparse(tmp_path: Path) -> None:
    node = NodeTree(tmp_path)
    node.results.mkdir(parents=True, mode=0o700)
    assert loads_argparse(["--json"], node.root) == (0, False)
    # An abbreviation is argparse's to read: the same run.
    assert loads_argparse(["--js"], node.root) == (0, True)
