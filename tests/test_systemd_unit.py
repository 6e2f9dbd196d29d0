"""The shipped unit and drop-ins, judged by systemd's own tools: verify, security, condition."""

from __future__ import annotations

import ast
import gzip
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from cni_reaper import __version__
from cni_reaper.options import build_parser
from cni_reaper.repair import replay
from tests.private_node import cannot_run, unshare

REPO = Path(__file__).resolve().parent.parent
UNIT = REPO / "systemd/cni-reaper.service"
DROP_INS = sorted((REPO / "systemd").glob("*.service.d/*.conf"))
RUNTIMES = ("containerd.service", "crio.service")
HOST_UNITS = Path("/lib/systemd/system")


def directives(path: Path) -> dict[tuple[str, str], list[str]]:
    """(section, key) -> values in order, as systemd reads them (repeated keys accumulate)."""
    found: dict[tuple[str, str], list[str]] = defaultdict(list)
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        found[(section, key.strip())].append(value.strip())
    return found


def words(unit: dict[tuple[str, str], list[str]], section: str, key: str) -> list[str]:
    return [word for value in unit.get((section, key), []) for word in value.split()]


@pytest.fixture(scope="module")
def analyze() -> str:
    tool = shutil.which("systemd-analyze")
    if tool is None:
        cannot_run("needs systemd-analyze (Debian package systemd)")
    return tool


def exec_paths(unit: Path) -> list[str]:
    paths = []
    for (section, key), values in directives(unit).items():
        if section == "Service" and key.startswith("Exec"):
            for value in values:
                command = value.lstrip("-@:+!").split()
                if command and command[0].startswith("/"):
                    paths.append(command[0])
    return paths


def stand_in(root: Path, path: str) -> None:
    """An executable where a unit's Exec= points, for a binary not under test."""
    target = root / path.lstrip("/")
    if not target.exists():
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("#!/bin/sh\nexit 0\n")
        target.chmod(0o755)


@pytest.fixture(scope="module")
def unit_root(tmp_path_factory: pytest.TempPathFactory, analyze: str) -> Path:
    """A root laid out as the packages lay it out: the host's own units (for the targets they
    order against), ours beside them, the installed console script and the man page."""
    root = tmp_path_factory.mktemp("unit-root")
    system = root / "lib/systemd/system"
    shutil.copytree(HOST_UNITS, system, symlinks=True)
    shutil.copy(UNIT, system / UNIT.name)
    for drop_in in DROP_INS:
        (system / drop_in.parent.name).mkdir(exist_ok=True)
        shutil.copy(drop_in, system / drop_in.parent.name / drop_in.name)
    for runtime in RUNTIMES:
        # Debian's containerd unit when the machine has it; CRI-O is not packaged in Debian,
        # so its unit is a stand-in that only has to carry the drop-in.
        if not (system / runtime).exists():
            (system / runtime).write_text(
                f"[Unit]\nDescription=stand-in\n[Service]\nExecStart=/usr/bin/{runtime[:-8]}\n"
            )
        for path in exec_paths(system / runtime):
            stand_in(root, path)
    script = Path(sys.executable).with_name("cni-reaper")
    (root / "usr/bin").mkdir(parents=True, exist_ok=True)
    shutil.copy(script, root / "usr/bin/cni-reaper")
    man8 = root / "usr/share/man/man8"
    man8.mkdir(parents=True)
    (man8 / "cni-reaper.8.gz").write_bytes(gzip.compress((REPO / "man/cni-reaper.8").read_bytes()))
    return root


