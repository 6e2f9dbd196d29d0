"""What the reaper, running as root, trusts on disk: what only root (or whoever runs it) could
have written. Only the object itself and its own directory are checked, not every ancestor:
a directory up the path that others may write to is the system's business (/tmp is 1777)."""

from __future__ import annotations

import os
import stat


def untrusted(st: os.stat_result) -> str | None:
    """Why a file or dir is not trusted: writable by group or others, or owned by someone
    other than root or the user running the reaper."""
    if st.st_uid not in (0, os.geteuid()):
        return f"is owned by uid {st.st_uid}"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o})"
    return None
