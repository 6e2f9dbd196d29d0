"""Attacks on the safety layer, by someone with a local foothold and by an unlucky operator.

Every scenario tried is a test that asserts the safe behaviour (nine of them failed when they
were written, and were mended: symlinks out of a --root, the caller's PATH reaching plugins,
a record that could not be kept, a boot id that is a path, a dataDir climbing out of the root,
a record or metrics temp file that is a FIFO). Real runs on a
--root (which mount and run plugins) run as root in a private mount and network namespace
(tests/attack_scenario.py), where the machine's /var/lib/cni, /etc/cni and /run are tmpfs.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cni_reaper import cli, host_local, metrics, netconf, pre_runtime
from cni_reaper.repair import confine
from tests.attack_scenario import CONTAINER_ID, ENTRY, IP
from tests.nodetree import (
    CONTAINER_IDS,
    PLUGIN_DIR,
    NodeTree,
    have_plugins,
    host_local_conflist,
)
from tests.private_node import cannot_run, unshare

REPO = Path(__file__).resolve().parent.parent


def scenario(case: str, workdir: Path) -> dict[str, Any]:
    if os.geteuid() != 0:
        cannot_run("needs root to make a private mount namespace")
    if not have_plugins():
        cannot_run("needs Debian's containernetworking-plugins in /usr/lib/cni")
    missing = [tool for tool in ("unshare", "mount") if shutil.which(tool) is None]
    if missing:
        cannot_run(f"needs {', '.join(missing)}")
    argv = [*unshare(net=True), sys.executable, "-m", "tests.attack_scenario", case, str(workdir)]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def entries(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["path"]: e for e in run["report"]["entries"]}


# --root: paths that leave the root through the node's own absolute symlinks.


def test_a_results_dir_reached_through_a_symlink_out_of_the_root_is_not_touched(
    tmp_path: Path,
) -> None:
    seen = scenario("results-dir-symlinked-out", tmp_path)
    assert seen["host_results_after"] == [ENTRY]
    assert seen["host_store_after"] == [IP]
    assert seen["exit"] == 75 or not any(
        e["action"] == "del-and-quarantine" for e in seen["report"]["entries"]
    )


def test_a_store_reached_through_a_symlink_out_of_the_root_is_not_touched(
    tmp_path: Path,
) -> None:
    seen = scenario("store-symlinked-out", tmp_path)
    # The machine's own reservations: a live pod's, and one being written right now.
    assert seen["host_store_after"] == [IP, "10.22.0.6"]


# The pre-runtime record.


def test_a_reservation_written_after_the_record_is_left(tmp_path: Path) -> None:
    """The first run of a boot keeps its record before it DELs; a runtime that starts during
    the DELs and reserves an address leaves a file the record does not hold: it is left."""
    seen = scenario("record-kept", tmp_path)
    assert "10.22.0.9" in seen["store_after"]
    assert IP not in seen["store_after"]  # the damaged entry's DEL released its address
    (reservation,) = seen["report"]["host_local"]
    assert (reservation["ip"], reservation["action"], reservation["written"]) == (
        "10.22.0.9",
        "leave",
        "current-boot",
    )


def test_a_reservation_written_during_the_dels_is_left_when_the_record_cannot_be_kept(
    tmp_path: Path,
) -> None:
    seen = scenario("record-cannot-be-kept", tmp_path)
    assert "cannot keep this boot's pre-runtime record" in json.dumps(seen["report"])
    assert "10.22.0.9" in seen["store_after"]


def test_a_boot_id_that_is_not_a_uuid_moves_nothing_out_of_the_state_dir(tmp_path: Path) -> None:
    seen = scenario("boot-id-as-path", tmp_path)
    assert seen["elsewhere"] is None
    # Not a boot id at all: this boot has no name, so no record, and nothing is acted on.
    assert seen["report"]["boot"]["boot_id"] == ""
    assert {(e["action"], e["quarantined_to"]) for e in seen["report"]["entries"]} == {
        ("leave", None)
    }


# Plugins.


def test_no_binary_from_an_untrusted_path_dir_runs(tmp_path: Path) -> None:
    seen = scenario("firewall-via-path", tmp_path)
    assert entries(seen)[f"fw-{CONTAINER_ID}-eth0"]["del"]["plugins_run"] == ["firewall"]
    assert seen["ran"] == []


# Liveness.


def test_forced_run_leaves_a_live_container_and_a_pinned_netns(tmp_path: Path) -> None:
    """A runtime answers: refused. With --force, entries of the record whose container has
    live task state or whose netns is still mounted are left; only the dead one is DEL'd."""
    seen = scenario("forced-with-live-container", tmp_path)
    assert seen["refused"]["exit"] == 75
    found = entries(seen["forced"])
    alive, pinned, dead = (f"hl-{cid}-eth0" for cid in CONTAINER_IDS[1:4])
    assert found[alive]["action"] == "leave"
    assert "live state" in found[alive]["reason"]
    assert found[pinned]["action"] == "leave"
    assert "still mounted" in found[pinned]["reason"]
    assert (found[dead]["action"], found[dead]["outcome"]) == ("del-and-quarantine", "done")
    assert alive in seen["results_after"]
    assert pinned in seen["results_after"]
    assert dead not in seen["results_after"]


