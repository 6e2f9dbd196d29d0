"""The metrics file as Debian's node_exporter reads it: the real prometheus-node-exporter, as
its own user `prometheus` (as its unit runs it), scrapes a textfile directory into which the
reaper wrote as root under the unit's UMask=0077, over loopback in a network namespace of its
own. Needs root, setpriv and unshare (util-linux), ip (iproute2) and the Debian package
prometheus-node-exporter, which also makes the user."""

from __future__ import annotations

import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import cni_reaper
from cni_reaper import metrics
from tests.crashed import Crashed
from tests.nodetree import CONTAINER_IDS
from tests.private_node import cannot_run

REPO = Path(cni_reaper.__file__).resolve().parent.parent
NODE_EXPORTER = "/usr/bin/prometheus-node-exporter"
USER = "prometheus"  # the user Debian's package makes and its unit runs as

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(textfile_dir: Path) -> Samples:
    """/metrics as the real node_exporter serves it, reading textfile_dir as its own user."""
    if os.geteuid() != 0:
        cannot_run("needs root, to unshare a network namespace and run node_exporter as its user")
    if not os.access(NODE_EXPORTER, os.X_OK):
        cannot_run(f"needs {NODE_EXPORTER} (Debian package prometheus-node-exporter)")
    try:
        pwd.getpwnam(USER)
    except KeyError:
        cannot_run(f"no user {USER!r}: the prometheus-node-exporter package makes it")
    for tool, package in (("unshare", "util-linux"), ("setpriv", "util-linux"), ("ip", "iproute2")):
        if shutil.which(tool) is None:
            cannot_run(f"needs {tool} ({package})")
    scenario = [sys.executable, "-m", "tests.node_exporter_scenario", str(textfile_dir), USER]
    done = subprocess.run(
        ["unshare", "--net", *scenario],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    found: Samples = {}
    for family in text_string_to_metric_families(done.stdout):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


@pytest.fixture
def textfile_dir() -> Iterator[Path]:
    """A textfile directory as Debian's package makes it (root's, 0755), on a path node_exporter's
    user can reach: pytest's own tmp dirs are root's alone (0700)."""
    top = tempfile.mkdtemp(prefix="cni-reaper-node-exporter-")
    os.chmod(top, 0o711)  # noqa: S103 (only to pass through, for node_exporter's user)
    directory = Path(top) / "node-exporter"
    directory.mkdir(mode=0o755)
    try:
        yield directory
    finally:
        shutil.rmtree(top)


def test_the_node_exporter_user_cannot_read_a_file_left_to_the_umask(textfile_dir: Path) -> None:
    """The control: what the unit's UMask=0077 made of the file before its mode was set. This is
    the failure the next test shows gone, with the same exporter and the same user."""
    prom = textfile_dir / "cni-reaper.prom"
    prom.write_text("cni_reaper_exit_code 0\n")
    prom.chmod(0o600)

    found = scrape(textfile_dir)

    assert found[("node_textfile_scrape_error", ())] == 1
    assert not any(name.startswith("cni_reaper_") for name, _ in found)


def test_node_exporter_serves_what_a_run_under_umask_077_wrote(
    crashed: Crashed, textfile_dir: Path
) -> None:
    crashed.add(CONTAINER_IDS[0])
    crashed.add(CONTAINER_IDS[1]).write_bytes(b"")
    crashed.reboot_now()  # the reaper below runs on the real clock
    prom = textfile_dir / "cni-reaper.prom"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for variable in ("JOURNAL_STREAM", "NOTIFY_SOCKET"):
        env.pop(variable, None)

    run = subprocess.run(
        [sys.executable, "-m", "cni_reaper", *crashed.argv("--metrics-file", str(prom))],
        umask=0o077,
        env=env,
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert run.returncode == 0, run.stderr
    assert stat.S_IMODE(prom.stat().st_mode) == 0o644
    assert (prom.stat().st_uid, sorted(os.listdir(textfile_dir))) == (0, ["cni-reaper.prom"])
    found = scrape(textfile_dir)
    assert found[("node_textfile_scrape_error", ())] == 0
    assert found[("cni_reaper_exit_code", ())] == 0
    assert found[("cni_reaper_dry_run", ())] == 0
    assert found[("cni_reaper_entries", (("content", "valid"),))] == 1
    assert found[("cni_reaper_entries", (("content", "empty"),))] == 1
    assert (
        found[("cni_reaper_actions", (("action", "del-and-quarantine"), ("outcome", "done")))] == 1
    )
    assert found[("cni_reaper_actions", (("action", "leave"), ("outcome", "skipped")))] == 0
    assert found[("cni_reaper_del_failures_all_plugins", ())] == 0
    assert found[("cni_reaper_previous_boot_crashed", ())] == 1
    pool = (("network", "hl"), ("range_set", "0"))
    assert found[("cni_reaper_pool_capacity", pool)] == 253
    assert found[("cni_reaper_pool_released", pool)] == 1
    assert found[("cni_reaper_pool_left", (*pool[:1], ("owner", "runtime"), *pool[1:]))] == 1
    assert found[("cni_reaper_pool_left", (*pool[:1], ("owner", "failed"), *pool[1:]))] == 0
    build = found[
        (
            "cni_reaper_build_info",
            (
                ("python", ".".join(map(str, sys.version_info[:3]))),
                ("version", cni_reaper.__version__),
            ),
        )
    ]
    assert build == 1
    assert found[("cni_reaper_last_run_timestamp_seconds", ())] == pytest.approx(
        prom.stat().st_mtime, abs=60
    )
    # node_exporter's own account of the file: it read this one.
    assert found[("node_textfile_mtime_seconds", (("file", str(prom)),))] == pytest.approx(
        prom.stat().st_mtime, abs=1
    )
    assert metrics.FILE_MODE == 0o644


# --- one textfile path everywhere -------------------------------------------------------------

UNIT_METRICS_FILE = "/var/lib/prometheus/node-exporter/cni-reaper.prom"
DOCUMENTS = (
    "systemd/cni-reaper.service",
    "README.md",
    "man/cni-reaper.8",
    "packaging/README.md",
    "monitoring/cni-reaper.rules.yml",
)


def test_the_unit_writes_where_debians_node_exporter_reads() -> None:
    if not os.access(NODE_EXPORTER, os.X_OK):
        cannot_run(f"needs {NODE_EXPORTER} (Debian package prometheus-node-exporter)")
    done = subprocess.run([NODE_EXPORTER, "--help"], capture_output=True, text=True)
    default = re.search(r'--collector\.textfile\.directory="([^"]*)"', done.stdout + done.stderr)
    assert default is not None, done.stderr
    assert default.group(1) == os.path.dirname(UNIT_METRICS_FILE)

    unit = (REPO / "systemd/cni-reaper.service").read_text()
    assert f"ExecStart=/usr/bin/cni-reaper --metrics-file {UNIT_METRICS_FILE}\n" in unit
    # Writable under ProtectSystem=strict; "-": a node without node_exporter lacks it.
    read_write = re.findall(r"^ReadWritePaths=(.*)$", unit, re.M)
    assert f"-{default.group(1)}" in " ".join(read_write).split()


def test_every_document_names_the_same_textfile_path() -> None:
    for document in DOCUMENTS:
        text = (REPO / document).read_text().replace("\\-", "-").replace("\\%", "")
        assert UNIT_METRICS_FILE in text, document
        named = set(re.findall(r"/var/lib/[\w./-]*\.prom\b", text))
        assert named == {UNIT_METRICS_FILE}, document
        assert "/var/lib/node_exporter" not in text, document
