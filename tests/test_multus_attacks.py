"""Attacks on the Multus delegate-results repair (cni_reaper/multus.py, multus_repair.py): an
attacker's or an unlucky operator's node, each scenario asserting what the safety invariants
(shared/DESIGN.md) say must hold. Real files, real runs, the real libcni 1.1.2."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from cni_reaper import cli, pre_runtime
from cni_reaper.errors import ExitCode
from tests.crashed import Crashed, pin_netns
from tests.nodetree import CONTAINER_IDS, cache_entry_bytes, snapshot
from tests.private_node import damage
from tests.real_libcni import LibcniClient
from tests.test_multus import BOOT_ID, KNOWN, MultusNode, delegates

OTHER = CONTAINER_IDS[1]


@pytest.fixture
def multus_node(crashed: Crashed, libcni_client: LibcniClient) -> MultusNode:
    return MultusNode(crashed, libcni_client)


def damaged_delegate(node: MultusNode, container_id: str = KNOWN, how: str = "empty") -> Path:
    result = node.delegate(container_id)
    damage(result, how)
    return result


def multus_results(node: MultusNode) -> str:
    return str(node.cache_dir / "results")


# 1. --root on a rescue box: the multus/ component of the path is a symlink.


@pytest.mark.parametrize("kind", ["absolute", "relative-out-of-root"])
def test_a_multus_dir_symlinked_out_of_the_root_is_never_followed(
    multus_node: MultusNode, capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str
) -> None:
    """On a rescue box, ROOT/var/lib/cni/multus -> /var/lib/cni/multus (absolute, as the node
    resolves it) names THIS machine's Multus cache, not the node's. paths.build resolves
    cache_dir inside the root; the multus/ component after it must be resolved the same way
    (or refused), never followed from here."""
    crashed = multus_node.crashed
    host = tmp_path / "this-machine" / "multus"
    (host / "results").mkdir(parents=True, mode=0o700)
    victim = host / "results" / f"hl-{KNOWN}-eth0"
    victim.write_bytes(b"")  # a damaged delegate result of THIS machine
    victim.chmod(0o600)
    link = crashed.node.root / "var/lib/cni/multus"
    link.parent.mkdir(parents=True, exist_ok=True)
    if kind == "absolute":
        link.symlink_to(host)  # as the node reads it: ROOT + host, which does not exist
    else:
        link.symlink_to(os.path.relpath(host, link.parent))  # climbs out of the root
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert victim.exists(), "a file outside --root was moved"
    moved_outside = [d for d in report["multus_results"] if d["path"].startswith(str(host))]
    assert moved_outside == [], moved_outside
    assert code != ExitCode.ACTION_FAILED


def test_a_multus_dir_that_is_a_symlink_to_the_cache_dir_does_not_move_results_entries(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """multus -> . makes multus/results the runtime's results dir: its damaged entries must
    go through the results path (DEL, then quarantine), never be moved without a DEL by the
    delegate path."""
    damaged = crashed.add(KNOWN)
    damaged.write_bytes(b"")
    (crashed.node.root / "var/lib/cni/multus").symlink_to(".")
    crashed.reboot()

    code, report = crashed.run(capsys)

    (entry,) = [e for e in report["entries"] if Path(e["path"]).name == damaged.name]
    fates = [(r["action"], r["outcome"], r["reason"]) for r in report["host_local"]]
    assert entry["outcome"] != "skipped", (entry.get("error"), entry.get("del"), fates)
    moved = [d["path"] for d in report["multus_results"] if d["outcome"] == "done"]
    assert moved == [], moved
    assert (entry["action"], entry["outcome"]) == ("del-and-quarantine", "done"), entry
    assert code == ExitCode.OK


# 2. Liveness: a live sandbox's delegate result.


def test_a_delegate_result_of_a_container_with_live_task_state_is_left(
    multus_node: MultusNode, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed = multus_node.crashed
    result = damaged_delegate(multus_node)
    crashed.reboot()
    crashed.node.record_before_runtime(crashed.t0 + 20, result.parent)
    crashed.node.runtime_starts()
    task = crashed.node.root / "run/containerd/io.containerd.runtime.v2.task/k8s.io" / KNOWN
    task.mkdir(parents=True)

    code, report = crashed.run(capsys, "--force")

    doc = delegates(report)[result.name]
    assert (doc["action"], doc["outcome"]) == ("leave", "skipped"), doc
    assert "may be alive" in doc["reason"]
    assert result.exists() and not multus_node.quarantine.exists()
    assert code == ExitCode.DATA


def test_a_delegate_result_of_a_sandbox_whose_netns_is_still_mounted_is_left(
    multus_node: MultusNode,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariant 2: a mounted netns stops the repair of every file of its sandbox. The
    results path checks the netns the sandbox's whole entries cache (here Multus's own entry);
    the delegate path must too ("same liveness as a results entry")."""
    crashed = multus_node.crashed
    result = damaged_delegate(multus_node)
    pin = f"cni-{KNOWN[:8]}"
    conf = json.dumps({"cniVersion": "1.0.0", "name": "multus-cni-network", "type": "multus"})
    crashed.node.write_result(
        f"multus-cni-network-{KNOWN}-eth0",
        cache_entry_bytes(
            conf.encode(), "multus-cni-network", KNOWN, "eth0", netns=f"/var/run/netns/{pin}"
        ),
    )
    # A sibling damaged results entry of the same sandbox, for comparison.
    sibling = crashed.node.write_result(f"hl-{KNOWN}-eth1", b"")
    crashed.reboot()
    crashed.node.record_before_runtime(crashed.t0 + 20, result.parent)
    crashed.node.runtime_starts()
    pin_netns(crashed, monkeypatch, tmp_path, pin)

    code, report = crashed.run(capsys, "--force")

    (entry,) = [e for e in report["entries"] if Path(e["path"]).name == sibling.name]
    assert "still mounted" in entry["reason"], entry  # the results path holds it back
    doc = delegates(report)[result.name]
    assert (doc["action"], doc["outcome"]) == ("leave", "skipped"), doc
    assert result.exists(), "a delegate result of a sandbox whose netns is mounted was moved"
    assert code == ExitCode.DATA


