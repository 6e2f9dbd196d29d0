"""A review of the fixes to Multus's `cniDir` (65a1d40: multus.named_dirs, MultusCache.inside,
cli._Delegates.open and cached_by, multus_repair.moved_earlier by dir, MAX_NAMED_DIRS) and of
8c3b870 (CRI-O containers.json metadata that is no string), as an attacker and an unlucky
operator would meet them. Eleven were defects, strict xfails on 65a1d40, mended since (found
on 2026-12-06: the skip with a warning lost the delegates a skipped dir's Multus caches and
DEL'd their addresses as orphans; a later null key; the cap spent on dirs that hold no
descriptor; MultusCache.inside() through a bind mount, past its depth or on a `..` it cannot
open, now one walk of the state dir by identity; CRI-O's metadata key in another spelling).
The one lost repair it found, a damaged scratch file in /var/lib/cni, is now said and kept as
it is. A delegate is ADDed by the real libcni (tests/libcni_client) with the cache dir Multus
would give it, and real host-local."""

from __future__ import annotations

import ctypes
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from cni_reaper import multus
from cni_reaper.errors import ExitCode
from cni_reaper.runtime import inventory
from tests.crashed import Crashed
from tests.nodetree import snapshot
from tests.private_node import damage
from tests.real_libcni import LibcniClient
from tests.test_multus import BOOT_ID, KNOWN, MultusNode
from tests.test_multus_cni_dir import multus_conf, the_reservation, warned
from tests.test_multus_cni_dir_attacks import (
    moved_then_kept_by_a_second_run,
    multus_at,
    named,
    reasons,
)

OLD_BOOT = "00000000-0000-0000-0000-000000000000"


def whole_delegate_of_a_known_pod(node: MultusNode) -> Path:
    """A pod containerd knows, set up through Multus, its delegate's result cached whole where
    node.cache_dir says (Multus's DEL will use it and release the address); then the reboot."""
    result = node.delegate(KNOWN)
    node.containerd_knows(KNOWN)
    node.crashed.reboot()
    return result


# --- the dir skipped with a warning: where its Multus caches, nobody looks ------------------


def left_to_multus(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], result: Path
) -> tuple[int, dict[str, Any]]:
    """A run that says the dir result's Multus caches in is not inspected as Multus's, and
    leaves the delegate's result where it is and its address reserved for Multus's DEL."""
    held = crashed.ips()

    code, report = crashed.run(capsys, "-v")

    assert warned(report, "is or holds a dir this run inspects")
    assert result.exists()
    assert the_reservation(report)["action"] == "keep", reasons(report)
    assert crashed.ips() == held
    return code, report


def test_a_dir_holding_another_caches_dir_keeps_the_delegates_its_multus_cached(
    crashed: Crashed, libcni_client: LibcniClient, capsys: pytest.CaptureFixture[str]
) -> None:
    """00-a.conf names /srv/m/results (inspected first), 01-b.conf /srv/m: the Multus of 01-b
    caches its delegates in /srv/m/results, which is inspected only as 00-a's scratch dir."""
    multus_at(crashed, libcni_client, named("inner", "multus", "/srv/m/results"), None, "00-a.conf")
    node = multus_at(
        crashed, libcni_client, named("outer", "multus", "/srv/m"), "/srv/m", "01-b.conf"
    )
    result = whole_delegate_of_a_known_pod(node)

    code, report = left_to_multus(crashed, capsys, result)

    assert code == ExitCode.OK, report


def test_a_dir_inside_another_caches_results_keeps_the_delegates_its_multus_cached(
    crashed: Crashed, libcni_client: LibcniClient, capsys: pytest.CaptureFixture[str]
) -> None:
    multus_at(crashed, libcni_client, named("outer", "multus", "/srv/m"), None, "00-a.conf")
    node = multus_at(
        crashed,
        libcni_client,
        named("inner", "multus", "/srv/m/results"),
        "/srv/m/results",
        "01-b.conf",
    )
    result = whole_delegate_of_a_known_pod(node)
    assert result.parent == crashed.node.root / "srv/m/results/results"

    code, report = left_to_multus(crashed, capsys, result)

    assert code in (ExitCode.OK, ExitCode.DATA), report


