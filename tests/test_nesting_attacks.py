"""Deeply nested, recursion-provoking or out-of-range data in the files the reaper reads from a
node: whatever they hold, a run ends with a documented exit code and a verdict or a warning,
never as an internal error or a hang, and never acts on what it could not read.

CPython 3.9 to 3.11 decode JSON about 990 levels deep (fewer by the caller's frames); what
content.decode() decodes in a fresh thread may still be too deep for anything recursive done to
it afterwards in the caller's thread (repr, str, json.dumps). Scenarios that depend on that
window find its edge here (deepest_decodable) rather than assume a number.
"""

from __future__ import annotations

import contextlib
import json
import re
import resource
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cni_reaper import content
from cni_reaper.errors import ExitCode
from cni_reaper.prev_result import Unconvertible, convert
from cni_reaper.runtime.bbolt import LEAF_PAGE, MAGIC, fnv1a64
from cni_reaper.runtime.inventory import META_DB
from tests.bolt_writer import containerd_sandbox, protobuf_any
from tests.crashed import Crashed, by_path
from tests.nodetree import CONTAINER_IDS
from tests.runtime_layouts import crio_knows, write
from tests.test_forgotten import containerd_knows

CID, OTHER = CONTAINER_IDS[24], CONTAINER_IDS[25]
ENTRY = f"hl-{CID}-eth0"
REPO = Path(__file__).resolve().parent.parent


def nested(depth: int, kind: str = "array") -> str:
    if kind == "array":
        return "[" * depth + "]" * depth
    return '{"a":' * depth + "1" + "}" * depth


def deepest_decodable() -> int:
    """The deepest array content.decode() decodes, called from here (a fresh thread decides
    what the caller's frames cannot)."""
    low, high = 1, 200_000
    while low < high:
        middle = (low + high + 1) // 2
        try:
            content.decode(nested(middle))
        except RecursionError:
            high = middle - 1
        else:
            low = middle
    return low


def with_raw(doc: dict[str, Any], raw: str) -> str:
    """doc as JSON, its value "RAW" replaced by the raw JSON text raw."""
    return json.dumps(doc).replace('"RAW"', raw)


def strict_json(text: str) -> Any:
    """JSON as RFC 8259 (and jq, Go, JavaScript) reads it: no NaN, no Infinity."""

    def refuse(name: str) -> Any:
        raise ValueError(f"{name} is not JSON")

    return json.loads(text, parse_constant=refuse)


