"""Fuzz targets for every parser that reads what a node left on disk, driven by hypothesis from
real seeds (a libcni cache entry, a conflist, wtmp records, a bbolt file in containerd's layout)
cut, spliced and flipped. Bounded:
CNI_REAPER_FUZZ_EXAMPLES examples per target (default 300; CI runs the default)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni_reaper import cli
from cni_reaper.cache import split_name
from cni_reaper.content import Content, classify
from cni_reaper.errors import ExitCode
from cni_reaper.escape import printable
from cni_reaper.evidence import wtmp
from cni_reaper.evidence.shutdown_marker import ShutdownEvidence
from cni_reaper.netconf import ConfigError, parse_conf_bytes
from cni_reaper.runtime.bbolt import BoltError, Bucket, Database
from cni_reaper.runtime.inventory import _containerd_sandboxes
from tests.bolt_writer import containerd_sandbox, put, sandbox_metadata, write_db
from tests.nodetree import CONTAINER_IDS, NodeTree, cache_entry_bytes

EXAMPLES = int(os.environ.get("CNI_REAPER_FUZZ_EXAMPLES", "300"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
CONFLIST = json.dumps(
    {
        "cniVersion": "1.0.0",
        "name": "podnet",
        "plugins": [
            {"type": "bridge", "ipam": {"type": "host-local", "subnet": "10.88.0.0/16"}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }
).encode()
ENTRY = cache_entry_bytes(CONFLIST, "podnet", CONTAINER_IDS[0], "eth0")
WTMP = wtmp.encode_all(
    [wtmp.boot_record(1.7e9), wtmp.shutdown_record(1.7e9 + 60), wtmp.boot_record(1.7e9 + 90)]
)
EXIT_CODES = {int(code) for code in ExitCode}


@st.composite
def mutated(draw: st.DrawFn, seed: bytes) -> bytes:
    """seed, damaged the ways disks and crashes damage files, and some ways they do not."""
    data = bytearray(seed)
    for _ in range(draw(st.integers(0, 4))):
        how = draw(st.sampled_from(["cut", "zero", "flip", "splice", "insert"]))
        at = draw(st.integers(0, len(data)))
        if how == "cut":
            del data[at:]
        elif how == "zero":
            end = draw(st.integers(at, len(data)))
            data[at:end] = b"\0" * (end - at)
        elif how == "flip" and data:
            at = min(at, len(data) - 1)
            data[at] ^= 1 << draw(st.integers(0, 7))
        elif how == "splice":
            data[at:at] = seed[draw(st.integers(0, len(seed))) :]
        else:
            data[at:at] = draw(st.sampled_from([b"{", b"}", b'"', b"\\", b"\xff", b"[" * 64]))
    return bytes(data)


def fuzzed(seed: bytes) -> st.SearchStrategy[bytes]:
    return st.one_of(mutated(seed), st.binary(max_size=2048))


@FUZZ
@given(fuzzed(ENTRY))
def test_classify(data: bytes) -> None:
    verdict = classify(data)
    assert verdict.content in set(Content)
    if verdict.content is Content.VALID:
        # Go's decoder, like this one, reads invalid UTF-8 as U+FFFD.
        assert json.loads(data.decode("utf-8", "replace"))["kind"] == "cniCacheV1"


@FUZZ
@given(fuzzed(CONFLIST))
def test_parse_conf(data: bytes) -> None:
    try:
        netlist = parse_conf_bytes(data, "fuzz.conflist", single_plugin=False)
    except ConfigError:
        return
    assert netlist.name and all(isinstance(t, str) and t for t in netlist.plugin_types)


@FUZZ
@given(fuzzed(WTMP))
def test_wtmp_parse(data: bytes) -> None:
    for record in wtmp.parse(data):
        assert 0 <= record.ut_type <= 9


@FUZZ
@given(st.text(max_size=300), st.sets(st.text(min_size=1, max_size=30), max_size=4))
def test_split_name_and_printable(name: str, networks: set[str]) -> None:
    split, problem = split_name(name, networks)
    assert (split is None) != (problem is None)
    if split is not None:
        assert f"{split.network}-{split.container_id}-{split.ifname}" == name
    shown = printable(name)
    assert shown.isprintable()


@FUZZ
@given(st.recursive(st.none() | st.booleans() | st.floats() | st.text(), st.lists, max_leaves=8))
def test_shutdown_evidence_from_any_json(doc: object) -> None:
    ShutdownEvidence.from_json(doc)
    ShutdownEvidence.from_json({"state": "clean", "boot_id": doc, "time": doc, "detail": doc})


@FUZZ
@given(
    st.lists(
        st.tuples(
            st.sampled_from([f"podnet-{CONTAINER_IDS[i]}-eth0" for i in range(4)] + ["x", "a-b-c"]),
            fuzzed(ENTRY),
        ),
        max_size=5,
    ),
    fuzzed(CONFLIST),
)
def test_a_dry_run_over_any_tree(files: list[tuple[str, bytes]], conflist: bytes) -> None:
    """The whole pipeline never raises and always ends with a documented exit code."""
    with tempfile.TemporaryDirectory() as tmp:
        node = NodeTree(Path(tmp) / "node")
        node.write_conf("10-podnet.conflist", conflist)
        for name, data in files:
            node.write_result(name, data)
        node.boot(1.7e9)
        node.write_boot_world(btime=2e9)
        code = cli.main(
            ["--root", str(node.root), "--dry-run", "--json"],
            clock=lambda: 2e9 + 60,
            environ={},
        )
    assert code in EXIT_CODES - {ExitCode.INTERNAL}


@pytest.fixture(scope="module")
def containerd_db(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """A small real meta.db: containerd's layout on 1 KiB pages (so that most bytes are in
    pages in use), sandboxes and containers, overflow specs, a sandbox store, a second commit."""
    records = []
    for i, sandbox_id in enumerate(CONTAINER_IDS[:4]):
        kind = "sandbox" if i % 2 == 0 else "container"
        metadata = sandbox_metadata(sandbox_id, cni_result=i != 2)
        records += containerd_sandbox("k8s.io", sandbox_id, kind, metadata=metadata)
    store = ["v1", "k8s.io", "sandboxes", CONTAINER_IDS[5], "extensions"]
    later = [put(store, "metadata", b"\x0a\x01x\x12\x02{}"), put(["v1", "moby"], "k", "v")]
    path = tmp_path_factory.mktemp("bbolt-seed") / "meta.db"
    return write_db(path, [records, later], page_size=1024, no_freelist_sync=True).read_bytes()


@st.composite
def pages_damaged(draw: st.DrawFn, seed: bytes, page_size: int = 1024) -> bytes:
    """seed with whole pages overwritten by other pages or by noise: structure, not bytes."""
    data = bytearray(seed)
    pages = len(data) // page_size
    for _ in range(draw(st.integers(1, 3))):
        target = draw(st.integers(0, pages - 1)) * page_size
        if draw(st.booleans()):
            source = draw(st.integers(0, pages - 1)) * page_size
            data[target : target + page_size] = seed[source : source + page_size]
        else:
            noise = draw(st.binary(min_size=1, max_size=64))
            at = target + draw(st.integers(0, page_size - len(noise)))
            data[at : at + len(noise)] = noise
    return bytes(data)


def walk(bucket: Bucket) -> int:
    """Every key of bucket and its nested buckets, read both ways (a damaged tree may order
    its keys so that a lookup misses one the walk finds); how many."""
    count = 0
    for key, value in bucket.items():
        count += 1
        bucket.get(key)
        if isinstance(value, Bucket):
            count += walk(value)
    return count


@FUZZ
@given(data=st.data())
def test_bbolt_reader(containerd_db: bytes, data: st.DataObject) -> None:
    """A damaged, cut or random meta.db ends in a BoltError or a walk, and quickly: the
    reader's bounds hold whatever the pages say."""
    damaged = data.draw(
        st.one_of(mutated(containerd_db), pages_damaged(containerd_db), st.binary(max_size=8192))
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "meta.db"
        path.write_bytes(damaged)
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        started = time.monotonic()
        try:
            db = Database(fd, str(path))
            walk(db.root())
            for _ in _containerd_sandboxes(db, "containerd"):
                pass
        except BoltError:
            pass
        finally:
            os.close(fd)
        assert time.monotonic() - started < 10
