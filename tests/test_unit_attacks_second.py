"""Second attack pass on the reading of the runtimes' systemd units (runtime/units.py,
config.py), on the hardened code. The first pass is in test_unit_attacks.py and
test_k3s_data_dir_attacks.py; nothing here repeats it.

Each test asserts the safe behaviour: the records the reaper reads include the place the runtime
really keeps them, or its records are in doubt (then no sandbox is called forgotten).

systemd facts (src/shared/conf-parser.c in v239 to v252 and main; src/core/load-dropin.c in
main): parse_line() returns -EBADMSG for a section header that does not end in "]" (and, since
v250 or so, for one with unsafe characters), and config_parse() stops reading the file at the
first line parse_line() fails. unit_load_dropin() ignores what config_parse() returns for a
drop-in: the lines of the drop-in before the bad one apply, those after it do not. For the
unit file itself the error fails the load: the unit does not start. Up to v246, ".include
<file>" in a unit file (CONFIG_PARSE_ALLOW_INCLUDE) parses <file> right there, relative to the
unit's dir; v247 removed it (a line without "=": ignored). "Missing '='" is ignored.

urfave/cli (containerd 1.x: v1, 2.x: v2): --help/-h and --version/-v are flags of every app;
set, the app prints and returns, the daemon never runs.

Only config.load, inventory.load and dry runs: nothing runs a plugin or needs root.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cni_reaper.runtime import config, inventory
from cni_reaper.runtime.config import Runtime
from cni_reaper.runtime.inventory import META_DB
from tests.bolt_writer import containerd_sandbox, write_db
from tests.crashed import by_path
from tests.nodetree import NodeTree
from tests.runtime_layouts import (
    CONTAINERD_DEFAULT,
    CRIO_UNIT,
    DROP_IN,
    K3S_DEFAULT,
    K3S_STOCK,
    K3S_UNIT,
    KNOWN,
    STALE,
    STOCK,
    SYSTEM,
    UNIT,
    VENDOR_UNIT,
    assert_reads_or_doubts,
    dry_run,
    earlier_boots_entry,
    in_doubt,
    knows,
    roots,
    tree,
    write,
)

C, K3S, CRIO = Runtime.CONTAINERD, Runtime.K3S, Runtime.CRIO


# --- 1. a file systemd stops reading at a bad line ----------------------------------------------

BAD_LINE_STOPS: list[Any] = [
    # A comment after a section header: "Invalid section header", the drop-in is read no
    # further; containerd keeps the vendor unit's command line. The reader takes up again at
    # the next good header and follows the --root below it.
    pytest.param(
        {
            VENDOR_UNIT: STOCK,
            DROP_IN: "[Unit] # moved to the data disk\nDescription=containerd\n"
            "[Service]\nExecStart=\nExecStart=/usr/bin/containerd --root /data/c\n",
        },
        C,
        CONTAINERD_DEFAULT,
        id="drop-in-comment-after-a-section-header",
    ),
    pytest.param(
        {
            VENDOR_UNIT: STOCK,
            DROP_IN: "[Service\nLimitNOFILE=1048576\n"
            "[Service]\nExecStart=\nExecStart=/usr/bin/containerd --root /data/c\n",
        },
        C,
        CONTAINERD_DEFAULT,
        id="drop-in-section-header-without-bracket",
    ),
    # k3s: an installer-made unit, an operator's drop-in with the same mistake.
    pytest.param(
        {
            K3S_UNIT: K3S_STOCK,
            f"{SYSTEM}/k3s.service.d/override.conf": "[Service] ; data disk\n"
            "[Service]\nExecStart=\nExecStart=/usr/local/bin/k3s server --data-dir /data/k3s\n",
        },
        K3S,
        K3S_DEFAULT,
        id="k3s-drop-in-comment-after-a-section-header",
    ),
]


@pytest.mark.parametrize(("files", "runtime", "real"), BAD_LINE_STOPS)
def test_a_drop_in_is_read_up_to_its_first_bad_line_only(
    tmp_path: Path, files: dict[str, str | bytes], runtime: Runtime, real: str
) -> None:
    assert_reads_or_doubts(tree(tmp_path, files), runtime, real)


def test_a_unit_file_with_a_bad_line_does_not_start(tmp_path: Path) -> None:
    """The unit file itself: the load fails, containerd does not start with it; whatever the
    operator mends decides where its records are (as for the first pass's WONT_START)."""
    unit = "[Unit] # local\n[Service]\nExecStart=/usr/bin/containerd --root /data/c\n"
    configs = tree(tmp_path, {UNIT: unit})
    assert in_doubt(configs, C), (roots(configs, C), configs.warnings)


# --- 2. .include (systemd up to v246: Ubuntu 20.04, Debian 10, RHEL 8) -------------------------


def test_an_include_in_a_unit_file_is_followed_or_doubted(tmp_path: Path) -> None:
    """The included file resets ExecStart= and moves the root; the reader ignores the line and
    follows the unit's own --root."""
    files = {
        UNIT: "[Service]\nExecStart=/usr/bin/containerd --root /var/lib/containerd-old\n"
        ".include /etc/systemd/system/containerd.local\n",
        f"{SYSTEM}/containerd.local": "[Service]\nExecStart=\n"
        "ExecStart=/usr/bin/containerd --root /data/c\n",
    }
    assert_reads_or_doubts(tree(tmp_path, files), C, "/data/c")


# --- 3. command lines containerd does not run with ----------------------------------------------

WONT_RUN: list[Any] = [
    pytest.param("--root /data/c --version", id="version-last"),
    pytest.param("--root /data/c -v", id="v-last"),
    pytest.param("--root=/data/c --help", id="help-last"),
    pytest.param("-root /data/c -h", id="h-last"),
    # --config named explicitly and missing: LoadConfig fails, containerd exits (1.7's main:
    # GlobalIsSet("config") makes a missing file an error).
    pytest.param("--config /etc/containerd/nowhere.toml", id="explicit-config-missing"),
]


@pytest.mark.parametrize("args", WONT_RUN)
def test_a_command_line_containerd_exits_on_puts_its_records_in_doubt(
    tmp_path: Path, args: str
) -> None:
    (tmp_path / "var/lib/containerd").mkdir(parents=True)
    configs = tree(tmp_path, {UNIT: f"[Service]\nExecStart=/usr/bin/containerd {args}\n"})
    assert in_doubt(configs, C), (roots(configs, C), configs.warnings)


# --- 4. a path the kernel resolves otherwise than the reader -------------------------------------


def test_a_config_path_with_dot_dot_through_a_symlink(tmp_path: Path) -> None:
    """containerd opens --config as given (no filepath.Clean): the kernel follows
    /etc/containerd -> /opt/containerd/etc before "..". The reader cleans the path first and
    reads /etc/c.toml, a leftover."""
    write(tmp_path, "/opt/containerd/etc/config.toml", "version = 2\n")
    write(tmp_path, "/opt/containerd/c.toml", "version = 2\nroot = '/data/c'\n")
    write(tmp_path, "/etc/c.toml", "version = 2\nroot = '/var/lib/containerd-old'\n")
    (tmp_path / "etc/containerd").symlink_to("/opt/containerd/etc")
    unit = "[Service]\nExecStart=/usr/bin/containerd --config /etc/containerd/../c.toml\n"
    configs = tree(tmp_path, {UNIT: unit})
    assert_reads_or_doubts(configs, C, "/data/c")


# --- 5. environments not looked at -------------------------------------------------------------


def test_k3s_data_dir_in_the_managers_default_environment(tmp_path: Path) -> None:
    """systemd.conf(5) DefaultEnvironment= reaches every service: K3S_DATA_DIR set there moves
    k3s's data dir (its flag's EnvVar). Missed entirely: the old behaviour."""
    files = {
        K3S_UNIT: K3S_STOCK,
        "/etc/systemd/system.conf.d/k3s.conf": "[Manager]\n"
        "DefaultEnvironment=K3S_DATA_DIR=/data/k3s\n",
    }
    assert_reads_or_doubts(tree(tmp_path, files), K3S, "/data/k3s/agent/containerd")


def test_crio_root_moved_by_its_packaged_units_options(tmp_path: Path) -> None:
    """Fedora's/CRI-O's packaged crio.service runs `crio $CRIO_CONFIG_OPTIONS ...
    $CRIO_STORAGE_OPTIONS ...` with EnvironmentFile=-/etc/sysconfig/crio: the options there
    are expanded as systemd does (test_crio_unit.py has the rest)."""
    files = {
        CRIO_UNIT: "[Service]\nEnvironmentFile=-/etc/sysconfig/crio\n"
        "ExecStart=/usr/bin/crio $CRIO_CONFIG_OPTIONS $CRIO_STORAGE_OPTIONS\n",
        "/etc/sysconfig/crio": "CRIO_STORAGE_OPTIONS=--root /data/crio\n",
        "/etc/crio/crio.conf": "[crio]\n",
    }
    (tmp_path / "data/crio").mkdir(parents=True)
    configs = tree(tmp_path, files)
    assert roots(configs, CRIO) == ["/data/crio"] and not in_doubt(configs, CRIO), configs.warnings


# --- 5b. the service's own mount namespace and root -------------------------------------------

NAMESPACED: list[Any] = [
    # systemd.exec(5) BindPaths=: containerd writes /var/lib/containerd, which is /data/c on
    # the node; the reaper, outside the service's namespace, reads the node's
    # /var/lib/containerd, where the records from before the move still lie.
    pytest.param(
        {
            VENDOR_UNIT: STOCK,
            DROP_IN: "[Service]\nBindPaths=/data/c:/var/lib/containerd\n",
            "/etc/containerd/config.toml": "version = 2\n",
        },
        C,
        "/data/c",
        id="containerd-bind-paths",
    ),
    pytest.param(
        {
            K3S_UNIT: K3S_STOCK,
            f"{SYSTEM}/k3s.service.d/data.conf": "[Service]\n"
            "BindPaths=/data/k3s:/var/lib/rancher/k3s\n",
        },
        K3S,
        "/data/k3s/agent/containerd",
        id="k3s-bind-paths",
    ),
    # RootDirectory=: every path of the command line is inside /srv/ctr.
    pytest.param(
        {
            UNIT: "[Service]\nRootDirectory=/srv/ctr\nExecStart=/usr/bin/containerd\n",
        },
        C,
        "/srv/ctr/var/lib/containerd",
        id="containerd-root-directory",
    ),
]


@pytest.mark.parametrize(("files", "runtime", "real"), NAMESPACED)
def test_a_unit_that_remaps_paths_for_the_runtime_is_followed_or_doubted(
    tmp_path: Path, files: dict[str, str | bytes], runtime: Runtime, real: str
) -> None:
    assert_reads_or_doubts(tree(tmp_path, files), runtime, real)


def test_drop_ins_of_another_name_linked_to_the_unit(tmp_path: Path) -> None:
    """cri.service -> containerd.service (an Alias= enabled, or a link by hand): systemd loads
    the drop-ins of every name of the unit (unit_find_dropin_paths gets u->aliases), so
    cri.service.d moves the root. The reader looks at containerd.service's own dirs only."""
    write(tmp_path, UNIT, "[Service]\nExecStart=/usr/bin/containerd --root /var/lib/c-old\n")
    (tmp_path / SYSTEM.lstrip("/") / "cri.service").symlink_to("containerd.service")
    write(
        tmp_path,
        f"{SYSTEM}/cri.service.d/10-root.conf",
        "[Service]\nExecStart=\nExecStart=/usr/bin/containerd --root /data/c\n",
    )
    assert_reads_or_doubts(config.load(str(tmp_path)), C, "/data/c")


def test_an_installer_dir_too_large_to_list_is_doubt(tmp_path: Path) -> None:
    """/etc/systemd/system with more entries than the reader lists: k3s-edge.service (the
    installer's INSTALL_K3S_NAME=edge) is not found, and the warning puts nothing in doubt."""
    system = tmp_path / SYSTEM.lstrip("/")
    system.mkdir(parents=True)
    for i in range(4100):
        (system / f"unit-{i:05}.timer").write_bytes(b"")
    write(
        tmp_path,
        f"{SYSTEM}/k3s-edge.service",
        "[Service]\nExecStart=/usr/local/bin/k3s server --data-dir /data/k3s\n",
    )
    write(tmp_path, "/etc/rancher/k3s/config.yaml", "token: x\n")
    configs = config.load(str(tmp_path))
    assert_reads_or_doubts(configs, K3S, "/data/k3s/agent/containerd")


def test_a_prefix_twice_is_no_command(tmp_path: Path) -> None:
    """config_parse_exec takes each prefix once ("!" twice): "--/usr/bin/containerd" is the
    path "-/usr/bin/containerd", neither absolute nor a file name: the line is dropped ("-":
    ignored), the service has no ExecStart= and does not start."""
    (tmp_path / "var/lib/containerd").mkdir(parents=True)
    configs = tree(tmp_path, {UNIT: "[Service]\nExecStart=--/usr/bin/containerd --root /x\n"})
    assert in_doubt(configs, C), (roots(configs, C), configs.warnings)


# --- 6. what holds ------------------------------------------------------------------------------

HOLDS: list[Any] = [
    pytest.param(
        {UNIT: "[Service]\nExecStart=/usr/bin/containerd -root /s\n"}, "/s", id="one-dash"
    ),
    pytest.param({UNIT: "[Service]\nExecStart=containerd --root=/a=b\n"}, "/a=b", id="eq-in-value"),
    pytest.param(
        {UNIT: "[Service]\nExecStart=/usr/bin/containerd --root=/a/../../b\n"}, "/b", id="dotdot"
    ),
    pytest.param(
        {UNIT: "[Service]\nExecStart=/usr/bin/containerd --root //srv//c/\n"},
        "/srv/c",
        id="slashes",
    ),
    pytest.param(
        {UNIT: "[Service]\nExecStart=/usr/bin/containerd --root /a --root=/b -root /c\n"},
        "/c",
        id="repeated",
    ),
    pytest.param(
        {UNIT: "[Service]\nExecStart=/usr/bin/containerd\t'--root'\t'/srv/my dir'\n"},
        "/srv/my dir",
        id="tabs-and-a-quoted-blank",
    ),
    # [Service ] is an unknown section for systemd ("Service "): ignored by both.
    pytest.param(
        {UNIT: STOCK + "[Service ]\nExecStart=\nExecStart=/usr/bin/containerd --root /x\n"},
        CONTAINERD_DEFAULT,
        id="section-name-with-a-blank",
    ),
    # A line without "=": "Missing '=', ignoring line." (v239 on).
    pytest.param(
        {
            UNIT: "[Service]\nExecStart /usr/bin/containerd --root /x\n"
            "ExecStart=/usr/bin/containerd\n"
        },
        CONTAINERD_DEFAULT,
        id="key-without-equals",
    ),
    # .include inside a drop-in is ignored by systemd too ("not allowed here").
    pytest.param(
        {
            VENDOR_UNIT: STOCK,
            DROP_IN: "[Service]\n.include /etc/x.conf\n",
            "/etc/x.conf": "[Service]\nExecStart=\nExecStart=/usr/bin/containerd --root /x\n",
        },
        CONTAINERD_DEFAULT,
        id="include-in-a-drop-in",
    ),
    # Unit names are case-sensitive; templates are not containerd.service.
    pytest.param(
        {
            VENDOR_UNIT: STOCK,
            f"{SYSTEM}/Containerd.service": "[Service]\nExecStart=/usr/bin/containerd --root /x\n",
            f"{SYSTEM}/containerd@.service": "[Service]\nExecStart=/usr/bin/containerd --root /y\n",
        },
        CONTAINERD_DEFAULT,
        id="other-case-and-template",
    ),
]


@pytest.mark.parametrize(("files", "real"), HOLDS)
def test_what_holds(tmp_path: Path, files: dict[str, str | bytes], real: str) -> None:
    assert_reads_or_doubts(tree(tmp_path, files), C, real)


DOUBTED: list[Any] = [
    pytest.param("ExecStart=-", id="prefix-only"),
    pytest.param("ExecStart=-@", id="prefixes-only"),
    pytest.param("ExecStart=/usr/bin/containerd '' --root /x", id="empty-quotes"),
    pytest.param("ExecStart=/usr/bin/containerd '--root''/x'", id="quote-after-quote"),
    pytest.param("ExecStart=/usr/bin/containerd -c=", id="empty-short-config"),
    pytest.param("ExecStart=/usr/bin/containerd -a -x", id="address-taking-a-dash-word"),
    pytest.param("ExecStart=/usr/bin/containerd --root ---x", id="triple-dash"),
    pytest.param("ExecStart=/usr/bin/containerd --root /x ; /bin/true", id="semicolon"),
    pytest.param(
        "Type=oneshot\nExecStart=/usr/bin/containerd --root /a\nExecStart=/usr/bin/containerd",
        id="oneshot-two",
    ),
    pytest.param("ExecStart=/usr/bin/containerd -a unix:///run/c.sock", id="unix-address"),
]


@pytest.mark.parametrize("line", DOUBTED)
def test_what_is_doubted(tmp_path: Path, line: str) -> None:
    configs = tree(tmp_path, {UNIT: f"[Service]\n{line}\n"})
    assert in_doubt(configs, C), (roots(configs, C), configs.warnings)


def test_a_root_behind_a_relative_symlink_inside_the_root(tmp_path: Path) -> None:
    """--root /data/c, /data a relative link to mnt/disk inside the root: the records are
    read there, and a sandbox they hold is known."""
    write(tmp_path, UNIT, "[Service]\nExecStart=/usr/bin/containerd --root /data/c\n")
    db = tmp_path / "mnt/disk/c" / META_DB
    db.parent.mkdir(parents=True)
    write_db(db, [containerd_sandbox("k8s.io", KNOWN)], no_freelist_sync=True)
    (tmp_path / "data").symlink_to("mnt/disk")
    configs = config.load(str(tmp_path))
    assert not in_doubt(configs, C)
    assert inventory.load(str(tmp_path), configs).knows(KNOWN) is True


def test_a_root_symlink_out_of_the_root_is_unreadable(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    db = outside / "c" / META_DB
    db.parent.mkdir(parents=True)
    write_db(db, [containerd_sandbox("k8s.io", KNOWN)], no_freelist_sync=True)
    root = tmp_path / "root"
    write(root, UNIT, "[Service]\nExecStart=/usr/bin/containerd --root /data/c\n")
    (root / "data").symlink_to("../outside")
    configs = config.load(str(root))
    found = inventory.load(str(root), configs)
    assert found.knows(KNOWN) is None


def test_many_drop_ins_and_a_long_line_are_bounded(tmp_path: Path) -> None:
    write(tmp_path, VENDOR_UNIT, STOCK)
    for i in range(3000):
        write(tmp_path, f"{SYSTEM}/containerd.service.d/{i:05}.conf", "[Service]\nNice=1\n")
    write(tmp_path, f"{SYSTEM}/service.d/long.conf", "[Service]\nX-A=" + "a" * 500_000 + "\n")
    configs = config.load(str(tmp_path))
    assert_reads_or_doubts(configs, C, CONTAINERD_DEFAULT)


# --- 7. end to end, and crashes ----------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        "--root /" + "a" * 5000,
        "--root /" + "/".join(["b" * 255] * 20),
        "--config /" + "c" * 300 + ".toml",
        "--config / --root /",
        "-c /proc/self/fd/0",
        "--state /" + "s" * 300 + " -a /" + "a" * 300,
    ],
    ids=["long-root", "deep-root", "long-config-name", "slash", "proc-fd", "long-state-address"],
)
def test_odd_paths_crash_no_dry_run(node: NodeTree, t0: float, args: str) -> None:
    write(node.root, UNIT, f"[Service]\nExecStart=/usr/bin/containerd {args}\n")
    node.boot(t0 - 7200)
    node.boot(t0 - 55)
    node.write_boot_world(btime=t0 - 60)
    configs = config.load(str(node.root))
    inventory.load(str(node.root), configs)
    dry_run(node, t0)


