"""The Debian package built with the Debian toolchain, checked by lintian and installed into (and
purged from) a fresh Debian root; the Python sdist and wheel built with Debian 12's setuptools and
with a current one; the RPM built from the sdist by rpmbuild and checked by rpmlint."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import uuid
import zipfile
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
        # Drop-ins where systemd reads them on Debian 12 and 13 alike, and where trixie's
        # debhelper puts units: /usr/lib (on bookworm, /lib may not be merged into it).
        "./usr/lib/systemd/system/containerd.service.d/10-cni-reaper.conf",
        "./usr/lib/systemd/system/crio.service.d/10-cni-reaper.conf",
        "./usr/share/man/man8/cni-reaper.8.gz",
        "./usr/lib/systemd/catalog/cni-reaper.catalog",
        # The README holds the JSON report's schema ("JSON report (schema 1)").
        "./usr/share/doc/cni-reaper/README.md.gz",
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


def fresh_root(tmp_path: Path, deb: Path) -> Path:
    """The Debian root unpacked, with the package copied into its /tmp."""
    if os.geteuid() != 0:
        cannot_run("needs root to unpack a Debian root and chroot into it")
    if not DEBIAN_ROOT.is_file():
        cannot_run(f"no Debian root at {DEBIAN_ROOT}: run packaging/debian-root.sh {DEBIAN_ROOT}")
    root = tmp_path / "root"
    root.mkdir()
    subprocess.run(["tar", "-C", str(root), "-xpf", str(DEBIAN_ROOT)], check=True)
    shutil.copy(deb, root / "tmp" / deb.name)
    return root


def assert_runtime_units_get_the_drop_ins(root: Path) -> None:
    """The root's own systemd tools (Debian 12's, offline: no manager runs in a chroot) apply
    the drop-ins to the runtimes' units. The root has no runtime: a unit of each name stands in
    for the one containerd or CRI-O would ship."""
    if shutil.which("systemd-delta", path=str(root / "usr/bin")) is None:
        cannot_run(f"no systemd in {DEBIAN_ROOT}: rebuild it with packaging/debian-root.sh")
    for runtime in ("containerd", "crio"):
        unit = root / f"lib/systemd/system/{runtime}.service"
        unit.write_text(f"[Unit]\nDescription={runtime}\n[Service]\nExecStart=/bin/true\n")
    delta = chroot(root, "systemd-delta", "--no-pager", "--type=extended")
    for runtime in ("containerd", "crio"):
        drop_in = f"/usr/lib/systemd/system/{runtime}.service.d/10-cni-reaper.conf"
        assert re.search(rf"^\[EXTENDED\] +\S+/{runtime}\.service → {drop_in}$", delta.stdout, re.M)
    verified = chroot(
        root, "systemd-analyze", "verify", "--man=no", "cni-reaper.service", "containerd.service"
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    for runtime in ("containerd", "crio"):
        (root / f"lib/systemd/system/{runtime}.service").unlink()


def test_installed_into_a_fresh_debian_root(deb: Path, tmp_path: Path) -> None:
    root = fresh_root(tmp_path, deb)

    install = chroot(root, "dpkg", "-i", f"/tmp/{deb.name}")

    assert install.returncode == 0, install.stdout + install.stderr
    # Enabled, as dh_installsystemd does it, but never started (no systemd runs here anyway).
    wants = root / "etc/systemd/system/multi-user.target.wants/cni-reaper.service"
    assert os.readlink(wants) == "/lib/systemd/system/cni-reaper.service"
    assert (root / "lib/systemd/system/cni-reaper.service").read_bytes() == (
        REPO / "systemd/cni-reaper.service"
    ).read_bytes()
    for drop_in in ("containerd.service.d/10-cni-reaper.conf", "crio.service.d/10-cni-reaper.conf"):
        installed = root / "usr/lib/systemd/system" / drop_in
        assert installed.read_bytes() == (REPO / "systemd" / drop_in).read_bytes()
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
    assert (root / "usr/share/doc/cni-reaper/README.md.gz").is_file()
    assert_runtime_units_get_the_drop_ins(root)
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
            # and names the dirs it looked for (found by an operator's review)
            assert ": no plugin dirs; not there: " in entry["del"]["config_problem"]
            assert entry["del"]["config_problem"].endswith("/srv/node/usr/libexec/cni")
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
        # systemd-rpm-macros' %systemd_post where defined, else the spec's fallback.
        "systemctl --no-reload preset cni-reaper.service",
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


# The Debian 13 packages .ci/run fetches for the VM image (tests/vm/build_image.sh).
TRIXIE_DEBS = Path(
    os.environ.get("CNI_REAPER_VM_DEBS_TRIXIE", REPO / ".test-cache/vm-debs-trixie.tgz")
)


def test_drop_ins_sit_beside_trixies_own_units(deb: Path, tmp_path: Path) -> None:
    """On Debian 13 systemd and containerd ship their units in /usr/lib/systemd/system and
    nothing in /lib: the drop-ins go there on bookworm and trixie alike."""
    if not TRIXIE_DEBS.is_file():
        cannot_run(f"no Debian 13 packages at {TRIXIE_DEBS}: run tests/vm/build_image.sh debs")
    wanted = ["var/cache/apt/archives/containerd_*.deb", "var/cache/apt/archives/systemd_*.deb"]
    subprocess.run(
        ["tar", "-C", str(tmp_path), "-xzf", str(TRIXIE_DEBS), "--wildcards", *wanted], check=True
    )

    def contents(package: Path) -> list[str]:
        listing = subprocess.run(
            ["dpkg-deb", "--contents", str(package)], capture_output=True, text=True, check=True
        ).stdout
        return [line.split()[5] for line in listing.splitlines()]

    (containerd,) = tmp_path.glob("var/cache/apt/archives/containerd_*.deb")
    (systemd,) = tmp_path.glob("var/cache/apt/archives/systemd_*.deb")
    assert "./usr/lib/systemd/system/containerd.service" in contents(containerd)
    systemd_files = contents(systemd)
    assert "./usr/lib/systemd/system/systemd-journald.service" in systemd_files
    assert [f for f in systemd_files if f.startswith("./lib/")] == []
    ours = contents(deb)
    assert "./usr/lib/systemd/system/containerd.service.d/10-cni-reaper.conf" in ours


def test_postinst_reloads_systemd_and_starts_nothing(deb: Path) -> None:
    """dh_installsystemd --no-start adds no daemon-reload: the package's own postinst does, on
    configure, so that a running systemd reads the unit and the runtimes' drop-ins."""
    postinst = subprocess.run(
        ["dpkg-deb", "--info", str(deb), "postinst"], capture_output=True, text=True, check=True
    ).stdout
    reload = re.search(
        r'^if \[ "\$1" = configure \] && \[ -d /run/systemd/system \]; then\n'
        r"    systemctl --system daemon-reload >/dev/null \|\| true\nfi$",
        postinst,
        re.M,
    )
    assert reload is not None, postinst
    # After dh_installsystemd's enable, so that the reload sees the new symlink too.
    assert postinst.index("deb-systemd-helper enable") < reload.start()
    assert not re.search(r"deb-systemd-invoke|systemctl .*(start|restart)", postinst), postinst


