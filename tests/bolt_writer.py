"""Real bbolt databases for the tests: tests/bolt_writer/main.go, built once with Debian's
golang-go and golang-github-coreos-bbolt-dev (bbolt 1.3.6) offline in GOPATH mode (no module, no
proxy, no download), and kept under .test-cache/ by the hash of its source, Go's version and
bbolt's source."""

from __future__ import annotations

import base64
import contextlib
import functools
import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from tests.private_node import cannot_run
from tests.real_libcni import SYSTEM_GOPATH, offline_build_env

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "tests/bolt_writer/main.go"
CACHE = REPO / ".test-cache"
BBOLT_SOURCE = SYSTEM_GOPATH / "src/go.etcd.io/bbolt"

Operation = dict[str, Any]


def _b64(data: bytes | str) -> str:
    return base64.b64encode(data.encode() if isinstance(data, str) else data).decode()


def _path(path: Sequence[bytes | str]) -> list[str]:
    return [_b64(name) for name in path]


def bucket(*path: bytes | str) -> Operation:
    return {"op": "bucket", "path": _path(path)}


def put(path: Sequence[bytes | str], key: bytes | str, value: bytes | str) -> Operation:
    return {"op": "put", "path": _path(path), "key": _b64(key), "value": _b64(value)}


def delete(path: Sequence[bytes | str], key: bytes | str) -> Operation:
    return {"op": "delete", "path": _path(path), "key": _b64(key)}


def delete_bucket(path: Sequence[bytes | str], key: bytes | str) -> Operation:
    return {"op": "delete_bucket", "path": _path(path), "key": _b64(key)}


def build_key(go_version: str) -> str:
    """What the writer is made of: its source, the Go toolchain, bbolt's source."""
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(b"\0" + go_version.encode() + b"\0")
    for path in sorted(BBOLT_SOURCE.glob("*.go")):
        if not path.name.endswith("_test.go"):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:24]


@functools.cache
def writer() -> Path:
    """The built writer; the test cannot run (skip, or fail in CI) without the Go toolchain."""
    go = shutil.which("go")
    if go is None or not (BBOLT_SOURCE / "db.go").is_file():
        cannot_run(
            "needs Debian's golang-go and golang-github-coreos-bbolt-dev to write real bbolt files"
        )
    version = subprocess.run([go, "version"], capture_output=True, text=True, check=True)
    built = CACHE / f"bolt-writer-{build_key(version.stdout.strip())}"
    if built.is_file():
        return built
    CACHE.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bolt-writer-build-") as tmp:
        work = Path(tmp)
        argv = [go, "build", "-trimpath", "-buildvcs=false", "-o", str(work / "bolt_writer")]
        proc = subprocess.run(
            [*argv, str(SOURCE)],
            cwd=SOURCE.parent,
            env=offline_build_env(work / "gopath", work / "gocache"),
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"building {SOURCE} failed:\n{proc.stdout}{proc.stderr}")
        # The temp dir may be on another file system: copied beside the target, then renamed.
        partial = CACHE / f".bolt-writer.{os.getpid()}.partial"
        shutil.copy2(work / "bolt_writer", partial)
        os.replace(partial, built)
    return built


def _program(
    transactions: Iterable[Iterable[Operation]],
    churn: Iterable[Iterable[Operation]],
    page_size: int,
    no_freelist_sync: bool,
) -> bytes:
    program = {
        "page_size": page_size,
        "no_freelist_sync": no_freelist_sync,
        "transactions": [list(ops) for ops in transactions],
        "churn": [list(ops) for ops in churn],
    }
    return json.dumps(program).encode()


