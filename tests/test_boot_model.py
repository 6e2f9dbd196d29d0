"""A model test of the first safety invariant: a file written in the current boot is never DEL'd,
moved or released, whatever the wall clock, /proc/stat btime, wtmp, the clean-shutdown marker
and the file times say.

hypothesis draws a node's life: boots one after another, each with its own clock (true, stepped
forward or back during the boot, started in 1970 or at a saved clock as boards without an RTC
do, drifting), its btime and its boot records: wtmp, wtmpdb as Debian 13 writes it (the boot's
row written late, after the unit's first run, as wtmpdb-update-boot.service is not ordered
before it), both, or neither (a node that has neither, until the package is installed), lying
with the clock or true; whether the last boot shut down cleanly (wtmp record, wtmpdb Logout,
marker) or crashed, whether the unit ran before the runtime
or the runtime came first, which files the runtime wrote in the boot (new ones, rewrites of old
ones, with any mtime; reservations with and without a results file), whether the node has
runtime records (CRI-O's storage) and which sandboxes they hold, and several runs of the reaper
in the boot (at boot, by hand, dry or real, forced or not). Every run is the real CLI on a real
tree; DEL is a fake plugin that notes each container ID it is asked to delete. After each run:
no file the current boot wrote was planned for a change, DEL'd, moved or released, and the
report never calls it previous-boot; and no sandbox the runtime's records say it will DEL
itself had its whole entry DEL'd or moved, or an address it owns released.
"""

from __future__ import annotations

import io
import json
import os
import sqlite3
import uuid
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cni_reaper import cli
from cni_reaper.journal import EventLog
from tests.nodetree import NodeTree, cache_entry_bytes
from tests.private_node import cannot_run

CONF = json.dumps(
    {
        "cniVersion": "1.0.0",
        "name": "m",
        "plugins": [{"type": "note", "ipam": {"type": "host-local", "subnet": "10.77.0.0/16"}}],
    }
).encode()
EXAMPLES = int(os.environ.get("CNI_REAPER_MODEL_EXAMPLES", "60"))
REAL_NOW = 1_790_000_000.0  # the true time this node's story is told in: late 2026
DAY = 86_400.0

# What a clock may read, relative to the true time: true, an RTC ahead or behind, a board that
# starts at 1970 or at the clock timesyncd saved a month ago.
CLOCK_ERRORS = st.one_of(
    st.just(0.0),
    st.sampled_from([-REAL_NOW, -30 * DAY, -3600.0, -1.0, 1.0, 3600.0, 30 * DAY]),
    st.floats(min_value=-REAL_NOW, max_value=365 * DAY, allow_nan=False),
)
# WHOLE stands for a whole entry of the file's own attachment: where the node has runtime
# records that do not hold its sandbox, one from an earlier boot is DEL'd as forgotten.
WHOLE = b"whole"
CONTENTS = st.sampled_from([b"", b"\0" * 40, b'{"kind":"cniCacheV1","contai', b"garbage", WHOLE])
# What host-local writes: an owner (the file's own container), or nothing yet (a crash).
OWNER = b"owner"
RESERVATIONS = st.sampled_from([OWNER, OWNER, b"", b"\0" * 8])
STORE = "var/lib/cni/networks/m"


@st.composite
def writes(draw: st.DrawFn) -> list[tuple[str, bytes, float, bool]]:
    """What the runtime writes in a boot: (new or rewrite, bytes, mtime error, whether the
    runtime's records keep the sandbox of a new one); a reservation in host-local's store, with
    or without a results file beside it."""
    return draw(
        st.lists(
            st.one_of(
                st.tuples(
                    st.sampled_from(["new", "rewrite"]), CONTENTS, CLOCK_ERRORS, st.booleans()
                ),
                st.tuples(
                    st.sampled_from(["reserve", "reserve-only"]),
                    RESERVATIONS,
                    CLOCK_ERRORS,
                    st.booleans(),
                ),
            ),
            max_size=4,
        )
    )


