"""A third review, as an attacker and an unlucky operator, of the mends of 3db6ff8 to Multus's
`cniDir` (cli._Delegates.open: a named dir among the identities of the reaper's own state
dir's dirs, multus.found_in, the cap counted on dirs opened; multus._cni_dir's nulls) and to
CRI-O's containers.json (inventory._crio_sandbox_ids's object_pairs_hook and
_storage_metadata). Its six defects, strict xfails on 3db6ff8, are mended (a quarantine past
10,000 dirs turned every named dir off, a warning without its cause, the cap spent on dirs
that do not exist or named twice, a reason that contradicted its warning, and a freed
object's id() taken for a container's, now that no hook decodes it); the rest held. A
delegate is ADDed by the real libcni (tests/libcni_client) with the cache dir Multus would
give it, and real host-local."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

import pytest

from cni_reaper import cli, multus
from cni_reaper.errors import ExitCode
from cni_reaper.runtime import inventory
from tests.crashed import Crashed
from tests.nodetree import snapshot
from tests.real_libcni import LibcniClient
from tests.test_multus import KNOWN, MultusNode, delegates
from tests.test_multus_cni_dir import multus_conf, the_reservation, warned
from tests.test_multus_cni_dir_attacks import multus_at, named, orphan_of_a_known_pod, reasons
from tests.test_multus_cni_dir_review import OLD_BOOT

A_ID, B_ID = "a" * 64, "b" * 64


def a_damaged_delegate_in(
    crashed: Crashed, client: LibcniClient, cni_dir: str = "/srv/m"
) -> tuple[MultusNode, Path]:
    node = multus_at(crashed, client, multus_conf("multus", cni_dir), cni_dir)
    return node, node.crash_damages_a_known_pods_delegate("empty")


def quarantined(report: dict[str, Any], result: Path) -> bool:
    doc = delegates(report).get(result.name)
    return doc is not None and (doc["action"], doc["outcome"]) == ("quarantine", "done")


def earlier_boots_quarantines(crashed: Crashed, boots: int) -> None:
    """What runs of earlier boots left in the quarantine, which nothing prunes: per boot its
    dir, Multus's subdir and host-local's, with one network's."""
    top = crashed.node.quarantine
    for n in range(boots):
        boot = top / f"{n:08x}-0000-0000-0000-000000000000"
        (boot / "multus").mkdir(parents=True, mode=0o700)
        (boot / "host-local/hl").mkdir(parents=True, mode=0o700)


# --- the reaper's own state dir, walked: multus.found_in ------------------------------------


def test_a_symlinked_state_dir_keeps_the_named_dirs_delegates_and_ends_no_run(
    crashed: Crashed, libcni_client: LibcniClient, capsys: pytest.CaptureFixture[str]
) -> None:
    """--state-dir a symlink: found_in refuses it (O_NOFOLLOW), as the quarantine does; the named
    dir is not inspected, with a warning, and Multus's address stays."""
    real = crashed.node.root / "data/cni-reaper"
    real.mkdir(parents=True)
    link = crashed.node.root / "srv/state"
    link.parent.mkdir(parents=True)
    link.symlink_to(real)
    _, result = a_damaged_delegate_in(crashed, libcni_client)
    held = crashed.ips()

    code, report = crashed.run(capsys, "-v", "--state-dir", str(link))

    assert warned(report, "cannot be told"), report["warnings"]
    assert result.exists()
    assert the_reservation(report)["action"] == "keep", reasons(report)
    assert crashed.ips() == held
    assert code != ExitCode.INTERNAL, report


