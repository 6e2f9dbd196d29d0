"""Review of the fixed-depth JSON change (content.at_fixed_depth and its callers, the CRI-O
verdicts, bbolt's inline-bucket rules and element budget, evidence.time_read): what an attacker
or an unlucky operator could make of it. The review found five defects (two DEL workers'
fresh threads and the process's stack size, no thread to be had, the encoder deeper than the
decoder, a bare number called unreadable, twice); their tests were strict xfails until mended."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni_reaper import content, pre_runtime, strays
from cni_reaper.boot import FirstReading
from cni_reaper.errors import ExitCode
from cni_reaper.evidence import shutdown_marker
from cni_reaper.netconf import parse_conf_bytes
from cni_reaper.paths import NodePaths
from cni_reaper.repair import replay
from cni_reaper.runtime.bbolt import Bucket, Database
from tests.bolt_writer import Operation, bucket, containerd_sandbox, put, write_db
from tests.crashed import Crashed, by_path
from tests.meta_db_running import META_DB, inventory_of
from tests.nodetree import CONTAINER_IDS
from tests.test_inventory import IDS, crio_node, userdata

CID = CONTAINER_IDS[26]
ENTRY = f"hl-{CID}-eth0"
FRESH = 16 << 20  # content._FRESH_STACK_BYTES
REVIEW = settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def deep_object(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def cache_entry(result_tail: str) -> bytes:
    """A whole cniCacheV1 entry whose result's dns holds the raw JSON text result_tail."""
    doc = {
        "kind": "cniCacheV1",
        "containerId": CID,
        "networkName": "hl",
        "ifName": "eth0",
        "result": {"cniVersion": "1.0.0", "dns": {"options": "RAW"}},
    }
    return json.dumps(doc).replace('"RAW"', result_tail).encode()


def deepest(decodes: Callable[[int], bool]) -> int:
    low, high = 1, 20_000
    while low < high:
        middle = (low + high + 1) // 2
        if decodes(middle):
            low = middle
        else:
            high = middle - 1
    return low


def frames_here() -> int:
    frame: Any = sys._getframe()
    n = 0
    while frame is not None:
        n, frame = n + 1, frame.f_back
    return n


def at_depth(extra: int, through_c: bool, code: Callable[[], Any]) -> Any:
    """code() called with extra frames more under it; through_c: each frame also a C call (on
    3.12 on, what counts against the C recursion limit is only what goes through C)."""
    if extra <= 0:
        return code()
    if through_c:
        return next(map(lambda _: at_depth(extra - 1, through_c, code), [0]))
    return at_depth(extra - 1, through_c, code)


def in_thread(code: Callable[[], Any]) -> Any:
    """code() in a plain thread, as a DEL worker calls it."""
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(code()))
    thread.start()
    thread.join(120)
    assert not thread.is_alive(), "hang guard"
    return out[0]


def judged(data: bytes) -> content.Content:
    found = content.judge(data)  # as cache.py's inventory judges a results entry
    return content.Content.VALID if isinstance(found, content.Identity) else found.content


# ---------------------------------------------------------------------------------------------
# The fresh thread and the process-wide stack size


@pytest.fixture
def stack_size_restored() -> Iterator[None]:
    before = threading.stack_size()
    yield
    threading.stack_size(before)


def test_two_workers_at_fixed_depth_at_once_leave_stack_size_and_stacks_as_meant(
    monkeypatch: pytest.MonkeyPatch, stack_size_restored: None
) -> None:
    """Two DEL workers each decode something too deep for their own thread at the same time
    (parallel.py runs several networks' DELs at once). The setting is the process's: each
    fresh thread must start on 16 MiB, and the setting be as it was after. The window between
    the set and the restore is widened, so that unserialised workers cross in it (the second
    started its thread on the default stack, and left 16 MiB for every later thread)."""
    real = threading.stack_size
    original = real()
    started_with: list[int] = []
    real_start = threading.Thread.start

    def stack_size(size: int | None = None) -> int:
        if size is None:
            return real()
        previous = real(size)
        if size == FRESH:
            time.sleep(0.2)
        return previous

    def start(self: threading.Thread) -> None:
        if self.name == "cni-reaper-json":
            started_with.append(real())
        real_start(self)

    monkeypatch.setattr(threading, "stack_size", stack_size)
    monkeypatch.setattr(threading.Thread, "start", start)
    together = threading.Barrier(2)

    def worker() -> None:
        together.wait(60)
        with pytest.raises(RecursionError):
            content.decode(nested(100_000))

    workers = [threading.Thread(target=worker) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
        assert not w.is_alive(), "hang guard"
    monkeypatch.undo()
    assert started_with == [FRESH, FRESH], "a fresh thread started on the default stack"
    assert threading.stack_size() == original, "threads started later get 16 MiB stacks"


def test_an_interrupt_during_the_join_reaches_the_caller_and_leaves_nothing(
    stack_size_restored: None,
) -> None:
    """Ctrl-C while the main thread waits on the fresh thread: the interrupt is raised, the
    stack size is as it was, and the daemon thread ends on its own."""
    before = threading.stack_size()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    called_in: list[str] = []

    def code(text: str) -> Any:
        called_in.append(threading.current_thread().name)
        if threading.current_thread() is threading.main_thread():
            raise RecursionError("too deep here")
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)
        return json.loads(text)

    try:
        with pytest.raises(KeyboardInterrupt):
            content.at_fixed_depth(code, "[1]")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert threading.stack_size() == before
    assert called_in == ["MainThread", "cni-reaper-json"]
    deadline = time.monotonic() + 60
    while any(t.name == "cni-reaper-json" for t in threading.enumerate()):
        assert time.monotonic() < deadline, "hang guard: the fresh thread never ended"
        time.sleep(0.01)