@pytest.mark.parametrize(
    "results_dir",
    ["/var/lib/cni/multus/results", "/var/lib/cni/results"],
    ids=["default", "runtime"],
)
def test_cni_dir_naming_a_results_dir_already_inspected_keeps_the_delegates_reservation(
    crashed: Crashed,
    libcni_client: LibcniClient,
    capsys: pytest.CaptureFixture[str],
    results_dir: str,
) -> None:
    """The default cache's results dir, or the runtime's: not inspected again as Multus's
    cache, and the address of the delegate Multus cached there stays Multus's."""
    node = multus_at(crashed, libcni_client, multus_conf("multus", results_dir), results_dir)
    result = whole_delegate_of_a_known_pod(node)
    assert (crashed.node.root / results_dir.lstrip("/")).is_dir()

    code, report = left_to_multus(crashed, capsys, result)

    assert code in (ExitCode.OK, ExitCode.DATA), report


def test_cni_dir_var_lib_cni_leaves_a_damaged_scratch_file_and_says_so(
    crashed: Crashed, libcni_client: LibcniClient, capsys: pytest.CaptureFixture[str]
) -> None:
    """The review found that nothing judges Multus's scratch files in /var/lib/cni, a dir not
    inspected as Multus's: a damaged one stays (no repair lost against the code before, which
    never looked there), the warning says the dir is not inspected, and the address is kept."""
    node = multus_at(crashed, libcni_client, multus_conf("multus", "/var/lib/cni"), "/var/lib/cni")
    node.delegate(KNOWN)
    node.containerd_knows(KNOWN)
    scratch = crashed.node.root / "var/lib/cni" / KNOWN
    scratch.write_bytes(b'[{"cniVersion":"0.3.1","name":"hl"')  # cut by the crash
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert report["multus_scratch"] == []
    assert scratch.exists()
    assert warned(report, "is or holds a dir this run inspects as the runtime's")
    assert code == ExitCode.OK, report


# --- the key in any case ----------------------------------------------------------------------


@pytest.mark.parametrize("later", ["cnidir", "CNIDIR"])
def test_a_later_null_key_in_another_case_leaves_the_earlier_dir(
    crashed: Crashed, libcni_client: LibcniClient, capsys: pytest.CaptureFixture[str], later: str
) -> None:
    conf = multus_conf("multus", "/srv/m") | {later: None}
    assert list(conf)[-2:] == ["cniDir", later]
    node = multus_at(crashed, libcni_client, conf, "/srv/m")
    result = node.crash_damages_a_known_pods_delegate("empty")
    held = crashed.ips()

    code, report = crashed.run(capsys, "-v")

    assert [(d["path"], d["outcome"]) for d in report["multus_results"]] == [(str(result), "done")]
    assert the_reservation(report)["action"] == "keep", reasons(report)
    assert crashed.ips() == held
    assert code == ExitCode.OK, report


def test_an_earlier_null_key_in_another_case_yields_to_the_later_dir(
    crashed: Crashed, libcni_client: LibcniClient, capsys: pytest.CaptureFixture[str]
) -> None:
    conf = multus_conf("multus", None) | {"cnidir": None, "cniDir": "/srv/m"}
    node = multus_at(crashed, libcni_client, conf, "/srv/m")
    result = node.crash_damages_a_known_pods_delegate("empty")
    held = crashed.ips()

    code, report = crashed.run(capsys, "-v")

    assert code == ExitCode.OK, report
    assert [(d["path"], d["outcome"]) for d in report["multus_results"]] == [(str(result), "done")]
    assert the_reservation(report)["action"] == "keep", reasons(report)
    assert crashed.ips() == held


