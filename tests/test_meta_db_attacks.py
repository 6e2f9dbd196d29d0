"""Attacks on containerd's meta.db read while containerd runs (commit 2abb33c): commits landing
at each moment of a read (during the look at the meta pages, between them and the walk, between
the walk and the check, during the check), the file growing, the txid going backwards, the file
renamed over, other holders of the lock, other flock errors, damage, and the real bbolt churning
with other page sizes, a synced freelist, nested buckets and overflow pages. What must hold: no
sandbox containerd keeps in every commit is ever said to be in no record (knows() is False), no
traceback, and no lock left held. The files are the real bbolt's (tests/bolt_writer); bytes are
made by hand only for what bbolt cannot be made to leave at a chosen moment (a meta page read
while it is being written)."""

from __future__ import annotations

import collections
import errno
import fcntl
import os
import shutil
import struct
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from cni_reaper.runtime import bbolt, inventory
from cni_reaper.runtime.bbolt import PAGE_HEADER_SIZE, Database
from cni_reaper.runtime.inventory import SandboxInventory
from tests.bolt_writer import (
    Operation,
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
    inventory_of,
    lands,
    read_while_held,
)

# Sandboxes in every commit of the scenarios below.
KEPT = [f"{n:064x}" for n in range(30)]
# Sandboxes some commits make.
NEW = [f"{n:064x}" for n in range(1000, 1040)]

ReadMetaPage = Callable[[Database, int], bytes]


def sandboxes(ids: list[str], spec_bytes: int = 2000) -> list[Operation]:
    return [
        op for sandbox in ids for op in containerd_sandbox("k8s.io", sandbox, spec_bytes=spec_bytes)
    ]


def relabel(ids: list[str], value: str) -> list[Operation]:
    """A commit that rewrites every one of the sandboxes' records (a label on each): the pages
    the previous commit reached are freed."""
    return [put(["v1", "k8s.io", "containers", sandbox, "labels"], "x", value) for sandbox in ids]


def dropped(ids: list[str]) -> list[Operation]:
    return [delete_bucket(["v1", "k8s.io", "containers"], sandbox) for sandbox in ids]


def commits(root: Path, first: list[Operation], *later: list[Operation]) -> list[bytes]:
    """meta.db under root made by the first commit; the file's bytes after it and after each
    later commit, each made by the real bbolt on a copy (the file itself is left as after the
    first). bbolt reopened frees what the previous commit freed at once, as a running one does
    one commit later: pages the commit before reaches are written over by the next."""
    path = root / META_DB
    path.parent.mkdir(parents=True, exist_ok=True)
    write_db(path, [first], no_freelist_sync=True)
    copy = root / "later.db"
    shutil.copyfile(path, copy)
    states = [path.read_bytes()]
    for ops in later:
        write_db(copy, [ops], no_freelist_sync=True)
        states.append(copy.read_bytes())
    return states


def page_size(state: bytes) -> int:
    (size,) = struct.unpack_from("<I", state, PAGE_HEADER_SIZE + 8)
    return int(size)


def meta_page(state: bytes, page_id: int) -> bytes:
    size = page_size(state)
    return state[page_id * size : (page_id + 1) * size]


def txid(state: bytes, page_id: int) -> int:
    (value,) = struct.unpack_from("<Q", meta_page(state, page_id), PAGE_HEADER_SIZE + 48)
    return int(value)


def with_pages(state: bytes, page0: bytes, page1: bytes) -> bytes:
    """state with its two meta pages replaced: a commit's data pages written, its meta not."""
    size = page_size(state)
    return page0 + page1 + state[2 * size :]


def being_written(old: bytes, new: bytes) -> bytes:
    """A meta page read while bbolt writes it over: the start of the new one, the rest of the old
    one (the checksum fails)."""
    cut = PAGE_HEADER_SIZE + 40
    return new[:cut] + old[cut:]


def lock_is_free(path: Path) -> bool:
    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def never_dropped(found: SandboxInventory, ids: list[str]) -> None:
    said = {sandbox: found.knows(sandbox) for sandbox in ids}
    assert [s for s, knows in said.items() if knows is False] == [], found.sources