# 3. The pre-runtime record: a runtime starts mid-scan; the file changes after the record.


def test_a_runtime_starting_after_the_delegates_were_judged_holds_the_move_back(
    multus_node: MultusNode, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    crashed = multus_node.crashed
    result = multus_node.crash_damages_a_known_pods_delegate("empty")
    judge = cli._Delegates.judge

    def then_containerd_starts(self: Any, *args: Any) -> None:
        judge(self, *args)
        crashed.node.runtime_starts()  # containerd makes /run/containerd: evidence for confirm

    monkeypatch.setattr(cli._Delegates, "judge", then_containerd_starts)

    code, report = crashed.run(capsys)

    doc = delegates(report)[result.name]
    assert (doc["action"], doc["outcome"]) == ("leave", "skipped"), doc
    assert "not proven to predate this boot" in doc["reason"]
    assert doc["written"] == "unknown"
    assert result.exists() and not multus_node.quarantine.exists()
    assert code == ExitCode.DATA


def test_a_delegate_result_rewritten_in_place_after_the_record_is_left(
    multus_node: MultusNode, capsys: pytest.CaptureFixture[str]
) -> None:
    """Recorded whole before the runtime; damaged in this boot (same inode): not proven."""
    crashed = multus_node.crashed
    result = multus_node.delegate(KNOWN)
    crashed.reboot()
    crashed.node.record_before_runtime(crashed.t0 + 20, result.parent)
    crashed.node.runtime_starts()
    with open(result, "r+b") as f:  # same inode, as a crash mid-write of this boot leaves it
        f.truncate(0)

    code, report = crashed.run(capsys)

    doc = delegates(report)[result.name]
    assert (doc["written"], doc["action"], doc["outcome"]) == ("current-boot", "leave", "skipped")
    assert result.exists() and not multus_node.quarantine.exists()
    assert code == ExitCode.DATA


def test_a_delegate_dir_not_in_the_record_proves_nothing(
    multus_node: MultusNode, capsys: pytest.CaptureFixture[str]
) -> None:
    """The record was taken with no Multus dir (only the results dir): whatever is in one now
    was written since a runtime could start."""
    crashed = multus_node.crashed
    crashed.reboot()
    crashed.node.record_before_runtime(crashed.t0 + 20)
    crashed.node.runtime_starts()
    result = damaged_delegate(multus_node)

    code, report = crashed.run(capsys)

    doc = delegates(report)[result.name]
    assert (doc["written"], doc["action"]) == ("current-boot", "leave"), doc
    assert result.exists()
    assert code == ExitCode.DATA


def test_a_recreated_delegate_dir_proves_nothing(
    multus_node: MultusNode, capsys: pytest.CaptureFixture[str]
) -> None:
    """Recorded, then the whole results dir replaced by one with the same names (a new inode):
    the record's identities of its files must not carry over."""
    crashed = multus_node.crashed
    result = damaged_delegate(multus_node)
    crashed.reboot()
    crashed.node.record_before_runtime(crashed.t0 + 20, result.parent)
    crashed.node.runtime_starts()
    old = result.parent.with_name("results.old")
    result.parent.rename(old)
    result.parent.mkdir(mode=0o700)
    os.link(old / result.name, result)  # same inode, size, mtime: only ctime and the dir differ

    code, report = crashed.run(capsys)

    doc = delegates(report)[result.name]
    assert doc["action"] == "leave", doc
    assert result.exists()
    assert code == ExitCode.DATA


# 4. Between the scan and the move.


@pytest.mark.parametrize("how", ["replaced", "rewritten-valid", "rewritten-empty"])
def test_a_delegate_result_that_changes_before_its_move_stays(
    multus_node: MultusNode,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    how: str,
) -> None:
    crashed = multus_node.crashed
    result = multus_node.delegate(KNOWN)
    whole = result.read_bytes()
    damage(result, "empty")
    multus_node.containerd_knows(KNOWN)
    crashed.reboot()
    confirm = pre_runtime.confirm

    def then_changed(*args: Any) -> Any:
        veto = confirm(*args)  # the last look before the damaged delegate results move
        if how == "replaced":
            result.unlink()
            result.write_bytes(b"")
        elif how == "rewritten-valid":
            result.write_bytes(whole)
        else:
            os.utime(result, ns=(1, 1))  # same bytes, another mtime: another write
        return veto

    monkeypatch.setattr(pre_runtime, "confirm", then_changed)

    code, report = crashed.run(capsys)

    doc = delegates(report)[result.name]
    assert doc["outcome"] == "skipped", doc
    assert "changed" in (doc["problem"] or ""), doc
    assert doc["quarantined_to"] is None
    assert result.exists()
    assert not multus_node.quarantine.exists() or not any(multus_node.quarantine.iterdir())
    assert code == ExitCode.DATA


# 5. What lies in the Multus results dir.


def test_a_hard_linked_delegate_result_loses_nothing(
    multus_node: MultusNode, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    crashed = multus_node.crashed
    result = damaged_delegate(multus_node, how="truncated")
    data = result.read_bytes()
    other = crashed.node.root / "var/lib/cni/elsewhere"
    os.link(result, other)
    multus_node.containerd_knows(KNOWN)
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert other.read_bytes() == data
    doc = delegates(report)[result.name]
    if doc["outcome"] == "done":
        assert Path(doc["quarantined_to"]).read_bytes() == data
    else:
        assert result.read_bytes() == data
    assert code in (ExitCode.OK, ExitCode.DATA)


def test_a_directory_named_as_a_delegate_result_is_never_touched(
    multus_node: MultusNode, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed = multus_node.crashed
    results = multus_node.cache_dir / "results"
    results.mkdir(parents=True, mode=0o700)
    inside = results / f"hl-{KNOWN}-eth0"
    inside.mkdir()
    (inside / "precious").write_text("keep me")
    crashed.reboot()

    code, report = crashed.run(capsys)

    doc = delegates(report)[inside.name]
    assert (doc["content"], doc["action"], doc["outcome"]) == ("not-a-file", "report", "skipped")
    assert (inside / "precious").read_text() == "keep me"
    assert code == ExitCode.DATA


def test_a_multus_results_path_that_is_a_file_keeps_every_reservation(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Multus cache that cannot be looked at: reservations count as Multus's (doubt keeps)."""
    result = crashed.add(KNOWN)
    result.unlink()  # an address with no results entry: an orphan, but for Multus
    multus = crashed.node.root / "var/lib/cni/multus"
    multus.mkdir(parents=True)
    (multus / "results").write_bytes(b"not a dir")
    held = crashed.ips()
    crashed.reboot()

    code, report = crashed.run(capsys, "-v")

    assert any("Multus's delegate results" in w for w in report["warnings"]), report["warnings"]
    assert crashed.ips() == held
    (reservation,) = report["host_local"]
    assert reservation["action"] == "keep", reservation
    assert code != ExitCode.ACTION_FAILED


# 6. The quarantine.


def test_a_file_already_in_the_multus_quarantine_is_never_overwritten(
    multus_node: MultusNode, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed = multus_node.crashed
    result = multus_node.crash_damages_a_known_pods_delegate("empty")
    multus_node.quarantine.mkdir(parents=True, mode=0o700)
    precious = multus_node.quarantine / result.name
    precious.write_text("an earlier run's quarantined file")
    (multus_node.quarantine / f"{result.name}.json").write_text('{"sha256": "x"}')

    code, report = crashed.run(capsys)

    assert precious.read_text() == "an earlier run's quarantined file"
    doc = delegates(report)[result.name]
    assert (doc["outcome"], doc["quarantined_to"]) == (
        "done",
        str(multus_node.quarantine / f"{result.name}.1"),
    ), doc
    assert (multus_node.quarantine / f"{result.name}.1").read_bytes() == b""
    sidecar = json.loads((multus_node.quarantine / f"{result.name}.1.json").read_text())
    assert sidecar["path"] == str(result)
    assert code == ExitCode.OK


def test_a_boot_dir_swapped_for_a_symlink_takes_no_multus_file_out_of_the_state_dir(
    multus_node: MultusNode, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The quarantine's boot dir is a symlink to a dir elsewhere that already holds multus/:
    the move is refused and says why, the file stays, nothing lands where the symlink points."""
    crashed = multus_node.crashed
    result = multus_node.crash_damages_a_known_pods_delegate("empty")
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "multus").mkdir(parents=True)
    boot_dir = multus_node.quarantine.parent
    boot_dir.parent.mkdir(parents=True, mode=0o700)
    boot_dir.symlink_to(elsewhere)

    code, report = crashed.run(capsys)

    doc = delegates(report)[result.name]
    assert (doc["outcome"], doc["quarantined_to"]) == ("failed", None), doc
    assert str(boot_dir) in doc["problem"] and "symlink" in doc["problem"], doc
    assert result.exists()
    assert list(elsewhere.rglob("*")) == [elsewhere / "multus"]
    assert code == ExitCode.ACTION_FAILED


def test_a_same_bytes_copy_in_the_quarantine_is_not_taken_for_this_file(
    multus_node: MultusNode, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty file already quarantined under the same name (its sidecar's sha256 is every
    empty file's): this file must get its own copy and sidecar, not be unlinked as 'already
    copied', with the report pointing at another file's sidecar."""
    crashed = multus_node.crashed
    result = multus_node.crash_damages_a_known_pods_delegate("empty")
    multus_node.quarantine.mkdir(parents=True, mode=0o700)
    earlier = multus_node.quarantine / result.name
    earlier.write_bytes(b"")
    empty_sha = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    earlier_sidecar = {"sha256": empty_sha, "path": "/somewhere/else", "container_id": "other"}
    (multus_node.quarantine / f"{result.name}.json").write_text(json.dumps(earlier_sidecar))

    code, report = crashed.run(capsys)

    doc = delegates(report)[result.name]
    assert doc["outcome"] == "done", doc
    sidecar = json.loads(Path(doc["quarantined_to"] + ".json").read_text())
    assert sidecar["path"] == str(result), (doc["quarantined_to"], sidecar)
    assert code == ExitCode.OK


@pytest.mark.parametrize("how", ["file", "symlink"])
def test_a_multus_quarantine_that_cannot_be_used_fails_the_move_and_says_so(
    multus_node: MultusNode,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    how: str,
) -> None:
    crashed = multus_node.crashed
    result = multus_node.crash_damages_a_known_pods_delegate("empty")
    multus_node.quarantine.parent.mkdir(parents=True, mode=0o700)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if how == "file":
        multus_node.quarantine.write_text("in the way")
    else:
        multus_node.quarantine.symlink_to(elsewhere)

    code, report = crashed.run(capsys)

    doc = delegates(report)[result.name]
    assert (doc["action"], doc["outcome"]) == ("quarantine", "failed"), doc
    assert doc["quarantined_to"] is None and doc["problem"]
    assert result.exists() and list(elsewhere.iterdir()) == []
    assert report["summary"]["multus_results"] == {"quarantine/failed": 1}
    assert code == ExitCode.ACTION_FAILED


# 7. Runs: a second in the same boot, a dry run, many files.


def test_a_second_run_in_the_same_boot_keeps_the_delegates_reservation_for_multus(
    multus_node: MultusNode, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run 1 moves the damaged delegate result and keeps its address for Multus's DEL (the
    sandbox's Multus entry is whole, containerd knows it). Run 2, in the same boot, finds the
    same node but for the file run 1 moved: Multus's DEL still releases that address; the
    reaper must not now call it an orphan and release it behind the runtime's back."""
    crashed = multus_node.crashed
    result = damaged_delegate(multus_node)
    multus_node.containerd_knows(KNOWN)
    held = crashed.ips()
    crashed.reboot()

    _, report1 = crashed.run(capsys, "-v")
    assert delegates(report1)[result.name]["outcome"] == "done"
    (first,) = report1["host_local"]
    assert first["action"] == "keep"
    assert crashed.ips() == held

    code2, report2 = crashed.run(capsys, "-v")

    assert report2["multus_results"] == []
    (second,) = report2["host_local"]
    assert (second["action"], second["outcome"]) == ("keep", "skipped"), second["reason"]
    assert crashed.ips() == held
    assert code2 == ExitCode.OK


@pytest.mark.parametrize("sidecar", ["{", "[" * 2000 + "]" * 2000, '{"path": 5}'])
def test_a_sidecar_that_cannot_be_read_keeps_the_delegates_reservation_for_multus(
    multus_node: MultusNode, capsys: pytest.CaptureFixture[str], sidecar: str
) -> None:
    """As above, but the sidecar of the file run 1 moved no longer says where that file was:
    which delegate results runs moved aside cannot be told, and every one counts as moved (a
    sidecar that could not be read was skipped, its delegate's address called an orphan's)."""
    crashed = multus_node.crashed
    result = damaged_delegate(multus_node)
    multus_node.containerd_knows(KNOWN)
    held = crashed.ips()
    crashed.reboot()
    _, report1 = crashed.run(capsys, "-v")
    moved_to = delegates(report1)[result.name]["quarantined_to"]
    Path(moved_to + ".json").write_text(sidecar)

    code2, report2 = crashed.run(capsys, "-v")

    (second,) = report2["host_local"]
    assert second["action"] == "keep", second["reason"]
    assert crashed.ips() == held
    assert code2 == ExitCode.OK


def test_a_dry_run_changes_nothing_anywhere(
    multus_node: MultusNode, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed = multus_node.crashed
    damaged_delegate(multus_node)
    damaged_delegate(multus_node, OTHER, "zeroed")
    multus_node.containerd_knows(KNOWN, OTHER)
    crashed.reboot()
    before = snapshot(crashed.node.root)

    code, report = crashed.run(capsys, "--dry-run")

    assert snapshot(crashed.node.root) == before
    assert report["summary"]["multus_results"] == {"quarantine/planned": 2}
    assert code == ExitCode.OK


def test_many_damaged_delegate_results_are_all_moved_and_counted(
    multus_node: MultusNode, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed = multus_node.crashed
    results = multus_node.cache_dir / "results"
    results.mkdir(parents=True, mode=0o700)
    names = [f"hl-{i:064x}-net1" for i in range(1, 2001)]
    for name in names:
        (results / name).write_bytes(b"\0" * 64)
        (results / name).chmod(0o600)
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert report["summary"]["multus_results"] == {"quarantine/done": len(names)}
    assert os.listdir(results) == []
    moved = sorted(p.name for p in multus_node.quarantine.iterdir() if p.suffix != ".json")
    assert moved == sorted(names)
    assert code == ExitCode.OK


def test_the_text_report_and_exit_code_say_a_failed_move(
    multus_node: MultusNode, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed = multus_node.crashed
    result = multus_node.crash_damages_a_known_pods_delegate("empty")
    multus_node.quarantine.parent.mkdir(parents=True, mode=0o700)
    multus_node.quarantine.write_text("in the way")

    code = cli.run(crashed.argv(), clock=lambda: crashed.t0 + 60, environ={})

    text = capsys.readouterr().out
    assert code == ExitCode.ACTION_FAILED
    assert "Multus delegate results: 0 done, 1 failed" in text, text
    assert f"{result}: Multus delegate result empty, previous-boot -> quarantine [failed]" in text
    assert BOOT_ID in str(multus_node.quarantine)
