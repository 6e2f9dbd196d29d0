"""The runtime inventory from real files in a node tree: containerd's meta.db written by the real
bbolt in containerd's layout (default root, config.toml's root, k3s), CRI-O's containers/storage
files and what its next start does with them, and every record that cannot be read."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from cni_reaper.runtime import config, inventory
from cni_reaper.runtime.inventory import SandboxInventory
from tests.bolt_writer import (
    Operation,
    containerd_sandbox,
    protobuf_any,
    put,
    sandbox_metadata,
    write_db,
)

IDS = [f"{n:x}{n + 1:x}" * 32 for n in range(1, 10)]
META_DB = "/var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db"
GRAPH = "/var/lib/containers/storage"
WANTS_LINK = "/etc/systemd/system/multi-user.target.wants/crio-wipe.service"


def write(root: Path, node_path: str, data: str | bytes) -> Path:
    path = root / node_path.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        path.write_text(data)
    else:
        path.write_bytes(data)
    return path


def symlink(root: Path, node_path: str, target: str | Path) -> Path:
    path = root / node_path.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)
    return path


def meta_db(root: Path, records: list[Operation], node_path: str = META_DB) -> Path:
    path = root / node_path.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_db(path, [records], no_freelist_sync=True)


def inventory_of(root: Path) -> SandboxInventory:
    return inventory.load(str(root), config.load(str(root)))


def host(root: Path, node_path: str) -> str:
    return str(root / node_path.lstrip("/"))


# containerd


def test_a_node_without_any_runtime_records_cannot_tell(tmp_path: Path) -> None:
    """Whatever made the entries keeps its records where the reaper did not look: whole
    entries are left for it, none called forgotten."""
    found = inventory_of(tmp_path)
    assert found.known == frozenset()
    assert found.unreadable == ()
    assert found.knows(IDS[0]) is None
    assert found.describe(IDS[0]) == "no CRI runtime's sandbox records found on this node"
    rancher = "/agent/containerd/io.containerd.metadata.v1.bolt/meta.db"
    assert found.sources == (
        f"containerd: {host(tmp_path, META_DB)}: not present: no sandbox records",
        f"k3s: {host(tmp_path, '/var/lib/rancher/k3s' + rancher)}: not present: no sandbox records",
        f"rke2: {host(tmp_path, '/var/lib/rancher/rke2' + rancher)}: not present: "
        "no sandbox records",
        f"cri-o: {host(tmp_path, GRAPH)}: no containers.json: no sandbox records",
    )


def test_containerd_sandbox_records_of_every_namespace_but_not_its_containers(
    tmp_path: Path,
) -> None:
    meta_db(
        tmp_path,
        containerd_sandbox("k8s.io", IDS[0])
        + containerd_sandbox("k8s.io", IDS[1])
        + containerd_sandbox("k8s.io", IDS[2], "container")
        + containerd_sandbox("other", IDS[3])
        + containerd_sandbox("other", IDS[4], "container")
        + [put(["v1", "k8s.io", "containers", IDS[5], "labels"], "app", "not a CRI one")],
    )
    found = inventory_of(tmp_path)
    assert found.known == {IDS[0], IDS[1]}
    assert found.unreadable == ()
    assert [found.knows(i) for i in IDS[:6]] == [True, True, False, None, False, False]
    assert found.sources[0] == (
        f"containerd: {host(tmp_path, META_DB)}: 3 sandboxes (namespace k8s.io: 2, other: 1), "
        "1 undecided"
    )
    assert "containerd loads it at start and DELs it" in found.describe(IDS[0])
    assert "never loads" in found.describe(IDS[3])


def test_a_containerd_sandbox_whose_add_never_saved_its_result_is_the_reapers_to_del(
    tmp_path: Path,
) -> None:
    """Some containerd releases never DEL it (trixie's 1.7.24 left a whole cni-loopback entry
    of one for good in the crash campaign, seed 2002); the others DEL it again after the
    reaper, with nothing left to undo."""
    no_result = sandbox_metadata(IDS[1], cni_result=False)
    host_network = sandbox_metadata(IDS[2], netns="", cni_result=False)
    meta_db(
        tmp_path,
        containerd_sandbox("k8s.io", IDS[0])
        + containerd_sandbox("k8s.io", IDS[1], metadata=no_result)
        + containerd_sandbox("k8s.io", IDS[2], metadata=host_network),
    )
    found = inventory_of(tmp_path)
    assert found.known == {IDS[0], IDS[2]}
    assert (found.undecided, found.unsaved) == (frozenset(), frozenset({IDS[1]}))
    assert found.knows(IDS[1]) is False
    assert "1.7.23 to 1.7.30" in found.describe(IDS[1])
    assert "other releases DEL it again, with nothing left to undo" in found.describe(IDS[1])
    assert found.sources[0].endswith(
        "3 sandboxes (namespace k8s.io: 3), 1 whose CNI ADD never saved its result"
    )


def test_a_record_containerd_cannot_load_is_dropped_one_unread_here_undecided(
    tmp_path: Path,
) -> None:
    meta_db(
        tmp_path,
        containerd_sandbox("k8s.io", IDS[0], with_extension=False)
        + containerd_sandbox("k8s.io", IDS[1], extension=b"\x0a\x01x\x12\x03{}}")
        + containerd_sandbox("k8s.io", IDS[2], extension=b"\xff\xff"),
    )
    found = inventory_of(tmp_path)
    assert found.knows(IDS[0]) is False
    assert "containerd cannot load it at start" in found.describe(IDS[0])
    assert found.knows(IDS[1]) is None
    assert found.knows(IDS[2]) is None
    assert "could not be read here" in found.describe(IDS[2])
    assert found.sources[0].endswith(", 2 undecided, 1 it will never DEL")


def test_the_sandbox_store_of_containerd_1_7_and_2(tmp_path: Path) -> None:
    store = ["v1", "k8s.io", "sandboxes"]
    metadata = protobuf_any("x", json.dumps(sandbox_metadata(IDS[0])).encode())
    no_result = sandbox_metadata(IDS[2], cni_result=False)
    meta_db(
        tmp_path,
        [
            # The same sandbox as a container record too, as 2.x makes it after the ADD.
            *containerd_sandbox("k8s.io", IDS[0]),
            put([*store, IDS[0], "extensions"], "metadata", metadata),
            put([*store, IDS[1], "labels"], "name", "pod"),
            put(
                [*store, IDS[2], "extensions"],
                "metadata",
                protobuf_any("x", json.dumps(no_result).encode()),
            ),
        ],
    )
    found = inventory_of(tmp_path)
    assert found.known == {IDS[0]}
    assert found.unsaved == {IDS[2]}
    assert found.knows(IDS[1]) is False
    assert "without the CRI's sandbox metadata" in found.describe(IDS[1])
    assert ": 3 sandboxes (namespace k8s.io: 4)" in found.sources[0]


def test_containerd_root_from_its_config_and_not_the_overridden_default(tmp_path: Path) -> None:
    write(tmp_path, "/etc/containerd/config.toml", 'version = 2\nroot = "/data/containerd"\n')
    moved = "/data/containerd/io.containerd.metadata.v1.bolt/meta.db"
    meta_db(tmp_path, containerd_sandbox("k8s.io", IDS[0]), moved)
    meta_db(tmp_path, containerd_sandbox("k8s.io", IDS[1]))  # the default root, not used
    found = inventory_of(tmp_path)
    assert found.known == {IDS[0]}
    assert (
        found.sources[0] == f"containerd: {host(tmp_path, moved)}: 1 sandbox (namespace k8s.io: 1)"
    )


@pytest.mark.parametrize("distribution", ["k3s", "rke2"])
def test_the_containerd_of_k3s_and_rke2(tmp_path: Path, distribution: str) -> None:
    node_path = f"/var/lib/rancher/{distribution}/agent/containerd/" + META_DB.split("/", 4)[-1]
    meta_db(tmp_path, containerd_sandbox("k8s.io", IDS[0]), node_path)
    found = inventory_of(tmp_path)
    assert found.known == {IDS[0]}
    line = f"{distribution}: {host(tmp_path, node_path)}: 1 sandbox (namespace k8s.io: 1)"
    assert line in found.sources


def test_an_unreadable_meta_db_lets_no_sandbox_be_called_dropped(tmp_path: Path) -> None:
    meta_db(tmp_path, containerd_sandbox("k8s.io", IDS[0]))
    k3s = "/var/lib/rancher/k3s/agent/containerd/io.containerd.metadata.v1.bolt/meta.db"
    write(tmp_path, k3s, b"\0" * 65536)
    found = inventory_of(tmp_path)
    assert found.known == {IDS[0]}
    assert found.knows(IDS[0]) is True
    assert found.knows(IDS[1]) is None
    assert len(found.unreadable) == 1
    assert found.unreadable[0].startswith(f"k3s: {host(tmp_path, k3s)}: no valid meta page")


def outside_db(tmp_path: Path) -> Path:
    return meta_db(tmp_path / "outside", containerd_sandbox("k8s.io", IDS[7]), "/meta.db")


def test_a_meta_db_symlinked_out_of_the_root_is_not_followed(tmp_path: Path) -> None:
    root = tmp_path / "node"
    target = outside_db(tmp_path)
    symlink(root, META_DB, target)  # absolute: the node's own path, inside the root
    found = inventory_of(root)
    assert IDS[7] not in found.known
    assert found.knows(IDS[7]) is None
    assert found.unreadable == (
        f"containerd: {host(root, META_DB)}: a symlink whose target does not exist inside "
        f"{root} (an absolute target is the node's own path)",
    )


def test_a_meta_db_symlink_climbing_out_of_the_root_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "node"
    outside_db(tmp_path)
    symlink(root, META_DB, "../" * META_DB.count("/") + "outside/meta.db")
    found = inventory_of(root)
    assert found.known == frozenset()
    assert found.unreadable == (
        f"containerd: {host(root, META_DB)}: a symlink that leads out of {root}",
    )


def test_a_meta_db_symlinked_inside_the_root_is_read_as_the_node_reads_it(tmp_path: Path) -> None:
    meta_db(tmp_path, containerd_sandbox("k8s.io", IDS[0]), "/srv/meta.db")
    symlink(tmp_path, META_DB, "/srv/meta.db")
    assert inventory_of(tmp_path).known == {IDS[0]}


@pytest.mark.parametrize("kind", ["dir", "fifo"])
def test_a_meta_db_that_is_no_file(tmp_path: Path, kind: str) -> None:
    path = tmp_path / META_DB.lstrip("/")
    path.parent.mkdir(parents=True)
    if kind == "dir":
        path.mkdir()
    else:
        os.mkfifo(path)
    found = inventory_of(tmp_path)
    assert found.unreadable == (f"containerd: {path}: not a regular file",)


def test_a_thousand_sandboxes_among_a_thousand_containers(tmp_path: Path) -> None:
    records: list[Operation] = []
    for n in range(1000):
        sandbox_id = f"{n:064x}"
        records += containerd_sandbox("k8s.io", sandbox_id, spec_bytes=9000)
        records += containerd_sandbox("k8s.io", f"{n + 5000:064x}", "container", spec_bytes=9000)
    meta_db(tmp_path, records)
    found = inventory_of(tmp_path)
    assert found.known == {f"{n:064x}" for n in range(1000)}
    assert found.knows(f"{5000:064x}") is False  # a container, no sandbox


# CRI-O


def crio_metadata(sandbox_id: str, *, pod: bool = True) -> dict[str, Any]:
    """A container's metadata as CRI-O's internal/storage writes it."""
    metadata: dict[str, Any] = {
        "pod-name": "web",
        "pod-id": sandbox_id,
        "image-name": "registry.k8s.io/pause:3.9",
        "name": "k8s_POD_web_default_0",
        "metadata-name": "web",
        "created-at": 1700000000,
    }
    if pod:
        metadata["pod"] = True
    return metadata


def storage_entry(container_id: str, metadata: dict[str, Any]) -> dict[str, Any]:
    """A containers.json entry as containers/storage writes it."""
    return {
        "id": container_id,
        "names": [metadata.get("name", container_id)],
        "image": "a" * 64,
        "layer": "b" * 64,
        "metadata": json.dumps(metadata),
        "created": "2025-01-01T00:00:00Z",
    }


def crio_node(
    root: Path,
    *,
    sandboxes: tuple[str, ...] = (IDS[0],),
    file_name: str = "containers.json",
    graph: str = GRAPH,
    extra: tuple[dict[str, Any], ...] = (),
) -> None:
    """CRI-O's storage with pod sandboxes (each with its config.json) and whatever else."""
    entries = [storage_entry(i, crio_metadata(i)) for i in sandboxes]
    write(root, f"{graph}/overlay-containers/{file_name}", json.dumps([*entries, *extra]))
    for sandbox_id in sandboxes:
        spec = {"ociVersion": "1.0.2", "annotations": {"io.kubernetes.cri-o.SandboxID": "x"}}
        write(
            root, f"{graph}/overlay-containers/{sandbox_id}/userdata/config.json", json.dumps(spec)
        )