# --- the cap ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "cni_dir"),
    [("multus-shim", "/host/m{}"), ("multus", "/srv/none{}")],
    ids=["the thick plugin's, not placeable", "not there"],
)
def test_dirs_not_opened_do_not_use_up_the_cap_meant_for_descriptors(
    kind: str,
    cni_dir: str,
    crashed: Crashed,
    libcni_client: LibcniClient,
    capsys: pytest.CaptureFixture[str],
) -> None:
    for i in range(multus.MAX_NAMED_DIRS):
        conf = named(f"m{i}", kind, cni_dir.format(i))
        multus_at(crashed, libcni_client, conf, None, f"0{i:02}.conf")
    node = multus_at(
        crashed, libcni_client, named("thin", "multus", "/srv/m"), "/srv/m", "50-m.conf"
    )
    result = node.crash_damages_a_known_pods_delegate("empty")

    code, report = crashed.run(capsys)

    assert not warned(report, "past the first"), report["warnings"]
    assert [(d["path"], d["outcome"]) for d in report["multus_results"]] == [(str(result), "done")]
    assert not result.exists()
    assert code == ExitCode.OK, report


def test_the_seventeenth_real_dir_is_left_and_its_delegates_address_kept(
    crashed: Crashed, libcni_client: LibcniClient, capsys: pytest.CaptureFixture[str]
) -> None:
    """Past the cap, in load order: the 17th dir's damaged file stays, its reservation kept; the
    same on a second run (deterministic)."""
    root = crashed.node.root
    for i in range(multus.MAX_NAMED_DIRS):
        (root / f"srv/d{i}/results").mkdir(parents=True)
        multus_at(
            crashed, libcni_client, named(f"m{i}", "multus", f"/srv/d{i}"), None, f"0{i:02}.conf"
        )
    node = multus_at(
        crashed, libcni_client, named("last", "multus", "/srv/z"), "/srv/z", "50-z.conf"
    )
    result = node.crash_damages_a_known_pods_delegate("empty")
    held = crashed.ips()

    for _ in range(2):
        code, report = crashed.run(capsys, "-v")
        assert warned(report, "the 1 past the first 16 are not inspected"), report["warnings"]
        assert report["multus_results"] == []
        assert result.exists()
        assert the_reservation(report)["action"] == "keep", reasons(report)
        assert crashed.ips() == held
        assert code == ExitCode.OK, report


# --- moved_earlier by dir -------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["/srv/m/", "//srv/./m", "/srv/x/../m"])
def test_a_second_run_finds_what_the_first_moved_whatever_the_spelling(
    crashed: Crashed, libcni_client: LibcniClient, capsys: pytest.CaptureFixture[str], spelling: str
) -> None:
    node = multus_at(crashed, libcni_client, multus_conf("multus", spelling), "/srv/m")
    moved_then_kept_by_a_second_run(node, capsys)


# --- CRI-O's metadata -------------------------------------------------------------------------


def crio_container(metadata_key: str, metadata: object) -> dict[str, Any]:
    return {"id": "a" * 64, metadata_key: metadata}


@pytest.mark.parametrize("metadata", [None, "", "{}"])
def test_crio_metadata_null_or_empty_is_read_as_containers_storage_loads_it(
    metadata: object,
) -> None:
    data = json.dumps([crio_container("metadata", metadata)]).encode()
    assert inventory._crio_sandbox_ids(data) == ([], 0)


@pytest.mark.parametrize(
    "data",
    [
        b'[{"id": "' + b"a" * 64 + b'", "Metadata": 7}]',
        b'[{"id": "' + b"a" * 64 + b'", "metadata": "{}", "METADATA": [1]}]',
    ],
)
def test_crio_metadata_no_string_under_another_spelling_is_unreadable_too(data: bytes) -> None:
    """(A key given twice exactly, a number then a string, is read as its last value, as
    Python's json keeps it: containers/storage never writes one, and the review's case of it
    is left out.)"""
    with pytest.raises(inventory._Unreadable):
        inventory._crio_sandbox_ids(data)


