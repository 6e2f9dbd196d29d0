"""Multus's scratch files (cni_reaper/multus.py): /var/lib/cni/multus/<container ID>, the list of
delegates Multus's DEL reads, written with no fsync. A damaged one an earlier boot left makes
Multus 3.x fail that DEL at every try and 4.x end it with no delegate's DEL; moved aside, Multus
reads the pod's delegates from the API server instead. Real files, real runs of the reaper."""

from __future__ import annotations

import base64
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_reaper import cli, failpoint
from cni_reaper.boot import Written, WrittenVerdict
from cni_reaper.content import Content, ContentVerdict
from cni_reaper.errors import ExitCode
from cni_reaper.filestat import UNKNOWN_FILE
from cni_reaper.journal import EventLog
from cni_reaper.multus import ScratchFile, plan_scratch, scratch_verdict
from cni_reaper.plan import Action
from cni_reaper.repair import quarantine
from tests.crashed import Crashed
from tests.nodetree import CONTAINER_IDS, snapshot
from tests.private_node import damage

KNOWN, OTHER = CONTAINER_IDS[0], CONTAINER_IDS[1]
BOOT_ID = "11111111-2222-3333-4444-555555555555"


def scratch_bytes(network: str = "hl") -> bytes:
    """What Multus's ADD saves (saveScratchNetConf): its delegates, marshalled by Go's
    encoding/json from []*types.DelegateNetConf (field names as the struct has them)."""
    conflist = {"cniVersion": "0.3.1", "name": network, "plugins": [{"type": "host-local"}]}
    delegate = {
        "Conf": {"cniVersion": "", "name": "", "type": ""},
        "ConfList": conflist,
        "Name": network,
        "IsFilterV4Gateway": False,
        "IsFilterV6Gateway": False,
        "Bytes": base64.b64encode(json.dumps(conflist).encode()).decode(),
    }
    return json.dumps([delegate], separators=(",", ":")).encode()


class ScratchNode:
    def __init__(self, crashed: Crashed) -> None:
        self.crashed = crashed
        self.dir = crashed.node.root / "var/lib/cni/multus"
        self.quarantine = crashed.node.quarantine / BOOT_ID / "multus"

    def scratch(self, container_id: str, data: bytes | None = None) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        path = self.dir / container_id
        path.write_bytes(scratch_bytes() if data is None else data)
        path.chmod(0o600)
        return path

    def damaged(self, container_id: str = KNOWN, how: str = "empty") -> Path:
        path = self.scratch(container_id)
        damage(path, how)
        return path

    def runtime_started_with_a_record(self) -> None:
        """The reboot; this boot's first run recorded the Multus dir; then containerd started."""
        crashed = self.crashed
        crashed.reboot()
        crashed.node.record_before_runtime(crashed.t0 + 20, self.dir)
        crashed.node.runtime_starts()


@pytest.fixture
def node(crashed: Crashed) -> ScratchNode:
    return ScratchNode(crashed)