END_TO_END: list[Any] = [
    pytest.param(
        {
            VENDOR_UNIT: STOCK,
            "/etc/containerd/config.toml": "version = 2\n",
            DROP_IN: "[Unit] # data disk, not yet\n"
            "[Service]\nExecStart=\nExecStart=/usr/bin/containerd --root /data/c\n",
        },
        CONTAINERD_DEFAULT,
        "/data/c",
        id="drop-in-bad-section-header",
    ),
    pytest.param(
        {
            UNIT: "[Service]\nExecStart=/usr/bin/containerd --root /data/old\n"
            ".include /etc/systemd/system/containerd.local\n",
            f"{SYSTEM}/containerd.local": "[Service]\nExecStart=\nExecStart=/usr/bin/containerd\n",
            "/etc/containerd/config.toml": "version = 2\n",
        },
        CONTAINERD_DEFAULT,
        "/data/old",
        id="include",
    ),
    # The operator moved containerd's data to a new disk with BindPaths=; the old
    # /var/lib/containerd, left on the root disk, is what the reaper reads.
    pytest.param(
        {
            VENDOR_UNIT: STOCK,
            "/etc/containerd/config.toml": "version = 2\n",
            DROP_IN: "[Service]\nBindPaths=/data/c:/var/lib/containerd\n",
        },
        "/data/c",
        CONTAINERD_DEFAULT,
        id="bind-paths",
    ),
    pytest.param(
        {
            UNIT: "[Service]\nExecStart=/usr/bin/containerd --root /var/lib/c-old\n",
            "/etc/containerd/config.toml": "version = 2\n",
            f"{SYSTEM}/cri.service.d/10-root.conf": "[Service]\nExecStart=\n"
            "ExecStart=/usr/bin/containerd --root /data/c\n",
        },
        "/data/c",
        "/var/lib/c-old",
        id="drop-in-of-an-alias",
    ),
]


