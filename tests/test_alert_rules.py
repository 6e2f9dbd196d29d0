"""monitoring/cni-reaper.rules.yml, checked and unit-tested by promtool (Debian package
prometheus). The input series are not written by hand: each node's are the metrics file of a
real run on a node in the state the alert is about, read back as node_exporter serves it (with
its instance and job), so a renamed series or label breaks this test. Only node_boot_time_seconds
is node_exporter's own. Everything is written under tmp_path."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

import cni_reaper
from cni_reaper import cli
from tests.crashed import Crashed
from tests.libcni import add_network_list
from tests.nodetree import CONTAINER_IDS, NodeTree, have_plugins, host_local_conflist
from tests.private_node import cannot_run

REPO = Path(cni_reaper.__file__).resolve().parent.parent
RULES = REPO / "monitoring/cni-reaper.rules.yml"
JOB = "node"
MINUTES = 90  # each series holds its value this long, one sample a minute
EVAL_AT = "60m"  # past every rule's for:


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        cannot_run("needs promtool (Debian package prometheus)")
    return found


def test_promtool_checks_the_rules() -> None:
    done = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 6 rules found" in done.stdout


# --- the nodes: each a real run, its metrics file kept -----------------------------------------


def repaired(crashed: Crashed) -> None:
    """A zero-byte entry of the previous boot: DEL replayed, quarantined; nothing to alert on."""
    crashed.add(CONTAINER_IDS[0]).write_bytes(b"")
    crashed.reboot()


def failed(crashed: Crashed) -> None:
    """A damaged entry of a network no config names: its DEL cannot run (exit 73)."""
    crashed.node.write_result(f"gone-net-{CONTAINER_IDS[1]}-eth0", b"")
    crashed.reboot()


def left(crashed: Crashed) -> None:
    """A results entry that is a symlink: reported, never touched (exit 65)."""
    crashed.node.results.mkdir(parents=True, exist_ok=True)
    os.symlink("/etc/hostname", crashed.node.results / f"hl-{CONTAINER_IDS[2]}-eth0")
    crashed.reboot()


def multus_left(crashed: Crashed) -> None:
    """One of Multus's delegate results that is a symlink: reported, never touched (exit 65)."""
    results = crashed.node.root / "var/lib/cni/multus/results"
    results.mkdir(parents=True)
    os.symlink("/etc/hostname", results / f"hl-{CONTAINER_IDS[8]}-eth0")
    crashed.reboot()


def full(crashed: Crashed) -> None:
    """A /29 pool (5 addresses: the gateway is not handed out) whose every address belongs to
    a whole entry the runtime will DEL: nothing to repair, no address free."""
    conflist = host_local_conflist("small", "10.23.0.0/29")
    crashed.node.write_conf("20-small.conflist", conflist)
    for container_id in CONTAINER_IDS[3:8]:
        add_network_list(conflist, container_id, "eth0", "/run/netns/x", crashed.node.root)
    crashed.reboot()


def uninspected(crashed: Crashed) -> None:
    """The results dir is a symlink: the run inspects nothing (exit 65, as for damage left
    alone, but with no cni_reaper_actions): it alerted on nothing before (found by an
    operator's review)."""
    crashed.results_dir_links_to(crashed.node.root / "elsewhere")


def refused(crashed: Crashed) -> None:
    """containerd answers on its socket: the run is refused (exit 75), changing nothing."""
    crashed.reboot()
    (crashed.node.root / "run/containerd").mkdir(parents=True)


NODES: dict[str, Callable[[Crashed], None]] = {
    "repaired": repaired,
    "failed": failed,
    "left": left,
    "multus_left": multus_left,
    "full": full,
    "refused": refused,
    "uninspected": uninspected,
}


def run_node(tmp_path: Path, name: str, setup: Callable[[Crashed], None]) -> tuple[int, Path]:
    crashed = Crashed(NodeTree(tmp_path / name / "root"), time.time())
    setup(crashed)
    prom = tmp_path / name / "cni-reaper.prom"
    argv = crashed.argv("--metrics-file", str(prom))
    if name == "refused":
        with listening(crashed.node.root / "run/containerd/containerd.sock"):
            code = cli.main(argv, clock=lambda: crashed.t0 + 60, environ={})
    else:
        code = cli.main(argv, clock=lambda: crashed.t0 + 60, environ={})
    return code, prom


@contextlib.contextmanager
def listening(path: Path) -> Iterator[None]:
    """A unix socket that answers, for the time of a with block."""
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        server.listen(1)
        yield


@pytest.fixture
def written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Iterator[dict[str, Path]]:
    if not have_plugins():
        cannot_run("containernetworking-plugins is not installed")
    if os.geteuid() != 0:
        cannot_run("needs root: plugins run confined to the node's root (repair/confine.py)")
    files, codes = {}, {}
    for name, setup in NODES.items():
        codes[name], files[name] = run_node(tmp_path, name, setup)
    capsys.readouterr()
    # The states the alerts are about, as the exit codes say them.
    assert codes == {
        "repaired": 0,
        "failed": 73,
        "left": 65,
        "multus_left": 65,
        "full": 0,
        "refused": 75,
        "uninspected": 65,
    }
    yield files


# --- from a metrics file to promtool's input ---------------------------------------------------


