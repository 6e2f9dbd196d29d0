"""Named crash points between the steps of a repair, for the crash-safety tests, and points
where a test has something happen that a run cannot order (a commit landing during a read).

Inert unless $CNI_REAPER_FAILPOINT names one: "NAME" kills the process with SIGKILL the first
time NAME is reached, "NAME#N" the N-th time. With $CNI_REAPER_FAILPOINT_LOG set, every point
reached is appended to that file, so a test learns which steps a run takes. Every point is
declared at import by the module that owns the step, so registered() lists the steps of a
repair and a new one is covered by the crash tests without touching them. A test in the same
process may also have something happen at a point (a file rewritten between two steps, say):
interfere(); a point that is no step of a repair (the end of a read) is declared for that
alone (step=False), and is no crash test's.
"""

from __future__ import annotations

import os
from collections.abc import Callable

ENV = "CNI_REAPER_FAILPOINT"
LOG_ENV = "CNI_REAPER_FAILPOINT_LOG"

_registered: list[str] = []  # the steps of a repair
_declared: set[str] = set()  # every point, steps or not
_interference: dict[str, Callable[[], None]] = {}
_target: tuple[str, int] | None = None
_log: str | None = None
_hits = 0


def declare(name: str, *, step: bool = True) -> str:
    if name in _declared:
        raise ValueError(f"failpoint {name!r} declared twice")
    _declared.add(name)
    if step:
        _registered.append(name)
    return name


def registered() -> tuple[str, ...]:
    return tuple(_registered)


def arm(spec: str | None, log: str | None = None) -> None:
    """Set from the environment at import; tests in the same process may call it too."""
    global _target, _log, _hits  # noqa: PLW0603 (one switch for the whole process)
    _log, _hits, _target = log, 0, None
    if spec:
        name, _, nth = spec.partition("#")
        _target = (name, int(nth) if nth else 1)


def interfere(name: str, action: Callable[[], None] | None) -> None:
    """Run action (in the thread that reaches it) every time name is reached; None stops it."""
    if name not in _declared:
        raise ValueError(f"no failpoint {name!r}")
    if action is None:
        _interference.pop(name, None)
    else:
        _interference[name] = action


def hit(name: str) -> None:
    global _hits  # noqa: PLW0603
    if _interference:
        action = _interference.get(name)
        if action is not None:
            action()
    if _log is not None:
        with open(_log, "a", encoding="utf-8") as log:
            log.write(name + "\n")
    if _target is not None and _target[0] == name:
        _hits += 1
        if _hits == _target[1]:
            import signal  # noqa: PLC0415 (only a test ever gets here)

            os.kill(os.getpid(), signal.SIGKILL)


arm(os.environ.get(ENV), os.environ.get(LOG_ENV))
