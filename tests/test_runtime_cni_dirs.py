"""Which CNI conf and plugin dirs a run uses, and the report saying what named each: the flags,
the runtimes' own configs read inside the root (runtime/config.py), or the defaults. Real node
trees, in process; a node laid out as k3s lays it out is found without any flag."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from cni_reaper import cli
from cni_reaper.errors import ExitCode
from cni_reaper.lock import RunLock
from cni_reaper.paths import NodePaths, SourcedDir
from cni_reaper.runtime import config
from tests.crashed import Crashed
from tests.libcni import add_network_list
from tests.nodetree import CONTAINER_IDS, PLUGIN_DIR, NodeTree, host_local_conflist
from tests.test_runtime_config import CRI_V2, K3S_CONFIG, K3S_HASH_BIN, k3s_generated_config, write

K3S_CONF_DIR = "/var/lib/rancher/k3s/agent/etc/cni/net.d"
# What k3s's own flannel writes (pkg/agent/flannel): flannel delegates to bridge itself.
K3S_FLANNEL_CONFLIST = {
    "name": "cbr0",
    "cniVersion": "1.0.0",
    "plugins": [
        {
            "type": "flannel",
            "delegate": {"hairpinMode": True, "forceAddress": True, "isDefaultGateway": True},
        },
        {"type": "portmap", "capabilities": {"portMappings": True}},
        {"type": "bandwidth", "capabilities": {"bandwidth": True}},
    ],
}


def built(root: Path, **flags: Any) -> NodePaths:
    """The paths a run takes, as cli.run takes them."""
    return NodePaths.build(root=str(root), runtime_dirs=config.load(str(root)).cni_dirs, **flags)


def test_with_no_runtime_found_the_defaults_stay(tmp_path: Path) -> None:
    paths = built(tmp_path)
    assert paths.sourced_conf_dirs == (SourcedDir(str(tmp_path / "etc/cni/net.d"), ("default",)),)
    assert paths.bin_dirs == tuple(
        str(tmp_path / d) for d in ("opt/cni/bin", "usr/lib/cni", "usr/libexec/cni")
    )
    assert {d.sources for d in paths.sourced_bin_dirs} == {("default",)}


def test_the_runtimes_dirs_each_once_with_every_runtime_naming_it(tmp_path: Path) -> None:
    """Debian's containerd config beside a CRI-O: the dirs of both, containerd's first."""
    ctd = write(
        tmp_path,
        "/etc/containerd/config.toml",
        f'version = 2\n[{CRI_V2}.cni]\nbin_dir = "/usr/lib/cni"\nconf_dir = "/etc/cni/net.d"\n',
    )
    (tmp_path / "var/lib/crio").mkdir(parents=True)
    paths = built(tmp_path)
    assert paths.sourced_conf_dirs == (
        SourcedDir(
            str(tmp_path / "etc/cni/net.d"),
            (f"containerd: {ctd}: [{CRI_V2}.cni] conf_dir", "cri-o: default"),
        ),
    )
    assert paths.sourced_bin_dirs == (
        SourcedDir(str(tmp_path / "usr/lib/cni"), (f"containerd: {ctd}: [{CRI_V2}.cni] bin_dir",)),
        SourcedDir(str(tmp_path / "opt/cni/bin"), ("cri-o: default",)),
    )


def test_flags_win_over_the_runtimes_configs(tmp_path: Path) -> None:
    write(tmp_path, K3S_CONFIG, k3s_generated_config(2))
    paths = built(tmp_path, conf_dirs=["/etc/mine", "/etc/mine"], bin_dirs=["rel/bin"])
    assert paths.sourced_conf_dirs == (SourcedDir("/etc/mine", ("flag --conf-dir",)),)
    assert paths.sourced_bin_dirs == (SourcedDir(os.path.abspath("rel/bin"), ("flag --bin-dir",)),)
    # Only the dir not given comes from the config.
    paths = built(tmp_path, bin_dirs=["/opt/mine"])
    assert paths.conf_dirs == (str(tmp_path / K3S_CONF_DIR.lstrip("/")),)
    assert paths.bin_dirs == ("/opt/mine",)


def test_a_default_the_node_leads_out_of_the_root_stops_no_run_given_others(
    tmp_path: Path,
) -> None:
    node = tmp_path / "node"
    (node / "usr").mkdir(parents=True)
    (node / "usr/lib").symlink_to("../../elsewhere")
    (node / "var/lib/crio").mkdir(parents=True)
    assert built(node).bin_dirs == (str(node / "opt/cni/bin"),)  # CRI-O's own
    assert built(node, bin_dirs=["/opt/mine"]).bin_dirs == ("/opt/mine",)


def dry_run(root: Path, clock: float, *extra: str) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.run(["--root", str(root), "--dry-run", *extra], lambda: clock, environ={})
    return int(code), out.getvalue()


def k3s_node(node: NodeTree, t0: float) -> Path:
    """A node as k3s with its flannel lays it out, and a pod's damaged cache entry from a boot
    that crashed. Returns the plugin dir."""
    write(node.root, K3S_CONFIG, k3s_generated_config(2))
    conf_dir = node.root / K3S_CONF_DIR.lstrip("/")
    conf_dir.mkdir(parents=True)
    (conf_dir / "10-flannel.conflist").write_text(json.dumps(K3S_FLANNEL_CONFLIST))
    bin_dir = node.root / K3S_HASH_BIN.lstrip("/")
    bin_dir.mkdir(parents=True)
    for plugin in ("flannel", "bridge", "host-local", "portmap", "bandwidth", "loopback"):
        # A dry run only finds them: never run, they need not be the real plugins.
        (bin_dir / plugin).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / plugin).chmod(0o755)
    (node.root / "var/lib/rancher/k3s/data/current").symlink_to(bin_dir.parent.name)
    node.boot(t0 - 7200)
    node.boot(t0 - 55)
    node.write_boot_world(btime=t0 - 60)
    node.write_result(f"cbr0-{CONTAINER_IDS[0]}-eth0", b"")
    return bin_dir


def test_a_k3s_node_is_found_without_flags(node: NodeTree, t0: float) -> None:
    bin_dir = k3s_node(node, t0)
    code, out = dry_run(node.root, t0, "--json")
    report = json.loads(out)

    assert code == ExitCode.OK
    generated = node.root / K3S_CONFIG.lstrip("/")
    conf_dir = node.root / K3S_CONF_DIR.lstrip("/")
    assert report["conf_dirs"] == [
        {"path": str(conf_dir), "sources": [f"k3s: {generated}: [{CRI_V2}.cni] conf_dir"]}
    ]
    assert report["bin_dirs"] == [
        {"path": str(bin_dir), "sources": [f"k3s: {generated}: [{CRI_V2}.cni] bin_dir"]}
    ]
    assert report["warnings"] == []
    (entry,) = report["entries"]
    assert (entry["network"], entry["action"], entry["outcome"]) == (
        "cbr0",
        "del-and-quarantine",
        "planned",
    )
    assert entry["del"]["config"] == str(conf_dir / "10-flannel.conflist")
    assert entry["del"]["config_problem"] is None
    assert [(p["type"], p["path"]) for p in entry["del"]["chain"]] == [
        (kind, str(bin_dir / kind)) for kind in ("bandwidth", "portmap", "flannel")
    ]

    code, text = dry_run(node.root, t0)
    assert code == ExitCode.OK
    assert f"  conf dir {conf_dir} (k3s: {generated}: [{CRI_V2}.cni] conf_dir)\n" in text
    assert f"  plugin dir {bin_dir} (k3s: {generated}: [{CRI_V2}.cni] bin_dir)\n" in text


def test_a_plugin_dir_a_config_names_is_vetted_as_a_flag_dir_is(node: NodeTree, t0: float) -> None:
    bin_dir = k3s_node(node, t0)
    bin_dir.chmod(0o777)
    try:
        code, out = dry_run(node.root, t0, "--json")
    finally:
        bin_dir.chmod(0o755)
    report = json.loads(out)
    refused = f"plugin dir {bin_dir} left out of CNI_PATH: {bin_dir} is writable by group or others"
    assert any(w.startswith(refused) for w in report["warnings"])
    (entry,) = report["entries"]
    assert entry["del"]["config_problem"].startswith("plugin 'bandwidth': no plugin dirs; ")
    assert code == ExitCode.ACTION_FAILED  # the DEL it plans cannot run


def test_a_run_ended_early_says_the_dirs_it_knew(
    node: NodeTree, t0: float, capsys: pytest.CaptureFixture[str]
) -> None:
    k3s_node(node, t0)
    with RunLock(NodePaths.build(root=str(node.root)).lock_file):
        code = cli.main(["--root", str(node.root), "--json"], clock=lambda: t0, environ={})
    assert code == ExitCode.REFUSED
    doc = json.loads(capsys.readouterr().out)
    assert doc["boot"] is None
    assert doc["conf_dirs"] == [
        {
            "path": str(node.root / K3S_CONF_DIR.lstrip("/")),
            "sources": [f"k3s: {node.root / K3S_CONFIG.lstrip('/')}: [{CRI_V2}.cni] conf_dir"],
        }
    ]
    # Before the paths are known, nothing is claimed of them.
    assert cli.main(["--json", "--root", str(node.root), "--nope"]) == ExitCode.USAGE
    doc = json.loads(capsys.readouterr().out)
    assert (doc["conf_dirs"], doc["bin_dirs"]) == (None, None)


def test_a_k3s_node_is_repaired_under_root_without_flags(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """A real run, its plugins confined to the root: host-local found in k3s's data dir,
    the network in k3s's conf dir, the address released from the node's own store."""
    root = crashed.node.root
    write(root, K3S_CONFIG, k3s_generated_config(2))
    bin_dir = root / K3S_HASH_BIN.lstrip("/")
    bin_dir.mkdir(parents=True)
    shutil.copy2(os.path.join(PLUGIN_DIR, "host-local"), bin_dir)
    conflist = host_local_conflist("k3s-hl", "10.42.0.0/24")
    write(root, f"{K3S_CONF_DIR}/10-hl.conflist", conflist.decode())
    cid = CONTAINER_IDS[0]
    add_network_list(conflist, cid, "eth0", f"/run/netns/cni-{cid[:8]}", root, (str(bin_dir),))
    damaged = crashed.node.results / f"k3s-hl-{cid}-eth0"
    damaged.write_bytes(b"")
    store = crashed.ipam / "k3s-hl"
    assert [p.name for p in store.iterdir() if p.name.startswith("10.")] == ["10.42.0.2"]
    crashed.reboot()

    code = cli.run(["--root", str(root), "--json"], clock=lambda: crashed.t0 + 60, environ={})
    report = json.loads(capsys.readouterr().out)

    assert code == ExitCode.OK
    (entry,) = report["entries"]
    assert (entry["action"], entry["outcome"]) == ("del-and-quarantine", "done")
    assert entry["del"]["plugins_run"] == ["host-local"]
    assert not damaged.exists()
    assert not [p.name for p in store.iterdir() if p.name.startswith("10.")]


def test_k3s_multi_call_plugins_are_run_by_the_name_libcni_runs_them_by(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    root = crashed.node.root
    write(root, K3S_CONFIG, k3s_generated_config(2))
    bin_dir = root / K3S_HASH_BIN.lstrip("/")
    bin_dir.mkdir(parents=True)
    # As k3s's data dir holds them: one binary that acts as the plugin it is called by.
    host_local = os.path.join(PLUGIN_DIR, "host-local")
    (bin_dir / "cni").write_text(
        '#!/bin/sh\ncase "${0##*/}" in\n'
        f'host-local) exec "{host_local}" ;;\n'
        '*) echo \'{"cniVersion":"1.0.0","code":100,"msg":"which plugin?"}\'; exit 1 ;;\nesac\n'
    )
    (bin_dir / "cni").chmod(0o755)
    (bin_dir / "host-local").symlink_to("cni")
    conflist = host_local_conflist("k3s-hl", "10.42.0.0/24")
    write(root, f"{K3S_CONF_DIR}/10-hl.conflist", conflist.decode())
    cid = CONTAINER_IDS[0]
    add_network_list(conflist, cid, "eth0", f"/run/netns/cni-{cid[:8]}", root)
    (crashed.node.results / f"k3s-hl-{cid}-eth0").write_bytes(b"")
    crashed.reboot()

    code = cli.run(["--root", str(root), "--json"], clock=lambda: crashed.t0 + 60, environ={})
    report = json.loads(capsys.readouterr().out)

    (entry,) = report["entries"]
    assert (entry["outcome"], entry["plugin_errors"]) == ("done", [])
    assert code == ExitCode.OK
