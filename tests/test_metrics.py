"""--metrics-file, read back with prometheus_client's own parser, as node_exporter would read it."""

from __future__ import annotations

import os
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import cni_reaper
from cni_reaper import cli
from cni_reaper.content import Content
from cni_reaper.errors import ExitCode
from cni_reaper.journal import EventLog
from tests.crashed import Crashed
from tests.nodetree import CONTAINER_IDS, NodeTree
from tests.test_journal import Recorder
from tests.test_refusals import NOBODY, SETPRIV, cli_run, damaged_node, unprivileged_python

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(path: Path) -> Samples:
    found = {}
    for family in text_string_to_metric_families(path.read_text()):
        assert family.type == "gauge"
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_metrics_file_holds_the_run_figures(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    crashed.add(CONTAINER_IDS[0])
    crashed.add(CONTAINER_IDS[1]).write_bytes(b"")
    crashed.node.write_result(f"gone-net-{CONTAINER_IDS[2]}-eth0", b"")
    crashed.reboot()
    textfile = tmp_path / "textfile"
    textfile.mkdir()
    prom = textfile / "cni-reaper.prom"

    code, report = crashed.run(capsys, "--metrics-file", str(prom))

    found = samples(prom)
    assert found[("cni_reaper_warnings", ())] == len(report["warnings"]) > 0
    assert found[("cni_reaper_entries", (("content", "valid"),))] == 1
    assert found[("cni_reaper_entries", (("content", "empty"),))] == 2
    # Every verdict has its series, zero or not.
    for content in Content:
        assert ("cni_reaper_entries", (("content", content.value),)) in found
    assert (
        found[("cni_reaper_actions", (("action", "del-and-quarantine"), ("outcome", "done")))] == 1
    )
    assert (
        found[("cni_reaper_actions", (("action", "del-and-quarantine"), ("outcome", "failed")))]
        == 1
    )
    assert found[("cni_reaper_actions", (("action", "keep"), ("outcome", "skipped")))] == 1
    # The network with no config fails before any plugin runs.
    assert found[("cni_reaper_del_failures", (("plugin", "none"),))] == 1
    assert found[("cni_reaper_previous_boot_crashed", ())] == 1
    assert found[("cni_reaper_exit_code", ())] == code == 73
    assert found[("cni_reaper_dry_run", ())] == 0
    assert 0 <= found[("cni_reaper_run_duration_seconds", ())] < 60
    assert abs(found[("cni_reaper_last_run_timestamp_seconds", ())] - crashed.t0) < 600
    # Written through a temp file in the same dir and renamed: nothing else is left there.
    assert os.listdir(textfile) == ["cni-reaper.prom"]


def test_plugin_failures_are_counted_by_plugin_type(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    bin_dir = crashed.node.fake_plugin_network(
        "f", "failing", 'echo \'{"code": 11, "msg": "store locked"}\'\nexit 1\n'
    )
    for cid in CONTAINER_IDS[:2]:
        crashed.node.write_result(f"f-{cid}-eth0", b"")
    crashed.reboot()
    prom = tmp_path / "cni-reaper.prom"

    code, _ = crashed.run(capsys, "--bin-dir", str(bin_dir), "--metrics-file", str(prom))

    assert code == 73
    assert samples(prom)[("cni_reaper_del_failures", (("plugin", "failing"),))] == 2


def test_the_time_until_the_plan_is_told_apart_from_the_repairs(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Where a boot's wait went: the seconds until the whole plan was made (nothing changed
    yet), then the DELs; two DELs of 0.4 s each come after the plan, never before it."""
    bin_dir = crashed.node.fake_plugin_network("slow", "slow", "sleep 0.4\n")
    for cid in CONTAINER_IDS[:2]:
        crashed.node.write_result(f"slow-{cid}-eth0", b"")
    crashed.reboot()
    prom = tmp_path / "cni-reaper.prom"

    code, report = crashed.run(capsys, "--bin-dir", str(bin_dir), "--metrics-file", str(prom))

    assert code == 0, report["summary"]
    seconds = report["summary"]["seconds"]
    assert 0 < seconds["to_plan"] <= seconds["in_all"] - 0.8, seconds
    assert samples(prom)[("cni_reaper_plan_duration_seconds", ())] == seconds["to_plan"]


def test_metrics_of_a_dry_run_say_so(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    crashed.reboot()
    prom = tmp_path / "cni-reaper.prom"
    crashed.run(capsys, "--dry-run", "--metrics-file", str(prom))
    assert samples(prom)[("cni_reaper_dry_run", ())] == 1


def test_the_file_is_readable_by_all_whatever_the_umask(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The unit runs with UMask=0077; node_exporter runs as a user of its own."""
    crashed.reboot()
    prom = tmp_path / "cni-reaper.prom"
    umask = os.umask(0o077)
    try:
        crashed.run(capsys, "--metrics-file", str(prom))
    finally:
        os.umask(umask)
    assert stat.S_IMODE(prom.stat().st_mode) == 0o644


# The label sets the shipped alerts (monitoring/) sum over: written at zero, so that a sum is
# never empty. Spelled out, not taken from the code: a rename breaks this test.
ENTRY_PAIRS = {
    ("keep", "skipped"),
    ("leave", "skipped"),
    ("report", "skipped"),
    *(
        (action, outcome)
        for action in ("del-and-quarantine", "quarantine")
        for outcome in ("planned", "done", "failed", "skipped")
    ),
}
RESERVATION_PAIRS = {
    ("leave", "skipped"),
    *(
        (action, outcome)
        for action in ("del", "quarantine")
        for outcome in ("planned", "done", "failed", "skipped")
    ),
}
OWNERS = {"runtime", "current-boot", "alive", "left", "failed", "damaged", "unknown"}


def by_labels(found: Samples, name: str) -> dict[tuple[str, ...], float]:
    """One series' samples by their label values, in label name order."""
    return {
        tuple(value for _, value in labels): n
        for (series, labels), n in found.items()
        if series == name
    }


def multus_files_counted(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], metrics_dir: Path
) -> tuple[int, dict[tuple[str, ...], float]]:
    """A run's exit code and the Multus files its metrics file counts, those not zero."""
    prom = metrics_dir / "cni-reaper.prom"
    code, _ = crashed.run(capsys, "--metrics-file", str(prom))
    counted = by_labels(samples(prom), "cni_reaper_multus_files")
    return code, {labels: n for labels, n in counted.items() if n}


def test_every_known_label_set_is_written_zero_or_not(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A node with nothing wrong: one whole entry, its address held for the runtime's DEL."""
    crashed.add(CONTAINER_IDS[0])
    crashed.reboot()
    prom = tmp_path / "cni-reaper.prom"

    code, _ = crashed.run(capsys, "--metrics-file", str(prom))

    assert code == 0
    found = samples(prom)
    actions = by_labels(found, "cni_reaper_actions")
    assert set(actions) == ENTRY_PAIRS
    assert {pair: n for pair, n in actions.items() if n} == {("keep", "skipped"): 1}
    reservations = by_labels(found, "cni_reaper_reservations")
    assert set(reservations) == RESERVATION_PAIRS
    assert set(reservations.values()) == {0}
    left = {labels[1]: n for labels, n in by_labels(found, "cni_reaper_pool_left").items()}
    assert set(left) == OWNERS
    assert {owner: n for owner, n in left.items() if n} == {"runtime": 1}
    multus = by_labels(found, "cni_reaper_multus_files")  # labels: action, kind, outcome
    assert set(multus) == {
        (action, kind, outcome)
        for action, outcome in ENTRY_PAIRS
        if action != "del-and-quarantine"
        for kind in ("delegate-result", "multus-scratch")
    }
    assert set(multus.values()) == {0}
    assert by_labels(found, "cni_reaper_del_failures") == {}
    assert found[("cni_reaper_del_failures_all_plugins", ())] == 0
    assert found[("cni_reaper_previous_boot_known", ())] == 1
    assert found[("cni_reaper_previous_boot_crashed", ())] == 1
    python = ".".join(str(n) for n in sys.version_info[:3])
    build = (("python", python), ("version", cni_reaper.__version__))
    assert found[("cni_reaper_build_info", build)] == 1


def test_a_previous_boot_that_cannot_be_told_is_said_not_known(
    node: NodeTree, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No boot record at all: crashed is 0, and known says that 0 means nothing."""
    node.write_boot_world(btime=1_700_000_000)
    prom = tmp_path / "cni-reaper.prom"

    cli.run(["--root", str(node.root), "--dry-run", "--metrics-file", str(prom)], environ={})

    capsys.readouterr()
    found = samples(prom)
    assert found[("cni_reaper_previous_boot_known", ())] == 0
    assert found[("cni_reaper_previous_boot_crashed", ())] == 0
    assert found[("cni_reaper_dry_run", ())] == 1


# What a run that ends in an error writes: how it ended, and nothing it did not make whole.
FAILURE_SERIES = {
    "cni_reaper_build_info",
    "cni_reaper_dry_run",
    "cni_reaper_exit_code",
    "cni_reaper_run_duration_seconds",
    "cni_reaper_last_run_timestamp_seconds",
}


def failure_written(prom: Path, exit_code: int, started: float) -> None:
    found = samples(prom)
    assert {name for name, _ in found} == FAILURE_SERIES
    assert found[("cni_reaper_exit_code", ())] == exit_code
    assert started - 1 <= found[("cni_reaper_last_run_timestamp_seconds", ())] <= time.time() + 1
    assert stat.S_IMODE(prom.stat().st_mode) == 0o644


def test_a_run_refused_while_a_runtime_answers_writes_its_exit_code(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    crashed.reboot()
    prom = tmp_path / "cni-reaper.prom"
    started = time.time()
    with crashed.containerd_answering():
        assert crashed.run_main("--metrics-file", str(prom)) == ExitCode.REFUSED
    capsys.readouterr()
    failure_written(prom, 75, started)


def test_an_unsafe_input_writes_its_exit_code(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The results dir is a symlink: refused as unsafe, after the boot was read."""
    crashed.results_dir_links_to(tmp_path / "elsewhere")
    prom = tmp_path / "cni-reaper.prom"
    started = time.time()

    assert crashed.run_main("--metrics-file", str(prom)) == ExitCode.DATA

    capsys.readouterr()
    failure_written(prom, 65, started)


def test_a_usage_error_after_metrics_file_writes_its_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prom = tmp_path / "cni-reaper.prom"
    started = time.time()

    assert cli.main(["--metrics-file", str(prom), "--parallel", "0"]) == ExitCode.USAGE
    failure_written(prom, 2, started)
    prom.unlink()
    assert cli.main(["--metrics-file", str(prom), "--root", str(tmp_path / "no-such")]) == 2
    failure_written(prom, 2, started)
    prom.unlink()

    # Before argparse reached --metrics-file, it does not know the file.
    assert cli.main(["--parallel", "many", "--metrics-file", str(prom)]) == ExitCode.USAGE
    assert not prom.exists()
    capsys.readouterr()


def test_a_real_run_not_as_root_writes_its_exit_code() -> None:
    python = unprivileged_python()
    top = Path(tempfile.mkdtemp(prefix="cni-reaper-metrics-"))
    try:
        top.chmod(0o711)  # only to pass through, for the user who is not root
        node = damaged_node(top / "node")
        for path in [node.root, *node.root.rglob("*")]:
            path.chmod(0o755 if path.is_dir() else 0o644)
        textfile = top / "textfile"
        textfile.mkdir()
        os.chown(textfile, NOBODY, NOBODY)
        prom = textfile / "cni-reaper.prom"
        started = time.time()

        done = cli_run(
            ["--root", str(node.root), "--metrics-file", str(prom)],
            python=python,
            prefix=tuple(SETPRIV),
        )

        assert done.returncode == ExitCode.NOPERM, done.stderr
        failure_written(prom, 77, started)
        assert prom.stat().st_uid == NOBODY
    finally:
        shutil.rmtree(top)


def test_the_clean_shutdown_marker_writes_no_metrics(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The ExecStop at shutdown is no run of the repair: it must not pass for one."""
    crashed.reboot()
    prom = tmp_path / "cni-reaper.prom"
    argv = crashed.argv("--mark-clean-shutdown", "--metrics-file", str(prom))

    assert cli.run(argv, environ={}, system_state=lambda: "stopping") == ExitCode.OK

    capsys.readouterr()
    assert not prom.exists()


def test_a_metrics_dir_that_does_not_exist_is_a_warning_not_a_failure(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The unit names Debian's textfile dir on every node; not every node has node_exporter."""
    crashed.reboot()
    missing = tmp_path / "no-node-exporter"

    recorder = Recorder()

    code, report = crashed.run(
        capsys, "--metrics-file", str(missing / "cni-reaper.prom"), events=EventLog(send=recorder)
    )

    assert code == 0
    said = f"no metrics written: no directory {missing}"
    assert said in report["warnings"]
    assert not missing.exists()
    # In the journal at every boot of such a node: a notice, not a warning.
    (record,) = [r for r in recorder.sent if r["MESSAGE"] == said]
    assert (record["PRIORITY"], record["CNI_REAPER_EVENT"]) == ("5", "warning")
    others = [r for r in recorder.sent if r.get("CNI_REAPER_EVENT") == "warning" and r != record]
    assert others and {r["PRIORITY"] for r in others} == {"4"}


def test_a_metrics_file_that_cannot_be_written_is_said_and_the_exit_code_stands(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    crashed.add(CONTAINER_IDS[0]).write_bytes(b"")
    crashed.reboot()
    textfile = tmp_path / "textfile"
    prom = textfile / "cni-reaper.prom"
    (prom / "in-the-way").mkdir(parents=True)  # a directory where the file goes

    assert crashed.run_main("--metrics-file", str(prom)) == ExitCode.OK
    err = capsys.readouterr().err
    assert f"cni-reaper: metrics not written to {prom}: " in err
    assert "Traceback" not in err
    assert os.listdir(textfile) == ["cni-reaper.prom"]  # no temp file left


def test_a_metrics_file_not_written_is_a_warning_on_the_journal_stream_the_run_was_given(
    capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Under the unit, stderr is journald's stream, which the run learns from the environment
    handed to it (JOURNAL_STREAM): the line gets journald's priority prefix from that, not from
    the process's own environment."""
    prom = tmp_path / "cni-reaper.prom"
    (prom / "in-the-way").mkdir(parents=True)
    st = os.fstat(2)
    cli._write_metrics(str(prom), "x 1\n", {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
    assert capfd.readouterr().err.startswith(f"<4>cni-reaper: metrics not written to {prom}: ")


def test_multus_files_are_counted_by_kind_action_and_outcome(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A delegate result and a scratch file the crash left empty, moved; a delegate result
    that is a symlink, reported: the alert on damage left alone sees it."""
    multus = crashed.node.root / "var/lib/cni/multus"
    (multus / "results").mkdir(parents=True)
    (multus / "results" / f"hl-{CONTAINER_IDS[0]}-eth0").write_bytes(b"")
    (multus / CONTAINER_IDS[0]).write_bytes(b"")
    os.symlink("/etc/hostname", multus / "results" / f"hl-{CONTAINER_IDS[1]}-eth0")
    crashed.reboot()

    code, counted = multus_files_counted(crashed, capsys, tmp_path)

    assert code == ExitCode.DATA
    assert counted == {
        ("quarantine", "delegate-result", "done"): 1,
        ("report", "delegate-result", "skipped"): 1,
        ("quarantine", "multus-scratch", "done"): 1,
    }
