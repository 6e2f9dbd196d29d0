"""A read-only reader of bbolt database files, enough to walk buckets and their keys: containerd
keeps its metadata (containers, sandboxes, images, ...) in one, meta.db.

The file format, as bbolt (go.etcd.io/bbolt: page.go, db.go, bucket.go; format version 2, the
same since boltdb) lays it out:
- The file is an array of pages of one size, which the meta page states. Each page starts with a
  16-byte header: its id (u64), flags (u16: 0x01 branch, 0x02 leaf, 0x04 meta, 0x10 freelist),
  an element count (u16) and an overflow count (u32): a page spans 1 + overflow pages.
- Pages 0 and 1 are meta pages, written in turn by the commits: magic 0xED0CDAED, version 2, the
  page size, flags, the root bucket (root page id u64, sequence u64), the freelist's page id, the
  high-water mark (the number of pages in use), the transaction id, and an FNV-1a 64 checksum of
  the fields before it. The meta with the higher transaction id that validates is the database;
  a commit torn by a crash leaves that meta invalid, and the other one is the last whole commit.
- A bucket is a B+tree. A branch element is (pos u32, key size u32, child page id u64), a leaf
  element (flags u32, pos u32, key size u32, value size u32); pos counts from the element itself
  and the value follows the key. A leaf element with flag 0x01 is a nested bucket: its value
  starts with the bucket header (root page id, sequence). A root of 0 means an inline bucket,
  whose one leaf page follows the header inside the value.
- Integers are in the byte order of the machine that wrote the file; it is read here from the
  magic.

The reader only reads (pread on a descriptor the caller opened; no mmap, so a file cut while it
is read cannot crash the process). It takes the lock bbolt's own readers take, without waiting
for it (share_lock): a runtime holding the file open is never waited for, and one starting is
held off for the few milliseconds of the read. Where the runtime holds the file (it runs), its
commits may land during the read, and a read is only good if no commit did (Database.unchanged).
Everything it is given is checked before use: a page id beyond the high-water mark or the file,
a page that is not what its place requires, an element that points outside its page, a tree
that is deeper than any real one, pages reached twice in one tree, and a walk that reads more
than a few times the file: each is a BoltError naming the file and the page.
"""

from __future__ import annotations

import fcntl
import os
import struct
from collections.abc import Iterator

from cni_reaper.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Union

MAGIC = 0xED0CDAED
FORMAT_VERSION = 2

BRANCH_PAGE = 0x01
LEAF_PAGE = 0x02
META_PAGE = 0x04
FREELIST_PAGE = 0x10
BUCKET_LEAF = 0x01  # a leaf element whose value is a nested bucket

PAGE_HEADER_SIZE = 16
ELEMENT_SIZE = 16  # branch and leaf elements alike
BUCKET_HEADER_SIZE = 16
# The meta fields the checksum covers: magic, version, page size, flags (u32 each), root page,
# sequence, freelist page, high-water mark, transaction id (u64 each).
META_CHECKED_SIZE = 56
META_SIZE = META_CHECKED_SIZE + 8

# bbolt takes the OS page size unless told otherwise: 4 KiB on x86, up to 64 KiB on arm64 and
# ppc64 kernels. Sizes outside these bounds are taken for damage.
MIN_PAGE_SIZE = 512
MAX_PAGE_SIZE = 1 << 20
# Where page 1 is looked for when page 0 is damaged and so cannot say the page size: where
# bbolt looks (db.go, Open), at the OS page size. No other place: a page of a file whose page
# size differs may hold anything a value holds, such as a pod's spec.
PAGE_1_WITHOUT_PAGE_0 = os.sysconf("SC_PAGE_SIZE")
# A B+tree of 2^64 keys with two keys per page is 64 levels deep; buckets nest as deep as their
# writer wants, but containerd's are 6 deep.
MAX_TREE_DEPTH = 64
MAX_NESTING = 64
# The walks of one Database read at most this many times the file (plus a little), whatever
# the pages say: shared or cyclic pages in a damaged file end as an error, not a hang.
READ_BUDGET_FACTOR = 4
READ_BUDGET_SLACK = 1 << 20
# Elements walked, at most, by the walks of one Database: the file holds at most one per
# ELEMENT_SIZE bytes, and the walks' lookups go over a few again. Elements of an inline bucket
# are cut from bytes already read, which READ_BUDGET_FACTOR does not see: many elements
# naming one inline bucket would be walked once each.
ELEMENT_BUDGET_FACTOR = 16
ELEMENT_BUDGET_SLACK = 1 << 20

FNV64_OFFSET = 0xCBF29CE484222325
FNV64_PRIME = 0x100000001B3
U64 = (1 << 64) - 1


class BoltError(Exception):
    """The file is not a bbolt database this reader can walk: damaged, cut, or not one at all."""


