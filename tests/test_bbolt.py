"""The bbolt reader against files the real bbolt wrote (tests/bolt_writer.py), and against the
damage a crash or a hostile file can bring: every failure is a BoltError, never a hang."""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Union

import pytest

from cni_reaper.runtime.bbolt import (
    BRANCH_PAGE,
    LEAF_PAGE,
    MAGIC,
    META_CHECKED_SIZE,
    PAGE_HEADER_SIZE,
    BoltError,
    Bucket,
    Database,
    fnv1a64,
)
from tests.bolt_writer import bucket, delete, delete_bucket, put, write_db

Tree = dict[bytes, Union[bytes, "Tree"]]


def as_tree(bucket: Bucket) -> Tree:
    """A bucket as nested dicts, read with items()."""
    return {
        key: as_tree(value) if isinstance(value, Bucket) else value for key, value in bucket.items()
    }


@contextmanager
def opened(path: Path) -> Iterator[Database]:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        yield Database(fd, str(path))
    finally:
        os.close(fd)


def read_tree(path: Path) -> Tree:
    with opened(path) as db:
        return as_tree(db.root())


def test_nested_buckets_values_and_empty_ones(tmp_path: Path) -> None:
    db = write_db(
        tmp_path / "nested.db",
        [
            [
                put(["a"], "k1", "v1"),
                put(["a"], "k2", b""),
                put(["a", "b", "c"], "deep", b"\x00\xff binary"),
                bucket("empty"),
                put(["z"], b"\x00key", "x"),
            ]
        ],
    )
    assert read_tree(db) == {
        b"a": {b"k1": b"v1", b"k2": b"", b"b": {b"c": {b"deep": b"\x00\xff binary"}}},
        b"empty": {},
        b"z": {b"\x00key": b"x"},
    }
    with opened(db) as database:
        assert database.bucket(b"a", b"b", b"c") is not None
        assert database.bucket(b"a", b"k1") is None  # a value, not a bucket
        assert database.bucket(b"missing") is None
        a = database.bucket(b"a")
        assert a is not None
        assert a.get(b"k1") == b"v1"
        assert a.get(b"k0") is None


def test_many_keys_branch_pages_and_lookups(tmp_path: Path) -> None:
    keys = [f"key-{i:06d}".encode() for i in range(6000)]
    ops = [put(["big"], key, key[::-1] * 3) for key in keys]
    db = write_db(tmp_path / "big.db", [ops[:3000], ops[3000:]])
    with opened(db) as database:
        big = database.bucket(b"big")
        assert big is not None
        assert list(big.keys()) == keys  # in order, across leaves
        root_page = database.page(big._root)
        assert root_page.flags & BRANCH_PAGE, "6000 keys must need branch pages"
        for key in (keys[0], keys[1234], keys[2999], keys[3000], keys[-1]):
            assert big.get(key) == key[::-1] * 3
        for missing in (b"", b"key-", b"key-999999", b"zzz", b"key-000000\x00"):
            assert big.get(missing) is None


@pytest.mark.parametrize("size", [5000, 70_000, 1 << 20])
def test_values_on_overflow_pages(tmp_path: Path, size: int) -> None:
    value = os.urandom(size)
    db = write_db(tmp_path / "overflow.db", [[put(["o"], "before", "x"), put(["o"], "v", value)]])
    assert read_tree(db) == {b"o": {b"before": b"x", b"v": value}}


def test_small_buckets_are_inline_and_read_from_their_value(tmp_path: Path) -> None:
    db = write_db(
        tmp_path / "inline.db",
        [[put(["parent", f"child-{i}"], "label", f"value-{i}") for i in range(50)]],
    )
    with opened(db) as database:
        parent = database.bucket(b"parent")
        assert parent is not None
        children = dict(parent.items())
        assert len(children) == 50
        for child in sorted(children):
            node = children[child]
            assert isinstance(node, Bucket)
            assert node._inline is not None, "a small bucket without sub-buckets is inline"
        assert as_tree(parent)[b"child-7"] == {b"label": b"value-7"}


@pytest.mark.parametrize("page_size", [1024, 8192, 65536])
def test_page_sizes(tmp_path: Path, page_size: int) -> None:
    ops = [put(["b", f"sub-{i % 7}"], f"k{i}", os.urandom(i % 300)) for i in range(800)]
    db = write_db(tmp_path / "paged.db", [ops], page_size=page_size)
    with opened(db) as database:
        assert database.page_size == page_size
    reference = write_db(tmp_path / "reference.db", [ops])
    assert read_tree(db) == read_tree(reference)


