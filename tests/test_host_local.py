"""host-local reservations a crash left without an owner: freed when an earlier boot left them,
only reported when this boot did. (Seen for real in the VM test: host-local writes without
fsync, and a crash leaves its reservation files empty, so DEL can never release them.) A whole
one with no results entry is an orphan: its network's DEL releases it."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni_reaper import cli, host_local, netconf
from cni_reaper.errors import ExitCode
from tests.crashed import Crashed
from tests.nodetree import CONTAINER_IDS, snapshot

NETWORK = "store-net"


def store_node(crashed: Crashed) -> Path:
    conf = {
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "plugins": [{"type": "bridge", "ipam": {"type": "host-local", "subnet": "10.30.0.0/24"}}],
    }
    crashed.node.write_conf("70-store.conflist", json.dumps(conf).encode())
    store = crashed.node.root / "var/lib/cni/networks" / NETWORK
    store.mkdir(parents=True)
    (store / "10.30.0.2").write_bytes(f"{CONTAINER_IDS[0]}\r\neth0".encode())
    (store / "10.30.0.3").write_bytes(b"")
    (store / "10.30.0.4").write_bytes(b"\0" * 70)
    (store / "last_reserved_ip.0").write_bytes(b"")
    (store / "lock").write_bytes(b"")
    return store


def test_reservations_without_an_owner_from_an_earlier_boot_are_freed(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    store = store_node(crashed)
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert code == ExitCode.OK
    assert sorted(os.listdir(store)) == ["last_reserved_ip.0", "lock"]
    found = {r["ip"]: r for r in report["host_local"]}
    orphan = found.pop("10.30.0.2")
    assert (orphan["action"], orphan["outcome"], orphan["quarantined_to"]) == ("del", "done", None)
    assert orphan["del"]["released"] == ["10.30.0.2"]
    assert orphan["del"]["plugins_run"] == ["bridge"]
    assert set(found) == {"10.30.0.3", "10.30.0.4"}
    assert (found["10.30.0.3"]["content"], found["10.30.0.4"]["content"]) == ("empty", "zeroed")
    qdir = crashed.node.quarantine / "11111111-2222-3333-4444-555555555555/host-local" / NETWORK
    for ip, reservation in found.items():
        assert (reservation["action"], reservation["outcome"]) == ("quarantine", "done")
        assert Path(reservation["quarantined_to"]) == qdir / ip
        assert json.loads((qdir / f"{ip}.json").read_text())["ip"] == ip
    assert report["summary"]["host_local"] == {"del/done": 1, "quarantine/done": 2}


def test_in_this_boot_they_are_only_reported_and_a_dry_run_changes_nothing(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    store = store_node(crashed)
    crashed.reboot()
    before = snapshot(crashed.node.root)
    code, report = crashed.run(capsys, "--dry-run")  # by hand, before the unit's run
    assert snapshot(crashed.node.root) == before  # not even this boot's record is written
    outcomes = {r["ip"]: (r["action"], r["outcome"]) for r in report["host_local"]}
    assert outcomes == {
        "10.30.0.2": ("del", "planned"),
        "10.30.0.3": ("quarantine", "planned"),
        "10.30.0.4": ("quarantine", "planned"),
    }
    assert code == ExitCode.OK

    assert crashed.run(capsys)[0] == ExitCode.OK  # the unit's run frees both
    crashed.node.runtime_starts()
    late = store / "10.30.0.9"  # reserved in this boot, its owner not yet written
    late.write_bytes(b"")
    before = snapshot(crashed.node.root)

    code, report = crashed.run(capsys, "--dry-run")

    assert snapshot(crashed.node.root) == before
    outcomes = {r["ip"]: (r["action"], r["outcome"]) for r in report["host_local"]}
    assert outcomes == {"10.30.0.9": ("leave", "skipped")}
    assert report["host_local"][0]["written"] == "current-boot"
    assert code == ExitCode.DATA
    code, report = crashed.run(capsys)
    assert code == ExitCode.DATA
    assert late.exists()


# Reservations as host-local writes them and near them: IDs and ifnames libcni takes and
# refuses ('.', '..', '/', ':', spaces, over 15 bytes, not UTF-8), other lines, NULs, whitespace.
_ids = st.one_of(
    st.sampled_from(["0" * 64, "a", "Z-1.x_", "-a", ".a", "_a"]),
    st.text("aZ09_-./ \xff", max_size=70),
).map(lambda t: t.encode("latin-1"))
_ifnames = st.one_of(
    st.sampled_from(["eth0", ".", "..", "net1", "a" * 15, "a" * 16]),
    st.text("e0.:/ \t~!\xe9\x7f", max_size=17),
).map(lambda t: t.encode())
_separators = st.sampled_from([b"\n", b"\r", b"", b"\r\n\r\n", b" \r\n"])
_edges = st.sampled_from([b"", b" ", b"\n", b"\0", b"\r\n"])
_reservation_bytes = st.one_of(
    st.builds(lambda i, f: i + b"\r\n" + f, _ids, _ifnames),  # as host-local writes them
    st.builds(lambda a, i, s, f, z: a + i + s + f + z, _edges, _ids, _separators, _ifnames, _edges),
    st.binary(max_size=40),
)


@settings(max_examples=2000)
@given(_reservation_bytes)
def test_the_plain_owner_match_says_what_every_check_says(data: bytes) -> None:
    """read_owner()'s one match for a plain '<id>\\r\\n<ifname>' gives, for any bytes, what its
    checks of every case give: the same verdict and owner, so a reservation no DEL may be run
    with is never read as a plain one."""
    assert host_local.read_owner(data) == host_local._read_owner(data)


def test_a_warning_of_the_pools_after_the_head_is_in_every_report(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pool's range that cannot be read is found once every entry is written: the JSON
    document and the text report say it all the same, after the entries."""
    conf = {
        "cniVersion": "1.0.0",
        "name": NETWORK,
        "plugins": [
            {"type": "bridge", "ipam": {"type": "host-local", "ranges": [[{"subnet": "nonsense"}]]}}
        ],
    }
    crashed.node.write_conf("70-store.conflist", json.dumps(conf).encode())
    store = crashed.node.root / "var/lib/cni/networks" / NETWORK
    store.mkdir(parents=True)
    (store / "10.30.0.2").write_bytes(f"{CONTAINER_IDS[0]}\r\neth0".encode())
    crashed.reboot()

    _, report = crashed.run(capsys, "--dry-run")
    said = [w for w in report["later_warnings"] if w.startswith(f"pool of {NETWORK}: ")]
    assert len(said) == 1 and said[0] not in report["warnings"]
    assert report["summary"]["warnings"] == len(report["warnings"]) + len(report["later_warnings"])

    code = cli.run(crashed.argv("--dry-run"), clock=lambda: crashed.t0 + 60, environ={})
    assert f"warning: {said[0]}" in capsys.readouterr().out.splitlines()
    assert code == report["summary"]["exit_code"]


