"""An attacker's and an unlucky operator's review of four changes (85dc0b5..HEAD):

1. quarantine.Quarantine._finish_copy: a copy across file systems whose original cannot be
   unlinked is taken back out of the quarantine when this run made it (ours=True).
2. failed_move() / READ_ONLY_HINT: EROFS says what the unit leaves writable.
3. DelOutcome.error_texts(): a DEL none of whose plugins ran is said "DEL not run: ...".
4. EntryFate.DEL_FAILED: only the reason of the reservation's quarantine changes.

Each scenario asserts what someone would care about: where a file is, its sidecar, an exit code,
a report line. The review (2026-12-06) found three defects, strict xfails until mended, each
then made a plain test: the copy of an original removed between its check and its unlink was
deleted and the move called failed, where it is a file gone since it was read; the cleanup's
own failure (an immutable copy) replaced the read-only error; and with SIGCHLD ignored, a
plugin that had run was said "DEL not run" (SIGCHLD is now set back to the default where
Python may, and a plugin lost track of once started counts as run). Real runs of the
CLI as root; those that need a mount (a read-only bind mount, a file bind-mounted over an entry)
run in a private mount namespace of their own; the machine's own CNI state is never touched.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from cni_reaper import cli, failpoint
from cni_reaper.errors import ExitCode
from cni_reaper.filestat import FileStat
from cni_reaper.read_only import READ_ONLY_HINT
from cni_reaper.repair import quarantine
from cni_reaper.repair.quarantine import (
    COPY_IN_PLACE,
    FileChanged,
    Move,
    Quarantine,
    failed_move,
)
from tests.nodetree import CONTAINER_IDS, NodeTree, host_local_conflist
from tests.private_node import cannot_run, unshare

REPO = Path(__file__).resolve().parent.parent
SHM = Path("/dev/shm")
NAME = "net-" + "ab" * 32 + "-eth0"
OLD = 1_600_000_000  # an earlier boot wrote the file
DEL_DONE = "exit 0\n"  # a plugin whose DEL succeeds: the move is what fails
ENTRY = f"net-{CONTAINER_IDS[0]}-eth0"
SECOND = f"net-{CONTAINER_IDS[1]}-eth0"
BOOT_ID = "11111111-2222-3333-4444-555555555555"  # NodeTree.write_boot_world's

# Run in a private mount namespace: the mounts the spec names, then the CLI in this process,
# with a failpoint interference if asked for, or SIGCHLD ignored as a parent may leave it.
IN_NAMESPACE = r"""
import json, signal, subprocess, sys
from pathlib import Path
from cni_reaper.node_root import PLUGIN_STATE_DIRS
from tests.private_node import private_tmpfs
# As tests/sealed_run.py: a run killed half way leaves no mount point on the machine.
for target in PLUGIN_STATE_DIRS:
    private_tmpfs(Path(target))
spec = json.loads(sys.argv[1])
for command in spec.get("mounts", []):
    subprocess.run(command, check=True)
if spec.get("ignore_sigchld"):
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
from cni_reaper import cli, failpoint
from cni_reaper.repair import quarantine
at = spec.get("immutable_at")
if at:
    point, path = at
    def make_immutable():
        subprocess.run(["chattr", "+i", path], check=True)
    failpoint.interfere(point, make_immutable)
if spec.get("in_thread"):
    import threading
    codes = []
    worker = threading.Thread(target=lambda: codes.append(cli.main(spec["argv"], environ={})))
    worker.start()
    worker.join()
    sys.exit(codes[0])
