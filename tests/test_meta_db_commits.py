"""containerd's meta.db read while containerd runs (a dry run by hand, --force) or starts: the
read holds the lock bbolt's readers take, so a containerd starting waits it out; where a running
one holds the lock, only a read no commit landed during counts, and a database committed to
during every read is in doubt, so that no sandbox containerd knows is ever called forgotten from
a torn read. The files are the real bbolt's (tests/bolt_writer), and the running containerd is
the real bbolt too, holding the file open, locked, and committing."""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from cni_reaper.runtime.inventory import READS_WHILE_COMMITTED
from tests.bolt_writer import (
    Operation,
    committing,
    containerd_sandbox,
    delete_bucket,
    finish,
    put,
    start_writing,
    write_db,
)
from tests.meta_db_running import (
    HELD,
    META_DB,
    RUNNING,
    Interfere,
    held_by_containerd,
    inventory_of,
    lands,
    read_while_held,
)

KEPT = "a" * 64  # a sandbox in every commit
IDS = [f"{n:x}" * 64 for n in range(1, 10)]


def meta_db(root: Path, *transactions: list[Operation]) -> Path:
    path = root / META_DB
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_db(path, transactions, no_freelist_sync=True)


def records_line(root: Path, sandboxes: int) -> str:
    return f"containerd: {root / META_DB}: {sandboxes} sandboxes (namespace k8s.io: {sandboxes})"


def later_commits(path: Path, work: Path, *transactions: list[Operation]) -> list[bytes]:
    """The file's bytes after each of the transactions, committed in turn to a copy of it."""
    copy = work / "later.db"
    shutil.copyfile(path, copy)
    states = []
    for ops in transactions:
        write_db(copy, [ops], no_freelist_sync=True)
        states.append(copy.read_bytes())
    return states


def test_a_read_holds_off_a_containerd_starting_until_it_ends(
    tmp_path: Path, after_each_read: Interfere
) -> None:
    """The reaper runs before containerd, but a unit ordered wrongly, or k3s started by hand,
    may start it during the read: its bbolt waits for the lock (containerd's default bolt open
    timeout is 0, wait for ever), and opens the file once the read ends."""
    path = meta_db(tmp_path, containerd_sandbox("k8s.io", KEPT))
    starting: list[subprocess.Popen[bytes]] = []

    def containerd_starts(read: int) -> None:
        if read > 1:
            return
        starting.append(start_writing(path, [containerd_sandbox("k8s.io", IDS[0])]))
        with pytest.raises(BlockingIOError):
            held_by_containerd(path)
        time.sleep(0.3)  # time enough to open the file, were it not locked
        assert starting[0].poll() is None

    reads = after_each_read(containerd_starts)
    found = inventory_of(tmp_path)
    assert reads == [1]  # the lock was taken: one read
    assert found.known == {KEPT}
    assert found.sources[0] == f"containerd: {tmp_path / META_DB}: 1 sandbox (namespace k8s.io: 1)"
    finish(starting[0])  # it opened the file once the read ended, and committed
    assert inventory_of(tmp_path).known == {KEPT, IDS[0]}
    os.close(held_by_containerd(path))  # and nothing holds the lock now


def test_a_running_containerd_with_no_commit_during_the_read(
    tmp_path: Path, after_each_read: Interfere
) -> None:
    meta_db(tmp_path, containerd_sandbox("k8s.io", KEPT) + containerd_sandbox("k8s.io", IDS[0]))
    reads, found = read_while_held(tmp_path, after_each_read)
    assert reads == [1]
    assert found.known == {KEPT, IDS[0]}
    assert found.unreadable == ()
    assert found.sources[0] == records_line(tmp_path, 2) + RUNNING


def test_a_commit_during_a_read_has_it_read_again(
    tmp_path: Path, after_each_read: Interfere
) -> None:
    """The commit that landed adds a sandbox and removes one: the read that counts is the one
    after it, whole."""
    path = meta_db(
        tmp_path, containerd_sandbox("k8s.io", KEPT) + containerd_sandbox("k8s.io", IDS[0])
    )
    (later,) = later_commits(
        path,
        tmp_path,
        [
            *containerd_sandbox("k8s.io", IDS[1]),
            delete_bucket(["v1", "k8s.io", "containers"], IDS[0]),
        ],
    )
    reads, found = read_while_held(
        tmp_path, after_each_read, lambda read: lands(path, later) if read == 1 else None
    )
    assert reads == [1, 2]
    assert found.known == {KEPT, IDS[1]}
    assert found.knows(IDS[0]) is False  # containerd removed it in the commit read whole
    assert found.sources[0] == records_line(tmp_path, 2) + RUNNING