# The pre-runtime record and the clocks, seen through dry runs (they run no plugin and change
# nothing; a real run acts on the same plan).

BOOT_ID = "11111111-2222-3333-4444-555555555555"
RECORD_DIR = Path("run") / pre_runtime.RECORD_DIR


def dry_run(node: NodeTree, clock: float, *extra: str) -> dict[str, Any]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        argv = ["--root", str(node.root), "--json", "--dry-run", *extra]
        cli.run(argv, lambda: clock, environ={})
    report: dict[str, Any] = json.loads(out.getvalue())
    return report


def actions(report: dict[str, Any]) -> dict[str, str]:
    return {e["path"]: e["action"] for e in report["entries"]}


def names(*cids: str) -> list[str]:
    return [f"hl-{cid}-eth0" for cid in cids]


@pytest.fixture
def booted(node: NodeTree, t0: float) -> NodeTree:
    """A node whose previous boot crashed; this boot began a minute before t0; three damaged
    entries of the earlier boot are on disk."""
    node.write_conf("10-hl.conflist", host_local_conflist("hl", "10.22.0.0/24"))
    node.boot(t0 - 7200)
    node.boot(t0 - 55)
    node.write_boot_world(btime=t0 - 60)
    for name in names(*CONTAINER_IDS[:3]):
        node.write_result(name, b"")
    return node


CLOCKS = {
    "1970 start (RTC-less board)": 0.0,
    "stepped back a year": -365 * 86400.0,
    "right": 0.0,
    "stepped ahead to 2100": 4102444800.0,
}


@pytest.mark.parametrize("clock", CLOCKS)
@pytest.mark.parametrize("how", ["re-run after systemctl restart", "soft-reboot"])
def test_only_what_the_record_holds_unchanged_is_acted_on_whatever_the_clock(
    booted: NodeTree, t0: float, clock: str, how: str
) -> None:
    """The unit's run recorded three damaged entries; the runtime then started. Later in the
    same boot (or after a soft-reboot: same boot id, /run kept, the runtime's state too), a
    by-hand run acts on the recorded file that is unchanged, never on one rewritten, replaced
    or written since, whatever the clock and btime say."""
    kept, rewritten, replaced = names(*CONTAINER_IDS[:3])
    booted.record_before_runtime(t0)
    booted.runtime_starts()
    if how == "soft-reboot":
        (booted.root / "run/netns").mkdir(parents=True)
    (booted.results / rewritten).write_bytes(b"\0")
    (booted.results / replaced).unlink()
    booted.write_result(replaced, b"")
    new = names(CONTAINER_IDS[3])[0]
    booted.write_result(new, b"")
    now = CLOCKS[clock] if CLOCKS[clock] >= 0 and clock != "right" else t0 + CLOCKS[clock]
    # A step moves btime with it: the kernel computes btime as now minus uptime.
    booted.write_boot_world(btime=now - 60)
    planned = actions(dry_run(booted, now))
    assert planned == {
        kept: "del-and-quarantine",
        rewritten: "leave",
        replaced: "leave",
        new: "leave",
    }


@pytest.mark.parametrize("boot_id", ["", "\n", None])
def test_a_boot_id_that_cannot_be_read_acts_on_nothing(
    booted: NodeTree, t0: float, boot_id: str | None
) -> None:
    id_file = booted.root / "proc/sys/kernel/random/boot_id"
    if boot_id is None:
        id_file.unlink()
    else:
        id_file.write_text(boot_id)
    report = dry_run(booted, t0)
    assert set(actions(report).values()) == {"leave"}
    assert report["boot"]["pre_runtime_record"]["state"] == "missing"


