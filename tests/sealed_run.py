"""The reaper as its own process on a clock the caller chooses, in a mount namespace of its own
whose /var/lib/cni, /etc/cni, /run/netns and /run/cni are empty tmpfs: a run killed half way
(the crash-safety tests) leaves nothing on the machine, not even the mount points a run with a
--root makes for its plugins (cni_reaper/repair/confine.py).

Usage: unshare --mount --propagation private python -m tests.sealed_run CLOCK -- ARGV...
"""

from __future__ import annotations

import sys
from pathlib import Path

from cni_reaper import cli
from cni_reaper.node_root import PLUGIN_STATE_DIRS
from tests.private_node import private_tmpfs

if __name__ == "__main__":
    for target in PLUGIN_STATE_DIRS:
        private_tmpfs(Path(target))
    split = sys.argv.index("--")
    now = float(sys.argv[1])
    sys.exit(cli.main(sys.argv[split + 1 :], clock=lambda: now))