sys.exit(cli.main(spec["argv"], environ={}))
"""


class Ran(NamedTuple):
    code: int
    stdout: str
    stderr: str

    def doc(self) -> dict[str, Any]:
        found: dict[str, Any] = json.loads(self.stdout)
        return found


@pytest.fixture(autouse=True)
def _as_root() -> None:
    if os.geteuid() != 0:
        cannot_run("needs root: real runs, chattr, bind mounts in a private mount namespace")


@pytest.fixture
def other_fs(tmp_path: Path) -> Iterator[Path]:
    """A dir on another file system than tmp_path: every move into it is a copy."""
    if not SHM.is_dir() or os.stat(SHM).st_dev == os.stat(tmp_path).st_dev:
        cannot_run("needs /dev/shm on another file system than the test's temp dir")
    with tempfile.TemporaryDirectory(dir=SHM) as other:
        yield Path(other)
        _mutable_again(Path(other))


def _mutable_again(*roots: Path) -> None:
    """chattr -i on everything under roots, so that the temp dirs can be removed."""
    for root in roots:
        for path in [root, *root.rglob("*")]:
            if path.is_file() and not path.is_symlink():
                subprocess.run(["chattr", "-i", str(path)], check=False, capture_output=True)


def chattr(flag: str, path: Path) -> None:
    subprocess.run(["chattr", flag, str(path)], check=True)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run_private(spec: dict[str, Any], env: dict[str, str] | None = None) -> Ran:
    environ = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    for name in ("JOURNAL_STREAM", "NOTIFY_SOCKET", "INVOCATION_ID"):
        environ.pop(name, None)
    done = subprocess.run(
        [*unshare(), sys.executable, "-c", IN_NAMESPACE, json.dumps(spec)],
        capture_output=True,
        text=True,
        env=environ,
        cwd=REPO,
        timeout=120,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return Ran(done.returncode, done.stdout, done.stderr)


def read_only(path: Path) -> list[list[str]]:
    """The mounts that make path a read-only bind mount of itself."""
    return [
        ["mount", "--bind", str(path), str(path)],
        ["mount", "-o", "remount,bind,ro", str(path)],
    ]


def crashed_node(root: Path) -> NodeTree:
    node = NodeTree(root)
    node.write_boot_world(btime=1_700_000_000)
    return node


def files_under(root: Path) -> dict[str, bytes]:
    """Every regular file under root by its path relative to root."""
    if not root.is_dir():
        return {}
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink()
    }


def copies_and_sidecars(qroot: Path) -> tuple[dict[str, bytes], dict[str, dict[str, Any]]]:
    """The quarantined files and their sidecars; no temp file may be among them."""
    found = files_under(qroot)
    assert not [n for n in found if os.path.basename(n).startswith(".")], found
    copies = {n: d for n, d in found.items() if not n.endswith(".json")}
    sidecars = {n: json.loads(d) for n, d in found.items() if n.endswith(".json")}
    return copies, sidecars


def assert_every_copy_has_a_true_sidecar(qroot: Path) -> dict[str, bytes]:
    copies, sidecars = copies_and_sidecars(qroot)
    assert set(sidecars) == {n + ".json" for n in copies}, (copies, sidecars)
    for name, data in copies.items():
        assert sidecars[name + ".json"]["sha256"] == sha(data), name
    return copies


# --- 1. the copy taken back out of the quarantine -------------------------------------------


@pytest.mark.parametrize(
    "step",
    [
        "quarantine.sidecar-written",
        "quarantine.sidecar-in-place",
        "quarantine.copy-written",
        "quarantine.copy-in-place",  # the state a SIGKILL between the failed unlink and the
        # cleanup leaves too: the failed unlink changed nothing on disk
    ],
)
def test_sigkill_in_a_move_from_a_read_only_dir_then_reruns_move_each_file_exactly_once(
    tmp_path: Path, step: str
) -> None:
    """A run killed mid-move while the results dir is read-only, a rerun on the same read-only
    mount, then one after the operator fixed it: nothing is lost on the way, the read-only
    rerun leaves each original in place, and the fixed one finishes every move once, each copy
    beside a sidecar whose sha256 is its bytes."""
    node = crashed_node(tmp_path / "node")
    bin_dir = node.fake_plugin_network("net", "done", DEL_DONE)
    originals = {
        ENTRY: node.write_result(ENTRY, b"").read_bytes(),
        SECOND: node.write_result(SECOND, b"\0" * 10).read_bytes(),
    }
    argv = ["--json", "--root", str(node.root), "--bin-dir", str(bin_dir)]
    mounts = read_only(node.results)

    killed = run_private({"mounts": mounts, "argv": argv}, {failpoint.ENV: step})
    assert killed.code == -9, killed.stderr

    again = run_private({"mounts": mounts, "argv": argv})
    assert again.code == ExitCode.ACTION_FAILED
    for entry in again.doc()["entries"]:
        assert entry["outcome"] == "failed"
        assert entry["quarantined_to"] is None
        assert entry["problems"] == [f"quarantine: Read-only file system; {READ_ONLY_HINT}"]
    assert files_under(node.results) == originals  # nothing lost, nothing moved
    earlier = assert_every_copy_has_a_true_sidecar(node.quarantine)
    # Only the copy the killed run completed (ours=False now) may stay: never this run's.
    expected = {ENTRY} if step == "quarantine.copy-in-place" else set()
    assert {os.path.basename(n) for n in earlier} == expected

    fixed = run_private({"argv": argv})
    assert fixed.code == ExitCode.OK, fixed.stderr
    assert files_under(node.results) == {}
    moved = assert_every_copy_has_a_true_sidecar(node.quarantine)
    assert sorted(os.path.basename(n) for n in moved) == sorted(originals)  # once each
    for name, data in moved.items():
        assert data == originals[os.path.basename(name)]
    for entry in fixed.doc()["entries"]:
        assert entry["outcome"] == "done"
        assert entry["quarantined_to"] == str(node.quarantine / BOOT_ID / entry["path"])


def json_run_argv(node: NodeTree, bin_dir: Path, state: Path) -> list[str]:
    """A real run with --json, its state dir (and so its quarantine) on another file system."""
    return [
        "--json",
        "--root",
        str(node.root),
        "--bin-dir",
        str(bin_dir),
        "--state-dir",
        str(state),
    ]


def test_an_immutable_original_stays_and_leaves_no_copy_nor_a_read_only_hint(
    tmp_path: Path, other_fs: Path
) -> None:
    """chattr +i: the unlink fails with EPERM, not EROFS. The copy this run made goes, and the
    report does not send the operator to ReadWritePaths=."""
    node = crashed_node(tmp_path / "node")
    bin_dir = node.fake_plugin_network("net", "done", DEL_DONE)
    original = node.write_result(ENTRY, b"\0" * 12)
    state = other_fs / "state"
    argv = json_run_argv(node, bin_dir, state)
    chattr("+i", original)
    try:
        ran = run_private({"argv": argv})
    finally:
        chattr("-i", original)

    assert ran.code == ExitCode.ACTION_FAILED
    (entry,) = ran.doc()["entries"]
    assert (entry["outcome"], entry["quarantined_to"]) == ("failed", None)
    assert entry["problems"] == ["quarantine: Operation not permitted"]
    assert original.read_bytes() == b"\0" * 12
    assert files_under(state / "quarantine") == {}


def test_an_original_that_is_a_mount_point_stays_and_leaves_no_copy(
    tmp_path: Path, other_fs: Path
) -> None:
    """A file bind-mounted over the entry: its unlink fails with EBUSY. Nothing of the move
    is left in the quarantine; the bytes under the mount are untouched."""
    node = crashed_node(tmp_path / "node")
    bin_dir = node.fake_plugin_network("net", "done", DEL_DONE)
    entry_path = node.write_result(ENTRY, b"")
    source = tmp_path / "mounted"
    source.write_bytes(b"\0" * 7)
    state = other_fs / "state"
    argv = json_run_argv(node, bin_dir, state)

    ran = run_private({"mounts": [["mount", "--bind", str(source), str(entry_path)]], "argv": argv})

    assert ran.code == ExitCode.ACTION_FAILED
    (entry,) = ran.doc()["entries"]
    assert entry["content"] == "zeroed"  # what the mount showed
    assert (entry["outcome"], entry["quarantined_to"]) == ("failed", None)
    assert entry["problems"] == ["quarantine: Device or resource busy"]
    assert source.read_bytes() == b"\0" * 7
    assert entry_path.read_bytes() == b""
    assert files_under(state / "quarantine") == {}


def test_an_immutable_reservation_stays_reserved_and_leaves_no_copy(
    tmp_path: Path, other_fs: Path
) -> None:
    """An orphaned reservation no DEL can release (no plugin dir holds host-local) is released
    into the quarantine; made immutable, its unlink fails after the copy: the address stays
    reserved, and nothing of it is left in the quarantine."""
    node = crashed_node(tmp_path / "node")
    node.write_conf("10-pods.conflist", host_local_conflist("pods", "10.77.0.0/24"))
    store = node.root / "var/lib/cni/networks/pods"
    store.mkdir(parents=True)
    reservation = store / "10.77.0.5"
    owner = f"{CONTAINER_IDS[1]}\r\neth0".encode()
    reservation.write_bytes(owner)
    no_plugins = tmp_path / "no-plugins"
    no_plugins.mkdir()
    state = other_fs / "state"
    argv = ["--json", "--root", str(node.root), "--bin-dir", str(no_plugins)]
    chattr("+i", reservation)
    try:
        ran = run_private({"argv": [*argv, "--state-dir", str(state)]})
    finally:
        chattr("-i", reservation)

    assert ran.code == ExitCode.ACTION_FAILED
    (held,) = ran.doc()["host_local"]
    assert (held["outcome"], held["quarantined_to"]) == ("failed", None)
    assert held["problem"] == "quarantine: Operation not permitted"
    assert reservation.read_bytes() == owner
    assert files_under(state / "quarantine") == {}


def test_a_read_only_multus_dir_keeps_its_scratch_file_and_leaves_no_copy(
    tmp_path: Path,
) -> None:
    """Multus's scratch files go through their own quarantine (<boot>/multus): a damaged one in
    a read-only dir fails its move with the hint, and leaves no copy there."""
    node = crashed_node(tmp_path / "node")
    bin_dir = node.fake_plugin_network("net", "done", DEL_DONE)
    multus = node.root / "var/lib/cni/multus"
    multus.mkdir(parents=True, mode=0o700)
    scratch = multus / CONTAINER_IDS[2]
    scratch.write_bytes(b'[{"Na')
    scratch.chmod(0o600)
    argv = ["--json", "--root", str(node.root), "--bin-dir", str(bin_dir)]

    ran = run_private({"mounts": read_only(multus), "argv": argv})

    assert ran.code == ExitCode.ACTION_FAILED
    (doc,) = ran.doc()["multus_scratch"]
    assert (doc["action"], doc["outcome"], doc["quarantined_to"]) == ("quarantine", "failed", None)
    assert doc["problem"] == f"quarantine: Read-only file system; {READ_ONLY_HINT}"
    assert scratch.read_bytes() == b'[{"Na'
    assert files_under(node.quarantine) == {}


def test_a_cleanup_that_fails_does_not_change_why_the_move_failed(tmp_path: Path) -> None:
    node = crashed_node(tmp_path / "node")
    bin_dir = node.fake_plugin_network("net", "done", DEL_DONE)
    node.write_result(ENTRY, b"")
    argv = ["--json", "--root", str(node.root), "--bin-dir", str(bin_dir)]
    copy = node.quarantine / BOOT_ID / ENTRY
    spec = {
        "mounts": read_only(node.results),
        "immutable_at": [COPY_IN_PLACE, str(copy)],
        "argv": argv,
    }
    try:
        ran = run_private(spec)
    finally:
        _mutable_again(node.quarantine)

    assert ran.code == ExitCode.ACTION_FAILED
    assert (node.results / ENTRY).read_bytes() == b""
    # The copy could not go: it keeps its sidecar, which names its bytes.
    assert_every_copy_has_a_true_sidecar(node.quarantine)
    (entry,) = ran.doc()["entries"]
    assert entry["problems"] == [f"quarantine: Read-only file system; {READ_ONLY_HINT}"]


class Placed(NamedTuple):
    results: Path
    qdir: Path
    outcome: object


def move_once(results: Path, qbase: Path, data: bytes, make_immutable: bool = False) -> Placed:
    """One move of results/NAME (written with data if absent) into qbase's quarantine."""
    results.mkdir(exist_ok=True)
    path = results / NAME
    if not path.exists():
        path.write_bytes(data)
        os.chmod(path, 0o600)
        os.utime(path, (OLD, OLD))
    if make_immutable:
        chattr("+i", path)  # before the scan: it changes the ctime
    scanned = FileStat.of(os.stat(path, follow_symlinks=False))
    place = Quarantine(str(qbase / "quarantine"), "boot")

    def record(dest: str, digest: str) -> dict[str, object]:
        return {"sha256": digest, "path": NAME, "to": dest}

    dir_fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY)
    try:
        (outcome,) = place.move_all([Move(dir_fd, NAME, scanned, record)])
        place.close()
    finally:
        os.close(dir_fd)
        if make_immutable:
            chattr("-i", path)
    return Placed(results, Path(place.dir), outcome)