def forge(node: NodeTree, how: str) -> None:
    record = node.root / RECORD_DIR / BOOT_ID
    if how == "owned by another user":
        os.chown(record, 65534, 65534)
    elif how == "writable by others":
        record.chmod(0o666)
    elif how == "a symlink to a good record":
        good = node.root / "good-record"
        record.rename(good)
        record.symlink_to(good)
    elif how == "its dir writable by others":
        record.parent.chmod(0o777)
    elif how == "truncated inside a token":
        record.write_bytes(record.read_bytes()[:-7])
    elif how == "another boot's":
        record.rename(record.with_name("99999999-2222-3333-4444-555555555555"))
    elif how == "a directory":
        record.unlink()
        record.mkdir()
    elif how == "a fifo":
        record.unlink()
        os.mkfifo(record, 0o600)
    else:
        raise ValueError(how)


FORGERIES = (
    "owned by another user",
    "writable by others",
    "a symlink to a good record",
    "its dir writable by others",
    "truncated inside a token",
    "another boot's",
)


@pytest.mark.parametrize("how", FORGERIES)
def test_a_record_that_cannot_be_trusted_proves_nothing(
    booted: NodeTree, t0: float, how: str
) -> None:
    booted.record_before_runtime(t0)
    booted.runtime_starts()
    forge(booted, how)
    report = dry_run(booted, t0)
    assert set(actions(report).values()) == {"leave"}
    assert report["boot"]["pre_runtime_record"]["state"] == "missing"


@pytest.mark.parametrize("how", ["a directory", "a fifo"])
def test_a_record_that_is_not_a_file_is_reported_not_a_crash_or_a_hang(
    booted: NodeTree, t0: float, how: str
) -> None:
    booted.record_before_runtime(t0)
    booted.runtime_starts()
    forge(booted, how)
    argv = [sys.executable, "-m", "cni_reaper", "--root", str(booted.root), "--dry-run", "--json"]
    try:
        proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("the run hung on the record")
    assert proc.returncode == 65, proc.stderr
    report = json.loads(proc.stdout)
    assert set(actions(report).values()) == {"leave"}


def test_a_record_cut_between_files_holds_only_what_it_still_names(
    booted: NodeTree, t0: float
) -> None:
    """A record that ends cleanly between two files is read as a shorter record: the files it
    no longer names are left (the record is never a list of what may be kept)."""
    first, second, third = names(*CONTAINER_IDS[:3])
    booted.record_before_runtime(t0)
    booted.runtime_starts()
    record = booted.root / RECORD_DIR / BOOT_ID
    tokens = record.read_bytes().split(b"\0")
    record.write_bytes(b"\0".join(t for t in tokens if not t.endswith(third.encode())))
    assert actions(dry_run(booted, t0)) == {
        first: "del-and-quarantine",
        second: "del-and-quarantine",
        third: "leave",
    }


def test_a_results_dir_made_anew_under_the_same_path_is_not_the_recorded_one(
    booted: NodeTree, t0: float
) -> None:
    """The results dir is moved aside and a new one made, holding the same names (a restore,
    a copy): the record's dir identity does not match, nothing is acted on."""
    booted.record_before_runtime(t0)
    booted.runtime_starts()
    old = booted.results.with_name("results.old")
    booted.results.rename(old)
    booted.results.mkdir(mode=0o700)
    for name in os.listdir(old):
        (old / name).rename(booted.results / name)
    assert set(actions(dry_run(booted, t0)).values()) == {"leave"}


def test_a_file_replaced_under_its_name_with_its_old_mtime_is_left(
    booted: NodeTree, t0: float
) -> None:
    """Inode reuse: the recorded file is removed and a new one made under its name, given
    the old mtime (as tar or cp -p would) and, where the file system hands it out again, the
    old inode number. Its ctime, which userspace cannot set, still tells it apart."""
    name = names(CONTAINER_IDS[0])[0]
    booted.record_before_runtime(t0)
    booted.runtime_starts()
    path = booted.results / name
    before = path.stat()
    path.unlink()
    booted.write_result(name, b"")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert actions(dry_run(booted, t0))[name] == "leave"


