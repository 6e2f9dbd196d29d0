"""Attacks on 65ebf14, a plugin's config fields read as Go's encoding/json decodes them
(netconf.go_field, go_object): what the reaper makes of a config against what libcni 1.1.2
(tests/libcni_client, Debian's golang-github-appc-cni-dev) and the real plugins
(containernetworking-plugins) make of the same bytes. Found on 2026-12-06: nine defects, strict
xfails on 65ebf14; eight are mended (a .conf naming itself twice, or with an empty type in the
file's order; host-local's IPAM pointer reset by a null; a losing spelling of another type
that fails libcni's decoding; a null ranges; a lone surrogate or a NUL in a path field that
ended the run as an internal error); the ninth, numbers reaching a plugin's stdin as Python
read them, not as Go re-marshals them from a float64, is mended by go_marshal.py."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from cni_reaper import host_local, multus, netconf, pool
from cni_reaper.errors import ExitCode
from cni_reaper.netconf import ConfigError, NetworkConfigs, NetworkList, parse_conf_bytes
from cni_reaper.node_root import RootBinds
from cni_reaper.plugin import resolve_chain, vet_plugin_dirs
from cni_reaper.repair.replay import plugin_stdin
from tests.crashed import Crashed, by_path
from tests.libcni import AddFailed, add_network_list
from tests.nodetree import CONTAINER_IDS, PLUGIN_DIR, have_plugins
from tests.private_node import cannot_run
from tests.real_libcni import LibcniClient
from tests.test_multus_cni_dir import away_out_of_the_root

A, B = CONTAINER_IDS[0], CONTAINER_IDS[1]


@pytest.fixture(autouse=True)
def _plugins() -> None:
    if not have_plugins():
        cannot_run(f"containernetworking-plugins is not installed in {PLUGIN_DIR}")


def libcni_loads(client: LibcniClient, conf_dir: Path, network: str) -> dict[str, Any] | None:
    """What libcni's LoadConfList makes of the conf dir for this network; None if nothing."""
    run = client.run("parse", "x", "eth0", conf_dir=conf_dir, network=network, bin_dirs=())
    return run.result if run.ok else None


def libcni_parses(client: LibcniClient, tmp: Path, conflist: bytes) -> dict[str, Any] | None:
    path = tmp / "parsed.conflist"
    path.write_bytes(conflist)
    run = client.run("parse", "x", "eth0", conflist=path, bin_dirs=())
    return run.result if run.ok else None


def one_conf_dir(tmp: Path, file_name: str, data: bytes) -> Path:
    conf_dir = tmp / "net.d"
    conf_dir.mkdir(exist_ok=True)
    for old in conf_dir.iterdir():
        old.unlink()
    (conf_dir / file_name).write_bytes(data)
    return conf_dir


def ours(data: bytes, single: bool) -> NetworkList | None:
    try:
        return parse_conf_bytes(data, "f", single_plugin=single)
    except ConfigError:
        return None


def recording_plugins(root: Path, seen: Path, *kinds: str) -> Path:
    """Plugins in ROOT/opt/cni/bin that each append their name and stdin to seen."""
    bin_dir = root / "opt/cni/bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for kind in kinds:
        plugin = bin_dir / kind
        plugin.write_text(f'#!/bin/sh\n{{ echo "{kind}"; cat; echo; }} >> "{seen}"\n')
        plugin.chmod(0o755)
    return bin_dir


# A single .conf: ConfFromFile decodes the file's own bytes into types.NetConf, every member
# in the file's order, a key given twice exactly decoded twice. json.loads keeps one member
# per exact key, at the place of its first occurrence: the order go_field is handed is not
# the file's.

NAMED_TWICE = b'{"Name":"decoy","name":"net","Name":"other","type":"bridge","cniVersion":"0.4.0"}'


