"""tests/libcni_client: the real libcni (Debian 12: 1.1.2) with host-local, the one real plugin
that needs neither root nor a netns, its store and libcni's cache both in the test's own dirs.

What the namespace scenarios rely on: the client caches as libcni caches, and its DEL is
libcni's, seed bug included: a damaged results file aborts it before any plugin runs.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from cni_reaper.cache import CachedAttachment, inventory, read_cached
from cni_reaper.content import Content
from tests.nodetree import CONTAINER_IDS, PLUGIN_DIR, have_plugins
from tests.private_node import cannot_run, damage
from tests.real_libcni import (
    SEED_ERROR,
    Built,
    ClientRun,
    LibcniClient,
    build_key,
    seed_error,
)

NETWORK = "hl-net"
CID = CONTAINER_IDS[0]
ARGS = (("IgnoreUnknown", "1"), ("K8S_POD_NAMESPACE", "default"), ("K8S_POD_NAME", "pod-0"))


class Node:
    """A conf dir, libcni's cache dir and host-local's dataDir, all under tmp_path."""

    def __init__(self, tmp: Path, client: LibcniClient) -> None:
        self.client = client
        self.conf_dir = tmp / "net.d"
        self.cache_dir = tmp / "cache"
        self.data_dir = tmp / "ipam"
        self.conf_dir.mkdir()
        self.conflist: dict[str, Any] = {
            "cniVersion": "1.0.0",
            "name": NETWORK,
            "plugins": [
                {
                    "type": "host-local",
                    "ipam": {
                        "type": "host-local",
                        "dataDir": str(self.data_dir),
                        "ranges": [[{"subnet": "10.55.0.0/24"}], [{"subnet": "fd55::/64"}]],
                    },
                }
            ],
        }
        self.conf_bytes = json.dumps(self.conflist, indent=2).encode()
        (self.conf_dir / f"10-{NETWORK}.conflist").write_bytes(self.conf_bytes)

    @property
    def results_file(self) -> Path:
        return self.cache_dir / "results" / f"{NETWORK}-{CID}-eth0"

    def run(self, command: str, **kwargs: Any) -> ClientRun:
        # host-local never opens the netns; CNI_NETNS must only be set for ADD.
        kwargs.setdefault("netns", f"/run/netns/never-made-{CID[:8]}")
        return self.client.run(
            command,
            CID,
            "eth0",
            conf_dir=self.conf_dir,
            network=NETWORK,
            bin_dirs=(PLUGIN_DIR,),
            cache_dir=self.cache_dir,
            cni_args=ARGS,
            **kwargs,
        )

    def reservations(self) -> dict[str, bytes]:
        store = self.data_dir / NETWORK
        return {
            p.name: p.read_bytes()
            for p in sorted(store.iterdir())
            if p.name != "lock" and not p.name.startswith("last_reserved_ip")
        }


@pytest.fixture
def node(tmp_path: Path, libcni_client: LibcniClient) -> Node:
    if not have_plugins():
        cannot_run(f"containernetworking-plugins is not installed in {PLUGIN_DIR}")
    return Node(tmp_path, libcni_client)


def test_the_build_is_keyed_and_kept(libcni_build: Built) -> None:
    assert libcni_build.path.is_file()
    assert libcni_build.path.parent.name == build_key(libcni_build.go_version)
    assert libcni_build.offline in ("unshare --net", "GOPROXY=off")


def test_usage_errors_exit_2(libcni_client: LibcniClient) -> None:
    for argv in ([], ["add", CID], ["frob", CID, "eth0"], ["--args", "novalue", "del", CID, "x"]):
        proc = subprocess.run([str(libcni_client.path), *argv], capture_output=True, text=True)
        assert proc.returncode == 2, argv
        assert proc.stdout == ""


def test_add_caches_as_libcni_1_1_does(node: Node) -> None:
    caps = {"portMappings": [{"hostPort": 80, "containerPort": 8080, "protocol": "tcp"}]}
    add = node.run("add", capability_args=caps)
    assert add.ok, add.error
    assert add.result is not None
    ips = sorted(ip["address"] for ip in add.result["ips"])
    assert ips == ["10.55.0.2/24", "fd55::2/64"]
    assert node.reservations() == {
        "10.55.0.2": CID.encode() + b"\r\neth0",
        "fd55::2": CID.encode() + b"\r\neth0",
    }
    cached = json.loads(node.results_file.read_bytes())
    # Go's encoding/json: struct fields in declaration order, the result map's keys sorted.
    assert list(cached) == [
        "kind",
        "containerId",
        "config",
        "ifName",
        "networkName",
        "cniArgs",
        "capabilityArgs",
        "result",
    ]
    assert cached["kind"] == "cniCacheV1"
    assert base64.b64decode(cached["config"]) == node.conf_bytes
    assert cached["cniArgs"] == [list(kv) for kv in ARGS]
    assert cached["capabilityArgs"] == caps
    assert cached["result"]["ips"] == add.result["ips"]
    assert node.results_file.stat().st_mode & 0o777 == 0o600

    check = node.run("check")
    assert check.ok, check.error
    again = node.run("cached")
    assert again.ok
    assert again.result == add.result
    assert again.output["args"] == [list(kv) for kv in ARGS]


def test_del_tears_down_and_forgets(node: Node) -> None:
    assert node.run("add").ok
    gone = node.run("del", netns="")
    assert gone.ok, gone.error
    assert node.reservations() == {}
    assert not node.results_file.exists()
    # DEL is idempotent, with or without a cache file.
    assert node.run("del", netns="").ok


def _wrapped(config: str, newline: str) -> str:
    """config broken into lines as a MIME encoder breaks it, with a newline in the padding
    and around the whole."""
    lines = newline.join(config[i : i + 76] for i in range(0, len(config), 76))
    return f"{newline}{lines[:-1]}{newline}{lines[-1]}{newline}"


@pytest.mark.parametrize(
    ("newline", "readable"), [("\n", True), ("\r\n", True), ("\r", True), (" ", False)]
)
def test_the_config_is_base64_to_the_reaper_as_it_is_to_libcni(
    node: Node, newline: str, readable: bool
) -> None:
    # Go's base64 decoder skips CR and LF wherever they stand, and nothing else: an entry
    # whose config holds them is whole to libcni, so it is no damage to the reaper, and a
    # DEL the reaper plans from it runs with the config libcni would read.
    assert node.run("add").ok
    doc = json.loads(node.results_file.read_bytes())
    doc["config"] = _wrapped(doc["config"], newline)
    node.results_file.write_bytes(json.dumps(doc).encode())

    libcni = node.run("cached")
    dir_fd = os.open(node.results_file.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        (entry,) = inventory(dir_fd, [NETWORK])
        cached = read_cached(dir_fd, entry)
    finally:
        os.close(dir_fd)
    assert libcni.ok is readable, libcni.error
    assert (entry.content is Content.VALID) is readable, entry.verdict
    if readable:
        assert libcni.output["config"] == node.conflist
        assert isinstance(cached, CachedAttachment)
        assert cached.config == node.conf_bytes
    else:
        assert libcni.error == (
            f'failed to unmarshal cached network "{NETWORK}" config: '
            "illegal base64 data at input byte 0"
        )
        assert entry.verdict.detail == "'config' is not valid base64"


@pytest.mark.parametrize("how", ["empty", "zeroed", "truncated"])
def test_a_damaged_results_file_aborts_del_before_any_plugin(node: Node, how: str) -> None:
    assert node.run("add").ok
    damage(node.results_file, how)
    held = node.reservations()
    failed = node.run("del", netns="")
    assert not failed.ok
    assert failed.exit == 1
    assert failed.error == seed_error(NETWORK, how)
    # Nothing ran: the address stays reserved and the damaged file stays, for every retry.
    assert node.reservations() == held
    assert node.run("del", netns="").error == failed.error
    # CHECK reads the cache the same way.
    assert node.run("check").error == seed_error(NETWORK, how)
    # The file gone, as the reaper leaves it: DEL runs with no cached result and frees it all.
    node.results_file.unlink()
    cleared = node.run("del", netns="")
    assert cleared.ok, cleared.error
    assert node.reservations() == {}


def test_the_seed_error_is_the_one_containerd_reports(node: Node) -> None:
    assert node.run("add").ok
    damage(node.results_file, "empty")
    assert node.run("del").error == SEED_ERROR.format(network=NETWORK)


def test_conflist_from_a_file_or_a_missing_name(node: Node, tmp_path: Path) -> None:
    copy = tmp_path / "copy.conflist"
    copy.write_bytes(node.conf_bytes)
    add = node.client.run(
        "add",
        CID,
        "eth0",
        conflist=copy,
        cache_dir=node.cache_dir,
        netns="/run/netns/never-made",
    )
    assert add.ok, add.error
    missing = node.client.run("del", CID, "eth0", conf_dir=node.conf_dir, network="no-such-net")
    assert not missing.ok
    assert missing.error is not None
    assert 'no net configuration with name "no-such-net"' in missing.error
