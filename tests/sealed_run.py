"""The reaper as its own process on a clock the caller chooses, in a mount namespace of its own
whose /var/lib/cni, /etc/cni, /run/netns and /run/cni are empty tmpfs: a run killed half way
(the crash-safety tests) leaves nothing on the machine, not even the mount points a run with a
--root makes for its plugins (cni_reaper/repair/confine.py).

Usage: unshare --mount --propagation private python -m tests.sealed_run CLOCK [FILE...] -- ARGV...

Each FILE is made a regular file of this namespace (under a tmpfs over its parent): a file of
the machine's where the run may want a mount point.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cni_reaper import cli
from cni_reaper.node_root import PLUGIN_STATE_DIRS
from tests.private_node import private_tmpfs

if __name__ == "__main__":
    split = sys.argv.index("--")
    for target in PLUGIN_STATE_DIRS:
        private_tmpfs(Path(target))
    for in_the_way in map(Path, sys.argv[2:split]):
        private_tmpfs(in_the_way.parent)  # a tmpfs of its own there, over whatever was
        for state_dir in map(Path, PLUGIN_STATE_DIRS):
            if in_the_way.parent in state_dir.parents:
                state_dir.mkdir(parents=True, exist_ok=True)  # in that tmpfs, as empty as before
        in_the_way.write_bytes(b"the machine's own\n")
    now = float(sys.argv[1])
    sys.exit(cli.main(sys.argv[split + 1 :], clock=lambda: now))
