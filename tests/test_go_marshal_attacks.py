"""Attacks on 87adcc2 and 59efeb6: a plugin's stdin written as libcni writes it (go_marshal.py)
and a conf's bytes read as Go reads them (netconf.as_go_reads), against what libcni 1.1.2
(tests/libcni_client) hands a recording plugin on DEL, after its own ADD cached a result.

Found on 2026-12-06, four defects, strict xfails on 59efeb6:
- prevResult is written as a map, keys sorted; libcni injects its typed Result, which Go writes
  in the struct's field order (cniVersion, interfaces, ips, routes, dns), so when no
  runtimeConfig is injected (the common DEL: no capability asked for) the stdin is not the
  bytes libcni hands the plugin, though the same document. Kept as it is: the plugin decodes
  the same, and the field order is libcni's release's (1.2 adds fields); the test now holds
  the document equal. With a runtimeConfig libcni re-marshals the stdin through a map, and the
  bytes agree (a passing test);
- a cached result holding a number no float64 holds (1e400) fails the DEL before any plugin
  runs ("its config cannot be written", exit 73); libcni 1.1.2 cannot decode its cache entry,
  falls back to reading the file as a legacy result, finds an empty one, runs the plugins with
  it and removes the entry. Left, a strict xfail: no runtime writes such a file, and the
  reaper's DEL of a sandbox no runtime knows uses what the entry cached, as libcni's GC would,
  which skips an entry it cannot decode;
- a bare integer that rounds to float64's largest (up to half a unit past it) is a number Go
  decodes, and netconf refused the whole config as out of range: mended (as float() rounds);
- float64_text's digits depended on the calling thread's decimal context (normalize rounded
  to its precision; a trap on Inexact raised decimal.Inexact): mended, no decimal arithmetic.
Held: the cached result with a runtimeConfig; half a unit past float64's largest refused by
both; a byte not UTF-8 in a network's name reaching the plugin as libcni's per-byte U+FFFD;
whatever a cached result holds (lone surrogates, a huge list) written as ASCII JSON.
"""

from __future__ import annotations

import base64
import decimal
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cni_reaper import cache, go_marshal
from cni_reaper.errors import ExitCode
from cni_reaper.netconf import ConfigError, parse_conf_bytes
from cni_reaper.prev_result import convert
from cni_reaper.repair.replay import plugin_stdin
from tests.crashed import Crashed, by_path
from tests.nodetree import CONTAINER_IDS
from tests.real_libcni import LibcniClient
from tests.test_del_attacks import containerd_knows
from tests.test_go_fields_attacks import recording_plugins, stdin_pair

A = CONTAINER_IDS[0]

RESULT_100 = {
    "cniVersion": "1.0.0",
    "interfaces": [{"name": "eth0", "mac": "aa:bb:cc:dd:ee:ff", "sandbox": "/run/netns/x"}],
    "ips": [{"interface": 0, "address": "10.0.0.5/24", "gateway": "10.0.0.1"}],
    "routes": [{"dst": "0.0.0.0/0"}],
    "dns": {"nameservers": ["10.0.0.1"]},
}


