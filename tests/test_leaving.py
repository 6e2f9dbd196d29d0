"""A file's last step out of its dir after a copy across file systems (leaving.py): hidden
beside itself, checked there, then unlinked; and what a run killed in that step leaves, settled
by the next real run, said by a dry run.

The races are had at the points a writer could use: right after the last check by name
(quarantine.original-checked) and right after the rename (quarantine.original-hidden). The
crash states come from real runs killed with SIGKILL at quarantine.original-hidden, in a private
mount namespace (tests/test_move_cleanup_attacks.py's run_private), then rerun in the same boot
or in the next one.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni_reaper import failpoint, leaving
from cni_reaper.errors import ExitCode
from cni_reaper.filestat import FileStat
from cni_reaper.repair.quarantine import (
    ORIGINAL_CHECKED,
    ORIGINAL_HIDDEN,
    FileChanged,
    Move,
    Quarantine,
)
from tests.nodetree import CONTAINER_IDS, NodeTree
from tests.private_node import cannot_run
from tests.test_move_cleanup_attacks import (
    DEL_DONE,
    Ran,
    assert_every_copy_has_a_true_sidecar,
    files_under,
    json_run_argv,
    move_once,
    other_fs,
    run_private,
)
from tests.test_move_cleanup_attacks import NAME as MOVED  # move_once's file

__all__ = ["other_fs"]  # the fixture, used by name

NAME = f"net-{CONTAINER_IDS[0]}-eth0"
SECOND = f"net-{CONTAINER_IDS[1]}-eth0"
FIRST_BOOT = "11111111-2222-3333-4444-555555555555"  # NodeTree.write_boot_world's
NEXT_BOOT = "66666666-7777-8888-9999-000000000000"


@pytest.fixture(autouse=True)
def _as_root() -> None:
    if os.geteuid() != 0:
        cannot_run("needs root: real runs in a private mount namespace")


def cut_short(ran: Ran) -> list[str]:
    """The report's warnings of a move cut short."""
    return [w for w in ran.doc()["warnings"] if "left by a move cut short" in w]


def hidden_in(dir_path: Path) -> list[str]:
    return sorted(n for n in os.listdir(dir_path) if leaving.original_of(n) is not None)


# --- the names --------------------------------------------------------------------------


def test_a_hidden_name_says_its_original_and_nothing_else_is_taken_for_one(
    tmp_path: Path,
) -> None:
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        hidden = leaving.hidden_name(dir_fd, NAME)
        assert hidden is not None
        assert leaving.original_of(hidden) == NAME
        (tmp_path / hidden).write_bytes(b"")  # a leftover
        assert hidden != leaving.hidden_name(dir_fd, NAME)  # fresh: never one a leftover holds
    finally:
        os.close(dir_fd)
    for not_hidden in [
        NAME,
        f".{NAME}{leaving.SUFFIX}",  # no tag
        f".{NAME}.0123456{leaving.SUFFIX}",  # 7 digits
        f".{NAME}.0123456G{leaving.SUFFIX}",
        f"..0123abcd{leaving.SUFFIX}",  # no original
        f".{NAME}.0123abcd{leaving.SUFFIX}.json",
    ]:
        assert leaving.original_of(not_hidden) is None, not_hidden


def test_a_name_with_no_room_for_the_suffix_gets_no_hidden_name(tmp_path: Path) -> None:
    dir_fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert leaving.hidden_name(dir_fd, "n" * 226) is not None
        assert leaving.hidden_name(dir_fd, "n" * 227) is None  # 1 + 227 + 9 + 19: past NAME_MAX
    finally:
        os.close(dir_fd)


def test_hidden_names_are_found_among_a_sorted_listing_of_any_names() -> None:
    hidden = [f".{n}.0123abcd{leaving.SUFFIX}" for n in ("a", NAME, "-x", ".dot")]
    others = [NAME, "-x", "+y", " z", ".other", "/", ".", "..x", "0", "~", "é", "."]
    listing = sorted(hidden + others)
    assert leaving.hidden_among(listing) == sorted(hidden)


# --- races at the last step -------------------------------------------------------------


def move_across(results: Path, qbase: Path, data: bytes) -> object:
    """One move of results/MOVED (written with data) into a quarantine on another file
    system (move_once's): a copy, then the original's last step."""
    return move_once(results, qbase, data).outcome


