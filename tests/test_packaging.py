"""The Debian package built with the Debian toolchain and installed into a fresh Debian root, and
the RPM spec parsed by rpmspec."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from cni_reaper import __version__
from cni_reaper.evidence import wtmp
from cni_reaper.journal import Event
from tests.nodetree import NodeTree
from tests.private_node import cannot_run, tree_digest, unshare

REPO = Path(__file__).resolve().parent.parent
# Made by packaging/debian-root.sh, which .ci/run calls before the tests: tests download nothing.
DEBIAN_ROOT = Path(os.environ.get("CNI_REAPER_DEBIAN_ROOT", REPO / ".test-cache/debian-root.tar"))
CLEAN_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
BUILD_TOOLS = ("dpkg-buildpackage", "dh", "dh_python3", "dpkg-deb")


@pytest.fixture(scope="module")
def deb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    missing = [tool for tool in BUILD_TOOLS if shutil.which(tool, path=CLEAN_ENV["PATH"]) is None]
    if missing or not Path("/usr/share/dh-python/dhpython/build/plugin_pyproject.py").exists():
        cannot_run("needs debhelper, dh-python and pybuild-plugin-pyproject to build the package")
    out = tmp_path_factory.mktemp("deb")
    proc = subprocess.run(
        [str(REPO / "packaging/build-deb.sh"), str(out)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return Path(proc.stdout.strip().splitlines()[-1])


def test_deb_is_named_for_the_version_and_holds_the_layout(deb: Path) -> None:
    assert deb.name == f"cni-reaper_{__version__}_all.deb"
    field = subprocess.run(
        ["dpkg-deb", "--field", str(deb), "Depends"], capture_output=True, text=True, check=True
    ).stdout
    depends = {d.strip() for d in field.split(",")}
    assert {"python3 (>= 3.9)", "python3-pyudev", "python3-systemd"} <= depends
    listing = subprocess.run(
        ["dpkg-deb", "--contents", str(deb)], capture_output=True, text=True, check=True
    ).stdout
    for path in (
        "./usr/bin/cni-reaper",
        "./lib/systemd/system/cni-reaper.service",
        "./lib/systemd/system/containerd.service.d/10-cni-reaper.conf",
        "./lib/systemd/system/crio.service.d/10-cni-reaper.conf",
        "./usr/share/man/man8/cni-reaper.8.gz",
        "./usr/lib/systemd/catalog/cni-reaper.catalog",
        "./usr/lib/python3/dist-packages/cni_reaper/cli.py",
        "./usr/lib/python3/dist-packages/cni_reaper/evidence/wtmp.py",
        "./usr/lib/python3/dist-packages/cni_reaper/runtime/config.py",
        "./etc/cni-reaper/",
    ):
        assert f" {path}\n" in listing, path


def chroot(root: Path, *command: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["chroot", str(root), *command], capture_output=True, text=True, env=CLEAN_ENV
    )


def stage_crashed_example(node_dir: Path) -> None:
    """The shipped crashed-node tree, as a node that has just rebooted after a crash."""
    shutil.copytree(REPO / "examples/crashed-node", node_dir)
    (node_dir / "var/lib/cni/results").chmod(0o700)
    time.sleep(3.2)  # the crash: the next boot begins clearly after the last write
    now = time.time()
    node = NodeTree(node_dir)
    node.boot(now - 7200)
    node.shutdown(now - 3700)
    node.boot(now - 3600)
    node.records.append(wtmp.boot_record(now - 0.5))
    node.write_boot_world(btime=now - 1, boot_id=str(uuid.uuid4()))


def test_installed_into_a_fresh_debian_root(deb: Path, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        cannot_run("needs root to unpack a Debian root and chroot into it")
    if not DEBIAN_ROOT.is_file():
        cannot_run(f"no Debian root at {DEBIAN_ROOT}: run packaging/debian-root.sh {DEBIAN_ROOT}")
    root = tmp_path / "root"
    root.mkdir()
    subprocess.run(["tar", "-C", str(root), "-xpf", str(DEBIAN_ROOT)], check=True)
    shutil.copy(deb, root / "tmp" / deb.name)

    install = chroot(root, "dpkg", "-i", f"/tmp/{deb.name}")

    assert install.returncode == 0, install.stdout + install.stderr
    # Enabled, as dh_installsystemd does it, but never started (no systemd runs here anyway).
    wants = root / "etc/systemd/system/multi-user.target.wants/cni-reaper.service"
    assert os.readlink(wants) == "/lib/systemd/system/cni-reaper.service"
    for shipped in ("cni-reaper.service", "containerd.service.d/10-cni-reaper.conf"):
        installed = root / "lib/systemd/system" / shipped
        assert installed.read_bytes() == (REPO / "systemd" / shipped).read_bytes()
    assert (root / "usr/share/man/man8/cni-reaper.8.gz").is_file()
    # Where systemd's dpkg trigger (interest in /usr/lib/systemd/catalog) has journalctl find
    # it: what that trigger runs, run here, lists the reaper's IDs.
    catalog = root / "usr/lib/systemd/catalog/cni-reaper.catalog"
    assert catalog.read_bytes() == (REPO / "systemd/cni-reaper.catalog").read_bytes()
    if shutil.which("journalctl"):
        subprocess.run(["journalctl", f"--root={root}", "--update-catalog"], check=True)
        listed = subprocess.run(
            ["journalctl", f"--root={root}", "--list-catalog"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert listed.count(" cni-reaper: ") == len(Event)
    version = chroot(root, "cni-reaper", "--version")
    assert (version.returncode, version.stdout.strip()) == (0, f"cni-reaper {__version__}")

    stage_crashed_example(root / "srv/node")
    before = tree_digest(root / "srv/node")
    # With a /proc of its own, as a node has: without one, nothing says no runtime runs.
    dry = subprocess.run(
        [
            *unshare(pid=False),
            "--pid",
            "--fork",
            f"--mount-proc={root / 'proc'}",
            "chroot",
            str(root),
            "cni-reaper",
            "--dry-run",
            "--json",
            "--root",
            "/srv/node",
        ],
        capture_output=True,
        text=True,
        env=CLEAN_ENV,
    )

    # The fresh root has no CNI plugins: the dry run says that the DELs will fail, and exits as
    # the real run would.
    assert dry.returncode == 73, dry.stderr
    assert tree_digest(root / "srv/node") == before
    report = json.loads(dry.stdout)
    assert report["version"] == __version__
    actions = {e["path"]: (e["action"], e["outcome"]) for e in report["entries"]}
    planned = [path for path, (_, outcome) in actions.items() if outcome == "planned"]
    assert len(planned) == 4
    for entry in report["entries"]:
        if entry["action"] == "del-and-quarantine":
            assert entry["del"]["config_problem"].endswith(": no plugin dirs")
    assert {action for action, _ in actions.values()} == {
        "del-and-quarantine",
        "quarantine",
        "keep",
    }


def test_rpm_spec_parses_with_the_same_layout() -> None:
    rpmspec = shutil.which("rpmspec")
    if rpmspec is None:
        cannot_run("needs rpmspec (Debian package rpm)")
    spec = REPO / "packaging/rpm/cni-reaper.spec"
    # What systemd-rpm-macros defines on Fedora; Debian's rpm package does not carry it.
    defines = [
        "--define=_unitdir /usr/lib/systemd/system",
        "--define=_presetdir /usr/lib/systemd/system-preset",
        "--define=_journalcatalogdir /usr/lib/systemd/catalog",
    ]
    parsed = subprocess.run([rpmspec, "-P", *defines, str(spec)], capture_output=True, text=True)
    assert parsed.returncode == 0, parsed.stderr
    assert parsed.stderr == ""
    text = parsed.stdout
    for line in (
        f"Version:        {__version__}",
        "Requires:       python3 >= 3.9",
        "Requires:       python3-pyudev",
        "Requires:       python3-systemd",
        "%systemd_post cni-reaper.service",
        "/usr/lib/systemd/system/cni-reaper.service",
        "/usr/lib/systemd/system/containerd.service.d/10-cni-reaper.conf",
        "/usr/lib/systemd/system/crio.service.d/10-cni-reaper.conf",
        "/usr/lib/systemd/system-preset/80-cni-reaper.preset",
        "/usr/lib/systemd/catalog/cni-reaper.catalog",
        "%{_mandir}/man8/cni-reaper.8*".replace("%{_mandir}", "/usr/share/man"),
    ):
        assert line in text, line
    queried = subprocess.run(
        [rpmspec, "-q", "--srpm", "--queryformat=%{NAME} %{VERSION}", *defines, str(spec)],
        capture_output=True,
        text=True,
    )
    assert queried.stdout == f"cni-reaper {__version__}"