def test_systemd_analyze_verify_passes_every_shipped_unit(analyze: str, unit_root: Path) -> None:
    units = [UNIT.name, *RUNTIMES]
    proc = subprocess.run(
        [analyze, "verify", f"--root={unit_root}", *units],
        capture_output=True,
        text=True,
        env={**os.environ, "MANPATH": str(unit_root / "usr/share/man")},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    # The drop-ins were read: the runtimes now want the reaper and start after it.
    for runtime in RUNTIMES:
        shown = (unit_root / "lib/systemd/system" / f"{runtime}.d/10-cni-reaper.conf").read_text()
        assert "Wants=cni-reaper.service" in shown


def test_unit_is_ordered_between_the_boot_records_and_the_runtimes() -> None:
    unit = directives(UNIT)
    after = words(unit, "Unit", "After")
    for needed in ("local-fs.target", "systemd-update-utmp.service", "wtmpdb-update-boot.service"):
        assert needed in after
    assert {
        "containerd.service",
        "crio.service",
        "cri-docker.service",
        "kubelet.service",
        "k3s.service",
        "k3s-agent.service",
        "rke2-server.service",
        "rke2-agent.service",
    } <= set(words(unit, "Unit", "Before"))
    assert words(unit, "Unit", "RequiresMountsFor") == ["/var/lib/cni"]
    assert unit[("Service", "Type")] == ["oneshot"]
    assert unit[("Service", "RemainAfterExit")] == ["yes"]
    # A refusal (75) changed nothing and keeps the unit active: its ExecStop runs at shutdown.
    assert words(unit, "Service", "SuccessExitStatus") == ["65", "73", "75"]
    timeout = unit[("Service", "TimeoutStartSec")][0]
    assert re.fullmatch(r"\d+(min|s)?", timeout), "a bounded start timeout"
    assert unit[("Service", "ExecStop")] == ["/usr/bin/cni-reaper --mark-clean-shutdown"]
    assert ("Service", "PrivateNetwork") not in unit


def test_a_failed_reaper_never_keeps_the_runtime_down() -> None:
    hard = ("Requires", "Requisite", "BindsTo", "PartOf", "Upholds")
    unit = directives(UNIT)
    for key in hard:
        assert ("Unit", key) not in unit
    assert len(DROP_INS) == len(RUNTIMES)
    for drop_in in DROP_INS:
        conf = directives(drop_in)
        assert conf[("Unit", "Wants")] == ["cni-reaper.service"]
        assert conf[("Unit", "After")] == ["cni-reaper.service"]
        for key in hard:
            assert ("Unit", key) not in conf


def test_security_exposure_is_at_most_4(analyze: str) -> None:
    proc = subprocess.run(
        [analyze, "security", "--offline=true", str(UNIT)], capture_output=True, text=True
    )
    found = re.search(r"Overall exposure level for cni-reaper\.service: (\d+\.\d+)", proc.stdout)
    assert found, proc.stdout + proc.stderr
    exposure = float(found.group(1))
    print(f"systemd-analyze security --offline=true: exposure {exposure}")
    assert exposure <= 4.0


def condition(analyze: str, env: dict[str, str], prefix: list[str] | None = None) -> str:
    proc = subprocess.run(
        [*(prefix or []), analyze, "condition", "--unit=cni-reaper.service"],
        capture_output=True,
        text=True,
        env={**os.environ, "SYSTEMD_UNIT_PATH": f"{UNIT.parent}:", **env},
    )
    return "succeeded" if proc.returncode == 0 else "failed: " + proc.stderr


def test_kill_switch_on_the_kernel_command_line(analyze: str) -> None:
    assert condition(analyze, {"SYSTEMD_PROC_CMDLINE": "quiet"}) == "succeeded"
    skipped = condition(analyze, {"SYSTEMD_PROC_CMDLINE": "quiet cni-reaper.disable"})
    assert "ConditionKernelCommandLine=!cni-reaper.disable failed" in skipped


def test_kill_switch_file(analyze: str, tmp_path: Path) -> None:
    if os.geteuid() != 0:
        cannot_run("needs root to lay /etc/cni-reaper/disable over /etc in a mount namespace")
    upper, work = tmp_path / "upper", tmp_path / "work"
    (upper / "cni-reaper").mkdir(parents=True)
    (upper / "cni-reaper/disable").touch()
    work.mkdir()
    # /etc/cni-reaper/disable exists only inside a private mount namespace.
    overlay = f"lowerdir=/etc,upperdir={upper},workdir={work}"
    prefix = [
        *unshare(),
        "sh",
        "-c",
        f'mount -t overlay overlay -o {overlay} /etc && exec "$@"',
        "sh",
    ]
    skipped = condition(analyze, {"SYSTEMD_PROC_CMDLINE": "quiet"}, prefix)
    assert "ConditionPathExists=!/etc/cni-reaper/disable failed" in skipped
    assert not Path("/etc/cni-reaper/disable").exists()


def test_man_page_documents_every_option_and_the_version() -> None:
    page = (REPO / "man/cni-reaper.8").read_text()
    assert f'"cni-reaper {__version__}"' in page.splitlines()[0]
    for action in build_parser()._actions:
        if action.dest == "help":
            continue
        for option in action.option_strings:
            assert option.replace("-", "\\-") in page, option


MAN_PAGE = REPO / "man/cni-reaper.8"


def man_section(name: str) -> str:
    """The roff source of one .SH section of the page, up to the next."""
    found = re.search(rf"^\.SH {name}\n(.*?)(?=^\.SH |\Z)", MAN_PAGE.read_text(), re.M | re.S)
    assert found, name
    return found.group(1)


@pytest.mark.parametrize(
    "argv",
    [
        ["mandoc", "-Tlint", "-W", "warning"],
        ["groff", "-man", "-Tutf8", "-ww", "-z"],
    ],
    ids=["mandoc", "groff"],
)
def test_man_page_lints_clean(argv: list[str]) -> None:
    if shutil.which(argv[0]) is None:
        cannot_run(f"no {argv[0]} to lint the man page with")
    proc = subprocess.run([*argv, str(MAN_PAGE)], capture_output=True, text=True)
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "", "")


