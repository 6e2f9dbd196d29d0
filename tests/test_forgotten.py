"""Whole results entries of sandboxes no runtime will tear down: the runtime's records on disk
(a real bbolt meta.db in containerd's layout) say which it will; the others get the DEL libcni's
GC would run, with their cached result, args and config, then go to the quarantine."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cni_reaper.errors import ExitCode
from cni_reaper.runtime.inventory import META_DB
from tests.bolt_writer import containerd_sandbox, put, sandbox_metadata, write_db
from tests.crashed import Crashed, by_path
from tests.nodetree import CONTAINER_IDS, cache_entry_bytes
from tests.runtime_layouts import CRIO_PACKAGED_UNIT, CRIO_STOCK_SYSCONFIG, crio_knows

KNOWN, FORGOTTEN, DROPPED = CONTAINER_IDS[:3]


def containerd_knows(
    crashed: Crashed, *records: list[Any], root: str = "/var/lib/containerd"
) -> None:
    """A meta.db under containerd's root (its default, or where another config puts it)."""
    path = crashed.node.root / root.lstrip("/") / META_DB
    path.parent.mkdir(parents=True, exist_ok=True)
    write_db(path, [[op for ops in records for op in ops]], no_freelist_sync=True)


def test_entries_of_sandboxes_containerd_forgot_are_deleted_and_their_addresses_freed(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    for container_id in (KNOWN, FORGOTTEN, DROPPED):
        crashed.add(container_id)
    held = crashed.ips()
    containerd_knows(
        crashed,
        containerd_sandbox("k8s.io", KNOWN),
        # a record containerd's CRI cannot load: it never DELs it
        containerd_sandbox("k8s.io", DROPPED, with_extension=False),
    )
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert code == ExitCode.OK, report
    entries = by_path(report)
    kept = entries[f"hl-{KNOWN}-eth0"]
    assert (kept["action"], kept["outcome"]) == ("keep", "skipped")
    assert "a runtime" in kept["reason"] or "containerd" in kept["reason"]
    for container_id in (FORGOTTEN, DROPPED):
        entry = entries[f"hl-{container_id}-eth0"]
        assert (entry["action"], entry["outcome"]) == ("del-and-quarantine", "done"), entry
        assert "no runtime will know" in entry["reason"]
        assert entry["del"]["plugins_run"] == ["host-local"]
        assert len(entry["del"]["released"]) == 1
        assert not (crashed.node.results / f"hl-{container_id}-eth0").exists()
    assert list(crashed.ips().values()) == [f"{KNOWN}\r\neth0"]
    assert (crashed.node.results / f"hl-{KNOWN}-eth0").exists()
    (pool,) = report["pools"]
    assert (pool["reserved_before"], pool["released"], pool["left_by_owner"]) == (
        3,
        2,
        {"runtime": 1},
    )
    assert report["host_local"] == []
    assert any("meta.db: 2 sandboxes" in line for line in report["runtime_records"])
    assert len(held) == 3


def test_a_sandbox_whose_add_never_saved_its_result_is_deleted_whole(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """The crash campaign's seed 2002 on Debian 13: the kernel died inside a RunPodSandbox, after
    libcni had written a whole entry and before containerd saved the CNI result in its record.
    containerd 1.7.24 never DELs such a sandbox, so its entry (there, a cni-loopback one) was
    left for good; had it been a host-local network's, its address too. The reaper DELs the
    entry as a forgotten sandbox's and moves it away; a release that does DEL it later finds
    nothing left to undo."""
    for container_id in (KNOWN, FORGOTTEN):
        crashed.add(container_id)
    containerd_knows(
        crashed,
        containerd_sandbox("k8s.io", KNOWN),
        containerd_sandbox(
            "k8s.io", FORGOTTEN, metadata=sandbox_metadata(FORGOTTEN, cni_result=False)
        ),
    )
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert code == ExitCode.OK, report
    entry = by_path(report)[f"hl-{FORGOTTEN}-eth0"]
    assert (entry["action"], entry["outcome"]) == ("del-and-quarantine", "done"), entry
    assert "whose CNI ADD never saved its result" in entry["reason"], entry["reason"]
    assert len(entry["del"]["released"]) == 1
    assert not (crashed.node.results / f"hl-{FORGOTTEN}-eth0").exists()
    assert list(crashed.ips().values()) == [f"{KNOWN}\r\neth0"]
    assert any(
        line.endswith("2 sandboxes (namespace k8s.io: 2), 1 whose CNI ADD never saved its result")
        for line in report["runtime_records"]
    ), report["runtime_records"]


def test_the_del_carries_the_cached_result_args_and_capabilities(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """What libcni's DelNetworkList hands each plugin for a cached attachment: the result as
    prevResult at the config's cniVersion, the cached CNI_ARGS, runtimeConfig from the cached
    capability args the plugin asks for. The network is no longer in the conf dirs: the config
    cached in the entry is used."""
    seen = tmp_path / "seen"
    bin_dir = crashed.node.fake_plugin_network(
        "fg", "record", f'cat > "{seen}.stdin"; echo "$CNI_ARGS" > "{seen}.args"\n'
    )
    conf = {
        "cniVersion": "0.4.0",
        "name": "fg",
        "plugins": [{"type": "record", "capabilities": {"portMappings": True}}],
    }
    (crashed.node.conf_dir / "60-fg.conflist").unlink()
    result = {
        "cniVersion": "1.0.0",
        "dns": {},
        "interfaces": [{"name": "eth0"}],
        "ips": [{"address": "10.60.0.4/24", "interface": 0}],
    }
    doc = json.loads(cache_entry_bytes(json.dumps(conf).encode(), "fg", FORGOTTEN, "eth0", result))
    doc["capabilityArgs"] = {"portMappings": [{"HostPort": 80, "ContainerPort": 8080}], "dns": {}}
    crashed.node.write_result(f"fg-{FORGOTTEN}-eth0", json.dumps(doc).encode())
    containerd_knows(crashed, containerd_sandbox("k8s.io", KNOWN))
    crashed.reboot()

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir))

    entry = by_path(report)[f"fg-{FORGOTTEN}-eth0"]
    assert (entry["outcome"], code) == ("done", ExitCode.OK), entry
    assert entry["del"]["config"] == f"the config cached in fg-{FORGOTTEN}-eth0"
    stdin = json.loads(Path(f"{seen}.stdin").read_text())
    assert stdin["prevResult"] == {
        "cniVersion": "0.4.0",
        "dns": {},
        "interfaces": [{"name": "eth0"}],
        "ips": [{"address": "10.60.0.4/24", "interface": 0, "version": "4"}],
    }
    assert stdin["runtimeConfig"] == {"portMappings": [{"HostPort": 80, "ContainerPort": 8080}]}
    assert Path(f"{seen}.args").read_text().strip() == (
        f"IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_INFRA_CONTAINER_ID={FORGOTTEN}"
    )


def test_a_whole_entry_of_this_boot_is_kept_whatever_the_records_say(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    containerd_knows(crashed, containerd_sandbox("k8s.io", KNOWN))
    crashed.reboot()
    assert crashed.run(capsys)[0] == ExitCode.OK  # the unit's run: this boot's record
    crashed.node.runtime_starts()
    crashed.add(FORGOTTEN)  # the runtime's ADD in this boot, its sandbox not yet persisted
    held = crashed.ips()

    code, report = crashed.run(capsys, "--force")

    entry = by_path(report)[f"hl-{FORGOTTEN}-eth0"]
    assert (entry["written"], entry["action"]) == ("current-boot", "keep")
    assert crashed.ips() == held
    assert code == ExitCode.OK


def test_under_root_a_cached_config_naming_a_data_dir_the_plugins_would_not_see_runs_no_del(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Plugins run confined to the root's standard CNI dirs and the conf dirs' dataDirs; a
    dataDir only a cached config names would be this machine's own: no DEL through it."""
    ipam = {"type": "host-local", "subnet": "10.61.0.0/24", "dataDir": "/srv/ipam-elsewhere"}
    conf = {"cniVersion": "1.0.0", "name": "fx", "plugins": [{"type": "host-local", "ipam": ipam}]}
    crashed.node.write_result(
        f"fx-{FORGOTTEN}-eth0",
        cache_entry_bytes(json.dumps(conf).encode(), "fx", FORGOTTEN, "eth0"),
    )
    containerd_knows(crashed, containerd_sandbox("k8s.io", KNOWN))
    crashed.reboot()

    code, report = crashed.run(capsys)

    entry = by_path(report)[f"fx-{FORGOTTEN}-eth0"]
    assert entry["action"] == "del-and-quarantine"
    assert "/srv/ipam-elsewhere is not one the plugins see" in entry["del"]["config_problem"]
    assert entry["del"]["plugins_run"] == []
    assert (entry["outcome"], code) == ("failed", ExitCode.ACTION_FAILED)


# Records of the same software that no CRI wrote, and CRI records kept where the reaper does
# not look: a whole entry is called forgotten only from a CRI runtime's own records.


def write_file(crashed: Crashed, node_path: str, data: str | bytes) -> Path:
    path = crashed.node.root / node_path.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    return path


def dockers_containerd(crashed: Crashed) -> None:
    """containerd.io as Docker installs it: the CRI turned off, a database all the same, with
    Docker's namespace only."""
    write_file(crashed, "/etc/containerd/config.toml", 'disabled_plugins = ["cri"]\n')
    labels = ["v1", "moby", "containers", "c" * 64, "labels"]
    containerd_knows(crashed, [put(labels, "com.docker", "1")])


def podmans_storage(crashed: Crashed) -> None:
    """podman or buildah run once on the node: containers/storage's default graph root, whose
    containers carry no CRI-O pod metadata."""
    metadata = json.dumps({"name": "buildah-working-container"})
    containers = json.dumps([{"id": "d" * 64, "metadata": metadata}])
    write_file(
        crashed, "/var/lib/containers/storage/overlay-containers/containers.json", containers
    )


def k3s_with_its_data_dir_in_a_variable(crashed: Crashed) -> None:
    """k3s started with --data-dir from a variable of its unit's environment, which the reaper
    does not expand: its containerd's records, which know the sandbox, are under /data/k3s."""
    unit = (
        "[Service]\nEnvironmentFile=-/etc/default/%N\nExecStart=/usr/local/bin/k3s server $ARGS\n"
    )
    write_file(crashed, "/etc/systemd/system/k3s.service", unit)
    write_file(crashed, "/etc/default/k3s", "ARGS=--data-dir /data/k3s\n")
    containerd_knows(
        crashed, containerd_sandbox("k8s.io", KNOWN), root="/data/k3s/agent/containerd"
    )


def containerd_rooted_by_a_variable(crashed: Crashed) -> None:
    """containerd started with --root by a drop-in of its unit, through a variable."""
    write_file(crashed, "/etc/containerd/config.toml", "version = 2\n")
    unit = "[Service]\nExecStart=\nExecStart=/usr/bin/containerd ${ROOT_FLAGS}\n"
    write_file(crashed, "/etc/systemd/system/containerd.service.d/10-root.conf", unit)
    containerd_knows(crashed, containerd_sandbox("k8s.io", KNOWN), root="/srv/containerd")


def containerd_on_a_volume_not_mounted_yet(crashed: Crashed) -> None:
    """/var/lib/containerd on a nofail volume, which local-fs.target does not wait for: an
    empty mount point when the reaper runs."""
    write_file(crashed, "/etc/containerd/config.toml", "version = 2\n")
    (crashed.node.root / "var/lib/containerd").mkdir(parents=True)


def cri_dockerd(crashed: Crashed) -> None:
    """Docker Engine through cri-dockerd: its sandboxes are Docker's containers, which it
    tears down itself."""
    config = {"ID": KNOWN, "Config": {"Labels": {"io.kubernetes.docker.type": "podsandbox"}}}
    write_file(crashed, f"/var/lib/docker/containers/{KNOWN}/config.v2.json", json.dumps(config))


@pytest.mark.parametrize(
    ("elsewhere", "others"),
    [
        (k3s_with_its_data_dir_in_a_variable, dockers_containerd),
        (k3s_with_its_data_dir_in_a_variable, podmans_storage),
        (containerd_rooted_by_a_variable, podmans_storage),
        (containerd_on_a_volume_not_mounted_yet, podmans_storage),
        (cri_dockerd, dockers_containerd),
    ],
)
def test_records_no_cri_wrote_prove_no_sandbox_forgotten(
    crashed: Crashed,
    capsys: pytest.CaptureFixture[str],
    elsewhere: Callable[[Crashed], None],
    others: Callable[[Crashed], None],
) -> None:
    """The runtime that made the entry keeps its records where the reaper does not look; the
    records it does find are another program's. Called forgotten, the entry would be DEL'd
    with the reaper's plugins and moved away from under the runtime that still knows it."""
    crashed.add(KNOWN)
    held = crashed.ips()
    elsewhere(crashed)
    others(crashed)
    crashed.reboot()

    code, report = crashed.run(capsys)

    entry = by_path(report)[f"hl-{KNOWN}-eth0"]
    assert (entry["action"], entry["outcome"]) == ("keep", "skipped"), entry
    # No records of a CRI runtime found; or found, and a unit that may move them.
    assert (
        "no CRI runtime's sandbox records found on this node" in entry["reason"]
        or "in none of the records read, which may not be all" in entry["reason"]
    ), entry["reason"]
    assert (crashed.node.results / f"hl-{KNOWN}-eth0").exists()
    assert crashed.ips() == held
    assert code == ExitCode.OK
    assert any(
        "not the CRI's records" in line or "not CRI-O's records" in line
        for line in report["runtime_records"]
    ), report["runtime_records"]


K3S_INSTALLED_WITH = (
    "[Service]\nExecStart=/usr/local/bin/k3s \\\n    server \\\n"
    "\t'--data-dir' \\\n\t'/data/k3s' \\\n\n"
)


def k3s_moved_by_a_config_yaml_drop_in(crashed: Crashed) -> tuple[str, str]:
    write_file(crashed, "/etc/rancher/k3s/config.yaml", "write-kubeconfig-mode: '0644'\n")
    write_file(crashed, "/etc/rancher/k3s/config.yaml.d/50-volume.yaml", 'data-dir: "/data/k3s"\n')
    return "k3s", "/data/k3s/agent/containerd"


def k3s_moved_on_its_installers_command_line(crashed: Crashed) -> tuple[str, str]:
    """INSTALL_K3S_EXEC="--data-dir /data/k3s": each argument quoted on a line of its own."""
    write_file(crashed, "/etc/systemd/system/k3s.service", K3S_INSTALLED_WITH)
    write_file(crashed, "/etc/rancher/k3s/config.yaml", "data-dir: /var/lib/rancher/k3s\n")
    return "k3s", "/data/k3s/agent/containerd"


def containerd_rooted_by_a_drop_in_of_its_unit(crashed: Crashed) -> tuple[str, str]:
    write_file(crashed, "/etc/containerd/config.toml", "version = 2\nroot = '/var/lib/c'\n")
    write_file(
        crashed,
        "/lib/systemd/system/containerd.service",
        "[Service]\nExecStart=/usr/bin/containerd\n",
    )
    unit = "[Service]\nExecStart=\nExecStart=/usr/bin/containerd --root=/srv/containerd\n"
    write_file(crashed, "/etc/systemd/system/containerd.service.d/10-root.conf", unit)
    return "containerd", "/srv/containerd"


def containerd_configured_by_its_unit(crashed: Crashed) -> tuple[str, str]:
    write_file(crashed, "/etc/containerd/node.toml", "version = 2\nroot = '/srv/containerd'\n")
    unit = "[Service]\nExecStart=/usr/bin/containerd -c /etc/containerd/node.toml\n"
    write_file(crashed, "/etc/systemd/system/containerd.service", unit)
    return "containerd", "/srv/containerd"


def crio_packaged(crashed: Crashed, sysconfig: str) -> None:
    write_file(crashed, "/usr/lib/systemd/system/crio.service", CRIO_PACKAGED_UNIT)
    alias = crashed.node.root / "etc/systemd/system/cri-o.service"
    alias.parent.mkdir(parents=True, exist_ok=True)
    alias.symlink_to("/usr/lib/systemd/system/crio.service")
    write_file(crashed, "/etc/sysconfig/crio", sysconfig)
    write_file(crashed, "/etc/crio/crio.conf", "[crio]\n")


def crio_moved_by_its_packaged_units_options(crashed: Crashed) -> tuple[str, str]:
    """The operator's options in /etc/sysconfig/crio, which the packaged unit expands."""
    options = 'CRIO_STORAGE_OPTIONS="--root /data/crio --runroot /run/data-crio"\n'
    crio_packaged(
        crashed, CRIO_STOCK_SYSCONFIG + options + "CRIO_METRICS_OPTIONS=--enable-metrics\n"
    )
    return "cri-o", "/data/crio"


def crio_moved_by_its_config_under_its_packaged_unit(crashed: Crashed) -> tuple[str, str]:
    """The packaged unit and its stock options, none set: the config's root holds."""
    crio_packaged(crashed, CRIO_STOCK_SYSCONFIG)
    write_file(crashed, "/etc/crio/crio.conf.d/10-root.conf", "[crio]\nroot = '/srv/crio'\n")
    return "cri-o", "/srv/crio"


@pytest.mark.parametrize(
    "moved",
    [
        k3s_moved_by_a_config_yaml_drop_in,
        k3s_moved_on_its_installers_command_line,
        containerd_rooted_by_a_drop_in_of_its_unit,
        containerd_configured_by_its_unit,
        crio_moved_by_its_packaged_units_options,
        crio_moved_by_its_config_under_its_packaged_unit,
    ],
)
def test_records_are_read_where_the_runtime_keeps_them(
    crashed: Crashed,
    capsys: pytest.CaptureFixture[str],
    moved: Callable[[Crashed], tuple[str, str]],
) -> None:
    """A runtime's records moved by its config or its unit's command line: read there, they
    say which sandbox it will still tear down, and the other is forgotten."""
    crashed.add(KNOWN)
    crashed.add(FORGOTTEN)
    runtime, root = moved(crashed)
    if runtime == "cri-o":
        records = crio_knows(crashed.node.root, root, KNOWN)
        said = f"cri-o: {records.parents[1]}: overlay-containers/containers.json: 1 sandbox"
    else:
        containerd_knows(crashed, containerd_sandbox("k8s.io", KNOWN), root=root)
        said = f"{runtime}: {crashed.node.root / root.lstrip('/') / META_DB}: 1 sandbox"
    crashed.reboot()

    code, report = crashed.run(capsys)

    entries = by_path(report)
    kept, forgotten = entries[f"hl-{KNOWN}-eth0"], entries[f"hl-{FORGOTTEN}-eth0"]
    assert (kept["action"], kept["outcome"]) == ("keep", "skipped"), kept
    assert runtime in kept["reason"]
    assert (forgotten["action"], forgotten["outcome"]) == ("del-and-quarantine", "done")
    assert list(crashed.ips().values()) == [f"{KNOWN}\r\neth0"]
    assert any(line.startswith(said) for line in report["runtime_records"]), report
    assert code == ExitCode.OK


LATIN_1 = b"# r\xe9pertoire\n"  # Go's TOML reader takes it in a comment, the reaper does not
NOT_READ_WHOLE = "could not be read whole"


@pytest.mark.parametrize(
    ("config", "data", "warned"),
    [
        ("/etc/containerd/config.toml", LATIN_1 + b"root = '/data/c'\n", NOT_READ_WHOLE),
        ("/etc/crio/crio.conf.d/10-root.conf", LATIN_1 + b"[crio]\nroot = '/c'\n", NOT_READ_WHOLE),
        ("/etc/rancher/k3s/config.yaml", b"v: &v /data/k3s\ndata-dir: *v\n", "k3s: its data-dir"),
    ],
)
def test_a_runtime_config_not_read_whole_proves_no_sandbox_forgotten(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], config: str, data: bytes, warned: str
) -> None:
    """The runtime's config, which may move its records, could not be read (Latin-1 in a
    comment: Go's TOML reader takes it, the reaper does not; a YAML alias the reaper does not
    follow): the CRI records found at the default root may not be the ones the runtime starts
    with."""
    crashed.add(FORGOTTEN)
    held = crashed.ips()
    write_file(crashed, config, data)
    if "crio" in config:
        write_file(crashed, "/etc/crio/crio.conf", "[crio]\n")
        crio_knows(crashed.node.root, "/var/lib/containers/storage", KNOWN)
    else:
        containerd_knows(crashed, containerd_sandbox("k8s.io", KNOWN))
    crashed.reboot()

    code, report = crashed.run(capsys)

    entry = by_path(report)[f"hl-{FORGOTTEN}-eth0"]
    assert (entry["action"], entry["outcome"]) == ("keep", "skipped"), entry
    assert crashed.ips() == held
    assert (crashed.node.results / f"hl-{FORGOTTEN}-eth0").exists()
    assert any(warned in w for w in report["warnings"]), report["warnings"]
    assert code == ExitCode.OK