@pytest.fixture
def interfering() -> Iterator[None]:
    yield
    failpoint.interfere(ORIGINAL_CHECKED, None)
    failpoint.interfere(ORIGINAL_HIDDEN, None)


def test_a_file_that_replaces_the_original_after_its_last_check_is_never_unlinked(
    tmp_path: Path, other_fs: Path, interfering: None
) -> None:
    """libcni's ADD writes without a lock: a file renamed over the original between the last
    check and the unlink was unlinked by name before. Now the newcomer is what gets hidden, is
    found to be another inode, and goes back; this run's copy leaves the quarantine."""
    results = tmp_path / "results"
    newcomer = b'{"kind":"cniCacheV1","containerId":"' + CONTAINER_IDS[0].encode() + b'"}'

    def replace() -> None:
        (tmp_path / "new").write_bytes(newcomer)
        os.rename(tmp_path / "new", results / MOVED)

    failpoint.interfere(ORIGINAL_CHECKED, replace)
    outcome = move_across(results, other_fs, b"")

    assert isinstance(outcome, FileChanged)
    assert str(outcome) == "another file took its place as it was moved; put back"
    assert (results / MOVED).read_bytes() == newcomer
    assert hidden_in(results) == []
    assert files_under(other_fs / "quarantine") == {}


def test_an_original_written_to_after_its_last_check_stays_with_what_was_written(
    tmp_path: Path, other_fs: Path, interfering: None
) -> None:
    results = tmp_path / "results"

    def write() -> None:
        with open(results / MOVED, "ab") as f:
            f.write(b"more")

    failpoint.interfere(ORIGINAL_CHECKED, write)
    outcome = move_across(results, other_fs, b"{")

    assert isinstance(outcome, FileChanged)
    assert str(outcome) == "it was written to as it was moved; put back"
    assert (results / MOVED).read_bytes() == b"{more"
    assert hidden_in(results) == []
    assert files_under(other_fs / "quarantine") == {}


def test_a_name_taken_again_while_the_file_was_hidden_leaves_both_and_says_where(
    tmp_path: Path, other_fs: Path, interfering: None
) -> None:
    """The newcomer hidden (it replaced the original after the check), and yet another file
    took the name meanwhile: link() does not replace it, and the report names the hidden one."""
    results = tmp_path / "results"

    def replace() -> None:
        (tmp_path / "new").write_bytes(b"second")
        os.rename(tmp_path / "new", results / MOVED)

    failpoint.interfere(ORIGINAL_CHECKED, replace)

    def take_the_name() -> None:
        (results / MOVED).write_bytes(b"third")

    failpoint.interfere(ORIGINAL_HIDDEN, take_the_name)
    outcome = move_across(results, other_fs, b"")

    assert isinstance(outcome, FileChanged)
    (hidden,) = hidden_in(results)
    assert str(outcome) == (
        f"another file took its place as it was moved, and a new {MOVED} appeared meanwhile: "
        f"left as {hidden}"
    )
    assert (results / MOVED).read_bytes() == b"third"
    assert (results / hidden).read_bytes() == b"second"
    assert files_under(other_fs / "quarantine") == {}


def test_the_original_hidden_and_checked_leaves_no_name_behind(
    tmp_path: Path, other_fs: Path, interfering: None
) -> None:
    results = tmp_path / "results"
    seen: list[list[str]] = []
    failpoint.interfere(ORIGINAL_HIDDEN, lambda: seen.append(hidden_in(results)))

    outcome = move_across(results, other_fs, b"\0" * 7)

    assert outcome == str(other_fs / "quarantine/boot" / MOVED)
    assert len(seen) == 1 and len(seen[0]) == 1  # it went by way of one hidden name
    assert os.listdir(results) == []
    assert assert_every_copy_has_a_true_sidecar(other_fs / "quarantine") == {
        f"boot/{MOVED}": b"\0" * 7
    }


