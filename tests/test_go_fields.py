"""A plugin's config as libcni decodes it (netconf.go_field): libcni reads each plugin's type,
its IPAM's type and its capabilities into types.NetConf, whose fields match a key in any case,
the last one winning, a null leaving the field as it was; a conflist's own name, cniVersion
and plugins are looked up in a map, by exact key; a single .conf is decoded into the struct
whole. Each case is checked against libcni itself: tests/libcni_client's `parse`, built from
Debian's golang-github-appc-cni-dev."""

from __future__ import annotations

import codecs
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni_reaper import host_local, multus, netconf, pool
from cni_reaper.errors import ExitCode
from cni_reaper.netconf import ConfigError, NetworkList, go_field, go_object, parse_conf_bytes
from tests.crashed import Crashed, by_path
from tests.nodetree import CONTAINER_IDS
from tests.real_libcni import LibcniClient


def spellings(name: str) -> list[str]:
    """A field's key as a config may spell it, Go's folded forms among them."""
    forms = {name, name.lower(), name.upper(), name[:1].upper() + name[1:]}
    forms |= {form.replace("s", "\u017f") for form in set(forms) if "s" in form}
    forms |= {form.replace("k", "\u212a") for form in set(forms) if "k" in form}
    return sorted(forms)


def keyed(name: str, values: st.SearchStrategy[Any]) -> st.SearchStrategy[list[tuple[str, Any]]]:
    """Up to three keys spelling the field, none twice exactly (a dict keeps one of those)."""
    pair = st.tuples(st.sampled_from(spellings(name)), values)
    return st.lists(pair, max_size=3, unique_by=lambda kv: kv[0])


TYPES = st.one_of(st.none(), st.sampled_from(["bridge", "host-local", "ptp", "portmap"]))
CAPABILITIES = st.one_of(
    st.none(), st.fixed_dictionaries({}, optional={"portMappings": st.booleans()})
)
IPAM = keyed("type", TYPES).map(dict)
PLUGIN = st.tuples(
    keyed("type", TYPES),
    keyed("ipam", st.one_of(st.none(), IPAM)),
    keyed("capabilities", CAPABILITIES),
).map(lambda parts: dict(parts[0] + parts[1] + parts[2]))


def libcni_parse(client: LibcniClient, tmp: Path, conflist: bytes) -> dict[str, Any] | None:
    """What libcni makes of a conflist's bytes; None when it refuses them."""
    path = tmp / "net.conflist"
    path.write_bytes(conflist)
    run = client.run("parse", "x", "eth0", conflist=path, bin_dirs=())
    return run.result if run.ok else None


def read_by_both(
    client: LibcniClient, tmp: Path, conflist: bytes
) -> tuple[dict[str, Any], NetworkList] | None:
    """What libcni and the reaper make of a conflist's bytes; None when both refuse them (one
    refusing alone fails the test)."""
    theirs = libcni_parse(client, tmp, conflist)
    try:
        ours = parse_conf_bytes(conflist, "net.conflist", single_plugin=False)
    except ConfigError:
        assert theirs is None, theirs
        return None
    assert theirs is not None, ours
    return theirs, ours


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(PLUGIN, min_size=1, max_size=3))
def test_each_plugins_fields_are_read_as_libcni_reads_them(
    libcni_client: LibcniClient, tmp_path: Path, plugins: list[dict[str, Any]]
) -> None:
    data = json.dumps({"cniVersion": "0.4.0", "name": "net", "plugins": plugins}).encode()

    read = read_by_both(libcni_client, tmp_path, data)

    if read is None:
        return
    theirs, ours = read
    assert [p["type"] for p in theirs["plugins"]] == list(ours.plugin_types)
    for mine, libcnis in zip(ours.plugins, theirs["plugins"]):
        ipam = go_object(mine, "ipam")
        ipam_type = go_field(ipam, "type") if isinstance(ipam, tuple) else None
        assert (ipam_type or "") == libcnis["ipamType"]
        capabilities = go_object(mine, "capabilities", null_resets=True)
        assert (None if capabilities is None else dict(capabilities)) == libcnis["capabilities"]


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(keyed("name", st.just("net")), keyed("type", TYPES), keyed("cniVersion", st.just("0.4.0")))
def test_a_single_confs_own_fields_match_any_case_as_libcni_loads_it(
    libcni_client: LibcniClient,
    tmp_path: Path,
    name: list[tuple[str, Any]],
    kind: list[tuple[str, Any]],
    version: list[tuple[str, Any]],
) -> None:
    """A .conf is decoded into types.NetConf whole (ConfFromFile, then ConfListFromConf), so
    its name and cniVersion match any case too, unlike a conflist's."""
    conf_dir = tmp_path / "net.d"
    conf_dir.mkdir(exist_ok=True)
    data = json.dumps(dict(name + kind + version)).encode()
    (conf_dir / "10-net.conf").write_bytes(data)

    run = libcni_client.run("parse", "x", "eth0", conf_dir=conf_dir, network="net", bin_dirs=())

    try:
        ours = parse_conf_bytes(data, "10-net.conf", single_plugin=True)
    except ConfigError:
        assert not run.ok, run.output
        return
    assert run.ok, (ours, run.output)
    assert run.result is not None
    assert (run.result["name"], run.result["cniVersion"]) == (ours.name, ours.cni_version)
    assert [p["type"] for p in run.result["plugins"]] == list(ours.plugin_types)


