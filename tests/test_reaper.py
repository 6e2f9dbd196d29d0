"""The whole pipeline on temp trees, in process, with the real host-local plugin doing the DEL.

host-local run as the only plugin of a network touches nothing but its own store, so these tests
need no root and no namespace; bridge and ptp are in test_netns.py.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from pathlib import Path

import pytest

from cni_reaper import cli
from cni_reaper.errors import ExitCode
from cni_reaper.lock import RunLock
from cni_reaper.paths import NodePaths
from tests.crashed import Crashed, by_path
from tests.libcni import add_network_list, reserved_ips
from tests.nodetree import (
    CONTAINER_IDS,
    PLUGIN_DIR,
    cache_entry_bytes,
    have_plugins,
    host_local_conflist,
    snapshot,
)


@pytest.fixture(autouse=True)
def _plugins() -> None:
    if not have_plugins():
        if os.environ.get("CI") == "true":
            pytest.fail(f"containernetworking-plugins is not installed in {PLUGIN_DIR}")
        pytest.skip(f"containernetworking-plugins is not installed in {PLUGIN_DIR}")


def test_damaged_attachments_are_deleted_and_quarantined(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    valid, empty, zeroed, cut = (crashed.add(cid) for cid in CONTAINER_IDS[:4])
    valid_bytes = valid.read_bytes()
    empty.write_bytes(b"")
    zeroed.write_bytes(b"\0" * zeroed.stat().st_size)
    cut.write_bytes(cut.read_bytes()[:57])
    crashed.reboot()
    assert len(crashed.ips()) == 4

    code, report = crashed.run(capsys)

    assert code == ExitCode.OK
    # Only the valid attachment still holds an IP: host-local's DEL released the others.
    assert list(crashed.ips().values()) == [f"{CONTAINER_IDS[0]}\r\neth0"]
    assert valid.read_bytes() == valid_bytes
    assert sorted(os.listdir(crashed.node.results)) == [valid.name]
    qdir = crashed.node.quarantine / "11111111-2222-3333-4444-555555555555"
    for damaged, content in ((empty, "empty"), (zeroed, "zeroed"), (cut, "truncated")):
        sidecar = json.loads((qdir / (damaged.name + ".json")).read_text())
        assert (qdir / damaged.name).is_file()
        assert sidecar["content"] == content
        assert sidecar["del"]["ok"] is True
        assert sidecar["del"]["plugins_run"] == ["host-local"]
        entry = by_path(report)[damaged.name]
        assert (entry["action"], entry["outcome"], entry["written"]) == (
            "del-and-quarantine",
            "done",
            "previous-boot",
        )
        assert "which crashed" in entry["evidence"]
        assert entry["writing_boot"]["crashed"] is True
    assert by_path(report)[valid.name]["action"] == "keep"
    assert report["summary"]["outcome"] == {"done": 3, "skipped": 1}
    assert report["boot"]["previous_boot_crashed"] is True


def test_dry_run_changes_nothing_and_prints_the_plan(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed.add(CONTAINER_IDS[0])
    crashed.add(CONTAINER_IDS[1]).write_bytes(b"")
    crashed.reboot()
    before = snapshot(crashed.node.root.parent)

    code, report = crashed.run(capsys, "--dry-run")

    assert snapshot(crashed.node.root.parent) == before
    assert code == ExitCode.OK
    entry = by_path(report)[f"hl-{CONTAINER_IDS[1]}-eth0"]
    assert (entry["action"], entry["outcome"]) == ("del-and-quarantine", "planned")
    assert entry["del"]["plugins"] == ["host-local"]
    assert report["dry_run"] is True

    assert cli.run(crashed.argv("--dry-run"), clock=lambda: crashed.t0 + 60) == ExitCode.OK
    text = capsys.readouterr().out
    assert (
        f"hl-{CONTAINER_IDS[1]}-eth0: empty (0 bytes), "
        "previous-boot -> del-and-quarantine [planned]" in text
    )
    assert "DEL hl from" in text


def test_damage_written_in_this_boot_is_left_alone(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed.add(CONTAINER_IDS[1])  # a pod of the earlier boot, whose cache file is whole
    crashed.reboot()
    code, _ = crashed.run(capsys)  # the unit's run at boot: nothing to do, the record is taken
    assert code == ExitCode.OK
    crashed.node.runtime_starts()
    path = crashed.add(CONTAINER_IDS[0])  # a pod set up in this boot, its cache write cut short
    path.write_bytes(b"")

    code, report = crashed.run(capsys)  # by hand, later in the boot, the runtime stopped

    assert code == ExitCode.DATA
    assert path.read_bytes() == b""
    assert len(crashed.ips()) == 2
    entry = by_path(report)[path.name]
    assert (entry["written"], entry["action"], entry["outcome"]) == (
        "current-boot",
        "leave",
        "skipped",
    )
    assert "not in this boot's pre-runtime record" in entry["evidence"]


@pytest.mark.parametrize("clock", ["stepped back before the boot", "stepped ahead a day"])
def test_the_clocks_do_not_decide(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], clock: str
) -> None:
    """What the first run of the boot found before any runtime started is repaired whatever
    the clock says; with no such record, nothing is, whatever the clock says."""
    now = crashed.t0 - 1000 if clock.endswith("before the boot") else crashed.t0 + 86400
    path = crashed.add(CONTAINER_IDS[0])
    path.write_bytes(b"")
    crashed.reboot()
    crashed.node.runtime_starts()
    code = cli.run(crashed.argv("--json"), clock=lambda: now)
    entry = by_path(json.loads(capsys.readouterr().out))[path.name]
    assert code == ExitCode.DATA
    assert (entry["written"], entry["action"]) == ("unknown", "leave")
    assert "a runtime has started in this boot" in entry["evidence"]
    assert path.exists()

    crashed.node.write_boot_world(btime=crashed.t0 + 5, boot_id=str(uuid.uuid4()))  # a reboot
    code = cli.run(crashed.argv("--json"), clock=lambda: now)
    entry = by_path(json.loads(capsys.readouterr().out))[path.name]
    assert code == ExitCode.OK
    assert (entry["written"], entry["action"], entry["outcome"]) == (
        "previous-boot",
        "del-and-quarantine",
        "done",
    )
    assert not path.exists()
    assert crashed.ips() == {}


def test_network_without_config_is_still_quarantined_but_fails(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    path = crashed.node.write_result(f"gone-net-{CONTAINER_IDS[5]}-eth0", b"")
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert code == ExitCode.ACTION_FAILED
    entry = by_path(report)[path.name]
    assert entry["outcome"] == "failed"
    assert "no config for network 'gone-net'" in entry["plugin_errors"][0]["msg"]
    assert not path.exists()
    assert entry["quarantined_to"] and Path(entry["quarantined_to"]).is_file()


def test_cni_error_from_a_plugin_is_reported_and_the_file_still_quarantined(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    bin_dir = crashed.node.fake_plugin_network(
        "f",
        "failing",
        'echo \'{"cniVersion":"1.0.0","code":11,"msg":"try again","details":"busy"}\'\nexit 1\n',
    )
    path = crashed.node.write_result(f"f-{CONTAINER_IDS[6]}-eth0", b"\0" * 100)
    crashed.reboot()

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir))

    assert code == ExitCode.ACTION_FAILED
    entry = by_path(report)[path.name]
    assert entry["plugin_errors"] == [
        {
            "plugin": "failing",
            "code": 11,
            "msg": "try again",
            "details": "busy",
            "exit_status": 1,
            "timed_out": False,
        }
    ]
    assert not path.exists()


def test_hanging_plugin_is_killed_at_the_timeout(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    bin_dir = crashed.node.fake_plugin_network("h", "hang", "sleep 300 &\nsleep 300\n")
    crashed.node.write_result(f"h-{CONTAINER_IDS[7]}-eth0", b"")
    crashed.reboot()

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir), "--plugin-timeout", "0.5")

    assert code == ExitCode.ACTION_FAILED
    error = report["entries"][0]["plugin_errors"][0]
    assert error["timed_out"] is True
    assert "0.5 s timeout" in error["msg"]


def test_old_cni_version_is_only_quarantined(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed.node.write_conf(
        "40-old.conf",
        b'{"cniVersion":"0.3.1","name":"old","type":"host-local","ipam":{"type":"host-local"}}',
    )
    path = crashed.node.write_result(f"old-{CONTAINER_IDS[8]}-eth0", b"")
    loopback = crashed.node.write_result(f"cni-loopback-{CONTAINER_IDS[8]}-lo", b"")
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert code == ExitCode.OK
    for name in (path.name, loopback.name):
        entry = by_path(report)[name]
        assert (entry["action"], entry["outcome"], entry["plugin_errors"]) == (
            "quarantine",
            "done",
            [],
        )
        assert not (crashed.node.results / name).exists()


def test_seed_report_case(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """shared/seeds/000: 0-byte generic-veth ...-eth1, istio-cni ...-eth2 and a valid -eth0."""
    cid = "5bae61e683f7e59902f458514e9af1515d1c1c71ff069e9d4a2008a011307d04"
    for name, subnet in (
        ("generic-veth", "10.30.0.0/24"),
        ("istio-cni", "10.31.0.0/24"),
        ("k8s-pod-network", "10.32.0.0/24"),
    ):
        crashed.node.write_conf(f"50-{name}.conflist", host_local_conflist(name, subnet))
    for name, ifname in (
        ("k8s-pod-network", "eth0"),
        ("generic-veth", "eth1"),
        ("istio-cni", "eth2"),
    ):
        conflist = (crashed.node.conf_dir / f"50-{name}.conflist").read_bytes()
        add_network_list(conflist, cid, ifname, "/run/netns/seed", crashed.node.root)
    eth0 = crashed.node.results / f"k8s-pod-network-{cid}-eth0"
    eth0_bytes = eth0.read_bytes()
    for name in (f"generic-veth-{cid}-eth1", f"istio-cni-{cid}-eth2"):
        (crashed.node.results / name).write_bytes(b"")
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert code == ExitCode.OK
    assert os.listdir(crashed.node.results) == [eth0.name]
    assert eth0.read_bytes() == eth0_bytes
    assert reserved_ips(crashed.ipam, "generic-veth") == {}
    assert reserved_ips(crashed.ipam, "istio-cni") == {}
    assert list(reserved_ips(crashed.ipam, "k8s-pod-network").values()) == [f"{cid}\r\neth0"]
    entries = by_path(report)
    assert entries[f"generic-veth-{cid}-eth1"]["network"] == "generic-veth"
    assert entries[f"istio-cni-{cid}-eth2"]["ifname"] == "eth2"


def test_odd_entries_are_reported_and_never_touched(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    secret = tmp_path / "shadow"
    secret.write_text("root:x:0:0\n")
    results = crashed.node.results
    results.mkdir(parents=True)
    os.symlink(secret, results / f"hl-{CONTAINER_IDS[9]}-eth0")
    os.mkfifo(results / f"hl-{CONTAINER_IDS[10]}-eth0")
    (results / f"hl-{CONTAINER_IDS[11]}-eth0").mkdir()
    crashed.node.write_result(
        f"hl-{CONTAINER_IDS[12]}-eth0",
        cache_entry_bytes(b"{}", "other", CONTAINER_IDS[12], "eth0"),
    )
    crashed.node.write_result("no-way-to-split", b"")
    crashed.node.write_result(f"hl-{CONTAINER_IDS[13]}-eth0", b" " * ((1 << 20) + 1))
    listener = socket.socket(socket.AF_UNIX)
    cwd = os.getcwd()
    os.chdir(results)  # a socket path may not be longer than 107 bytes
    try:
        listener.bind(f"hl-{CONTAINER_IDS[14]}-eth0")
    finally:
        os.chdir(cwd)
    crashed.reboot()
    before = snapshot(crashed.node.root.parent)

    code, report = crashed.run(capsys)

    assert code == ExitCode.DATA
    after = snapshot(crashed.node.root.parent)
    # The run's own lock and boot evidence under /run, and its note of this run, are all it
    # may add.
    own = ("node/run", "node/var/lib/cni-reaper/last-run")
    assert {k: v for k, v in after.items() if not k.startswith(own)} == {
        **before,
        "node/var/lib/cni-reaper": ("dir", b"0o40700"),
    }
    contents = {e["path"]: (e["content"], e["action"]) for e in report["entries"]}
    assert contents == {
        f"hl-{CONTAINER_IDS[9]}-eth0": ("not-a-file", "report"),
        f"hl-{CONTAINER_IDS[10]}-eth0": ("not-a-file", "report"),
        f"hl-{CONTAINER_IDS[11]}-eth0": ("not-a-file", "report"),
        f"hl-{CONTAINER_IDS[12]}-eth0": ("mismatched", "report"),
        "no-way-to-split": ("empty", "report"),
        f"hl-{CONTAINER_IDS[13]}-eth0": ("oversized", "report"),
        f"hl-{CONTAINER_IDS[14]}-eth0": ("not-a-file", "report"),
    }
    listener.close()


def test_results_dir_that_is_a_symlink_is_refused(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / f"hl-{CONTAINER_IDS[0]}-eth0").write_bytes(b"")
    (crashed.node.root / "var/lib/cni").mkdir(parents=True)
    os.symlink(elsewhere, crashed.node.results)
    crashed.reboot()
    code = cli.main(crashed.argv())
    assert code == ExitCode.DATA
    assert "symlink" in capsys.readouterr().err
    assert (elsewhere / f"hl-{CONTAINER_IDS[0]}-eth0").exists()


def test_running_runtime_refuses_unless_forced(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    path = crashed.add(CONTAINER_IDS[0])
    path.write_bytes(b"")
    crashed.reboot()
    blocked = crashed.node.root / "blocked"
    blocked.write_text("")
    # The unit's run at boot: its DEL freed the address, but the quarantine was not there.
    code, _ = crashed.run(capsys, "--state-dir", str(blocked / "state"))
    assert code == ExitCode.ACTION_FAILED
    assert path.exists()
    assert crashed.ips() == {}
    with crashed.containerd_answering():
        assert cli.main(crashed.argv()) == ExitCode.REFUSED
        assert "answers on" in capsys.readouterr().err
        assert path.exists()
        # Forced, it acts on what the boot's record holds, the runtime up or not.
        code, report = crashed.run(capsys, "--force")
    assert code == ExitCode.OK
    assert not path.exists()
    assert by_path(report)[path.name]["written"] == "previous-boot"
    assert any("answers on" in w for w in report["warnings"])


def test_second_concurrent_run_is_refused(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed.reboot()
    with RunLock(NodePaths.build(root=str(crashed.node.root)).lock_file):
        assert cli.main(crashed.argv()) == ExitCode.REFUSED
    assert "another cni-reaper" in capsys.readouterr().err


def test_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--plugin-timeout", "soon"]) == ExitCode.USAGE
    assert "usage:" in capsys.readouterr().err