@pytest.mark.parametrize(("files", "real", "stale"), END_TO_END)
def test_a_sandbox_the_runtime_still_knows_is_never_planned_for_del(
    node: NodeTree, t0: float, files: dict[str, str | bytes], real: str, stale: str
) -> None:
    name = earlier_boots_entry(node, t0, KNOWN)
    for node_path, data in files.items():
        write(node.root, node_path, data)
    if f"{SYSTEM}/cri.service.d/10-root.conf" in files:
        (node.root / SYSTEM.lstrip("/") / "cri.service").symlink_to("containerd.service")
    knows(node, real, KNOWN)
    knows(node, stale, STALE)

    report = dry_run(node, t0)

    entry = by_path(report)[name]
    assert entry["action"] == "keep", (entry["reason"], report["runtime_records"])


def test_a_data_dir_on_a_volume_not_mounted_yet(node: NodeTree, t0: float) -> None:
    """k3s's unit names --data-dir /data/k3s; /data is mounted after the reaper runs (a
    remote-fs or late .mount). Its root is absent: no records read for k3s, no doubt. The
    system containerd's records (kubeadm's, before k3s) are read, so the sandbox k3s knows is
    in no record read and planned for DEL."""
    name = earlier_boots_entry(node, t0, KNOWN)
    write(
        node.root, K3S_UNIT, "[Service]\nExecStart=/usr/local/bin/k3s server --data-dir /data/k3s\n"
    )
    write(node.root, "/etc/containerd/config.toml", "version = 2\n")
    knows(node, CONTAINERD_DEFAULT, STALE)
    (node.root / "data").mkdir()

    report = dry_run(node, t0)

    entry = by_path(report)[name]
    assert entry["action"] == "keep", (entry["reason"], report["runtime_records"])


