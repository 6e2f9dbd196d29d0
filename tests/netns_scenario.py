"""A crashed node, inside a private network and mount namespace; run by test_netns.py.

Usage: unshare --net --mount --propagation private python -m tests.netns_scenario WORKDIR

Sets up real attachments with Debian's CNI plugins the way libcni does, crashes the node as a
power cut does (cache files emptied, NUL-filled or cut; every netns gone), gives cni-reaper a
boot world that says so, runs it (dry run, then for real) and writes what it saw to
WORKDIR/result.json for the test to judge.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from cni_reaper.evidence import wtmp
from tests.libcni import add_network_list, reserved_ips
from tests.nodetree import CONTAINER_IDS, PLUGIN_DIR, NodeTree, bridge_conflist
from tests.private_node import bind, damage, private_tmpfs, reaper_command, tree_digest

CACHE_DIR = Path("/var/lib/cni")
NETNS_DIR = Path("/run/netns")

BRIDGE_NET = bridge_conflist("bridge-net", "10.88.0.0/24")
PTP_NET = {
    "cniVersion": "0.4.0",
    "name": "ptp-net",
    "plugins": [
        {
            "type": "ptp",
            "ipMasq": True,
            "ipam": {"type": "host-local", "subnet": "10.89.0.0/24"},
        }
    ],
}

# Per network, what the crash does to each pod's cache file, in pod order.
DAMAGE = {
    "bridge-net": ["empty", "zeroed", "truncated", "valid"],
    "ptp-net": ["truncated", "valid", "empty", "zeroed"],
}


def host_links() -> list[str]:
    out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, check=True).stdout
    return sorted(link["ifname"] for link in json.loads(out))


def main(workdir: Path) -> dict[str, Any]:
    private_tmpfs(CACHE_DIR)
    private_tmpfs(NETNS_DIR)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    # The node as cni-reaper sees it with --root: this namespace's CNI state bound in, the boot
    # world its own. Its plugins run confined to that root, and so see the same state.
    node = NodeTree(workdir / "root")
    bind(CACHE_DIR, node.root / "var/lib/cni")
    node.boot(time.time() - 600)  # the boot that is about to crash
    conflists = {}
    for number, net in enumerate((BRIDGE_NET, PTP_NET)):
        data = json.dumps(net, indent=2).encode()
        node.write_conf(f"{10 + number}-{net['name']}.conflist", data)
        conflists[str(net["name"])] = data

    pods: list[dict[str, Any]] = []
    ids = iter(CONTAINER_IDS)
    for network, plan in DAMAGE.items():
        for index, how in enumerate(plan):
            cid = next(ids)
            netns = NETNS_DIR / f"pod-{cid[:8]}"
            subprocess.run(["ip", "netns", "add", netns.name], check=True)
            caps = {
                "portMappings": [{"hostPort": 8080 + index, "containerPort": 80, "protocol": "tcp"}]
            }
            result = add_network_list(
                conflists[network], cid, "eth0", str(netns), Path("/"), capability_args=caps
            )
            pods.append(
                {
                    "network": network,
                    "container_id": cid,
                    "damage": how,
                    "file": f"{network}-{cid}-eth0",
                    "ips": [ip["address"].split("/")[0] for ip in result["ips"]],
                    "host_veth": next(
                        i["name"]
                        for i in result["interfaces"]
                        if "sandbox" not in i and i["name"].startswith("veth")
                    ),
                }
            )
    before_crash = {
        "ips": {n: reserved_ips(CACHE_DIR / "networks", n) for n in DAMAGE},
        "links": host_links(),
    }

    # The crash: unsynced cache writes lost, every network namespace gone with the old kernel.
    results = CACHE_DIR / "results"
    for pod in pods:
        damage(results / pod["file"], pod["damage"])
    for pod in pods:
        subprocess.run(["ip", "netns", "delete", f"pod-{pod['container_id'][:8]}"], check=True)
    valid_bytes = {
        p["file"]: (results / p["file"]).read_bytes().hex() for p in pods if p["damage"] == "valid"
    }

    # The reboot: a new boot begins clearly after the last write of the old one.
    time.sleep(3.2)
    now = time.time()
    node.records.append(wtmp.boot_record(now))
    node.write_boot_world(btime=int(now) - 1)

    argv = [
        *reaper_command(),
        "--json",
        "--root",
        str(node.root),
        "--bin-dir",
        PLUGIN_DIR,
    ]
    watched = (CACHE_DIR, node.root)
    digest_before = tree_digest(*watched)
    dry = subprocess.run([*argv, "--dry-run"], capture_output=True, text=True)
    dry_unchanged = tree_digest(*watched) == digest_before
    real = subprocess.run(argv, capture_output=True, text=True)

    quarantine = node.root / "var/lib/cni-reaper/quarantine"
    return {
        "pods": pods,
        "before_crash": before_crash,
        "valid_bytes_before": valid_bytes,
        "dry_run": {
            "exit": dry.returncode,
            "stderr": dry.stderr,
            "report": json.loads(dry.stdout) if dry.stdout else None,
            "tree_unchanged": dry_unchanged,
        },
        "run": {
            "exit": real.returncode,
            "stderr": real.stderr,
            "report": json.loads(real.stdout) if real.stdout else None,
        },
        "after": {
            "ips": {n: reserved_ips(CACHE_DIR / "networks", n) for n in DAMAGE},
            "links": host_links(),
            "results": {p.name: p.read_bytes().hex() for p in sorted(results.iterdir())},
            "quarantine": sorted(
                str(p.relative_to(quarantine)) for p in quarantine.rglob("*") if p.is_file()
            ),
            "sidecars": {p.name: json.loads(p.read_text()) for p in quarantine.rglob("*.json")},
        },
    }


if __name__ == "__main__":
    target = Path(sys.argv[1])
    (target / "result.json").write_text(json.dumps(main(target), indent=2))
