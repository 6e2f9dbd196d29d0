"""No move of a file that changed: a file rewritten, replaced, removed or touched at any step of
its move stays in (or goes back to) the results dir and is reported as changed; a sidecar always
describes the bytes that were moved; nothing written is ever lost.

A model test: hypothesis draws what the file holds, what happens to it and at which step of the
move (the quarantine's own failpoints), on one file system and across two.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni_reaper import failpoint
from cni_reaper.filestat import FileStat
from cni_reaper.repair.quarantine import FileChanged, Move, Quarantine, QuarantineError
from tests.private_node import cannot_run

OLD = 1_600_000_000  # the previous boot wrote the file: its mtime is long past
ORIGINALS = (b"", b"\0" * 64, b'{"kind":"cniCacheV1","containerId":"ab')
MUTATIONS = (
    "none",
    "rewrite",
    "append",
    "same-size",
    "chmod",
    "replace",
    "symlink",
    "unlink",
    "rewrite-and-recreate",
)
SAME_FS_STEPS = (
    "after the scan",
    "quarantine.sidecar-written",
    "quarantine.sidecar-in-place",
    "quarantine.file-renamed",
)
CROSS_FS_STEPS = (
    "after the scan",
    "quarantine.sidecar-written",
    "quarantine.sidecar-in-place",
    "quarantine.copy-written",
    "quarantine.copy-in-place",
    "quarantine.original-checked",  # after its last check by name, before it is hidden
    "quarantine.original-hidden",  # hidden beside itself, not yet checked there
)
NAME = "net-" + "ab" * 32 + "-eth0"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Writer:
    """Someone else at work on the file: by its path, or through a descriptor it opened
    before the move began (as a truncate-and-write in flight holds one)."""

    def __init__(self, results: Path, secret: Path) -> None:
        self.path = results / NAME
        self.secret = secret
        self.fd = os.open(self.path, os.O_RDWR)

    def mutate(self, how: str) -> None:
        if how == "rewrite":
            os.ftruncate(self.fd, 0)
            os.pwrite(self.fd, b'{"kind":"cniCacheV1"}', 0)
        elif how == "append":
            os.pwrite(self.fd, b"}", os.fstat(self.fd).st_size)
        elif how == "same-size":
            size = os.fstat(self.fd).st_size
            os.pwrite(self.fd, b"x" * size, 0)
        elif how == "chmod":
            os.fchmod(self.fd, 0o644)
        elif how == "rewrite-and-recreate":
            self.mutate("rewrite")
            self.mutate("replace")
        elif how == "replace":
            fresh = self.path.with_name(".fresh")
            fresh.write_bytes(b'{"fresh":1}')
            os.replace(fresh, self.path)
        elif how == "symlink":
            if self.path.exists() or self.path.is_symlink():
                self.path.unlink()
            self.path.symlink_to(self.secret)
        elif how == "unlink" and self.path.exists():
            self.path.unlink()

    def close(self) -> None:
        os.close(self.fd)


def run_move(
    base: Path, qbase: Path, original: bytes, how: str, step: str
) -> tuple[object, Path, Path, Writer]:
    results = base / "results"
    results.mkdir()
    secret = base / "secret"
    secret.write_bytes(b"root:x:0:0\n")
    path = results / NAME
    path.write_bytes(original)
    os.chmod(path, 0o600)
    os.utime(path, (OLD, OLD))
    scanned = FileStat.of(os.stat(path, follow_symlinks=False))
    writer = Writer(results, secret)
    quarantine = Quarantine(str(qbase / "quarantine"), "boot")

    def record(dest: str, digest: str) -> dict[str, object]:
        return {"sha256": digest, "path": NAME, "to": dest}

    def vet(data: bytes) -> str | None:
        return None if data == original else "not the bytes judged"

    dir_fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY)
    action: Callable[[], None] = lambda: writer.mutate(how)  # noqa: E731
    try:
        if step == "after the scan":
            writer.mutate(how)
        else:
            failpoint.interfere(step, action)
        try:
            (outcome,) = quarantine.move_all([Move(dir_fd, NAME, scanned, record, vet)])
        finally:
            if step != "after the scan":
                failpoint.interfere(step, None)
        quarantine.close()
    finally:
        os.close(dir_fd)
    return outcome, results, Path(quarantine.dir), writer


def check(original: bytes, how: str, step: str, base: Path, qbase: Path) -> None:
    outcome, results, qdir, writer = run_move(base, qbase, original, how, step)
    try:
        in_quarantine = {p.name: p.read_bytes() for p in qdir.iterdir()} if qdir.is_dir() else {}
        files = {n: d for n, d in in_quarantine.items() if not n.endswith(".json")}
        assert not [n for n in in_quarantine if n.endswith(".tmp")], in_quarantine
        # Every quarantined file lies beside a sidecar naming exactly its bytes.
        for name, data in files.items():
            assert json.loads(in_quarantine[name + ".json"])["sha256"] == sha(data)
        assert set(in_quarantine) == set(files) | {n + ".json" for n in files}
        path = results / NAME
        now = os.fstat(writer.fd)
        left = step in (FILE_RENAMED, ORIGINAL_HIDDEN)
        untouched = (
            how == "none"
            or (how == "same-size" and not original)  # a write of nothing changes nothing
            # Once it has left, what is done to the name is done to another file, and a
            # chmod leaves the bytes as they were.
            or (left and how in ("chmod", "replace", "symlink", "unlink"))
            # Past its last check by name, a copy's original is checked by its bytes: a chmod
            # leaves them as they were.
            or (step == ORIGINAL_CHECKED and how == "chmod")
        )
        if how in ("none", "rewrite", "append", "same-size", "chmod") and not isinstance(
            outcome, str
        ):
            # Nothing lost: a file the writer holds that did not move is still linked, in
            # place (under a hidden name at worst: leaving.py).
            assert now.st_nlink == 1, (how, step, outcome)
        if isinstance(outcome, str):
            # Moved: exactly the bytes that were judged, and nothing changed them on the way
            # but what leaves bytes alone after they left (a chmod).
            assert untouched, (how, step)
            assert files == {NAME: original}
            if how == "none" or not left:
                assert not path.exists() and not path.is_symlink()
        elif isinstance(outcome, FileChanged):
            assert not untouched, (how, step)
            assert files == {}
            if how in ("replace", "symlink", "unlink", "rewrite-and-recreate"):
                # Whatever took the name is left as it is; the old inode was never moved.
                assert how != "unlink" or not path.exists()
            else:
                # The file is where the runtime expects it, holding what was written to it.
                assert path.stat().st_ino == now.st_ino
                assert path.read_bytes() == os.pread(writer.fd, 1 << 16, 0)
        else:
            # Only a file that changed after it left, while its name was taken anew, stays in
            # quarantine: with a sidecar that says what it holds now (checked above).
            assert isinstance(outcome, QuarantineError), outcome
            assert (how, left) == ("rewrite-and-recreate", True), (how, step, outcome)
            assert files == {NAME: os.pread(writer.fd, 1 << 16, 0)}
    finally:
        writer.close()


FILE_RENAMED = "quarantine.file-renamed"  # after it: the file has left the results dir
ORIGINAL_CHECKED = "quarantine.original-checked"
ORIGINAL_HIDDEN = "quarantine.original-hidden"  # after it: a copy's original has left its name


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    original=st.sampled_from(ORIGINALS),
    how=st.sampled_from(MUTATIONS),
    step=st.sampled_from(SAME_FS_STEPS),
)
def test_a_file_that_changes_at_any_step_is_never_moved(
    original: bytes, how: str, step: str
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        check(original, how, step, Path(tmp), Path(tmp))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    original=st.sampled_from(ORIGINALS),
    how=st.sampled_from(MUTATIONS),
    step=st.sampled_from(CROSS_FS_STEPS),
)
def test_across_file_systems_too(original: bytes, how: str, step: str) -> None:
    shm = Path("/dev/shm")
    with tempfile.TemporaryDirectory() as tmp:
        if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp).st_dev:
            cannot_run("needs /dev/shm on another file system than the temp dir")
        with tempfile.TemporaryDirectory(dir=shm) as other:
            check(original, how, step, Path(tmp), Path(other))


def test_each_case_is_reached() -> None:
    """Every (mutation, step) pair on one file system, once, by hand: the model test draws
    them, this shows none is out of its reach."""
    for how in MUTATIONS:
        for step in SAME_FS_STEPS:
            with tempfile.TemporaryDirectory() as tmp:
                check(ORIGINALS[0], how, step, Path(tmp), Path(tmp))


def test_each_case_of_a_copys_last_step_is_reached() -> None:
    """Every (original, mutation) pair at the two points of a copy's last step, by hand:
    after its last check by name, and once hidden beside itself."""
    shm = Path("/dev/shm")
    for original in ORIGINALS:
        for how in MUTATIONS:
            for step in (ORIGINAL_CHECKED, ORIGINAL_HIDDEN):
                with tempfile.TemporaryDirectory() as tmp:
                    if not shm.is_dir() or os.stat(shm).st_dev == os.stat(tmp).st_dev:
                        cannot_run("needs /dev/shm on another file system than the temp dir")
                    with tempfile.TemporaryDirectory(dir=shm) as other:
                        check(original, how, step, Path(tmp), Path(other))
