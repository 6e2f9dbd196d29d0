"""Bounded time: the run's deadline, and a circuit breaker per plugin binary.

The unit holds the runtime back until the reaper exits (TimeoutStartSec=5min). A plugin that
hangs costs --plugin-timeout per DEL, and DELs of one network run one after another: eleven
hung DELs at the 30 s default would outlast the unit. So no DEL starts after the deadline, a
plugin is never given more time than the deadline leaves, and a plugin binary that has timed
out TRIP_AFTER times is not started again in this run. The DELs not attempted fail with why,
and their files follow the policy (a damaged one quarantined all the same; a whole entry, and
an orphaned reservation, left for the next run to DEL): the run still ends with its
summary, metrics, journal record and exit code.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable

# Timeouts of one plugin binary before its remaining DELs are not attempted: one can be bad
# luck (a lock held by something else), three in a row is a plugin that hangs.
TRIP_AFTER = 3
# A plugin started just before the deadline still gets this long, rather than none at all.
MIN_PLUGIN_TIME = 0.05


class Budget:
    """Shared by the DEL workers; every method is safe to call from any of them."""

    def __init__(self, seconds: float, trip_after: int = TRIP_AFTER) -> None:
        self.seconds = seconds
        self._deadline = time.monotonic() + seconds
        self._trip_after = trip_after
        self._timeouts: dict[str, int] = {}
        self._lock = threading.Lock()
        self.cancel = threading.Event()  # set when the run is interrupted: no DEL starts after

    def refusal(self, executables: Iterable[str]) -> str | None:
        """Why a DEL that would run these executables may not start now, or None."""
        if self.cancel.is_set():
            return "the run was interrupted before it started"
        if time.monotonic() >= self._deadline:
            return f"the run's deadline ({self.seconds:g} s, --deadline) passed before it started"
        with self._lock:
            for path in executables:
                if self._timeouts.get(path, 0) >= self._trip_after:
                    count = self._timeouts[path]
                    return f"{path} timed out {count} times in this run, so not started again"
        return None

    def seconds_left(self) -> float:
        """Until the deadline; 0 once it passed, or the run was interrupted."""
        if self.cancel.is_set():
            return 0.0
        return max(0.0, self._deadline - time.monotonic())

    def plugin_time(self, timeout: float) -> float:
        """How long a plugin started now may run: its timeout, cut at the deadline."""
        left = self._deadline - time.monotonic()
        return max(MIN_PLUGIN_TIME, min(timeout, left))

    def timed_out(self, path: str) -> None:
        with self._lock:
            self._timeouts[path] = self._timeouts.get(path, 0) + 1