@pytest.mark.parametrize(
    ("ipam", "data_dirs"),
    [
        (None, {"/var/lib/cni/networks"}),  # no ipam: host-local's, by default
        ({"dataDir": "/srv/a"}, {"/srv/a"}),
        ({"type": "host-local", "dataDir": "/srv/a"}, {"/srv/a"}),
        ({"type": "dhcp", "dataDir": "/srv/a"}, set()),
        # flannel looks for the key "type" itself, as a map's key: any other case is no type
        ({"Type": "dhcp", "dataDir": "/srv/a"}, {"/srv/a"}),
        # marshalled from a map, keys in order; host-local takes the last of any case
        ({"datadir": "/srv/b", "dataDir": "/srv/a"}, {"/srv/b"}),
    ],
)
def test_flannels_delegate_runs_host_local_with_flannels_own_ipam(
    ipam: dict[str, str] | None, data_dirs: set[str]
) -> None:
    plugin: dict[str, object] = {"type": "flannel"}
    if ipam is not None:
        plugin["ipam"] = ipam
    conf = {"cniVersion": "1.0.0", "name": "cbr0", "plugins": [plugin]}
    netlist = netconf.parse_conf_bytes(json.dumps(conf).encode(), "cbr0.conflist", False)
    configs = netconf.NetworkConfigs({"cbr0": netlist}, ())

    assert host_local.data_dirs(configs) == data_dirs
    assert host_local.twice(netlist) is None
    chained = {**conf, "plugins": [plugin, {"type": "host-local", "ipam": {}}]}
    doubled = netconf.parse_conf_bytes(json.dumps(chained).encode(), "cbr0.conflist", False)
    assert (host_local.twice(doubled) is None) == (not data_dirs)


@settings(max_examples=150, deadline=None)
@given(
    layout=st.tuples(st.integers(0, 5), st.integers(0, 4) | st.none(), st.booleans()),
    limit=st.integers(0, 12),
)
def test_a_store_only_scratch_files_name_is_taken_only_within_so_many_names(
    layout: tuple[int, int | None, bool], limit: int
) -> None:
    """Model (host_local.named_store_problem, the bound made limit): a store is refused when
    others may write it, or when its names, its subdirectories' too (here: files, and a
    subdirectory of files or none), are more than the bound; taken otherwise; and a dir that
    is not there is nothing to refuse."""
    files, below, shared = layout
    with (
        tempfile.TemporaryDirectory() as top,
        mock.patch.object(host_local, "MAX_NAMED_STORE_NAMES", limit),
    ):
        assert host_local.named_store_problem(os.path.join(top, "none")) is None
        store = os.path.join(top, "s")
        os.mkdir(store)
        for n in range(files):
            Path(store, f"f{n}").touch()
        if below is not None:
            os.mkdir(os.path.join(store, "d"))
            for n in range(below):
                Path(store, "d", f"f{n}").touch()
        os.chmod(store, 0o777 if shared else 0o755)
        names = files + (0 if below is None else 1 + below)

        problem = host_local.named_store_problem(store)

        if shared:
            assert problem == "may be written by others than root"
        elif names > limit:
            assert problem == f"holds more than {limit:,} names"
        else:
            assert problem is None