def add_then_del(
    client: LibcniClient,
    tmp_path: Path,
    plugin: dict[str, Any],
    result: dict[str, Any],
    caps: dict[str, Any],
) -> tuple[bytes, bytes]:
    """(libcni's, the reaper's) DEL stdin for an attachment libcni ADDed through a recording
    plugin that answered result: libcni's as the plugin received it on DEL, the reaper's from
    the entry libcni cached, read as the reaper reads it (cache.read_cached, convert)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "answer").write_text(json.dumps(result))
    rec = bin_dir / "rec"
    rec.write_text(
        '#!/bin/sh\nif [ "$CNI_COMMAND" = ADD ]; then cat >/dev/null; '
        f'cat "{tmp_path}/answer"; else cat > "{tmp_path}/seen"; fi\n'
    )
    rec.chmod(0o755)
    doc = {"cniVersion": "1.0.0", "name": "net", "plugins": [plugin]}
    path = tmp_path / "net.conflist"
    path.write_text(json.dumps(doc))
    where: dict[str, Any] = {
        "conflist": path,
        "bin_dirs": (str(bin_dir),),
        "cache_dir": tmp_path / "cache",
        "capability_args": caps,
    }
    added = client.run("add", A, "eth0", **where)
    assert added.ok, added.error
    mine = reaper_stdin(tmp_path / "cache/results")
    deleted = client.run("del", A, "eth0", **where)
    assert deleted.ok, deleted.error
    return (tmp_path / "seen").read_bytes(), mine


def reaper_stdin(results: Path) -> bytes:
    fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY)
    try:
        (entry,) = cache.whole_entries(fd, "net", {"net"})
        cached = cache.read_cached(fd, entry)
    finally:
        os.close(fd)
    assert not isinstance(cached, str) and cached.config is not None
    assert cached.result is not None
    netlist = parse_conf_bytes(cached.config, "cached", single_plugin=False)
    prev = convert(cached.result, netlist.cni_version)
    return plugin_stdin(netlist, netlist.plugins[0], cached.capability_args, prev)


def test_a_cached_result_reaches_the_plugin_as_the_document_libcni_hands_it(
    libcni_client: LibcniClient, tmp_path: Path
) -> None:
    """With no runtimeConfig, libcni writes its typed Result in the struct's field order, which
    differs between libcni releases (1.2 adds fields); the reaper writes its keys sorted, as
    libcni does with a runtimeConfig. The plugin decodes the same document."""
    theirs, mine = add_then_del(libcni_client, tmp_path, {"type": "rec"}, RESULT_100, {})

    assert b'"prevResult":{"cniVersion":"1.0.0","interfaces":[{"name":"eth0",' in theirs
    assert json.loads(theirs) == json.loads(mine)


def test_with_a_runtime_config_the_cached_result_reaches_the_plugin_as_libcni_hands_it(
    libcni_client: LibcniClient, tmp_path: Path
) -> None:
    """libcni injects runtimeConfig through a second map, which sorts prevResult's keys too."""
    plugin = {"type": "rec", "capabilities": {"portMappings": True}, "mtu": 1500.0}
    caps = {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]}

    theirs, mine = add_then_del(libcni_client, tmp_path, plugin, RESULT_100, caps)

    assert mine == theirs
    assert b'"mtu":1500,' in mine and b'"prevResult":{"cniVersion":"1.0.0","dns":{' in mine


def cache_entry(result_json: str) -> bytes:
    config = json.dumps({"cniVersion": "1.0.0", "name": "f", "plugins": [{"type": "right"}]})
    return (
        '{"kind":"cniCacheV1","containerId":"' + A + '","config":"'
        + base64.b64encode(config.encode()).decode()
        + '","ifName":"eth0","networkName":"f","result":' + result_json + "}"
    ).encode()  # fmt: skip


OUT_OF_RANGE_RESULT = '{"cniVersion":"1.0.0","ips":[{"address":"10.0.0.5/24"}],"x":1e400}'


def test_libcni_dels_through_a_cached_result_no_float64_holds(
    libcni_client: LibcniClient, tmp_path: Path
) -> None:
    """What libcni 1.1.2 does with it: its cniCacheV1 decoding fails, the legacy decoding
    finds an empty 0.2.0 result, the plugins run with that, and the entry is removed."""
    seen = tmp_path / "seen"
    bin_dir = recording_plugins(tmp_path, seen, "right")
    path = tmp_path / "f.conflist"
    path.write_text(
        json.dumps({"cniVersion": "1.0.0", "name": "f", "plugins": [{"type": "right"}]})
    )
    results = tmp_path / "cache/results"
    results.mkdir(parents=True)
    entry = results / f"f-{A}-eth0"
    entry.write_bytes(cache_entry(OUT_OF_RANGE_RESULT))

    run = libcni_client.run(
        "del", A, "eth0", conflist=path, bin_dirs=(str(bin_dir),), cache_dir=tmp_path / "cache"
    )

    assert run.ok, run.error
    assert seen.read_text().splitlines()[:2] == [
        "right",
        '{"cniVersion":"1.0.0","name":"f","prevResult":{"cniVersion":"1.0.0","dns":{}},'
        '"type":"right"}',
    ]
    assert not entry.exists()


@pytest.mark.xfail(
    strict=True,
    reason="plugin_stdin raises ValueError for the inf, and replay fails the DEL before any "
    "plugin runs; libcni reads the entry as an empty legacy result and DELs",
)
def test_a_cached_result_no_float64_holds_is_deleted_as_libcni_deletes_it(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """containerd knows another sandbox only: the entry is of a sandbox no runtime will DEL."""
    containerd_knows(crashed, CONTAINER_IDS[3])
    seen = tmp_path / "seen"
    bin_dir = recording_plugins(crashed.node.root, seen, "right")
    conflist = {"cniVersion": "1.0.0", "name": "f", "plugins": [{"type": "right"}]}
    crashed.node.write_conf("60-f.conflist", json.dumps(conflist).encode())
    entry = crashed.node.write_result(f"f-{A}-eth0", cache_entry(OUT_OF_RANGE_RESULT))
    crashed.reboot()

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir))

    e = by_path(report)[entry.name]
    assert (e["outcome"], code) == ("done", ExitCode.OK), e["plugin_errors"]
    assert seen.exists() and seen.read_text().splitlines()[0] == "right"