@pytest.mark.parametrize("columns", [60, 80])
def test_man_page_breaks_no_path_with_a_hyphen(columns: int) -> None:
    """Rendered for a terminal that wide, 2 columns spare: no line ends in a
    hyphen inside a path."""
    if shutil.which("groff") is None:
        cannot_run("no groff to render the man page with")
    proc = subprocess.run(
        ["groff", "-man", "-Tascii", f"-rLL={columns - 2}n", "-P", "-cbou", str(MAN_PAGE)],
        capture_output=True,
        text=True,
        check=True,
    )
    lines = proc.stdout.splitlines()
    assert any("/var/lib/cni" in line for line in lines)  # the page was rendered
    broken = [line for line in lines if line.endswith("-") and "/" in line.split()[-1]]
    assert broken == []


def test_man_page_sees_also_the_tools_that_read_its_traces() -> None:
    refs = re.findall(r"^\.BR (?:\\%)?(\S+) \((\d)\)", man_section("SEE ALSO"), re.M)
    pages = [(section, name.replace("\\-", "-")) for name, section in refs]
    assert ("1", "journalctl") in pages
    assert ("1", "systemd-analyze") in pages
    assert pages == sorted(pages)  # man-pages(7): by section, then by name


def _is_environ(expr: ast.expr) -> bool:
    name = expr.attr if isinstance(expr, ast.Attribute) else getattr(expr, "id", "")
    return str(name).endswith("environ")


def _key_read(node: ast.AST) -> ast.expr | None:
    """X of os.environ[X], environ.get(X) or os.getenv(X), the mapping named ...environ."""
    if isinstance(node, ast.Subscript) and _is_environ(node.value):
        return node.slice
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
        return None
    if node.func.attr == "getenv" or (node.func.attr == "get" and _is_environ(node.func.value)):
        return node.args[0]
    return None


def environment_read() -> set[str]:
    """The variables cni_reaper's own code reads, each named by a literal or a module constant."""
    found: set[str] = set()
    for path in sorted((REPO / "cni_reaper").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        constants = {
            target.id: node.value.value
            for node in tree.body
            if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(tree):
            key = _key_read(node)
            if key is None:
                continue
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                found.add(key.value)
            else:
                name = constants.get(key.id) if isinstance(key, ast.Name) else None
                assert name is not None, f"{path.name}:{key.lineno}: cannot tell what is read"
                found.add(name)
    return found


def test_man_page_environment_names_what_the_code_reads() -> None:
    read = environment_read()
    # The finder finds what is known to be read: it cannot go blind and pass on nothing.
    assert {"JOURNAL_STREAM", "NOTIFY_SOCKET"} <= read
    # What every plugin gets instead of the reaper's environment.
    plugin = set(replay.plugin_env(replay.Attachment("c0ffee", "eth0"), []))
    assert {"PATH", "CNI_COMMAND", "CNI_PATH"} <= plugin
    section = man_section("ENVIRONMENT")
    named = set(re.findall(r"^\.TP\n\.B (?:\\%)?([A-Z_]+)$", section, re.M))  # the items
    assert read | plugin <= named
    assert named <= read | plugin  # and names none the code does not read or set
