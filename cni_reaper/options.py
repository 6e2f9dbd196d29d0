"""The command line: its options, and the two readers of it, argparse and plain().

argparse's import (it loads gettext and locale) and the parser it builds came to some 15 M
instructions of every run (3.11), about a tenth of what a run spends before it reads a file,
at every boot while the runtime waits. The command lines the unit and an operator write are
plain: each option by its full name, a value in the next word or after '='. plain() reads
those and nothing else: for any other word (an abbreviation, `-vv`, `--`, --help, --version,
a stray word), a value that is empty or starts with '-', a flag given a value, or a number
float() or int() refuses, it returns None, and argparse reads the command line and decides,
its errors and help included. Whatever plain() returns is what argparse returns for the same
words: tests/test_options.py holds the two to each other over generated command lines.
"""

from __future__ import annotations

import os

from cni_reaper import __version__
from cni_reaper.errors import UsageError
from cni_reaper.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from typing import Any, NoReturn

DEFAULT_PLUGIN_TIMEOUT = 30.0
# Well inside the unit's TimeoutStartSec (5 min): time is left to move files and report.
DEFAULT_DEADLINE = 180.0
# Plugins are mostly waiting on the kernel (netlink, iptables' lock): a few at once pay off
# even on a 2-core node, and a small bound keeps a boot from being swamped.
DEFAULT_PARALLEL = 4

# The end of --help, as laid out here: the exit statuses of the man page's EXIT STATUS.
EXIT_STATUS_HELP = """\
exit status:
  0    nothing wrong, or everything repaired
  1    internal error (a bug)
  2    usage error, or a --root that is not a directory this process can name
  65   damage found that the policy leaves alone, or an unsafe input
  73   an action failed: a DEL or a quarantine move
  75   refused: the lock is held, a runtime runs, or the plugins cannot be confined
  77   a real run, or --mark-clean-shutdown, not as root
  130  interrupted (SIGINT)

See man cni-reaper.
"""

DESCRIPTION = (
    "Repair the CNI results cache a crashed node left behind: replay CNI DEL for attachments "
    "whose cached result is damaged, then move the damaged files to a quarantine. Run before "
    "the container runtime starts."
)

# What an option takes: nothing (a flag), a word, a word each time it is given, a number.
FLAG, WORD, WORDS, FLOAT, INT = "flag", "word", "words", "float", "int"
_NUMBERS = {FLOAT: float, INT: int}  # how both readers make a number of the word


class Option(Record):
    names: tuple[str, ...]
    dest: str
    takes: str  # FLAG, WORD, WORDS, FLOAT or INT
    default: object
    metavar: str | None
    help: str


OPTIONS = (
    Option(
        ("--dry-run",),
        "dry_run",
        FLAG,
        False,
        None,
        "print the plan; change nothing, run no plugin",
    ),
    Option(("--json",), "json", FLAG, False, None, "print one JSON document (schema 1) on stdout"),
    Option(("--root",), "root", WORD, "/", "DIR", "prefix for every default path (default: /)"),
    Option(
        ("--cache-dir",),
        "cache_dir",
        WORD,
        None,
        "DIR",
        "libcni cache dir holding results/ (default: ROOT/var/lib/cni)",
    ),
    Option(
        ("--conf-dir",),
        "conf_dirs",
        WORDS,
        None,
        "DIR",
        "CNI config dir; repeatable (default: those the container runtimes' configs name, "
        "inside ROOT; with no runtime found, ROOT/etc/cni/net.d)",
    ),
    Option(
        ("--bin-dir",),
        "bin_dirs",
        WORDS,
        None,
        "DIR",
        "CNI plugin dir; repeatable (default: those the container runtimes' configs name, "
        "inside ROOT; with no runtime found, ROOT/opt/cni/bin, ROOT/usr/lib/cni, "
        "ROOT/usr/libexec/cni)",
    ),
    Option(
        ("--wtmp",),
        "wtmp",
        WORD,
        None,
        "FILE",
        "wtmp file; FILE.1 is read first (default: ROOT/var/log/wtmp)",
    ),
    Option(
        ("--state-dir",),
        "state_dir",
        WORD,
        None,
        "DIR",
        "quarantine and state (default: ROOT/var/lib/cni-reaper)",
    ),
    Option(
        ("--plugin-timeout",),
        "plugin_timeout",
        FLOAT,
        DEFAULT_PLUGIN_TIMEOUT,
        "SECONDS",
        f"kill a plugin's process group after this long (default: {DEFAULT_PLUGIN_TIMEOUT:g})",
    ),
    Option(
        ("--deadline",),
        "deadline",
        FLOAT,
        DEFAULT_DEADLINE,
        "SECONDS",
        "start no DEL after this long, and let no plugin run past it; the files are "
        f"still quarantined and the run reports why (default: {DEFAULT_DEADLINE:g})",
    ),
    Option(
        ("--parallel",),
        "parallel",
        INT,
        DEFAULT_PARALLEL,
        "N",
        "DEL replays at once, each of a different network; never two of one network "
        f"(default: {DEFAULT_PARALLEL})",
    ),
    Option(
        ("--force",),
        "force",
        FLAG,
        False,
        None,
        "act even while a container runtime answers on its socket",
    ),
    Option(
        ("--metrics-file",),
        "metrics_file",
        WORD,
        None,
        "PATH",
        "also write Prometheus text format here, for node_exporter's textfile collector "
        "(temp file and rename)",
    ),
    Option(
        ("--mark-clean-shutdown",),
        "mark_clean_shutdown",
        FLAG,
        False,
        None,
        "only write the clean-shutdown marker (the unit's ExecStop), then exit",
    ),
    Option(
        ("-v", "--verbose"),
        "verbose",
        FLAG,
        False,
        None,
        "also list and log the entries that are kept",
    ),
)
_BY_NAME = {name: option for option in OPTIONS for name in option.names}