def userdata(root: Path, sandbox_id: str) -> Path:
    return root / GRAPH.lstrip("/") / "overlay-containers" / sandbox_id / "userdata"


def test_after_a_reboot_crio_dels_the_sandboxes_it_can_read_back(tmp_path: Path) -> None:
    crio_node(
        tmp_path,
        sandboxes=(IDS[0], IDS[1], IDS[2], IDS[3]),
        extra=(
            storage_entry(IDS[4], crio_metadata(IDS[0], pod=False)),  # a container of a pod
            storage_entry(IDS[5], {"name": "podman-ctr", "created-at": 1}),  # not CRI-O's
            storage_entry(IDS[6], {"pod": True, "pod-name": "", "pod-id": ""}),
        ),
    )
    (userdata(tmp_path, IDS[1]) / "config.json").unlink()
    (userdata(tmp_path, IDS[2]) / "config.json").write_bytes(b"")
    (userdata(tmp_path, IDS[3]) / "network-stopped").write_bytes(b"")
    found = inventory_of(tmp_path)
    assert found.unreadable == ()
    assert found.known == {IDS[0]}
    assert [found.knows(i) for i in IDS[:7]] == [True, False, False, False, False, False, False]
    assert "CRI-O DELs its sandboxes at start" in found.describe(IDS[0])
    assert "config.json is missing (it is written after the CNI ADD)" in found.describe(IDS[1])
    assert "config.json is not a JSON object" in found.describe(IDS[2])
    assert "ran its DEL already" in found.describe(IDS[3])
    assert found.sources[-1] == (
        f"cri-o: {host(tmp_path, GRAPH)}: overlay-containers/containers.json: 4 sandboxes "
        "(1 known, 3 dropped); rebooted "
        f"({host(tmp_path, '/run/crio/version')} missing) after a clean shutdown: CRI-O DELs its "
        "sandboxes at start"
    )