@pytest.fixture
def meta_reads(
    monkeypatch: pytest.MonkeyPatch,
) -> Callable[[Callable[[int, str], None]], list[int]]:
    """Have an action run around each read of a meta page (given its number from 1 and
    "before" or "after"): a commit landing between the two meta pages, or between the size
    and the meta pages. Calls 1 and 2 are the first read's Database(), 3 and 4 its check."""

    def interfere(action: Callable[[int, str], None]) -> list[int]:
        calls: list[int] = []
        original: ReadMetaPage = Database._read_meta_page

        def read_meta_page(db: Database, offset: int) -> bytes:
            calls.append(len(calls) + 1)
            action(len(calls), "before")
            got = original(db, offset)
            action(len(calls), "after")
            return got

        monkeypatch.setattr(Database, "_read_meta_page", read_meta_page)
        return calls

    return interfere


def relabelled_then_made(root: Path) -> list[bytes]:
    """T (30 sandboxes), T+1 rewriting all their records, T+2 making 10 more, T+3 rewriting
    them all again. T+2's data pages go where T's pages were (T+1 freed them): a walk of T over
    them reaches T+2's pages from T's, and misses 4 of the 30 (checked below)."""
    return commits(
        root,
        sandboxes(KEPT),
        relabel(KEPT, "1"),
        sandboxes(NEW[:10]),
        relabel(KEPT, "3"),
    )


def test_a_walk_of_a_commit_over_the_pages_two_commits_later_misses_sandboxes(
    tmp_path: Path,
) -> None:
    """The ground the next tests stand on: read with no check (as before 2abb33c), the pages of
    T+2 under T's meta lose sandboxes T, T+1 and T+2 all keep."""
    state_t, _, state_t2, _ = relabelled_then_made(tmp_path)
    assert txid(state_t, 0) == 2  # T is in meta page 0
    torn = with_pages(state_t2, meta_page(state_t, 0), meta_page(state_t, 1))
    path = tmp_path / "torn.db"
    path.write_bytes(torn)
    fd = os.open(path, os.O_RDONLY)
    try:
        db = Database(fd, str(path))
        read = inventory._walk_meta_db(db, "containerd", HELD)
    finally:
        os.close(fd)
    assert db.meta.txid == 2
    assert len(set(KEPT) - {sandbox for sandbox, _, _ in read.records}) == 4


def test_commits_landing_between_the_meta_pages_and_the_walk_have_it_read_again(
    tmp_path: Path,
    meta_reads: Callable[[Callable[[int, str], None]], list[int]],
    after_each_read: Interfere,
) -> None:
    """Database() takes T; T+1 lands whole and T+2's data pages over T's before the walk: the
    walk is torn, the check finds T+1 newest, and the read after it is whole."""
    _, state_t1, state_t2, _ = relabelled_then_made(tmp_path)
    path = tmp_path / META_DB
    mid_t2 = with_pages(state_t2, meta_page(state_t1, 0), meta_page(state_t1, 1))

    def land(call: int, when: str) -> None:
        if call == 2 and when == "after":
            lands(path, mid_t2)

    calls = meta_reads(land)
    reads, found = read_while_held(tmp_path, after_each_read)
    assert reads == [1, 2]
    assert len(calls) == 8
    assert found.known == set(KEPT)
    assert found.sources[0].endswith(RUNNING)
    assert lock_is_free(path)


def test_a_meta_page_read_while_it_is_written_during_the_check_hides_newer_commits(
    tmp_path: Path,
    meta_reads: Callable[[Callable[[int, str], None]], list[int]],
    after_each_read: Interfere,
) -> None:
    """T in page 0, T+1 in page 1, T+2's data over T's pages (the walk torn); T+2's meta lands
    once the check has read page 0, and T+3's is being written when it reads page 1. A check
    that took the newest meta whose checksum holds found T still newest, and the torn walk
    counted (the review found 4 of the 30 said to be in no record); the bytes of page 1 differ
    from those read before the walk."""
    _, state_t1, state_t2, state_t3 = relabelled_then_made(tmp_path)
    path = tmp_path / META_DB
    mid_t2 = with_pages(state_t2, meta_page(state_t1, 0), meta_page(state_t1, 1))
    mid_t3 = with_pages(
        state_t3,
        meta_page(state_t2, 0),
        being_written(meta_page(state_t2, 1), meta_page(state_t3, 1)),
    )

    def land(call: int, when: str) -> None:
        if call == 2 and when == "after":  # Database() took T; T+1 whole, T+2's data
            lands(path, mid_t2)
        elif call == 3 and when == "after":  # the check read T in page 0; T+2 whole, T+3 ...
            lands(path, mid_t3)
        elif call == 4 and when == "after":  # ... whose meta is whole once page 1 is read
            lands(path, state_t3)

    meta_reads(land)
    reads, found = read_while_held(tmp_path, after_each_read)
    assert lock_is_free(path)
    assert reads  # at least one read made
    never_dropped(found, KEPT)


