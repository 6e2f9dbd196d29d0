"""tests/libcni.py, the Python stand-in for libcni's AddNetworkList that most tests set up their
attachments with, writes the results file byte for byte as the real libcni 1.1.2 does
(tests/libcni_client, built on Debian's libcni): the same ADD through the same plugins, once by
each, gives the same bytes. host-local and portmap with no port mappings need neither root nor
a netns; their store is the test's own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.libcni import add_to_cache, cached_bytes
from tests.nodetree import CONTAINER_IDS, PLUGIN_DIR, have_plugins
from tests.private_node import cannot_run
from tests.real_libcni import LibcniClient

NETWORK = "imitated"
CID = CONTAINER_IDS[0]
NETNS = f"/run/netns/never-made-{CID[:8]}"  # host-local never opens it; ADD needs one named
# As containerd gives them: a Go map's order. A value Go's encoder escapes (<, >, &).
ARGS = (
    ("K8S_POD_NAMESPACE", "default"),
    ("IgnoreUnknown", "1"),
    ("K8S_POD_NAME", "web<&>0"),
    ("K8S_POD_INFRA_CONTAINER_ID", CID),
)
# Capabilities no plugin here asks for: cached all the same, handed to none (portmap would
# touch this machine's iptables). Keys out of order at every level.
CAPS: dict[str, Any] = {
    "io.kubernetes.cri.pod-annotations": {"z": "1", "a": "<b>", "m": {"y": 2, "x": [3, {"k": 1}]}},
    "bandwidth": {"ingressRate": 1000, "egressRate": 2000},
}


def conflist(data_dir: Path, cni_version: str) -> bytes:
    """Indented, as a file in a conf dir is: libcni caches the bytes it read."""
    ipam = {
        "type": "host-local",
        "dataDir": str(data_dir),
        "ranges": [[{"subnet": "10.56.0.0/24"}], [{"subnet": "fd56::/64"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
    }
    doc = {
        "cniVersion": cni_version,
        "name": NETWORK,
        "plugins": [
            {"type": "host-local", "ipam": ipam},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
    return json.dumps(doc, indent=2).encode()


@pytest.mark.parametrize("cni_version", ["0.4.0", "1.0.0"])
def test_the_imitation_caches_byte_for_byte_as_libcni_1_1_2(
    tmp_path: Path, libcni_client: LibcniClient, cni_version: str
) -> None:
    if not have_plugins():
        cannot_run(f"containernetworking-plugins is not installed in {PLUGIN_DIR}")
    conf_dir, data_dir = tmp_path / "net.d", tmp_path / "ipam"
    conf_dir.mkdir()
    conf = conflist(data_dir, cni_version)
    (conf_dir / f"10-{NETWORK}.conflist").write_bytes(conf)
    name = f"{NETWORK}-{CID}-eth0"

    real = libcni_client.run(
        "add",
        CID,
        "eth0",
        conf_dir=conf_dir,
        network=NETWORK,
        bin_dirs=(PLUGIN_DIR,),
        cache_dir=tmp_path / "real",
        netns=NETNS,
        cni_args=ARGS,
        capability_args=CAPS,
    )
    assert real.ok, real.error
    # host-local's store as it was before, so that it hands out the same addresses again
    shutil.rmtree(data_dir)
    imitated = add_to_cache(
        conf, CID, "eth0", NETNS, tmp_path / "imitated", (PLUGIN_DIR,), ARGS, CAPS
    )

    assert imitated == real.result
    written = (tmp_path / "imitated/results" / name).read_bytes()
    assert written == (tmp_path / "real/results" / name).read_bytes()
    assert b"\\u003c&" not in written and b"web\\u003c\\u0026\\u003e0" in written


def test_libcni_1_2_caches_the_netns_after_the_network_name() -> None:
    doc = json.loads(
        cached_bytes(b"{}", NETWORK, CID, "eth0", {"cniVersion": "1.0.0"}, ARGS, None, NETNS)
    )
    assert list(doc) == [
        "kind",
        "containerId",
        "config",
        "ifName",
        "networkName",
        "netns",
        "cniArgs",
        "result",
    ]
    assert doc["netns"] == NETNS