class Options:
    """The command line read: argparse fills one (parse_args' namespace), plain() another."""

    dry_run: bool
    json: bool
    root: str
    cache_dir: str | None
    conf_dirs: list[str] | None
    bin_dirs: list[str] | None
    wtmp: str | None
    state_dir: str | None
    plugin_timeout: float
    deadline: float
    parallel: int
    force: bool
    metrics_file: str | None
    mark_clean_shutdown: bool
    verbose: bool

    def __repr__(self) -> str:
        return f"Options({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


def plain(argv: Sequence[str]) -> Options | None:
    """argv read as argparse reads it, if it is a plain command line; None if not."""
    read = Options()
    for each in OPTIONS:
        setattr(read, each.dest, each.default)
    words = iter(argv)
    for word in words:
        name, given, value = word.partition("=") if word.startswith("--") else (word, "", "")
        option = _BY_NAME.get(name)
        if option is None:
            return None
        if option.takes == FLAG:
            if given:
                return None
            setattr(read, option.dest, True)
            continue
        if not given:
            value = next(words, "")
        if not value or value.startswith("-"):
            return None
        if option.takes == WORDS:
            setattr(read, option.dest, [*(getattr(read, option.dest) or ()), value])
            continue
        convert = _NUMBERS.get(option.takes)
        try:
            setattr(read, option.dest, value if convert is None else convert(value))
        except ValueError:
            return None
    return read


def read(argv: Sequence[str], into: Options) -> Options:
    """argv read into `into`: by plain() if it is plain, else by argparse, which fills it as it
    goes (a usage error after --metrics-file finds it there)."""
    found = plain(argv)
    if found is None:
        return parse(argv, into)
    vars(into).update(vars(found))
    return into


def parse(argv: Sequence[str], into: Options) -> Options:
    """argv read by argparse into `into`; --help and --version print and exit, as argparse's
    do."""
    build_parser().parse_args(argv, namespace=into)
    return into


_USAGE_STARTS = "\nusage: "


def usage_error(message: str, parser: argparse.ArgumentParser | None = None) -> UsageError:
    """A usage error as argparse's own end: with the usage."""
    usage = (parser or build_parser()).format_usage().strip()
    return UsageError(f"{message}\n{usage}")


def split_usage(message: str) -> tuple[str, str]:
    """A usage error's message, and the usage usage_error() ended it with ("" if none)."""
    cut = message.rfind(_USAGE_STARTS)
    return (message, "") if cut < 0 else (message[:cut], message[cut:])


def _terminal_columns() -> int:
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size().columns  # of fd 1, where help goes
    except (ValueError, OSError):
        return 80


def build_parser() -> argparse.ArgumentParser:
    import argparse  # noqa: PLC0415 (only for a command line plain() does not read)

    class Parser(argparse.ArgumentParser):
        def error(self, message: str) -> NoReturn:
            raise usage_error(message, self)

        def format_help(self) -> str:
            # Not an epilog: argparse would refill its lines into one paragraph.
            return f"{super().format_help()}\n{EXIT_STATUS_HELP}"

    class HelpFormatter(argparse.HelpFormatter):
        """argparse's own, sized without shutil: argparse builds a formatter for every argument
        added, and shutil (which loads bz2 and lzma) would be imported for it."""

        def __init__(self, prog: str) -> None:
            super().__init__(prog, width=_terminal_columns() - 2)

    parser = Parser(prog="cni-reaper", formatter_class=HelpFormatter, description=DESCRIPTION)
    actions = {FLAG: "store_true", WORDS: "append"}
    for option in OPTIONS:
        extra: dict[str, Any] = {}
        if option.takes in _NUMBERS:
            extra["type"] = _NUMBERS[option.takes]
        if option.metavar is not None:
            extra["metavar"] = option.metavar
        parser.add_argument(
            *option.names,
            action=actions.get(option.takes, "store"),
            dest=option.dest,
            default=option.default,
            help=option.help,
            **extra,
        )
    parser.add_argument("--version", action="version", version=f"cni-reaper {__version__}")
    return parser