def run_main(crashed: Crashed, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    code = crashed.run_main(*extra)
    return code, capsys.readouterr().out


def report_of(out: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(out)
    return doc


# ---------------------------------------------------------------------------------------------
# Results entries (cache.py, content.py)


@pytest.mark.parametrize("depth", [1_000, 3_000, 100_000])
@pytest.mark.parametrize("kind", ["array", "object"])
def test_a_deep_results_entry_gets_a_verdict_and_the_run_ends(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], depth: int, kind: str
) -> None:
    crashed.node.write_result(ENTRY, nested(depth, kind).encode())
    crashed.reboot()

    code, out = run_main(crashed, capsys, "--dry-run")

    assert code != ExitCode.INTERNAL
    entry = by_path(report_of(out))[ENTRY]
    assert entry["content"] in ("unreadable", "garbage", "mismatched"), entry


def test_a_results_entry_whose_kind_nests_at_the_decoders_edge(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    depth = deepest_decodable() - 1  # the object around it is one level more
    data = ('{"kind":' + nested(depth) + "}").encode()
    path = crashed.node.write_result(ENTRY, data)
    crashed.reboot()

    code, out = run_main(crashed, capsys)

    assert code != ExitCode.INTERNAL
    entry = by_path(report_of(out))[ENTRY]
    assert entry["content"] in ("mismatched", "unreadable")
    assert entry["action"] == "report"
    assert path.read_bytes() == data


def test_a_cached_result_whose_address_nests_at_the_decoders_edge_is_unconvertible() -> None:
    depth = deepest_decodable() - 3  # result, ips list, ip object
    text = '{"cniVersion":"1.0.0","ips":[{"address":' + nested(depth) + "}]}"
    result = content.decode(text)  # as cache.read_cached decodes the entry's result

    with contextlib.suppress(Unconvertible):
        convert(result, "0.4.0")


# ---------------------------------------------------------------------------------------------
# CNI configs (netconf.py), Multus scratch files (multus.py)


@pytest.mark.parametrize("depth", [1_000, 3_000, 100_000])
def test_a_deep_conflist_is_a_config_problem_not_a_crash(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], depth: int
) -> None:
    conf = json.dumps(
        {"cniVersion": "1.0.0", "name": "deep", "plugins": [{"type": "host-local", "x": "X"}]}
    ).replace('"X"', nested(depth))
    crashed.node.write_conf("05-deep.conflist", conf.encode())
    crashed.node.write_result(f"deep-{CID}-eth0", b"")
    crashed.reboot()

    code, out = run_main(crashed, capsys, "--dry-run")

    assert code != ExitCode.INTERNAL
    report_of(out)


def test_a_deep_multus_scratch_file_is_judged_not_crashed_on(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    scratch = crashed.node.root / "var/lib/cni/multus"
    scratch.mkdir(parents=True, mode=0o700)
    (scratch / CID).write_bytes(nested(100_000).encode())
    (scratch / CID).chmod(0o600)
    crashed.reboot()

    code, out = run_main(crashed, capsys, "--dry-run")

    assert code != ExitCode.INTERNAL
    assert report_of(out)["multus_scratch"], out


# ---------------------------------------------------------------------------------------------
# Runtime configs (runtime/config.py, plain_toml.py, plain_yaml.py)


CONTAINERD_CONFIG, K3S_CONFIG = "/etc/containerd/config.toml", "/etc/rancher/k3s/config.yaml"


@pytest.mark.parametrize(
    ("path", "text"),
    [
        (CONTAINERD_CONFIG, "a = " + "[" * 100_000 + "]" * 100_000 + "\n"),
        (CONTAINERD_CONFIG, "a = " + "{b = " * 100_000 + "1" + "}" * 100_000 + "\n"),
        (CONTAINERD_CONFIG, "a = " + "[" * 300 + "]" * 300 + "\n"),
        (CONTAINERD_CONFIG, "[" + ".".join(["t"] * 60) + "]\n"),
        (K3S_CONFIG, "a: " + "[" * 100_000 + "]" * 100_000 + "\n"),
        (K3S_CONFIG, "a: " + "{b: " * 100_000 + "1" + "}" * 100_000 + "\n"),
        (K3S_CONFIG, "a:\n" + "".join(" " * i + "b:\n" for i in range(1, 3000))),
        (K3S_CONFIG, "data-dir: " + "[" * 100_000 + "\n"),
    ],
    ids=[
        "toml-arrays-100000",
        "toml-inline-tables-100000",
        "toml-arrays-300",
        "toml-header-60-parts",
        "yaml-flow-sequences",
        "yaml-flow-mappings",
        "yaml-block-3000",
        "yaml-data-dir-unclosed",
    ],
)
def test_a_deep_runtime_config_ends_the_run_with_a_report(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], path: str, text: str
) -> None:
    write(crashed.node.root, path, text)
    crashed.reboot()

    code, out = run_main(crashed, capsys, "--dry-run")

    assert code != ExitCode.INTERNAL
    report_of(out)


def test_a_containerd_config_with_a_huge_integer_is_a_warning(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    write(crashed.node.root, CONTAINERD_CONFIG, "version = " + "1" * 5000 + "\n")
    crashed.reboot()

    code, out = run_main(crashed, capsys, "--dry-run")

    assert code != ExitCode.INTERNAL
    assert any("config.toml" in w for w in report_of(out)["warnings"])


def unit_stack_limit() -> int:
    """The shipped unit's LimitSTACK=, in bytes."""
    unit = (REPO / "systemd/cni-reaper.service").read_text()
    found = re.search(r"^LimitSTACK=(\d+)M$", unit, re.MULTILINE)
    assert found, "the unit sets no LimitSTACK= (in MiB)"
    return int(found.group(1)) << 20


def limited_run(
    crashed: Crashed, timeout: float, *extra: str, stack: int | None = None
) -> subprocess.CompletedProcess[str]:
    """The reaper as the unit runs it, in a process of its own with 2 GiB of address space:
    MemoryError there, not the machine's OOM killer; with stack, that stack limit. Timeout-
    Expired is the hang guard."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
        if stack is not None:
            resource.setrlimit(resource.RLIMIT_STACK, (stack, stack))

    return subprocess.run(
        [sys.executable, "-m", "cni_reaper", *crashed.argv("--json", *extra)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        preexec_fn=limit,
        check=False,
    )


@pytest.mark.parametrize("depth", [3_000, 9_990])
def test_an_entry_nested_to_gos_limit_gets_a_verdict_on_the_units_stack(
    crashed: Crashed, depth: int
) -> None:
    """CPython 3.12 and later decode some 10,000 levels on about 2 MiB of C stack, unchecked:
    on a 1 MiB stack a whole entry 9,990 deep killed the reaper (SIGSEGV) before any
    RecursionError could make it unreadable. On the stack the unit gives it, it gets a verdict
    (valid where this Python decodes it, unreadable where not), and the run its report."""
    entry = {"kind": "cniCacheV1", "networkName": "hl", "containerId": CID, "ifName": "eth0"}
    data = with_raw({**entry, "result": {"x": "RAW"}}, nested(depth)).encode()
    crashed.node.write_result(ENTRY, data)
    crashed.reboot_now()

    run = limited_run(crashed, 600, "--dry-run", stack=unit_stack_limit())

    assert run.returncode >= 0, f"killed by signal {-run.returncode}"
    assert by_path(report_of(run.stdout))[ENTRY]["content"] in ("valid", "unreadable")


def test_a_table_header_of_a_hundred_thousand_parts_is_read_in_linear_memory(
    crashed: Crashed,
) -> None:
    """Valid TOML, a table 100,000 deep: plain_toml kept every prefix of a header's path, n * n
    / 2 slots (a 200 KB config.toml was MemoryError, or the OOM killer on a node)."""
    write(crashed.node.root, CONTAINERD_CONFIG, "[" + ".".join(["a"] * 100_000) + "]\n")
    crashed.reboot_now()

    run = limited_run(crashed, 600, "--dry-run")

    assert run.returncode == ExitCode.OK, run.stderr[-2000:]
    assert not any("config.toml" in w for w in report_of(run.stdout)["warnings"])


# ---------------------------------------------------------------------------------------------
# The runtimes' records (runtime/inventory.py, bbolt.py)


@pytest.mark.parametrize("depth", [1_000, 3_000, 100_000])
def test_containerd_metadata_nested_deep_keeps_the_sandbox_undecided(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], depth: int
) -> None:
    crashed.add(CID)
    held = crashed.ips()
    metadata = with_raw({"Version": "v1", "Metadata": {"ID": CID, "x": "RAW"}}, nested(depth))
    extension = protobuf_any(
        "github.com/containerd/cri/pkg/store/sandbox/Metadata", metadata.encode()
    )
    containerd_knows(crashed, containerd_sandbox("k8s.io", CID, extension=extension))
    crashed.reboot()

    code, out = run_main(crashed, capsys)

    assert code != ExitCode.INTERNAL
    assert by_path(report_of(out))[ENTRY]["action"] == "keep"
    assert crashed.ips() == held


def crio_node(crashed: Crashed) -> str:
    """CRI-O's config and its record of CID's sandbox; its storage dir."""
    crashed.add(CID)
    write(crashed.node.root, "/etc/crio/crio.conf", "[crio]\n")
    crio_knows(crashed.node.root, "/var/lib/containers/storage", CID)
    return "/var/lib/containers/storage/overlay-containers"


@pytest.mark.parametrize("depth", [1_000, 100_000])
def test_a_deep_crio_containers_json_keeps_every_entry(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], depth: int
) -> None:
    storage = crio_node(crashed)
    held = crashed.ips()
    write(crashed.node.root, f"{storage}/containers.json", nested(depth))
    crashed.reboot()

    code, out = run_main(crashed, capsys)

    assert code != ExitCode.INTERNAL
    assert by_path(report_of(out))[ENTRY]["action"] == "keep"
    assert crashed.ips() == held


def test_a_crio_sandbox_config_nested_within_gos_limit_is_not_called_dropped(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = crio_node(crashed)
    held = crashed.ips()
    write(
        crashed.node.root,
        f"{storage}/{CID}/userdata/config.json",
        '{"ociVersion":"1.0.2","x":' + nested(2_000) + "}",
    )
    crashed.reboot()

    code, out = run_main(crashed, capsys)

    assert code != ExitCode.INTERNAL
    assert by_path(report_of(out))[ENTRY]["action"] in ("keep", "leave", "report")
    assert (crashed.node.results / ENTRY).exists()
    assert crashed.ips() == held


def test_a_crio_sandbox_whose_metadata_nests_within_gos_limit_is_not_forgotten(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = crio_node(crashed)
    crio_knows(crashed.node.root, "/var/lib/containers/storage", OTHER)
    held = crashed.ips()
    pod = {"pod": True, "pod-name": "web", "pod-id": CID, "x": "RAW"}
    deep = with_raw(pod, nested(2_000))
    other = json.dumps({"pod": True, "pod-name": "db", "pod-id": OTHER})
    containers = [{"id": CID, "metadata": deep}, {"id": OTHER, "metadata": other}]
    write(crashed.node.root, f"{storage}/containers.json", json.dumps(containers))
    crashed.reboot()

    code, out = run_main(crashed, capsys)

    assert code != ExitCode.INTERNAL
    assert by_path(report_of(out))[ENTRY]["action"] in ("keep", "leave", "report")
    assert (crashed.node.results / ENTRY).exists()
    assert crashed.ips() == held


def _inline_bucket(key: bytes, value: bytes, count: int) -> bytes:
    """A bucket value holding an inline leaf page of count elements, all nested buckets with
    the same key and value: one copy of them, which each element points at (pos counts from
    the element)."""
    elements = b"".join(
        struct.pack("<IIII", 0x01, 16 * (count - index), len(key), len(value))
        for index in range(count)
    )
    page = struct.pack("<QHHI", 0, LEAF_PAGE, count, 0) + elements + key + value
    return struct.pack("<QQ", 0, 0) + page


def fan_out_meta_db(fan_out: int, page_size: int = 4096) -> bytes:
    """A bbolt file of a few MiB: v1 holds `fan_out` namespaces and each `fan_out` containers,
    all the same few bytes (inline buckets sharing their value): fan_out^2 records."""
    container = _inline_bucket(b"labels", _inline_bucket(b"", b"", 0), 1)
    containers = _inline_bucket(b"c" * 64, container, fan_out)
    namespace = _inline_bucket(b"containers", containers, 1)
    v1 = _inline_bucket(b"k8s.io", namespace, fan_out)
    body = struct.pack("<IIII", 0x01, 16, 2, len(v1)) + b"v1" + v1
    overflow = (16 + len(body) + page_size - 1) // page_size - 1
    high_water = 3 + overflow

    def meta(page_id: int, txid: int) -> bytes:
        fields = struct.pack(
            "<IIIIQQQQQ", MAGIC, 2, page_size, 0, 2, 0, 2**64 - 1, high_water, txid
        )
        page = struct.pack("<QHHI", page_id, 0x04, 0, 0) + fields
        return (page + struct.pack("<Q", fnv1a64(fields))).ljust(page_size, b"\0")

    leaf = struct.pack("<QHHI", 2, LEAF_PAGE, 1, overflow) + body
    return meta(0, 4) + meta(1, 5) + leaf.ljust((1 + overflow) * page_size, b"\0")


def test_a_meta_db_of_shared_inline_buckets_ends_in_seconds(crashed: Crashed) -> None:
    crashed.add(CID)
    path = crashed.node.root / "var/lib/containerd" / META_DB
    path.parent.mkdir(parents=True)
    path.write_bytes(fan_out_meta_db(65_535))
    assert path.stat().st_size < 4 << 20
    crashed.reboot_now()

    try:
        run = limited_run(crashed, 60, "--dry-run")  # a good run takes under a second
    except subprocess.TimeoutExpired:
        pytest.fail("the run did not end within 60 s on a 2 MiB meta.db")
    assert run.returncode != ExitCode.INTERNAL, run.stderr[-2000:]
    assert by_path(report_of(run.stdout))[ENTRY]["action"] == "keep"


# ---------------------------------------------------------------------------------------------
# Boot evidence: the reaper's own markers (evidence/shutdown_marker.py, pre_runtime.py)

MARKERS = (
    "var/lib/cni-reaper/clean-shutdown",
    "var/lib/cni-reaper/last-run",
    "run/cni-reaper/shutdown-evidence.json",
)


@pytest.mark.parametrize("marker", MARKERS)
def test_a_deep_marker_reads_as_none(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], marker: str
) -> None:
    crashed.node.write_result(ENTRY, b"")
    crashed.reboot()
    write(crashed.node.root, marker, nested(2_000))  # markers are read up to 4 KiB

    code, out = run_main(crashed, capsys, "--dry-run")

    assert code != ExitCode.INTERNAL
    report_of(out)


def marker_doc(marker: str, time_text: str) -> str:
    if marker.startswith("run/"):
        this_boot = "11111111-2222-3333-4444-555555555555"  # a reading kept in this boot
        doc = {"state": "clean", "boot_id": this_boot, "time": "RAW", "read_in": this_boot}
        return with_raw(doc, time_text)
    return with_raw({"boot_id": "00000000-0000-0000-0000-000000000000", "time": "RAW"}, time_text)


@pytest.mark.parametrize("marker", MARKERS)
def test_a_marker_time_past_a_float_is_none(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], marker: str
) -> None:
    crashed.node.write_result(ENTRY, b"")
    crashed.reboot()
    write(crashed.node.root, marker, marker_doc(marker, "1" + "0" * 400))

    code, out = run_main(crashed, capsys, "--dry-run")

    assert code != ExitCode.INTERNAL
    report_of(out)


@pytest.mark.parametrize("constant", ["NaN", "Infinity", "-Infinity"])
def test_a_marker_time_that_is_no_number_keeps_the_report_json(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], constant: str
) -> None:
    crashed.node.write_result(ENTRY, b"")
    crashed.reboot()
    write(crashed.node.root, MARKERS[0], marker_doc(MARKERS[0], constant))

    code, out = run_main(crashed, capsys, "--dry-run")

    assert code != ExitCode.INTERNAL
    strict_json(out)


@pytest.mark.parametrize("taken_at", [b"nan", b"inf", b"1e300"])
def test_a_pre_runtime_record_taken_at_no_time_is_damaged(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], taken_at: bytes
) -> None:
    crashed.node.write_result(ENTRY, b"")
    crashed.reboot()
    crashed.node.record_before_runtime(crashed.t0 + 30)
    (record,) = (p for p in (crashed.node.root / "run/cni-reaper/pre-runtime").iterdir())
    head, rest = record.read_bytes().split(b"\0", 1)
    fields = head.rsplit(b" ", 4)
    fields[2] = taken_at
    record.write_bytes(b" ".join(fields) + b"\0" + rest)

    code, out = run_main(crashed, capsys, "--dry-run")

    assert code != ExitCode.INTERNAL
    report_of(out)
