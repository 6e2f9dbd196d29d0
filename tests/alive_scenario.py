"""Attachments that may be alive, on a node whose runtime is up again: run by test_alive.py.

Usage: unshare --mount --propagation private python -m tests.alive_scenario WORKDIR

The node's first run of the boot recorded its state before the runtime started (three damaged
cache files of the boot before). Then the runtime started: it keeps live state for one of the
containers, and another's network namespace, named by a whole cache entry of the same
container, is pinned under the node's /run/netns (a real nsfs mount of this namespace). A run
with --force (the runtime is up) may repair only the third. Prints the report as JSON.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import time
from contextlib import redirect_stdout
from pathlib import Path

from cni_reaper import cli
from tests.libcni import add_network_list
from tests.nodetree import CONTAINER_IDS, PLUGIN_DIR, NodeTree, host_local_conflist

LIVE, PINNED, DEAD = CONTAINER_IDS[:3]
PIN = "cni-5e1f0a77-0000-4000-8000-000000000001"


def main(workdir: Path) -> dict[str, object]:
    node = NodeTree(workdir / "node")
    conflist = host_local_conflist("hl", "10.44.0.0/24")
    node.write_conf("10-hl.conflist", conflist)
    now = time.time()
    node.boot(now - 3600)
    for cid in (LIVE, PINNED, DEAD):
        add_network_list(conflist, cid, "eth0", f"/var/run/netns/{PIN}", node.root)
        node.write_result(f"hl-{cid}-eth0", b"")
    # A second attachment of the pinned container, whole, as libcni 1.2 on caches it.
    add_network_list(conflist, PINNED, "eth1", f"/var/run/netns/{PIN}", node.root, cache_netns=True)
    node.boot(now)
    node.write_boot_world(btime=now - 1)
    node.record_before_runtime(now, node.root / "var/lib/cni/networks/hl")

    node.runtime_starts()
    task = node.root / "run/containerd/io.containerd.runtime.v2.task/k8s.io" / LIVE
    task.mkdir(parents=True)
    pin = node.root / "run/netns" / PIN
    pin.parent.mkdir(parents=True)
    pin.touch()
    subprocess.run(["mount", "--bind", "/proc/self/ns/net", str(pin)], check=True)

    out = io.StringIO()
    argv = ["--root", str(node.root), "--bin-dir", PLUGIN_DIR, "--json", "--force"]
    with redirect_stdout(out):
        code = cli.run(argv, clock=lambda: now + 60, environ={})
    report = json.loads(out.getvalue())
    store = node.root / "var/lib/cni/networks/hl"
    return {
        "exit": int(code),
        "report": report,
        "reserved": sorted(p.read_bytes().decode() for p in store.iterdir() if p.name[0].isdigit()),
        "results": sorted(p.name for p in node.results.iterdir()),
    }


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