def test_the_last_commit_wins_deleted_keys_and_buckets_are_gone(tmp_path: Path) -> None:
    db = write_db(
        tmp_path / "history.db",
        [
            [put(["a"], "k", "1"), put(["a", "gone"], "x", "y"), put(["b"], "k", "1")],
            [put(["a"], "k", "2"), delete(["b"], "k")],
            [delete_bucket(["a"], "gone"), delete_bucket([], "b")],
        ],
        no_freelist_sync=True,
    )
    assert read_tree(db) == {b"a": {b"k": b"2"}}


def meta_offsets(path: Path) -> dict[int, int]:
    """txid -> offset of each meta page (a little-endian file)."""
    data = path.read_bytes()
    page_size = struct.unpack_from("<I", data, PAGE_HEADER_SIZE + 8)[0]
    found = {}
    for offset in (0, page_size):
        txid = struct.unpack_from("<Q", data, offset + PAGE_HEADER_SIZE + 48)[0]
        found[txid] = offset
    return found


def test_a_torn_newest_meta_falls_back_to_the_commit_before(tmp_path: Path) -> None:
    db = write_db(tmp_path / "torn.db", [[put(["a"], "k", "first")], [put(["a"], "k", "second")]])
    assert read_tree(db) == {b"a": {b"k": b"second"}}
    newest = meta_offsets(db)[max(meta_offsets(db))]
    with db.open("r+b") as f:  # the newest meta half-written: its checksum fails
        f.seek(newest + PAGE_HEADER_SIZE + 40)
        f.write(b"\xff" * 8)
    assert read_tree(db) == {b"a": {b"k": b"first"}}


def test_page_0_damaged_page_1_is_found_by_its_page_size(tmp_path: Path) -> None:
    db = write_db(tmp_path / "p0.db", [[put(["a"], "k", "v")], [put(["a"], "k", "w")]])
    with db.open("r+b") as f:
        f.write(b"\x00" * 4096)
    # Page 1 holds whichever commit it held; either is a whole one.
    assert read_tree(db) in ({b"a": {b"k": b"v"}}, {b"a": {b"k": b"w"}})


def test_both_meta_pages_bad_is_an_error(tmp_path: Path) -> None:
    db = write_db(tmp_path / "bad.db", [[put(["a"], "k", "v")]])
    data = bytearray(db.read_bytes())
    for offset in meta_offsets(db).values():
        data[offset + PAGE_HEADER_SIZE + 20] ^= 0x01  # a bit of the root page id
    db.write_bytes(bytes(data))
    with pytest.raises(BoltError, match=r"no valid meta page.*checksum mismatch"):
        read_tree(db)


@pytest.mark.parametrize(
    "content",
    [b"", b"{}", b"\x00" * 65536, b"not a database at all\n" * 1000, os.urandom(40000)],
    ids=["empty", "json", "zeros", "text", "random"],
)
def test_not_a_bbolt_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "x.db"
    path.write_bytes(content)
    with pytest.raises(BoltError, match="no valid meta page"):
        read_tree(path)