# --- inside(): mounts, symlinks, --state-dir, what `..` cannot open ---------------------------

_LIBC = ctypes.CDLL(None, use_errno=True)
_CLONE_NEWNS = 0x00020000
_MS_BIND, _MS_REC, _MS_PRIVATE = 0x1000, 0x4000, 0x40000


def _mount(source: str, target: str, fstype: str | None, flags: int) -> None:
    kind = fstype.encode() if fstype is not None else None
    if _LIBC.mount(source.encode(), target.encode(), kind, flags, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), target)


def run_in_child(
    crashed: Crashed,
    tmp_path: Path,
    extra: Sequence[str],
    prepare: Callable[[], None] = lambda: None,
) -> tuple[int, dict[str, Any]]:
    """One run through main in a forked child (its own mount namespace when prepare mounts),
    after prepare; nothing of it outlives the child."""
    out = tmp_path / "child-report.json"
    pid = os.fork()
    if pid == 0:  # pragma: no cover (the child)
        code = 99
        try:
            with out.open("w") as sys.stdout:
                prepare()
                code = crashed.run_main(*extra)
        except BaseException as e:
            out.with_suffix(".err").write_text(repr(e))
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    err = out.with_suffix(".err")
    assert not err.exists(), err.read_text()
    text = out.read_text()
    return code, json.loads(text) if text.startswith("{") else {"raw": text}


def private_mounts(*mounts: tuple[str, Path, str | None]) -> Callable[[], None]:
    """(source, target, fstype or None for a bind) mounted in a mount namespace of its own."""

    def prepare() -> None:
        if _LIBC.unshare(_CLONE_NEWNS) != 0:
            raise OSError(ctypes.get_errno(), "unshare")
        _mount("none", "/", None, _MS_REC | _MS_PRIVATE)
        for source, target, fstype in mounts:
            _mount(source, str(target), fstype, 0 if fstype else _MS_BIND)

    return prepare


def an_earlier_boots_quarantine(crashed: Crashed) -> tuple[Path, Path]:
    """A damaged scratch file an earlier boot's run moved into the quarantine, and its sidecar."""
    old = crashed.node.quarantine / OLD_BOOT / "multus"
    old.mkdir(parents=True, mode=0o700)
    kept = old / KNOWN
    kept.write_bytes(b"")
    sidecar = old / f"{KNOWN}.json"
    sidecar.write_text(json.dumps({"path": f"/var/lib/cni/multus/{KNOWN}", "outcome": "done"}))
    return kept, sidecar


def test_the_quarantine_reached_through_a_bind_mount_is_never_inspected(
    crashed: Crashed, libcni_client: LibcniClient, tmp_path: Path
) -> None:
    kept, _ = an_earlier_boots_quarantine(crashed)
    view = crashed.node.root / "srv/q"
    view.mkdir(parents=True, mode=0o700)
    multus_at(crashed, libcni_client, multus_conf("multus", "/srv/q"))
    crashed.reboot()

    code, report = run_in_child(
        crashed, tmp_path, [], private_mounts((str(kept.parent), view, None))
    )

    assert report["multus_scratch"] == [], report["multus_scratch"]
    assert kept.exists()
    assert not (crashed.node.quarantine / BOOT_ID).exists()
    assert code == ExitCode.OK, report