def test_crio_volatile_containers_are_read_too(tmp_path: Path) -> None:
    crio_node(tmp_path, sandboxes=(IDS[0],))
    crio_node(tmp_path, sandboxes=(IDS[1],), file_name="volatile-containers.json")
    found = inventory_of(tmp_path)
    assert found.known == {IDS[0], IDS[1]}
    assert (
        "overlay-containers/containers.json, overlay-containers/volatile-containers.json"
        in (found.sources[-1])
    )


def test_crio_started_in_this_boot_knows_its_sandboxes(tmp_path: Path) -> None:
    crio_node(tmp_path)
    write(tmp_path, "/run/crio/version", '"1.28.1"')
    write(tmp_path, "/var/lib/crio/clean.shutdown.supported", "")  # no wipe: not a reboot
    symlink(tmp_path, WANTS_LINK, "/usr/lib/systemd/system/crio-wipe.service")
    found = inventory_of(tmp_path)
    assert found.known == {IDS[0]}
    assert "CRI-O has started in this boot" in found.describe(IDS[0])


def unclean(root: Path) -> None:
    write(root, "/var/lib/crio/clean.shutdown.supported", "")


def test_crio_wipe_after_an_unclean_shutdown_drops_them_all(tmp_path: Path) -> None:
    crio_node(tmp_path, sandboxes=(IDS[0], IDS[1]))
    unclean(tmp_path)
    symlink(tmp_path, WANTS_LINK, "/usr/lib/systemd/system/crio-wipe.service")
    found = inventory_of(tmp_path)
    assert found.known == frozenset()
    assert found.knows(IDS[0]) is False
    assert "runs `crio wipe`, which removes CRI-O's storage without CNI DEL" in (
        found.describe(IDS[1])
    )


