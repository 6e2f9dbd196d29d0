"""Attacks on the Multus scratch-file repair (cni_reaper/multus.py MultusCache.scratch_files,
plan_scratch; multus_repair.carry_out; cli._Delegates): an attacker's or an unlucky operator's
node, each scenario asserting what the safety invariants say must hold. Nothing written in this
boot is moved; nothing alive; nothing that changed; no symlink followed, nothing outside --root
read or moved, no dir others can write acted on; a dry run writes nothing, nothing is deleted or
overwritten in the quarantine; whole JSON that is no list is never touched. Real files, real
runs of the reaper; failpoints where they reach the moment, a monkeypatch (said) where none does.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import stat
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from cni_reaper import cli, content, failpoint, pre_runtime
from cni_reaper.errors import ExitCode
from cni_reaper.journal import EventLog
from cni_reaper.repair import quarantine
from tests.crashed import Crashed, pin_netns
from tests.nodetree import CONTAINER_IDS, cache_entry_bytes, snapshot
from tests.test_multus_scratch import BOOT_ID, ScratchNode, scratch_bytes, scratch_docs

KNOWN, OTHER, THIRD = CONTAINER_IDS[0], CONTAINER_IDS[1], CONTAINER_IDS[2]
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


@pytest.fixture
def scratch(crashed: Crashed) -> ScratchNode:
    return ScratchNode(crashed)


@pytest.fixture
def interference() -> Iterator[None]:
    yield
    failpoint.interfere(quarantine.SIDECAR_WRITTEN, None)


@contextlib.contextmanager
def no_longer_than(seconds: int) -> Iterator[None]:
    """A run that would hang (a FIFO opened for reading, a lock never released) fails instead."""

    def expired(signum: int, frame: FrameType | None) -> None:
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def delegate_docs(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {Path(d["path"]).name: d for d in report["multus_results"]}


def quarantined(scratch: ScratchNode) -> list[str]:
    """The files (not sidecars) in this boot's Multus quarantine."""
    if not scratch.quarantine.exists():
        return []
    return sorted(p.name for p in scratch.quarantine.iterdir() if p.suffix != ".json")


# 1. Names: only a whole 64-hex name is a sandbox's scratch file.


