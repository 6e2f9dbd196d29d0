"""Prometheus text format for node_exporter's textfile collector.

The file is written to a temp file in the same directory and renamed over the target, so the
collector never reads half a file. Gauges only, no timestamps (the textfile collector rejects
them); every content verdict is written, zero or not, so alerts need no absent() dance.
"""

from __future__ import annotations

import contextlib
import os

from cni_reaper.content import Content
from cni_reaper.escape import printable
from cni_reaper.report import Report


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _series(name: str, help_text: str, samples: list[tuple[str, float]]) -> list[str]:
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


def render(report: Report, started: float, finished: float) -> str:
    lines: list[str] = []
    lines += _series(
        "cni_reaper_entries",
        "Results cache entries found by the last run, by content verdict.",
        [(_label(content=c.value), report.contents.get(c.value, 0)) for c in Content],
    )
    lines += _series(
        "cni_reaper_actions",
        "Entries of the last run by planned action and outcome.",
        [(_label(action=a, outcome=o), n) for (a, o), n in sorted(report.actions.items())],
    )
    lines += _series(
        "cni_reaper_del_failures",
        "Plugin failures during DEL replay in the last run, by plugin type.",
        [(_label(plugin=p), n) for p, n in sorted(report.del_failures.items())],
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
        "(runtime, current-boot, alive, left, failed, damaged, unknown).",
        [
            (_label(network=p.network, range_set=str(p.range_set.number), owner=owner), n)
            for p in pools
            for owner, n in sorted(p.left.items())
        ],
    )
    crashed = report.boot.previous_boot_crashed
    if crashed is not None:
        lines += _series(
            "cni_reaper_previous_boot_crashed",
            "1 if the boot before this one crashed, 0 if it shut down cleanly.",
            [("", 1 if crashed else 0)],
        )
    lines += _series(
        "cni_reaper_dry_run", "1 if the last run was a dry run.", [("", int(report.dry_run))]
    )
    lines += _series(
        "cni_reaper_exit_code", "Exit code of the last run.", [("", int(report.exit_code))]
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
    return "\n".join(lines) + "\n"


def write(path: str, text: str) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    # A name no one can have put anything at beforehand (the textfile dir may belong to
    # node_exporter's user), made by this open alone, never through a link or a FIFO.
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{os.urandom(8).hex()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o644)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