def test_an_owners_lock_spares_the_hidden_step(
    tmp_path: Path, other_fs: Path, interfering: None
) -> None:
    """host-local's store is locked by its owner through every move (release.py): no name
    can change hands there, and no hidden name is ever left in it."""
    store = tmp_path / "store"
    store.mkdir()
    (store / "10.0.0.5").write_bytes(b"x")
    reached: list[bool] = []
    failpoint.interfere(ORIGINAL_HIDDEN, lambda: reached.append(True))
    place = Quarantine(str(other_fs / "q"), "net", owner_locks=True)
    scanned = FileStat.of(os.stat(store / "10.0.0.5"))
    dir_fd = os.open(store, os.O_RDONLY | os.O_DIRECTORY)
    try:
        (outcome,) = place.move_all([Move(dir_fd, "10.0.0.5", scanned, lambda d, s: {})])
        place.close()
    finally:
        os.close(dir_fd)
    assert outcome == str(other_fs / "q/net/10.0.0.5")
    assert reached == []
    assert os.listdir(store) == []


# --- what a killed run leaves, settled --------------------------------------------------


def earlier_boots_node(tmp_path: Path) -> tuple[NodeTree, Path]:
    """A node booted after a crash, with one network whose DEL succeeds: its plugin dir."""
    node = NodeTree(tmp_path / "node")
    node.write_boot_world(btime=1_700_000_000)
    return node, node.fake_plugin_network("net", "done", DEL_DONE)


def crashed_in_the_last_step(tmp_path: Path, other_fs: Path) -> tuple[NodeTree, list[str]]:
    """A real run killed right after it hid its first original: the copy is in the quarantine,
    the original under a hidden name, the second file not moved yet."""
    node, bin_dir = earlier_boots_node(tmp_path)
    node.write_result(NAME, b"")
    node.write_result(SECOND, b"\0" * 10)
    argv = json_run_argv(node, bin_dir, other_fs / "state")
    killed = run_private({"argv": argv}, {failpoint.ENV: "quarantine.original-hidden"})
    assert killed.code == -9, killed.stderr
    assert hidden_in(node.results) != []
    return node, argv


def test_a_rerun_in_the_same_boot_finishes_the_move_the_killed_run_began(
    tmp_path: Path, other_fs: Path
) -> None:
    node, argv = crashed_in_the_last_step(tmp_path, other_fs)
    (hidden,) = hidden_in(node.results)
    original = leaving.original_of(hidden)

    again = run_private({"argv": argv})

    assert again.code == ExitCode.OK, again.stderr
    copies = assert_every_copy_has_a_true_sidecar(other_fs / "state/quarantine")
    assert sorted(copies) == sorted(f"{FIRST_BOOT}/{n}" for n in (NAME, SECOND))  # once each
    assert os.listdir(node.results) == []
    quarantined = other_fs / "state/quarantine" / FIRST_BOOT / str(original)
    assert cut_short(again) == [
        f"{node.results / hidden}: left by a move cut short before its last step; its bytes "
        f"are in {quarantined}: removed it"
    ]


def test_a_run_in_the_next_boot_finishes_the_move_from_the_earlier_boots_copy(
    tmp_path: Path, other_fs: Path
) -> None:
    """Killed in the last step, then the node went down: the copy is in the earlier boot's
    quarantine dir, where the next boot's run finds it, and the hidden name goes. No second
    copy, and no second DEL."""
    node, argv = crashed_in_the_last_step(tmp_path, other_fs)
    (hidden,) = hidden_in(node.results)
    node.write_boot_world(btime=1_700_000_600, boot_id=NEXT_BOOT)
    quarantined = other_fs / "state/quarantine" / FIRST_BOOT / NAME

    dry = run_private({"argv": [*argv, "--dry-run"]})
    assert dry.code == ExitCode.OK, dry.stderr
    assert hidden_in(node.results) == [hidden]  # a dry run changes nothing
    assert [e["path"] for e in dry.doc()["entries"]] == [SECOND]
    assert cut_short(dry) == [
        f"{node.results / hidden}: left by a move cut short before its last step; its bytes "
        f"are in {quarantined}: a real run removes it"
    ]

    again = run_private({"argv": argv})

    assert again.code == ExitCode.OK, again.stderr
    assert cut_short(again) == [
        f"{node.results / hidden}: left by a move cut short before its last step; its bytes "
        f"are in {quarantined}: removed it"
    ]
    assert [e["path"] for e in again.doc()["entries"]] == [SECOND]
    assert os.listdir(node.results) == []
    # The killed run had written the second file's sidecar, not yet in place: its temp stays
    # in that boot's dir.
    (tmp,) = (other_fs / "state/quarantine" / FIRST_BOOT).glob(".*")
    assert tmp.name == f".{SECOND}.json.tmp"
    tmp.unlink()
    copies = assert_every_copy_has_a_true_sidecar(other_fs / "state/quarantine")
    assert sorted(copies) == [f"{FIRST_BOOT}/{NAME}", f"{NEXT_BOOT}/{SECOND}"]