def fnv1a64(data: bytes) -> int:
    value = FNV64_OFFSET
    for byte in data:
        value = ((value ^ byte) * FNV64_PRIME) & U64
    return value


class Meta(Record):
    page_id: int  # 0 or 1
    byte_order: str  # "<" or ">", as struct spells it
    page_size: int
    root: int  # the root bucket's root page
    high_water: int  # pages in use: every page id is below it
    txid: int
    damage: str  # "" for a meta that can be used


class _Page(Record):
    page_id: int
    flags: int
    elements: int
    data: bytes  # the whole page, header included (for an inline page, the inline bytes)


if TYPE_CHECKING:
    Value = Union[bytes, "Bucket"]


class Database:
    """A bbolt file open for reading; the caller owns the descriptor (opened with O_NOFOLLOW)
    and keeps it open while the Database is used."""

    def __init__(self, fd: int, name: str) -> None:
        self._fd = fd
        self.name = name
        self.size = os.fstat(fd).st_size
        self._budget = READ_BUDGET_FACTOR * self.size + READ_BUDGET_SLACK
        self._elements_left = ELEMENT_BUDGET_FACTOR * self.size // ELEMENT_SIZE
        self._elements_left += ELEMENT_BUDGET_SLACK
        self._metas_read: dict[int, bytes] = {}  # offset: the meta page's bytes read there
        self.meta = self._choose_meta()
        self.page_size = self.meta.page_size
        self.byte_order = self.meta.byte_order

    def root(self) -> Bucket:
        """The top-level bucket: its keys are the database's buckets."""
        return Bucket(self, self.meta.root, None, 0)

    def bucket(self, *path: bytes) -> Bucket | None:
        """The bucket at path (top-level name first); None where a name is missing."""
        bucket = self.root()
        for name in path:
            found = bucket.get(name)
            if not isinstance(found, Bucket):
                return None
            bucket = found
        return bucket

    def unchanged(self) -> bool:
        """Whether no commit has written a meta page since this Database read them.

        bbolt copies on write: a commit writes its pages to free ones, then its meta, to the
        meta page the commit before did not use. A page the read commit T reaches is freed by
        T+1 at the earliest, and only T+2 may write over it, once T+1's meta is whole on the
        other meta page. So while that page still holds what it held, byte for byte, no page
        the walk read can have changed under it; and its bytes change with every write to it
        (the transaction id grows), even one not done yet. Both pages are compared.
        """
        for offset, was in self._metas_read.items():
            try:
                now = self._read_meta_page(offset)
            except BoltError:
                return False
            if now != was:
                return False
        return True

    def error(self, message: str) -> BoltError:
        return BoltError(f"{self.name}: {message}")

    def walked(self, elements: int) -> None:
        """Count elements a walk is about to go over against the element budget."""
        self._elements_left -= elements
        if self._elements_left < 0:
            raise self.error(
                f"walking more than {ELEMENT_BUDGET_FACTOR} times the elements the file can "
                "hold: elements are shared"
            )

    def _read(self, offset: int, length: int) -> bytes:
        self._budget -= length
        if self._budget < 0:
            raise self.error(
                f"reading more than {READ_BUDGET_FACTOR} times the file: pages are shared or cyclic"
            )
        try:
            data = os.pread(self._fd, length, offset)
        except OSError as e:
            raise self.error(f"cannot read {length} bytes at {offset}: {e.strerror or e}") from e
        if len(data) != length:
            raise self.error(f"cut short: {length} bytes at {offset} are past its end")
        return data

    def _meta_at(self, page_id: int, offset: int) -> tuple[Meta | None, str]:
        """The meta page at offset, or None and why bbolt would not take it (no magic, another
        version, a checksum mismatch). A meta bbolt would take may still be damaged beyond what
        its checksum covers (its pages past the end of the file): then Meta.damage says how."""
        page = self._read_meta_page(offset)
        self._metas_read[offset] = page
        if len(page) < PAGE_HEADER_SIZE + META_SIZE:
            return None, "past the end of the file"
        raw = page[PAGE_HEADER_SIZE:]
        order = _byte_order(raw[:4])
        if order is None:
            return None, "no bbolt magic"
        (
            _magic,
            version,
            page_size,
            _flags,
            root,
            _sequence,
            _freelist,
            high_water,
            txid,
            checksum,
        ) = struct.unpack(order + "IIIIQQQQQQ", raw)
        if version != FORMAT_VERSION:
            return None, f"format version {version}, not {FORMAT_VERSION}"
        # bbolt skips a checksum of 0 (files from before checksums); so does this reader.
        if checksum not in (0, fnv1a64(raw[:META_CHECKED_SIZE])):
            return None, "checksum mismatch"
        damage = ""
        if not MIN_PAGE_SIZE <= page_size <= MAX_PAGE_SIZE:
            damage = f"page size {page_size} out of bounds"
        elif page_id == 1 and offset != page_size:
            damage = f"page size {page_size}, but page 1 is at {offset}"
        elif not 2 <= root < high_water:
            damage = f"root page {root} outside pages 2..{high_water - 1}"
        elif high_water * page_size > self.size:
            damage = f"{high_water} pages of {page_size} bytes, more than the file holds"
        return Meta(page_id, order, page_size, root, high_water, txid, damage), ""

    def _read_meta_page(self, offset: int) -> bytes:
        """The header and meta of the meta page at offset, as far as the file holds them."""
        end = min(offset + PAGE_HEADER_SIZE + META_SIZE, self.size)
        return self._read(offset, end - offset) if end > offset else b""

    def _choose_meta(self) -> Meta:
        """The meta bbolt would open the file with: the valid one with the higher txid. The
        other is never taken instead of a damaged one: it is an older commit, and a file whose
        newest commit is cut is one bbolt cannot open either."""
        meta0, why0 = self._meta_at(0, 0)
        meta1: Meta | None = None
        if meta0 is not None and not meta0.damage:
            meta1, why1 = self._meta_at(1, meta0.page_size)
            same = (meta0.byte_order, meta0.page_size)
            if meta1 is not None and (meta1.byte_order, meta1.page_size) != same:
                meta1, why1 = None, "byte order or page size differs from page 0's"
        else:
            # Page 0 cannot say the page size: page 1 is looked for where bbolt looks.
            meta1, why1 = self._meta_at(1, PAGE_1_WITHOUT_PAGE_0)
            if meta1 is not None and meta1.damage:
                why1 = meta1.damage
                meta1 = None
            why1 = f"{why1}, at the OS page size ({PAGE_1_WITHOUT_PAGE_0})"
        metas = [meta for meta in (meta0, meta1) if meta is not None]
        if not metas:
            raise self.error(f"no valid meta page (page 0: {why0}; page 1: {why1})")
        chosen = max(metas, key=lambda meta: meta.txid)
        if chosen.damage:
            raise self.error(f"meta page {chosen.page_id} (txid {chosen.txid}): {chosen.damage}")
        return chosen

    def page(self, page_id: int) -> _Page:
        """Page page_id with its overflow, checked to lie in the pages in use."""
        if not 2 <= page_id < self.meta.high_water:
            raise self.error(f"page id {page_id} outside pages 2..{self.meta.high_water - 1}")
        offset = page_id * self.page_size
        header = self._read(offset, PAGE_HEADER_SIZE)
        stored_id, flags, count, overflow = struct.unpack(self.byte_order + "QHHI", header)
        if stored_id != page_id:
            raise self.error(f"page {page_id} says it is page {stored_id}")
        if page_id + overflow >= self.meta.high_water:
            raise self.error(f"page {page_id} overflows past the pages in use ({overflow} more)")
        length = (1 + overflow) * self.page_size
        data = header + self._read(offset + PAGE_HEADER_SIZE, length - PAGE_HEADER_SIZE)
        return _Page(page_id, flags, count, data)