@st.composite
def runs(draw: st.DrawFn) -> list[tuple[str, float, float]]:
    """Later runs of a boot: (kind, clock error, btime error after a step)."""
    return draw(
        st.lists(
            st.tuples(st.sampled_from(["dry", "real", "forced"]), CLOCK_ERRORS, CLOCK_ERRORS),
            min_size=1,
            max_size=3,
        )
    )


# Runtime records on the node: none at all (then no whole entry is called forgotten), or
# CRI-O's storage, holding the sandboxes drawn as known (CRI-O DELs those at its next start).
RECORDS = st.sampled_from(["none", "crio"])
CRIO_STORAGE = "var/lib/containers/storage/overlay-containers"


@st.composite
def boots(draw: st.DrawFn) -> list[dict[str, Any]]:
    return draw(
        st.lists(
            st.fixed_dictionaries(
                {
                    "clock_error": CLOCK_ERRORS,
                    # which boot records the boot writes, and whether they lie with its clock
                    "witness": st.sampled_from(["wtmp", "wtmpdb", "both", "neither"]),
                    "records": st.sampled_from(["true", "lying"]),
                    # wtmpdb's row not yet written when the unit's first run reads it
                    "wtmpdb_late": st.booleans(),
                    "unit_first": st.booleans(),
                    "writes": writes(),
                    "runs": runs(),
                    "end": st.sampled_from(["crash", "clean"]),
                    "damage_at_crash": st.lists(CONTENTS, max_size=2),
                }
            ),
            min_size=2,
            max_size=4,
        )
    )


