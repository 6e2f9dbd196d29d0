"""Hostile or odd input: nothing crashes the run, escapes the inspected dirs, follows a symlink or
runs a program from outside the plugin dirs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cni_reaper import cli
from cni_reaper.errors import ExitCode
from tests.crashed import Crashed, by_path
from tests.nodetree import CONTAINER_IDS, PLUGIN_DIR, host_local_conflist, snapshot

CID = CONTAINER_IDS[20]


def canary(where: Path) -> Path:
    """A program that leaves a file behind if anything ever runs it."""
    ran = where.parent / f"{where.name}.ran"
    where.write_text(f"#!/bin/sh\ntouch {ran}\n")
    where.chmod(0o755)
    return ran


def test_symlinks_into_secrets_and_dirs_are_reported_never_followed(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    shadow = tmp_path / "shadow"
    shadow.write_text("root:$6$secret:19000:0:99999:7:::\n")
    results = crashed.node.results
    results.mkdir(parents=True)
    (results / f"hl-{CONTAINER_IDS[1]}-eth0").symlink_to(shadow)
    (results / f"hl-{CONTAINER_IDS[2]}-eth0").symlink_to(tmp_path)
    (results / f"hl-{CONTAINER_IDS[3]}-eth0").symlink_to("../../../../../../etc/passwd")
    crashed.reboot()
    before = snapshot(tmp_path)

    code, report = crashed.run(capsys)

    assert code == ExitCode.DATA
    for entry in report["entries"]:
        assert (entry["file"]["kind"], entry["content"], entry["action"]) == (
            "symlink",
            "not-a-file",
            "report",
        )
    after = snapshot(tmp_path)
    assert {
        k: v for k, v in after.items() if k == "shadow" or k.startswith("node/var/lib/cni/")
    } == {k: v for k, v in before.items() if k == "shadow" or k.startswith("node/var/lib/cni/")}


LONG_NETWORK = "n" * 185  # its file names have 255 bytes, the most a file system allows


@pytest.mark.parametrize(
    ("name", "plugin_says"),
    [
        (f"hl-{CID}-..", "interface name is . or .."),
        (f"hl-{CID}-eth0\n", "interface name contains / or : or whitespace characters"),
        (f"hl-{CID}-e\x1b[31mth", None),
        (f"hl-{CID}-" + os.fsdecode(b"\xff\xfe"), None),
        (f"{LONG_NETWORK}-{CID}-eth0", None),
    ],
    ids=["dotdot", "newline", "escape", "not-utf-8", "255-bytes"],
)
def test_odd_names_are_handled_inside_the_dirs(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], name: str, plugin_says: str | None
) -> None:
    assert len(os.fsencode(name)) <= 255
    crashed.node.write_conf(
        "50-long.conflist",
        host_local_conflist(LONG_NETWORK, "10.23.0.0/24"),
    )
    crashed.node.write_result(name, b"")
    crashed.reboot()

    text_code, text = run_text(crashed, capsys)
    code, report = crashed.run(capsys)

    entry = report["entries"][0]
    assert entry["content"] == "empty"
    assert entry["network"] in ("hl", LONG_NETWORK)
    # host-local itself refuses some interface names; the refusal is reported as it came, and
    # the file is quarantined all the same, as the policy says.
    if plugin_says is None:
        assert (entry["action"], entry["outcome"], code) == ("del-and-quarantine", "done", 0)
    else:
        assert (entry["action"], entry["outcome"], code) == ("del-and-quarantine", "failed", 73)
        assert entry["plugin_errors"][0]["msg"] == plugin_says
    # Moved, never further than the quarantine dir of this boot, with its sidecar beside it.
    moved = Path(entry["quarantined_to"])
    qdir = crashed.node.quarantine / "11111111-2222-3333-4444-555555555555"
    assert moved.parent == qdir
    assert moved.is_file()
    assert json.loads((qdir / (moved.name + ".json")).read_text())["path"] == entry["path"]
    assert not (crashed.node.results / name).exists()
    # The text report (of the dry run before) names the file, but never with raw control
    # characters or undecodable bytes.
    assert "del-and-quarantine [planned]" in text
    assert "\x1b" not in text and "\udcff" not in text and "eth0\n:" not in text
    assert text_code == ExitCode.OK


def test_a_name_that_is_another_files_quarantine_name(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """eth0.1 is a VLAN's interface name, and also what eth0 is quarantined as when eth0 is
    there already: two files moved in one batch each get a name, and a sidecar, of their own."""
    qdir = crashed.node.quarantine / "11111111-2222-3333-4444-555555555555"
    qdir.mkdir(parents=True)
    earlier = qdir / f"hl-{CID}-eth0"
    earlier.write_bytes(b"\0" * 8)
    (qdir / f"hl-{CID}-eth0.json").write_text('{"sha256": "from an earlier run"}\n')
    before = snapshot(qdir)
    for ifname in ("eth0", "eth0.1"):
        crashed.node.write_result(f"hl-{CID}-{ifname}", b"")
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert code == ExitCode.OK
    moved = {e["ifname"]: Path(e["quarantined_to"]) for e in report["entries"]}
    assert moved == {"eth0": qdir / f"hl-{CID}-eth0.1", "eth0.1": qdir / f"hl-{CID}-eth0.1.1"}
    for entry in report["entries"]:
        sidecar = json.loads(Path(entry["quarantined_to"] + ".json").read_text())
        assert sidecar["path"] == entry["path"]
    after = snapshot(qdir)
    assert {k: after[k] for k in before} == before


def test_sidecars_nested_past_the_decoders_depth_are_no_record(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """Sidecars in the quarantine, of a results entry and of a Multus file, that nest deeper
    than 3.9 to 3.11 decode: each is a sidecar that says nothing, never the end of the run."""
    qdir = crashed.node.quarantine / "11111111-2222-3333-4444-555555555555"
    (qdir / "multus").mkdir(parents=True)
    nested = "[" * 2000 + "]" * 2000
    (qdir / f"hl-{CID}-eth0").write_bytes(b"")
    (qdir / f"hl-{CID}-eth0.json").write_text(nested)
    (qdir / "multus" / f"{CID}.json").write_text(nested)
    crashed.node.write_result(f"hl-{CID}-eth0", b"")
    # Multus's sidecars are read where Multus keeps a cache and host-local a store.
    (crashed.node.root / "var/lib/cni/multus/results").mkdir(parents=True)
    (crashed.node.root / "var/lib/cni/networks/hl").mkdir(parents=True)
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert code == ExitCode.OK
    (entry,) = report["entries"]
    assert entry["quarantined_to"].endswith(f"hl-{CID}-eth0.1")
    assert (qdir / f"hl-{CID}-eth0.json").read_text() == nested


def run_text(crashed: Crashed, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = cli.run(crashed.argv("--dry-run"), clock=lambda: crashed.t0 + 60, environ={})
    return int(code), capsys.readouterr().out


@pytest.mark.parametrize(
    "kind",
    ["../canary", "ABSOLUTE", "canary\u0000", "..", ""],
    ids=["dotdot-path", "absolute-path", "nul", "dotdot", "empty"],
)
def test_plugin_types_outside_the_plugin_dirs_never_run(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str
) -> None:
    bin_dir = crashed.node.root / "opt/cni/bin"
    bin_dir.mkdir(parents=True)
    ran = canary(bin_dir.parent / "canary")
    canary(bin_dir / "canary")  # a real plugin named just "canary" is fine to run
    kind = str(bin_dir.parent / "canary") if kind == "ABSOLUTE" else kind
    conf = {"cniVersion": "1.0.0", "name": "evil", "plugins": [{"type": kind}]}
    crashed.node.write_conf("30-evil.conflist", json.dumps(conf).encode())
    path = crashed.node.write_result(f"evil-{CID}-eth0", b"")
    crashed.reboot()

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir))

    assert not ran.exists()
    entry = by_path(report)[path.name]
    if kind == "":
        # Not a valid conflist at all: the network has no config, so DEL cannot run.
        assert "evil" in " ".join(report["warnings"])
    else:
        assert "invalid plugin name" in entry["plugin_errors"][0]["msg"]
    assert (entry["action"], entry["outcome"]) == ("del-and-quarantine", "failed")
    assert code == ExitCode.ACTION_FAILED
    assert not path.exists()  # quarantined per policy, even though DEL could not run


@pytest.mark.parametrize(
    "conflist",
    [
        b"{not json",
        b"[1, 2, 3]",
        b'{"cniVersion": "1.0.0", "name": "bad"}',
        b'{"cniVersion": "1.0.0", "name": "bad", "plugins": []}',
        b'{"cniVersion": "1.0.0", "name": "bad", "plugins": [1]}',
        json.dumps(
            {"cniVersion": "1.0.0", "name": "bad", "plugins": [{"type": "host-local"}] * 10_000}
        ).encode(),
        b'{"name": "bad", "plugins": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    ],
    ids=[
        "not-json",
        "not-object",
        "no-plugins",
        "empty-plugins",
        "plugin-not-object",
        "10000-plugins",
        "deeply-nested",
    ],
)
def test_broken_conflists_are_skipped_with_a_warning(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], conflist: bytes
) -> None:
    crashed.node.write_conf("05-bad.conflist", conflist)
    damaged = crashed.add(CONTAINER_IDS[0])
    damaged.write_bytes(b"")
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert any("05-bad.conflist" in w for w in report["warnings"])
    # The good network next to it is repaired as usual.
    assert code == ExitCode.OK
    assert by_path(report)[damaged.name]["outcome"] == "done"


def test_cached_config_that_is_not_base64_is_damage(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    path = crashed.add(CONTAINER_IDS[0])
    doc = json.loads(path.read_bytes())
    doc["config"] = "!!! not base64 !!!"
    path.write_text(json.dumps(doc))
    crashed.reboot()

    code, report = crashed.run(capsys)

    entry = by_path(report)[path.name]
    # libcni cannot unmarshal it either, so the runtime's DEL would abort on it.
    assert (entry["content"], entry["content_detail"]) == (
        "garbage",
        "'config' is not valid base64",
    )
    assert (entry["action"], entry["outcome"], code) == ("del-and-quarantine", "done", 0)
    assert crashed.ips() == {}


def test_a_100_mib_file_is_reported_unread(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    path = crashed.node.write_result(f"hl-{CID}-eth0", b"")
    os.truncate(path, 100 << 20)  # sparse: 100 MiB that cost no disk
    crashed.reboot()

    code, report = crashed.run(capsys)

    entry = by_path(report)[path.name]
    assert (entry["content"], entry["action"], code) == ("oversized", "report", ExitCode.DATA)
    assert path.stat().st_size == 100 << 20


def test_deeply_nested_json_in_a_cache_file(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    nested = crashed.node.write_result(
        f"hl-{CONTAINER_IDS[1]}-eth0", b"[" * 400_000 + b"]" * 400_000
    )
    cut = crashed.node.write_result(f"hl-{CONTAINER_IDS[2]}-eth0", b'{"a":' * 200_000)
    crashed.reboot()

    code, report = crashed.run(capsys)

    entries = by_path(report)
    assert entries[nested.name]["content"] == "garbage"
    assert entries[cut.name]["content"] == "truncated"
    assert code == ExitCode.OK


def test_world_writable_or_foreign_results_dir_is_refused(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed.add(CONTAINER_IDS[0]).write_bytes(b"")
    crashed.reboot()
    crashed.node.results.chmod(0o777)
    before = snapshot(crashed.node.results)

    code = crashed.run_main()

    assert code == ExitCode.DATA
    assert "writable by group or others" in capsys.readouterr().err
    assert snapshot(crashed.node.results) == before
    if os.geteuid() == 0:
        crashed.node.results.chmod(0o700)
        os.chown(crashed.node.results, 65534, 65534)
        assert crashed.run_main() == ExitCode.DATA
        assert "owned by uid 65534" in capsys.readouterr().err


def test_plugins_others_could_have_replaced_are_not_run(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    bin_dir = crashed.node.root / "opt/cni/bin"
    bin_dir.mkdir(parents=True)
    writable_plugin = bin_dir / "loose"
    ran = canary(writable_plugin)
    writable_plugin.chmod(0o777)
    open_dir = crashed.node.root / "srv/open"
    open_dir.mkdir(parents=True)
    ran_too = canary(open_dir / "opendir")
    open_dir.chmod(0o777)
    for name, kind in (("a", "loose"), ("b", "opendir")):
        conf = {"cniVersion": "1.0.0", "name": name, "plugins": [{"type": kind}]}
        crashed.node.write_conf(f"40-{name}.conflist", json.dumps(conf).encode())
        crashed.node.write_result(f"{name}-{CID}-eth0", b"")
    crashed.reboot()

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir), "--bin-dir", str(open_dir))

    assert not ran.exists() and not ran_too.exists()
    errors = {e["network"]: e["plugin_errors"][0]["msg"] for e in report["entries"]}
    # Each dir is left out of CNI_PATH whole: plugins exec from it by name.
    assert (
        f"plugin dir {bin_dir} left out of CNI_PATH: {writable_plugin} is writable by group or "
        "others (mode 0777)"
    ) in errors["a"]
    assert (
        f"plugin dir {open_dir} left out of CNI_PATH: {open_dir} is writable by group or others"
    ) in errors["b"]
    assert code == ExitCode.ACTION_FAILED


def test_an_ipam_plugin_in_an_untrusted_dir_never_runs_nor_does_any_of_its_chain(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """bridge would exec its IPAM type from CNI_PATH: a canary of that name, in a plugin dir
    others may write to, is never found, and the DEL runs none of the chain."""
    bin_dir = crashed.node.root / "opt/cni/bin"
    bin_dir.mkdir(parents=True)
    tracer = bin_dir / "tracer"
    tracer.write_text(f"#!/bin/sh\ntouch {bin_dir.parent / 'tracer.ran'}\n")
    tracer.chmod(0o755)
    evil = crashed.node.root / "srv/evil"
    evil.mkdir(parents=True)
    ran = canary(evil / "canary-ipam")
    evil.chmod(0o777)
    conf = {
        "cniVersion": "1.0.0",
        "name": "chained",
        "plugins": [
            {"type": "bridge", "bridge": "cni-test0", "ipam": {"type": "canary-ipam"}},
            {"type": "tracer"},
        ],
    }
    crashed.node.write_conf("30-chained.conflist", json.dumps(conf).encode())
    path = crashed.node.write_result(f"chained-{CID}-eth0", b"")
    repaired = crashed.add(CONTAINER_IDS[0])
    repaired.write_bytes(b"")
    crashed.reboot()

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir), "--bin-dir", str(evil))

    assert not ran.exists()
    assert not (bin_dir.parent / "tracer.ran").exists()
    entry = by_path(report)[path.name]
    error = entry["plugin_errors"][0]
    assert error["plugin"] == "canary-ipam"
    assert error["msg"].startswith(
        "ipam plugin 'canary-ipam' of 'bridge': failed to find plugin 'canary-ipam' in path "
        f"['{PLUGIN_DIR}', '{bin_dir}']; plugin dir {evil} left out of CNI_PATH: {evil} is "
        "writable by group or others (mode 0777)"
    )
    assert (entry["action"], entry["outcome"], code) == (
        "del-and-quarantine",
        "failed",
        ExitCode.ACTION_FAILED,
    )
    assert not path.exists()  # quarantined per policy
    assert by_path(report)[repaired.name]["outcome"] == "done"


def test_a_symlinked_conf_file_is_followed_and_its_network_repaired(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """libcni reads a conf file through a symlink: so does the reaper, or the DEL it owes the
    network never runs and its address stays reserved."""
    damaged = crashed.add(CONTAINER_IDS[0])
    damaged.write_bytes(b"")
    assert crashed.ips()
    conf = crashed.node.conf_dir / "10-hl.conflist"
    templates = crashed.node.root / "etc/cni/templates"
    templates.mkdir(parents=True)
    conf.rename(templates / "hl.conflist")
    conf.symlink_to("../templates/hl.conflist")
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert (by_path(report)[damaged.name]["outcome"], code) == ("done", ExitCode.OK)
    assert crashed.ips() == {}


def test_a_conf_file_linked_into_a_dir_others_write_is_not_read(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    bin_dir = crashed.node.root / "opt/cni/bin"
    bin_dir.mkdir(parents=True)
    ran = canary(bin_dir / "canary")
    open_dir = crashed.node.root / "srv/open"
    open_dir.mkdir(parents=True)
    conf = {"cniVersion": "1.0.0", "name": "linked", "plugins": [{"type": "canary"}]}
    (open_dir / "linked.conflist").write_text(json.dumps(conf))
    open_dir.chmod(0o777)
    link = crashed.node.conf_dir / "20-linked.conflist"
    link.symlink_to(open_dir / "linked.conflist")
    path = crashed.node.write_result(f"linked-{CID}-eth0", b"")
    crashed.reboot()

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir))

    assert not ran.exists()
    assert (
        f"config skipped: {link}: {open_dir} is writable by group or others (mode 0777)"
        in report["warnings"]
    )
    entry = by_path(report)[path.name]
    assert (entry["outcome"], code) == ("failed", ExitCode.ACTION_FAILED)