@pytest.mark.parametrize("earlier", ["other bytes", "no sidecar"])
def test_a_file_that_holds_the_name_in_the_quarantine_is_never_removed(
    tmp_path: Path, other_fs: Path, earlier: str
) -> None:
    """The quarantine name is taken by a file that is no copy of this one (other bytes, or no
    sidecar to say so): this run's copy takes the next name, and only that copy and its
    sidecar are removed when the original cannot be unlinked."""
    qdir = other_fs / "quarantine/boot"
    qdir.mkdir(parents=True)
    (qdir / NAME).write_bytes(b"\0" if earlier == "other bytes" else b"")
    if earlier == "other bytes":
        (qdir / (NAME + ".json")).write_text(json.dumps({"sha256": sha(b"\0"), "path": NAME}))
    before = files_under(qdir)

    placed = move_once(tmp_path / "results", other_fs, b"", make_immutable=True)

    assert isinstance(placed.outcome, OSError)
    assert placed.outcome.errno == errno.EPERM
    assert files_under(qdir) == before
    assert (placed.results / NAME).read_bytes() == b""


def test_an_earlier_runs_copy_stays_while_the_original_cannot_go_then_is_finished_once(
    tmp_path: Path, other_fs: Path
) -> None:
    """ours=False: a copy an earlier run completed, beside its sidecar, is not removed when the
    unlink fails; once the original can go, the move ends in that copy, with no second one."""
    qdir = other_fs / "quarantine/boot"
    qdir.mkdir(parents=True)
    data = b'{"kind":"cniCacheV1","containerId":"ab'
    (qdir / NAME).write_bytes(data)
    sidecar = {"sha256": sha(data), "path": NAME, "to": str(qdir / NAME)}
    (qdir / (NAME + ".json")).write_text(json.dumps(sidecar))
    before = files_under(qdir)
    results = tmp_path / "results"

    stuck = move_once(results, other_fs, data, make_immutable=True)

    assert isinstance(stuck.outcome, OSError)
    assert files_under(qdir) == before
    assert (results / NAME).read_bytes() == data

    done = move_once(results, other_fs, data)

    assert done.outcome == str(qdir / NAME)
    assert not (results / NAME).exists()
    assert files_under(qdir) == before  # the same copy and sidecar, and no second copy