@dataclass
class Life:
    """The node, and what the model knows: which boot last wrote each file."""

    node: NodeTree
    deletes: Path
    written_in: dict[str, int] = field(default_factory=dict)
    bytes_of: dict[str, bytes] = field(default_factory=dict)
    next_container: int = 0
    next_address: int = 0
    reserved_in: dict[str, tuple[int, str, bytes]] = field(default_factory=dict)  # by address
    boot: int = 0
    in_hypothesis: bool = False  # to say how often the checks had something to check
    records: bool = False  # whether the node has runtime records (CRI-O's storage)
    known: set[str] = field(default_factory=set)  # sandboxes in them: CRI-O will DEL those
    damaged: set[str] = field(default_factory=set)  # containers whose entry was ever damaged
    deleted_before: int = 0  # DELs noted before the run being checked

    def keep_records(self) -> None:
        """CRI-O's storage: a pod sandbox, with its config.json, for each known container."""
        storage = self.node.root / CRIO_STORAGE
        storage.mkdir(parents=True, exist_ok=True)
        entries = []
        for container in sorted(self.known):
            metadata = {"pod": True, "pod-name": "p", "pod-id": container}
            entries.append({"id": container, "metadata": json.dumps(metadata)})
            userdata = storage / container / "userdata"
            userdata.mkdir(parents=True, exist_ok=True)
            (userdata / "config.json").write_text("{}")
        (storage / "containers.json").write_text(json.dumps(entries))

    def runtime_knows(self, name: str) -> None:
        if self.records:
            self.known.add(name.split("-")[1])
            self.keep_records()

    def write(self, name: str, data: bytes, mtime: float) -> None:
        if data == WHOLE:
            container = name.split("-")[1]
            data = cache_entry_bytes(CONF, "m", container, "eth0")
        else:
            self.damaged.add(name.split("-")[1])
        path = self.node.write_result(name, data)
        os.utime(path, (mtime, mtime))
        self.written_in[name] = self.boot
        self.bytes_of[name] = data

    def reserve(self, name: str, data: bytes, mtime: float) -> None:
        """host-local's reservation for the attachment of the results file name."""
        container = name.split("-")[1]
        self.next_address += 1
        ip = f"10.77.{self.next_address // 250}.{self.next_address % 250 + 2}"
        if data == OWNER:
            data = f"{container}\r\neth0".encode()
        store = self.node.root / STORE
        store.mkdir(parents=True, exist_ok=True)
        path = store / ip
        path.write_bytes(data)
        os.utime(path, (mtime, mtime))
        self.reserved_in[ip] = (self.boot, container, data)

    def new_name(self) -> str:
        self.next_container += 1
        return f"m-{self.next_container:064x}-eth0"

    def run(self, kind: str, clock: float) -> dict[str, Any]:
        argv = ["--root", str(self.node.root), "--json", "--bin-dir", str(self.bin_dir)]
        if kind == "dry":
            argv.append("--dry-run")
        if kind == "forced":
            argv.append("--force")
        self.deleted_before = len(self.deleted())
        out = io.StringIO()
        with redirect_stdout(out):
            cli.run(argv, clock=lambda: clock, events=EventLog(stream=io.StringIO()), environ={})
        doc: dict[str, Any] = json.loads(out.getvalue())
        return doc

    @property
    def bin_dir(self) -> Path:
        return self.node.root / "opt/cni/bin"

    def deleted(self) -> list[str]:
        return self.deletes.read_text().split() if self.deletes.exists() else []

    def check(self, report: dict[str, Any]) -> None:
        """Nothing the current boot wrote was touched, or claimed for an earlier boot."""
        current = {n for n, b in self.written_in.items() if b == self.boot}
        for entry in report["entries"]:
            if entry["path"] in current:
                assert entry["written"] != "previous-boot", entry
                assert entry["action"] not in ("del-and-quarantine", "quarantine"), entry
        deleted = self.deleted()
        if self.in_hypothesis:
            seen = current & {e["path"] for e in report["entries"]}
            event(f"files of this boot in the report: {bool(seen)}")
            event(f"DELs so far: {min(len(deleted), 3)}")
        for name in current:
            container = name.split("-")[1]
            assert f"{self.boot}:{container}" not in deleted, name
            path = self.node.results / name
            assert path.read_bytes() == self.bytes_of[name], name
        acted_on = {r["ip"]: r for r in report["host_local"]}
        for ip, (boot, container, data) in self.reserved_in.items():
            if boot != self.boot:
                continue
            assert (self.node.root / STORE / ip).read_bytes() == data, ip
            assert f"{self.boot}:{container}" not in deleted, ip
            if ip in acted_on:
                assert acted_on[ip]["written"] != "previous-boot", acted_on[ip]
                assert acted_on[ip]["outcome"] != "done", acted_on[ip]
        # What the runtime will DEL itself, the reaper leaves to it: whole entries and their
        # addresses. (An address with no entry at all is an orphan, whoever knows its sandbox.)
        with_entries = {name.split("-")[1] for name in self.bytes_of}
        kept = (self.known - self.damaged) & with_entries
        now_deleted = {d.split(":", 1)[1] for d in deleted[self.deleted_before :]}
        assert not kept & now_deleted, kept & now_deleted
        for name, data in self.bytes_of.items():
            if name.split("-")[1] in kept:
                assert (self.node.results / name).read_bytes() == data, name
        for ip, (_, container, data) in self.reserved_in.items():
            if container in kept and data.startswith(container.encode()):
                assert (self.node.root / STORE / ip).read_bytes() == data, ip
        if self.in_hypothesis:
            event(f"reservations acted on: {min(len(acted_on), 2)}")
            event(f"node with runtime records: {self.records}")
            event(f"previous boots from: {report['boot']['previous_boots_source']}")
            forgotten = [
                e for e in report["entries"] if e["content"] == "valid" and e["del"] is not None
            ]
            event(f"forgotten whole entries planned for a DEL: {bool(forgotten)}")


