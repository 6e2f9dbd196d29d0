"""Multus's `cniDir` (cni_reaper/multus.py): the cache dir a Multus config in the conf dirs names
in place of /var/lib/cni/multus. The thin plugin's is a node path, inspected as the default one
is; the thick plugin's is its daemon's, which sees the node through its pod's mounts, and a
place that cannot be told leaves the delegates' addresses to Multus. The delegate is ADDed by
the real libcni (tests/libcni_client) with that cache dir, as Multus runs it, and real
host-local."""

from __future__ import annotations

import json
import os
import posixpath
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni_reaper import node_root
from cni_reaper.errors import ExitCode
from cni_reaper.multus import (
    DEFAULT_CNI_DIR,
    THICK_SHIM,
    THIN_PLUGIN,
    MultusCache,
    named_dirs,
)
from cni_reaper.netconf import NetworkList
from tests.crashed import Crashed
from tests.nodetree import CONTAINER_IDS
from tests.private_node import damage
from tests.real_libcni import LibcniClient
from tests.test_multus import KNOWN, MultusNode, delegates

OTHER = "/var/lib/cni/multus-data"  # where the thin plugin's config keeps its cache here


def multus_conf(kind: str, cni_dir: object) -> dict[str, Any]:
    """The Multus network's config in the conf dir, as the runtime hands it to Multus's DEL."""
    conf: dict[str, Any] = {
        "cniVersion": "0.3.1",
        "name": "multus-cni-network",
        "type": kind,
        "delegates": [{"cniVersion": "0.3.1", "name": "hl", "type": "bridge"}],
    }
    if cni_dir is not None:
        conf["cniDir"] = cni_dir
    return conf


@pytest.fixture
def node_with(
    crashed: Crashed, libcni_client: LibcniClient
) -> Any:  # a maker: (kind, cniDir, where its delegates are really cached) -> MultusNode
    def make(kind: str, cni_dir: object, cached_in: str | None = None) -> MultusNode:
        crashed.node.write_conf("00-multus.conf", json.dumps(multus_conf(kind, cni_dir)).encode())
        node = MultusNode(crashed, libcni_client)
        if cached_in is not None:
            node.cache_dir = crashed.node.root / cached_in.lstrip("/")
        return node

    return make


def warned(report: dict[str, Any], part: str) -> bool:
    return any(part in w for w in report["warnings"])


def the_reservation(report: dict[str, Any]) -> dict[str, Any]:
    (reservation,) = report["host_local"]
    return reservation  # type: ignore[no-any-return]