def test_a_cut_file(tmp_path: Path) -> None:
    db = write_db(
        tmp_path / "cut.db", [[put(["a", f"b{i}"], "k", os.urandom(900)) for i in range(200)]]
    )
    with opened(db) as database:
        in_use = database.meta.high_water * database.page_size
    db.write_bytes(db.read_bytes()[: in_use // 2])
    with pytest.raises(BoltError):
        read_tree(db)


def branch_root(database: Database) -> tuple[int, int]:
    """The page id of the bucket "big"'s branch root, and its offset."""
    big = database.bucket(b"big")
    assert big is not None
    assert database.page(big._root).flags & BRANCH_PAGE
    return big._root, big._root * database.page_size


def big_db(tmp_path: Path) -> Path:
    return write_db(
        tmp_path / "big.db", [[put(["big"], f"k{i:05d}", "v" * 40) for i in range(3000)]]
    )


@pytest.mark.parametrize("child", ["itself", "meta page", "past the end", "huge"])
def test_bad_child_pages_are_refused(tmp_path: Path, child: str) -> None:
    db = big_db(tmp_path)
    with opened(db) as database:
        root_id, offset = branch_root(database)
        high_water = database.meta.high_water
    target = {"itself": root_id, "meta page": 1, "past the end": high_water, "huge": 2**63}[child]
    data = bytearray(db.read_bytes())
    # The last branch element's child page id (elements: pos u32, key size u32, page id u64).
    count = struct.unpack_from("<H", data, offset + 10)[0]
    struct.pack_into("<Q", data, offset + PAGE_HEADER_SIZE + (count - 1) * 16 + 8, target)
    db.write_bytes(bytes(data))
    message = "reached twice" if child == "itself" else "outside pages"
    with pytest.raises(BoltError, match=message):
        read_tree(db)
    with opened(db) as database, pytest.raises(BoltError, match=message):
        big = database.bucket(b"big")
        assert big is not None
        big.get(b"k99999")  # the descent goes to the last child


def test_a_page_that_is_not_what_its_place_needs(tmp_path: Path) -> None:
    db = big_db(tmp_path)
    with opened(db) as database:
        _, offset = branch_root(database)
    data = bytearray(db.read_bytes())
    struct.pack_into("<H", data, offset + 8, 0x10)  # a freelist page where a branch must be
    db.write_bytes(bytes(data))
    with pytest.raises(BoltError, match="neither branch nor leaf"):
        read_tree(db)


def test_an_element_pointing_out_of_its_page(tmp_path: Path) -> None:
    db = write_db(tmp_path / "elem.db", [[put(["a"], "k", "v")]])
    with opened(db) as database:
        root = database.meta.root
        offset = root * database.page_size
    data = bytearray(db.read_bytes())
    struct.pack_into("<I", data, offset + PAGE_HEADER_SIZE + 4, 1 << 30)  # pos of element 0
    db.write_bytes(bytes(data))
    with pytest.raises(BoltError, match="runs past the page"):
        read_tree(db)


def synthetic_db(order: str, entries: list[tuple[bytes, bytes]], page_size: int = 4096) -> bytes:
    """A bbolt file made here, in either byte order: meta pages 0 and 1, a root leaf at page 2."""

    def meta(page_id: int, txid: int) -> bytes:
        fields = struct.pack(order + "IIIIQQQQQ", MAGIC, 2, page_size, 0, 2, 0, 2**64 - 1, 3, txid)
        assert len(fields) == META_CHECKED_SIZE
        body = fields + struct.pack(order + "Q", fnv1a64(fields))
        return (struct.pack(order + "QHHI", page_id, 0x04, 0, 0) + body).ljust(page_size, b"\0")

    elements = b""
    data = b""
    for index, (key, value) in enumerate(entries):
        pos = (len(entries) - index) * 16 + len(data)
        elements += struct.pack(order + "IIII", 0, pos, len(key), len(value))
        data += key + value
    leaf = struct.pack(order + "QHHI", 2, LEAF_PAGE, len(entries), 0) + elements + data
    return meta(0, 4) + meta(1, 5) + leaf.ljust(page_size, b"\0")


@pytest.mark.parametrize("order", ["<", ">"])
def test_either_byte_order(tmp_path: Path, order: str) -> None:
    path = tmp_path / "made.db"
    path.write_bytes(synthetic_db(order, [(b"alpha", b"1"), (b"beta", b"22")]))
    assert read_tree(path) == {b"alpha": b"1", b"beta": b"22"}


def test_a_value_where_a_bucket_header_is_needed(tmp_path: Path) -> None:
    path = tmp_path / "made.db"
    data = bytearray(synthetic_db("<", [(b"b", b"short")]))
    struct.pack_into("<I", data, 2 * 4096 + PAGE_HEADER_SIZE, 0x01)  # flag the value a bucket
    path.write_bytes(bytes(data))
    with pytest.raises(BoltError, match="has no header"):
        read_tree(path)


def test_an_inline_bucket_nested_in_itself_ends(tmp_path: Path) -> None:
    """An inline bucket's value is a page that may claim to hold a bucket again: bbolt's own
    rules (an inline bucket holds no bucket, in a quarter page at most) end it, as the nesting
    bound did before them."""
    inline = b""
    for _ in range(70):
        page = struct.pack("<QHHI", 0, LEAF_PAGE, 1, 0)
        element = struct.pack("<IIII", 0x01, 16, 1, 16 + len(inline))
        inline = page + element + b"n" + struct.pack("<QQ", 0, 0) + inline
    path = tmp_path / "made.db"
    data = bytearray(synthetic_db("<", [(b"n", struct.pack("<QQ", 0, 0) + inline)]))
    struct.pack_into("<I", data, 2 * 4096 + PAGE_HEADER_SIZE, 0x01)
    path.write_bytes(bytes(data))
    with pytest.raises(BoltError, match=r"over a quarter page|inline bucket holds bucket"):
        read_tree(path)