@pytest.mark.parametrize(
    "name",
    [KNOWN + "\n", "\n" + KNOWN, KNOWN + " ", KNOWN + ".1", KNOWN + KNOWN[:1]],
    ids=["newline-after", "newline-before", "space-after", "dot-1", "65-hex"],
)
def test_a_name_that_is_64_hex_and_more_is_no_scratch_file(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    """A regex with $ takes "<64 hex>\\n" for a container ID: an empty file of that name is
    nobody's scratch file and must be neither judged nor moved."""
    path = scratch.scratch(name, b"")
    scratch.crashed.reboot()

    code, report = scratch.crashed.run(capsys, "-v")

    assert report["multus_scratch"] == []
    assert path.exists() and path.read_bytes() == b""
    assert quarantined(scratch) == []
    assert code == ExitCode.OK


# 2. The Multus dir and its results dir: what is not a plain dir of root's is left alone.


@pytest.mark.parametrize("kind", ["file", "fifo"])
def test_a_multus_path_that_is_no_directory_is_refused_without_a_hang(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    scratch.dir.parent.mkdir(parents=True, exist_ok=True)
    if kind == "file":
        scratch.dir.write_bytes(b"")
    else:
        os.mkfifo(scratch.dir)
    scratch.crashed.reboot()

    with no_longer_than(30):
        code, report = scratch.crashed.run(capsys)

    assert report["multus_scratch"] == []
    assert any(w.startswith(f"Multus's cache {scratch.dir}") for w in report["warnings"]), report[
        "warnings"
    ]
    mode = os.lstat(scratch.dir).st_mode
    assert stat.S_ISREG(mode) if kind == "file" else stat.S_ISFIFO(mode)
    assert code == ExitCode.OK


@pytest.mark.parametrize(
    "kind", ["symlink-to-parent", "fifo", "others-writable", "another-users", "sticky-shared"]
)
def test_a_multus_results_dir_that_cannot_be_trusted_leaves_every_scratch_file(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str], kind: str
) -> None:
    path = scratch.damaged(KNOWN)
    results = scratch.dir / "results"
    if kind == "symlink-to-parent":
        results.symlink_to("..")
    elif kind == "fifo":
        os.mkfifo(results)
    else:
        results.mkdir(mode=0o700)
        if kind == "others-writable":
            results.chmod(0o777)
        elif kind == "sticky-shared":
            results.chmod(0o1777)
        else:
            os.chown(results, 1000, 1000)
    scratch.crashed.reboot()

    with no_longer_than(30):
        code, report = scratch.crashed.run(capsys)

    assert report["multus_scratch"] == []
    assert path.exists() and path.read_bytes() == b""
    assert quarantined(scratch) == []
    said = f"Multus's delegate results {results}"
    assert any(w.startswith(said) for w in report["warnings"]), report["warnings"]
    assert code == ExitCode.OK


def test_a_multus_dir_of_another_user_is_not_acted_on(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    """Mode 0700, but not root's: its owner may put any file, or any link, under any name."""
    path = scratch.damaged(KNOWN)
    os.chown(scratch.dir, 1000, 1000)
    scratch.crashed.reboot()

    code, report = scratch.crashed.run(capsys)

    assert report["multus_scratch"] == []
    assert path.exists()
    said = f"Multus's cache {scratch.dir}: multus is owned by uid 1000"
    assert any(w.startswith(said) for w in report["warnings"]), report["warnings"]
    assert code == ExitCode.OK


def test_a_cache_dir_that_is_an_absolute_symlink_is_resolved_inside_the_root(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A rescue box: the node's /var/lib/cni -> /data/cni, as the node reads it. Followed from
    here it names this machine's /data/cni; the node's files are ROOT/data/cni."""
    crashed = scratch.crashed
    host = tmp_path / "data" / "cni"
    (host / "multus").mkdir(parents=True, mode=0o700)
    victim = host / "multus" / KNOWN
    victim.write_bytes(b"")
    victim.chmod(0o600)
    root = crashed.node.root
    inside = root / str(host).lstrip("/") / "multus"
    inside.mkdir(parents=True, mode=0o700)
    nodes = inside / KNOWN
    nodes.write_bytes(b"")
    nodes.chmod(0o600)
    (root / "var/lib").mkdir(parents=True, exist_ok=True)
    (root / "var/lib/cni").symlink_to(host)
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert victim.exists(), "this machine's own scratch file was moved"
    doc = scratch_docs(report)[KNOWN]
    assert doc["path"] == str(nodes)
    assert (doc["action"], doc["outcome"]) == ("quarantine", "done"), doc
    assert not nodes.exists()
    assert Path(doc["quarantined_to"]).is_relative_to(root)
    assert code == ExitCode.OK


# 3. What a scratch name is: links, and hard links, lose nothing.


def test_two_scratch_names_of_one_inode_lose_nothing(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    path = scratch.damaged(KNOWN, "truncated")
    data = path.read_bytes()
    twin = scratch.dir / OTHER
    os.link(path, twin)
    scratch.crashed.reboot()

    code, report = scratch.crashed.run(capsys)

    found = scratch_docs(report)
    for name, original in ((KNOWN, path), (OTHER, twin)):
        doc = found[name]
        if doc["outcome"] == "done":
            assert Path(doc["quarantined_to"]).read_bytes() == data
            assert not original.exists()
        else:
            assert original.read_bytes() == data, doc
    assert [found[n]["outcome"] for n in (KNOWN, OTHER)] in (
        ["done", "done"],
        ["done", "skipped"],
    )
    assert code in (ExitCode.OK, ExitCode.DATA)


def test_a_scratch_file_hard_linked_from_elsewhere_keeps_its_other_name(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    path = scratch.damaged(KNOWN, "zeroed")
    data = path.read_bytes()
    elsewhere = scratch.crashed.node.root / "var/lib/cni/keep-me"
    os.link(path, elsewhere)
    scratch.crashed.reboot()

    code, report = scratch.crashed.run(capsys)

    assert elsewhere.read_bytes() == data
    doc = scratch_docs(report)[KNOWN]
    assert doc["outcome"] == "done", doc
    assert Path(doc["quarantined_to"]).read_bytes() == data
    assert code == ExitCode.OK


@pytest.mark.parametrize(
    "doc", [b"null", b'"delegates"', b"42", b"true", b'{"Name": "hl"}\n'], ids=str
)
def test_whole_json_of_another_shape_is_never_touched(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str], doc: bytes
) -> None:
    path = scratch.scratch(KNOWN, doc)
    scratch.crashed.reboot()

    code, report = scratch.crashed.run(capsys)

    found = scratch_docs(report)[KNOWN]
    assert (found["content"], found["action"]) == ("mismatched", "report"), found
    assert path.read_bytes() == doc
    assert quarantined(scratch) == []
    assert code == ExitCode.DATA


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


def test_a_deeply_nested_whole_json_object_is_never_touched(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = b'{"delegates":' + nested(3000) + b"}"
    path = scratch.scratch(KNOWN, doc)
    scratch.crashed.reboot()

    code, report = scratch.crashed.run(capsys)

    assert path.exists(), "whole JSON that is no list was moved as crash damage"
    found = scratch_docs(report)[KNOWN]
    # Whole: unreadable where the interpreter cannot decode it (3.9 to 3.11), a format this
    # reaper does not know where it can (3.12 on); never damage.
    assert (found["content"], found["action"]) in (
        ("unreadable", "report"),
        ("mismatched", "report"),
    ), found
    assert code == ExitCode.DATA


def test_a_deeply_nested_whole_list_is_never_touched(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    # Whole JSON, a list (Python's decoder cannot say so: it recurses); Go's reads it.
    delegate = scratch_bytes()[:-2] + b',"Extra":' + nested(3000) + b"}]"
    path = scratch.scratch(KNOWN, delegate)
    scratch.crashed.reboot()

    code, report = scratch.crashed.run(capsys)

    assert path.exists(), "a whole list Multus can read was moved"
    assert path.read_bytes() == delegate
    found = scratch_docs(report)[KNOWN]
    # Unreadable where the interpreter cannot decode it (3.9 to 3.11), kept where it can.
    fate = (found["content"], found["action"], found["outcome"], code)
    assert fate in (
        ("unreadable", "report", "skipped", ExitCode.DATA),
        ("valid", "keep", "skipped", ExitCode.OK),
    ), found


@pytest.mark.parametrize("how", ["whole-list", "zeroed-sparse"])
def test_a_scratch_file_over_1_mib_is_reported_and_never_moved(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    path = scratch.scratch(KNOWN, b"")
    size = (1 << 20) + 1
    if how == "whole-list":
        one = scratch_bytes()[1:-1]
        count = size // len(one) + 1
        path.write_bytes(b"[" + b",".join([one] * count) + b"]")
    else:
        os.truncate(path, 1 << 30)  # a GiB of NULs, sparse: it must never be read whole
    before = path.stat()
    scratch.crashed.reboot()

    with no_longer_than(60):
        code, report = scratch.crashed.run(capsys)

    doc = scratch_docs(report)[KNOWN]
    assert (doc["content"], doc["action"], doc["outcome"]) == ("oversized", "report", "skipped")
    assert path.stat().st_ino == before.st_ino and path.stat().st_size == before.st_size
    assert quarantined(scratch) == []
    assert code == ExitCode.DATA


def test_a_cut_off_scratch_file_of_many_scalars_is_judged_and_moved(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    """The grammar once copied the rest of the text for every scalar it met: a 320 KiB file
    took seconds a look, and 8 MiB of them (below) would not end before the unit's timeout."""
    path = scratch.scratch(KNOWN, b"[" + b"0," * (160 << 10))  # 320 KiB, cut off
    scratch.crashed.reboot()

    code, report = scratch.crashed.run(capsys)

    assert scratch_docs(report)[KNOWN]["content"] == "truncated"
    assert not path.exists()
    assert code == ExitCode.OK
    # A hang guard, not a timing: linear, this takes seconds; quadratic, hours.
    with no_longer_than(120):
        assert content.json_state("[" + "true," * (1 << 21)) is content.JsonState.PREFIX


# 4. Between the judging and the move.


@pytest.mark.parametrize(
    "how",
    [
        "symlink-out-of-root",
        "fifo",
        "directory",
        "swapped-with-a-whole-one",
        "emptied-in-place",
        "multus-dir-swapped",
    ],
)
def test_what_is_at_the_name_when_it_moves_is_never_what_moves_unless_judged(
    scratch: ScratchNode,
    capsys: pytest.CaptureFixture[str],
    interference: None,
    tmp_path: Path,
    how: str,
) -> None:
    path = scratch.damaged(KNOWN, "truncated")
    judged = path.read_bytes()
    whole = scratch.scratch(OTHER)
    outside = tmp_path / "outside"
    outside.write_bytes(b"")
    scratch.crashed.reboot()
    put: dict[str, Any] = {}

    def change() -> None:
        if how == "symlink-out-of-root":
            path.unlink()
            path.symlink_to(outside)
        elif how == "fifo":
            path.unlink()
            os.mkfifo(path)
        elif how == "directory":
            path.unlink()
            path.mkdir()
            (path / "precious").write_text("keep me")
        elif how == "swapped-with-a-whole-one":
            os.rename(whole, path)
        elif how == "emptied-in-place":
            with open(path, "r+b") as f:
                f.truncate(0)
        else:
            scratch.dir.rename(scratch.dir.with_name("multus.old"))
            scratch.dir.mkdir(mode=0o700)
            path.write_bytes(b"")
        put["st"] = os.lstat(path)

    failpoint.interfere(quarantine.SIDECAR_WRITTEN, change)

    with no_longer_than(30):
        code, report = scratch.crashed.run(capsys)

    now = os.lstat(path)
    assert (now.st_ino, now.st_mode) == (put["st"].st_ino, put["st"].st_mode), (
        "what a change put at the name was moved"
    )
    assert outside.exists()
    doc = scratch_docs(report)[KNOWN]
    if how == "multus-dir-swapped":
        # The file judged, in the dir as it was opened, may go: it is the one judged.
        moved = doc["quarantined_to"]
        assert moved is None or Path(moved).read_bytes() == judged
        assert code in (ExitCode.OK, ExitCode.DATA)
    else:
        assert doc["outcome"] == "skipped" and "changed" in (doc["problem"] or ""), doc
        assert quarantined(scratch) == []
        assert code == ExitCode.DATA
    if how == "emptied-in-place":
        assert path.read_bytes() == b""
    if how == "swapped-with-a-whole-one":
        assert path.read_bytes() == scratch_bytes()


@pytest.mark.parametrize("how", ["rewritten-whole", "other-damage", "touched"])
def test_a_scratch_file_changed_after_the_last_look_stays(
    scratch: ScratchNode,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    """pre_runtime.confirm is the last look before the moves; no failpoint lies between it and
    them, so it is wrapped (monkeypatch): the real one runs, then the file changes."""
    path = scratch.damaged(KNOWN, "empty")
    scratch.crashed.reboot()
    confirm = pre_runtime.confirm

    def then_changed(*args: Any) -> Any:
        veto = confirm(*args)
        if how == "rewritten-whole":
            path.write_bytes(scratch_bytes())
        elif how == "other-damage":
            path.write_bytes(b"\0" * 64)
        else:
            os.utime(path, ns=(1, 1))
        return veto

    monkeypatch.setattr(pre_runtime, "confirm", then_changed)

    code, report = scratch.crashed.run(capsys)

    doc = scratch_docs(report)[KNOWN]
    assert doc["outcome"] == "skipped" and "changed" in (doc["problem"] or ""), doc
    assert path.exists() and quarantined(scratch) == []
    if how == "rewritten-whole":
        assert path.read_bytes() == scratch_bytes()
    assert code == ExitCode.DATA


def test_a_runtime_starting_at_the_last_look_holds_every_scratch_move_back(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """containerd starts after the files were judged, just before the last look: nothing this
    run found is proven. No failpoint lies there: pre_runtime.confirm is wrapped
    (monkeypatch), containerd's /run dir made, then the real one runs."""
    crashed = scratch.crashed
    path = scratch.damaged(KNOWN)
    crashed.reboot()
    confirm = pre_runtime.confirm

    def containerd_starts_first(*args: Any) -> Any:
        crashed.node.runtime_starts()
        return confirm(*args)

    monkeypatch.setattr(pre_runtime, "confirm", containerd_starts_first)

    code, report = crashed.run(capsys)

    doc = scratch_docs(report)[KNOWN]
    assert (doc["written"], doc["action"], doc["outcome"]) == ("unknown", "leave", "skipped"), doc
    assert "not proven to predate this boot" in doc["reason"]
    assert path.exists() and not scratch.quarantine.exists()
    assert code == ExitCode.DATA
    monkeypatch.setattr(pre_runtime, "confirm", confirm)

    # And no record was kept: a later run of the boot, the runtime up, proves nothing either.
    code, report = crashed.run(capsys, "--force")

    assert scratch_docs(report)[KNOWN]["action"] == "leave"
    assert path.exists()
    assert code == ExitCode.DATA


# 5. Liveness: a netns still mounted that a whole entry of the sandbox names.


@pytest.mark.parametrize("entry", ["runtime-results", "multus-delegate-result"])
def test_a_scratch_file_of_a_sandbox_whose_netns_is_still_mounted_is_left(
    scratch: ScratchNode,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    entry: str,
) -> None:
    crashed = scratch.crashed
    path = scratch.damaged(KNOWN)
    pin = f"cni-{KNOWN[:8]}"
    conf = json.dumps({"cniVersion": "1.0.0", "name": "hl", "type": "host-local"}).encode()
    whole = cache_entry_bytes(conf, "hl", KNOWN, "eth0", netns=f"/var/run/netns/{pin}")
    if entry == "runtime-results":
        crashed.node.write_result(f"hl-{KNOWN}-eth0", whole)
    else:
        results = scratch.dir / "results"
        results.mkdir(mode=0o700)
        (results / f"hl-{KNOWN}-net1").write_bytes(whole)
    scratch.runtime_started_with_a_record()
    pin_netns(crashed, monkeypatch, tmp_path, pin)  # a netns dir in /run: a runtime is up

    code, report = crashed.run(capsys, "--force")

    doc = scratch_docs(report)[KNOWN]
    assert (doc["action"], doc["outcome"]) == ("leave", "skipped"), doc
    assert "still mounted" in doc["reason"], doc
    assert path.exists() and quarantined(scratch) == []
    assert code == ExitCode.DATA


# 6. One sandbox, two files of Multus's: a delegate result and the scratch file.


def test_a_sandbox_with_a_damaged_delegate_result_and_scratch_file_loses_neither_nor_its_address(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both moved to quarantine/<boot>/multus/, each beside its own sidecar; the delegate's
    address stays Multus's to release, in this run and in a second one of the boot, whose
    reading of the quarantine's sidecars must not take the scratch file's for a delegate's."""
    crashed = scratch.crashed
    crashed.add(KNOWN).unlink()  # the address, with no results entry: Multus's delegate's
    held = crashed.ips()
    assert len(held) == 1
    results = scratch.dir / "results"
    results.mkdir(parents=True, mode=0o700)
    delegate = results / f"hl-{KNOWN}-eth0"
    delegate.write_bytes(b"")
    delegate.chmod(0o600)
    path = scratch.damaged(KNOWN, "zeroed")
    zeroes = path.read_bytes()
    crashed.reboot()

    code, report = crashed.run(capsys, "-v")

    assert code == ExitCode.OK, report
    d, s = delegate_docs(report)[delegate.name], scratch_docs(report)[KNOWN]
    assert (d["outcome"], s["outcome"]) == ("done", "done"), (d, s)
    assert (
        Path(d["quarantined_to"]).parent == Path(s["quarantined_to"]).parent == scratch.quarantine
    )
    assert Path(s["quarantined_to"]).read_bytes() == zeroes
    for doc, original in ((d, delegate), (s, path)):
        sidecar = json.loads(Path(doc["quarantined_to"] + ".json").read_text())
        assert sidecar["path"] == str(original)
    assert report["summary"]["multus_results"] == {"quarantine/done": 1}
    assert report["summary"]["multus_scratch"] == {"quarantine/done": 1}
    (reservation,) = report["host_local"]
    assert reservation["action"] == "keep", reservation
    assert crashed.ips() == held

    code, again = crashed.run(capsys, "-v")

    assert (again["multus_results"], again["multus_scratch"]) == ([], [])
    (reservation,) = again["host_local"]
    assert reservation["action"] == "keep", reservation
    assert crashed.ips() == held
    assert code == ExitCode.OK


def test_a_delegate_result_named_as_another_ones_sidecar_overwrites_nothing(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed = scratch.crashed
    results = scratch.dir / "results"
    results.mkdir(parents=True, mode=0o700)
    first = results / f"hl-{KNOWN}-net1"
    second = results / f"hl-{KNOWN}-net1.json"  # an ifname of 9 characters
    first.write_bytes(b"")
    second.write_bytes(b'{"kind":"cniCacheV1","containerId":"')
    path = scratch.damaged(KNOWN)
    crashed.reboot()

    code, report = crashed.run(capsys)

    found = delegate_docs(report)
    assert scratch_docs(report)[KNOWN]["outcome"] == "done"
    for original in (first, second):
        doc = found[original.name]
        assert doc["outcome"] == "done", doc
        text = Path(doc["quarantined_to"] + ".json").read_bytes()
        assert text.startswith(b'{"schema":1,'), ("not a sidecar", doc["quarantined_to"], text)
        assert json.loads(text)["path"] == str(original)
    assert not path.exists()
    assert code == ExitCode.OK


# 7. The quarantine.


@pytest.mark.parametrize("how", ["file", "symlink", "boot-dir-symlink", "sidecar-name-a-dir"])
def test_a_quarantine_that_cannot_be_used_fails_the_scratch_move_and_says_so(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str], tmp_path: Path, how: str
) -> None:
    path = scratch.damaged(KNOWN)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    boot_dir = scratch.quarantine.parent
    boot_dir.parent.mkdir(parents=True, mode=0o700)
    if how == "boot-dir-symlink":
        boot_dir.symlink_to(elsewhere)
    else:
        boot_dir.mkdir(mode=0o700)
        if how == "file":
            scratch.quarantine.write_text("in the way")
        elif how == "symlink":
            scratch.quarantine.symlink_to(elsewhere)
        else:
            scratch.quarantine.mkdir(mode=0o700)
            (scratch.quarantine / f"{KNOWN}.json").mkdir()
    scratch.crashed.reboot()

    code, report = scratch.crashed.run(capsys)

    doc = scratch_docs(report)[KNOWN]
    assert (doc["action"], doc["outcome"]) == ("quarantine", "failed"), doc
    assert doc["quarantined_to"] is None and doc["problem"]
    assert path.exists() and path.read_bytes() == b""
    assert list(elsewhere.iterdir()) == []
    assert report["summary"]["multus_scratch"] == {"quarantine/failed": 1}
    assert code == ExitCode.ACTION_FAILED


def test_a_directory_of_the_scratch_files_name_in_the_quarantine_is_kept(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    path = scratch.damaged(KNOWN)
    scratch.quarantine.mkdir(parents=True)
    (scratch.quarantine / KNOWN).mkdir()
    (scratch.quarantine / KNOWN / "precious").write_text("keep me")
    scratch.crashed.reboot()

    code, report = scratch.crashed.run(capsys)

    doc = scratch_docs(report)[KNOWN]
    assert doc["outcome"] == "done", doc
    assert doc["quarantined_to"] == str(scratch.quarantine / f"{KNOWN}.1")
    assert (scratch.quarantine / KNOWN / "precious").read_text() == "keep me"
    assert not path.exists()
    assert code == ExitCode.OK


def test_an_empty_file_quarantined_earlier_under_its_name_is_not_taken_for_its_copy(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every empty file has one sha256: a quarantined empty file of the same name, whose
    sidecar names another original, must not make this one count as copied already (and be
    unlinked with no copy of its own)."""
    path = scratch.damaged(KNOWN)
    scratch.quarantine.mkdir(parents=True)
    (scratch.quarantine / KNOWN).write_bytes(b"")
    other = {"sha256": EMPTY_SHA256, "path": "/elsewhere/" + KNOWN, "container_id": KNOWN}
    (scratch.quarantine / f"{KNOWN}.json").write_text(json.dumps(other))
    scratch.crashed.reboot()

    code, report = scratch.crashed.run(capsys)

    doc = scratch_docs(report)[KNOWN]
    assert doc["quarantined_to"] == str(scratch.quarantine / f"{KNOWN}.1"), doc
    sidecar = json.loads((scratch.quarantine / f"{KNOWN}.1.json").read_text())
    assert sidecar["path"] == str(path)
    assert json.loads((scratch.quarantine / f"{KNOWN}.json").read_text()) == other
    assert code == ExitCode.OK


def test_the_text_report_and_the_log_say_a_failed_scratch_move(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed = scratch.crashed
    path = scratch.damaged(KNOWN)
    scratch.quarantine.parent.mkdir(parents=True, mode=0o700)
    scratch.quarantine.write_text("in the way")
    crashed.reboot()
    log = io.StringIO()

    code = cli.run(
        crashed.argv(), clock=lambda: crashed.t0 + 60, events=EventLog(stream=log), environ={}
    )

    text = capsys.readouterr().out
    assert code == ExitCode.ACTION_FAILED
    assert f"{path}: Multus scratch file empty, previous-boot -> quarantine [failed]" in text
    assert "Multus scratch files: 0 done, 1 failed" in text, text
    (line,) = [ln for ln in log.getvalue().splitlines() if ln.startswith(f"cni-reaper: {path}:")]
    assert "cni_reaper_action=quarantine-multus-scratch" in line, line
    assert "cni_reaper_outcome=failed" in line, line
    assert path.exists()


# 8. Runs of one boot: a second, a dry run, --force with a runtime up.


def test_a_move_that_failed_is_made_by_a_later_run_of_the_boot(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first run kept the record of the Multus dir, though its move failed: the next run
    of the boot, containerd up by then, finds the file unchanged and moves it."""
    crashed = scratch.crashed
    path = scratch.damaged(KNOWN)
    scratch.quarantine.parent.mkdir(parents=True, mode=0o700)
    scratch.quarantine.write_text("in the way")
    crashed.reboot()
    first, _ = crashed.run(capsys)
    assert first == ExitCode.ACTION_FAILED and path.exists()
    scratch.quarantine.unlink()
    crashed.node.runtime_starts()

    code, report = crashed.run(capsys, "--force")

    doc = scratch_docs(report)[KNOWN]
    assert (doc["written"], doc["outcome"]) == ("previous-boot", "done"), doc
    assert not path.exists() and quarantined(scratch) == [KNOWN]
    assert code == ExitCode.OK


def test_a_second_run_leaves_damage_written_since_the_first(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed = scratch.crashed
    scratch.damaged(KNOWN)
    crashed.reboot()
    first, _ = crashed.run(capsys)
    assert first == ExitCode.OK and quarantined(scratch) == [KNOWN]
    crashed.node.runtime_starts()
    fresh = scratch.damaged(OTHER, "truncated")  # Multus's ADD, cut by this boot's own trouble
    data = fresh.read_bytes()

    code, report = crashed.run(capsys, "--force")

    doc = scratch_docs(report)[OTHER]
    assert (doc["written"], doc["action"], doc["outcome"]) == ("current-boot", "leave", "skipped")
    assert fresh.read_bytes() == data
    assert KNOWN not in scratch_docs(report)
    assert quarantined(scratch) == [KNOWN]
    assert code == ExitCode.DATA


def test_a_record_taken_with_no_scratch_file_proves_nothing_of_one_made_since(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    """The first run found Multus's dir empty; a scratch file damaged afterwards, this boot,
    is not in its record."""
    crashed = scratch.crashed
    scratch.dir.mkdir(parents=True, mode=0o700)
    crashed.reboot()
    first, _ = crashed.run(capsys)
    assert first == ExitCode.OK
    crashed.node.runtime_starts()
    path = scratch.damaged(KNOWN)

    code, report = crashed.run(capsys, "--force")

    doc = scratch_docs(report)[KNOWN]
    assert (doc["written"], doc["action"]) == ("current-boot", "leave"), doc
    assert path.exists() and quarantined(scratch) == []
    assert code == ExitCode.DATA


def test_a_multus_dir_recreated_after_the_record_proves_nothing(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    """Recorded, then Multus's dir replaced by a new one holding the same file (renamed in:
    the same inode, size and mtime): the record's identities of the old dir's files must not
    carry over."""
    path = scratch.damaged(KNOWN)
    scratch.runtime_started_with_a_record()
    old = scratch.dir.with_name("multus.old")
    scratch.dir.rename(old)
    scratch.dir.mkdir(mode=0o700)
    os.rename(old / KNOWN, path)

    code, report = scratch.crashed.run(capsys, "--force")

    doc = scratch_docs(report)[KNOWN]
    assert (doc["written"], doc["action"]) == ("current-boot", "leave"), doc
    assert path.exists() and quarantined(scratch) == []
    assert code == ExitCode.DATA


def test_a_dry_run_with_a_runtime_up_and_no_record_writes_nothing_and_moves_nothing(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed = scratch.crashed
    scratch.damaged(KNOWN)
    results = scratch.dir / "results"
    results.mkdir(mode=0o700)
    (results / f"hl-{OTHER}-net1").write_bytes(b"")
    crashed.reboot()
    crashed.node.runtime_starts()
    before = snapshot(crashed.node.root)

    code, report = crashed.run(capsys, "--dry-run")

    assert snapshot(crashed.node.root) == before
    doc = scratch_docs(report)[KNOWN]
    assert (doc["written"], doc["action"], doc["outcome"]) == ("unknown", "leave", "skipped")
    assert report["summary"]["multus_scratch"] == {"leave/skipped": 1}
    assert code == ExitCode.DATA


def test_a_dry_run_then_a_real_run_move_it_once(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dry run keeps no record; the real run after it, no runtime yet, takes its own."""
    crashed = scratch.crashed
    path = scratch.damaged(KNOWN)
    crashed.reboot()
    dry, planned = crashed.run(capsys, "--dry-run")
    assert (dry, scratch_docs(planned)[KNOWN]["outcome"]) == (ExitCode.OK, "planned")
    assert not (crashed.node.root / "run" / pre_runtime.RECORD_DIR / BOOT_ID).exists()

    code, report = crashed.run(capsys)

    assert scratch_docs(report)[KNOWN]["outcome"] == "done"
    assert not path.exists() and quarantined(scratch) == [KNOWN]
    assert code == ExitCode.OK


def test_force_with_a_runtime_up_moves_only_the_dead_sandboxs_recorded_scratch_file(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed = scratch.crashed
    live = scratch.damaged(KNOWN)
    dead = scratch.damaged(OTHER, "zeroed")
    scratch.runtime_started_with_a_record()
    task = crashed.node.root / "run/containerd/io.containerd.runtime.v2.task/k8s.io" / KNOWN
    task.mkdir(parents=True)
    fresh = scratch.damaged(THIRD, "truncated")

    code, report = crashed.run(capsys, "--force")

    found = scratch_docs(report)
    assert (found[KNOWN]["action"], found[KNOWN]["outcome"]) == ("leave", "skipped")
    assert (found[OTHER]["action"], found[OTHER]["outcome"]) == ("quarantine", "done")
    assert (found[THIRD]["written"], found[THIRD]["action"]) == ("current-boot", "leave")
    assert live.exists() and fresh.exists() and not dead.exists()
    assert quarantined(scratch) == [OTHER]
    assert code == ExitCode.DATA


def test_many_damaged_scratch_files_are_all_moved_and_counted(
    scratch: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    names = [f"{i:064x}" for i in range(1, 2001)]
    for name in names:
        scratch.scratch(name, b"\0" * 64)
    scratch.crashed.reboot()

    code, report = scratch.crashed.run(capsys)

    assert report["summary"]["multus_scratch"] == {"quarantine/done": len(names)}
    assert [n for n in os.listdir(scratch.dir) if n in names] == []
    assert quarantined(scratch) == sorted(names)
    assert code == ExitCode.OK
