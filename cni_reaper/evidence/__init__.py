"""Boot evidence: the witnesses of which boot wrote what, and how each boot ended."""

from __future__ import annotations

import math

# Some 4,000 years either side of 1970: what gmtime(), and so a report, can show.
_TIME_BOUND = float(2**37)


def time_read(value: object) -> float | None:
    """A time, in seconds, as one of the reaper's own files held it (a marker, the pre-runtime
    record); None when it is no such time: not a number, not finite (NaN, whose JSON no
    reader takes, or an overflow), or past the years a report can show."""
    if not isinstance(value, (int, float, bytes)):
        return None
    try:
        seconds = float(value)
    except (OverflowError, ValueError):
        return None
    return seconds if math.isfinite(seconds) and abs(seconds) < _TIME_BOUND else None
