"""A model test of settling what a move cut short left (leaving.settle, through the scan that
hands it the hidden names, cache.inspect_all, wired as cli._settling wires it): hypothesis draws
the hidden file (a regular file, or a symlink, FIFO or dir under its name), what its original's
name holds, what the quarantine holds and in which boot's dir (this boot's, an earlier one's, or
a symlink among them that names a boot), what this boot's pre-runtime record says, and whether
the run is a dry run; the model says what must become of it, and the invariants hold for every
draw:
- a dry run changes nothing anywhere;
- no bytes are lost: each regular file's bytes are, after it, in the results dir or in a
  quarantined copy beside a sidecar naming them;
- a file is renamed or removed only when it could be the reaper's own and a file that predates
  every runtime of the boot (the record, or a run taking it);
- a file that holds the original's name is never replaced, and nothing outside the dirs changes;
- what the report's warnings say, and how they count toward the exit code.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import tempfile
from pathlib import Path
from typing import NamedTuple

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni_reaper import cache, leaving
from cni_reaper.boot import FirstReading
from cni_reaper.pre_runtime import DirRecord, FileIdentities, PreRuntimeRecord, Proof
from cni_reaper.repair.quarantine import copy_finder
from tests.test_leaving_attacks import tree

NAME = "net-" + "cd" * 32 + "-eth0"
HIDDEN = f".{NAME}.89abcdef{leaving.SUFFIX}"
BOOT = "boot"

KINDS = ("regular", "symlink", "fifo", "dir")
ORIGINALS = ("absent", "same-file", "other-file")
COPIES = ("none", "true", "other-path", "other-sha", "no-sidecar", "other-bytes", "symlink")
PROOFS = ("taking", "holds-it", "holds-another", "holds-nothing", "missing")
# Which boot's dir the copy is in: this boot's, an earlier one's, or a dir outside that a
# symlink in the quarantine, named like a boot, points to (never followed). Multus's files go
# to a box of the boot's dir, the results dir's to the boot's dir itself.
WHERE = ("this-boot", "earlier-boot", "linked-boot")
BOXES = (None, "multus")


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def quarantined(top: Path) -> set[bytes]:
    """The bytes of every regular copy, in any boot's dir, beside a sidecar whose sha256 names
    them."""
    found = set()
    qdirs = top.iterdir() if top.is_dir() else iter(())
    for boot in qdirs:
        if boot.is_symlink() or not boot.is_dir():
            continue
        for path in itertools.chain(boot.iterdir(), (boot / "multus").glob("*")):
            sidecar = path.with_name(path.name + ".json")
            if path.suffix == ".json" or path.is_symlink() or not sidecar.is_file():
                continue
            data = path.read_bytes()
            if json.loads(sidecar.read_text()).get("sha256") == sha(data):
                found.add(data)
    return found


def plant_copy(
    top: Path, where: str, box: str | None, outside: Path, how: str, data: bytes
) -> None:
    if how == "none":
        return
    if where == "linked-boot":
        qdir = outside.with_name("elsewhere")
        top.mkdir()
        (top / "linked-boot").symlink_to(qdir)
    else:
        qdir = top / {"this-boot": BOOT, "earlier-boot": "an-earlier-boot"}[where]
    qdir = qdir / box if box is not None else qdir
    qdir.mkdir(parents=True)
    copy, sidecar = qdir / NAME, qdir / (NAME + ".json")
    held = {"other-bytes": data + b"~"}.get(how, data)
    if how == "symlink":
        outside.write_bytes(data)
        copy.symlink_to(outside)
    else:
        copy.write_bytes(held)
    if how == "no-sidecar":
        return
    record = {
        "sha256": sha(held) if how != "other-sha" else sha(held + b"!"),
        "path": NAME if how != "other-path" else "other-" + NAME,
    }
    sidecar.write_text(json.dumps(record))


def proof_for(how: str, results: Path, hidden: os.stat_result) -> Proof:
    if how == "taking":
        return Proof("boot", None, True, None)
    if how == "missing":
        return Proof("boot", None, False, "no record: the unit did not run before the runtime")
    files = FileIdentities()
    if how != "holds-nothing":
        inode = hidden.st_ino if how == "holds-it" else hidden.st_ino + 1
        files.set(NAME, (inode, hidden.st_size, hidden.st_mtime_ns, 0))
    dir_st = os.stat(results)
    dirs = {str(results): DirRecord(dir_st.st_dev, dir_st.st_ino, files)}
    return Proof.loaded(PreRuntimeRecord("boot", 0.0, FirstReading(None, None), dirs))


class Case(NamedTuple):
    kind: str  # of KINDS
    data: bytes  # the hidden file's
    original: str  # of ORIGINALS
    copy: str  # of COPIES
    where: str  # of WHERE
    box: str | None  # of BOXES
    proof: str  # of PROOFS
    dry_run: bool


def expected(case: Case) -> str:
    """The model: what becomes of the hidden name."""
    kind, _, original, copy, where, _, proof, dry_run = case
    if kind != "regular":
        return "judged"  # never handed to settle: the scan judges it as what it is
    if proof not in ("taking", "holds-it"):
        return "left"
    if original == "same-file" or (copy == "true" and where != "linked-boot"):
        return "planned" if dry_run else "dropped"
    if original == "other-file":
        return "left"
    return "planned" if dry_run else "put back"


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.builds(
        Case,
        kind=st.sampled_from(KINDS),
        data=st.sampled_from([b"", b"\0\0\0\0", b'{"kind":"cniCacheV1","containerId":"cd']),
        original=st.sampled_from(ORIGINALS),
        copy=st.sampled_from(COPIES),
        where=st.sampled_from(WHERE),
        box=st.sampled_from(BOXES),
        proof=st.sampled_from(PROOFS),
        dry_run=st.booleans(),
    )
)
def test_settling_any_leftover_loses_nothing_and_touches_only_what_is_proven(case: Case) -> None:
    check(case)


def test_each_case_is_reached() -> None:
    """Every draw but the bytes, once, by hand: the model test draws them, this shows none
    is out of its reach."""
    for case in itertools.product(KINDS, ORIGINALS, COPIES, WHERE, BOXES, PROOFS, (False, True)):
        kind, original, copy, where, box, proof, dry_run = case
        if copy == "none" and (where, box) != ("this-boot", None):
            continue  # no copy is nowhere, whichever dir it is not in
        check(Case(kind, b"", original, copy, where, box, proof, dry_run))


def check(case: Case) -> None:
    kind, data, original, copy, where, box, proof, dry_run = case
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        results, top, outside = base / "results", base / "quarantine", base / "outside"
        results.mkdir()
        hidden = results / HIDDEN
        if kind == "regular":
            hidden.write_bytes(data)
        elif kind == "symlink":
            (base / "target").write_bytes(data)
            hidden.symlink_to(base / "target")
        elif kind == "fifo":
            os.mkfifo(hidden)
        else:
            hidden.mkdir()
        if original == "same-file" and kind == "regular":
            os.link(hidden, results / NAME)
        elif original != "absent":
            (results / NAME).write_bytes(b"libcni's own")
        plant_copy(top, where, box, outside, copy, data)
        the_proof = proof_for(proof, results, os.lstat(hidden))
        before = tree(base)
        bytes_before = {
            p.read_bytes() for p in results.iterdir() if p.is_file() and not p.is_symlink()
        }
        name_before = (results / NAME).lstat() if original != "absent" else None
        handed: list[list[str]] = []
        said: list[leaving.Settled] = []

        def settle(names: list[str]) -> list[str]:
            # As cli._settling wires it for the results dir (a sidecar names its bare name).
            handed.append(names)
            copy_of = copy_finder(str(top), BOOT, box, dir_fd, lambda name: name)
            dir_st = os.fstat(dir_fd)

            def predates(st_: os.stat_result, original: str) -> str | None:
                return the_proof.held_before(str(results), dir_st, original, st_)

            put_back, settled = leaving.settle(
                dir_fd, str(results), names, copy_of, predates, dry_run
            )
            said.extend(settled)
            return put_back

        dir_fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY)
        try:
            judged = [name for name, _, _ in cache.inspect_all(dir_fd, settle=settle)]
        finally:
            os.close(dir_fd)

        fate = expected(case)
        after = tree(base)
        outcomes = [s.outcome for s in said]
        # Nothing outside the two dirs changes, nor the quarantine: a settle only reads it.
        for path, entry in before.items():
            if not path.startswith("results"):
                assert after.get(path) == entry, path
        assert {p for p in after if not p.startswith("results")} == {
            p for p in before if not p.startswith("results")
        }
        # Its original's name, if it held another file, holds it still.
        if name_before is not None:
            now = (results / NAME).lstat()
            assert (now.st_ino, now.st_dev) == (name_before.st_ino, name_before.st_dev)
        # No bytes lost: every regular file's bytes are still in the results dir, or in a
        # quarantined copy whose sidecar names them.
        bytes_after = {
            p.read_bytes() for p in results.iterdir() if p.is_file() and not p.is_symlink()
        }
        assert bytes_before <= bytes_after | quarantined(top)
        if fate == "judged":
            assert handed == [] and said == []
            assert HIDDEN in judged
            assert after == before
        elif fate in ("left", "planned"):
            assert after == before
            assert outcomes == [{"left": leaving.LEFT, "planned": leaving.PLANNED}[fate]]
            assert HIDDEN not in judged
        elif fate == "dropped":
            assert outcomes == [leaving.DONE]
            assert not hidden.exists()
            assert said[0].line.endswith(": removed it")
        else:
            assert outcomes == [leaving.DONE]
            assert not hidden.exists()
            assert (results / NAME).read_bytes() == data
            assert os.lstat(results / NAME).st_ino == before[f"results/{HIDDEN}"][0]
            assert NAME in judged
            assert said[0].line.endswith(f": put back as {NAME}")
