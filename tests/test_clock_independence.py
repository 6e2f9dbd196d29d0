"""Where this boot's pre-runtime record exists, the plan does not depend on any clock; where it
does not, nothing is acted on, whatever the clocks say (issue 15, point 4: boards without an
RTC that start in 1970 or at the clock systemd-timesyncd saved, and are stepped later).

hypothesis draws one node: the files an earlier boot left (damaged and whole results entries,
host-local reservations with and without an owner, runtime records holding some sandboxes),
how that boot ended, and how this boot's record came to be: taken by the run looked at, or by
an earlier run of the boot (which died once it had kept the record, or did its repairs), after
which a runtime started and wrote files of its own. Then it draws the clocks: `now` of every
run, /proc/stat btime before and after a step, which boot records there are (wtmp, wtmpdb, both,
neither) and the times in them, whether wtmpdb's row of this boot is written yet, the time of
the clean-shutdown marker and every file's mtime; from 1970 to years ahead. The same node is
built under the true clocks and under the drawn ones, and the real CLI run on each; a fake DEL
plugin notes the container IDs it is asked to delete. What is compared is what someone cares
about: which files are left in the results dir and the host-local store and with what bytes,
which went to the quarantine, which DELs were asked for, and the report's action, outcome and
written verdict of each entry and reservation, and the exit code. (A file's ctime is this
machine's clock at the test and cannot be drawn; it is the same whatever else is.)
"""

from __future__ import annotations

import io
import json
import os
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cni_reaper import cli, failpoint, pre_runtime
from cni_reaper.journal import EventLog
from tests.nodetree import NodeTree, cache_entry_bytes
from tests.private_node import cannot_run

EXAMPLES = int(os.environ.get("CNI_REAPER_CLOCK_EXAMPLES", "20"))
CONF = json.dumps(
    {
        "cniVersion": "1.0.0",
        "name": "m",
        "plugins": [{"type": "note", "ipam": {"type": "host-local", "subnet": "10.77.0.0/16"}}],
    }
).encode()
STORE = "var/lib/cni/networks/m"
CRIO_STORAGE = "var/lib/containers/storage/overlay-containers"
REAL_NOW = 1_790_000_000.0  # this boot's true start: late 2026
DAY = 86_400.0
YEAR = 365 * DAY
OLDER, PREVIOUS = REAL_NOW - 2 * DAY, REAL_NOW - DAY  # the true starts of the boots before
PREVIOUS_ID = "0d5c1a3e-2b7f-4c9a-8e61-3f0b9d2a7c14"
THIS_ID = "7e2f9b40-51c3-4d8e-a6f2-c08d1e5b9a37"

# What a clock may say, relative to the truth: right, 1970 (a board without an RTC, at boot or
# an hour in), a clock timesyncd saved months or a month back, off by an hour or by less than
# the margin, years ahead; and anything between.
CLOCK_ERRORS = st.one_of(
    st.sampled_from(
        [
            *(0.0, -REAL_NOW, -REAL_NOW + 3600, -120 * DAY, -30 * DAY),
            *(-3600.0, -1.5, 1.5, 3600.0, 3 * YEAR, 20 * YEAR),
        ]
    ),
    st.floats(min_value=-REAL_NOW + 2 * DAY, max_value=20 * YEAR, allow_nan=False),
)
WHOLE = b"whole"  # a whole entry of the file's own attachment
CONTENTS = st.sampled_from([b"", b"\0" * 40, b'{"kind":"cniCacheV1","contai', b"garbage", WHOLE])
OWNER = b"owner"  # host-local's reservation naming the entry's container
RESERVATIONS = st.sampled_from([None, OWNER, OWNER, b"", b"\0" * 8])
CHANGING = ("del-and-quarantine", "quarantine")


@st.composite
def nodes(draw: st.DrawFn, record: list[str]) -> dict[str, Any]:
    """The node, whatever the clocks: what the earlier boot left and how this boot goes on."""
    return draw(
        st.fixed_dictionaries(
            {
                # (content, its reservation, whether the runtime's records hold its sandbox)
                "entries": st.lists(
                    st.tuples(CONTENTS, RESERVATIONS, st.booleans()), min_size=1, max_size=4
                ),
                "orphan": st.booleans(),  # a reservation whose entry is gone
                "runtime_records": st.booleans(),  # CRI-O's storage on the node
                "end": st.sampled_from(["crash", "clean"]),
                "record": st.sampled_from(record),
                "run": st.sampled_from(["real", "dry", "forced"]),
                # what the runtime writes once it has started, where the story lets it
                "runtime_writes": st.lists(
                    st.tuples(st.sampled_from(["new", "rewrite", "reserve"]), CONTENTS),
                    max_size=2,
                ),
            }
        )
    )