def test_the_same_commits_with_the_meta_page_whole_during_the_check(
    tmp_path: Path,
    meta_reads: Callable[[Callable[[int, str], None]], list[int]],
    after_each_read: Interfere,
) -> None:
    """As above, but page 1 read whole (T+1): the check sees it, and the read after is whole."""
    _, state_t1, state_t2, state_t3 = relabelled_then_made(tmp_path)
    path = tmp_path / META_DB
    mid_t2 = with_pages(state_t2, meta_page(state_t1, 0), meta_page(state_t1, 1))
    mid_t3 = with_pages(state_t3, meta_page(state_t2, 0), meta_page(state_t2, 1))

    def land(call: int, when: str) -> None:
        if call == 2 and when == "after":
            lands(path, mid_t2)
        elif call == 3 and when == "after":
            lands(path, mid_t3)
        elif call == 4 and when == "after":
            lands(path, state_t3)

    meta_reads(land)
    reads, found = read_while_held(tmp_path, after_each_read)
    assert reads == [1, 2]
    assert found.known == set(KEPT) | set(NEW[:10])  # T+3's
    assert lock_is_free(path)


def test_a_meta_page_being_written_when_database_reads_it(
    tmp_path: Path,
    meta_reads: Callable[[Callable[[int, str], None]], list[int]],
    after_each_read: Interfere,
) -> None:
    """T+1's meta (page 1) torn as Database() reads it: T is taken, the walk is of T whole (T+2
    has not begun), and the check sees T+1 whole: read again, whole."""
    state_t, state_t1, _, _ = relabelled_then_made(tmp_path)
    path = tmp_path / META_DB
    torn = with_pages(
        state_t1,
        meta_page(state_t, 0),
        being_written(meta_page(state_t, 1), meta_page(state_t1, 1)),
    )

    def land(call: int, when: str) -> None:
        if call == 1 and when == "after":
            lands(path, torn)
        elif call == 2 and when == "after":
            lands(path, state_t1)

    calls = meta_reads(land)
    reads, found = read_while_held(tmp_path, after_each_read)
    assert reads == [1, 2]
    assert len(calls) >= 6
    assert found.known == set(KEPT)


def test_both_meta_pages_rewritten_during_a_read(
    tmp_path: Path, after_each_read: Callable[[Callable[[int], None]], list[int]]
) -> None:
    """T+1 and T+2 (both meta pages) land between the walk and the check."""
    _, _, state_t2, _ = relabelled_then_made(tmp_path)
    path = tmp_path / META_DB
    reads, found = read_while_held(
        tmp_path, after_each_read, lambda read: lands(path, state_t2) if read == 1 else None
    )
    assert reads == [1, 2]
    assert found.known == set(KEPT) | set(NEW[:10])
    assert lock_is_free(path)


def test_a_commit_growing_the_file_during_a_read(
    tmp_path: Path, after_each_read: Callable[[Callable[[int], None]], list[int]]
) -> None:
    """The commit makes 40 sandboxes with 20 KiB specs: bbolt grows the file, and the check
    (with the size Database() took) finds a newest meta beyond it: not unchanged."""
    state_t, state_t1 = commits(tmp_path, sandboxes(KEPT), sandboxes(NEW, spec_bytes=20000))
    assert len(state_t1) > len(state_t)
    path = tmp_path / META_DB
    reads, found = read_while_held(
        tmp_path, after_each_read, lambda read: lands(path, state_t1) if read == 1 else None
    )
    assert reads == [1, 2]
    assert found.known == set(KEPT) | set(NEW)


def test_a_commit_growing_the_file_between_its_size_and_its_meta_pages(
    tmp_path: Path,
    meta_reads: Callable[[Callable[[int, str], None]], list[int]],
    after_each_read: Interfere,
) -> None:
    """Database() took the size, then the commit landed: its meta is beyond that size, so
    Database() fails; that read is not taken, and the next is whole."""
    _, state_t1 = commits(tmp_path, sandboxes(KEPT), sandboxes(NEW, spec_bytes=20000))
    path = tmp_path / META_DB
    meta_reads(lambda call, when: lands(path, state_t1) if (call, when) == (1, "before") else None)
    reads, found = read_while_held(tmp_path, after_each_read)
    assert reads == [1, 2]
    assert found.known == set(KEPT) | set(NEW)


