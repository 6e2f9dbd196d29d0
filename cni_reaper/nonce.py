"""A tag that makes a temp or hidden file name unique, never waiting on the kernel's entropy.

os.urandom() is getrandom() with no flags: it blocks until the kernel's pool is initialised,
and the reaper runs early in a boot, before a runtime starts, where on a board or a VM with no
hardware RNG that can take seconds. A name needs no secret, only one no one else holds, so the
pool is asked not to wait; where it is not ready, the monotonic clock's nanoseconds, the
process ID and a count make the tag, and a caller whose name is taken tries the next one.
"""

from __future__ import annotations

import itertools
import os
import time

_COUNT = itertools.count()


def tag(nbytes: int) -> str:
    """nbytes, as 2 * nbytes lower-case hex digits: a tag a name taken before is unlikely to
    hold, never a promise that it does not (the callers look)."""
    try:
        return os.getrandom(nbytes, os.GRND_NONBLOCK).hex()
    except OSError:  # BlockingIOError where the pool is not ready; ENOSYS before Linux 3.17
        return fallback(nbytes)


def fallback(nbytes: int) -> str:
    """The tag where the pool is not ready: from the clock, the process (in tags of 6 bytes
    and more) and a count."""
    mixed = time.monotonic_ns() ^ (os.getpid() << 40) ^ (next(_COUNT) << 20)
    return (mixed & ((1 << (8 * nbytes)) - 1)).to_bytes(nbytes, "big").hex()