FILES = 16  # mtimes drawn: more than any node here has files


def clocks() -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            "now": CLOCK_ERRORS,  # the run looked at
            "btime": CLOCK_ERRORS,  # /proc/stat btime when it runs: after any step
            "first_now": CLOCK_ERRORS,  # the boot's earlier run, at boot
            "first_btime": CLOCK_ERRORS,  # btime then
            "witness": st.sampled_from(["wtmp", "wtmpdb", "both", "neither"]),
            # the older boot's, the previous boot's start and shutdown, this boot's start
            "records": st.tuples(CLOCK_ERRORS, CLOCK_ERRORS, CLOCK_ERRORS, CLOCK_ERRORS),
            "wtmpdb_late": st.booleans(),  # this boot's row written only after the first run
            "marker": CLOCK_ERRORS,  # the clean-shutdown marker's time
            "mtimes": st.lists(CLOCK_ERRORS, min_size=FILES, max_size=FILES),
        }
    )


TRUE_CLOCKS: dict[str, Any] = {
    "now": 0.0,
    "btime": 0.0,
    "first_now": 0.0,
    "first_btime": 0.0,
    "witness": "both",
    "records": (0.0, 0.0, 0.0, 0.0),
    "wtmpdb_late": False,
    "marker": 0.0,
    "mtimes": [0.0] * FILES,
}

# The clock stepped years forward before the run (a board that started at a saved clock, say,
# then met an NTP server set wrong): btime moves with it, and every file, whichever boot wrote
# it, looks older than this boot by the clocks. Every example tries it besides those drawn.
STEPPED_AHEAD: dict[str, Any] = {**TRUE_CLOCKS, "now": 3 * YEAR, "btime": 3 * YEAR}


class _Died(BaseException):
    """The earlier run, stopped once its record is kept, before it changes anything."""


@dataclass
class Built:
    node: NodeTree
    deletes: Path
    reports: list[dict[str, Any]]  # of every run, the one looked at last
    codes: list[int]
    before_run: dict[str, bytes]  # the results dir and store as the run looked at found them

    def outcome(self) -> dict[str, Any]:
        """What someone cares about: files left and moved, DELs asked for, the report's
        verdicts, actions and outcomes; never its evidence, which quotes the clocks."""
        quarantined = sorted(
            str(p.relative_to(self.node.quarantine))
            for p in self.node.quarantine.rglob("*")
            if p.is_file() and not p.name.endswith(".json")
        )
        return {
            "left": _files(self.node),
            "quarantined": quarantined,
            "deleted": sorted(self.deleted()),
            "codes": self.codes,
            "reports": [_plan(report) for report in self.reports],
        }

    def deleted(self) -> list[str]:
        return self.deletes.read_text().split() if self.deletes.exists() else []


def _files(node: NodeTree) -> dict[str, bytes]:
    found = {}
    for directory in (node.results, node.root / STORE):
        if directory.is_dir():
            for path in directory.iterdir():
                if path.is_file() and not path.name.startswith("last_reserved_ip"):
                    found[str(path.relative_to(node.root))] = path.read_bytes()
    return found


def _plan(report: dict[str, Any]) -> dict[str, Any]:
    keys = ("content", "written", "action", "outcome")
    return {
        "entries": sorted(
            (e["path"], *(str(e[k]) for k in keys), json.dumps(e["del"] is not None))
            for e in report["entries"]
        ),
        "host_local": sorted((r["ip"], *(str(r[k]) for k in keys)) for r in report["host_local"]),
    }


def _run(node: NodeTree, kind: str, now: float) -> tuple[dict[str, Any], int]:
    argv = ["--root", str(node.root), "--json", "--bin-dir", str(node.root / "opt/cni/bin")]
    if kind == "dry":
        argv.append("--dry-run")
    if kind == "forced":
        argv.append("--force")
    out = io.StringIO()
    with redirect_stdout(out):
        code = cli.run(argv, clock=lambda: now, events=EventLog(stream=io.StringIO()), environ={})
    return json.loads(out.getvalue()), int(code)


def _boot_world(node: NodeTree, btime: float, boot_id: str) -> None:
    node.write_boot_world(btime=btime, boot_id=boot_id)
    if not node.records:  # no wtmp's writer on this node: no file at all
        (node.root / "var/log/wtmp").unlink()


def _at(t: float) -> float:
    """A time a file or record can hold: no clock here reads before the epoch."""
    return max(t, 0.0)


