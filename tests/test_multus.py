"""Multus's cache of its delegates' results (cni_reaper/multus.py): a delegate's result the crash
left damaged aborts Multus's DEL of it in libcni 1.1.x, exactly as a damaged results entry
aborts the runtime's. The delegate here is ADDed and DELeted by the real libcni (Debian's 1.1.2,
tests/libcni_client) with Multus's cache dir, as Multus runs it, and real host-local."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_reaper import cli
from cni_reaper.boot import Written, WrittenVerdict
from cni_reaper.cache import CacheEntry
from cni_reaper.content import Content, ContentVerdict, Identity
from cni_reaper.errors import ExitCode
from cni_reaper.filestat import UNKNOWN_FILE
from cni_reaper.journal import EventLog
from cni_reaper.multus import plan_delegate
from cni_reaper.plan import Action
from tests.bolt_writer import containerd_sandbox, write_db
from tests.crashed import Crashed
from tests.nodetree import CONTAINER_IDS, PLUGIN_DIR, cache_entry_bytes
from tests.private_node import damage
from tests.real_libcni import LibcniClient, seed_error

KNOWN = CONTAINER_IDS[0]
BOOT_ID = "11111111-2222-3333-4444-555555555555"


class MultusNode:
    """A crashed node whose pod's network came from Multus: the runtime's entry is Multus's own,
    the delegate's result is in Multus's cache dir, made by the real libcni."""

    def __init__(self, crashed: Crashed, client: LibcniClient) -> None:
        self.crashed = crashed
        self.client = client
        root = crashed.node.root
        self.cache_dir = root / "var/lib/cni/multus"
        # The delegate's conflist as Multus hands it to libcni: host-local's store named, since
        # libcni_client runs it here, unconfined, and it must be the node's.
        conflist = json.loads((crashed.node.conf_dir / "10-hl.conflist").read_bytes())
        conflist["plugins"][0]["ipam"]["dataDir"] = str(crashed.ipam)
        self.conflist = root.parent / "delegate.conflist"
        self.conflist.write_text(json.dumps(conflist))
        self.quarantine = crashed.node.quarantine / BOOT_ID / "multus"

    def delegate(self, container_id: str) -> Path:
        """Multus's ADD of its delegate, and the runtime's entry for Multus."""
        added = self.run("add", container_id, netns=f"/run/netns/cni-{container_id[:8]}")
        assert added.ok, added.error
        multus = {"cniVersion": "0.3.1", "name": "multus-cni-network", "type": "multus"}
        conf = json.dumps(multus).encode()
        self.crashed.node.write_result(
            f"multus-cni-network-{container_id}-eth0",
            cache_entry_bytes(conf, "multus-cni-network", container_id, "eth0"),
        )
        return self.cache_dir / "results" / f"hl-{container_id}-eth0"

    def run(self, command: str, container_id: str, netns: str = "") -> Any:
        return self.client.run(
            command,
            container_id,
            "eth0",
            conflist=self.conflist,
            bin_dirs=(PLUGIN_DIR,),
            cache_dir=self.cache_dir,
            netns=netns,
        )

    def crash_damages_a_known_pods_delegate(self, how: str) -> Path:
        """A pod containerd knows, set up through Multus; the crash damaged its delegate's
        result; then the reboot. The damaged file."""
        result = self.delegate(KNOWN)
        self.containerd_knows(KNOWN)
        damage(result, how)
        self.crashed.reboot()
        return result

    def containerd_knows(self, *container_ids: str) -> None:
        meta_db = self.crashed.node.root / "var/lib/containerd/io.containerd.metadata.v1.bolt"
        meta_db.mkdir(parents=True)
        records = [containerd_sandbox("k8s.io", i) for i in container_ids]
        write_db(meta_db / "meta.db", [[op for ops in records for op in ops]])


@pytest.fixture
def multus_node(crashed: Crashed, libcni_client: LibcniClient) -> MultusNode:
    return MultusNode(crashed, libcni_client)


def delegates(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {Path(d["path"]).name: d for d in report["multus_results"]}


@pytest.mark.parametrize("how", ["empty", "zeroed", "truncated"])
def test_a_damaged_delegate_result_is_moved_aside_and_multus_del_then_frees_its_address(
    multus_node: MultusNode, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    crashed = multus_node.crashed
    result = multus_node.crash_damages_a_known_pods_delegate(how)
    held = crashed.ips()
    assert len(held) == 1
    # What the pod's teardown meets today, every time kubelet retries it.
    stuck = multus_node.run("del", KNOWN)
    assert stuck.error == seed_error("hl", how)

    code, report = crashed.run(capsys)

    assert code == ExitCode.OK, report
    doc = delegates(report)[result.name]
    assert (doc["content"], doc["written"]) == (how, "previous-boot")
    assert (doc["action"], doc["outcome"]) == ("quarantine", "done"), doc
    assert (doc["network"], doc["container_id"], doc["ifname"]) == ("hl", KNOWN, "eth0")
    moved = multus_node.quarantine / result.name
    assert doc["quarantined_to"] == str(moved)
    assert not result.exists()
    sidecar = json.loads((multus_node.quarantine / f"{result.name}.json").read_text())
    assert (sidecar["path"], sidecar["outcome"]) == (str(result), "done")
    assert report["summary"]["multus_results"] == {"quarantine/done": 1}
    # The reaper ran no DEL of it: the address is Multus's to release, and is still held.
    assert crashed.ips() == held
    assert report["host_local"] == []  # kept: listed only with -v
    # Multus's DEL of its delegate now runs with no cached result, and frees the address.
    freed = multus_node.run("del", KNOWN)
    assert freed.ok, freed.error
    assert crashed.ips() == {}


def test_the_delegates_reservation_stays_multus_to_release_after_the_move(
    multus_node: MultusNode, capsys: pytest.CaptureFixture[str]
) -> None:
    """The reservations are judged after the moves, on the names the dir held before them."""
    crashed = multus_node.crashed
    result = multus_node.crash_damages_a_known_pods_delegate("empty")
    held = crashed.ips()
    assert len(held) == 1

    code, report = crashed.run(capsys, "-v")

    assert code == ExitCode.OK, report
    assert delegates(report)[result.name]["outcome"] == "done"
    (reservation,) = report["host_local"]
    assert reservation["action"] == "keep", reservation
    assert f"Multus cached it as a delegate's ({result})" in reservation["reason"]
    assert crashed.ips() == held


def test_one_written_in_this_boot_is_left_and_said(
    multus_node: MultusNode, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed = multus_node.crashed
    before = multus_node.delegate(KNOWN)
    crashed.reboot()
    crashed.node.record_before_runtime(crashed.t0 + 20, before.parent)
    crashed.node.runtime_starts()
    fresh = multus_node.delegate(CONTAINER_IDS[1])  # after the record: may be in flight
    damage(fresh, "truncated")

    code, report = crashed.run(capsys)

    assert code == ExitCode.DATA
    found = delegates(report)
    assert found[before.name]["action"] == "keep"
    doc = found[fresh.name]
    assert (doc["written"], doc["action"], doc["outcome"]) == ("current-boot", "leave", "skipped")
    assert "may be a write still in flight" in doc["reason"]
    assert fresh.stat().st_size > 0 and not multus_node.quarantine.exists()


def test_a_dry_run_plans_the_move_and_moves_nothing(
    multus_node: MultusNode, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed = multus_node.crashed
    result = multus_node.crash_damages_a_known_pods_delegate("empty")

    code, report = crashed.run(capsys, "--dry-run")

    assert code == ExitCode.OK
    doc = delegates(report)[result.name]
    assert (doc["action"], doc["outcome"]) == ("quarantine", "planned")
    assert result.exists() and not multus_node.quarantine.exists()
    assert report["summary"]["multus_results"] == {"quarantine/planned": 1}


def test_what_is_not_a_file_is_reported_and_never_touched(
    multus_node: MultusNode, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    crashed = multus_node.crashed
    results = multus_node.cache_dir / "results"
    results.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.write_bytes(b"")
    link = results / f"hl-{KNOWN}-eth0"
    link.symlink_to(outside)
    fifo = results / f"hl-{CONTAINER_IDS[1]}-eth0"
    os.mkfifo(fifo)
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert code == ExitCode.DATA
    found = delegates(report)
    for path in (link, fifo):
        doc = found[path.name]
        assert (doc["content"], doc["action"], doc["outcome"]) == (
            "not-a-file",
            "report",
            "skipped",
        )
    assert link.is_symlink() and outside.exists() and fifo.exists()


def test_a_delegate_results_dir_others_can_write_is_not_acted_on(
    multus_node: MultusNode, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed = multus_node.crashed
    result = multus_node.delegate(KNOWN)
    damage(result, "empty")
    result.parent.chmod(0o777)
    crashed.reboot()

    code, report = crashed.run(capsys)

    assert report["multus_results"] == []
    assert result.exists()
    said = f"Multus's delegate results {result.parent}: results is writable by group or others"
    assert any(w.startswith(said) for w in report["warnings"]), report["warnings"]
    assert code == ExitCode.OK


def test_the_text_report_and_the_log_say_it(
    multus_node: MultusNode, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed = multus_node.crashed
    result = multus_node.crash_damages_a_known_pods_delegate("empty")
    log = io.StringIO()

    code = cli.run(
        crashed.argv(), clock=lambda: crashed.t0 + 60, events=EventLog(stream=log), environ={}
    )

    text = capsys.readouterr().out
    assert code == ExitCode.OK
    assert f"{result}: Multus delegate result empty, previous-boot -> quarantine [done]" in text
    assert f"moved to {multus_node.quarantine / result.name}" in text
    assert "Multus delegate results: 1 done, 0 failed, 0 left alone" in text
    (line,) = [ln for ln in log.getvalue().splitlines() if ln.startswith(f"cni-reaper: {result}:")]
    for field in (
        "cni_network=hl",
        f"cni_containerid={KNOWN}",
        "cni_reaper_action=quarantine-delegate-result",
        "cni_reaper_outcome=done",
        "cni_reaper_event=repaired",
    ):
        assert field in line, line


# The policy itself, over every verdict a file can get.

CONTENTS = st.sampled_from(list(Content))
WRITTEN = st.sampled_from(list(Written))
ALIVE = st.sampled_from([None, "its task is running"])
SPLITS = st.sampled_from([Identity("hl", KNOWN, "eth0"), None])


@given(CONTENTS, WRITTEN, ALIVE, SPLITS)
def test_only_damage_an_earlier_boot_left_of_no_live_sandbox_is_ever_moved(
    content: Content, written: Written, alive: str | None, split: Identity | None
) -> None:
    entry = CacheEntry(
        "name",
        UNKNOWN_FILE,
        ContentVerdict(content, "detail"),
        split,
        None if split else "cannot split",
    )
    planned = plan_delegate(entry, WrittenVerdict(written, "evidence"), lambda _: alive)
    moved = planned.action is Action.QUARANTINE
    assert moved == (
        content.is_corrupt
        and written is Written.PREVIOUS_BOOT
        and alive is None
        and split is not None
    )
    assert planned.action is not Action.DEL_AND_QUARANTINE  # no DEL of the reaper's, ever
    if content in (Content.VALID, Content.LEGACY):
        assert planned.action is Action.KEEP
    elif not content.is_corrupt:
        assert planned.action is Action.REPORT


def test_an_address_kept_because_the_quarantine_cannot_be_read_says_so(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """Multus keeps a cache here (empty), and the quarantine, whose sidecars say which of its
    files runs moved, is one others may write: which delegates' results were moved cannot be
    told, so an address no results entry names is kept, as doubt asks. An operator's review
    found it kept with no warning and the reason "Multus cached it as a delegate's (<the
    empty results dir>)", which nothing had; the address then leaked with exit 0."""
    crashed.add(CONTAINER_IDS[1]).unlink()  # its address: no results entry names it
    multus = crashed.node.root / "var/lib/cni/multus"
    (multus / "results").mkdir(parents=True, mode=0o700)
    multus.chmod(0o700)
    quarantine = crashed.node.root / "var/lib/cni-reaper/quarantine"
    quarantine.mkdir(parents=True)
    quarantine.chmod(0o777)
    crashed.reboot()
    held = crashed.ips()

    code, report = crashed.run(capsys, "-v", "--dry-run")

    assert code == ExitCode.OK  # kept, as an address of a delegate Multus will DEL
    (reservation,) = report["host_local"]
    assert reservation["action"] == "keep", reservation
    assert reservation["reason"].startswith("Multus may have cached it as a delegate's ("), (
        reservation
    )
    assert "the quarantine's record of those cannot be read" in reservation["reason"]
    (warning,) = [w for w in report["warnings"] if "which Multus files earlier runs moved" in w]
    assert f"({quarantine}: " in warning and "others" in warning, warning
    assert crashed.ips() == held