@pytest.mark.parametrize("error", [ValueError("bad"), MemoryError(), OSError(5, "EIO")])
def test_what_the_fresh_thread_raises_is_raised_to_the_caller(
    error: BaseException, stack_size_restored: None
) -> None:
    before = threading.stack_size()

    def code(_: str) -> Any:
        if threading.current_thread() is threading.main_thread():
            raise RecursionError("too deep here")
        raise error

    with pytest.raises(type(error)) as raised:
        content.at_fixed_depth(code, "")
    assert raised.value is error
    assert threading.stack_size() == before


def test_a_deep_entry_when_no_thread_can_be_started_is_unreadable_not_a_crash(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    real_start = threading.Thread.start

    def start(self: threading.Thread) -> None:
        if self.name == "cni-reaper-json":
            raise RuntimeError("can't start new thread")
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    data = nested(10_000).encode()  # within Go's 10,000 levels: whole JSON, unreadable here
    path = crashed.node.write_result(ENTRY, data)
    crashed.reboot()

    code = crashed.run_main("--dry-run")
    out = capsys.readouterr().out

    assert code != ExitCode.INTERNAL
    assert by_path(json.loads(out))[ENTRY]["content"] == "unreadable"
    assert path.read_bytes() == data


def test_the_strays_watcher_lists_children_while_fresh_threads_come_and_go(
    stack_size_restored: None,
) -> None:
    """strays._children() reads each thread's children list while DEL workers start and end
    fresh threads: it neither fails nor loses a child."""
    child = subprocess.Popen(["sleep", "60"])
    stop = threading.Event()
    errors: list[BaseException] = []

    def churn() -> None:
        while not stop.is_set():
            try:
                content.decode(nested(100_000))
            except RecursionError:
                pass
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)
                return

    churners = [threading.Thread(target=churn) for _ in range(3)]
    for t in churners:
        t.start()
    try:
        seen = [set(strays._children()) for _ in range(200)]
    finally:
        stop.set()
        for t in churners:
            t.join(120)
        child.kill()
        child.wait()
    assert errors == []
    assert all(child.pid in s for s in seen)


# ---------------------------------------------------------------------------------------------
# One verdict for the same bytes: the inventory (judge) and the check before the move


@REVIEW
@given(
    depth=st.one_of(st.integers(940, 1_010), st.integers(9_960, 10_010), st.integers(1, 3_000)),
    shape=st.sampled_from(["entry-array", "entry-object", "bare-array"]),
    inventory_extra=st.integers(0, 400),
    check_extra=st.integers(0, 400),
    through_c=st.booleans(),
    check_in_thread=st.booleans(),
)
def test_the_check_before_a_move_says_what_the_inventory_said(
    depth: int,
    shape: str,
    inventory_extra: int,
    check_extra: int,
    through_c: bool,
    check_in_thread: bool,
) -> None:
    if shape == "entry-array":
        data = cache_entry(nested(depth))
    elif shape == "entry-object":
        data = cache_entry(deep_object(depth))
    else:
        data = nested(depth).encode()
    room = sys.getrecursionlimit() - frames_here() - 80
    inventory_extra, check_extra = min(inventory_extra, room), min(check_extra, room)

    verdict = at_depth(inventory_extra, through_c, lambda: judged(data))
    vet = content.same_damage(verdict)

    def check() -> str | None:
        said: str | None = at_depth(check_extra, through_c, lambda: vet(data))
        return said

    changed = in_thread(check) if check_in_thread else check()
    assert changed is None, (depth, verdict)


# ---------------------------------------------------------------------------------------------
# A DEL's stdin: what decoded is encoded