def share_lock(fd: int) -> str | None:
    """Take the lock bbolt's read-only opening takes (flock, shared), without waiting. None:
    taken; until fd is closed no writer can open the file (bbolt takes it exclusive to write,
    and a runtime retries every 50 ms until it has it), so nothing commits during the read.
    Else why not: a writer holds it (the runtime runs), or the lock cannot be had at all."""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return "the lock bbolt's readers take is held (a running containerd holds it)"
    except OSError as e:
        return f"the lock bbolt's readers take cannot be had ({e.strerror or e})"
    return None


def _byte_order(magic: bytes) -> str | None:
    if magic == struct.pack("<I", MAGIC):
        return "<"
    if magic == struct.pack(">I", MAGIC):
        return ">"
    return None


class Bucket:
    """A bucket of a Database: its keys in order, each with a value or a nested bucket."""

    def __init__(self, db: Database, root: int, inline: bytes | None, nesting: int) -> None:
        if nesting > MAX_NESTING:
            raise db.error(f"buckets nested more than {MAX_NESTING} deep")
        self._db = db
        self._root = root
        self._inline = inline
        self._nesting = nesting

    def items(self) -> Iterator[tuple[bytes, Value]]:
        """Every key in order, with its value or nested bucket."""
        for page in self._leaves():
            yield from self._elements(page)

    def keys(self) -> Iterator[bytes]:
        for key, _ in self.items():
            yield key

    def get(self, key: bytes) -> Value | None:
        """The value or nested bucket at key; None where there is none."""
        page = self._leaf_for(key)
        for found, value in self._elements(page):
            if found == key:
                return value
        return None

    def _inline_page(self) -> _Page:
        assert self._inline is not None
        data = self._inline
        if len(data) < PAGE_HEADER_SIZE:
            raise self._db.error("an inline bucket shorter than a page header")
        _, flags, count, _ = struct.unpack(self._db.byte_order + "QHHI", data[:PAGE_HEADER_SIZE])
        if flags & LEAF_PAGE == 0:
            raise self._db.error(f"an inline bucket whose page is not a leaf (flags {flags:#x})")
        # bbolt inlines a bucket of at most a quarter page, and never one that holds a bucket
        # (Bucket.inlineable): inline buckets nested in one another would multiply a walk.
        if len(data) > self._db.page_size // 4:
            raise self._db.error(f"an inline bucket of {len(data)} bytes, over a quarter page")
        return _Page(0, flags, count, data)

    def _tree_page(self, page_id: int, depth: int, seen: set[int]) -> _Page:
        if depth > MAX_TREE_DEPTH:
            raise self._db.error(f"a bucket tree deeper than {MAX_TREE_DEPTH} at page {page_id}")
        if page_id in seen:
            raise self._db.error(f"page {page_id} is reached twice in one bucket")
        seen.add(page_id)
        page = self._db.page(page_id)
        if page.flags & (BRANCH_PAGE | LEAF_PAGE) == 0:
            raise self._db.error(f"page {page_id} in a bucket is neither branch nor leaf")
        return page

    def _leaves(self) -> Iterator[_Page]:
        if self._inline is not None:
            yield self._inline_page()
            return
        seen: set[int] = set()
        stack = [(self._root, 0)]
        while stack:
            page_id, depth = stack.pop()
            page = self._tree_page(page_id, depth, seen)
            if page.flags & BRANCH_PAGE:
                children = [child for _, child in self._branch_elements(page)]
                stack.extend((child, depth + 1) for child in reversed(children))
            else:
                yield page

    def _leaf_for(self, key: bytes) -> _Page:
        """The leaf where key is, if anywhere: the B+tree descent bbolt's cursor makes."""
        if self._inline is not None:
            return self._inline_page()
        seen: set[int] = set()
        page = self._tree_page(self._root, 0, seen)
        depth = 0
        while page.flags & BRANCH_PAGE:
            elements = self._branch_elements(page)
            if not elements:
                raise self._db.error(f"branch page {page.page_id} has no elements")
            # The last child whose first key is not after key (the first child for a key
            # before them all).
            child = elements[0][1]
            for first_key, page_id in elements:
                if first_key > key:
                    break
                child = page_id
            depth += 1
            page = self._tree_page(child, depth, seen)
        return page

    def _element(self, page: _Page, index: int) -> tuple[int, bytes]:
        """Element index's raw fields and where its key starts in the page."""
        at = PAGE_HEADER_SIZE + index * ELEMENT_SIZE
        if at + ELEMENT_SIZE > len(page.data):
            raise self._db.error(f"page {page.page_id}: element {index} is past the page")
        return at, page.data[at : at + ELEMENT_SIZE]

    def _slice(self, page: _Page, start: int, length: int, what: str) -> bytes:
        end = start + length
        if end > len(page.data):
            raise self._db.error(f"page {page.page_id}: a {what} runs past the page")
        return page.data[start:end]

    def _branch_elements(self, page: _Page) -> list[tuple[bytes, int]]:
        self._db.walked(page.elements)
        found = []
        for index in range(page.elements):
            at, raw = self._element(page, index)
            pos, key_size, child = struct.unpack(self._db.byte_order + "IIQ", raw)
            found.append((self._slice(page, at + pos, key_size, "key"), child))
        return found

    def _elements(self, page: _Page) -> Iterator[tuple[bytes, Value]]:
        if page.flags & LEAF_PAGE == 0:  # pragma: no cover - _leaves yields leaves only
            raise self._db.error(f"page {page.page_id} is not a leaf")
        order = self._db.byte_order
        self._db.walked(page.elements)
        for index in range(page.elements):
            at, raw = self._element(page, index)
            flags, pos, key_size, value_size = struct.unpack(order + "IIII", raw)
            key = self._slice(page, at + pos, key_size, "key")
            value = self._slice(page, at + pos + key_size, value_size, "value")
            if flags & BUCKET_LEAF == 0:
                yield key, value
                continue
            if self._inline is not None:
                raise self._db.error(f"inline bucket holds bucket {key!r}: bbolt never writes one")
            if len(value) < BUCKET_HEADER_SIZE:
                raise self._db.error(f"page {page.page_id}: bucket {key!r} has no header")
            root, _sequence = struct.unpack(order + "QQ", value[:BUCKET_HEADER_SIZE])
            inline = value[BUCKET_HEADER_SIZE:] if root == 0 else None
            yield key, Bucket(self._db, root, inline, self._nesting + 1)
