"""A node's runtime layouts for the attack tests of the reaper's reading of runtime configs and
units: files written under a root, what config.load makes of them, the records a runtime keeps
where, and what a dry run then plans."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cni_reaper import cli
from cni_reaper.runtime import config
from cni_reaper.runtime.config import Runtime, RuntimeConfigs
from cni_reaper.runtime.inventory import META_DB
from tests.bolt_writer import containerd_sandbox, write_db
from tests.nodetree import CONTAINER_IDS, NodeTree, cache_entry_bytes, host_local_conflist

SYSTEM = "/etc/systemd/system"
LIB = "/lib/systemd/system"
UNIT = f"{SYSTEM}/containerd.service"
VENDOR_UNIT = f"{LIB}/containerd.service"
DROP_IN = f"{SYSTEM}/containerd.service.d/10-root.conf"
K3S_UNIT = f"{SYSTEM}/k3s.service"
CONTAINERD_DEFAULT = "/var/lib/containerd"
K3S_DEFAULT = "/var/lib/rancher/k3s/agent/containerd"
STOCK = "[Service]\nExecStart=/usr/bin/containerd\n"
K3S_STOCK = "[Service]\nExecStart=/usr/local/bin/k3s \\\n    server \\\n\n"
KNOWN, STALE = CONTAINER_IDS[0], CONTAINER_IDS[5]
CRIO_UNIT = "/usr/lib/systemd/system/crio.service"
CRIO_SYSCONFIG = "/etc/sysconfig/crio"
CRIO_DROP_IN = "/etc/systemd/system/crio.service.d/10-env.conf"
CRIO_DEFAULT_ROOT = "/var/lib/containers/storage"
# CRI-O's contrib/systemd/crio.service as Fedora's RPM and pkgs.k8s.io's packages install it,
# and contrib/sysconfig/crio, every option commented out.
CRIO_COMMAND = (
    "ExecStart={crio} \\\n          $CRIO_CONFIG_OPTIONS \\\n          $CRIO_RUNTIME_OPTIONS \\\n"
    "          $CRIO_STORAGE_OPTIONS \\\n          $CRIO_NETWORK_OPTIONS \\\n"
    "          $CRIO_METRICS_OPTIONS\n"
)
CRIO_PACKAGED_UNIT = (
    "[Unit]\nDescription=Container Runtime Interface for OCI (CRI-O)\n"
    "Wants=network-online.target\nBefore=kubelet.service\nAfter=network-online.target\n\n"
    "[Service]\nType=notify\nEnvironmentFile=-/etc/sysconfig/crio\n"
    "Environment=GOTRACEBACK=crash\n" + CRIO_COMMAND.format(crio="/usr/bin/crio") + "ExecReload="
    "/bin/kill -s HUP $MAINPID\nTasksMax=infinity\nLimitNPROC=1048576\nLimitCORE=infinity\n"
    "OOMScoreAdjust=-999\nTimeoutStartSec=0\nRestart=on-failure\nRestartSec=10\n"
    "WatchdogSec=60s\n\n[Install]\nWantedBy=multi-user.target\nAlias=cri-o.service\n"
)
CRIO_STOCK_SYSCONFIG = (
    '# /etc/sysconfig/crio\n\n# use "--enable-metrics" and "--metrics-port value"\n'
    '#CRIO_METRICS_OPTIONS="--enable-metrics"\n\n#CRIO_NETWORK_OPTIONS=\n#CRIO_STORAGE_OPTIONS=\n'
)


def write(root: Path, node_path: str, data: str | bytes) -> Path:
    path = root / node_path.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def tree(root: Path, files: Mapping[str, str | bytes]) -> RuntimeConfigs:
    for node_path, data in files.items():
        write(root, node_path, data)
    return config.load(str(root))


def roots(configs: RuntimeConfigs, runtime: Runtime) -> list[str]:
    """The persistent roots whose records are read (inventory.py reads those in effect)."""
    return [p.node_path for p in configs.persistent_roots if p.runtime is runtime and p.in_effect]


def in_doubt(configs: RuntimeConfigs, runtime: Runtime = Runtime.K3S) -> bool:
    return any(line.startswith(f"{runtime.value}:") for line in configs.records_in_doubt)


def assert_reads_or_doubts(configs: RuntimeConfigs, runtime: Runtime, real: str) -> None:
    """Safe: the runtime's real root is among those read, or its records are in doubt."""
    if in_doubt(configs, runtime):
        return
    assert real in roots(configs, runtime), (roots(configs, runtime), configs.warnings)


def dry_run(node: NodeTree, clock: float) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        cli.run(["--root", str(node.root), "--json", "--dry-run"], lambda: clock, environ={})
    report: dict[str, Any] = json.loads(out.getvalue())
    return report


def knows(node: NodeTree, containerd_root: str, sandbox_id: str) -> None:
    """A containerd (or k3s's, RKE2's) meta.db at containerd_root knowing the sandbox."""
    db = node.root / containerd_root.lstrip("/") / META_DB
    db.parent.mkdir(parents=True, exist_ok=True)
    write_db(db, [containerd_sandbox("k8s.io", sandbox_id)], no_freelist_sync=True)


def crio_node(root: Path, files: Mapping[str, str | bytes], *dirs: str) -> RuntimeConfigs:
    """A CRI-O node that has run (its graph root and state dir made), with its config and the
    packaged unit, files over them, and dirs; what config.load makes of it."""
    for node_dir in (CRIO_DEFAULT_ROOT, "/var/lib/crio", *dirs):
        (root / node_dir.lstrip("/")).mkdir(parents=True, exist_ok=True)
    return tree(root, {"/etc/crio/crio.conf": "[crio]\n", CRIO_UNIT: CRIO_PACKAGED_UNIT, **files})


def crio_knows(root: Path, graph_root: str, sandbox_id: str) -> Path:
    """CRI-O's record of the sandbox in containers/storage under graph_root: its
    containers.json, which it returns, and the userdata CRI-O reads back."""
    pod = json.dumps({"pod": True, "pod-name": "web", "pod-id": sandbox_id})
    storage = f"{graph_root}/overlay-containers"
    write(root, f"{storage}/{sandbox_id}/userdata/config.json", "{}")
    containers = json.dumps([{"id": sandbox_id, "metadata": pod}])
    return write(root, f"{storage}/containers.json", containers)


def earlier_boots_entry(node: NodeTree, t0: float, sandbox_id: str) -> str:
    """A whole results entry of the sandbox (host-local's network "hl"), written in the boot
    before the one that began 55 s before t0: the reaper calls it forgotten unless a runtime's
    records know the sandbox. Returns its name."""
    conflist = host_local_conflist("hl", "10.22.0.0/24")
    node.write_conf("10-hl.conflist", conflist)
    node.boot(t0 - 7200)
    node.boot(t0 - 55)
    node.write_boot_world(btime=t0 - 60)
    name = f"hl-{sandbox_id}-eth0"
    node.write_result(name, cache_entry_bytes(conflist, "hl", sandbox_id, "eth0"))
    return name