def live_a_life(
    base: Path, story: list[dict[str, Any]], in_hypothesis: bool = False, records: str = "none"
) -> None:
    node = NodeTree(base / "node")
    life = Life(node, base / "deletes", in_hypothesis=in_hypothesis, records=records != "none")
    if life.records:
        life.keep_records()
    # DEL notes which boot asked for which container.
    boot_index = base / "boot"
    script = (
        f'echo "$(cat "{boot_index}"):$CNI_CONTAINERID" >> "{life.deletes}"\n'
        # and releases what host-local holds for it, as a DEL through host-local does
        f'grep -lx "$CNI_CONTAINERID.*" /{STORE}/* 2>/dev/null | xargs -r rm -f\n'
    )
    bin_dir = node.fake_plugin_network("m", "note", script)
    node.write_conf("60-m.conflist", CONF)
    (bin_dir / "host-local").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "host-local").chmod(0o755)
    for index, boot in enumerate(story):
        life.boot = index
        boot_index.write_text(str(index))
        error = boot["clock_error"]
        start = REAL_NOW + index * DAY
        clock = start + error
        witness, lying = boot["witness"], boot["records"] == "lying"
        if witness in ("wtmp", "both"):
            node.boot(clock if lying else start)  # PID 1's start, by the clock of the moment
        # wtmpdb's row: the kernel's start, now minus uptime, by the clock of the moment it
        # is written; at boot, or only after the unit's first run.
        row_due = witness in ("wtmpdb", "both")
        if row_due and not boot["wtmpdb_late"]:
            node.wtmpdb_boot(clock - 1 if lying else start - 1)
            row_due = False
        _boot_world(node, btime=clock - 1, boot_id=str(uuid.uuid4()))
        if boot["unit_first"]:
            life.check(life.run("real", clock + 5))
        node.runtime_starts()
        for how, data, mtime_error, known in boot["writes"]:
            old = [n for n in life.written_in if (node.results / n).exists()]
            name = old[0] if how == "rewrite" and old else life.new_name()
            if known and name not in life.written_in:
                life.runtime_knows(name)
            if how.startswith("reserve"):
                life.reserve(name, data, start + 30 + mtime_error)
                if how == "reserve-only":
                    continue
            life.write(name, WHOLE if how == "reserve" else data, start + 30 + mtime_error)
        for kind, clock_error, btime_error in boot["runs"]:
            # The clock was stepped: btime, now minus uptime, moved with it.
            _boot_world(node, btime=start + btime_error, boot_id=_boot_id(node))
            if row_due:  # written late, by the clock of now
                node.wtmpdb_boot(start + btime_error if lying else start - 1)
                row_due = False
            life.check(life.run(kind, start + 60 + clock_error))
        if boot["end"] == "clean":
            stopped_at = start + 3000 + error
            if witness in ("wtmp", "both"):
                node.shutdown(stopped_at)
            if witness in ("wtmpdb", "both"):
                node.wtmpdb_shutdown(stopped_at)
            cli.run(
                ["--root", str(node.root), "--mark-clean-shutdown"],
                clock=lambda: stopped_at,  # noqa: B023 (called here, in this iteration)
                system_state=lambda: "stopping",
            )
        else:
            present = [n for n in life.written_in if (node.results / n).exists()]
            for name, data in zip(present, boot["damage_at_crash"]):
                life.write(name, data, start + 3000 + error)


def _boot_world(node: NodeTree, btime: float, boot_id: str) -> None:
    """The proc files of the boot, and wtmp if any boot so far wrote to it: a node without
    wtmp's writer (Debian 13) has no file at all."""
    node.write_boot_world(btime=btime, boot_id=boot_id)
    if not node.records:
        (node.root / "var/log/wtmp").unlink()