def test_a_mount_inside_the_state_dir_is_still_inside_it(
    crashed: Crashed, libcni_client: LibcniClient, tmp_path: Path
) -> None:
    """A tmpfs mounted at quarantine/<boot>/multus: `..` from its root crosses back into the
    state dir's file system."""
    mounted = crashed.node.quarantine / OLD_BOOT / "multus"
    mounted.mkdir(parents=True, mode=0o700)
    multus_at(
        crashed,
        libcni_client,
        multus_conf("multus", f"/var/lib/cni-reaper/quarantine/{OLD_BOOT}/multus"),
    )
    crashed.reboot()

    def prepare() -> None:
        private_mounts(("tmpfs", mounted, "tmpfs"))()
        os.chmod(mounted, 0o700)
        (mounted / KNOWN).write_bytes(b"")

    code, report = run_in_child(crashed, tmp_path, [], prepare)

    assert report["multus_scratch"] == []
    assert warned(report, "is in the reaper's own state dir"), report["warnings"]
    assert not (crashed.node.quarantine / BOOT_ID).exists()
    assert code == ExitCode.OK, report


@pytest.mark.parametrize("how", ["symlinked state dir", "--state-dir"])
def test_a_state_dir_elsewhere_is_still_the_reapers_own(
    crashed: Crashed,
    libcni_client: LibcniClient,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    how: str,
) -> None:
    root = crashed.node.root
    real = root / "data/state"
    quarantine = real / "quarantine"
    old = quarantine / OLD_BOOT / "multus"
    old.mkdir(parents=True, mode=0o700)
    (old / KNOWN).write_bytes(b"")
    extra: list[str] = []
    if how == "--state-dir":
        extra = ["--state-dir", str(real)]
    else:
        (root / "var/lib").mkdir(parents=True, exist_ok=True)
        (root / "var/lib/cni-reaper").symlink_to("/data/state")
    multus_at(
        crashed, libcni_client, multus_conf("multus", f"/data/state/quarantine/{OLD_BOOT}/multus")
    )
    crashed.reboot()

    code, report = crashed.run(capsys, *extra)

    assert report["multus_scratch"] == []
    assert (old / KNOWN).exists()
    assert not (quarantine / BOOT_ID).exists()
    assert code == ExitCode.OK, report


_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2


