"""Clean refusals, never a traceback: each refusal is one line naming what is wrong, a
documented exit status, and nothing created or changed on disk. Every run here is a real
process of the CLI; none mounts anything or runs a plugin."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import cni_reaper
from cni_reaper import cli, options
from cni_reaper.errors import ExitCode
from tests.crashed import Crashed
from tests.nodetree import CONTAINER_IDS, PLUGIN_DIR, NodeTree, host_local_conflist, snapshot
from tests.private_node import cannot_run, unshare

REPO = Path(cni_reaper.__file__).resolve().parent.parent
NOBODY = 65534
SETPRIV = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
MAN_PAGE = REPO / "man/cni-reaper.8"


def cli_run(
    argv: list[str], python: str = sys.executable, prefix: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "100"}
    env.pop("JOURNAL_STREAM", None)
    env.pop("NOTIFY_SOCKET", None)
    return subprocess.run(
        [*prefix, python, "-m", "cni_reaper", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=60,
    )


def damaged_node(root: Path) -> NodeTree:
    """A node whose earlier boot left a zero-byte results file of a configured network."""
    node = NodeTree(root)
    node.fake_plugin_network("slow", "slow", "exec sleep 300\n")
    node.write_result(f"slow-{CONTAINER_IDS[0]}-eth0", b"")
    node.write_boot_world(btime=1_700_000_000)
    return node


def one_line_refusal(stderr: str) -> str:
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("cni-reaper: ")
    return lines[0]


@pytest.fixture
def open_root() -> Iterator[Path]:
    """A root an unprivileged user can reach: pytest's own tmp dirs are root's alone (0700)."""
    top = tempfile.mkdtemp(prefix="cni-reaper-refusals-")
    os.chmod(top, 0o711)  # noqa: S103 (only to pass through, for the user who is not root)
    try:
        yield Path(top) / "node"
    finally:
        shutil.rmtree(top)


def unprivileged_python() -> str:
    if os.geteuid() != 0:
        cannot_run("needs root, to run the CLI as another, unprivileged user")
    if shutil.which("setpriv") is None:
        cannot_run("needs setpriv (util-linux)")
    for python in (os.path.realpath(sys.executable), "/usr/bin/python3"):
        probe = subprocess.run(
            [
                *SETPRIV,
                python,
                "-c",
                "import sys; sys.path.insert(0, sys.argv[1]); import cni_reaper.cli",
                str(REPO),
            ],
            capture_output=True,
        )
        if probe.returncode == 0:
            return python
    cannot_run(f"no Python the user {NOBODY} can run that can import {REPO}")


def test_a_real_run_not_as_root_is_refused_in_one_line_and_changes_nothing(
    open_root: Path,
) -> None:
    python = unprivileged_python()
    node = damaged_node(open_root)
    for path in [open_root, *open_root.rglob("*")]:  # readable, as a node's disk would be
        path.chmod(0o755 if path.is_dir() else 0o644)
    before = snapshot(open_root)

    done = cli_run(["--root", str(open_root)], python=python, prefix=tuple(SETPRIV))

    assert done.returncode == ExitCode.NOPERM
    assert int(ExitCode.NOPERM) == 77
    line = one_line_refusal(done.stderr)
    assert "a real run needs root" in line
    assert "--dry-run" in line  # what such a user can do instead
    assert done.stdout == ""
    assert snapshot(open_root) == before
    assert (node.results / f"slow-{CONTAINER_IDS[0]}-eth0").read_bytes() == b""

    # The ExecStop's marker needs root too.
    done = cli_run(
        ["--mark-clean-shutdown", "--root", str(open_root)], python=python, prefix=tuple(SETPRIV)
    )
    assert done.returncode == ExitCode.NOPERM
    assert "--mark-clean-shutdown needs root" in one_line_refusal(done.stderr)
    assert snapshot(open_root) == before

    # A root the user cannot reach is named as such, not as missing.
    hidden = open_root / "var/lib/cni"
    hidden.chmod(0o700)
    done = cli_run(
        ["--dry-run", "--root", str(hidden / "results")], python=python, prefix=tuple(SETPRIV)
    )
    assert done.returncode == ExitCode.USAGE
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[0].endswith("/var/lib/cni/results: Permission denied")
    hidden.chmod(0o755)

    # A dry run is anyone's: it shows the plan and writes nothing.
    done = cli_run(["--dry-run", "--root", str(open_root)], python=python, prefix=tuple(SETPRIV))
    assert "Traceback" not in done.stderr
    assert done.returncode != ExitCode.NOPERM, done.stderr
    assert snapshot(open_root) == before


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_a_root_that_does_not_exist_is_a_usage_error_and_nothing_is_created(
    tmp_path: Path, dry_run: list[str]
) -> None:
    missing = tmp_path / "no-such-node"

    done = cli_run([*dry_run, "--root", str(missing)])

    assert done.returncode == ExitCode.USAGE
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[0] == f"cni-reaper: --root {missing}: no such directory"
    assert done.stderr.splitlines()[1].startswith("usage: cni-reaper")
    assert not missing.exists()
    assert list(tmp_path.iterdir()) == []


def test_a_root_that_is_a_file_is_a_usage_error_and_the_file_is_unchanged(tmp_path: Path) -> None:
    file = tmp_path / "node.img"
    file.write_bytes(b"not a tree")

    done = cli_run(["--json", "--root", str(file)])

    assert done.returncode == ExitCode.USAGE
    assert "Traceback" not in done.stderr
    assert f"--root {file}: not a directory" in done.stderr
    doc = json.loads(done.stdout)  # --json still ends its one document
    assert doc["error"]["exit_code"] == ExitCode.USAGE
    assert file.read_bytes() == b"not a tree"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node.img"]


def test_a_root_whose_path_resolves_to_another_directory_is_a_usage_error(tmp_path: Path) -> None:
    """A /proc link's path names no directory of this namespace: here a directory open on a
    descriptor and removed since (its path reads "... (deleted)")."""
    gone = tmp_path / "node"
    gone.mkdir()
    script = (
        "import os, sys\n"
        f"fd = os.open({str(gone)!r}, os.O_RDONLY | os.O_DIRECTORY)\n"
        "os.set_inheritable(fd, True)\n"
        f"os.rmdir({str(gone)!r})\n"
        "root = f'/proc/self/fd/{fd}'\n"
        "argv = ['-m', 'cni_reaper', '--dry-run', '--root', root]\n"
        "os.execv(sys.executable, [sys.executable, *argv])\n"
    )

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60
    )

    assert done.returncode == ExitCode.USAGE, done.stderr
    first = done.stderr.splitlines()[0]
    assert re.fullmatch(
        r"cni-reaper: --root /proc/self/fd/\d+: its path resolves to .*node \(deleted\), which is "
        r"another file here \(a /proc link into another mount namespace\); mount the "
        r"node's file system at a path of this one and name that",
        first,
    ), first
    assert list(tmp_path.iterdir()) == []


def test_a_root_in_another_mount_namespace_is_refused_and_this_machine_is_untouched(
    tmp_path: Path,
) -> None:
    """--root /proc/<pid>/root, the node's file system seen through a process of another mount
    namespace: that link's path reads as "/" from here, and the run took the node for this
    machine, whose damaged entry it DEL'd and quarantined and whose address of an earlier
    boot host-local released (found by the attack review of b7354f6, which took a --root
    resolving to / for /; before it, the scan read the node while the plugins, unconfined,
    released this machine's address)."""
    if os.geteuid() != 0:
        cannot_run("needs root to make the mount namespaces")
    trees = {}
    for name, address in (("this", "10.22.0.5"), ("node", "10.22.0.7")):
        tree = NodeTree(tmp_path / name)
        tree.write_conf("10-hl.conflist", host_local_conflist("hl", "10.22.0.0/16"))
        store = tree.root / "var/lib/cni/networks/hl"
        store.mkdir(parents=True)
        (store / address).write_bytes(f"{CONTAINER_IDS[0]}\r\neth0".encode())
        tree.write_result(f"hl-{CONTAINER_IDS[0]}-eth0", b"")
        tree.write_boot_world(btime=time.time() - 60)
        trees[name] = tree
    before = {name: snapshot(tree.root / "var") for name, tree in trees.items()}
    inner = [sys.executable, "-m", "tests.another_namespace"]
    argv = [*unshare(net=True, pid=True), *inner, str(tmp_path / "this"), str(tmp_path / "node")]

    # The node as the root, or only its cache dir (found by the attack review of 45ba413:
    # the node's entry was DEL'd on this machine's store, exit 0), its conf dir, its state dir.
    for option, path in (
        ("--root", "@ROOT"),
        ("--cache-dir", "@ROOT/var/lib/cni"),
        ("--conf-dir", "@ROOT/etc/cni/net.d"),
        ("--state-dir", "@ROOT/var/lib/cni-reaper"),
    ):
        for run in ([], ["--dry-run"]):
            done = subprocess.run(
                [*argv, "--", *run, option, path, "--bin-dir", PLUGIN_DIR],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=120,
            )

            assert done.returncode == ExitCode.USAGE, done.stderr
            said = rf"{option} /proc/\d+/root\S*: its path resolves to /\S*, which is another"
            assert re.search(said, done.stderr), done.stderr
            # Each tree's CNI state as it was, and no state of the reaper's in either.
            assert {name: snapshot(tree.root / "var") for name, tree in trees.items()} == before


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--dry-run", "--mark-clean-shutdown writes the marker: it cannot be a --dry-run"),
        (
            "--json",
            "--mark-clean-shutdown writes the marker and no report: --json has nothing to print",
        ),
    ],
)
def test_mark_clean_shutdown_with_dry_run_or_json_is_a_usage_error_and_writes_nothing(
    tmp_path: Path, option: str, message: str
) -> None:
    """--json asks for one document on stdout; the ExecStop has none to give, and an empty
    stdout would fail whatever parses it."""
    node = damaged_node(tmp_path / "node")
    before = snapshot(node.root)

    done = cli_run(["--mark-clean-shutdown", option, "--root", str(node.root)])

    assert done.returncode == ExitCode.USAGE
    assert "Traceback" not in done.stderr
    first, *usage = done.stderr.splitlines()
    assert first == f"cni-reaper: {message}"
    assert usage and usage[0].startswith("usage: cni-reaper")
    if option == "--json":
        doc = json.loads(done.stdout)  # the one document, which says why
        assert doc["error"] == {"message": message, "exit_code": ExitCode.USAGE}
    else:
        assert done.stdout == ""
    assert snapshot(node.root) == before