FLOAT64_MAX = int(1.7976931348623157e308)
HALF_AN_ULP = 2**970  # float64's largest plus this rounds to infinity; anything less, to it


def plugin_with(number: int) -> str:
    return '{"type":"rec","n":' + str(number) + "}"


@pytest.mark.parametrize(
    "number", [FLOAT64_MAX + 1, -(FLOAT64_MAX + HALF_AN_ULP - 1)], ids=["max+1", "-(max+ulp/2-1)"]
)
def test_an_integer_go_rounds_to_float64_s_largest_reaches_the_plugin_as_libcni_writes_it(
    libcni_client: LibcniClient, tmp_path: Path, number: int
) -> None:
    theirs, mine = stdin_pair(libcni_client, tmp_path, plugin_with(number), {})

    assert b'"n":' + (b"-" if number < 0 else b"") + b"1.7976931348623157e+308" in theirs
    assert mine == theirs


def test_half_an_ulp_past_float64_s_largest_is_refused_by_both(
    libcni_client: LibcniClient, tmp_path: Path
) -> None:
    plugin = plugin_with(FLOAT64_MAX + HALF_AN_ULP)
    with pytest.raises(AssertionError, match="cannot unmarshal number"):  # libcni's error
        stdin_pair(libcni_client, tmp_path, plugin, {})
    doc = '{"cniVersion":"0.4.0","name":"net","plugins":[' + plugin + "]}"
    with pytest.raises(ConfigError, match="out of float64's range"):
        parse_conf_bytes(doc.encode(), "f", single_plugin=False)


@pytest.fixture
def caller_s_decimal_context() -> Iterator[decimal.Context]:
    """The thread's decimal context as a caller embedding the package may have set it."""
    with decimal.localcontext() as context:
        yield context


def test_the_caller_s_decimal_precision_does_not_change_what_a_plugin_reads(
    caller_s_decimal_context: decimal.Context,
) -> None:
    caller_s_decimal_context.prec = 3
    netlist = parse_conf_bytes(
        b'{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"x","mtu":9001,"r":0.1234}]}',
        "f",
        single_plugin=False,
    )

    stdin = plugin_stdin(netlist, netlist.plugins[0], None)

    assert stdin == b'{"cniVersion":"1.0.0","mtu":9001,"name":"n","r":0.1234,"type":"x"}'


def test_the_caller_s_decimal_traps_do_not_end_the_writing(
    caller_s_decimal_context: decimal.Context,
) -> None:
    caller_s_decimal_context.prec = 3
    caller_s_decimal_context.traps[decimal.Inexact] = True

    assert go_marshal.marshal({"r": [0.1234]}) == '{"r":[0.1234]}'


def test_a_byte_not_utf8_in_a_name_reaches_the_plugin_as_libcni_names_it(
    libcni_client: LibcniClient, tmp_path: Path
) -> None:
    """Each byte of a truncated sequence one U+FFFD, as Go reads it, in the name libcni
    injects and in the plugin's own strings."""
    seen = tmp_path / "seen"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    rec = bin_dir / "rec"
    rec.write_text(f'#!/bin/sh\ncat > "{seen}"\n')
    rec.chmod(0o755)
    doc = b'{"cniVersion":"0.4.0","name":"n\xe2\x82","plugins":[{"type":"rec","s":"\xf0\x9f\x98"}]}'
    path = tmp_path / "net.conflist"
    path.write_bytes(doc)
    run = libcni_client.run("del", A, "eth0", conflist=path, bin_dirs=(str(bin_dir),))
    assert run.ok, run.error

    netlist = parse_conf_bytes(doc, "f", single_plugin=False)
    mine = plugin_stdin(netlist, netlist.plugins[0], None)

    theirs = json.loads(seen.read_bytes())
    assert (netlist.name, theirs["name"]) == ("n\ufffd\ufffd", "n\ufffd\ufffd")
    assert json.loads(mine) == theirs and theirs["s"] == "\ufffd" * 3


@pytest.mark.parametrize(
    "value",
    [
        {"\udc80": ["\ud800x", {"\udfff": None}], "\ue000": True},
        {"ips": [[[1e-7, -0.0, 2**53 + 1]] * 3] * 20000},
    ],
    ids=["lone surrogates", "a huge list"],
)
def test_whatever_a_cached_result_holds_is_written_as_ascii_json(value: dict[str, Any]) -> None:
    netlist = parse_conf_bytes(
        b'{"cniVersion":"1.0.0","name":"n","plugins":[{"type":"x"}]}', "f", single_plugin=False
    )

    stdin = plugin_stdin(netlist, netlist.plugins[0], None, value)

    assert stdin.isascii()
    assert json.loads(stdin)["prevResult"].keys() == value.keys()
