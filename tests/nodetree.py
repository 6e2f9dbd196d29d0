"""A node's CNI state and boot world under a temporary root, as real components leave it."""

from __future__ import annotations

import base64
import json
import os
import shutil
import sqlite3
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cni_reaper import boot, pre_runtime
from cni_reaper.evidence import wtmp
from cni_reaper.paths import NodePaths

PLUGIN_DIR = "/usr/lib/cni"
# wtmpdb's table (lib/sqlite.c). wtmpdb creates it STRICT, which needs SQLite >= 3.37 even to
# open the file; Python 3.9's sqlite3 may link an older one, so there the same columns are laid
# out without STRICT.
WTMPDB_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS wtmp(ID INTEGER PRIMARY KEY, Type INTEGER, User TEXT NOT NULL, "
    "Login INTEGER, Logout INTEGER, TTY TEXT, RemoteHost TEXT, Service TEXT)"
    + (" STRICT" if sqlite3.sqlite_version_info >= (3, 37) else "")
)
# Debian 13's layout: the database is /var/log/wtmp.db, and upstream's path a symlink to it.
WTMPDB_FILE = "var/log/wtmp.db"
WTMPDB_LINK = "var/lib/wtmpdb/wtmp.db"
CONTAINER_IDS = [f"{n:02x}" * 32 for n in range(0x10, 0x30)]


def have_plugins() -> bool:
    return os.path.isfile(os.path.join(PLUGIN_DIR, "host-local"))


def cache_entry_bytes(
    netconf: bytes,
    network: str,
    container_id: str,
    ifname: str,
    result: dict[str, Any] | None = None,
    netns: str = "",
) -> bytes:
    """A results file exactly as libcni v1.1 cacheAdd writes it: one line, no newline."""
    doc: dict[str, Any] = {
        "kind": "cniCacheV1",
        "containerId": container_id,
        "config": base64.b64encode(netconf).decode(),
        "ifName": ifname,
        "networkName": network,
    }
    if netns:
        doc["netns"] = netns
    doc["cniArgs"] = [
        ["IgnoreUnknown", "1"],
        ["K8S_POD_NAMESPACE", "default"],
        ["K8S_POD_INFRA_CONTAINER_ID", container_id],
    ]
    doc["result"] = result or {"cniVersion": "1.0.0", "dns": {}, "ips": []}
    return json.dumps(doc, separators=(",", ":")).encode()


def bridge_conflist(name: str, subnet: str) -> dict[str, Any]:
    """bridge with host-local, then portmap: the chain most node images ship."""
    return {
        "cniVersion": "1.0.0",
        "name": name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": subnet}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
        ],
    }


def host_local_conflist(name: str, subnet: str) -> bytes:
    """host-local run directly as the only plugin: a real plugin that needs no netns. Its store
    is the default, /var/lib/cni/networks of the node (the root's, as plugins run confined)."""
    ipam = {"type": "host-local", "ranges": [[{"subnet": subnet}]]}
    return json.dumps(
        {"cniVersion": "1.0.0", "name": name, "plugins": [{"type": "host-local", "ipam": ipam}]}
    ).encode()