@pytest.mark.parametrize("option", ["--plugin-timeout", "--deadline"])
@pytest.mark.parametrize("value", ["inf", "-inf", "nan", "0", "-1"])
def test_a_time_that_is_not_a_positive_finite_number_is_a_usage_error(
    tmp_path: Path, option: str, value: str
) -> None:
    node = damaged_node(tmp_path / "node")
    before = snapshot(node.root)

    # A real run: the value is refused before the lock, the plugin or the node is touched.
    done = cli_run([f"{option}={value}", "--root", str(node.root)])

    assert done.returncode == ExitCode.USAGE
    assert "Traceback" not in done.stderr
    assert (
        done.stderr.splitlines()[0] == f"cni-reaper: {option} must be a positive number of seconds"
    )
    assert snapshot(node.root) == before


def test_ctrl_c_ends_with_130_and_one_line(tmp_path: Path) -> None:
    """A real SIGINT to a CLI process made slow where it reads the conf dirs (a dry run: a real
    run on a root other than / would mount its namespace, which these tests never do)."""
    node = damaged_node(tmp_path / "node")
    before = snapshot(node.root)
    slow = (
        "import sys, time\n"
        "from cni_reaper import cli, netconf\n"
        "def load_conf_dirs(dirs):\n"
        "    print('reading conf dirs', file=sys.stderr, flush=True)\n"
        "    time.sleep(60)\n"
        "netconf.load_conf_dirs = load_conf_dirs\n"
        "sys.exit(cli.main(sys.argv[1:]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("JOURNAL_STREAM", None)
    for extra in ([], ["--json"]):
        process = subprocess.Popen(
            [sys.executable, "-c", slow, "--dry-run", *extra, "--root", str(node.root)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert process.stderr is not None
        assert process.stderr.readline() == "reading conf dirs\n"
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=30)

        assert process.returncode == ExitCode.INTERRUPTED
        assert int(ExitCode.INTERRUPTED) == 130
        assert "Traceback" not in err
        assert err.splitlines() == ["cni-reaper: interrupted"]
        if extra:
            doc = json.loads(out)
            assert doc["error"] == {"message": "interrupted", "exit_code": 130}
        assert snapshot(node.root) == before


def test_keyboard_interrupt_anywhere_in_run_is_130(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    def interrupted(*args: object, **kwargs: object) -> ExitCode:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "_run", interrupted)
    assert cli.main(["--dry-run", "--root", str(tmp_path)]) == 130
    assert capsys.readouterr().err == "cni-reaper: interrupted\n"


def _man_options() -> dict[str, str]:
    """Each option the man page's OPTIONS names, with its metavar ('' for none)."""
    text = MAN_PAGE.read_text()
    section = text[text.index(".SH OPTIONS") : text.index(".SH POLICY")]
    found: dict[str, str] = {}
    for line in section.splitlines():
        m = re.match(r'\.BI \\-\\-([a-z\\-]+) " ([A-Z]+)"$', line)
        if m:
            found["--" + m[1].replace("\\-", "-")] = m[2]
            continue
        m = re.match(r'\.BR? (\\-\w ", " )?\\-\\-([a-z\\-]+)$', line)
        if m:
            found["--" + m[2].replace("\\-", "-")] = ""
    return found


def test_help_metavars_match_the_man_page_and_it_ends_with_the_exit_statuses() -> None:
    done = cli_run(["--help"])
    assert done.returncode == 0
    help_text = done.stdout

    man = _man_options()
    assert set(man) >= {"--root", "--cache-dir", "--state-dir", "--plugin-timeout", "--dry-run"}
    parser = options.build_parser()
    for action in parser._actions:
        for option in action.option_strings:
            if not option.startswith("--") or option == "--help":
                continue
            assert option in man, f"{option} is not in the man page's OPTIONS"
            metavar = man[option]
            shown = f"{option} {metavar}" if metavar else option
            assert re.search(rf"^  (-\w, )?{re.escape(shown)}(  |\n|$)", help_text, re.M), (
                f"--help does not show {shown!r}"
            )

    tail = help_text[help_text.index("exit status:") :]
    man_text = MAN_PAGE.read_text()
    exit_section = man_text[man_text.index(".SH EXIT STATUS") : man_text.index(".SH FILES")]
    man_codes = sorted(int(c) for c in re.findall(r"^\.B (\d+)$", exit_section, re.M))
    help_codes = sorted(int(c) for c in re.findall(r"^  (\d+) ", tail, re.M))
    assert help_codes == man_codes == sorted(int(c) for c in ExitCode)
    assert help_text.rstrip().endswith("See man cni-reaper.")


@pytest.mark.parametrize("option", ["--cache-dir", "--conf-dir", "--bin-dir"])
def test_a_dir_option_naming_no_dir_is_a_usage_error_and_nothing_is_released(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path, option: str
) -> None:
    """A typo in --cache-dir made every host-local reservation an orphan (no results entry
    named it) and released them all, the summary saying "nothing to do"; in --conf-dir or
    --bin-dir it made every DEL one that cannot run. Found by an operator's review."""
    crashed.add(CONTAINER_IDS[0])
    crashed.reboot()
    held = crashed.ips()
    typo = tmp_path / "no-such-dir"
    plugins = [] if option == "--bin-dir" else ["--bin-dir", PLUGIN_DIR]
    argv = ["--root", str(crashed.node.root), *plugins, option, str(typo)]

    code = cli.main(argv, clock=lambda: crashed.t0 + 60, environ={})

    assert code == ExitCode.USAGE
    assert (
        capsys.readouterr().err.splitlines()[0] == f"cni-reaper: {option} {typo}: no such directory"
    )
    assert crashed.ips() == held


def test_of_several_plugin_dirs_one_missing_on_this_node_is_no_error(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    crashed.add(CONTAINER_IDS[0]).write_bytes(b"")
    crashed.reboot()

    code, report = crashed.run(capsys, "--bin-dir", str(tmp_path / "not-here"))

    assert code == ExitCode.OK, report["warnings"]
    assert crashed.ips() == {}


def test_beside_a_runtime_that_started_first_the_refusal_says_no_run_of_this_boot_can_repair(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its advice was "stop it first, or use --force", and either way every damaged file was
    then left as a write that may be in flight (exit 65). Found by an operator's review."""
    crashed.add(CONTAINER_IDS[0]).write_bytes(b"")
    crashed.reboot()

    with crashed.containerd_answering():
        code = crashed.run_main()

    err = capsys.readouterr().err
    assert code == ExitCode.REFUSED
    assert "started before any run of cni-reaper in this boot" in err, err
    assert "the next boot's run, ordered before the runtime, repairs it" in err
    assert "stop it first" not in err


def test_beside_a_runtime_started_after_this_boots_record_the_refusal_says_stop_it(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    crashed.reboot()
    code, _ = crashed.run(capsys)  # the unit's run: nothing to repair, the record taken
    assert code == ExitCode.OK

    with crashed.containerd_answering():
        code = crashed.run_main()

    err = capsys.readouterr().err
    assert code == ExitCode.REFUSED
    assert err.splitlines()[0].endswith(": stop it first, or use --force"), err


def test_a_state_dir_that_is_a_file_is_a_usage_error_before_any_del(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """It was found when the first move failed, after the DELs had released the addresses:
    every damaged file stayed for the runtime's DEL to fail on again (exit 73). Found by an
    operator's review."""
    crashed.add(CONTAINER_IDS[0]).write_bytes(b"")
    crashed.reboot()
    held = crashed.ips()
    not_a_dir = tmp_path / "state"
    not_a_dir.write_bytes(b"")

    code = cli.main(
        [*crashed.argv(), "--state-dir", str(not_a_dir)],
        clock=lambda: crashed.t0 + 60,
        environ={},
    )

    assert code == ExitCode.USAGE
    assert capsys.readouterr().err.startswith(f"cni-reaper: --state-dir {not_a_dir}: not a dir")
    assert crashed.ips() == held