def build_and_run(base: Path, story: dict[str, Any], clock: dict[str, Any]) -> Built:
    node = NodeTree(base / "node")
    deletes = base / "deletes"
    script = (
        f'echo "$CNI_CONTAINERID" >> "{deletes}"\n'
        # and what host-local holds for it goes, as with a DEL through host-local
        f'grep -lx "$CNI_CONTAINERID.*" /{STORE}/* 2>/dev/null | xargs -r rm -f\n'
    )
    bin_dir = node.fake_plugin_network("m", "note", script)
    node.write_conf("60-m.conflist", CONF)
    (bin_dir / "host-local").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "host-local").chmod(0o755)
    witness = clock["witness"]
    wtmp, wtmpdb = witness in ("wtmp", "both"), witness in ("wtmpdb", "both")
    older, previous, shutdown, current = clock["records"]
    mtimes = iter(clock["mtimes"])

    # The older boot, which shut down cleanly, and the previous one.
    for start, error in ((OLDER, older), (PREVIOUS, previous)):
        if wtmp:
            node.boot(_at(start + error))
        if wtmpdb:
            node.wtmpdb_boot(_at(start - 1 + error))
        if start == OLDER:
            if wtmp:
                node.shutdown(_at(start + 3000 + error))
            if wtmpdb:
                node.wtmpdb_shutdown(_at(start + 3000 + error))
    _boot_world(node, btime=_at(PREVIOUS - 1 + previous), boot_id=PREVIOUS_ID)

    # What the previous boot left.
    store = node.root / STORE
    store.mkdir(parents=True, exist_ok=True)
    known = []
    for index, (content, reservation, is_known) in enumerate(story["entries"], 1):
        container = f"{index:064x}"
        name = f"m-{container}-eth0"
        data = cache_entry_bytes(CONF, "m", container, "eth0") if content == WHOLE else content
        _write(node.write_result(name, data), _at(PREVIOUS + 600 + next(mtimes)))
        if reservation is not None:
            owned = f"{container}\r\neth0".encode() if reservation == OWNER else reservation
            _write(store / f"10.77.0.{index + 1}", _at(PREVIOUS + 600 + next(mtimes)), owned)
        if is_known:
            known.append(container)
    if story["orphan"]:
        owned = f"{99:064x}\r\neth0".encode()
        _write(store / "10.77.1.99", _at(PREVIOUS + 600 + next(mtimes)), owned)
    if story["runtime_records"]:
        _crio_storage(node, known)
    if story["end"] == "clean":
        stopped = _at(PREVIOUS + 3000 + shutdown)
        if wtmp:
            node.shutdown(stopped)
        if wtmpdb:
            node.wtmpdb_shutdown(stopped)
        marked = _at(PREVIOUS + 3000 + clock["marker"])
        cli.run(
            ["--root", str(node.root), "--mark-clean-shutdown"],
            clock=lambda: marked,
            system_state=lambda: "stopping",
        )

    # This boot.
    if wtmp:
        node.boot(_at(REAL_NOW + current))
    row_due = wtmpdb
    if wtmpdb and not clock["wtmpdb_late"]:
        node.wtmpdb_boot(_at(REAL_NOW - 1 + current))
        row_due = False
    this_id = THIS_ID
    reports, codes = [], []
    record = story["record"]
    if record == "taken by this run":
        _boot_world(node, btime=_at(REAL_NOW - 1 + clock["btime"]), boot_id=this_id)
        before = _files(node)
        report, code = _run(node, story["run"], _at(REAL_NOW + 5 + clock["now"]))
        return Built(node, deletes, [report], [code], before)

    _boot_world(node, btime=_at(REAL_NOW - 1 + clock["first_btime"]), boot_id=this_id)
    first_now = _at(REAL_NOW + 5 + clock["first_now"])
    if record == "taken by a run that died":

        def die() -> None:
            raise _Died

        failpoint.interfere(pre_runtime.RECORD_WRITTEN, die)
        try:
            with pytest.raises(_Died):
                _run(node, "real", first_now)
        finally:
            failpoint.interfere(pre_runtime.RECORD_WRITTEN, None)
    elif record == "taken by a run that repaired":
        report, code = _run(node, "real", first_now)
        reports.append(report)
        codes.append(code)
    elif record == "none: the run at boot was dry":
        _run(node, "dry", first_now)
    # "none: the runtime came first": no run before it.

    # The clock is stepped; wtmpdb's row may come now, by the new clock; the runtime starts
    # and writes.
    _boot_world(node, btime=_at(REAL_NOW - 1 + clock["btime"]), boot_id=this_id)
    if row_due:
        node.wtmpdb_boot(_at(REAL_NOW - 1 + clock["btime"]))
    node.runtime_starts()
    if record == "none: a damaged record":
        kept = node.root / "run" / pre_runtime.RECORD_DIR
        kept.mkdir(parents=True, exist_ok=True, mode=0o700)
        (kept / this_id).write_bytes(b"cni-reaper pre-runtime record 1 damag")
    added = 100
    for how, content in story["runtime_writes"]:
        added += 1
        container = f"{added:064x}"
        name = f"m-{container}-eth0"
        present = sorted(p.name for p in node.results.iterdir())
        if how == "rewrite" and present:
            name = present[0]
            container = name.split("-")[1]
        data = cache_entry_bytes(CONF, "m", container, "eth0") if content == WHOLE else content
        mtime = _at(REAL_NOW + 30 + next(mtimes))
        _write(node.write_result(name, data), mtime)
        if how == "reserve":
            _write(store / f"10.77.2.{added}", mtime, f"{container}\r\neth0".encode())
    before = _files(node)
    report, code = _run(node, story["run"], _at(REAL_NOW + 60 + clock["now"]))
    return Built(node, deletes, [*reports, report], [*codes, code], before)


