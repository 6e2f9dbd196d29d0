"""What a read-only file system means for a run under the reaper's unit, said wherever a change
fails with EROFS: a move, a lock of host-local's store, a hidden name settled.

Under cni-reaper.service's ProtectSystem=strict every other path is read-only: a dir a config
names outside these (a Multus cniDir, a host-local dataDir) fails its changes with EROFS alone.
"""

from __future__ import annotations

import errno

READ_ONLY_HINT = (
    "under cni-reaper.service only /var/lib/cni, /run and the state dir are writable "
    "(ProtectSystem=strict): name a dir elsewhere in ReadWritePaths= in a drop-in; "
    "otherwise its file system is mounted read-only"
)


def read_only_noted(problem: str, error: OSError) -> str:
    """problem, and where the file system is read-only, the unit's sandbox, which makes it so
    for every dir it does not name."""
    return f"{problem}; {READ_ONLY_HINT}" if error.errno == errno.EROFS else problem