def drop_dac_capabilities() -> None:
    """As the unit runs it (CapabilityBoundingSet=CAP_NET_ADMIN CAP_NET_RAW): root, but no
    bypass of a dir's permission bits."""
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable for caps 0-31 and 32-63
    if _LIBC.capget(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capget")
    gone = ~((1 << _CAP_DAC_OVERRIDE) | (1 << _CAP_DAC_READ_SEARCH)) & 0xFFFFFFFF
    data[0] &= gone
    data[1] &= gone
    if _LIBC.capset(header, data) != 0:
        raise OSError(ctypes.get_errno(), "capset")


def test_a_dir_above_the_root_that_cannot_be_read_is_no_internal_error(
    crashed: Crashed, libcni_client: LibcniClient, tmp_path: Path
) -> None:
    node = multus_at(crashed, libcni_client, multus_conf("multus", "/srv/m"), "/srv/m")
    result = node.crash_damages_a_known_pods_delegate("empty")
    (crashed.node.root / "var/lib/cni-reaper").mkdir(parents=True, exist_ok=True)
    above = crashed.node.root.parent  # tmp_path/node's parent: searchable, not readable
    above.chmod(0o311)  # root's, searchable: not readable without CAP_DAC_READ_SEARCH
    try:
        code, report = run_in_child(crashed, tmp_path, ["--dry-run"], drop_dac_capabilities)
    finally:
        above.chmod(0o755)

    assert code != ExitCode.INTERNAL, report
    assert result.exists()


def unnest(top: Path) -> None:
    """top/d/d/.../d removed one level at a time (shutil.rmtree recurses per level)."""
    while (top / "d").exists():
        for entry in os.listdir(top / "d"):
            if entry != "d":
                os.unlink(top / "d" / entry)
        if (top / "d/d").exists():
            os.rename(top / "d/d", top / "next")
        os.rmdir(top / "d")
        if (top / "next").exists():
            os.rename(top / "next", top / "d")


def test_a_dir_deep_below_the_state_dir_is_still_inside_it(
    crashed: Crashed, libcni_client: LibcniClient, capsys: pytest.CaptureFixture[str]
) -> None:
    depth = 2050
    top = crashed.node.quarantine / OLD_BOOT
    top.mkdir(parents=True, mode=0o700)
    try:
        fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for _ in range(depth):
                os.mkdir("d", 0o700, dir_fd=fd)
                below = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
                os.close(fd)
                fd = below
            os.close(os.open(KNOWN, os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd))  # empty
        finally:
            os.close(fd)
        deep = f"/var/lib/cni-reaper/quarantine/{OLD_BOOT}" + "/d" * depth
        multus_at(crashed, libcni_client, multus_conf("multus", deep))
        crashed.reboot()
        code, report = crashed.run(capsys)
    finally:
        unnest(top)  # pytest's cleanup cannot remove a tree this deep

    assert report["multus_scratch"] == [], [d["outcome"] for d in report["multus_scratch"]]
    assert not (crashed.node.quarantine / BOOT_ID).exists()
    assert code == ExitCode.OK, report["warnings"]


# --- a dry run; the metrics ---------------------------------------------------------------------


def test_a_dry_run_over_every_new_case_writes_nothing(
    crashed: Crashed, libcni_client: LibcniClient, capsys: pytest.CaptureFixture[str]
) -> None:
    root = crashed.node.root
    an_earlier_boots_quarantine(crashed)
    in_state = f"/var/lib/cni-reaper/quarantine/{OLD_BOOT}/multus"
    multus_at(crashed, libcni_client, named("q", "multus", in_state), None, "01-q.conf")
    multus_at(
        crashed, libcni_client, named("r", "multus", "/var/lib/cni/results"), None, "02-r.conf"
    )
    conf = named("c", "multus", None) | {"CNIDIR": "/srv/c", "cnidir": None}
    multus_at(crashed, libcni_client, conf, None, "03-c.conf")
    multus_at(crashed, libcni_client, named("shim", "multus-shim", "/host/m"), None, "04-s.conf")
    multus_at(crashed, libcni_client, named("rel", "multus", "rel/m"), None, "05-rel.conf")
    node = multus_at(crashed, libcni_client, multus_conf("multus", "/srv/m"), "/srv/m")
    result = node.delegate(KNOWN)
    damage(result, "empty")
    (root / "srv/m" / KNOWN).write_bytes(b"[")
    node.containerd_knows(KNOWN)
    crashed.reboot()
    before = snapshot(root)

    code, report = crashed.run(capsys, "-v", "--dry-run")

    assert snapshot(root) == before
    assert sorted(d["outcome"] for d in report["multus_results"] + report["multus_scratch"]) == [
        "planned",
        "planned",
    ]
    assert code == ExitCode.OK, report


def test_the_metrics_count_a_named_dirs_files_with_the_defaults(
    crashed: Crashed,
    libcni_client: LibcniClient,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    from tests.test_metrics import multus_files_counted  # noqa: PLC0415 (prometheus's parser)

    default = crashed.node.root / "var/lib/cni/multus"
    default.mkdir(parents=True)
    (default / KNOWN.replace("1", "4")).write_bytes(b"")
    node = multus_at(crashed, libcni_client, multus_conf("multus", "/srv/m"), "/srv/m")
    node.delegate(KNOWN)
    node.containerd_knows(KNOWN)
    damage(node.cache_dir / "results" / f"hl-{KNOWN}-eth0", "zeroed")
    (node.cache_dir / KNOWN).write_bytes(b"[{")
    crashed.reboot()

    code, counted = multus_files_counted(crashed, capsys, tmp_path)

    assert code == ExitCode.OK
    assert counted == {
        ("quarantine", "delegate-result", "done"): 1,
        ("quarantine", "multus-scratch", "done"): 2,
    }