def _write(path: Path, mtime: float, data: bytes | None = None) -> None:
    if data is not None:
        path.write_bytes(data)
    os.utime(path, (mtime, mtime))


def _crio_storage(node: NodeTree, known: list[str]) -> None:
    """CRI-O's storage: a pod sandbox for each known container (CRI-O will DEL those)."""
    storage = node.root / CRIO_STORAGE
    storage.mkdir(parents=True, exist_ok=True)
    entries = []
    for container in known:
        metadata = {"pod": True, "pod-name": "p", "pod-id": container}
        entries.append({"id": container, "metadata": json.dumps(metadata)})
        (storage / container / "userdata").mkdir(parents=True)
        (storage / container / "userdata/config.json").write_text("{}")
    (storage / "containers.json").write_text(json.dumps(entries))


WITH_RECORD = ["taken by this run", "taken by a run that died", "taken by a run that repaired"]
WITHOUT_RECORD = [
    "none: the runtime came first",
    "none: the run at boot was dry",
    "none: a damaged record",
]
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@SETTINGS
@given(story=nodes(WITH_RECORD), drawn=st.lists(clocks(), min_size=2, max_size=2))
def test_with_this_boots_record_the_plan_is_the_same_whatever_the_clocks_say(
    story: dict[str, Any], drawn: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    if os.geteuid() != 0:
        cannot_run("needs root: real runs confine their plugins to the node's root")
    truth = build_and_run(tmp_path_factory.mktemp("truth"), story, TRUE_CLOCKS)
    expected = truth.outcome()
    assert all(r["boot"]["pre_runtime_record"]["state"] != "missing" for r in truth.reports)
    actions = {e[3] for r in expected["reports"] for e in r["entries"]}
    event(f"{story['record']}; acted on: {bool(set(CHANGING) & actions)}")
    event(f"DELs under the true clocks: {min(len(expected['deleted']), 2)}")
    for clock in [STEPPED_AHEAD, *drawn]:
        built = build_and_run(tmp_path_factory.mktemp("drawn"), story, clock)
        assert built.outcome() == expected, clock


@SETTINGS
@given(story=nodes(WITHOUT_RECORD), drawn=st.lists(clocks(), min_size=2, max_size=2))
def test_without_this_boots_record_nothing_is_acted_on_whatever_the_clocks_say(
    story: dict[str, Any], drawn: list[dict[str, Any]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    if os.geteuid() != 0:
        cannot_run("needs root: real runs confine their plugins to the node's root")
    event(story["record"])
    for clock in [TRUE_CLOCKS, STEPPED_AHEAD, *drawn]:
        built = build_and_run(tmp_path_factory.mktemp("drawn"), story, clock)
        assert built.deleted() == [], clock
        assert _files(built.node) == built.before_run, clock
        assert not built.node.quarantine.exists() or not any(built.node.quarantine.rglob("*"))
        report = built.reports[-1]
        assert report["boot"]["pre_runtime_record"]["state"] == "missing", report["boot"]
        for entry in report["entries"]:
            assert entry["written"] != "previous-boot", entry
            assert entry["action"] not in CHANGING, entry
        for reservation in report["host_local"]:
            assert reservation["written"] != "previous-boot", reservation
            assert reservation["outcome"] != "done", reservation