def series_of(prom: Path, instance: str) -> list[tuple[str, float]]:
    """Each sample of the file as promtool's input series, with the labels scraping adds."""
    found = []
    for family in text_string_to_metric_families(prom.read_text()):
        for sample in family.samples:
            labels = {**sample.labels, "instance": instance, "job": JOB}
            inside = ",".join(f"{k}={json.dumps(v)}" for k, v in sorted(labels.items()))
            found.append((f"{sample.name}{{{inside}}}", sample.value))
    return found


def constant(value: float) -> str:
    return f"{value!r}x{MINUTES}" if not float(value).is_integer() else f"{int(value)}x{MINUTES}"


def timestamp(prom: Path) -> float:
    match = re.search(r"^cni_reaper_last_run_timestamp_seconds (\S+)$", prom.read_text(), re.M)
    assert match is not None
    return float(match.group(1))


def expanded_annotations(alert: str, labels: dict[str, str], value: float) -> dict[str, str]:
    """The rule's annotations as Prometheus expands them, for the only template actions the
    file uses ($labels.X and $value), so that the test can say which alert fires with what."""
    rule = RULE_ANNOTATIONS[alert]
    expanded = {}
    for key, template in rule.items():
        text = template.replace("{{ $value }}", f"{value:g}")
        for name, label in labels.items():
            text = text.replace(f"{{{{ $labels.{name} }}}}", label)
        assert "{{" not in text, f"{alert}.{key}: a template this test cannot expand"
        expanded[key] = text
    return expanded


def rule_annotations() -> dict[str, dict[str, str]]:
    """Each alert's annotations, read from the rules file as it is laid out: each on one line,
    a double-quoted YAML string with no escape in it (which reads as JSON does)."""
    found: dict[str, dict[str, str]] = {}
    alert: str | None = None
    current: dict[str, str] = {}
    for line in RULES.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("- alert: "):
            alert = stripped[len("- alert: ") :]
            current = found.setdefault(alert, {})
        elif alert and re.match(r"(summary|description): ", stripped):
            key, _, text = stripped.partition(": ")
            current[key] = json.loads(text)
    return found


RULE_ANNOTATIONS = rule_annotations()


def test_each_alert_fires_on_the_node_it_is_about_and_no_other(
    written: dict[str, Path], tmp_path: Path
) -> None:
    inputs: list[dict[str, Any]] = []
    for name, prom in written.items():
        inputs += [{"series": s, "values": constant(v)} for s, v in series_of(prom, name)]
        boot = timestamp(prom) - 120  # this boot began before the run
        inputs.append({"series": boot_time(name), "values": constant(boot)})
    # A node whose file is from the boot before this one.
    repaired = written["repaired"]
    inputs += [{"series": s, "values": constant(v)} for s, v in series_of(repaired, "stale")]
    inputs.append({"series": boot_time("stale"), "values": constant(timestamp(repaired) + 3600)})
    # A node with node_exporter and no file of the reaper's.
    inputs.append({"series": boot_time("absent"), "values": constant(timestamp(repaired))})

    base = {"instance": "", "job": JOB, "severity": "warning"}

    def alert(name: str, value: float, **labels: str) -> dict[str, Any]:
        all_labels = {**base, **labels}
        return {
            "exp_labels": all_labels,
            "exp_annotations": expanded_annotations(name, all_labels, value),
        }

    expected: dict[str, list[dict[str, Any]]] = {
        "CniReaperRepairFailed": [alert("CniReaperRepairFailed", 73, instance="failed")],
        "CniReaperDamageLeftAlone": [
            alert("CniReaperDamageLeftAlone", 1, instance=name) for name in ("left", "multus_left")
        ],
        "CniReaperRunFailed": [
            alert("CniReaperRunFailed", 75, instance="refused"),
            alert("CniReaperRunFailed", 65, instance="uninspected"),
        ],
        "CniReaperPoolNearlyExhausted": [
            alert(
                "CniReaperPoolNearlyExhausted",
                0,
                instance="full",
                network="small",
                range_set="0",
            )
        ],
        "CniReaperNotRunThisBoot": [alert("CniReaperNotRunThisBoot", 0, instance="stale")],
        "CniReaperMetricsAbsent": [alert("CniReaperMetricsAbsent", 0, instance="absent")],
    }
    assert set(expected) == set(RULE_ANNOTATIONS)  # every rule is tested
    for name in ("CniReaperNotRunThisBoot", "CniReaperMetricsAbsent"):
        # Their $value is a timestamp or a boot time: their annotations do not show it.
        assert "$value" not in json.dumps(RULE_ANNOTATIONS[name])
    tests = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": inputs,
                "alert_rule_test": [
                    {"eval_time": EVAL_AT, "alertname": name, "exp_alerts": alerts}
                    for name, alerts in expected.items()
                ],
            }
        ],
    }
    # JSON is YAML: promtool reads it as its test file.
    test_file = tmp_path / "cni-reaper.rules.test.yml"
    test_file.write_text(json.dumps(tests, indent=1))

    done = subprocess.run(
        [promtool(), "test", "rules", str(test_file)], capture_output=True, text=True
    )

    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def boot_time(instance: str) -> str:
    return f'node_boot_time_seconds{{instance="{instance}",job="{JOB}"}}'