def test_a_cached_result_that_decoded_is_encoded_into_the_dels_stdin() -> None:
    def decodes(depth: int) -> bool:
        try:
            content.decode(cache_entry(deep_object(depth)).decode())
        except RecursionError:
            return False
        return True

    depth = deepest(decodes)
    doc = content.decode(cache_entry(deep_object(depth)).decode())
    assert content.classify(cache_entry(deep_object(depth))).content is content.Content.VALID
    netlist = parse_conf_bytes(
        b'{"cniVersion":"1.0.0","name":"hl","plugins":[{"type":"host-local"}]}',
        "test",
        single_plugin=False,
    )
    stdin = replay.plugin_stdin(netlist, netlist.plugins[0], None, doc["result"])
    assert (
        b'"prevResult":{"cniVersion":"1.0.0","dns":{"options":' + deep_object(depth).encode()
        in stdin
    )


# ---------------------------------------------------------------------------------------------
# Whole JSON Python refuses (a huge integer): unreadable, never hiding crash damage


HUGE = "9" * 5_000
WHOLE_WITH_HUGE = cache_entry(HUGE)


@REVIEW
@given(cut=st.integers(0, len(WHOLE_WITH_HUGE) - 1), zero_tail=st.booleans())
def test_a_cut_entry_holding_a_huge_integer_is_crash_damage_never_unreadable(
    cut: int, zero_tail: bool
) -> None:
    data = WHOLE_WITH_HUGE[:cut]
    if zero_tail:
        data = data.ljust(len(WHOLE_WITH_HUGE), b"\0")
    found = content.classify(data).content
    assert found is not content.Content.UNREADABLE
    assert found.is_corrupt


def test_a_zeroed_block_inside_an_entry_holding_a_huge_integer_is_garbage() -> None:
    data = bytearray(WHOLE_WITH_HUGE)
    data[100:4196] = b"\0" * 4096
    assert content.classify(bytes(data)).content is content.Content.GARBAGE


def test_a_results_entry_that_is_a_bare_huge_number_is_garbage() -> None:
    assert content.classify(HUGE.encode()).content is content.Content.GARBAGE


# ---------------------------------------------------------------------------------------------
# CRI-O: what CRI-O cannot load stays DROPPED


@pytest.mark.parametrize(
    ("name", "config"),
    [
        ("missing", None),
        ("empty", b""),
        ("truncated", b'{"ociVersion":"1.0.2","annotations":{"io.kub'),
        ("truncated, then NULs", b'{"ociVersion":"1.0.2","ann'.ljust(4096, b"\0")),
        ("garbage", b"\x89PNG\r\n\x1a\n garbage"),
        ("NUL-filled", b"\0" * 4096),
        ("whole, then NULs", b'{"ociVersion":"1.0.2"}'.ljust(4096, b"\0")),
        ("NaN", b'{"ociVersion":"1.0.2","x":NaN}'),
        ("deeper than Go reads", ('{"x":' + nested(10_001) + "}").encode()),
        ("not an object", b'["ociVersion"]'),
    ],
)
def test_a_crio_sandbox_config_crio_cannot_load_is_dropped(
    tmp_path: Path, name: str, config: bytes | None
) -> None:
    crio_node(tmp_path)
    path = userdata(tmp_path, IDS[0]) / "config.json"
    if config is None:
        path.unlink()
    else:
        path.write_bytes(config)
    found = inventory_of(tmp_path)
    assert found.unreadable == ()
    assert found.knows(IDS[0]) is False, (name, found.describe(IDS[0]))
    assert "config.json is" in found.describe(IDS[0])


def test_a_crio_sandbox_config_that_is_a_bare_huge_number_is_still_dropped(
    tmp_path: Path,
) -> None:
    crio_node(tmp_path)
    (userdata(tmp_path, IDS[0]) / "config.json").write_bytes(HUGE.encode())
    assert inventory_of(tmp_path).knows(IDS[0]) is False


def test_a_crio_sandbox_config_go_would_load_is_never_dropped(tmp_path: Path) -> None:
    crio_node(tmp_path, sandboxes=(IDS[0], IDS[1]))
    (userdata(tmp_path, IDS[0]) / "config.json").write_bytes(
        ('{"ociVersion":"1.0.2","x":' + nested(9_999) + "}").encode()
    )
    (userdata(tmp_path, IDS[1]) / "config.json").write_bytes(
        ('{"ociVersion":"1.0.2","x":' + HUGE + "}").encode()
    )
    found = inventory_of(tmp_path)
    assert found.knows(IDS[0]) is None, found.describe(IDS[0])
    assert found.knows(IDS[1]) is None, found.describe(IDS[1])


# ---------------------------------------------------------------------------------------------
# time_read: what the reaper itself writes, it reads back