def test_lintian_is_clean_on_the_package_and_its_source(deb: Path) -> None:
    lintian = shutil.which("lintian", path=CLEAN_ENV["PATH"])
    if lintian is None:
        cannot_run("needs lintian")
    changes = next(deb.parent.glob("cni-reaper_*.changes"))
    # The .changes names the .deb, the .dsc and the source tarball: lintian checks all three.
    checked = subprocess.run(
        [lintian, "--pedantic", "--fail-on=error,warning,pedantic", str(changes)],
        capture_output=True,
        text=True,
        env=CLEAN_ENV,
    )
    assert (checked.returncode, checked.stdout) == (0, ""), checked.stdout + checked.stderr


def test_purge_keeps_the_quarantine_as_evidence(deb: Path, tmp_path: Path) -> None:
    """A real run quarantines the crashed example's damaged files; purging the package removes
    what it installed and its enablement, and keeps /var/lib/cni-reaper (see the README)."""
    root = fresh_root(tmp_path, deb)
    install = chroot(root, "dpkg", "-i", f"/tmp/{deb.name}")
    assert install.returncode == 0, install.stdout + install.stderr
    stage_crashed_example(root / "srv/node")
    # The root made a mount point of its own (the reaper confines its plugins to /srv/node by
    # making the root's / private), with its own /proc, network and PIDs.
    run = subprocess.run(
        [
            *unshare(net=True, pid=False),
            "--pid",
            "--fork",
            f"--mount-proc={root / 'proc'}",
            "sh",
            "-c",
            'mount --rbind "$1" "$1" && exec chroot "$1" cni-reaper --root /srv/node'
            " --state-dir /var/lib/cni-reaper",
            "sh",
            str(root),
        ],
        capture_output=True,
        text=True,
        env=CLEAN_ENV,
    )
    # No CNI plugins in the root: the DELs fail (73), the damaged files are quarantined anyway.
    assert run.returncode == 73, run.stdout + run.stderr
    state = root / "var/lib/cni-reaper"
    quarantined = sorted(p.relative_to(state) for p in state.rglob("*") if p.is_file())
    assert len([p for p in quarantined if p.parts[0] == "quarantine"]) >= 4, quarantined

    purge = chroot(root, "dpkg", "--purge", "cni-reaper")

    assert purge.returncode == 0, purge.stdout + purge.stderr
    assert "kept /var/lib/cni-reaper (the quarantine is evidence)" in purge.stderr
    status = chroot(root, "dpkg-query", "--show", "--showformat=${db:Status-Status}", "cni-reaper")
    assert status.stdout in ("", "not-installed"), status.stdout
    for gone in (
        "usr/bin/cni-reaper",
        "lib/systemd/system/cni-reaper.service",
        "usr/lib/systemd/system/containerd.service.d",
        "etc/cni-reaper",
        "etc/systemd/system/multi-user.target.wants/cni-reaper.service",
        "usr/share/doc/cni-reaper",
    ):
        assert not (root / gone).exists() and not (root / gone).is_symlink(), gone
    assert sorted(p.relative_to(state) for p in state.rglob("*") if p.is_file()) == quarantined