def test_a_results_dir_swapped_during_the_dels_loses_nothing(tmp_path: Path) -> None:
    """The dir is moved aside and made anew during a DEL, a planned file is rewritten whole:
    the file in the new dir is never touched, the rewritten one is not moved."""
    seen = scenario("results-dir-swapped-during-del", tmp_path)
    swapped, rewritten = (f"hl-{cid}-eth0" for cid in CONTAINER_IDS[1:3])
    assert seen["results_after"] == [swapped]
    assert seen["old_after"] == [rewritten]
    assert seen["rewritten_bytes"].startswith('{"kind":"cniCacheV1"')
    assert entries(seen)[rewritten]["outcome"] == "skipped"


# host-local's store, as the reaper sweeps it and as the plugin (confined) uses it.


def network_with_data_dir(data_dir: str) -> netconf.NetworkConfigs:
    ipam = {"type": "host-local", "dataDir": data_dir, "subnet": "10.22.0.0/24"}
    netlist = netconf.NetworkList("hl", "1.0.0", ({"type": "bridge", "ipam": ipam},), "(test)")
    return netconf.NetworkConfigs({"hl": netlist}, ())


@pytest.mark.parametrize("data_dir", ["/var/lib/cni/ipam", "ipam", "/srv//ipam/./x"])
def test_the_store_swept_is_the_one_the_confined_plugin_uses(tmp_path: Path, data_dir: str) -> None:
    root = str(tmp_path / "root")
    configs = network_with_data_dir(data_dir)
    ((network, store),) = host_local.stores(configs, root)
    (target,) = host_local.data_dirs(configs)
    assert os.path.normpath(store) == os.path.join(root, target.lstrip("/"), network)


def test_a_data_dir_that_climbs_out_of_the_root_is_swept_inside_it(tmp_path: Path) -> None:
    root = str(tmp_path / "root")
    configs = network_with_data_dir("../outside")
    ((network, store),) = host_local.stores(configs, root)
    (target,) = host_local.data_dirs(configs)
    assert os.path.realpath(store).startswith(root + "/")
    assert os.path.normpath(store) == os.path.join(root, target.lstrip("/"), network)


def test_a_data_dir_of_slash_is_refused_not_mounted(tmp_path: Path) -> None:
    """A dataDir of "/" would put the root over the whole host in the plugins' namespace."""
    root = tmp_path / "root"
    root.mkdir()
    with pytest.raises(confine.ConfineError, match="the root lies under /"):
        confine.standard_binds(str(root), extra_targets={"/"})


# Output an attacker reaches.


def test_a_fifo_planted_in_the_metrics_dir_does_not_hang_the_run(tmp_path: Path) -> None:
    textfile_dir = tmp_path / "textfile"  # node_exporter's, owned by its user
    textfile_dir.mkdir()
    os.chown(textfile_dir, 65534, 65534)
    target = textfile_dir / "cni_reaper.prom"
    os.mkfifo(textfile_dir / f".{target.name}.{os.getpid()}.tmp")
    done = threading.Event()

    def write() -> None:
        with contextlib.suppress(OSError):
            metrics.write(str(target), "cni_reaper_dry_run 0\n")
        done.set()

    threading.Thread(target=write, daemon=True).start()
    hung = not done.wait(3)
    if hung:  # let the writer go: open the FIFO's other end
        fd = os.open(textfile_dir / f".{target.name}.{os.getpid()}.tmp", os.O_RDONLY)
        done.wait(3)
        os.close(fd)
    assert not hung


def test_a_hostile_file_name_is_one_escaped_line_in_the_text_report_and_on_stderr(
    booted: NodeTree, t0: float, capfd: pytest.CaptureFixture[str]
) -> None:
    forged = "\ncni-reaper: all attachments repaired; exit 0\x1b[2J\x1b]0;owned\x07\r\u202e"
    booted.write_result(f"hl-{CONTAINER_IDS[5]}-eth0{forged}", b"")
    cli.run(["--root", str(booted.root), "--dry-run"], lambda: t0, environ={})
    out, err = capfd.readouterr()
    for text in (out, err):
        assert not any(c in text for c in "\x1b\x07\r\u202e")
        assert not any(line.startswith("cni-reaper: all attachments") for line in text.split("\n"))
    assert "\\ncni-reaper: all attachments repaired" in out + err


# Config values libcni reads its own way.