def test_an_original_removed_between_its_check_and_its_unlink_is_said_gone(
    tmp_path: Path, other_fs: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tmp_path / "results"
    copied: list[bool] = []
    real = quarantine._still_held

    def then_removed(move: Move, file: Any) -> str | None:
        change = real(move, file)
        if copied and change is None:
            os.unlink(results / NAME)  # someone else's rm, just after the check
        return change

    monkeypatch.setattr(quarantine, "_still_held", then_removed)
    failpoint.interfere(COPY_IN_PLACE, lambda: copied.append(True))
    try:
        placed = move_once(results, other_fs, b"\0" * 5)
    finally:
        failpoint.interfere(COPY_IN_PLACE, None)

    assert copied
    assert not (results / NAME).exists()
    assert files_under(placed.qdir) == {}  # as for a file gone a step earlier
    assert isinstance(placed.outcome, FileChanged), (placed.outcome, failed_move_text(placed))


def failed_move_text(placed: Placed) -> str | None:
    return failed_move(placed.outcome) if isinstance(placed.outcome, OSError) else None


# --- 3. "DEL not run" -----------------------------------------------------------------------


def write_chain(node: NodeTree, kinds: list[str], scripts: dict[str, bytes]) -> Path:
    """A network whose conflist has plugins of kinds, in that order; each plugin's file."""
    bin_dir = node.root / "opt/cni/bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for kind, body in scripts.items():
        plugin = bin_dir / kind
        plugin.write_bytes(body)
        plugin.chmod(0o755)
    conf = {"cniVersion": "1.0.0", "name": "net", "plugins": [{"type": k} for k in kinds]}
    node.write_conf("60-net.conflist", json.dumps(conf).encode())
    return bin_dir


@pytest.mark.parametrize("chained", [False, True])
def test_a_plugin_that_cannot_be_executed_is_said_not_run_only_when_none_ran(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], chained: bool
) -> None:
    """A plugin file the kernel cannot exec (no #!): alone, the DEL did not run; after another
    plugin of the chain ran (DEL runs them in reverse), that plugin's failure is said."""
    node = crashed_node(tmp_path / "node")
    kinds = ["broken", "done"] if chained else ["broken"]
    scripts = {"broken": b"not a program\n", "done": b"#!/bin/sh\nexit 0\n"}
    bin_dir = write_chain(node, kinds, scripts)
    node.write_result(ENTRY, b"")

    code = cli.run(["--root", str(node.root), "--bin-dir", str(bin_dir)], environ={})

    shown = capsys.readouterr().out
    assert code == ExitCode.ACTION_FAILED
    path = bin_dir / "broken"
    cause = f"cannot run {path}: [Errno 8] Exec format error: '{path}'"
    if chained:
        assert f"    error: plugin type='broken' failed: {cause}\n" in shown, shown
        assert "DEL not run" not in shown
    else:
        assert f"    error: DEL not run: {cause}\n" in shown, shown


