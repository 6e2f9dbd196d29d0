"""Which pod sandboxes each container runtime will still know after this boot, and tear down
itself, read from what it keeps on disk. Nothing is started or written, and only
containerd's database is locked, as bbolt's own readers lock it, for its read; every file is
read inside --root (node_root.py: a symlink is resolved as the node resolves it, never out of
the root, and the last component is opened with O_NOFOLLOW).

After a reboot every sandbox of the earlier boot is dead. A runtime that still has a sandbox's
record tears its network down when kubelet stops it (or, CRI-O, when it starts), with the cached
result; a sandbox no runtime will tear down is one the reaper must DEL itself. So each sandbox
ID found in a runtime's records is one of: known (its runtime will DEL it), dropped (a record,
but its runtime will never DEL it), unsaved (containerd's record of an ADD that never saved its
result: some releases never DEL it, the others' DEL after the reaper's is harmless) or
undecided (which one cannot be told from disk). An ID in no record is dropped too: no runtime
will ever DEL it. Dropped and unsaved sandboxes are the reaper's to DEL.

containerd (1.6, 1.7 and 2.x alike; k3s and RKE2 run the same containerd with their own root):
- At start, the CRI plugin's recover() (pkg/cri/server/restart.go in 1.6 and 1.7,
  internal/cri/server/restart.go in 2.x) lists the containers of its namespace (k8s.io,
  pkg/cri/constants) labelled io.cri-containerd.kind=sandbox, and in 1.7's sbserver and 2.x also
  the sandbox store. Each is loaded from its metadata extension (loadSandbox); one without it is
  skipped ("Failed to load sandbox") and never torn down. Then cleanupOrphanedIDDirs removes
  every <root>/io.containerd.grpc.v1.cri/sandboxes/<id> dir without a container record: the
  record in the metadata database is the truth, not the dir. A record marked as a CRI sandbox
  in another namespace is read too, but no CRI loads it: undecided.
- The database is <root>/io.containerd.metadata.v1.bolt/meta.db, bbolt (bbolt.py), laid out as
  metadata/buckets.go says: v1/<namespace>/containers/<id>/{labels/<key>,
  extensions/<name>, ...}, and v1/<namespace>/sandboxes/<id>/extensions/metadata since 1.7.
  An extension is a protobuf Any whose value, for the CRI's sandbox metadata
  (io.cri-containerd.sandbox.metadata on the container, "metadata" in the sandbox store), is
  JSON: {"Version": "v1", "Metadata": {"ID", "NetNSPath", "CNIResult", ...}}.
- RunPodSandbox (pkg/cri/server/sandbox_run.go, 1.6 and 1.7) creates the container record
  (NewContainer, with its labels and metadata) first, then the sandboxes/<id> dir, then the
  netns (saved into the record), then the CNI ADD (setupPodNetwork), and only then saves the
  CNI result into the record. In 1.7's sbserver and in 2.x the sandbox store record is created
  before the ADD too. bbolt syncs every commit (containerd sets only NoFreelistSync; 2.x has an
  opt-in no_sync), so no sandbox reaches its CNI ADD without a durable record: a crash during or
  right after the ADD leaves a record without a CNI result, not a missing record.
- A running containerd (a dry run by hand, --force) holds meta.db open and commits to it while
  it is read: its metadata plugin opens it with bbolt, which takes an exclusive flock and, by
  default (io.containerd.timeout.bolt.open = 0), waits for it as long as another holds one. A
  read holds the shared flock bbolt's readers take, so a containerd starting then waits out the
  read. Where the flock is held already, a read counts only if no commit landed during it
  (bbolt.Database.unchanged); one read in READS_WHILE_COMMITTED that is so, or the records
  are in doubt. A walk torn by commits could miss a sandbox containerd still knows.
- StopPodSandbox (sandbox_stop.go) skips the CNI DEL when the record holds no CNI result in
  1.6.37 and later 1.6 releases, 1.7.23 to 1.7.30, 2.0.0 to 2.0.7, 2.1.0 to 2.1.6 and 2.2.0 to
  2.2.1; earlier and later releases run it (containerd PR #12923 restored it). Which release
  will start is not on disk. Such a sandbox is unsaved: its networks are DEL'd as a forgotten
  sandbox's, since the skipping releases would leave its entries and addresses for good (the
  crash campaign saw 1.7.24 leave a whole cni-loopback entry so), and the others' DEL, run
  again with no cached result, finds nothing left to undo and succeeds.

CRI-O (read in 1.20 to 1.36; internal/lib/container_server.go, server/server.go,
internal/criocli/wipe.go, which was cmd/crio/wipe.go before 1.28):
- Its sandboxes are containers/storage containers of the graph root whose metadata says
  "pod": true (with pod-name and pod-id: storage.IsCrioContainer); the sandbox ID is the
  container ID. They are listed in <graph root>/<driver>-containers/containers.json and, since
  containers/storage 1.45 (CRI-O 1.27.0; later 1.26 patch releases too),
  volatile-containers.json beside it: CRI-O makes its containers volatile, and that file is
  written without fsync.
- runPodSandbox (server/sandbox_run_linux.go) creates the storage container, runs the CNI ADD
  (networkStart), and only then writes userdata/config.json, the spec LoadSandbox reads back.
- At start, restore() (server.go) loads every sandbox (LoadSandbox). After a reboot that fails
  (the state in the run root is gone), and a sandbox that failed after it was built goes to
  networkStop: CNI DEL, retried 20 times with backoff, in one cleanup that stops at the first
  sandbox whose DEL keeps failing (resourcestore). A sandbox whose config.json is missing or
  unreadable fails before it is built: it gets no DEL at all. With internal_wipe (the default
  since 1.22) a sandbox that did load is removed by wipeIfAppropriate through removePodSandbox,
  which runs networkStop too. networkStop does nothing for a sandbox whose userdata has a
  network-stopped file: its DEL already ran.
- So after a reboot CRI-O DELs, at its own start, every sandbox it can read back (restore()
  has done so since 1.15, in a background cleanup with retries since mid-2021: 1.20.x, 1.21.x,
  1.22), with libcni (1.1.2
  up to CRI-O 1.30: a damaged cache file fails that DEL, an intact one works). node-state.md's
  "before 1.32 it never DELs wiped ones" holds only for the wipes below; peers.md's restore()
  DEL is the path a reboot takes. What 1.32 added is a CNI GC after restore().
- Wipes without DEL: `crio wipe` (crio-wipe.service, when enabled) after an unclean shutdown
  (clean_shutdown_file missing while its .supported file exists) removes the whole graph root
  (HandleUncleanShutdown), and with internal_wipe = false deletes CRI-O's containers after a
  reboot (wipeCrio; internal_wipe defaults to false before 1.22, taken here as set). With
  internal_repair (1.28 to 1.31: default false; 1.32 and later: default true; which release
  runs is not on disk, version_file_persist being empty by default since 1.25), CRI-O itself
  checks its storage after an unclean shutdown and removes what it cannot repair, or all of
  it: unless the config turns internal_repair off, all are undecided.
- A version file (version_file, under /run) that exists means CRI-O has started in this boot
  already: no wipe happens at its next start.

No CRI runtime's records at all (no containerd database with the CRI's namespace, no
containers/storage holding a CRI-O container, wherever the configs put them): knows() answers
None, not False. No runtime would DEL those sandboxes, but whatever made the entries keeps its
records where this reaper did not look (a runtime started with flags that move its root, k3s
with its own data-dir, a root on a volume not mounted yet, one it does not read): a whole entry
is left for it, as before the inventory existed. Records of the same software that no CRI
wrote say nothing of the pods kubelet ran, and do not count: Docker's containerd (namespace
moby only), podman's or buildah's containers/storage (no container with CRI-O's pod metadata).
An ID missing from CRI records that were read is dropped.

Records that cannot be read (a damaged meta.db, an unparsable containers.json, a symlink out of
the root), or a runtime's config that could not be read whole, so that its records may be kept
elsewhere (RuntimeConfigs.records_in_doubt), make the inventory unreadable: then no ID is said
to be dropped.
"""

