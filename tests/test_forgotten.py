"""Whole results entries of sandboxes no runtime will tear down: the runtime's records on disk
(a real bbolt meta.db in containerd's layout) say which it will; the others get the DEL libcni's
GC would run, with their cached result, args and config, then go to the quarantine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from cni_reaper.errors import ExitCode
from tests.bolt_writer import containerd_sandbox, sandbox_metadata, write_db
from tests.crashed import Crashed, by_path
from tests.nodetree import CONTAINER_IDS, cache_entry_bytes

META_DB = "var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db"
KNOWN, FORGOTTEN, DROPPED = CONTAINER_IDS[:3]


def containerd_knows(crashed: Crashed, *records: list[Any]) -> None:
    path = crashed.node.root / META_DB
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