def test_with_the_earlier_boots_copy_removed_the_file_goes_back_and_moves_again(
    tmp_path: Path, other_fs: Path
) -> None:
    """The earlier boot's quarantine dir removed by hand (the README lets an operator do so):
    no boot's quarantine holds a copy, so the hidden file goes back under its name, is judged
    as any file of the earlier boot, and is moved once more. Never a loss."""
    node, argv = crashed_in_the_last_step(tmp_path, other_fs)
    (hidden,) = hidden_in(node.results)
    node.write_boot_world(btime=1_700_000_600, boot_id=NEXT_BOOT)
    shutil.rmtree(other_fs / "state/quarantine" / FIRST_BOOT)

    dry = run_private({"argv": [*argv, "--dry-run"]})
    assert dry.code == ExitCode.OK, dry.stderr
    assert hidden_in(node.results) == [hidden]
    assert cut_short(dry) == [
        f"{node.results / hidden}: left by a move cut short before its last step; no copy of "
        "it in the quarantine: a real run puts it back"
    ]

    again = run_private({"argv": argv})

    assert again.code == ExitCode.OK, again.stderr
    assert cut_short(again) == [
        f"{node.results / hidden}: left by a move cut short before its last step; no copy of "
        f"it in the quarantine: put back as {NAME}"
    ]
    assert sorted(e["path"] for e in again.doc()["entries"]) == [NAME, SECOND]
    assert all(e["outcome"] == "done" for e in again.doc()["entries"])
    assert os.listdir(node.results) == []
    copies = assert_every_copy_has_a_true_sidecar(other_fs / "state/quarantine")
    assert sorted(copies) == [f"{NEXT_BOOT}/{NAME}", f"{NEXT_BOOT}/{SECOND}"]
    assert copies[f"{NEXT_BOOT}/{NAME}"] == b""


def test_a_hidden_name_beside_another_file_of_its_name_leaves_both(
    tmp_path: Path, other_fs: Path
) -> None:
    """No copy of the hidden file in any boot's quarantine (the earlier boot's dir removed by
    hand), and its name holds another file: which one libcni should have is not the reaper's
    to guess."""
    node, argv = crashed_in_the_last_step(tmp_path, other_fs)
    (hidden,) = hidden_in(node.results)
    node.write_boot_world(btime=1_700_000_600, boot_id=NEXT_BOOT)
    shutil.rmtree(other_fs / "state/quarantine" / FIRST_BOOT)
    (node.results / NAME).write_bytes(b"another")

    again = run_private({"argv": argv})

    assert (node.results / hidden).read_bytes() == b""  # untouched
    assert cut_short(again) == [
        f"{node.results / hidden}: left by a move cut short before its last step; {NAME} is "
        "another file now, and no boot's quarantine holds a copy of it: both left; compare "
        "them by hand"
    ]
    assert hidden not in {e["path"] for e in again.doc()["entries"]}
    # The other file is judged as any file is (here: damage from the earlier boot, moved).
    assert (
        b"another" in files_under(node.results).values()
        or b"another" in files_under(other_fs / "state/quarantine").values()
    )


def test_a_symlink_under_a_hidden_name_is_never_followed_nor_settled(
    tmp_path: Path, other_fs: Path
) -> None:
    node, bin_dir = earlier_boots_node(tmp_path)
    target = tmp_path / "elsewhere"
    target.write_bytes(b"not the reaper's")
    node.results.mkdir(parents=True, exist_ok=True)
    hidden = f".{NAME}.0123abcd{leaving.SUFFIX}"
    os.symlink(target, node.results / hidden)

    ran = run_private({"argv": json_run_argv(node, bin_dir, other_fs / "state")})

    assert os.readlink(node.results / hidden) == str(target)
    assert target.read_bytes() == b"not the reaper's"
    assert not (node.results / NAME).exists()
    (entry,) = ran.doc()["entries"]
    assert entry["path"] == hidden
    assert entry["content"] == "not-a-file"
    assert entry["outcome"] == "skipped"