from __future__ import annotations

import functools
import json
import os
import posixpath
import stat
from collections.abc import Callable, Iterable, Iterator, Mapping
from types import MappingProxyType

from cni_reaper import failpoint
from cni_reaper.choice import Choice
from cni_reaper.content import Content, ContentVerdict, document
from cni_reaper.node_root import (
    LeavesRoot,
    canonical,
    exists_inside,
    host_path,
    listed,
    open_inside,
)
from cni_reaper.record import Record
from cni_reaper.runtime.bbolt import BoltError, Bucket, Database, share_lock
from cni_reaper.runtime.config import (
    CRIO_CLEAN_SHUTDOWN_FILE,
    LocatedPath,
    Runtime,
    RuntimeConfigs,
    crio_settings,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

CONTAINERD_RUNTIMES = frozenset({Runtime.CONTAINERD, Runtime.K3S, Runtime.RKE2})
META_DB = "io.containerd.metadata.v1.bolt/meta.db"
# A containerd committing between its CRI calls leaves most reads of a few milliseconds whole;
# one that commits during each of these many is too busy to read.
READS_WHILE_COMMITTED = 3
# After a read of meta.db, before the look at whether a commit landed during it (the tests have a
# commit land there, or a writer try to open it).
META_DB_READ = failpoint.declare("inventory.meta-db-read", step=False)
CRI_NAMESPACE = "k8s.io"
KIND_LABEL = b"io.cri-containerd.kind"
SANDBOX_KIND = b"sandbox"
CONTAINER_METADATA_EXTENSION = b"io.cri-containerd.sandbox.metadata"
SANDBOX_STORE_METADATA_EXTENSION = b"metadata"
DEL_SKIPPED_RELEASES = (
    "containerd 1.6.37 and later 1.6, 1.7.23 to 1.7.30, 2.0.0 to 2.0.7, 2.1.0 to 2.1.6 and "
    "2.2.0 to 2.2.1"
)

STORAGE_FILES = ("containers.json", "volatile-containers.json")
CRIO_VERSION_FILE = "/run/crio/version"
CRIO_WIPE_UNIT = "crio-wipe.service"
SYSTEMD_UNIT_DIRS = ("/etc/systemd/system", "/usr/lib/systemd/system", "/lib/systemd/system")
# containers.json holds about 1 KiB per container; a sandbox's config.json tens of KiB.
MAX_STORAGE_FILE_BYTES = 64 << 20
MAX_SANDBOX_CONFIG_BYTES = 4 << 20
MAX_STORAGE_DIRS = 64


class Fate(str, Choice):
    """What a runtime will do with the network of a sandbox it has a record of."""

    KNOWN = "known"  # it will know the sandbox and DEL its network itself
    UNDECIDED = "undecided"  # which it will do cannot be told from disk
    # containerd's record of a sandbox whose CNI ADD never saved its result: some releases
    # never DEL it, the others DEL it again after the reaper, which is harmless
    UNSAVED = "unsaved"
    DROPPED = "dropped"  # it has a record but will never DEL it


# Where records of one ID disagree (2.x keeps a sandbox both as a container and in its sandbox
# store), a record its runtime DELs from wins over doubt, and doubt over a record it may or
# will not DEL from.
_FATE_RANK = {Fate.DROPPED: 0, Fate.UNSAVED: 1, Fate.UNDECIDED: 2, Fate.KNOWN: 3}


class SandboxInventory(Record):
    # sandbox IDs some runtime will still know after this boot, and DEL itself
    known: frozenset[str]
    # why some runtime's records could not be read; non-empty: no ID may be called forgotten
    unreadable: tuple[str, ...]
    # one line per runtime root consulted: what was read, how many sandboxes
    sources: tuple[str, ...]
    # IDs a runtime has records of whose fate cannot be told (knows() answers None)
    undecided: frozenset[str] = frozenset()
    # IDs of containerd records whose CNI ADD never saved its result (knows() answers False)
    unsaved: frozenset[str] = frozenset()
    # for every ID in some runtime's records: which runtime, and what it will do
    notes: Mapping[str, str] = MappingProxyType({})
    # whether any CRI runtime's records were found at all
    records_found: bool = True

    def knows(self, sandbox_id: str) -> bool | None:
        """True: a runtime will know the sandbox after this boot and DEL it itself. False:
        proven that none will (no record, or a record its runtime drops without DEL), or that
        the reaper's DEL must not wait for one (unsaved). None: cannot tell."""
        if sandbox_id in self.known:
            return True
        if self.unreadable or sandbox_id in self.undecided or not self.records_found:
            return None
        return False

    def describe(self, sandbox_id: str) -> str:
        if not self.records_found and not self.unreadable:
            return "no CRI runtime's sandbox records found on this node"
        note = self.notes.get(sandbox_id)
        if note is not None:
            return note
        if self.unreadable:
            return "in none of the records read, which may not be all (see the warnings)"
        return "no runtime has a record of it"


class _Unreadable(Exception):
    """A runtime record that exists but cannot be read."""


class _Found:
    def __init__(self) -> None:
        self.fates: dict[str, tuple[Fate, str]] = {}
        self.unreadable: list[str] = []
        self.sources: list[str] = []
        self.records_found = False

    def add(self, sandbox_id: str, fate: Fate, note: str) -> None:
        held = self.fates.get(sandbox_id)
        if held is None or _FATE_RANK[fate] > _FATE_RANK[held[0]]:
            self.fates[sandbox_id] = (fate, note)

    def inventory(self) -> SandboxInventory:
        def with_fate(fate: Fate) -> frozenset[str]:
            return frozenset(i for i, (f, _) in self.fates.items() if f is fate)

        return SandboxInventory(
            known=with_fate(Fate.KNOWN),
            unreadable=tuple(self.unreadable),
            sources=tuple(self.sources),
            undecided=with_fate(Fate.UNDECIDED),
            unsaved=with_fate(Fate.UNSAVED),
            notes=MappingProxyType({i: note for i, (_, note) in self.fates.items()}),
            records_found=self.records_found or bool(self.unreadable),
        )


def _open_file(root: str, node_path: str) -> int | None:
    """A descriptor of the regular file at node_path; None where nothing is there."""
    try:
        fd, _ = open_inside(root, node_path)
    except (FileNotFoundError, NotADirectoryError):
        try:
            dangling = exists_inside(root, node_path)
        except (OSError, LeavesRoot):
            dangling = False
        if dangling:
            raise _Unreadable(
                f"a symlink whose target does not exist inside {root} (an absolute target is "
                "the node's own path)"
            ) from None
        return None
    except LeavesRoot:
        raise _Unreadable(f"a symlink that leads out of {root}") from None
    except OSError as e:
        raise _Unreadable(e.strerror or str(e)) from e
    try:
        mode = os.fstat(fd).st_mode
    except OSError as e:
        os.close(fd)
        raise _Unreadable(e.strerror or str(e)) from e
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise _Unreadable("not a regular file")
    return fd


def _read_file(root: str, node_path: str, limit: int) -> bytes | None:
    fd = _open_file(root, node_path)
    if fd is None:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise _Unreadable(e.strerror or str(e)) from e
    if len(data) > limit:
        raise _Unreadable(f"larger than {limit} bytes")
    return data


def _exists(root: str, node_path: str) -> bool:
    """Whether node_path exists on the node; something that cannot be looked at counts."""
    try:
        return exists_inside(root, node_path)
    except (OSError, LeavesRoot):
        return True


def _in_effect(configs: RuntimeConfigs, runtimes: Iterable[Runtime]) -> list[LocatedPath]:
    """The persistent roots the runtimes use at their next start: a default their config
    overrides is not one (they read the config when they start)."""
    wanted = frozenset(runtimes)
    seen: set[str] = set()
    found = []
    for located in configs.persistent_roots:
        if located.runtime in wanted and located.in_effect and located.node_path not in seen:
            seen.add(located.node_path)
            found.append(located)
    return found


# containerd


def _protobuf_any_value(data: bytes) -> bytes:
    """The value field (2) of a serialized google.protobuf.Any; ValueError when it is not one."""
    at = 0
    value = b""

    def varint() -> int:
        nonlocal at
        result = shift = 0
        while True:
            if at >= len(data) or shift > 63:
                raise ValueError("a varint runs past the end")
            byte = data[at]
            at += 1
            result |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return result

    while at < len(data):
        tag = varint()
        field, wire_type = tag >> 3, tag & 7
        if wire_type == 0:
            varint()
        elif wire_type == 2:
            length = varint()
            if at + length > len(data):
                raise ValueError("a field runs past the end")
            if field == 2:
                value = data[at : at + length]
            at += length
        else:
            raise ValueError(f"wire type {wire_type} in an Any")
    return value


def _cri_metadata_fate(extension: bytes | None, where: str) -> tuple[Fate, str]:
    if extension is None:
        return Fate.DROPPED, (
            f"{where}, without the CRI's sandbox metadata: containerd cannot load it at start "
            "(loadSandbox) and never DELs it"
        )
    try:
        document = json.loads(_protobuf_any_value(extension))
        metadata = document["Metadata"]
        netns = metadata.get("NetNSPath")
        result = metadata.get("CNIResult")
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return Fate.UNDECIDED, f"{where}; its CRI sandbox metadata could not be read here"
    if netns and result is None:
        return Fate.UNSAVED, (
            f"{where}, whose CNI ADD never saved its result: {DEL_SKIPPED_RELEASES} never DEL "
            "such a sandbox; other releases DEL it again, with nothing left to undo"
        )
    return Fate.KNOWN, f"{where}: containerd loads it at start and DELs it when kubelet stops it"


def _buckets(bucket: Bucket | None) -> Iterator[tuple[bytes, Bucket]]:
    if bucket is not None:
        for key, value in bucket.items():
            if isinstance(value, Bucket):
                yield key, value


def _sub_buckets(bucket: Bucket, *names: bytes) -> dict[bytes, Bucket]:
    """The nested buckets of bucket among names, from one walk of its keys."""
    return {key: value for key, value in _buckets(bucket) if key in names}


def _value(bucket: Bucket | None, key: bytes) -> bytes | None:
    if bucket is None:
        return None
    value = bucket.get(key)
    return value if isinstance(value, bytes) else None


def _containerd_sandboxes(db: Database, runtime: str) -> Iterator[tuple[str, str, Fate, str]]:
    """(namespace, sandbox ID, fate, note) for each CRI sandbox record of the database, in
    every namespace. The CRI loads only its own (k8s.io): a record elsewhere that says it is a
    CRI sandbox is undecided, since no one can say who made it or who will tear it down."""
    for raw_namespace, namespace_bucket in _buckets(db.bucket(b"v1")):
        namespace = raw_namespace.decode("utf-8", "replace")
        objects = _sub_buckets(namespace_bucket, b"containers", b"sandboxes")
        records = []
        for raw_id, container in _buckets(objects.get(b"containers")):
            fields = _sub_buckets(container, b"labels", b"extensions")
            if _value(fields.get(b"labels"), KIND_LABEL) != SANDBOX_KIND:
                continue
            extension = _value(fields.get(b"extensions"), CONTAINER_METADATA_EXTENSION)
            records.append((raw_id, "a sandbox container", extension))
        for raw_id, sandbox in _buckets(objects.get(b"sandboxes")):
            extensions = _sub_buckets(sandbox, b"extensions").get(b"extensions")
            extension = _value(extensions, SANDBOX_STORE_METADATA_EXTENSION)
            records.append((raw_id, "a sandbox store record", extension))
        for raw_id, what, extension in records:
            where = f"{runtime}: {what} in namespace {namespace}"
            if namespace == CRI_NAMESPACE:
                fate, note = _cri_metadata_fate(extension, where)
            else:
                fate = Fate.UNDECIDED
                note = f"{where}, which containerd's CRI (namespace {CRI_NAMESPACE}) never loads"
            yield namespace, os.fsdecode(raw_id), fate, note


def _containerd(root: str, located: LocatedPath, found: _Found) -> None:
    runtime = located.runtime.value
    node_path = posixpath.join(located.node_path, META_DB)
    where = host_path(root, node_path)
    try:
        fd = _open_file(root, node_path)
    except _Unreadable as e:
        found.unreadable.append(f"{runtime}: {where}: {e}")
        return
    if fd is None:
        found.sources.append(f"{runtime}: {where}: not present: no sandbox records")
        return
    try:
        read = _read_meta_db(fd, where, runtime)
    except BoltError as e:
        found.unreadable.append(f"{runtime}: {e}")
        return
    finally:
        os.close(fd)  # and with it the lock
    records, per_namespace, of_the_cri, unlocked = read
    for sandbox_id, fate, note in records:
        found.add(sandbox_id, fate, note)
    ids = {sandbox_id for sandbox_id, _, _ in records}
    namespaces = ", ".join(f"{name}: {n}" for name, n in sorted(per_namespace.items()))
    counted = f" (namespace {namespaces})" if namespaces else ""
    counts = {fate: sum(1 for _, f, _ in records if f is fate) for fate in _COUNTED}
    extra = "".join(f", {counts[fate]} {what}" for fate, what in _COUNTED.items() if counts[fate])
    if of_the_cri:
        found.records_found = True
    else:
        extra += f"; no namespace {CRI_NAMESPACE}: not the CRI's records"
    if unlocked:
        extra += f"; {unlocked}: read between two commits"
    found.sources.append(f"{runtime}: {where}: {_sandboxes(len(ids))}{counted}{extra}")


class _MetaDbRead(Record):
    records: list[tuple[str, Fate, str]]  # (sandbox ID, fate, note)
    per_namespace: dict[str, int]
    of_the_cri: bool  # whether the CRI's namespace is there
    unlocked: str  # why the lock was not had ("": it was), so that commits could land


def _walk_meta_db(db: Database, runtime: str, unlocked: str) -> _MetaDbRead:
    per_namespace: dict[str, int] = {}
    records = []
    # Docker's containerd keeps a database too, with its own namespace (moby) only: records
    # the CRI never wrote say nothing of the pods kubelet ran.
    of_the_cri = db.bucket(b"v1", CRI_NAMESPACE.encode()) is not None
    for namespace, sandbox_id, fate, note in _containerd_sandboxes(db, runtime):
        per_namespace[namespace] = per_namespace.get(namespace, 0) + 1
        records.append((sandbox_id, fate, note))
    return _MetaDbRead(records, per_namespace, of_the_cri, unlocked)


def _read_meta_db(fd: int, where: str, runtime: str) -> _MetaDbRead:
    """The records of one whole commit. A BoltError where the file is damaged, or where a
    writer holds it and a commit landed during every read."""
    unlocked = share_lock(fd) or ""
    for _ in range(READS_WHILE_COMMITTED if unlocked else 1):
        db = None
        try:
            db = Database(fd, where)
            read: _MetaDbRead | BoltError = _walk_meta_db(db, runtime, unlocked)
        except BoltError as e:
            read = e  # damage, or a page a commit wrote over during the walk
        failpoint.hit(META_DB_READ)
        if not unlocked or (db is not None and db.unchanged()):
            if isinstance(read, BoltError):
                raise read  # damage in one whole commit
            return read
    held = f"{where}: {unlocked}, and"
    if isinstance(read, BoltError):
        raise BoltError(f"{held} no read of it was of one whole commit; the last: {read}")
    raise BoltError(f"{held} a commit landed during each of {READS_WHILE_COMMITTED} reads")


# How a records line counts the sandboxes not known, in this order.
_COUNTED = {
    Fate.UNDECIDED: "undecided",
    Fate.UNSAVED: "whose CNI ADD never saved its result",
    Fate.DROPPED: "it will never DEL",
}


def _sandboxes(n: int) -> str:
    return f"{n} sandbox" if n == 1 else f"{n} sandboxes"


# CRI-O


class _CrioStart(Record):
    """What CRI-O's next start does to the sandboxes in its storage as a whole."""

    fate: Fate | None  # for every sandbox; None: each is judged by its own files
    why: str
    rebooted: bool


def _setting(settings: Mapping[str, tuple[Any, str]], key: str, kind: type) -> Any:
    """A [crio] value of the right type; None where unset or of another type (CRI-O would not
    start with such a config, and then it DELs nothing: doubt either way)."""
    value = settings.get(key, (None, ""))[0]
    return value if isinstance(value, kind) else None


def _crio_wipe_enabled(root: str) -> str | None:
    """The enablement link of crio-wipe.service, which runs `crio wipe` before CRI-O starts;
    None where there is none, or the unit is masked."""
    if _masked(root, f"/etc/systemd/system/{CRIO_WIPE_UNIT}"):
        return None
    for unit_dir in SYSTEMD_UNIT_DIRS:
        try:
            fd, _ = open_inside(root, unit_dir, directory=True)
        except (OSError, LeavesRoot):
            continue
        try:
            names = sorted(entry.name for entry in listed(fd))
        except OSError:
            continue
        finally:
            os.close(fd)
        for name in names:
            if name.endswith((".wants", ".requires")):
                link = f"{unit_dir}/{name}/{CRIO_WIPE_UNIT}"
                if _exists(root, link):
                    return link
    return None


def _masked(root: str, node_path: str) -> bool:
    """Whether the unit file at node_path is masked: a symlink to /dev/null, which under --root
    need not exist."""
    parent, name = posixpath.split(node_path)
    try:
        fd, _ = open_inside(root, parent, directory=True)
    except (OSError, LeavesRoot):
        return False
    try:
        return os.readlink(name, dir_fd=fd) == "/dev/null"
    except OSError:
        return False
    finally:
        os.close(fd)


def _crio_start(root: str) -> _CrioStart:
    settings = crio_settings(root)
    version_file = _setting(settings, "version_file", str)
    version_file = CRIO_VERSION_FILE if version_file is None else version_file
    if version_file == "":
        return _CrioStart(None, "version_file is empty: CRI-O never wipes", rebooted=False)
    if _exists(root, canonical(version_file)):
        why = f"{host_path(root, canonical(version_file))} exists: CRI-O has started in this boot"
        return _CrioStart(None, why, rebooted=False)
    clean_file = _setting(settings, "clean_shutdown_file", str)
    clean_file = CRIO_CLEAN_SHUTDOWN_FILE if clean_file is None else clean_file
    unclean = (
        clean_file != ""
        and _exists(root, canonical(clean_file + ".supported"))
        and not _exists(root, canonical(clean_file))
    )
    wipe_unit = _crio_wipe_enabled(root)
    internal_wipe = _setting(settings, "internal_wipe", bool)
    internal_repair = _setting(settings, "internal_repair", bool)
    rebooted = f"rebooted ({host_path(root, canonical(version_file))} missing)"
    shutdown = (
        f"an unclean shutdown ({host_path(root, canonical(clean_file))} missing)"
        if unclean
        else "a clean shutdown"
    )
    if unclean and wipe_unit:
        return _CrioStart(
            Fate.DROPPED,
            f"{rebooted} after {shutdown}: {host_path(root, wipe_unit)} runs `crio wipe`, "
            "which removes CRI-O's storage without CNI DEL",
            rebooted=True,
        )
    if unclean and internal_repair is not False:
        return _CrioStart(
            Fate.UNDECIDED,
            f"{rebooted} after {shutdown}: CRI-O checks its storage (internal_repair, the "
            "default since 1.32) and removes without CNI DEL what it cannot repair",
            rebooted=True,
        )
    if wipe_unit and internal_wipe is False:
        return _CrioStart(
            Fate.DROPPED,
            f"{rebooted}: internal_wipe = false and {host_path(root, wipe_unit)} runs "
            "`crio wipe`, which deletes CRI-O's containers without CNI DEL",
            rebooted=True,
        )
    return _CrioStart(
        None, f"{rebooted} after {shutdown}: CRI-O DELs its sandboxes at start", rebooted=True
    )


def _storage_dirs(root: str, graph_root: str) -> list[str]:
    """The <driver>-containers dirs of a graph root, as node paths."""
    try:
        fd, _ = open_inside(root, graph_root, directory=True)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except LeavesRoot:
        raise _Unreadable(f"a symlink that leads out of {root}") from None
    except OSError as e:
        raise _Unreadable(e.strerror or str(e)) from e
    try:
        entries = listed(fd)
    except OSError as e:
        raise _Unreadable(e.strerror or str(e)) from e
    finally:
        os.close(fd)
    dirs = sorted(
        entry.name
        for entry in entries
        if entry.name.endswith("-containers") and entry.is_dir(follow_symlinks=False)
    )
    if len(dirs) > MAX_STORAGE_DIRS:
        raise _Unreadable(f"more than {MAX_STORAGE_DIRS} storage drivers' dirs")
    return [posixpath.join(graph_root, name) for name in dirs]


def _crio_sandbox_ids(data: bytes) -> tuple[list[str], int]:
    """The CRI-O pod sandboxes of a containers.json, as containers/storage reads it (an empty
    file is an empty store), and how many of its containers are CRI-O's (sandbox or not): one
    podman or buildah made has no pod metadata."""
    if not data.strip():
        return [], 0
    try:
        containers = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise _Unreadable(f"not JSON ({e})") from None
    if not isinstance(containers, list):
        raise _Unreadable("not a JSON list")
    ids = []
    of_crio = 0
    for container in containers:
        if not isinstance(container, dict) or not isinstance(container.get("id"), str):
            raise _Unreadable("a container without an id")
        text = _storage_metadata(container)
        metadata = document((text or "{}").encode("utf-8", "replace"))
        if type(metadata) is ContentVerdict:
            if metadata.content is Content.UNREADABLE:
                # Whole JSON that Go decodes: CRI-O knows this container, the reaper cannot
                # tell whose sandbox it is.
                raise _Unreadable(f"container {container['id']}'s metadata: {metadata.detail}")
            continue  # CRI-O ignores a container whose metadata it cannot parse
        if isinstance(metadata, dict) and metadata.get("pod-name") and metadata.get("pod-id"):
            of_crio += 1
            if metadata.get("pod") is True:
                ids.append(container["id"])
    return ids, of_crio


def _storage_metadata(container: dict[str, Any]) -> str | None:
    """A container's metadata as containers/storage decodes it into its string field: the key
    in any case, the last one winning, a null leaving what came before. A value of another
    type fails the whole file's load, and what CRI-O then knows cannot be told. (A key given
    twice exactly keeps only its last value here; containers/storage never writes one.)"""
    text = None
    for key, value in container.items():
        if value is None or key.lower() != "metadata":
            continue
        if type(value) is not str:
            raise _Unreadable(
                f"container {container['id']}'s metadata is no string: containers/storage "
                "cannot load this file"
            )
        text = value
    return text


def _crio_sandbox_fate(root: str, userdata: str, start: _CrioStart) -> tuple[Fate, str]:
    if start.fate is not None:
        return start.fate, f"cri-o: {start.why}"
    config_path = f"{userdata}/config.json"
    try:
        config = _read_file(root, config_path, MAX_SANDBOX_CONFIG_BYTES)
    except _Unreadable as e:
        return Fate.UNDECIDED, f"cri-o: {host_path(root, config_path)}: {e}"
    spec = document(config) if config is not None else None
    if type(spec) is ContentVerdict and spec.content is Content.UNREADABLE:
        # Whole JSON that Go decodes: CRI-O may well load this sandbox.
        return Fate.UNDECIDED, f"cri-o: {host_path(root, config_path)}: {spec.detail}"
    if not isinstance(spec, dict):
        how = "missing" if config is None else "not a JSON object"
        return Fate.DROPPED, (
            f"cri-o: its config.json is {how} (it is written after the CNI ADD): CRI-O cannot "
            "load the sandbox at start and never DELs it"
        )
    if _exists(root, f"{userdata}/network-stopped"):
        return Fate.DROPPED, (
            "cri-o: its network-stopped file says CRI-O ran its DEL already; it will not again"
        )
    if start.rebooted:
        return Fate.KNOWN, f"cri-o: {start.why}, this one included"
    return Fate.KNOWN, f"cri-o: {start.why}; it knows this sandbox, and DELs it when stopped"


def _crio(root: str, located: LocatedPath, start: Callable[[], _CrioStart], found: _Found) -> None:
    where = host_path(root, located.node_path)
    try:
        storage_dirs = _storage_dirs(root, located.node_path)
    except _Unreadable as e:
        found.unreadable.append(f"cri-o: {where}: {e}")
        return
    sandboxes = []  # (ID, its userdata dir)
    read = []
    of_crio = 0  # CRI-O's containers, sandboxes or not
    for storage_dir in storage_dirs:
        for file_name in STORAGE_FILES:
            node_path = f"{storage_dir}/{file_name}"
            try:
                data = _read_file(root, node_path, MAX_STORAGE_FILE_BYTES)
                ids, containers = _crio_sandbox_ids(data or b"")
            except _Unreadable as e:
                found.unreadable.append(f"cri-o: {host_path(root, node_path)}: {e}")
                return
            if data is not None:
                read.append(node_path[len(located.node_path) :].lstrip("/"))
            of_crio += containers
            for sandbox_id in ids:
                if "/" in sandbox_id or sandbox_id in ("", ".", ".."):
                    found.unreadable.append(
                        f"cri-o: {host_path(root, node_path)}: a container ID that is no file name"
                    )
                    return
                sandboxes.append((sandbox_id, f"{storage_dir}/{sandbox_id}/userdata"))
    if not read:
        found.sources.append(f"cri-o: {where}: no containers.json: no sandbox records")
        return
    if not of_crio:
        # The graph root podman and buildah share by default: what they keep there is no pod's.
        found.sources.append(
            f"cri-o: {where}: {', '.join(read)}: no container with CRI-O's pod metadata: "
            "not CRI-O's records"
        )
        return
    found.records_found = True
    if not sandboxes:
        found.sources.append(f"cri-o: {where}: {', '.join(read)}: 0 sandboxes")
        return
    records = [(i, *_crio_sandbox_fate(root, userdata, start())) for i, userdata in sandboxes]
    for sandbox_id, fate, note in records:
        found.add(sandbox_id, fate, note)
    by_fate = {fate: sum(1 for _, f, _ in records if f is fate) for fate in Fate}
    fates = ", ".join(f"{n} {fate.value}" for fate, n in by_fate.items() if n)
    found.sources.append(
        f"cri-o: {where}: {', '.join(read)}: {_sandboxes(len(records))} ({fates}); {start().why}"
    )


def load(root: str, configs: RuntimeConfigs) -> SandboxInventory:
    """The sandboxes the runtimes of the node at root will still know after this boot."""
    root = os.path.abspath(root)
    found = _Found()
    found.unreadable.extend(configs.records_in_doubt)
    for located in _in_effect(configs, CONTAINERD_RUNTIMES):
        _containerd(root, located, found)
    # What CRI-O's next start does is worked out only for a node that has CRI-O sandboxes.
    start = functools.cache(functools.partial(_crio_start, root))
    for located in _in_effect(configs, (Runtime.CRIO,)):
        _crio(root, located, start, found)
    return found.inventory()