def test_a_masked_crio_wipe_does_not_run(tmp_path: Path) -> None:
    crio_node(tmp_path)
    unclean(tmp_path)
    write(tmp_path, "/etc/crio/crio.conf", "[crio]\ninternal_repair = false\n")
    symlink(tmp_path, WANTS_LINK, "/usr/lib/systemd/system/crio-wipe.service")
    symlink(tmp_path, "/etc/systemd/system/crio-wipe.service", "/dev/null")
    assert inventory_of(tmp_path).knows(IDS[0]) is True


def test_after_an_unclean_shutdown_crio_repair_makes_them_undecided(tmp_path: Path) -> None:
    crio_node(tmp_path)
    unclean(tmp_path)
    found = inventory_of(tmp_path)
    assert found.undecided == {IDS[0]}
    assert found.knows(IDS[0]) is None
    assert "internal_repair" in found.describe(IDS[0])
    write(tmp_path, "/etc/crio/crio.conf.d/10-repair.conf", "[crio]\ninternal_repair = false\n")
    assert inventory_of(tmp_path).knows(IDS[0]) is True
    (tmp_path / "var/lib/crio/clean.shutdown").write_text("")  # a clean shutdown after all
    (tmp_path / "etc/crio/crio.conf.d/10-repair.conf").unlink()
    assert inventory_of(tmp_path).knows(IDS[0]) is True