@pytest.mark.parametrize(
    ("data", "name", "cni_version"),
    [
        (NAMED_TWICE, "other", "0.4.0"),
        (
            b'{"name":"net","type":"bridge","CNIVersion":"0.3.1","cniVersion":"1.0.0",'
            b'"CNIVersion":"0.4.0"}',
            "net",
            "0.4.0",
        ),
    ],
    ids=["its name, a .conf naming itself twice", "its cniVersion"],
)
def test_a_single_confs_field_given_twice_is_libcnis(
    data: bytes, name: str, cni_version: str, libcni_client: LibcniClient, tmp_path: Path
) -> None:
    conf_dir = one_conf_dir(tmp_path, "10-a.conf", data)
    theirs = libcni_loads(libcni_client, conf_dir, name)
    assert theirs is not None and (theirs["name"], theirs["cniVersion"]) == (name, cni_version)
    assert name == "net" or libcni_loads(libcni_client, conf_dir, "net") is None

    mine = ours(data, single=True)

    assert mine is not None and (mine.name, mine.cni_version) == (name, cni_version)


def test_a_single_conf_whose_last_type_in_the_file_is_empty_is_refused_as_libcni_refuses_it(
    libcni_client: LibcniClient, tmp_path: Path
) -> None:
    data = b'{"name":"net","type":"bridge","Type":"","cniVersion":"0.4.0"}'
    conf_dir = one_conf_dir(tmp_path, "10-a.conf", data)
    assert libcni_loads(libcni_client, conf_dir, "net") is None

    assert ours(data, single=True) is None


