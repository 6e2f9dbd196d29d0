"""Network namespaces pinned for real, read back from the kernel's own mount table; run by
test_liveness.py.

Usage: unshare --net --mount --propagation private python -m tests.liveness_scenario WORKDIR

/run/netns is a tmpfs private to this mount namespace. `ip netns add` pins two namespaces there
(one with a space in its name, which mountinfo escapes), and a third is pinned by hand in a
node tree under WORKDIR, as the node's /run/netns. What cni-reaper reads from
/proc/self/mountinfo goes to WORKDIR/result.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from cni_reaper.runtime import config
from cni_reaper.runtime.liveness import netns_pins, started_this_boot
from tests.private_node import private_tmpfs

NETNS_DIR = Path("/run/netns")
HOST_PINS = ("cni-1234", "pinned with space")


def main(workdir: Path) -> dict[str, Any]:
    private_tmpfs(NETNS_DIR)
    for name in HOST_PINS:
        subprocess.run(["ip", "netns", "add", name], check=True)
    node = workdir / "node"
    pin = node / "run/netns/cni-node"
    pin.parent.mkdir(parents=True)
    pin.touch()
    subprocess.run(["mount", "--bind", "/proc/self/ns/net", str(pin)], check=True)
    (node / "run/netns/not-a-pin").touch()
    result = {
        "host_pins": sorted(netns_pins("/")),
        "node_pins": sorted(netns_pins(str(node))),
        "node_evidence": started_this_boot(str(node), config.load(str(node))),
        "mountinfo": Path("/proc/self/mountinfo").read_text(),
    }
    for name in HOST_PINS:
        subprocess.run(["ip", "netns", "delete", name], check=True)
    subprocess.run(["umount", str(pin)], check=True)
    return result


if __name__ == "__main__":
    work = Path(sys.argv[1])
    (work / "result.json").write_text(json.dumps(main(work), indent=2))