def test_the_file_replaced_in_place_by_an_older_copy_during_a_read(
    tmp_path: Path, after_each_read: Callable[[Callable[[int], None]], list[int]]
) -> None:
    """A restore (cp of an older copy over it) while containerd holds it: the txid goes back;
    the check sees another newest meta, and the read after is of the older copy, whole."""
    state_t, _, state_t2, _ = relabelled_then_made(tmp_path)
    path = tmp_path / META_DB
    lands(path, state_t2)
    reads, found = read_while_held(
        tmp_path, after_each_read, lambda read: lands(path, state_t) if read == 1 else None
    )
    assert reads == [1, 2]
    assert found.known == set(KEPT)


def test_a_file_renamed_over_meta_db_during_a_read(
    tmp_path: Path, after_each_read: Callable[[Callable[[int], None]], list[int]]
) -> None:
    """A compacted or restored file renamed over meta.db while the reaper holds the old one,
    which the running containerd still holds and writes: the read is of the old inode."""
    state_t, _, _, _ = relabelled_then_made(tmp_path)
    path = tmp_path / META_DB
    replacement = tmp_path / "replacement.db"
    replacement.write_bytes(state_t)
    reads, found = read_while_held(
        tmp_path, after_each_read, lambda read: os.replace(replacement, path) if read == 1 else None
    )
    assert reads == [1]
    assert found.known == set(KEPT)
    assert lock_is_free(path)


def test_another_reader_holding_the_shared_lock(
    tmp_path: Path, after_each_read: Callable[[Callable[[int], None]], list[int]]
) -> None:
    """bbolt's CLI (or any read-only bbolt) holds LOCK_SH: the reaper's is taken beside it, no
    writer can open the file, one read; and the lock is the reader's alone afterwards."""
    commits(tmp_path, sandboxes(KEPT[:3]))
    path = tmp_path / META_DB
    other = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        fcntl.flock(other, fcntl.LOCK_SH | fcntl.LOCK_NB)
        reads = after_each_read(lambda _: None)
        found = inventory_of(tmp_path)
        assert not lock_is_free(path)
    finally:
        os.close(other)
    assert reads == [1]
    assert found.known == set(KEPT[:3])
    assert not found.sources[0].endswith(RUNNING)
    assert lock_is_free(path)


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.EINTR, errno.EINVAL, errno.EBADF])
def test_flock_failing_with_another_errno(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    after_each_read: Interfere,
    code: int,
) -> None:
    """No lock: a read counts only once checked, as with a writer holding it."""
    commits(tmp_path, sandboxes(KEPT[:3]))

    def flock(fd: int, operation: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fcntl, "flock", flock)  # as cni_reaper.runtime.bbolt calls it
    reads = after_each_read(lambda _: None)
    found = inventory_of(tmp_path)
    monkeypatch.undo()
    assert reads == [1]
    assert found.known == set(KEPT[:3])
    assert lock_is_free(tmp_path / META_DB)


def test_a_newer_meta_with_its_checksum_but_damaged_while_held(
    tmp_path: Path, after_each_read: Callable[[Callable[[int], None]], list[int]]
) -> None:
    """Meta page 1 rewritten by hand with a higher txid, a root past the pages in use and its
    checksum right (bbolt never writes one): the file is in doubt, never read as the older."""
    (state_t,) = commits(tmp_path, sandboxes(KEPT[:3]))
    size = page_size(state_t)
    page1 = bytearray(meta_page(state_t, 0))
    struct.pack_into("<Q", page1, 0, 1)  # the page id
    fields = PAGE_HEADER_SIZE
    struct.pack_into("<Q", page1, fields + 16, 1 << 40)  # the root
    struct.pack_into("<Q", page1, fields + 48, 99)  # the txid
    checked = bytes(page1[fields : fields + bbolt.META_CHECKED_SIZE])
    struct.pack_into("<Q", page1, fields + bbolt.META_CHECKED_SIZE, bbolt.fnv1a64(checked))
    path = tmp_path / META_DB
    lands(path, state_t[:size] + bytes(page1) + state_t[2 * size :])
    reads, found = read_while_held(tmp_path, after_each_read)
    assert reads == [1, 2, 3]
    assert [found.knows(sandbox) for sandbox in KEPT[:3]] == [None] * 3
    (unreadable,) = found.unreadable
    assert HELD in unreadable
    assert "root page 1099511627776 outside" in unreadable


