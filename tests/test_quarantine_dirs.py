"""Every dir a move takes a file to is opened below the one before it, never through a symlink:
the boot's dir, Multus's box in it, host-local's box and its network's dir. A symlink put at any
of them (by an operator's mistake, or by someone who may write the state dir) is refused; the
file stays where it was, and nothing lands where the symlink points. So is a dir someone other
than root may write: they could plant a FIFO where a sidecar is written, or a copy that lets a
hidden file go."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from cni_reaper.filestat import FileStat
from cni_reaper.repair import multus_repair
from cni_reaper.repair.quarantine import Move, Quarantine, QuarantineError
from tests.test_leaving import NAME as HIDDEN_NAME
from tests.test_leaving_cross_boot_attacks import (
    EARLIER,
    THIS_BOOT,
    a_hidden_file,
    plant,
    settle_at,
)
from tests.test_multus_scratch_attacks import no_longer_than

NAME = "net-" + "ab" * 32 + "-eth0"
BOXES = {"the boot's dir": (), "multus": ("multus",), "host-local": ("host-local", "net")}
CASES = [
    (box, depth)
    for box, parts in BOXES.items()
    for depth in range(len(parts) + 2)  # the quarantine dir, the boot's dir, each box's part
]


def move_one(results: Path, place: Quarantine, name: str = NAME) -> object:
    """One file of results moved by place, as a run moves it: its outcome. A move that would
    hang the boot (an open that waits on a FIFO) fails instead."""
    scanned = FileStat.of(os.stat(results / name, follow_symlinks=False))
    dir_fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with no_longer_than(20):
            (outcome,) = place.move_all(
                [Move(dir_fd, name, scanned, lambda dest, digest: {"path": name, "to": dest})]
            )
    finally:
        place.close()
        os.close(dir_fd)
    return outcome


@pytest.mark.parametrize(("box", "depth"), CASES)
def test_a_symlink_anywhere_below_the_state_dir_is_refused_not_followed(
    tmp_path: Path, box: str, depth: int
) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / NAME).write_bytes(b"")
    chain = ["quarantine", "boot", *BOXES[box]]
    state = tmp_path / "state"
    elsewhere = tmp_path / "elsewhere"
    # The real path down to the symlink, and the symlink's target with the rest of the chain
    # already made, so that following it would succeed.
    (state / Path(*chain[:depth])).mkdir(parents=True)
    (elsewhere / Path(*chain[depth + 1 :])).mkdir(parents=True)
    (state / Path(*chain[: depth + 1])).symlink_to(elsewhere)

    place = Quarantine(str(state / "quarantine"), "boot", *BOXES[box])
    outcome = move_one(results, place)

    assert isinstance(outcome, QuarantineError), outcome
    assert outcome.errno in (errno.ELOOP, errno.ENOTDIR)  # Linux says ENOTDIR
    assert str(state / Path(*chain[: depth + 1])) in str(outcome)
    assert "symlink" in str(outcome)
    assert (results / NAME).exists()
    assert [p for p in elsewhere.rglob("*") if not p.is_dir()] == []


@pytest.mark.parametrize("box", BOXES)
def test_each_missing_dir_is_made_private_and_the_file_lands_in_the_box(
    tmp_path: Path, box: str
) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / NAME).write_bytes(b"")
    state = tmp_path / "state"
    state.mkdir()

    place = Quarantine(str(state / "quarantine"), "boot", *BOXES[box])
    outcome = move_one(results, place)

    where = state / "quarantine" / "boot" / Path(*BOXES[box])
    assert outcome == str(where / NAME)
    assert (where / NAME).read_bytes() == b""
    assert not (results / NAME).exists()
    made = [state / "quarantine", *(state / "quarantine" / Path(*p) for p in _prefixes(box))]
    assert [oct(d.stat().st_mode & 0o777) for d in made] == ["0o700"] * len(made)


def test_the_system_s_own_symlink_above_the_quarantine_dir_is_followed(tmp_path: Path) -> None:
    """/var/lib may be a symlink to a bigger disk: that is the system's choice, not ours."""
    results = tmp_path / "results"
    results.mkdir()
    (results / NAME).write_bytes(b"")
    disk = tmp_path / "disk"
    disk.mkdir()
    (tmp_path / "state").symlink_to(disk)

    outcome = move_one(results, Quarantine(str(tmp_path / "state" / "quarantine"), "boot"))

    assert outcome == str(tmp_path / "state" / "quarantine" / "boot" / NAME)
    assert (disk / "quarantine" / "boot" / NAME).exists()


def _prefixes(box: str) -> list[tuple[str, ...]]:
    chain = ("boot", *BOXES[box])
    return [chain[: i + 1] for i in range(len(chain))]