def test_a_conflists_own_keys_are_exact(tmp_path: Path) -> None:
    """ConfListFromBytes looks its name up in a map: "Name" names no network."""
    data = json.dumps({"Name": "net", "cniVersion": "0.4.0", "plugins": [{"type": "x"}]})
    with pytest.raises(ConfigError, match="no network 'name'"):
        parse_conf_bytes(data.encode(), "net.conflist", single_plugin=False)


def test_host_locals_store_and_ranges_follow_any_case(tmp_path: Path) -> None:
    """host-local decodes its IPAM config into a struct too: a "DataDir" moves its store, a
    "Subnet" beside "ranges" is the first range set (LoadIPAMConfig puts it first)."""
    ipam = {
        "Type": "host-local",
        "DataDir": "/srv/ipam",
        "Subnet": "10.1.0.0/24",
        "ranges": [[{"subnet": "10.2.0.0/24"}]],
    }
    netlist = netconf.NetworkList("net", "0.4.0", ({"type": "bridge", "IPAM": ipam},), "f")
    configs = netconf.NetworkConfigs({"net": netlist}, ())
    assert [store for _, store in host_local.stores(configs, str(tmp_path))] == [
        str(tmp_path / "srv/ipam/net")
    ]
    sets, problem = pool.range_sets(ipam)
    assert problem is None
    assert [str(r.ranges[0].start) for r in sets] == ["10.1.0.1", "10.2.0.1"]


def test_multus_is_known_by_its_type_in_any_case() -> None:
    plugin = {"Type": "multus", "CNIDir": "/srv/multus"}
    netlist = netconf.NetworkList("m", "0.3.1", (plugin,), "f")
    assert multus.named_dirs([netlist]) == [multus.NamedDir("/srv/multus", None)]


# The bytes of a conf file as Go reads them: UTF-8 only, no byte order mark, each byte of an
# invalid sequence in a string read as U+FFFD.

STRING_BYTES = st.binary(max_size=16).filter(
    lambda data: all(byte >= 0x20 and byte not in b'"\\' for byte in data)
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    STRING_BYTES,
    STRING_BYTES,
    st.sampled_from([b"", b"\xef\xbb\xbf", b"\xff", b" \xc3 "]),
    st.sampled_from(["utf-8", "utf-16", "utf-32-be"]),
)
def test_a_conflist_in_any_bytes_is_read_as_libcni_reads_it(
    libcni_client: LibcniClient,
    tmp_path: Path,
    name: bytes,
    kind: bytes,
    before: bytes,
    encoding: str,
) -> None:
    data = before + (
        b'{"cniVersion":"0.4.0","name":"net' + name + b'","plugins":[{"type":"b' + kind + b'"}]}'
    )
    if encoding != "utf-8":
        data = data.decode("latin-1").encode(encoding)

    read = read_by_both(libcni_client, tmp_path, data)

    if read is None:
        return
    theirs, ours = read
    assert (ours.name, list(ours.plugin_types)) == (
        theirs["name"],
        [p["type"] for p in theirs["plugins"]],
    )


CONFLIST = b'{"cniVersion":"0.4.0","name":"net","plugins":[{"type":"bridge"}]}'


@pytest.mark.parametrize(
    ("data", "said"),
    [
        (codecs.BOM_UTF8 + CONFLIST, "not JSON libcni reads: it starts with a byte order mark"),
        (CONFLIST.decode().encode("utf-16"), "not JSON libcni reads: UTF-16 or UTF-32, not UTF-8"),
        (CONFLIST.decode().encode("utf-32-be"), "UTF-16 or UTF-32"),
        (b"\0" * 64, r"only NUL bytes \(64\), as a crash may leave a file"),
    ],
    ids=["byte order mark", "UTF-16", "UTF-32", "zeroed"],
)
def test_a_conflist_no_runtime_reads_is_refused_saying_why(data: bytes, said: str) -> None:
    """Python's own message would advise decoding with utf-8-sig, or point at char 0."""
    with pytest.raises(ConfigError, match=said):
        parse_conf_bytes(data, "net.conflist", single_plugin=False)


def test_a_conflist_saved_with_a_byte_order_mark_is_named_in_a_warning(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """The runtime refuses the file too (libcni reads no byte order mark): the operator is
    told which file, and why, while every other network is repaired."""
    crashed.node.write_conf("05-bom.conflist", codecs.BOM_UTF8 + CONFLIST)
    damaged = crashed.add(CONTAINER_IDS[0])
    damaged.write_bytes(b"")
    crashed.reboot()

    code, report = crashed.run(capsys)

    warned = [w for w in report["warnings"] if "05-bom.conflist" in w]
    assert len(warned) == 1 and "byte order mark" in warned[0], report["warnings"]
    assert by_path(report)[damaged.name]["outcome"] == "done"
    assert code == ExitCode.OK
