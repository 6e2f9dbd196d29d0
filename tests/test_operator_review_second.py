"""What an operator sees, where a second operator's review (2026-12-06, stop 56) found it wrong,
missing or said twice:
- an orphaned address released into the quarantine after its DEL failed made the run exit 73,
  while its journal record said "repaired" (notice), the metrics counted no DEL failure and
  the JSON summary no plugin error: the alert on exit 73 pointed at nothing;
- a dry run said "DEL <net> ... from None: no plugin" of an orphan whose network has no config,
  and "no plugin" of every orphan's DEL, and not why one will fail; the network's pool was
  "outside every range: 0 addresses";
- an entry whose DEL cannot run said so twice in a real run ("DEL will fail: X", "error: DEL
  not run: X"); a dry run's journal records did not say why a DEL will fail, and a
  reservation's record had it in another field than an entry's;
- an orphan left at the deadline said the deadline twice (its error and its problem);
- an entry whose DEL failed counted as failed, and nothing said it was moved all the same
  (a reservation's was counted done); its DEL line was the plan's, whether it ran or not;
- a plugin's error said neither its CNI error code nor, with no error JSON, its exit status;
- in a boot whose runtime started before any reaper ran, the journal said of each damaged file
  only that it may be a write in flight, and nowhere that there is no pre-runtime record.
(Its finding of an address kept, unsaid, when the quarantine cannot be read is in
test_multus.py.) A review of the fixes then found an orphan whose DEL failed and which changed
before its move counted as moved (exit 73, no failed repair said), and an orphan whose DEL
cannot run counted in no metric; and an orphan whose DEL exited 0 and left its address
reserved counted as done (exit 0) where an entry's is a failed repair.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cni_reaper import cli
from cni_reaper.errors import ExitCode
from cni_reaper.journal import Event, EventLog
from cni_reaper.plugin import PluginRun, error_from_run
from tests.crashed import Crashed
from tests.nodetree import CONTAINER_IDS
from tests.test_orphans import fake_plugin_with_host_local

A, B = CONTAINER_IDS[:2]
FAILING = 'echo \'{"cniVersion":"1.0.0","code":11,"msg":"try again"}\'\nexit 1\n'


def test_an_orphan_whose_del_failed_is_a_failed_repair_in_the_journal_metrics_and_summary(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Both addresses of one attachment (one DEL): each record is a failed repair (err), and
    the DEL's failure is counted once, by its plugin, as an entry's is."""
    bin_dir, store = fake_plugin_with_host_local(crashed, "failing", FAILING, "10.31.0")
    for ip in ("10.31.0.2", "10.31.0.3"):
        (store / ip).write_bytes(f"{A}\r\neth0".encode())
    crashed.reboot()
    metrics = tmp_path / "cni-reaper.prom"
    logged: list[dict[str, str]] = []

    code = cli.run(
        crashed.argv("--json", "--bin-dir", str(bin_dir), "--metrics-file", str(metrics)),
        clock=lambda: crashed.t0 + 60,
        events=EventLog(lambda **fields: logged.append(fields)),
        environ={},
    )
    report = json.loads(capsys.readouterr().out)

    assert code == ExitCode.ACTION_FAILED
    records = [f for f in logged if f.get("CNI_REAPER_FILE", "").startswith(str(store))]
    assert len(records) == 2, logged
    for record in records:
        assert record["MESSAGE_ID"] == Event.REPAIR_FAILED.message_id, record
        assert record["PRIORITY"] == "3", record
        assert record["CNI_REAPER_EVENT"] == "repair-failed"
    # Released into the quarantine all the same:
    assert not (store / "10.31.0.2").exists() and not (store / "10.31.0.3").exists()
    assert report["summary"]["plugin_errors"] == 1, report["summary"]
    text = metrics.read_text()
    assert 'cni_reaper_del_failures{plugin="failing"} 1\n' in text, text
    assert "cni_reaper_del_failures_all_plugins 1\n" in text, text


