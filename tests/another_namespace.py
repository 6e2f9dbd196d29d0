"""A node whose file system this process reaches only through /proc/<pid>/root.

Usage: unshare --mount --net --pid --fork --propagation private \
           python -m tests.another_namespace THIS NODE -- [ARGV...]

A process is started in a mount namespace of its own whose root is NODE (pivot_root), as a
rescue container's or the node's own init is seen from a pod; then this one is made THIS's,
as tests/node_itself.py does, and runs cni-reaper with ARGV, each "@ROOT" in it replaced by
/proc/<that pid>/root. From here that link reads as "/": its target is no path of this
namespace. Exits with the reaper's status.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests import node_itself

# Statically linked (busybox-static): it runs with nothing of the node's under it.
BUSYBOX = "/usr/bin/busybox"

if __name__ == "__main__":
    split = sys.argv.index("--")
    this, node = Path(sys.argv[1]), Path(sys.argv[2])
    pivot = (
        f"mount --bind {node} {node} && cd {node} && mkdir -p .old && pivot_root . .old && "
        f"exec /.old{BUSYBOX} sleep 600"
    )
    inside = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "sh", "-c", pivot])
    mark = f"/proc/{inside.pid}/root/.old"
    for _ in range(200):
        if os.path.isdir(mark):
            break
        time.sleep(0.05)
    else:
        sys.exit("the node's process did not take its root")
    node_itself.enter(this)
    from cni_reaper import cli

    argv = [a.replace("@ROOT", f"/proc/{inside.pid}/root") for a in sys.argv[split + 1 :]]
    try:
        status = cli.main(argv)
    finally:
        inside.kill()
    sys.exit(status)
