"""A name read by a run, looked at before it is opened (cni_reaper/unopened.py): what is found
through a symlink where the run follows one (a tree's own /proc files, on a rescue machine),
and the open that follows the look, which must not wait either: a FIFO may be swapped in
between the two.

A FIFO whose open waited would hang the test; an alarm turns that into a failure.
"""

from __future__ import annotations

import fcntl
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni_reaper.boot import read_boot_id, read_btime
from cni_reaper.unopened import NotRegularFile, open_regular

BOOT_ID = "11111111-2222-3333-4444-555555555555"


@pytest.fixture(autouse=True)
def _never_waits() -> Iterator[None]:
    def waited(signum: int, frame: object) -> None:
        pytest.fail("an open waited: what lies under the name was opened for real")

    previous = signal.signal(signal.SIGALRM, waited)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


def proc_tree(tmp_path: Path) -> Path:
    """A tree's proc, its files where the tree's own links lead, as a rescue copy may hold."""
    real = tmp_path / "kernel-files"
    (real / "sys/kernel/random").mkdir(parents=True)
    (real / "stat").write_text("cpu  1 0 1 1 0 0 0 0 0 0\nbtime 1700000000\nprocesses 1\n")
    (real / "sys/kernel/random/boot_id").write_text(BOOT_ID + "\n")
    proc = tmp_path / "proc"
    (proc / "sys/kernel/random").mkdir(parents=True)
    (proc / "stat").symlink_to(real / "stat")
    (proc / "sys/kernel/random/boot_id").symlink_to(real / "sys/kernel/random/boot_id")
    return proc


def test_a_file_behind_a_symlink_is_read_where_the_run_follows_one(tmp_path: Path) -> None:
    proc = proc_tree(tmp_path)

    assert read_btime(str(proc / "stat")) == 1_700_000_000.0
    assert read_boot_id(str(proc / "sys/kernel/random/boot_id")) == BOOT_ID


def test_a_fifo_behind_a_symlink_is_never_opened(tmp_path: Path) -> None:
    """Nothing writes to these FIFOs: an open for reading would wait for ever."""
    proc = proc_tree(tmp_path)
    for name in ("stat", "sys/kernel/random/boot_id"):
        target = Path(os.readlink(proc / name))
        target.unlink()
        os.mkfifo(target, 0o600)

    assert read_btime(str(proc / "stat")) is None
    assert read_boot_id(str(proc / "sys/kernel/random/boot_id")) == ""
    with pytest.raises(NotRegularFile) as refused:
        open_regular(str(proc / "stat"), follow=True)
    assert refused.value.kind == "FIFO"


def test_a_symlink_is_refused_unless_the_caller_follows_it(tmp_path: Path) -> None:
    proc = proc_tree(tmp_path)

    with pytest.raises(OSError) as refused:
        open_regular(str(proc / "stat"))
    assert not isinstance(refused.value, NotRegularFile)  # the open's own ELOOP
    fd = open_regular(str(proc / "stat"), follow=True)
    os.close(fd)


@pytest.mark.parametrize("follow", [False, True])
def test_the_open_after_the_look_would_not_wait_on_a_fifo_swapped_in(
    tmp_path: Path, follow: bool
) -> None:
    """The look and the open are two steps; a FIFO put in between would be opened by the
    second. It is opened non-blocking, so it returns at once, and is then refused: here the
    descriptor's own flags show it."""
    file = tmp_path / "stat"
    file.write_text("btime 1\n")
    name = tmp_path / "link" if follow else file
    if follow:
        name.symlink_to(file)

    fd = open_regular(str(name), follow=follow)
    try:
        assert fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_NONBLOCK
    finally:
        os.close(fd)