def test_a_commit_during_every_read_leaves_the_records_in_doubt(
    tmp_path: Path, after_each_read: Interfere
) -> None:
    """No read was of one whole commit: nothing in them is taken, and no sandbox is called one
    containerd will not DEL (a whole entry of any is left, not DEL'd)."""
    path = meta_db(tmp_path, containerd_sandbox("k8s.io", KEPT))
    states = later_commits(
        path, tmp_path, *(containerd_sandbox("k8s.io", i) for i in IDS[:READS_WHILE_COMMITTED])
    )
    reads, found = read_while_held(
        tmp_path, after_each_read, lambda read: lands(path, states[read - 1])
    )
    assert reads == [1, 2, 3]
    assert found.known == frozenset()
    assert [found.knows(i) for i in (KEPT, *IDS)] == [None] * (1 + len(IDS))
    assert found.unreadable == (
        f"containerd: {tmp_path / META_DB}: {HELD}, and a commit landed during each of 3 reads",
    )


def test_a_damaged_file_a_running_program_holds_is_damaged(
    tmp_path: Path, after_each_read: Interfere
) -> None:
    path = tmp_path / META_DB
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\0" * 65536)
    reads, found = read_while_held(tmp_path, after_each_read)
    assert reads == [1, 2, 3]
    assert found.knows(KEPT) is None
    (unreadable,) = found.unreadable
    assert unreadable.startswith(f"containerd: {path}: the lock bbolt's readers take is held")
    assert unreadable.endswith(
        "no read of it was of one whole commit; the last: "
        f"{path}: no valid meta page (page 0: no bbolt magic; page 1: no bbolt magic, at the OS "
        f"page size ({os.sysconf('SC_PAGE_SIZE')}))"
    )


def reads_while_committing(
    root: Path, kept: list[str], churn: list[list[Operation]], reads: int
) -> tuple[int, collections.Counter[str]]:
    """The inventory read again and again while the real bbolt holds the file and commits the
    churn without pause; the kept sandboxes are in every commit. Each read either knows them
    all or is in doubt: none says containerd will not DEL one of them. How many commits there
    were, and how many reads were of each kind."""
    path = root / META_DB
    path.parent.mkdir(parents=True)
    made = [op for sandbox in kept for op in containerd_sandbox("k8s.io", sandbox)]
    seen: collections.Counter[str] = collections.Counter()
    with committing(path, [made], churn) as commits:
        for _ in range(reads):
            found = inventory_of(root)
            knows = {found.knows(sandbox) for sandbox in kept}
            assert knows in ({True}, {None}), found.sources
            if knows == {True}:
                assert found.sources[0].endswith(RUNNING)
                seen["read between two commits"] += 1
            else:
                (unreadable,) = found.unreadable
                assert "the lock bbolt's readers take is held" in unreadable, unreadable
                seen["in doubt"] += 1
    print(f"{commits[0]} commits during {reads} reads: {dict(seen)}")
    return commits[0], seen


def made_and_dropped(sandboxes: list[str]) -> list[list[Operation]]:
    made = [op for sandbox in sandboxes for op in containerd_sandbox("k8s.io", sandbox)]
    return [made, [delete_bucket(["v1", "k8s.io", "containers"], i) for i in sandboxes]]


def test_a_real_containerd_making_and_dropping_sandboxes_all_the_while(tmp_path: Path) -> None:
    """A small database, each commit making 40 sandboxes or dropping them again: the reads are
    short, and most land between two commits."""
    extra = [f"{n:064x}" for n in range(40)]
    commits, seen = reads_while_committing(tmp_path, [KEPT], made_and_dropped(extra), 200)
    assert commits > 0
    assert seen["read between two commits"] > 0


def test_a_real_containerd_rewriting_every_record_all_the_while(tmp_path: Path) -> None:
    """300 sandboxes whose records every other commit rewrites (a label on each), so that the
    pages a read reaches are freed and written over while it walks them. Read as before this
    check (one read, no look at the commits), 14 of 100 reads said some of them were in no
    record: a dry run would have planned their forgotten DEL."""
    kept = [f"{n:064x}" for n in range(300)]
    relabel = [
        [put(["v1", "k8s.io", "containers", sandbox, "labels"], "x", str(n)) for sandbox in kept]
        for n in range(2)
    ]
    extra = [f"{n:064x}" for n in range(1000, 1040)]
    commits, _ = reads_while_committing(tmp_path, kept, relabel + made_and_dropped(extra), 100)
    assert commits > 0