def scratch_docs(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {Path(d["path"]).name: d for d in report["multus_scratch"]}


@pytest.fixture
def interference() -> Iterator[None]:
    yield
    failpoint.interfere(quarantine.SIDECAR_WRITTEN, None)


@pytest.mark.parametrize("how", ["empty", "zeroed", "truncated"])
def test_a_damaged_scratch_file_of_an_earlier_boot_is_moved_aside(
    node: ScratchNode, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    path = node.damaged(KNOWN, how)
    damaged = path.read_bytes()
    node.crashed.reboot()

    code, report = node.crashed.run(capsys)

    assert code == ExitCode.OK, report
    doc = scratch_docs(report)[KNOWN]
    assert (doc["content"], doc["written"]) == (how, "previous-boot")
    assert (doc["action"], doc["outcome"]) == ("quarantine", "done"), doc
    assert doc["container_id"] == KNOWN
    assert "Multus's DEL cannot read the delegates from it" in doc["reason"]
    moved = node.quarantine / KNOWN
    assert doc["quarantined_to"] == str(moved)
    assert not path.exists()
    assert moved.read_bytes() == damaged
    sidecar = json.loads((node.quarantine / f"{KNOWN}.json").read_text())
    assert (sidecar["path"], sidecar["outcome"], sidecar["content"]) == (str(path), "done", how)
    assert report["summary"]["multus_scratch"] == {"quarantine/done": 1}
    assert report["summary"]["multus_results"] == {}
    assert report["multus_results"] == []


def test_a_whole_scratch_file_is_kept_and_shown_with_v(
    node: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    path = node.scratch(KNOWN)
    before = path.read_bytes()
    node.crashed.reboot()

    code, quiet = node.crashed.run(capsys)
    _, verbose = node.crashed.run(capsys, "-v")

    assert code == ExitCode.OK
    assert quiet["summary"]["multus_scratch"] == {"keep/skipped": 1}
    doc = scratch_docs(verbose)[KNOWN]
    assert (doc["content"], doc["action"]) == ("valid", "keep"), doc
    assert doc["content_detail"] == "a JSON list of 1 items"
    assert path.read_bytes() == before and not node.quarantine.exists()


def test_only_files_named_by_a_container_id_are_looked_at(
    node: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing else in Multus's dir is a scratch file: an empty file of another name is no
    sandbox's, and is neither moved nor listed."""
    names = ("multus.kubeconfig", KNOWN[:63], "AB" * 32, f"{KNOWN}-eth0", f"{KNOWN}.tmp")
    others = [node.scratch(name, b"") for name in names]
    node.crashed.reboot()

    code, report = node.crashed.run(capsys, "-v")

    assert code == ExitCode.OK
    assert report["multus_scratch"] == []
    assert all(p.exists() for p in others)


def test_whole_json_that_is_no_list_is_reported_and_never_touched(
    node: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    """No crash makes whole JSON of another shape: a format this reaper does not know."""
    path = node.scratch(KNOWN, b'{"delegates": []}')
    node.crashed.reboot()

    code, report = node.crashed.run(capsys)

    doc = scratch_docs(report)[KNOWN]
    assert (doc["content"], doc["action"], doc["outcome"]) == ("mismatched", "report", "skipped")
    assert path.read_bytes() == b'{"delegates": []}'
    assert code == ExitCode.DATA


def test_one_written_in_this_boot_is_left(
    node: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed = node.crashed
    before = node.damaged(KNOWN)
    node.runtime_started_with_a_record()
    fresh = node.damaged(OTHER, "truncated")  # after the record: may be in flight

    code, report = crashed.run(capsys, "--force")

    found = scratch_docs(report)
    assert (found[KNOWN]["action"], found[KNOWN]["outcome"]) == ("quarantine", "done")
    assert not before.exists()
    doc = found[OTHER]
    assert (doc["written"], doc["action"], doc["outcome"]) == ("current-boot", "leave", "skipped")
    assert "may be a write still in flight" in doc["reason"]
    assert fresh.stat().st_size > 0
    assert code == ExitCode.DATA


def test_one_rewritten_after_the_record_is_left(
    node: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed = node.crashed
    path = node.damaged(KNOWN)
    node.runtime_started_with_a_record()
    os.utime(path, ns=(1, 1))  # rewritten in place, the same bytes: another write

    code, report = crashed.run(capsys, "--force")

    doc = scratch_docs(report)[KNOWN]
    assert (doc["written"], doc["action"]) == ("current-boot", "leave"), doc
    assert path.exists() and not node.quarantine.exists()
    assert code == ExitCode.DATA


def test_one_of_a_container_with_live_task_state_is_left(
    node: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed = node.crashed
    path = node.damaged(KNOWN)
    node.runtime_started_with_a_record()
    task = crashed.node.root / "run/containerd/io.containerd.runtime.v2.task/k8s.io" / KNOWN
    task.mkdir(parents=True)

    code, report = crashed.run(capsys, "--force")

    doc = scratch_docs(report)[KNOWN]
    assert (doc["action"], doc["outcome"]) == ("leave", "skipped"), doc
    assert "may be alive" in doc["reason"]
    assert path.exists() and not node.quarantine.exists()
    assert code == ExitCode.DATA


def test_a_runtime_that_started_in_this_boot_before_any_record_holds_every_move_back(
    node: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed = node.crashed
    path = node.damaged(KNOWN)
    crashed.reboot()
    crashed.node.runtime_starts()  # no reaper ran before it: nothing is proven

    code, report = crashed.run(capsys, "--force")

    doc = scratch_docs(report)[KNOWN]
    assert (doc["written"], doc["action"]) == ("unknown", "leave"), doc
    assert path.exists() and not node.quarantine.exists()
    assert code == ExitCode.DATA


def test_what_is_not_a_file_is_reported_and_never_followed(
    node: ScratchNode, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"")
    node.dir.mkdir(parents=True, mode=0o700)
    link = node.dir / KNOWN
    link.symlink_to(outside)
    fifo = node.dir / OTHER
    os.mkfifo(fifo)
    inside = node.dir / CONTAINER_IDS[2]
    inside.mkdir()
    (inside / "precious").write_text("keep me")
    node.crashed.reboot()

    code, report = node.crashed.run(capsys)

    found = scratch_docs(report)
    for path in (link, fifo, inside):
        doc = found[path.name]
        assert (doc["content"], doc["action"], doc["outcome"]) == (
            "not-a-file",
            "report",
            "skipped",
        )
    assert link.is_symlink() and outside.exists() and fifo.exists()
    assert (inside / "precious").read_text() == "keep me"
    assert code == ExitCode.DATA


@pytest.mark.parametrize("kind", ["absolute", "relative-out-of-root"])
def test_a_multus_dir_symlinked_out_of_the_root_is_never_followed(
    node: ScratchNode, capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str
) -> None:
    """On a rescue box, ROOT/var/lib/cni/multus -> /var/lib/cni/multus names this machine's
    scratch files, not the node's."""
    host = tmp_path / "this-machine" / "multus"
    host.mkdir(parents=True, mode=0o700)
    victim = host / KNOWN
    victim.write_bytes(b"")
    node.dir.parent.mkdir(parents=True, exist_ok=True)
    if kind == "absolute":
        node.dir.symlink_to(host)
    else:
        node.dir.symlink_to(os.path.relpath(host, node.dir.parent))
    node.crashed.reboot()

    code, report = node.crashed.run(capsys)

    assert victim.exists(), "a file outside --root was moved"
    assert report["multus_scratch"] == []
    assert any("Multus's cache" in w for w in report["warnings"]), report["warnings"]
    assert code == ExitCode.OK


def test_a_multus_dir_others_can_write_is_not_acted_on(
    node: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    path = node.damaged(KNOWN)
    node.dir.chmod(0o777)
    node.crashed.reboot()

    code, report = node.crashed.run(capsys)

    assert report["multus_scratch"] == []
    assert path.exists()
    said = f"Multus's cache {node.dir}: multus is writable by group or others"
    assert any(w.startswith(said) for w in report["warnings"]), report["warnings"]
    assert code == ExitCode.OK


def test_a_results_dir_that_cannot_be_looked_at_leaves_the_scratch_files_too(
    node: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    path = node.damaged(KNOWN)
    (node.dir / "results").write_bytes(b"not a dir")
    node.crashed.reboot()

    code, report = node.crashed.run(capsys)

    assert report["multus_scratch"] == []
    assert path.exists()
    assert any("Multus's delegate results" in w for w in report["warnings"]), report["warnings"]
    assert code == ExitCode.OK


@pytest.mark.parametrize("how", ["replaced", "rewritten-whole", "touched"])
def test_one_that_changes_just_before_its_move_stays(
    node: ScratchNode,
    capsys: pytest.CaptureFixture[str],
    interference: None,
    how: str,
) -> None:
    path = node.damaged(KNOWN)
    node.crashed.reboot()

    def change() -> None:
        if how == "replaced":
            path.unlink()
            path.write_bytes(b"")
        elif how == "rewritten-whole":
            path.write_bytes(scratch_bytes())
        else:
            os.utime(path, ns=(1, 1))

    failpoint.interfere(quarantine.SIDECAR_WRITTEN, change)

    code, report = node.crashed.run(capsys)

    doc = scratch_docs(report)[KNOWN]
    assert doc["outcome"] == "skipped", doc
    assert "changed" in (doc["problem"] or ""), doc
    assert doc["quarantined_to"] is None
    assert path.exists()
    if how == "rewritten-whole":
        assert path.read_bytes() == scratch_bytes()
    assert not node.quarantine.exists() or not any(
        p for p in node.quarantine.iterdir() if not p.name.endswith(".json")
    )
    assert code == ExitCode.DATA


def test_a_file_of_that_name_in_the_quarantine_is_never_overwritten(
    node: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    path = node.damaged(KNOWN)
    node.quarantine.mkdir(parents=True)
    (node.quarantine / KNOWN).write_bytes(b"an earlier one")
    node.crashed.reboot()

    code, report = node.crashed.run(capsys)

    doc = scratch_docs(report)[KNOWN]
    assert doc["outcome"] == "done", doc
    assert (node.quarantine / KNOWN).read_bytes() == b"an earlier one"
    assert doc["quarantined_to"] != str(node.quarantine / KNOWN)
    assert Path(doc["quarantined_to"]).read_bytes() == b""
    assert not path.exists()
    assert code == ExitCode.OK


def test_a_dry_run_plans_the_move_and_writes_nothing(
    node: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    node.damaged(KNOWN)
    node.crashed.reboot()
    before = snapshot(node.crashed.node.root)

    code, report = node.crashed.run(capsys, "--dry-run")

    assert code == ExitCode.OK
    doc = scratch_docs(report)[KNOWN]
    assert (doc["action"], doc["outcome"]) == ("quarantine", "planned")
    assert report["summary"]["multus_scratch"] == {"quarantine/planned": 1}
    assert snapshot(node.crashed.node.root) == before


def test_a_second_run_in_the_same_boot_finds_it_gone_and_does_nothing_more(
    node: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    node.damaged(KNOWN)
    node.crashed.reboot()
    first_code, first = node.crashed.run(capsys)
    moved = sorted(node.quarantine.iterdir())

    code, report = node.crashed.run(capsys)

    assert (first_code, code) == (ExitCode.OK, ExitCode.OK)
    assert scratch_docs(first)[KNOWN]["outcome"] == "done"
    assert report["multus_scratch"] == []
    assert sorted(node.quarantine.iterdir()) == moved


def test_the_text_report_and_the_log_say_it(
    node: ScratchNode, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed = node.crashed
    path = node.damaged(KNOWN)
    crashed.reboot()
    log = io.StringIO()

    code = cli.run(
        crashed.argv(), clock=lambda: crashed.t0 + 60, events=EventLog(stream=log), environ={}
    )

    text = capsys.readouterr().out
    assert code == ExitCode.OK
    assert f"{path}: Multus scratch file empty, previous-boot -> quarantine [done]" in text
    assert f"moved to {node.quarantine / KNOWN}" in text
    assert "Multus scratch files: 1 done, 0 failed, 0 left alone" in text
    (line,) = [ln for ln in log.getvalue().splitlines() if ln.startswith(f"cni-reaper: {path}:")]
    for field in (
        f"cni_containerid={KNOWN}",
        "cni_reaper_action=quarantine-multus-scratch",
        "cni_reaper_outcome=done",
        "cni_reaper_event=repaired",
    ):
        assert field in line, line
    assert "cni_network=" not in line and "cni_ifname=" not in line


# The policy and the verdict, over their whole input space.


@given(
    st.sampled_from(list(Content)),
    st.sampled_from(list(Written)),
    st.sampled_from([None, "its task is running"]),
)
def test_only_damage_an_earlier_boot_left_of_no_live_sandbox_is_ever_moved(
    content: Content, written: Written, alive: str | None
) -> None:
    entry = ScratchFile(KNOWN, UNKNOWN_FILE, ContentVerdict(content, "detail"))
    planned = plan_scratch(entry, WrittenVerdict(written, "evidence"), lambda _: alive)
    moved = planned.action is Action.QUARANTINE
    assert moved == (content.is_corrupt and written is Written.PREVIOUS_BOOT and alive is None)
    assert planned.action in (Action.KEEP, Action.QUARANTINE, Action.LEAVE, Action.REPORT)
    if content is Content.VALID:
        assert planned.action is Action.KEEP
    elif not content.is_corrupt:
        assert planned.action is Action.REPORT


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=12,
)


@given(st.lists(JSON, max_size=4), st.data())
def test_a_cut_or_zero_filled_scratch_file_is_damage_and_a_whole_one_is_not(
    delegates: list[Any], data: st.DataObject
) -> None:
    """What truncate-and-write leaves after a crash: any cut of the file, with or without the
    rest of its length NUL-filled; never a whole list."""
    whole = json.dumps(delegates).encode()
    assert scratch_verdict(whole).content is Content.VALID
    cut = data.draw(st.integers(0, len(whole) - 1))
    padded = data.draw(st.booleans())
    damaged = whole[:cut] + (b"\0" * (len(whole) - cut) if padded else b"")
    assert scratch_verdict(damaged).content.is_corrupt


@given(st.binary(max_size=64) | JSON.map(lambda doc: json.dumps(doc).encode()))
def test_any_bytes_get_a_verdict_and_only_a_whole_list_is_valid(data: bytes) -> None:
    verdict = scratch_verdict(data)
    if verdict.content is Content.VALID:
        assert type(json.loads(data)) is list
    else:
        assert verdict.content.is_corrupt or verdict.content is Content.MISMATCHED