def start_writing(
    path: Path,
    transactions: Iterable[Iterable[Operation]],
    churn: Iterable[Iterable[Operation]] = (),
    *,
    page_size: int = 0,
    no_freelist_sync: bool = False,
) -> subprocess.Popen[bytes]:
    """The writer started on path with its program written (its standard input still open)."""
    proc = subprocess.Popen(
        [str(writer()), str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None
    proc.stdin.write(_program(transactions, churn, page_size, no_freelist_sync))
    proc.stdin.flush()
    return proc


def finish(proc: subprocess.Popen[bytes]) -> str:
    """The writer's standard input ended and its exit waited for; what it said on stderr."""
    _, err = proc.communicate(timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"bolt_writer exited {proc.returncode}: {err.decode(errors='replace')}")
    return err.decode(errors="replace")


def write_db(
    path: Path,
    transactions: Iterable[Iterable[Operation]],
    *,
    page_size: int = 0,
    no_freelist_sync: bool = False,
) -> Path:
    """Commit the transactions in order to a bbolt file at path (made when missing)."""
    finish(
        start_writing(path, transactions, page_size=page_size, no_freelist_sync=no_freelist_sync)
    )
    return path


@contextlib.contextmanager
def committing(
    path: Path,
    transactions: Iterable[Iterable[Operation]],
    churn: Iterable[Iterable[Operation]],
) -> Iterator[list[int]]:
    """A running containerd's database: the transactions committed, then the file held open
    (and locked) by bbolt and the churn's transactions committed in turn, over and over, until
    the block ends. Yields a list that then holds how many churn commits there were."""
    proc = start_writing(path, transactions, churn, no_freelist_sync=True)
    assert proc.stdout is not None
    commits: list[int] = []
    try:
        if proc.stdout.readline() != b"committed\n":
            raise RuntimeError("bolt_writer did not commit the transactions")
        yield commits
    finally:
        said = finish(proc)
    commits.append(int(said.split()[-3]))


def containerd_sandbox(
    namespace: str,
    container_id: str,
    kind: str = "sandbox",
    *,
    metadata: dict[str, Any] | None = None,
    extension: bytes | None = None,
    with_extension: bool = True,
    spec_bytes: int = 2000,
) -> list[Operation]:
    """A container record laid out as containerd's metadata/containers.go writes it, with the
    CRI's kind label and (for a sandbox, unless with_extension is False) its metadata
    extension: the given bytes, or an Any of metadata's JSON."""
    base = ["v1", namespace, "containers", container_id]
    ops = [
        put(base, "createdat", b"\x01" * 15),
        put(base, "image", "registry.k8s.io/pause:3.9"),
        put(base, "snapshotter", "overlayfs"),
        put(base, "snapshotKey", container_id),
        put(base, "spec", b"s" * spec_bytes),
        put([*base, "runtime"], "name", "io.containerd.runc.v2"),
        put([*base, "labels"], "io.cri-containerd.kind", kind),
        put([*base, "labels"], "io.kubernetes.pod.name", f"pod-{container_id[:8]}"),
    ]
    if kind == "sandbox" and with_extension:
        if extension is None:
            extension = protobuf_any(
                "github.com/containerd/cri/pkg/store/sandbox/Metadata",
                json.dumps(metadata or sandbox_metadata(container_id)).encode(),
            )
        ops.append(put([*base, "extensions"], "io.cri-containerd.sandbox.metadata", extension))
    return ops


def sandbox_metadata(
    sandbox_id: str, *, netns: str = "/var/run/netns/cni-1", cni_result: bool = True
) -> dict[str, Any]:
    """The CRI's versioned sandbox metadata (pkg/cri/store/sandbox/metadata.go) as JSON."""
    result = {"Interfaces": {"eth0": {"IPConfigs": [{"IP": "10.88.0.5"}]}}} if cni_result else None
    return {
        "Version": "v1",
        "Metadata": {"ID": sandbox_id, "Name": "pod", "NetNSPath": netns, "CNIResult": result},
    }


def protobuf_any(type_url: str, value: bytes) -> bytes:
    """A serialized google.protobuf.Any (type_url = 1, value = 2)."""

    def varint(n: int) -> bytes:
        out = bytearray()
        while True:
            byte = n & 0x7F
            n >>= 7
            out.append(byte | (0x80 if n else 0))
            if not n:
                return bytes(out)

    url = type_url.encode()
    return b"\x0a" + varint(len(url)) + url + b"\x12" + varint(len(value)) + value