@dataclass
class NodeTree:
    """A root with var/lib/cni, etc/cni/net.d, var/log/wtmp and proc under it."""

    root: Path
    records: list[wtmp.WtmpRecord] = field(default_factory=list)

    @property
    def results(self) -> Path:
        return self.root / "var/lib/cni/results"

    @property
    def conf_dir(self) -> Path:
        return self.root / "etc/cni/net.d"

    @property
    def quarantine(self) -> Path:
        return self.root / "var/lib/cni-reaper/quarantine"

    def write_conf(self, file_name: str, data: bytes) -> None:
        self.conf_dir.mkdir(parents=True, exist_ok=True)
        (self.conf_dir / file_name).write_bytes(data)

    def fake_plugin_network(self, name: str, kind: str, script: str) -> Path:
        """A plugin that is a shell script, for a failure mode no real plugin shows on cue, in
        ROOT/opt/cni/bin, and a network of it alone; returns the plugin dir."""
        bin_dir = self.root / "opt/cni/bin"
        bin_dir.mkdir(parents=True, exist_ok=True)
        plugin = bin_dir / kind
        plugin.write_text("#!/bin/sh\n" + script)
        plugin.chmod(0o755)
        conf = {"cniVersion": "1.0.0", "name": name, "plugins": [{"type": kind}]}
        self.write_conf(f"60-{name}.conflist", json.dumps(conf).encode())
        return bin_dir

    def runtime_starts(self) -> None:
        """What containerd leaves in /run as it starts, before it can set up a pod."""
        (self.root / "run/containerd").mkdir(parents=True, exist_ok=True)

    def record_before_runtime(self, now: float, *dirs: Path) -> None:
        """What this boot's first run records of the CNI state before any runtime starts
        (pre_runtime.py), without the repairs that run would make: the results dir and dirs."""
        paths = NodePaths.build(root=str(self.root))
        boot_id = boot.read_boot_id(paths.boot_id)
        first = boot.FirstReading(None, None)
        proof = pre_runtime.Proof.taken_now(boot_id, now, first, paths.run_dir)
        for directory in (self.results, *dirs):
            pre_runtime.record_dir(proof, str(directory))
        pre_runtime.save(proof)

    def write_result(self, name: str, data: bytes) -> Path:
        self.results.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.results / name
        path.write_bytes(data)
        path.chmod(0o600)
        return path

    def boot(self, at: float) -> None:
        self.records.append(wtmp.boot_record(at))

    def shutdown(self, at: float) -> None:
        self.records.append(wtmp.shutdown_record(at))

    def wtmpdb_boot(self, login: float, kernel: str = "6.12.0-test") -> None:
        """The row `wtmpdb boot` (wtmpdb-update-boot.service) adds: Type 1, User "reboot",
        TTY "~", Login the boot's start in the clock of the moment it runs (now minus uptime),
        in microseconds, Logout NULL."""
        self._wtmpdb(
            "INSERT INTO wtmp (Type, User, Login, Logout, TTY, RemoteHost) "
            "VALUES (1, 'reboot', ?, NULL, '~', ?)",
            (int(login * 1e6), kernel),
        )

    def wtmpdb_shutdown(self, at: float) -> None:
        """What `wtmpdb shutdown` does at a clean shutdown: Logout on the newest open boot
        row, whichever boot wrote it."""
        self._wtmpdb(
            "UPDATE wtmp SET Logout = ? WHERE ID = "
            "(SELECT MAX(ID) FROM wtmp WHERE TTY = '~' AND Logout IS NULL)",
            (int(at * 1e6),),
        )

    def _wtmpdb(self, statement: str, parameters: tuple[object, ...]) -> None:
        path = self.root / WTMPDB_FILE
        link = self.root / WTMPDB_LINK
        path.parent.mkdir(parents=True, exist_ok=True)
        if not link.is_symlink():
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(path, link.parent))
        db = sqlite3.connect(path)
        try:
            with db:
                db.execute(WTMPDB_SCHEMA)
                db.execute(statement, parameters)
        finally:
            db.close()

    def login(self, at: float, user: str = "admin") -> None:
        self.records.append(wtmp.WtmpRecord(7, 4242, "pts/0", "ts/0", user, "10.0.0.9", at))

    def write_boot_world(
        self, btime: float, boot_id: str = "11111111-2222-3333-4444-555555555555"
    ) -> None:
        """wtmp from the records so far, and the proc files of the running boot. A new boot id
        begins a boot: /run, a tmpfs on a node, starts empty."""
        id_file = self.root / "proc/sys/kernel/random/boot_id"
        if id_file.exists() and id_file.read_text().strip() != boot_id:
            shutil.rmtree(self.root / "run", ignore_errors=True)
        log = self.root / "var/log"
        log.mkdir(parents=True, exist_ok=True)
        (log / "wtmp").write_bytes(wtmp.encode_all(self.records))
        proc = self.root / "proc"
        (proc / "sys/kernel/random").mkdir(parents=True, exist_ok=True)
        (proc / "stat").write_text(f"cpu  1 0 1 1 0 0 0 0 0 0\nbtime {int(btime)}\nprocesses 1\n")
        (proc / "sys/kernel/random/boot_id").write_text(boot_id + "\n")


def snapshot(root: Path) -> dict[str, tuple[str, bytes]]:
    """Every path under root with its type and bytes (link target for symlinks)."""
    state: dict[str, tuple[str, bytes]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = os.path.join(dirpath, name)
            rel = os.path.relpath(path, root)
            if os.path.islink(path):
                state[rel] = ("link", os.readlink(path).encode())
            elif os.path.isdir(path):
                state[rel] = ("dir", oct(os.stat(path).st_mode).encode())
            elif os.path.isfile(path):
                st = os.stat(path)
                with open(path, "rb") as f:
                    state[rel] = (f"file {oct(st.st_mode)} {st.st_mtime_ns}", f.read())
            else:
                state[rel] = ("special", oct(os.lstat(path).st_mode).encode())
    return state