def churning(
    root: Path,
    first: list[Operation],
    churn: list[list[Operation]],
    reads: int,
    *,
    page_size: int,
    no_freelist_sync: bool,
) -> collections.Counter[str]:
    """The inventory read again and again while the real bbolt holds the file and commits the
    churn without pause; each read knows KEPT's sandboxes or is in doubt."""
    path = root / META_DB
    path.parent.mkdir(parents=True)
    proc: subprocess.Popen[bytes] = start_writing(
        path, [first], churn, page_size=page_size, no_freelist_sync=no_freelist_sync
    )
    assert proc.stdout is not None
    seen: collections.Counter[str] = collections.Counter()
    try:
        assert proc.stdout.readline() == b"committed\n"
        for _ in range(reads):
            found = inventory_of(root)
            never_dropped(found, KEPT)
            if found.unreadable:
                (unreadable,) = found.unreadable
                assert HELD in unreadable, unreadable
                seen["in doubt"] += 1
            else:
                assert found.sources[0].endswith(RUNNING), found.sources
                seen["between two commits"] += 1
    finally:
        said = finish(proc)
    print(f"{said.strip()} during {reads} reads: {dict(seen)}")
    assert int(said.split()[-3]) > 0
    assert lock_is_free(path)
    return seen


@pytest.mark.parametrize(
    ("size", "no_freelist_sync"), [(1024, False), (1024, True), (16384, False)]
)
def test_real_churn_with_other_page_sizes_and_freelists(
    tmp_path: Path, size: int, no_freelist_sync: bool
) -> None:
    """Every record rewritten, 10 sandboxes made and dropped, by turns: with 1 KiB pages each
    record spans overflow pages and the trees are deep."""
    churn = [relabel(KEPT, "1"), sandboxes(NEW[:10]), relabel(KEPT, "2"), dropped(NEW[:10])]
    churning(
        tmp_path,
        sandboxes(KEPT),
        churn,
        40,
        page_size=size,
        no_freelist_sync=no_freelist_sync,
    )


def test_real_churn_with_large_values_and_nested_buckets(tmp_path: Path) -> None:
    """64 KiB specs (overflow pages), labels in nested buckets rewritten, sandbox store
    records (2.x) made and dropped, a second namespace churned."""
    nested = [
        [
            put(["v1", "k8s.io", "containers", sandbox, "labels", "deep", str(n)], "k", "v" * 300)
            for sandbox in KEPT[:10]
        ]
        for n in range(2)
    ]
    store = [
        [put(["v1", "k8s.io", "sandboxes", s, "extensions"], "metadata", b"x" * 50) for s in NEW],
        [delete_bucket(["v1", "k8s.io", "sandboxes"], s) for s in NEW],
    ]
    moby = [[put(["v1", "moby", "containers", s, "labels"], "k", "v") for s in NEW]]
    churning(
        tmp_path,
        sandboxes(KEPT, spec_bytes=65536),
        [*nested, *store, *moby, relabel(KEPT, "3")],
        30,
        page_size=0,
        no_freelist_sync=True,
    )


def forged_meta(page_id: int, page_size: int, root: int, high_water: int, txid: int) -> bytes:
    """A meta page as bbolt lays one out, checksum and all: what a pod's spec could hold."""
    meta = struct.pack("<IIIIQQQQQ", bbolt.MAGIC, 2, page_size, 0, root, 0, 0, high_water, txid)
    header = struct.pack("<QHHI", page_id, bbolt.META_PAGE, 0, 0)
    return header + meta + struct.pack("<Q", bbolt.fnv1a64(meta))


def test_with_both_meta_pages_damaged_no_meta_is_taken_from_inside_a_value(tmp_path: Path) -> None:
    """Page 0 and page 1 torn by a crash, and a value (a pod's spec on overflow pages) holding
    a meta page at an offset another page size would put page 1: bbolt looks for page 1 at
    the OS page size only, and so does the reader. It looked at every size from 512 bytes to
    1 MiB, and took the forged one."""
    (state,) = commits(tmp_path, sandboxes(KEPT, spec_bytes=40000))
    size = page_size(state)
    data = bytearray(state)
    data[0:size] = bytes(size)  # page 0 gone
    data[size + PAGE_HEADER_SIZE + 20] ^= 0x01  # page 1's checksum fails
    forged_at = 4 * size
    data[forged_at : forged_at + 80] = forged_meta(1, forged_at, 2, len(data) // forged_at, 99)
    path = tmp_path / META_DB
    path.write_bytes(bytes(data))
    found = inventory_of(tmp_path)
    never_dropped(found, KEPT)
    (unreadable,) = found.unreadable
    assert "no valid meta page (page 0: no bbolt magic; page 1: checksum mismatch" in unreadable