def test_a_damaged_entry_is_deleted_through_the_plugin_libcni_would_run(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The runtime's network 'f' is 60-f.conflist; 05-decoy.conf is the network libcni calls
    'decoy' (its last 'Name'), which the reaper takes for 'f'."""
    seen = tmp_path / "seen"
    bin_dir = recording_plugins(crashed.node.root, seen, "right", "wrong")
    real = {"cniVersion": "1.0.0", "name": "f", "plugins": [{"type": "right"}]}
    crashed.node.write_conf("60-f.conflist", json.dumps(real).encode())
    crashed.node.write_conf(
        "05-decoy.conf",
        b'{"Name":"x","name":"f","Name":"decoy","type":"wrong","cniVersion":"1.0.0"}',
    )
    entry = crashed.node.write_result(f"f-{A}-eth0", b"\0" * 100)
    crashed.reboot()

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir))

    assert by_path(report)[entry.name]["outcome"] == "done", report
    assert seen.read_text().splitlines()[0] == "right"
    assert code == ExitCode.OK


# A type error in a spelling that loses: encoding/json notes it, decodes on, and fails the
# whole decoding; ConfFromBytes then refuses the plugin, and the runtime loads no such network.

TYPE_ERRORS = [
    {"Type": 5, "type": "bridge"},
    {"type": "bridge", "ipam": {"Type": ["x"], "type": "host-local"}},
    {"type": "bridge", "Capabilities": {"portMappings": "yes"}, "capabilities": None},
]


@pytest.mark.parametrize("plugin", TYPE_ERRORS, ids=["type", "ipam-type", "capabilities"])
def test_a_plugin_libcni_cannot_decode_is_refused(
    libcni_client: LibcniClient, tmp_path: Path, plugin: dict[str, Any]
) -> None:
    data = json.dumps({"cniVersion": "0.4.0", "name": "net", "plugins": [plugin]}).encode()
    assert libcni_parses(libcni_client, tmp_path, data) is None

    assert ours(data, single=False) is None


# host-local decodes its stdin into its own Net, whose IPAM is a *pointer*: a null sets it to
# nil, and the next object starts from a fresh IPAMConfig. libcni's types.NetConf has IPAM as
# a struct (null leaves it), which is what go_object merges for everyone.


def pointer_reset_conflist(elsewhere: Path, subnet: str) -> bytes:
    plugin = {
        "type": "host-local",
        "IPAM": {"type": "host-local", "dataDir": str(elsewhere)},
        "Ipam": None,
        "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]]},
    }
    return json.dumps({"cniVersion": "1.0.0", "name": "hn", "plugins": [plugin]}).encode()


def test_host_local_itself_forgets_a_data_dir_a_null_ipam_came_after(
    crashed: Crashed, tmp_path: Path
) -> None:
    """What the real host-local does with that config: its store is the default one."""
    elsewhere = tmp_path / "elsewhere"
    conflist = pointer_reset_conflist(elsewhere, "10.61.0.0/24")
    root = crashed.node.root

    add_network_list(conflist, A, "eth0", f"/run/netns/cni-{A[:8]}", root)

    assert os.listdir(crashed.ipam / "hn") != []
    assert not elsewhere.exists()


def test_an_orphan_in_the_store_host_local_really_uses_is_released(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    conflist = pointer_reset_conflist(elsewhere, "10.61.0.0/24")
    crashed.node.write_conf("20-hn.conflist", conflist)
    root = crashed.node.root
    add_network_list(conflist, A, "eth0", f"/run/netns/cni-{A[:8]}", root)
    os.unlink(crashed.node.results / f"hn-{A}-eth0")  # the node died before libcni's write
    crashed.reboot()
    held = sorted(os.listdir(crashed.ipam / "hn"))
    assert "10.61.0.2" in held, held

    code, report = crashed.run(capsys)

    assert [r["ip"] for r in report["host_local"]] == ["10.61.0.2"], report["host_local"]
    assert not (crashed.ipam / "hn/10.61.0.2").exists()
    assert code == ExitCode.OK, report
    configs = netconf.load_conf_dirs([str(crashed.node.conf_dir)])
    assert dict(host_local.stores(configs, str(root)))["hn"] == str(crashed.ipam / "hn")


def test_a_null_ranges_after_ranges_leaves_host_local_none(crashed: Crashed) -> None:
    ipam = {"type": "host-local", "Ranges": [[{"subnet": "10.62.0.0/24"}]], "ranges": None}
    conflist = json.dumps(
        {"cniVersion": "1.0.0", "name": "hr", "plugins": [{"type": "host-local", "ipam": ipam}]}
    ).encode()
    with pytest.raises(AddFailed, match="no IP ranges"):
        add_network_list(conflist, A, "eth0", f"/run/netns/cni-{A[:8]}", crashed.node.root)

    sets, problem = pool.range_sets(ipam)

    assert (sets, problem) == ((), "no ranges")


# The stdin the reaper builds against the one libcni 1.1.2 hands a plugin on DEL.


def stdin_pair(
    client: LibcniClient, tmp_path: Path, plugin_json: str, caps: dict[str, Any]
) -> tuple[bytes, bytes]:
    """(libcni's, the reaper's) stdin for the plugin's DEL: libcni's as a recording plugin
    received it (run by libcni_client, outside any root: it only writes into tmp_path)."""
    seen = tmp_path / "seen"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    rec = bin_dir / "rec"
    rec.write_text(f'#!/bin/sh\ncat > "{seen}"\n')
    rec.chmod(0o755)
    doc = '{"cniVersion":"0.4.0","name":"net","plugins":[' + plugin_json + "]}"
    path = tmp_path / "net.conflist"
    path.write_text(doc)
    run = client.run(
        "del",
        A,
        "eth0",
        conflist=path,
        bin_dirs=(str(bin_dir),),
        cache_dir=tmp_path / "cache",
        capability_args=caps,
    )
    assert run.ok, run.error
    netlist = parse_conf_bytes(doc.encode(), "f", single_plugin=False)
    return seen.read_bytes(), plugin_stdin(netlist, netlist.plugins[0], caps)


def test_odd_spellings_reach_the_plugin_byte_for_byte_as_libcni_hands_them(
    libcni_client: LibcniClient, tmp_path: Path
) -> None:
    """Keys in other cases beside the injected ones (Name, cniVer\u017fion that sorts after
    cniVersion, runtimeconfig after runtimeConfig), two capability maps merged, one a null
    empties, strings Go escapes: the same bytes."""
    plugin = (
        '{"type":"rec","Name":"zz","cniVer\u017fion":"0.1.0","runtimeconfig":{"a":[1,{"b":2}]},'
        '"CAPABILITIES":{"bandwidth":true},"Capabilities":null,'
        '"capabilities":{"portMappings":true},"capabilitie\u017f":{"ipRanges":true},'
        '"html":"<a&b>\u2028","IPAM":{"type":"host-local","Z":1,"a":2}}'
    )
    caps = {"portMappings": [{"hostPort": 8080}], "bandwidth": {"rate": 1}, "ipRanges": [[{}]]}

    theirs, mine = stdin_pair(libcni_client, tmp_path, plugin, caps)

    assert json.loads(theirs) == json.loads(mine)
    assert theirs == mine.replace(b"<", b"\\u003c").replace(b">", b"\\u003e").replace(
        b"&", b"\\u0026"
    ).replace(b"\\u017f", "\u017f".encode())


def test_numbers_reach_the_plugin_as_libcni_marshals_them(
    libcni_client: LibcniClient, tmp_path: Path
) -> None:
    """libcni's map holds float64s: a bridge's mtu of 1500.0 reaches it as 1500, which its int
    field takes (1500.0 it refuses)."""
    plugin = '{"type":"rec","mtu":1500.0,"e":1E-7,"big":12345678901234567890,"f":0.00001}'

    theirs, mine = stdin_pair(libcni_client, tmp_path, plugin, {})

    assert theirs == mine
    assert b'"mtu":1500,' in mine


def test_keys_go_folds_and_keys_it_does_not_are_read_as_libcni_reads_them(
    libcni_client: LibcniClient, tmp_path: Path
) -> None:
    """The long s and the Kelvin sign fold onto s and k, the dotted and dotless i onto
    nothing; a field without s or k has no non-ASCII spelling."""
    plugins = [
        {"type": "bridge", "\u0130pam": {"type": "x"}, "\u0131pam": {"type": "y"}},
        {"type": "bridge", "capabilitie\u017f": {"portMappings": True}},
        {"TYPE": "bridge", "ipam": {"tYPE": "host-local"}, "\u0130PAM": None},
        {"type": "ptp", "Capabilities": {"\u212a": True}, "capabilities": {"k": False}},
    ]
    data = json.dumps({"cniVersion": "0.4.0", "name": "net", "plugins": plugins}).encode()
    theirs = libcni_parses(libcni_client, tmp_path, data)
    assert theirs is not None

    mine = ours(data, single=False)

    assert mine is not None
    assert [p["type"] for p in theirs["plugins"]] == list(mine.plugin_types)
    for plugin, libcnis in zip(mine.plugins, theirs["plugins"]):
        ipam = netconf.go_object(plugin, "ipam")
        ipam_type = netconf.go_field(ipam, "type") if isinstance(ipam, tuple) else None
        assert (ipam_type or "") == libcnis["ipamType"]
        caps = netconf.go_object(plugin, "capabilities", null_resets=True)
        assert (dict(caps) if caps else None) == libcnis["capabilities"]


def test_a_conflists_own_keys_in_another_spelling_are_not_its_own(
    libcni_client: LibcniClient, tmp_path: Path
) -> None:
    """ConfListFromBytes looks name and cniVersion up in a map: cniVer\u017fion is a stray."""
    doc = {"cniVersion": "0.3.1", "cniVer\u017fion": "1.0.0", "name": "net", "plugins": [{}]}
    doc["plugins"] = [{"type": "bridge"}]
    data = json.dumps(doc).encode()
    theirs = libcni_parses(libcni_client, tmp_path, data)
    assert theirs is not None

    mine = ours(data, single=False)

    assert mine is not None and (mine.name, mine.cni_version) == ("net", theirs["cniVersion"])


# Odd input: never an internal error.

CRASHING = {
    "DataDir-lone-surrogate": {
        "type": "host-local",
        "ipam": {"Type": "host-local", "DataDir": "/x\ud800"},
    },
    "dataDir-nul": {"type": "host-local", "IPAM": {"type": "host-local", "dataDir": "/x\0y"}},
    "Type-lone-surrogate": {"Type": "\ud800"},
    "CNIDir-lone-surrogate": {"TYPE": "multus", "CNIDir": "/x\ud800"},
}


@pytest.mark.parametrize("which", sorted(CRASHING))
def test_a_path_field_no_file_system_can_hold_is_no_internal_error(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], which: str
) -> None:
    conf = {"cniVersion": "1.0.0", "name": "odd", "plugins": [CRASHING[which]]}
    crashed.node.write_conf("20-odd.conflist", json.dumps(conf).encode())
    crashed.node.write_result(f"odd-{A}-eth0", b"\0" * 100)
    crashed.reboot()

    code = crashed.run_main()

    assert code != ExitCode.INTERNAL, capsys.readouterr().err[-2000:]


def deep(levels: int) -> Any:
    value: Any = {"type": "host-local"}
    for index in range(levels):
        value = {"Ipam": value} if index % 2 else {"x": [value], "TYPE": "host-local"}
    return value


HL = {"type": "host-local", "subnet": "10.63.0.0/24"}
LONE = (chr(0xD800), chr(0xDFFF))  # lone surrogates: Go decodes both to U+FFFD
ODD = {
    "ipam-list": {"type": "host-local", "IPAM": [HL]},
    "ipam-number": {"type": "host-local", "iPaM": 7, "ipam": HL},
    "ipam-string": {"type": "host-local", "IPAM": HL, "ipam": "host-local"},
    "ipam-true": {"type": "host-local", "ipam": True},
    "ipam-deep": {"type": "host-local", "IPAM": deep(400), "ipam": HL},
    "dotted-i": {"type": "host-local", "\u0130PAM": {"type": "nothing"}, "ipam": HL},
    "surrogate-keys": {"type": "host-local", LONE[0]: 1, LONE[1]: {LONE[0]: 2}, "ipam": HL},
    "many-keys": {"type": "host-local", **{f"Type{i}": None for i in range(20000)}, "IPAM": HL},
}


def test_odd_configs_are_deleted_or_refused_never_an_internal_error(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each odd network's damaged entry: DEL'd through host-local, or its DEL refused with a
    reason; an 'ipam' libcni cannot decode into its struct refuses the chain."""
    entries = {}
    for index, (name, plugin) in enumerate(sorted(ODD.items())):
        conf = {"cniVersion": "1.0.0", "name": name, "plugins": [plugin]}
        crashed.node.write_conf(f"3{index}-{name}.conflist", json.dumps(conf).encode())
        entries[name] = crashed.node.write_result(f"{name}-{A}-eth0", b"\0" * 100)
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert code in (ExitCode.OK, ExitCode.ACTION_FAILED), report
    outcomes = {name: by_path(report)[path.name]["outcome"] for name, path in entries.items()}
    refused = {n for n in ("ipam-list", "ipam-number", "ipam-string", "ipam-true")}
    assert {n for n, o in outcomes.items() if o != "done"} == refused, outcomes
    for name in refused:
        # libcni cannot decode the plugin into types.NetConf, and refuses the whole config;
        # the reaper too, the network then named by no config it can use
        said = json.dumps(by_path(report)[entries[name].name])
        assert "not an object" in said or "no config" in said, said


def test_a_megabyte_of_keys_is_read_in_good_time() -> None:
    plugin: dict[str, Any] = {f"tYpE{i:05x}": None for i in range(16000)}
    plugin.update({"TYPE": "bridge", "Ipam": {f"k{i}": i for i in range(8000)}})
    plugin["Ipam"]["type"] = "host-local"
    plugin["Capabilities"] = {f"c{i}": True for i in range(4000)}
    data = json.dumps({"cniVersion": "1.0.0", "name": "n", "plugins": [plugin] * 2}).encode()
    assert len(data) <= netconf.MAX_CONF_BYTES
    started = time.monotonic()

    netlist = parse_conf_bytes(data, "f", single_plugin=False)
    configs = NetworkConfigs({"n": netlist}, ())
    assert list(host_local.data_dirs(configs)) != []
    assert netlist.plugin_types == ("bridge", "bridge")
    plugin_stdin(netlist, netlist.plugins[0], {"c1": 1})

    assert time.monotonic() - started < 5.0


def test_a_type_in_any_case_with_a_slash_is_still_refused(tmp_path: Path) -> None:
    plugins = ({"TYPE": "../../../../bin/true"}, {"type": "bridge", "IPAM": {"Type": "/bin/sh"}})
    for plugin in plugins:
        netlist = NetworkList("n", "1.0.0", (plugin,), "f")
        chain = resolve_chain(netlist, vet_plugin_dirs([PLUGIN_DIR]))
        assert chain.failing is not None, chain


def test_a_data_dir_in_any_case_never_leads_out_of_the_root(tmp_path: Path) -> None:
    """'..' never above the root's '/'; a symlink in the root that climbs out is no store."""
    root = tmp_path / "root"
    (root / "var/lib").mkdir(parents=True)
    (tmp_path / "outside/esc").mkdir(parents=True)
    (root / "var/lib/esc").symlink_to("../../../outside/esc")
    networks = {}
    for name, data_dir in (("up", "/../../../../outside"), ("esc", "/var/lib/esc")):
        plugin = {"Type": "bridge", "IPAM": {"TYPE": "host-local", "DATADIR": data_dir}}
        networks[name] = NetworkList(name, "1.0.0", (plugin,), "f")
    configs = NetworkConfigs(networks, ())

    stores = dict(host_local.stores(configs, str(root)))

    assert stores == {"up": str(root / "outside/up")}
    binds = RootBinds(str(root), host_local.data_dirs(configs))
    assert "esc" in host_local.store_problems(configs, binds)


def test_a_multus_cni_dir_in_any_case_that_climbs_out_of_the_root_is_refused(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    conf = {
        "cniVersion": "0.3.1",
        "name": "multus-cni-network",
        "tYPE": "multus",
        "cniDIR": "/var/lib/cni/away",
        "delegates": [{"cniVersion": "0.3.1", "name": "hl", "type": "bridge"}],
    }
    crashed.node.write_conf("00-multus.conf", json.dumps(conf).encode())
    assert [
        d.node_path
        for d in multus.named_dirs(
            netconf.load_conf_dirs([str(crashed.node.conf_dir)]).networks.values()
        )
    ] == ["/var/lib/cni/away"]
    victim = away_out_of_the_root(crashed, tmp_path, B)
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert any("leads out of" in w for w in report["warnings"]), report["warnings"]
    assert report["multus_results"] == []
    assert victim.exists()
    assert code == ExitCode.OK, report


def test_a_config_holding_a_byte_that_is_not_utf8_is_deld_through_as_libcni_would(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """Go reads the byte as U+FFFD and libcni runs the DEL; the reaper read the whole config
    as no JSON, and so quarantined the damaged entry with no DEL. (In the network's name the
    byte names it with U+FFFD, which every plugin built on skel then refuses.)"""
    conflist = b'{"cniVersion":"1.0.0","name":"u","plugins":[{"type":"loopback","note":"\xff"}]}'
    crashed.node.write_conf("20-u.conflist", conflist)
    entry = crashed.node.write_result(f"u-{A}-eth0", b"")  # the crash
    crashed.reboot()

    code, report = crashed.run(capsys)

    e = by_path(report)[entry.name]
    assert (e["action"], e["outcome"]) == ("del-and-quarantine", "done"), e["reason"]
    assert e["del"]["plugins_run"] == ["loopback"], e
    assert not entry.exists()
    assert code == ExitCode.OK, report