@pytest.mark.parametrize("in_thread", [False, True], ids=["main-thread", "other-thread"])
def test_a_plugin_that_ran_is_never_said_not_run(tmp_path: Path, in_thread: bool) -> None:
    """SIGCHLD ignored, inherited from a parent: the kernel reaps each plugin as it exits, and
    waitpid() fails with ECHILD after the plugin ran. Found by the review as 'DEL not run: cannot
    run …: No child processes' for a plugin that had run."""
    node = crashed_node(tmp_path / "node")
    witness = tmp_path / "plugin-ran"
    bin_dir = node.fake_plugin_network("net", "done", f"echo DEL > {witness}\nexit 0\n")
    node.write_result(ENTRY, b"")

    argv = ["--root", str(node.root), "--bin-dir", str(bin_dir)]
    ran = run_private({"ignore_sigchld": True, "in_thread": in_thread, "argv": argv})

    assert witness.read_text() == "DEL\n"  # the plugin ran its DEL
    assert "    DEL net from " in ran.stdout
    assert "DEL not run" not in ran.stdout + ran.stderr, ran.stdout
    if in_thread:
        # Only the main thread may set a handler: the exit status is lost, and said so.
        assert ran.code == ExitCode.ACTION_FAILED
        assert "once started: No child processes" in ran.stdout, ran.stdout
    else:
        # The first plugin run sets SIGCHLD back to the default: its exit status is kept.
        assert ran.code == ExitCode.OK, ran.stdout