def test_a_damaged_delegate_result_in_the_named_dir_is_moved_and_multus_then_frees_it(
    node_with: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    multus_node: MultusNode = node_with("multus", OTHER, OTHER)
    crashed = multus_node.crashed
    result = multus_node.crash_damages_a_known_pods_delegate("empty")
    assert result.parent.parent == crashed.node.root / OTHER.lstrip("/")
    held = crashed.ips()
    assert len(held) == 1

    code, report = crashed.run(capsys, "-v")

    assert code == ExitCode.OK, report
    doc = delegates(report)[result.name]
    assert doc["path"] == str(result)
    assert (doc["content"], doc["action"], doc["outcome"]) == ("empty", "quarantine", "done")
    assert not result.exists()
    assert (multus_node.quarantine / result.name).exists()
    # Multus's DEL still comes for the delegate's address: kept, not an orphan to DEL.
    reservation = the_reservation(report)
    assert reservation["action"] == "keep", reservation
    assert f"Multus cached it as a delegate's ({result})" in reservation["reason"]
    assert crashed.ips() == held
    freed = multus_node.run("del", KNOWN)
    assert freed.ok, freed.error
    assert crashed.ips() == {}


def test_a_dry_run_plans_the_move_in_the_named_dir_and_moves_nothing(
    node_with: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    multus_node: MultusNode = node_with("multus", OTHER + "/", OTHER)  # its own spelling
    result = multus_node.crash_damages_a_known_pods_delegate("truncated")

    code, report = multus_node.crashed.run(capsys, "--dry-run")

    assert code == ExitCode.OK, report
    assert [(d["path"], d["outcome"]) for d in report["multus_results"]] == [
        (str(result), "planned")
    ]
    assert result.exists() and not multus_node.quarantine.exists()


def test_a_damaged_scratch_file_in_the_named_dir_is_moved(
    node_with: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    multus_node: MultusNode = node_with("multus", OTHER, OTHER)
    crashed = multus_node.crashed
    multus_node.delegate(KNOWN)
    multus_node.containerd_knows(KNOWN)
    scratch = multus_node.cache_dir / KNOWN
    scratch.write_bytes(b'[{"cniVersion":"0.3.1","name":"hl"')  # cut by the crash
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert code == ExitCode.OK, report
    (doc,) = report["multus_scratch"]
    assert (doc["path"], doc["action"], doc["outcome"]) == (str(scratch), "quarantine", "done")
    assert not scratch.exists() and (multus_node.quarantine / KNOWN).exists()


def test_the_default_dir_named_again_through_a_symlink_is_inspected_once(
    node_with: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    multus_node: MultusNode = node_with("multus", "/var/lib/cni/multus-link")
    crashed = multus_node.crashed
    result = multus_node.crash_damages_a_known_pods_delegate("zeroed")
    (crashed.node.root / "var/lib/cni/multus-link").symlink_to("multus")

    code, report = crashed.run(capsys, "--dry-run")

    assert code == ExitCode.OK, report
    assert [d["path"] for d in report["multus_results"]] == [str(result)]
    assert report["summary"]["multus_results"] == {"quarantine/planned": 1}


def test_a_thick_plugins_dir_elsewhere_leaves_the_delegates_address_to_multus(
    node_with: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The daemon's cniDir names a place in its pod: the cache is not found on the node, and
    without it the reservation would be an orphan, DEL'd by this run."""
    multus_node: MultusNode = node_with("multus-shim", "/host/multus", "/var/lib/daemon-cache")
    crashed = multus_node.crashed
    multus_node.crash_damages_a_known_pods_delegate("empty")
    held = crashed.ips()

    code, report = crashed.run(capsys, "-v")

    assert code == ExitCode.OK, report
    assert warned(report, "names cniDir '/host/multus' for Multus's daemon")
    reservation = the_reservation(report)
    assert reservation["action"] == "keep", reservation
    assert (
        "/host/multus/results, as a Multus config names it; not looked at"
        in (reservation["reason"])
    )
    assert crashed.ips() == held
    assert report["multus_results"] == []


@pytest.mark.parametrize(
    ("cni_dir", "said"),
    [
        ("multus", "names cniDir 'multus', no absolute path"),
        ("", "names cniDir '', no absolute path"),
        (7, "has a cniDir that is no string"),
    ],
)
def test_a_cni_dir_that_names_no_place_leaves_the_address_too(
    node_with: Any, capsys: pytest.CaptureFixture[str], cni_dir: object, said: str
) -> None:
    multus_node: MultusNode = node_with("multus", cni_dir, "/var/lib/daemon-cache")
    crashed = multus_node.crashed
    multus_node.crash_damages_a_known_pods_delegate("empty")
    held = crashed.ips()

    code, report = crashed.run(capsys, "-v")

    assert code == ExitCode.OK, report
    assert warned(report, said), report["warnings"]
    assert the_reservation(report)["action"] == "keep"
    assert crashed.ips() == held


def test_a_named_dir_that_holds_the_runtimes_results_dir_is_not_inspected(
    node_with: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """cniDir /var/lib/cni: its results dir is the runtime's, whose entries must not be judged
    a second time as Multus's delegates."""
    multus_node: MultusNode = node_with("multus", "/var/lib/cni")
    crashed = multus_node.crashed
    entry = crashed.add(CONTAINER_IDS[1])
    damage(entry, "empty")
    crashed.reboot()

    code, report = crashed.run(capsys, "--dry-run")

    assert warned(report, "is or holds a dir this run inspects as the runtime's or another")
    assert report["multus_results"] == [] and report["multus_scratch"] == []
    # judged once, as the runtime's entry
    assert [(e["path"], e["action"]) for e in report["entries"]] == [
        (entry.name, "del-and-quarantine")
    ]
    assert code == ExitCode.OK, report


def away_out_of_the_root(crashed: Crashed, tmp_path: Path, container_id: str) -> Path:
    """/var/lib/cni/away, a symlink that climbs out of the root to a dir with a damaged
    delegate result of the container's in it: that file, which no run may touch."""
    outside = tmp_path / "outside"
    (outside / "results").mkdir(parents=True)
    victim = outside / "results" / f"hl-{container_id}-eth0"
    victim.write_bytes(b"")
    depth = len(crashed.node.root.relative_to(tmp_path).parts) + 3
    link = crashed.node.root / "var/lib/cni/away"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to("../" * depth + "outside")
    assert link.resolve() == outside.resolve()
    return victim


def test_a_named_dir_whose_symlink_climbs_out_of_the_root_is_refused(
    node_with: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    multus_node: MultusNode = node_with("multus", "/var/lib/cni/away")
    crashed = multus_node.crashed
    victim = away_out_of_the_root(crashed, tmp_path, KNOWN)
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert warned(report, "leads out of"), report["warnings"]
    assert report["multus_results"] == []
    assert victim.exists()
    assert code == ExitCode.OK, report


def test_a_named_dir_others_can_write_is_not_acted_on(
    node_with: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    multus_node: MultusNode = node_with("multus", OTHER, OTHER)
    result = multus_node.crash_damages_a_known_pods_delegate("empty")
    multus_node.cache_dir.chmod(0o777)

    code, report = multus_node.crashed.run(capsys)

    assert report["multus_results"] == []
    assert result.exists()
    said = f"Multus's cache {multus_node.cache_dir}: multus-data is writable by group or others"
    assert warned(report, said), report["warnings"]
    assert code == ExitCode.OK


PARTS = st.sampled_from(["..", ".", "", "cni", "multus", "inside", "up", "away", "loop", "x"])
PATHS = st.lists(PARTS, max_size=8).map(lambda parts: "/" + "/".join(parts))


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture], max_examples=300)
@given(PATHS)
def test_a_named_dir_is_only_ever_opened_inside_the_root(tmp_path: Path, node_path: str) -> None:
    """Whatever a config names, through whatever symlinks the node holds, the dir opened is
    one of the root's: a symlink's absolute target starts again at the root, one that climbs
    above it is refused."""
    root = tmp_path / "root"
    if not root.exists():
        (root / "cni/multus/results").mkdir(parents=True)
        (tmp_path / "outside/results").mkdir(parents=True)
        (root / "inside").symlink_to("/cni")
        (root / "cni/up").symlink_to("../..")
        (root / "away").symlink_to("../outside")
        (root / "loop").symlink_to("loop")
    found = MultusCache.named(str(root), node_root.canonical(node_path))
    try:
        for fd in (found.scratch_fd, found.fd):
            if fd is not None:
                opened = os.readlink(f"/proc/self/fd/{fd}")
                assert opened == str(root) or opened.startswith(f"{root}/"), opened
        if found.scratch_fd is None:
            assert not found.present
    finally:
        found.close()


PLUGIN_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.text(max_size=12), PATHS, st.just(DEFAULT_CNI_DIR)
)
PLUGINS = st.fixed_dictionaries(
    {"type": st.sampled_from([THIN_PLUGIN, THICK_SHIM, "bridge", 7])},
    optional={"cniDir": PLUGIN_VALUES},
)


@given(st.lists(st.lists(PLUGINS, min_size=1, max_size=3), max_size=3))
def test_only_a_thin_plugins_absolute_dir_other_than_the_default_is_placed(
    networks: list[list[dict[str, Any]]],
) -> None:
    netlists = [
        NetworkList(f"net{i}", "0.3.1", tuple(plugins), f"/etc/cni/net.d/{i}.conflist")
        for i, plugins in enumerate(networks)
    ]
    named = named_dirs(netlists)
    asked = {
        p["cniDir"]
        for plugins in networks
        for p in plugins
        if p["type"] in (THIN_PLUGIN, THICK_SHIM) and "cniDir" in p
    }
    placed = [n.node_path for n in named if n.problem is None]
    thin = {
        "/" + posixpath.normpath(p["cniDir"]).lstrip("/")
        for plugins in networks
        for p in plugins
        if p["type"] == THIN_PLUGIN and isinstance(p.get("cniDir"), str) and p["cniDir"][:1] == "/"
    }
    assert set(placed) == thin - {DEFAULT_CNI_DIR}
    assert len(placed) == len(set(placed))
    if not asked:
        assert named == []