def test_a_dry_run_says_why_an_orphans_del_will_fail_and_what_it_will_run(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """An orphan of a network no config names any more, and one of a network that has one."""
    vanished = crashed.ipam / "vanished"
    vanished.mkdir(parents=True)
    (vanished / "10.41.0.2").write_bytes(f"{B}\r\neth0".encode())
    crashed.add(A).unlink()  # hl's address of A: an orphan, its network configured
    crashed.reboot()

    code = cli.run(crashed.argv("--dry-run"), clock=lambda: crashed.t0 + 60, environ={})
    out = capsys.readouterr().out

    assert code == ExitCode.ACTION_FAILED  # a DEL it plans will fail
    assert "None" not in out, out
    assert "no plugin" not in out, out
    assert "    DEL vanished as eth0 with no config\n    DEL will fail: no config" in out, out
    assert f"    DEL hl as eth0 from {crashed.node.root}/etc/cni/net.d/" in out, out
    # Not "outside every range: 0 addresses": no range of it is known.
    pool = "pool vanished of no range known: 1 reserved before"
    assert f"{pool}, 1 to release, 0 left\n" in out, out


def test_an_entry_whose_del_cannot_run_says_why_once_in_a_real_run(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its network names a plugin that is nowhere: the dry run says the DEL will fail, the
    real run that it did not run; each says why once."""
    conf = {
        "cniVersion": "1.0.0",
        "name": "gone",
        "plugins": [{"type": "no-such-plugin"}],
    }
    crashed.node.write_conf("20-gone.conflist", json.dumps(conf).encode())
    crashed.node.write_result(f"gone-{A}-eth0", b"")
    crashed.reboot()
    why = "failed to find plugin 'no-such-plugin'"

    cli.run(crashed.argv("--dry-run"), clock=lambda: crashed.t0 + 60, environ={})
    dry = capsys.readouterr().out
    code = cli.run(crashed.argv(), clock=lambda: crashed.t0 + 60, environ={})
    real = capsys.readouterr().out

    assert dry.count(why) == 1 and "    DEL will fail: plugin 'no-such-plugin'" in dry, dry
    assert code == ExitCode.ACTION_FAILED
    assert real.count(why) == 1 and "    error: DEL not run: plugin 'no-such-plugin'" in real, real
    assert "will fail" not in real, real


def test_an_orphan_left_at_the_deadline_says_why_once(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """A damaged entry whose plugin hangs holds the run past its deadline; the orphan's DEL,
    after it, is not started: its error says why, its problem what that left."""
    bin_dir, store = fake_plugin_with_host_local(crashed, "slow", "sleep 60\n", "10.70.0")
    crashed.node.write_result(f"slow-{A}-eth0", b"")
    (store / "10.70.0.9").write_bytes(f"{B}\r\neth0".encode())
    crashed.reboot()

    code = cli.run(
        crashed.argv("--bin-dir", str(bin_dir), "--deadline", "1", "--parallel", "1"),
        clock=lambda: crashed.t0 + 60,
        environ={},
    )
    out = capsys.readouterr().out
    orphan = out.split(f"{store}/10.70.0.9:")[1].split("\npool ")[0]

    assert code == ExitCode.ACTION_FAILED
    assert orphan.count("the run's deadline") == 1, orphan
    assert orphan.endswith("\n    problem: still reserved, left for the next run's DEL"), orphan
    assert (store / "10.70.0.9").exists()


def test_the_journal_summary_says_why_a_boot_whose_runtime_started_first_repairs_nothing(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under the unit the journal is all there is: its summary record carries the sentence
    the text report's head has on the pre-runtime record."""
    crashed.add(A).write_bytes(b"")
    crashed.reboot()
    crashed.node.runtime_starts()
    logged: list[dict[str, str]] = []

    code, _ = crashed.run(capsys, events=EventLog(lambda **fields: logged.append(fields)))

    assert code == ExitCode.DATA  # left alone
    (summary,) = [f for f in logged if f.get("CNI_REAPER_EVENT") == "summary"]
    said = summary["CNI_REAPER_PRE_RUNTIME_RECORD"]
    assert said.startswith("no pre-runtime record: a runtime has started in this boot"), said


def test_the_journal_says_why_a_del_cannot_run_in_one_field_for_entries_and_reservations(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """A network no config names any more: its damaged entry and its orphaned address. The
    dry run's records and the real run's carry why, each in CNI_REAPER_PLUGIN_ERRORS."""
    crashed.node.write_result(f"vanished-{A}-eth0", b"")
    vanished = crashed.ipam / "vanished"
    vanished.mkdir(parents=True)
    (vanished / "10.41.0.2").write_bytes(f"{B}\r\neth0".encode())
    crashed.reboot()

    for extra, said in (("--dry-run", "DEL will fail: "), ("-v", "DEL not run: ")):
        logged: list[dict[str, str]] = []
        crashed.run(capsys, extra, events=EventLog(lambda logged=logged, **f: logged.append(f)))
        records = [f for f in logged if "vanished" in f.get("CNI_REAPER_FILE", "")]
        assert len(records) == 2, logged
        for record in records:
            errors = record.get("CNI_REAPER_PLUGIN_ERRORS", "")
            assert errors.startswith(said) and "vanished" in errors, record


def test_an_entry_says_whether_its_del_ran_and_the_summary_that_it_was_moved_all_the_same(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two damaged entries of a network whose plugin fails: each DEL ran and failed, each file
    was moved; a third entry of the network, written in this boot, is left, its DEL not run."""
    bin_dir = crashed.node.fake_plugin_network("fl", "fl", FAILING)
    for container_id in (A, B):
        crashed.node.write_result(f"fl-{container_id}-eth0", b"")
    crashed.reboot()

    code = cli.run(
        crashed.argv("--bin-dir", str(bin_dir)), clock=lambda: crashed.t0 + 60, environ={}
    )
    out = capsys.readouterr().out

    assert code == ExitCode.ACTION_FAILED
    conf = crashed.node.conf_dir / "60-fl.conflist"
    assert out.count(f"    DEL fl from {conf}: fl (ran: fl)\n") == 2, out
    said = "0 done, 2 failed (2 of them moved to the quarantine all the same), 0 left alone"
    assert f"summary: 2 entries (2 empty); 2 del-and-quarantine; {said}; exit 73" in out, out


def test_a_dels_released_addresses_are_said(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real host-local: the DEL of a damaged entry releases its address."""
    crashed.add(A).write_bytes(b"")
    held = crashed.ips()
    crashed.reboot()

    code = cli.run(crashed.argv(), clock=lambda: crashed.t0 + 60, environ={})
    out = capsys.readouterr().out

    assert code == ExitCode.OK
    (ip,) = held
    assert f": host-local, host-local (ran: host-local; released {ip})\n" in out, out


@pytest.mark.parametrize(
    ("stdout", "exit_status", "said"),
    [
        (b'{"code":11,"msg":"try again","details":"busy"}', 1, " (CNI error 11): try again; busy"),
        (b"", 2, " (exit 2): netplugin failed: 'boom'"),
        (b"", -11, ": killed by SIGSEGV"),
    ],
)
def test_a_plugin_error_says_its_cni_code_or_else_its_exit_status(
    stdout: bytes, exit_status: int, said: str
) -> None:
    """The code says what kind of failure it is (11: try again later); the JSON report had it,
    the text and the journal did not."""
    run = PluginRun(exit_status, stdout, b"boom\n", timed_out=False, output_truncated=False)

    error = error_from_run("p", run, 10.0)

    assert str(error) == f"plugin type='p' failed{said}"


def test_an_orphan_whose_del_failed_then_changed_is_left_and_said_so_as_an_entry_would_be(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Its plugin writes the reservation again (the same bytes: a new mtime), then fails: the
    move finds it changed and leaves it. As an entry changed after its DEL, it is left alone
    (exit 65), its plugin errors counted but no DEL failure, and no summary claims it moved.
    Found by the review of this file's fixes."""
    store_path = "/var/lib/cni/networks/rewriting/10.62.0.5"  # as the confined plugin sees it
    owner = f"{A}\\r\\neth0"
    script = f"printf '{owner}' > {store_path}\n{FAILING}"
    bin_dir, store = fake_plugin_with_host_local(crashed, "rewriting", script, "10.62.0")
    (store / "10.62.0.5").write_bytes(owner.encode().decode("unicode_escape").encode())
    crashed.reboot()
    metrics = tmp_path / "cni-reaper.prom"
    logged: list[dict[str, str]] = []

    code, report = crashed.run(
        capsys,
        "--bin-dir",
        str(bin_dir),
        "--metrics-file",
        str(metrics),
        events=EventLog(lambda **fields: logged.append(fields)),
    )

    (held,) = [r for r in report["host_local"] if r["ip"] == "10.62.0.5"]
    assert (held["outcome"], held["del"]["plugin_errors"][0]["code"]) == ("skipped", 11), (
        held["del"],
        held.get("problem"),
    )
    assert code == ExitCode.DATA, report["summary"]
    assert (store / "10.62.0.5").exists()
    (summary,) = [f for f in logged if f.get("CNI_REAPER_EVENT") == "summary"]
    assert "moved after a DEL" not in summary["MESSAGE"], summary
    (record,) = [f for f in logged if f.get("CNI_REAPER_FILE") == str(store / "10.62.0.5")]
    assert record["CNI_REAPER_EVENT"] == "left", record
    assert "cni_reaper_del_failures_all_plugins 0\n" in metrics.read_text()


def test_an_orphan_whose_del_cannot_run_is_counted_as_a_failed_del_and_said_once(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """No config names its network: released into the quarantine all the same (exit 73), its
    DEL's failure counted as an entry's is, its cause said once in the text (the error), the
    problem what it left. Found by the review of this file's fixes."""
    vanished = crashed.ipam / "vanished"
    vanished.mkdir(parents=True)
    (vanished / "10.41.0.2").write_bytes(f"{B}\r\neth0".encode())
    crashed.reboot()
    metrics = tmp_path / "cni-reaper.prom"

    code = cli.run(
        crashed.argv("--metrics-file", str(metrics)), clock=lambda: crashed.t0 + 60, environ={}
    )
    out = capsys.readouterr().out

    assert code == ExitCode.ACTION_FAILED
    assert out.count("no config for network 'vanished'") == 1, out
    assert "    error: DEL not run: no config for network 'vanished'" in out, out
    assert "    problem: DEL not run, and the address is still reserved\n" in out, out
    assert 'cni_reaper_del_failures{plugin="none"} 1\n' in metrics.read_text()
    assert not (vanished / "10.41.0.2").exists()


def test_an_orphan_whose_del_exited_0_and_left_it_reserved_is_a_failed_repair_as_an_entry(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """A plugin that exits 0 on DEL and never hands it to its IPAM (a failure mode no real
    plugin shows on cue): the address, still reserved, goes to the quarantine, and the run
    says the DEL did not do what it said, as of an entry's DEL (exit 73, host-local's DEL
    failure counted, a failed repair), where it said done with exit 0. Found by the review of
    this file's fixes."""
    bin_dir, store = fake_plugin_with_host_local(crashed, "forgetful", "exit 0\n", "10.30.0")
    (store / "10.30.0.2").write_bytes(f"{A}\r\neth0".encode())
    crashed.reboot()
    metrics = tmp_path / "cni-reaper.prom"

    code = cli.run(
        crashed.argv("--bin-dir", str(bin_dir), "--metrics-file", str(metrics)),
        clock=lambda: crashed.t0 + 60,
        environ={},
    )
    out = capsys.readouterr().out

    assert code == ExitCode.ACTION_FAILED
    said = f"every plugin exited 0, but {store} still holds 10.30.0.2 for this attachment"
    assert f"    error: plugin type='host-local' failed: {said}\n" in out, out
    assert "    problem: DEL ran, and the address is still reserved\n" in out, out
    assert not (store / "10.30.0.2").exists()
    assert 'cni_reaper_del_failures{plugin="host-local"} 1\n' in metrics.read_text()