def test_a_quarantine_grown_past_ten_thousand_dirs_still_lets_a_dir_outside_be_inspected(
    crashed: Crashed, libcni_client: LibcniClient, capsys: pytest.CaptureFixture[str]
) -> None:
    """The review's case: 3,334 earlier boots' quarantines (10,002 dirs, past the first limit)
    turned every named dir off for good. The walk now goes to MAX_OWN_DIRS, a million."""
    earlier_boots_quarantines(crashed, 10_000 // 3 + 1)
    _, result = a_damaged_delegate_in(crashed, libcni_client)
    held = crashed.ips()

    code, report = crashed.run(capsys, "-v")

    assert quarantined(report, result), report["warnings"]
    assert not result.exists()
    assert the_reservation(report)["action"] == "keep", reasons(report)
    assert crashed.ips() == held
    assert code == ExitCode.OK, report


def test_past_the_limit_the_warning_says_why_the_state_dir_cannot_be_told_apart(
    crashed: Crashed,
    libcni_client: LibcniClient,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past MAX_OWN_DIRS (made small here) the walk is not whole: the named dir is not
    inspected, its address stays Multus's, and the warning names the cause."""
    monkeypatch.setattr(multus, "MAX_OWN_DIRS", 30)
    earlier_boots_quarantines(crashed, 11)
    _, result = a_damaged_delegate_in(crashed, libcni_client)

    _, report = crashed.run(capsys, "-v")

    (warning,) = [w for w in report["warnings"] if "cannot be told" in w]
    assert "holds more than 30 dirs" in warning, warning
    assert result.exists()
    assert the_reservation(report)["action"] == "keep", reasons(report)


def test_a_fifo_a_socket_and_a_symlink_to_the_root_in_the_quarantine_stop_nothing(
    crashed: Crashed,
    libcni_client: LibcniClient,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Nothing in the state dir but dirs is opened: no FIFO blocks, no symlink is walked."""
    old = crashed.node.quarantine / OLD_BOOT / "multus"
    old.mkdir(parents=True, mode=0o700)
    os.mkfifo(old / "fifo")
    with monkeypatch.context() as here, socket.socket(socket.AF_UNIX) as s:
        here.chdir(old)  # a path too long for sun_path
        s.bind("sock")
    (old / "root").symlink_to("/")
    (old / "up").symlink_to("../../..")
    _, result = a_damaged_delegate_in(crashed, libcni_client)
    held = crashed.ips()

    code, report = crashed.run(capsys, "-v")

    assert not warned(report, "cannot be told"), report["warnings"]
    assert quarantined(report, result), report["multus_results"]
    assert the_reservation(report)["action"] == "keep", reasons(report)
    assert crashed.ips() == held
    assert code == ExitCode.OK, report


@pytest.mark.parametrize("what", ["a file", "a FIFO", "absent"])
def test_a_state_dir_that_is_no_dir_or_absent_is_no_internal_error(
    crashed: Crashed,
    libcni_client: LibcniClient,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    what: str,
) -> None:
    """One that is there and no dir is a usage error since an operator's review (it was
    found only at the first move); one not there yet is made by a real run, and a dry run
    inspects the named dir as usual."""
    state = tmp_path / "state"
    if what == "a file":
        state.write_bytes(b"")
    elif what == "a FIFO":
        os.mkfifo(state)
    _, result = a_damaged_delegate_in(crashed, libcni_client)
    held = crashed.ips()
    argv = crashed.argv("--json", "-v", "--dry-run", "--state-dir", str(state))

    code = cli.main(argv, clock=lambda: crashed.t0 + 60, environ={})

    report = json.loads(capsys.readouterr().out)
    assert result.exists()
    assert crashed.ips() == held
    if what == "absent":  # nothing of the reaper's to spare: inspected
        assert code != ExitCode.INTERNAL, report
        assert the_reservation(report)["action"] == "keep", reasons(report)
        assert [d["outcome"] for d in report["multus_results"]] == ["planned"]
    else:
        assert code == ExitCode.USAGE
        assert report["error"]["message"] == f"--state-dir {state}: not a directory"


# --- the cap ------------------------------------------------------------------------------------


def sixteen_real_dirs(crashed: Crashed, client: LibcniClient) -> None:
    root = crashed.node.root
    for i in range(multus.MAX_NAMED_DIRS):
        (root / f"srv/d{i}/results").mkdir(parents=True)
        multus_at(crashed, client, named(f"m{i}", "multus", f"/srv/d{i}"), None, f"0{i:02}.conf")


@pytest.mark.parametrize(
    "named_again", [True, False], ids=["a seventeenth config naming one again", "the control"]
)
def test_sixteen_real_dirs_and_the_default_still_release_an_orphan(
    named_again: bool,
    crashed: Crashed,
    libcni_client: LibcniClient,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A dir named again through a symlink is no seventeenth dir: nothing past the cap keeps
    the orphan of the default cache's Multus."""
    sixteen_real_dirs(crashed, libcni_client)
    if named_again:
        (crashed.node.root / "srv/again").symlink_to("d0")
        multus_at(crashed, libcni_client, named("again", "multus", "/srv/again"), None, "40.conf")
    node = multus_at(crashed, libcni_client, multus_conf("multus", None), None, "50-m.conf")
    orphan_of_a_known_pod(node)

    code, report = crashed.run(capsys, "-v")

    assert not warned(report, "past the first"), report["warnings"]
    assert the_reservation(report)["action"] == "del", reasons(report)
    assert crashed.ips() == {}
    assert code == ExitCode.OK, report


def test_the_reason_for_a_dir_past_the_cap_does_not_say_it_cannot_be_placed(
    crashed: Crashed, libcni_client: LibcniClient, capsys: pytest.CaptureFixture[str]
) -> None:
    sixteen_real_dirs(crashed, libcni_client)
    node = multus_at(
        crashed, libcni_client, named("last", "multus", "/srv/z"), "/srv/z", "50-z.conf"
    )
    node.delegate(KNOWN)
    node.containerd_knows(KNOWN)
    crashed.reboot()

    _, report = crashed.run(capsys, "-v")

    assert warned(report, "cache dirs that exist; the 1 past the first 16"), report["warnings"]
    reservation = the_reservation(report)
    assert reservation["action"] == "keep", reservation
    assert "cannot be placed" not in reservation["reason"], reservation["reason"]


# --- a dry run --------------------------------------------------------------------------------


def test_a_dry_run_over_a_grown_quarantine_and_odd_files_in_it_writes_nothing(
    crashed: Crashed, libcni_client: LibcniClient, capsys: pytest.CaptureFixture[str]
) -> None:
    earlier_boots_quarantines(crashed, 50)
    os.mkfifo(crashed.node.quarantine / OLD_BOOT.replace("0", "1", 1))
    a_damaged_delegate_in(crashed, libcni_client)
    before = snapshot(crashed.node.root)

    code, report = crashed.run(capsys, "-v", "--dry-run")

    assert snapshot(crashed.node.root) == before
    assert [d["outcome"] for d in report["multus_results"]] == ["planned"]
    assert code == ExitCode.OK, report


# --- CRI-O's containers.json: the object_pairs_hook ------------------------------------------


def crio_file(*containers: str) -> bytes:
    return ("[" + ",".join(containers) + "]").encode()


def test_a_freed_nested_object_does_not_make_a_later_container_mistyped() -> None:
    dropped = ",".join(['{"metadata": 1}'] * 200)
    data = crio_file(
        f'{{"id": "{A_ID}", "flags": {{"x": [{dropped}]}}, "flags": {{}}}}',
        f'{{"id": "{B_ID}", "metadata": "{{}}"}}',
    )
    assert inventory._crio_sandbox_ids(data) == ([], 0)


@pytest.mark.parametrize(
    "field",
    [
        '"big-data-sizes": {"metadata": 1234}',
        '"flags": {"Metadata": {"a": 1}, "metadata": [1]}',
        '"big-data-digests": {"x": {"metadata": true}}',
    ],
)
def test_a_nested_metadata_key_of_any_type_is_no_container_metadata(field: str) -> None:
    """Go decodes only the container's own field into the string; a map's key "metadata"
    is a map's key."""
    sandbox = json.dumps(json.dumps({"pod": True, "pod-id": A_ID, "pod-name": "p"}))
    data = crio_file(f'{{"id": "{A_ID}", "metadata": {sandbox}, {field}}}')
    assert inventory._crio_sandbox_ids(data) == ([A_ID], 1)


@pytest.mark.parametrize("depth", [5_000, 200_000])
def test_deep_nesting_is_unreadable_not_an_internal_error(depth: int) -> None:
    """Past what this Python decodes (5,000 levels on 3.9 to 3.11, some 10,000 on 3.12 and
    later, as Go's limit) the store is unreadable; within it, the file is read as
    containers/storage reads it: nested metadata keys are no container's. Never any other
    exception."""
    nested = '{"metadata": ' * depth + "1" + "}" * depth
    data = crio_file(f'{{"id": "{A_ID}", "flags": {nested}}}')
    try:
        found = inventory._crio_sandbox_ids(data)
    except inventory._Unreadable:
        return
    assert depth < 10_000 and found == ([], 0), found