TIMES = [0.0, 1e-07, -86_400.5, 1_700_000_000.123456, 1_700_000_000, float(2**37 - 1)]
THIS_BOOT = "11111111-2222-3333-4444-555555555555"
EARLIER_BOOT = "00000000-0000-0000-0000-000000000000"


@pytest.mark.parametrize("now", TIMES)
def test_the_markers_the_reaper_writes_read_back_with_their_time(
    tmp_path: Path, now: float
) -> None:
    paths = NodePaths.build(root=str(tmp_path))
    assert shutdown_marker.mark_clean_shutdown(paths, EARLIER_BOOT, now, lambda: "stopping") is None
    evidence = shutdown_marker.read(paths, THIS_BOOT)
    assert (evidence.state, evidence.time) == (shutdown_marker.ShutdownState.CLEAN, now)
    shutdown_marker.consume(paths, THIS_BOOT, evidence, now)
    kept = shutdown_marker.read(paths, THIS_BOOT)  # the reading kept under /run
    assert (kept.state, kept.time) == (shutdown_marker.ShutdownState.CLEAN, now)
    assert shutdown_marker.read(paths, "22222222-2222-2222-2222-222222222222").time == now


@pytest.mark.parametrize("now", TIMES)
@pytest.mark.parametrize("first", [(None, None), ("now", None), ("now", "now")])
def test_the_pre_runtime_record_the_reaper_writes_reads_back(
    tmp_path: Path, now: float, first: tuple[str | None, str | None]
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    reading = FirstReading(*(now if f else None for f in first))
    proof = pre_runtime.Proof.taken_now(THIS_BOOT, now, reading, str(run_dir))
    pre_runtime.save(proof)
    record, why = pre_runtime.load(str(run_dir), THIS_BOOT)
    assert why is None and record is not None
    assert (record.taken_at, record.first) == (now, reading)


# ---------------------------------------------------------------------------------------------
# bbolt: what the real bbolt writes is read


PAGE_SIZES = [512, 1024, 4096, 16_384, 65_536]


def walk(b: Bucket, lookups: bool = True) -> int:
    """Every element under b, each also looked up by get (lookups): how many."""
    n = 0
    for key, value in b.items():
        n += 1
        assert not lookups or b.get(key) is not None
        if isinstance(value, Bucket):
            n += walk(value, lookups)
    return n


@pytest.mark.parametrize("page_size", PAGE_SIZES)
def test_inline_buckets_at_a_quarter_page_and_just_past_it_are_read(
    tmp_path: Path, page_size: int
) -> None:
    quarter = page_size // 4
    ops: list[Operation] = [bucket("outer")]
    sizes = {"at": quarter, "under": quarter - 1, "past": quarter + 1}
    for name, size in sizes.items():
        key = name.encode()
        # page header + one leaf element + key + value: bbolt's inlineable size
        ops.append(put(["outer", name], key, b"v" * (size - 16 - 16 - len(key))))
    ops += [put(["outer", "many"], f"{i:03}", "") for i in range(quarter // 19 - 1)]
    path = write_db(tmp_path / "q.db", [ops], page_size=page_size)
    fd = os.open(path, os.O_RDONLY)
    try:
        db = Database(fd, "q.db")
        assert db.page_size == page_size
        outer = db.bucket(b"outer")
        assert outer is not None
        inner = dict(outer.items())
        inline = {k: v._inline is not None for k, v in inner.items() if isinstance(v, Bucket)}
        assert inline == {b"at": True, b"under": True, b"past": False, b"many": True}, inline
        assert walk(db.root()) > 0
    finally:
        os.close(fd)


@pytest.mark.parametrize("page_size", [512, 65_536])
def test_a_meta_db_of_many_sandboxes_with_many_labels_is_read_whole(
    tmp_path: Path, page_size: int
) -> None:
    ids = [f"{n:064x}" for n in range(1, 1_201)]
    transactions: list[list[Operation]] = []
    for start in range(0, len(ids), 200):
        ops: list[Operation] = []
        for sandbox_id in ids[start : start + 200]:
            ops += containerd_sandbox("k8s.io", sandbox_id, spec_bytes=300)
            base = ["v1", "k8s.io", "containers", sandbox_id, "labels"]
            ops += [put(base, f"l{j}", "x") for j in range(25)]
        transactions.append(ops)
    path = tmp_path / META_DB
    path.parent.mkdir(parents=True)
    write_db(path, transactions, page_size=page_size, no_freelist_sync=True)
    found = inventory_of(tmp_path)
    assert found.unreadable == ()
    assert found.known == frozenset(ids)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert walk(Database(fd, "meta.db").root(), lookups=False) > len(ids)
    finally:
        os.close(fd)