def _boot_id(node: NodeTree) -> str:
    return (node.root / "proc/sys/kernel/random/boot_id").read_text().strip()


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(story=boots(), records=RECORDS)
def test_nothing_written_in_this_boot_is_ever_touched(
    story: list[dict[str, Any]], records: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    if os.geteuid() != 0:
        cannot_run("needs root: real runs confine their plugins to the node's root")
    live_a_life(tmp_path_factory.mktemp("life"), story, in_hypothesis=True, records=records)


def test_a_life_in_which_the_earlier_boots_damage_is_repaired(tmp_path: Path) -> None:
    """The model's checks are not vacuous: in a life the invariant permits it, the next boot's
    first run does repair what the boot before wrote."""
    if os.geteuid() != 0:
        cannot_run("needs root: real runs confine their plugins to the node's root")
    story = [
        {
            "clock_error": 0.0,
            "witness": "wtmp",
            "records": "true",
            "wtmpdb_late": False,
            "unit_first": True,
            "writes": [("new", b"", 0.0, False)],
            "runs": [("dry", 0.0, 0.0)],
            "end": "crash",
            "damage_at_crash": [],
        },
        {
            "clock_error": -REAL_NOW,  # a board without an RTC, back in 1970
            "witness": "wtmp",
            "records": "lying",
            "wtmpdb_late": False,
            "unit_first": True,
            "writes": [],
            "runs": [("dry", 0.0, 0.0)],
            "end": "clean",
            "damage_at_crash": [],
        },
    ]
    live_a_life(tmp_path, story)
    deletes = (tmp_path / "deletes").read_text().split()
    assert deletes == [f"1:{1:064x}"]
    assert not (tmp_path / "node/var/lib/cni/results" / f"m-{1:064x}-eth0").exists()


def test_a_life_in_which_a_forgotten_sandbox_is_deleted_and_a_known_one_kept(
    tmp_path: Path,
) -> None:
    """With runtime records on the node, the next boot's first run DELs the whole entry of a
    sandbox they do not hold, with its address, and leaves the one they hold, and its address,
    to the runtime: the new checks have something to check."""
    if os.geteuid() != 0:
        cannot_run("needs root: real runs confine their plugins to the node's root")
    first = {
        "clock_error": 0.0,
        "witness": "wtmp",
        "records": "true",
        "wtmpdb_late": False,
        "unit_first": True,
        "writes": [("reserve", OWNER, 0.0, False), ("reserve", OWNER, 0.0, True)],
        "runs": [("dry", 0.0, 0.0)],
        "end": "crash",
        "damage_at_crash": [],
    }
    second = {**first, "writes": [], "end": "clean"}
    live_a_life(tmp_path, [first, second], records="crio")
    assert (tmp_path / "deletes").read_text().split() == [f"1:{1:064x}"]
    results = tmp_path / "node/var/lib/cni/results"
    assert sorted(p.name for p in results.iterdir()) == [f"m-{2:064x}-eth0"]
    store = tmp_path / "node" / STORE
    assert [p.read_bytes() for p in store.glob("10.*")] == [f"{2:064x}\r\neth0".encode()]


def test_a_life_on_a_node_with_only_wtmpdb_whose_row_comes_late(tmp_path: Path) -> None:
    """Debian 13: wtmpdb the only boot record. The second boot starts in 1970 and its row is
    written after the unit's first run, which repairs what the crashed boot left; the file this
    boot writes later is left, and wtmpdb holds both boots as wtmpdb would."""
    if os.geteuid() != 0:
        cannot_run("needs root: real runs confine their plugins to the node's root")
    first = {
        "clock_error": 0.0,
        "witness": "wtmpdb",
        "records": "true",
        "wtmpdb_late": False,
        "unit_first": True,
        "writes": [("new", b"", 0.0, False)],
        "runs": [("dry", 0.0, 0.0)],
        "end": "crash",
        "damage_at_crash": [],
    }
    second = {
        **first,
        "clock_error": -REAL_NOW,
        "records": "lying",
        "wtmpdb_late": True,
        "writes": [("new", b"\0" * 40, -REAL_NOW, False)],
        "runs": [("real", -REAL_NOW, -REAL_NOW)],
        "end": "clean",
    }
    live_a_life(tmp_path, [first, second])
    assert (tmp_path / "deletes").read_text().split() == [f"1:{1:064x}"]
    results = tmp_path / "node/var/lib/cni/results"
    assert sorted(p.name for p in results.iterdir()) == [f"m-{2:064x}-eth0"]
    assert not (tmp_path / "node/var/log/wtmp").exists()
    db = sqlite3.connect(tmp_path / "node/var/lib/wtmpdb/wtmp.db")
    rows = db.execute("SELECT Type, User, Login, Logout FROM wtmp ORDER BY ID").fetchall()
    db.close()
    second_start = REAL_NOW + DAY
    assert rows == [
        (1, "reboot", int((REAL_NOW - 1) * 1e6), None),  # crashed: never logged out
        # the late row, and its clean shutdown, by the boot's 1970 clock
        (1, "reboot", int((second_start - REAL_NOW) * 1e6), int((DAY + 3000) * 1e6)),
    ]