def test_environment_files_spelled_many_ways_are_read_once(tmp_path: Path) -> None:
    """Each EnvironmentFile= of a k3s unit is read whole (up to 1 MiB) and only exact
    duplicates are skipped: one 1 MiB file named ~8000 ways ("//e///b", ...) in a 1 MiB
    drop-in makes ~8 GiB of reads (5 to 8 s here; twice that with RKE2's units too)."""
    write(tmp_path, "/e/b", b"# " + b"x" * ((1 << 20) - 3) + b"\n")
    lines: list[str] = []
    size = 0
    for i in range(1, 150):
        for j in range(1, 150):
            line = "EnvironmentFile=" + "/" * i + "e" + "/" * j + "b"
            size += len(line) + 1
            if size > (1 << 20) - 4096:
                break
            lines.append(line)
        if size > (1 << 20) - 4096:
            break
    write(tmp_path, f"{SYSTEM}/service.d/env.conf", "[Service]\n" + "\n".join(lines) + "\n")
    write(tmp_path, K3S_UNIT, "[Service]\nExecStart=/usr/local/bin/k3s server\n")
    configs = config.load(str(tmp_path))
    # Read once under all its spellings, until the units' byte budget runs out: then doubt.
    assert [w for w in configs.warnings if "bytes of units" in w], configs.warnings
    assert in_doubt(configs, K3S)