# Python packaging: the sdist and wheel, from a copy of this tree, with each setuptools.
# Debian 12's python3-setuptools is 66.1; the test venv's is a current one (pinned in the
# project's test extra). Neither build may warn about the license metadata's form.
DEBIAN_PYTHON = "/usr/bin/python3"
BUILD_WARNING = re.compile(r"deprecat|BetaConfiguration|is still \*beta\*", re.I)


def copy_of_this_tree(dest: Path) -> Path:
    """What git tracks here (and new files it would track), or all of it unpacked from an sdist;
    builds write their egg-info and build dirs into the copy, never into the checkout."""
    if (REPO / ".git").exists():
        listed = subprocess.run(
            [
                "git",
                "-C",
                str(REPO),
                "ls-files",
                "-z",
                "--cached",
                "--others",
                "--exclude-standard",
            ],
            capture_output=True,
            check=True,
        ).stdout
        for name in listed.decode().split("\0"):
            if name and (REPO / name).is_file():
                (dest / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / name, dest / name)
    else:
        skip = shutil.ignore_patterns("__pycache__", "*.egg-info", ".venv*", ".test-cache")
        shutil.copytree(REPO, dest, ignore=skip, dirs_exist_ok=True)
    return dest


def setuptools_version(python: str, *needs: str) -> tuple[int, ...] | None:
    imports = ", ".join(("build", "setuptools", *needs))
    probe = subprocess.run(
        [python, "-c", f"import {imports}; print(setuptools.__version__)"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return None
    return tuple(int(part) for part in probe.stdout.strip().split(".")[:2])


def build_dists(
    python: str, tmp: Path, *only: str
) -> tuple[subprocess.CompletedProcess[str], Path]:
    src = copy_of_this_tree(tmp / "src")
    out = tmp / "dist"
    built = subprocess.run(
        [python, "-m", "build", "--no-isolation", *only, "--outdir", str(out), str(src)],
        capture_output=True,
        text=True,
        env={**CLEAN_ENV, "HOME": str(tmp)},
    )
    return built, out


@pytest.mark.parametrize("side", ["debian-12", "current"])
def test_license_metadata_builds_without_warnings(side: str, tmp_path: Path) -> None:
    python = DEBIAN_PYTHON if side == "debian-12" else sys.executable
    # Setuptools before 70.1 builds wheels with the wheel package.
    version = setuptools_version(python, *(["wheel"] if side == "debian-12" else []))
    if version is None:
        cannot_run(f"{python} needs build, setuptools and wheel (python3-build, python3-wheel)")
    if side == "debian-12" and version[0] != 66:
        cannot_run(f"{python} has setuptools {version}, not Debian 12's 66")
    if side == "current" and version < (77, 0):
        cannot_run(f"{python} has setuptools {version}: install the test extra")

    built, out = build_dists(python, tmp_path)

    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    warnings = [ln for ln in (built.stdout + built.stderr).splitlines() if BUILD_WARNING.search(ln)]
    assert warnings == []
    with zipfile.ZipFile(next(out.glob("*.whl"))) as wheel:
        names = wheel.namelist()
        metadata = wheel.read(f"cni_reaper-{__version__}.dist-info/METADATA").decode()
        license_file = next(n for n in names if n.endswith("/LICENSE"))
        assert wheel.read(license_file) == (REPO / "LICENSE").read_bytes()
    assert "License: Apache-2.0\n" in metadata
    assert "Classifier: Operating System :: POSIX :: Linux\n" in metadata


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if (setuptools_version(sys.executable) or (0,)) < (69, 3):
        cannot_run("the sdist is built with the test extra's setuptools (69.3 or later)")
    built, out = build_dists(sys.executable, tmp_path_factory.mktemp("sdist"), "--sdist")
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    return out / f"cni_reaper-{__version__}.tar.gz"


def sdist_files(sdist: Path) -> set[str]:
    with tarfile.open(sdist) as tar:
        return {m.name.split("/", 1)[1] for m in tar.getmembers() if m.isfile()}


def test_sdist_holds_the_whole_source(sdist: Path) -> None:
    files = sdist_files(sdist)
    for name in (
        "LICENSE",
        "README.md",
        "man/cni-reaper.8",
        "systemd/cni-reaper.service",
        "systemd/containerd.service.d/10-cni-reaper.conf",
        "systemd/crio.service.d/10-cni-reaper.conf",
        "packaging/rpm/cni-reaper.spec",
        "packaging/debian/control",
        "examples/run-example.sh",
        "tests/test_packaging.py",
    ):
        assert name in files, name
    # Whatever else git tracks, the catalog and alerting rules among them once they exist.
    if (REPO / ".git").exists():
        tracked = subprocess.run(
            ["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True
        ).stdout.decode()
        missing = {n for n in tracked.split("\0") if n and (REPO / n).is_file()} - files
        assert missing == set()


def test_tests_run_from_the_unpacked_sdist(sdist: Path, tmp_path: Path) -> None:
    with tarfile.open(sdist) as tar:
        if hasattr(tarfile, "data_filter"):  # 3.12, and 3.9.17 on
            tar.extractall(tmp_path, filter="data")
        else:
            tar.extractall(tmp_path)  # noqa: S202 (the sdist this test just built)
    tree = tmp_path / f"cni_reaper-{__version__}"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    env.pop("CNI_REAPER_DEBIAN_ROOT", None)
    imported = subprocess.run(
        [sys.executable, "-c", "import cni_reaper; print(cni_reaper.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=True,
    )
    assert Path(imported.stdout.strip()).is_relative_to(tree)

    ran = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/test_content.py",
            "tests/test_packaging.py::test_rpm_spec_parses_with_the_same_layout",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tree,
    )

    assert ran.returncode == 0, ran.stdout[-3000:] + ran.stderr[-3000:]
    summary = ran.stdout.strip().splitlines()[-1]
    assert re.match(r"\d+ passed in ", summary), summary


@pytest.fixture(scope="module")
def rpms(sdist: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    if shutil.which("rpmbuild") is None:
        cannot_run("needs rpmbuild (Debian package rpm)")
    top = tmp_path_factory.mktemp("rpmbuild")
    (top / "SOURCES").mkdir()
    shutil.copy(sdist, top / "SOURCES")
    built = subprocess.run(
        [
            "rpmbuild",
            "-ba",
            # Debian's rpm database is empty: the BuildRequires (Fedora's package names) cannot
            # be checked here; the spec's fallbacks stand in for their macros.
            "--nodeps",
            f"--define=_topdir {top}",
            str(REPO / "packaging/rpm/cni-reaper.spec"),
        ],
        capture_output=True,
        text=True,
        env={**CLEAN_ENV, "HOME": str(top)},
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    rpm = top / f"RPMS/noarch/cni-reaper-{__version__}-1.noarch.rpm"
    srpm = top / f"SRPMS/cni-reaper-{__version__}-1.src.rpm"
    return rpm, srpm, built.stdout + built.stderr


def test_rpm_builds_from_the_sdist_and_checks_its_import(rpms: tuple[Path, Path, str]) -> None:
    rpm, srpm, log = rpms
    assert srpm.is_file()
    # %check ran the installed command with the buildroot's site dir on the path.
    assert "import cni_reaper.cli" in log
    assert f"\ncni-reaper {__version__}\n" in log
    listed = subprocess.run(
        ["rpm", "-qp", "--queryformat=[%{FILEFLAGS:fflags} %{FILENAMES}\n]", str(rpm)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    files: dict[str, str] = {}  # path: rpm's file flags (d: %doc, l: %license)
    for line in listed.splitlines():
        flags, path = line.split(" ", 1)
        files[path] = flags
    for path in (
        "/usr/bin/cni-reaper",
        "/usr/lib/systemd/system/cni-reaper.service",
        "/usr/lib/systemd/system/containerd.service.d/10-cni-reaper.conf",
        "/usr/lib/systemd/system/crio.service.d/10-cni-reaper.conf",
        "/usr/lib/systemd/system-preset/80-cni-reaper.preset",
        "/usr/share/man/man8/cni-reaper.8.gz",
        "/etc/cni-reaper",
    ):
        assert path in files, path
    assert any(p.endswith("/site-packages/cni_reaper/cli.py") for p in files)
    if (REPO / "systemd/cni-reaper.catalog").exists():
        assert "/usr/lib/systemd/catalog/cni-reaper.catalog" in files
    license_files = [p for p, flags in files.items() if "l" in flags]
    doc_files = [
        p for p, flags in files.items() if "d" in flags and not p.startswith("/usr/share/man")
    ]
    assert [Path(p).name for p in license_files] == ["LICENSE"]
    assert [Path(p).name for p in doc_files] == ["README.md"]
    url = subprocess.run(
        ["rpm", "-qp", "--queryformat=%{URL}", str(rpm)], capture_output=True, text=True, check=True
    )
    assert url.stdout.startswith("https://")


def test_rpmlint_is_clean_on_the_spec_and_the_rpms(rpms: tuple[Path, Path, str]) -> None:
    rpmlint = shutil.which("rpmlint")
    if rpmlint is None:
        cannot_run("needs rpmlint")
    rpm, srpm, _ = rpms
    checked = subprocess.run(
        [
            rpmlint,
            "-c",
            str(REPO / "packaging/rpm/rpmlint.toml"),
            str(REPO / "packaging/rpm/cni-reaper.spec"),
            str(rpm),
            str(srpm),
        ],
        capture_output=True,
        text=True,
    )
    assert checked.returncode == 0, checked.stdout
    assert "0 errors, 0 warnings, 0 badness" in checked.stdout, checked.stdout