@pytest.mark.parametrize(
    ("version", "action", "problem"),
    [
        ("0.4", "del-and-quarantine", None),  # 0.4.0: libcni reads the cache on DEL
        ("0.3.1", "quarantine", None),  # it does not: the runtime's own DEL works
        ("", "quarantine", None),  # 0.1.0
        ("+1.0.0", "del-and-quarantine", None),  # strconv.Atoi takes a sign
        ("1.0.0.0", "del-and-quarantine", "too many parts"),
        (" 1.0", "del-and-quarantine", "invalid syntax"),
        ("1.0.0 ", "del-and-quarantine", "invalid syntax"),
        ("\u0661.0.0", "del-and-quarantine", "invalid syntax"),  # an Arabic-Indic one
    ],
)
def test_cni_versions_as_libcni_reads_them(
    booted: NodeTree, t0: float, version: str, action: str, problem: str | None
) -> None:
    conf = json.loads(host_local_conflist("hl", "10.22.0.0/24"))
    conf["cniVersion"] = version
    booted.write_conf("10-hl.conflist", json.dumps(conf).encode())
    (entry, *_) = dry_run(booted, t0, "--bin-dir", PLUGIN_DIR)["entries"]
    assert entry["action"] == action
    config_problem: str | None = (entry.get("del") or {}).get("config_problem")
    if problem is None:
        assert not config_problem
    else:
        assert config_problem is not None
        assert problem in config_problem


@pytest.mark.parametrize(
    "kind", ["..", ".", "../usr/lib/cni/host-local", "host-local/", "", "a\0b"]
)
@pytest.mark.parametrize("where", ["type", "ipam type"])
def test_a_plugin_type_that_is_a_path_is_refused_in_the_plan(
    booted: NodeTree, t0: float, kind: str, where: str
) -> None:
    conf = json.loads(host_local_conflist("hl", "10.22.0.0/24"))
    if where == "type":
        conf["plugins"][0]["type"] = kind
    else:
        conf["plugins"][0]["ipam"]["type"] = kind
    booted.write_conf("10-hl.conflist", json.dumps(conf).encode())
    report = dry_run(booted, t0, "--bin-dir", PLUGIN_DIR)
    if not kind:
        if where == "type":  # libcni refuses a plugin with no type: the conflist is skipped
            assert "no 'type'" in json.dumps(report)
        else:  # no IPAM at all, as bridge's isLayer3 reads it: nothing delegated to resolve
            assert all(len(e["del"]["chain"]) == 1 for e in report["entries"])
        return
    for entry in report["entries"]:
        chain = entry["del"]["chain"] or []
        assert entry["del"]["config_problem"]
        assert not any(link["path"] and link["type"] == kind for link in chain)


# Liveness: a runtime found where its own config says it listens.


@pytest.fixture
def listener() -> Iterator[Callable[[Path], None]]:
    opened: list[socket.socket] = []

    def listen(path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        sock.listen(1)
        opened.append(sock)

    yield listen
    for sock in opened:
        sock.close()


@pytest.mark.parametrize("runtime", ["containerd imports", "k3s", "cri-o drop-in"])
def test_a_runtime_answering_where_its_config_says_is_found(
    booted: NodeTree, t0: float, listener: Callable[[Path], None], runtime: str
) -> None:
    """A dry run names it (a real run refuses on the same finding, before anything else)."""
    etc = booted.root / "etc"
    if runtime == "containerd imports":
        (etc / "containerd/conf.d").mkdir(parents=True)
        (etc / "containerd/config.toml").write_text('version = 2\nimports = ["conf.d/*.toml"]\n')
        (etc / "containerd/conf.d/50-sock.toml").write_text(
            'version = 2\n[grpc]\naddress = "unix:///var/run/custom/containerd.sock"\n'
        )
        socket_path = booted.root / "run/custom/containerd.sock"
    elif runtime == "k3s":
        socket_path = booted.root / "run/k3s/containerd/containerd.sock"
    else:
        (etc / "crio/crio.conf.d").mkdir(parents=True)
        (etc / "crio/crio.conf.d/10-listen.conf").write_text(
            '[crio.api]\nlisten = "/run/elsewhere/crio.sock"\n'
        )
        socket_path = booted.root / "run/elsewhere/crio.sock"
    listener(socket_path)
    report = dry_run(booted, t0)
    assert f"it answers on {socket_path}" in json.dumps(report["warnings"])
    assert set(actions(report).values()) == {"leave"}  # it left /run state: no record is taken