# --- 4. a reservation whose entry's DEL failed or could not run -----------------------------


def test_a_reservation_after_a_del_that_could_not_run_is_released_as_before(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only the reason is new: the action, the outcome, the pools and the summary's counts are
    those 85dc0b5 gave (checked against it by hand: the same but for the reason)."""
    from tests.crashed import Crashed  # noqa: PLC0415 (its fixture needs the real plugins)
    from tests.nodetree import have_plugins  # noqa: PLC0415

    if not have_plugins():
        cannot_run("needs containernetworking-plugins' host-local to make a reservation")
    crashed = Crashed(NodeTree(tmp_path / "node"), time.time())
    crashed.add(CONTAINER_IDS[0]).write_bytes(b"")
    crashed.reboot()
    empty = tmp_path / "no-plugins"
    empty.mkdir()
    argv = ["--json", "--root", str(crashed.node.root), "--bin-dir", str(empty)]

    code = cli.run(argv, clock=lambda: crashed.t0 + 60, environ={})

    doc = json.loads(capsys.readouterr().out)
    assert code == ExitCode.ACTION_FAILED
    (held,) = doc["host_local"]
    assert held["action"] == "quarantine"
    assert held["outcome"] == "done"
    assert held["owner"] == {"container_id": CONTAINER_IDS[0], "ifname": "eth0"}
    assert held["reason"] == "still reserved: the DEL of its results entry failed or could not run"
    (pool,) = doc["pools"]
    assert (pool["released"], pool["left"], pool["left_by_owner"]) == (1, 0, {})
    assert doc["summary"]["host_local"] == {"quarantine/done": 1}
    assert doc["summary"]["outcome"] == {"failed": 1}
    assert crashed.ips() == {}
