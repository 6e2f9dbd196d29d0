"""Prometheus text format for node_exporter's textfile collector.

The file is written to a temp file in the same directory and renamed over the target, so the
collector never reads half a file, and it is made readable by all (0644) whatever the umask:
node_exporter runs as a user of its own, and the unit's UMask=0077 would leave it root's
alone, which the collector reports as a scrape error of the whole directory. Gauges only, no
timestamps (the textfile collector rejects them).

Every series whose labels come from a closed set is written for each of its label sets, zero
or not (verdicts, action and outcome pairs, the owners of a pool's addresses), and the totals
beside the open sets (plugin types): an alert sums or compares them and needs no absent(). A
run that ends in an error (a refusal, a usage error, an unsafe input, a bug) writes only what
it knows: its exit code, when it ended, whether it was a dry run, and the build.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable, Mapping

from cni_reaper import __version__, nonce
from cni_reaper.content import Content
from cni_reaper.escape import printable
from cni_reaper.multus import DELEGATE_RESULT, SCRATCH_FILE
from cni_reaper.plan import Action
from cni_reaper.repair.outcome import Outcome
from cni_reaper.report import Report

# What a run can say of an entry: a planned change is planned (dry run), done, failed, or
# skipped (changed since the scan); the rest is skipped.
ENTRY_ACTION_OUTCOMES: tuple[tuple[str, str], ...] = tuple(
    (action.value, outcome.value)
    for action in Action
    for outcome in (
        (Outcome.PLANNED, Outcome.DONE, Outcome.FAILED, Outcome.SKIPPED)
        if action.changes_things
        else (Outcome.SKIPPED,)
    )
)
# What a run can say of one of Multus's files (multus.py): the results entries' pairs but the
# DEL, which the reaper never runs for them.
MULTUS_ACTION_OUTCOMES: tuple[tuple[str, str], ...] = tuple(
    pair for pair in ENTRY_ACTION_OUTCOMES if pair[0] != Action.DEL_AND_QUARANTINE.value
)
MULTUS_FILES = (DELEGATE_RESULT.action_suffix, SCRATCH_FILE.action_suffix)
# The reservations a run acts on or leaves alone (reservations.py, release.py); those it keeps
# are listed only with -v, so they are not counted here.
RESERVATION_ACTION_OUTCOMES: tuple[tuple[str, str], ...] = (
    ("leave", "skipped"),
    *(
        (action, outcome)
        for action in ("del", "quarantine")
        for outcome in ("planned", "done", "failed", "skipped")
    ),
)
# What still holds an address of a pool after the run (reservations.py's owner states, and
# cli.py's "unknown" for an address no reservation was planned for).
POOL_OWNERS = ("runtime", "current-boot", "alive", "left", "failed", "damaged", "unknown")
FILE_MODE = 0o644  # node_exporter's user reads it; only root writes the directory
_NAME_ATTEMPTS = 8  # temp names tried before a write fails


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _series(name: str, help_text: str, samples: Iterable[tuple[str, float]]) -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
    lines.extend(f"{name}{labels} {_number(value)}" for labels, value in samples)
    return lines


def _escape(value: str) -> str:
    """A label value as the text format wants it. The format itself asks only for backslash,
    double quote and newline to be escaped, but also for UTF-8, which a plugin type read from
    JSON as "\\udcff" is not: printable() first, which makes it UTF-8, leaves no newline,
    and shows the value as the report and the journal show it."""
    return printable(value).replace("\\", "\\\\").replace('"', '\\"')


def _label(**labels: str) -> str:
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in labels.items()) + "}"


def _every(
    known: Iterable[tuple[str, str]], found: Mapping[tuple[str, str], int]
) -> list[tuple[tuple[str, str], int]]:
    """Each known pair, zero or not, and any other the run found (none should be)."""
    return [(pair, found.get(pair, 0)) for pair in sorted(set(known) | set(found))]


def _pairs(docs: Iterable[Mapping[str, object]]) -> dict[tuple[str, str], int]:
    counted: dict[tuple[str, str], int] = {}
    for doc in docs:
        pair = (str(doc["action"]), str(doc["outcome"]))
        counted[pair] = counted.get(pair, 0) + 1
    return counted


def _run_series(exit_code: int, dry_run: bool, started: float, finished: float) -> list[str]:
    """What every run writes, whether it ended with a report or an error."""
    lines: list[str] = []
    python = ".".join(str(n) for n in sys.version_info[:3])
    lines += _series(
        "cni_reaper_build_info",
        "Always 1; the labels say which cni-reaper wrote the file, on which Python.",
        [(_label(version=__version__, python=python), 1)],
    )
    lines += _series("cni_reaper_dry_run", "1 if the last run was a dry run.", [("", int(dry_run))])
    lines += _series(
        "cni_reaper_exit_code",
        "Exit code of the last run (0 clean or repaired, 65 damage left alone, 73 an action "
        "failed, 75 refused, 77 not root, 2 usage, 1 a bug, 130 interrupted).",
        [("", exit_code)],
    )
    lines += _series(
        "cni_reaper_run_duration_seconds",
        "Wall time of the last run.",
        [("", round(finished - started, 6))],
    )
    lines += _series(
        "cni_reaper_last_run_timestamp_seconds",
        "When the last run finished, in seconds since the epoch.",
        [("", round(finished, 3))],
    )
    return lines


def render(report: Report, started: float, finished: float) -> str:
    lines: list[str] = []
    lines += _series(
        "cni_reaper_entries",
        "Results cache entries found by the last run, by content verdict.",
        [(_label(content=c.value), report.contents.get(c.value, 0)) for c in Content],
    )
    lines += _series(
        "cni_reaper_warnings",
        "Warnings of the last run: what it could not read or use; the report and the journal's "
        "warning records say what.",
        [("", len(report.warnings))],
    )
    lines += _series(
        "cni_reaper_actions",
        "Results cache entries of the last run by planned action and outcome.",
        [
            (_label(action=a, outcome=o), n)
            for (a, o), n in _every(ENTRY_ACTION_OUTCOMES, report.actions)
        ],
    )
    reservations = {key: n for key, n in report.reservations.items() if key[0] != "keep"}
    lines += _series(
        "cni_reaper_reservations",
        "host-local reservations the last run acted on or left alone, by action and outcome "
        "(those it kept are not counted).",
        [
            (_label(action=a, outcome=o), n)
            for (a, o), n in _every(RESERVATION_ACTION_OUTCOMES, reservations)
        ],
    )
    lines += _series(
        "cni_reaper_multus_files",
        "Multus's delegate results and scratch files found by the last run, by kind, planned "
        "action and outcome.",
        [
            (_label(kind=kind, action=a, outcome=o), n)
            for kind, docs in zip(MULTUS_FILES, (report.delegates, report.scratch))
            for (a, o), n in _every(MULTUS_ACTION_OUTCOMES, _pairs(docs))
        ],
    )
    lines += _series(
        "cni_reaper_del_failures",
        "Plugin failures during DEL replay in the last run, by plugin type.",
        [(_label(plugin=p), n) for p, n in sorted(report.del_failures.items())],
    )
    lines += _series(
        "cni_reaper_del_failures_all_plugins",
        "Plugin failures during DEL replay in the last run, every plugin type together.",
        [("", sum(report.del_failures.values()))],
    )
    pools = [p for p in report.pools if p.range_set.number >= 0]
    for name, help_text, value in (
        ("capacity", "Addresses host-local can hand out in the range set.", "capacity"),
        ("reserved_before", "Addresses reserved before the last run.", "reserved_before"),
        ("released", "Addresses the last run released.", "released"),
        ("free", "Addresses free after the last run.", "free"),
    ):
        lines += _series(
            f"cni_reaper_pool_{name}",
            help_text,
            [
                (_label(network=p.network, range_set=str(p.range_set.number)), p.to_json()[value])
                for p in pools
            ],
        )
    lines += _series(
        "cni_reaper_pool_left",
        "Addresses still reserved after the last run, by what holds them "
        f"({', '.join(POOL_OWNERS)}).",
        [
            (_label(network=p.network, range_set=str(p.range_set.number), owner=owner), n)
            for p in pools
            for owner, n in sorted({**dict.fromkeys(POOL_OWNERS, 0), **p.left}.items())
        ],
    )
    crashed = report.boot.previous_boot_crashed
    lines += _series(
        "cni_reaper_previous_boot_known",
        "1 if the last run could tell how the boot before this one ended, 0 if not.",
        [("", int(crashed is not None))],
    )
    lines += _series(
        "cni_reaper_previous_boot_crashed",
        "1 if the boot before this one crashed; 0 if it shut down cleanly or that is not "
        "known (cni_reaper_previous_boot_known 0).",
        [("", int(bool(crashed)))],
    )
    if report.to_plan is not None:
        lines += _series(
            "cni_reaper_plan_duration_seconds",
            "Seconds the last run took until its whole plan was made, before any DEL or move.",
            [("", report.to_plan)],
        )
    lines += _run_series(int(report.exit_code), report.dry_run, started, finished)
    return "\n".join(lines) + "\n"


def render_failure(exit_code: int, dry_run: bool, started: float, finished: float) -> str:
    """A run that ended in an error: how it ended, and no figure it may not have made whole."""
    return "\n".join(_run_series(exit_code, dry_run, started, finished)) + "\n"


def write(path: str, text: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    # A name no one can have put anything at beforehand (the textfile dir may belong to
    # node_exporter's user), made by this open alone, never through a link or a FIFO; one
    # taken (a guess, early in a boot: nonce.py) makes the next.
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    for attempt in range(_NAME_ATTEMPTS):
        tmp = os.path.join(directory, f".{os.path.basename(path)}.{nonce.tag(8)}.tmp")
        try:
            fd = os.open(tmp, flags, FILE_MODE)
            break
        except FileExistsError:
            if attempt + 1 == _NAME_ATTEMPTS:
                raise
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            # The open's mode went through the umask; this one does not.
            os.fchmod(f.fileno(), FILE_MODE)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