@pytest.mark.parametrize(("box", "depth"), CASES)
@pytest.mark.parametrize("how", ["open to all", "another owner"])
def test_a_quarantine_dir_others_may_write_is_refused(
    tmp_path: Path, box: str, depth: int, how: str
) -> None:
    if how == "another owner" and os.geteuid() != 0:
        pytest.skip("giving a dir to another user needs root")
    results = tmp_path / "results"
    results.mkdir()
    (results / NAME).write_bytes(b"")
    chain = ["quarantine", "boot", *BOXES[box]]
    state = tmp_path / "state"
    open_dir = state / Path(*chain[: depth + 1])
    open_dir.mkdir(parents=True)
    if how == "open to all":
        open_dir.chmod(0o777)
    else:
        os.chown(open_dir, 1000, 1000)
    # What someone who may write it could plant: a FIFO under the name the sidecar's temp file
    # would take, whose open would wait for a reader for ever.
    os.mkfifo(open_dir / f".{NAME}.json.tmp")

    outcome = move_one(results, Quarantine(str(state / "quarantine"), "boot", *BOXES[box]))

    assert isinstance(outcome, QuarantineError), outcome
    assert str(open_dir) in str(outcome) and "not trusted" in str(outcome), outcome
    assert (results / NAME).exists()
    assert not any(p.is_file() for p in state.rglob("*"))


@pytest.mark.parametrize(
    ("box", "which"),
    [
        (box, which)
        for box in (None, "multus")
        for which in ("the quarantine dir", "an earlier boot's dir", "its box")
        if box is not None or which != "its box"  # the results dir's files have no box
    ],
)
def test_a_copy_planted_where_others_may_write_never_lets_a_hidden_file_go(
    tmp_path: Path, box: str | None, which: str
) -> None:
    """Every empty file has one sha256: whoever may write a quarantine dir could plant an empty
    'copy' beside a sidecar naming the file, and a hidden empty file would be removed on its
    word. A dir others may write is not searched, and says so; the file goes back."""
    results, top = tmp_path / "results", tmp_path / "q"
    a_hidden_file(results, b"")
    path = HIDDEN_NAME if box is None else str(results / HIDDEN_NAME)
    planted = plant(top / EARLIER / (box or ""), HIDDEN_NAME, b"", path)
    opened = {"the quarantine dir": top, "an earlier boot's dir": top / EARLIER}.get(
        which, top / EARLIER / (box or "")
    )
    opened.chmod(0o777)

    put_back, said = settle_at(results, top, THIS_BOOT, box)

    assert put_back == [HIDDEN_NAME]
    assert (results / HIDDEN_NAME).read_bytes() == b""
    (line,) = said
    assert f"{opened} not searched: is writable by group or others" in line, line
    assert planted.exists()


def test_a_dir_refused_in_one_batch_is_tried_again_in_the_next(tmp_path: Path) -> None:
    """A run keeps one quarantine for all its batches: a dir it could not open (here a symlink
    the operator then removed) does not fail the rest of the run."""
    results = tmp_path / "results"
    results.mkdir()
    (results / NAME).write_bytes(b"")
    top = tmp_path / "state" / "quarantine"
    top.mkdir(parents=True)
    (top / "boot").symlink_to(tmp_path)
    place = Quarantine(str(top), "boot")
    dir_fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY)
    try:

        def batch() -> object:
            scanned = FileStat.of(os.stat(NAME, dir_fd=dir_fd, follow_symlinks=False))
            (moved,) = place.move_all([Move(dir_fd, NAME, scanned, lambda dest, digest: {})])
            return moved

        first = batch()
        (top / "boot").unlink()
        second = batch()
    finally:
        place.close()
        os.close(dir_fd)

    assert isinstance(first, QuarantineError), first
    assert second == str(top / "boot" / NAME)
    assert (top / "boot" / NAME).exists() and not (results / NAME).exists()


def test_multus_names_moved_earlier_are_read_only_from_the_quarantines_own_dirs(
    tmp_path: Path,
) -> None:
    """multus_repair.moved_earlier reads each boot's Multus box as the moves open it: a boot
    dir that is a symlink holds no sidecar of the quarantine's, and a box others may write
    says nothing trustworthy (None: every delegate then counts as moved)."""
    top = tmp_path / "state" / "quarantine"
    (top / "real" / "multus").mkdir(parents=True)
    (top / "real" / "multus" / "a.json").write_text('{"path": "/cache/results/a"}')
    elsewhere = tmp_path / "elsewhere" / "multus"
    elsewhere.mkdir(parents=True)
    (elsewhere / "b.json").write_text('{"path": "/cache/results/b"}')
    (top / "linked").symlink_to(elsewhere.parent)

    assert multus_repair.moved_earlier(str(top)) == {"/cache/results": frozenset({"a"})}

    (top / "real" / "multus").chmod(0o777)
    assert multus_repair.moved_earlier(str(top)) is None