def test_crio_wipe_without_internal_wipe_drops_them_after_any_reboot(tmp_path: Path) -> None:
    crio_node(tmp_path)
    symlink(tmp_path, WANTS_LINK, "/usr/lib/systemd/system/crio-wipe.service")
    assert inventory_of(tmp_path).knows(IDS[0]) is True
    write(tmp_path, "/etc/crio/crio.conf", "[crio]\ninternal_wipe = false\n")
    found = inventory_of(tmp_path)
    assert found.knows(IDS[0]) is False
    assert "internal_wipe = false" in found.describe(IDS[0])


def test_crio_config_moves_its_files(tmp_path: Path) -> None:
    """version_file, clean_shutdown_file and the graph root (storage.conf) as configured."""
    write(tmp_path, "/etc/containers/storage.conf", '[storage]\ngraphroot = "/data/storage"\n')
    write(
        tmp_path,
        "/etc/crio/crio.conf",
        '[crio]\nversion_file = "/run/mine/version"\nclean_shutdown_file = "/data/clean"\n',
    )
    crio_node(tmp_path, graph="/data/storage")
    write(tmp_path, "/data/clean.supported", "")
    write(tmp_path, "/run/crio/version", '"1.28.1"')  # not the configured one
    found = inventory_of(tmp_path)
    assert found.undecided == {IDS[0]}, found.describe(IDS[0])
    write(tmp_path, "/run/mine/version", '"1.28.1"')
    assert inventory_of(tmp_path).known == {IDS[0]}


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (b"[{", "not JSON"),
        (b'{"id": "x"}', "not a JSON list"),
        (b'[{"names": []}]', "a container without an id"),
        (
            b'[{"id": "../x", "metadata": "{\\"pod\\": true, \\"pod-name\\": \\"p\\", '
            b'\\"pod-id\\": \\"i\\"}"}]',
            "a container ID that is no file name",
        ),
        # containers/storage decodes metadata into a string: the file fails to load whole
        (b'[{"id": "a", "metadata": 7}]', "container a's metadata is no string"),
        (b'[{"id": "a", "metadata": {"pod": true}}]', "container a's metadata is no string"),
    ],
)
def test_crio_storage_that_cannot_be_read(tmp_path: Path, content: bytes, problem: str) -> None:
    path = write(tmp_path, f"{GRAPH}/overlay-containers/containers.json", content)
    found = inventory_of(tmp_path)
    assert len(found.unreadable) == 1
    assert found.unreadable[0].startswith(f"cri-o: {path}: {problem}")
    assert found.knows(IDS[0]) is None


def test_an_empty_containers_json_is_an_empty_store_that_says_nothing_of_pods(
    tmp_path: Path,
) -> None:
    """Read, not unreadable; but an empty store (podman's, buildah's, or CRI-O's own after a
    wipe) is no proof that no runtime knows a sandbox: the IDs missing from it are not dropped."""
    path = write(tmp_path, f"{GRAPH}/overlay-containers/containers.json", b"")
    found = inventory_of(tmp_path)
    assert found.unreadable == ()
    assert found.sources[-1] == (
        f"cri-o: {host(tmp_path, GRAPH)}: overlay-containers/containers.json: "
        "no container with CRI-O's pod metadata: not CRI-O's records"
    )
    assert found.knows(IDS[0]) is None
    assert path.exists()
