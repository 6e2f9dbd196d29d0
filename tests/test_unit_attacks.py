"""Attacks on the reading of the runtimes' systemd units (runtime/units.py, config.py).

Each test asserts the safe behaviour: the records the reaper reads include the place the
runtime really keeps them (the persistent root it starts with), or its records are "in doubt"
(then no sandbox is called forgotten). Reading extra places is harmless (more sandboxes
known); reading another place instead of the real one is what lets the reaper DEL the network
of a sandbox the runtime still knows. Liveness tests assert that the socket the runtime really
listens on is watched.

What systemd does was taken from its sources: src/shared/conf-parser.c (config_parse: a line
whose first non-blank is # or ; is skipped before continuations are looked at; a backslash
escaped by a backslash is no continuation; a UTF-8 byte order mark is dropped; keys and values
are stripped of " \\t\\n\\r" only), src/basic/fileio.c (read_line: \\n, \\r and \\0 end a line,
nothing else), src/basic/stat-util.c (null_or_empty: an empty file or a character device is
a mask), dirent-util.c (a drop-in whose name starts with "." is skipped), the "-" prefix
drop-in dirs and the top-level <type>.d dirs (systemd commit 2f3f86ab, v246 NEWS),
systemd.service(5) (prefixes "-", "@", ":", "+", "!" combine in any order; with "@" the second
word is argv[0]; more than one ExecStart= only for Type=oneshot), systemd.exec(5) (C escapes
and specifiers in ExecStart= words; WorkingDirectory= defaults to "/"). containerd from
cmd/containerd/command/main.go (urfave/cli v2; a first positional argument that is not "" ends
in the help text, not the daemon; applyFlags skips an empty --root/--state/--address and makes
--root and --state absolute with filepath.Abs). k3s from pkg/configfilearg, pkg/cli/cmds
(DataDirFlag has EnvVar K3S_DATA_DIR; RKE2 v1.33 documents [$RKE2_DATA_DIR]) and install.sh
(INSTALL_K3S_NAME makes k3s-<name>.service; create_env_file copies every K3S_* variable of the
installer's environment into k3s.service.env).

Only config.load, inventory.load and dry runs: nothing runs a plugin or needs root.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cni_reaper.runtime import config, inventory
from cni_reaper.runtime.config import Runtime, RuntimeConfigs
from tests.crashed import by_path
from tests.nodetree import NodeTree
from tests.runtime_layouts import (
    CONTAINERD_DEFAULT,
    DROP_IN,
    K3S_DEFAULT,
    K3S_STOCK,
    K3S_UNIT,
    KNOWN,
    LIB,
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

K3S_AGENT_UNIT = f"{SYSTEM}/k3s-agent.service"
RKE2_UNIT = "/usr/local/lib/systemd/system/rke2-server.service"
RKE2_DEFAULT = "/var/lib/rancher/rke2/agent/containerd"

C, K3S, RKE2 = Runtime.CONTAINERD, Runtime.K3S, Runtime.RKE2


def sockets(configs: RuntimeConfigs, runtime: Runtime) -> list[str]:
    return [p.node_path for p in configs.sockets if p.runtime is runtime]


# --- 1. systemd's syntax, read otherwise ------------------------------------------------------

# (files, runtime, the root the runtime really starts with)
SYNTAX: list[Any] = [
    # A comment line is skipped before continuations are looked at: its trailing backslash
    # continues nothing. The reader joins the next line to the comment and loses it.
    pytest.param(
        {
            VENDOR_UNIT: STOCK,
            DROP_IN: "[Service]\nExecStart=\n# was: --root /var/lib/c \\\n"
            "ExecStart=/usr/bin/containerd --root /srv/containerd\n",
        },
        C,
        "/srv/containerd",
        id="comment-ending-in-backslash-swallows-the-next-line",
    ),
    # A comment line inside a continuation is skipped; the command goes on after it. The reader
    # ends the command at the comment and takes the commented-out flag.
    pytest.param(
        {UNIT: "[Service]\nExecStart=/usr/bin/containerd \\\n#  --root /old\n  --state /run/c\n"},
        C,
        CONTAINERD_DEFAULT,
        id="commented-out-flag-inside-a-continuation",
    ),
    # The k3s installer's layout, one argument of INSTALL_K3S_EXEC commented out by hand.
    pytest.param(
        {
            K3S_UNIT: "[Service]\nExecStart=/usr/local/bin/k3s \\\n    server \\\n"
            "#\t'--data-dir' '/data/old' \\\n\t'--node-name' \\\n\t'n1' \\\n\n"
        },
        K3S,
        K3S_DEFAULT,
        id="k3s-installer-argument-commented-out",
    ),
    # "\\\\" at the end of a line is an escaped backslash, not a continuation.
    pytest.param(
        {UNIT: "[Service]\nEnvironment=DIR=c:\\\\\nExecStart=/usr/bin/containerd --root /srv/c\n"},
        C,
        "/srv/c",
        id="escaped-backslash-is-no-continuation",
    ),
    # systemd drops a UTF-8 byte order mark; the reader sees no [Service] section.
    pytest.param(
        {UNIT: "\ufeff[Service]\nExecStart=/usr/bin/containerd --root /srv/c\n"},
        C,
        "/srv/c",
        id="byte-order-mark",
    ),
    # read_line ends a line at NUL; str.splitlines does not.
    pytest.param(
        {UNIT: "[Service]\nEnvironment=A=b\0ExecStart=/usr/bin/containerd --root /srv/c\n"},
        C,
        "/srv/c",
        id="nul-ends-a-line",
    ),
    # str.splitlines ends a line at \v \f \x1c-\x1e \x85 \u2028 \u2029; systemd does not.
    *[
        pytest.param(
            {UNIT: f"{STOCK}# note{sep}ExecStart=\n# note{sep}ExecStart=containerd --root /old\n"},
            C,
            CONTAINERD_DEFAULT,
            id=f"python-line-break-{ord(sep):04x}",
        )
        for sep in ("\x0b", "\x0c", "\x1e", "\x85", "\u2028")
    ],
    # str.strip drops a no-break space (and \x1c-\x1f, \u3000 ...); systemd strips " \t\n\r".
    pytest.param(
        {UNIT: f"{STOCK}\u00a0ExecStart=\n\u00a0ExecStart=containerd --root /old\n"},
        C,
        CONTAINERD_DEFAULT,
        id="key-after-a-no-break-space",
    ),
    pytest.param(
        {UNIT: f"{STOCK}ExecStart\u3000=\nExecStart\x1f=containerd --root /old\n"},
        C,
        CONTAINERD_DEFAULT,
        id="key-before-a-unicode-blank",
    ),
]


@pytest.mark.parametrize(("files", "runtime", "real"), SYNTAX)
def test_unit_syntax_is_read_as_systemd_reads_it(
    tmp_path: Path, files: dict[str, str | bytes], runtime: Runtime, real: str
) -> None:
    assert_reads_or_doubts(tree(tmp_path, files), runtime, real)


# --- 2. which files systemd reads -----------------------------------------------------------

WHICH_FILES: list[Any] = [
    # Hidden files are skipped by conf_files_list (dirent_is_file_with_suffix).
    pytest.param(
        {
            VENDOR_UNIT: STOCK,
            f"{SYSTEM}/containerd.service.d/.old.conf": "[Service]\nExecStart=\n"
            "ExecStart=/usr/bin/containerd --root /old\n",
        },
        C,
        CONTAINERD_DEFAULT,
        id="hidden-drop-in",
    ),
    # An empty unit file masks the unit (null_or_empty); its drop-ins start nothing.
    pytest.param(
        {
            UNIT: "",
            VENDOR_UNIT: STOCK,
            DROP_IN: "[Service]\nExecStart=\nExecStart=/usr/bin/containerd --root /old\n",
        },
        C,
        CONTAINERD_DEFAULT,
        id="empty-unit-file-masks",
    ),
    # Drop-ins without any unit file: the unit is not found, nothing runs them.
    pytest.param(
        {DROP_IN: "[Service]\nExecStart=\nExecStart=/usr/bin/containerd --root /old\n"},
        C,
        CONTAINERD_DEFAULT,
        id="drop-ins-of-a-unit-that-does-not-exist",
    ),
    # The "-" prefix drop-in dirs: k3s-.service.d applies to k3s-agent.service.
    pytest.param(
        {
            K3S_AGENT_UNIT: "[Service]\nExecStart=/usr/local/bin/k3s agent\n",
            f"{SYSTEM}/k3s-.service.d/50-data.conf": "[Service]\nExecStart=\n"
            "ExecStart=/usr/local/bin/k3s agent --data-dir /data/k3s\n",
        },
        K3S,
        "/data/k3s/agent/containerd",
        id="dash-prefix-drop-in-dir",
    ),
    # rke2-.service.d applies to rke2-server.service and rke2-agent.service.
    pytest.param(
        {
            RKE2_UNIT: "[Service]\nExecStart=/usr/local/bin/rke2 server\n",
            f"{SYSTEM}/rke2-.service.d/50-data.conf": "[Service]\nExecStart=\n"
            "ExecStart=/usr/local/bin/rke2 server --data-dir /data/rke2\n",
        },
        RKE2,
        "/data/rke2/agent/containerd",
        id="rke2-dash-prefix-drop-in-dir",
    ),
    # The top-level service.d drop-ins apply to every service.
    pytest.param(
        {
            VENDOR_UNIT: STOCK,
            f"{SYSTEM}/service.d/50-k3s.conf": "[Service]\n"
            "Environment=K3S_CONFIG_FILE=/etc/k3s.yaml\n",
            "/etc/k3s.yaml": "data-dir: /data/k3s\n",
            "/etc/rancher/k3s/config.yaml": "write-kubeconfig-mode: '0644'\n",
            K3S_UNIT: K3S_STOCK,
        },
        K3S,
        "/data/k3s/agent/containerd",
        id="top-level-service-d-drop-in",
    ),
    # /etc/systemd/system.control comes before /etc/systemd/system in the search path.
    pytest.param(
        {
            VENDOR_UNIT: STOCK,
            "/etc/systemd/system.control/containerd.service.d/50-root.conf": "[Service]\n"
            "ExecStart=\nExecStart=/usr/bin/containerd --root /srv/c\n",
        },
        C,
        "/srv/c",
        id="system-control-drop-in",
    ),
    # Generators' output is read at boot too (/run/systemd/generator{,.early,.late}).
    pytest.param(
        {
            VENDOR_UNIT: STOCK,
            "/run/systemd/generator/containerd.service.d/50-root.conf": "[Service]\n"
            "ExecStart=\nExecStart=/usr/bin/containerd --root /srv/c\n",
        },
        C,
        "/srv/c",
        id="generator-drop-in",
    ),
    # INSTALL_K3S_NAME=edge: the installer writes k3s-edge.service.
    pytest.param(
        {
            f"{SYSTEM}/k3s-edge.service": "[Service]\nExecStart=/usr/local/bin/k3s \\\n"
            "    server \\\n\t'--data-dir' \\\n\t'/data/k3s' \\\n\n",
        },
        K3S,
        "/data/k3s/agent/containerd",
        id="k3s-installed-under-another-name",
    ),
    # k3s.service is the one enabled; k3s-agent.service is left from an earlier install.
    pytest.param(
        {
            K3S_UNIT: K3S_STOCK,
            K3S_AGENT_UNIT: "[Service]\nExecStart=/usr/local/bin/k3s agent --data-dir /old\n",
        },
        K3S,
        K3S_DEFAULT,
        id="leftover-k3s-agent-unit-wins-over-the-enabled-one",
    ),
]


@pytest.mark.parametrize(("files", "runtime", "real"), WHICH_FILES)
def test_the_units_and_drop_ins_read_are_those_systemd_reads(
    tmp_path: Path, files: dict[str, str | bytes], runtime: Runtime, real: str
) -> None:
    assert_reads_or_doubts(tree(tmp_path, files), runtime, real)


def test_drop_ins_of_a_units_alias_are_read(tmp_path: Path) -> None:
    """containerd.service is a symlink to another name: systemd loads the drop-ins of every
    name of the unit (u->aliases in unit_find_dropin_paths)."""
    write(tmp_path, f"{SYSTEM}/containerd-node.service", STOCK)
    (tmp_path / SYSTEM.lstrip("/") / "containerd.service").symlink_to("containerd-node.service")
    drop_in = "[Service]\nExecStart=\nExecStart=/usr/bin/containerd --root /srv/c\n"
    write(tmp_path, f"{SYSTEM}/containerd-node.service.d/10-root.conf", drop_in)
    assert_reads_or_doubts(config.load(str(tmp_path)), C, "/srv/c")


def test_drop_ins_are_ordered_by_their_names_bytes(tmp_path: Path) -> None:
    """systemd sorts drop-ins with strcmp on the name's bytes. A name that is not UTF-8 is
    decoded with surrogates, which Python sorts after every BMP letter: "1\\xc3.conf" comes
    before "1\\xc3\\xa9.conf" (1é.conf) for systemd, after it for the reader."""
    write(tmp_path, VENDOR_UNIT, STOCK)
    drop_ins = tmp_path / "etc/systemd/system/containerd.service.d"
    drop_ins.mkdir(parents=True)
    first = "[Service]\nExecStart=\nExecStart=/usr/bin/containerd --root /first\n"
    last = "[Service]\nExecStart=\nExecStart=/usr/bin/containerd --root /last\n"
    (drop_ins / os.fsdecode(b"1\xc3.conf")).write_text(first)
    (drop_ins / "1\u00e9.conf").write_text(last)
    assert_reads_or_doubts(config.load(str(tmp_path)), C, "/last")


# --- 3. the command line, read otherwise --------------------------------------------------------

COMMAND_LINE: list[Any] = [
    # "-@": prefixes combine; with "@" the second word is argv[0], not a flag.
    pytest.param(
        {UNIT: "[Service]\nExecStart=-@/usr/bin/containerd --root=/old\n"},
        C,
        CONTAINERD_DEFAULT,
        id="dash-at-prefix-second-word-is-argv0",
    ),
    pytest.param(
        {UNIT: "[Service]\nExecStart=+@/usr/bin/containerd --root=/old\n"},
        C,
        CONTAINERD_DEFAULT,
        id="plus-at-prefix-second-word-is-argv0",
    ),
    # Go's flag package stops at "", a non-flag; containerd's Action lets args.First() == ""
    # through, and starts with its default root.
    pytest.param(
        {UNIT: '[Service]\nExecStart=/usr/bin/containerd "" --root /old\n'},
        C,
        CONTAINERD_DEFAULT,
        id="empty-argument-ends-the-flags",
    ),
    # A string flag takes the next word whatever it is: the token is "--data-dir=/old".
    pytest.param(
        {K3S_UNIT: "[Service]\nExecStart=/usr/local/bin/k3s server --token --data-dir=/old\n"},
        K3S,
        K3S_DEFAULT,
        id="data-dir-as-the-value-of-another-flag",
    ),
    # The command is a shell's: its "-c" is no containerd flag, and the --root is inside a word.
    pytest.param(
        {UNIT: "[Service]\nExecStart=/bin/sh -c 'exec /usr/bin/containerd --root /srv/c'\n"},
        C,
        "/srv/c",
        id="command-run-by-a-shell",
    ),
    # A wrapper's own -c taken as containerd's --config: the real config is never read.
    pytest.param(
        {
            UNIT: "[Service]\nExecStart=/usr/bin/taskset -c 0-3 /usr/bin/containerd\n",
            "/etc/containerd/config.toml": "version = 2\nroot = '/srv/c'\n",
        },
        C,
        "/srv/c",
        id="wrapper-flag-taken-for-containerds",
    ),
    # systemd unescapes C escapes in every word: "--ro\x6ft" is "--root".
    pytest.param(
        {UNIT: "[Service]\nExecStart=/usr/bin/containerd --ro\\x6ft=/srv/c\n"},
        C,
        "/srv/c",
        id="c-escape-in-a-flag-name",
    ),
    pytest.param(
        {K3S_UNIT: "[Service]\nExecStart=/usr/local/bin/k3s server -\\x64 /data/k3s\n"},
        K3S,
        "/data/k3s/agent/containerd",
        id="c-escape-in-k3s-short-flag",
    ),
    # %i is empty for a unit that is no template instance: "--r%ioot" is "--root".
    pytest.param(
        {UNIT: "[Service]\nExecStart=/usr/bin/containerd --r%ioot=/srv/c\n"},
        C,
        "/srv/c",
        id="specifier-in-a-flag-name",
    ),
    # applyFlags skips an empty --root: the config's, else the default, stays.
    pytest.param(
        {UNIT: "[Service]\nExecStart=/usr/bin/containerd --root=\n"},
        C,
        CONTAINERD_DEFAULT,
        id="empty-root-flag",
    ),
    pytest.param(
        {
            UNIT: "[Service]\nExecStart=/usr/bin/containerd --root ''\n",
            "/etc/containerd/config.toml": "version = 2\nroot = '/srv/c'\n",
        },
        C,
        "/srv/c",
        id="empty-root-flag-config-root-stays",
    ),
    # filepath.Abs makes a relative --root absolute from the working directory.
    pytest.param(
        {UNIT: "[Service]\nWorkingDirectory=/opt\nExecStart=/usr/bin/containerd --root c\n"},
        C,
        "/opt/c",
        id="relative-root-from-working-directory",
    ),
]


@pytest.mark.parametrize(("files", "runtime", "real"), COMMAND_LINE)
def test_the_command_line_is_read_as_the_runtime_reads_it(
    tmp_path: Path, files: dict[str, str | bytes], runtime: Runtime, real: str
) -> None:
    assert_reads_or_doubts(tree(tmp_path, files), runtime, real)


# Units with which the runtime does not start: whatever the operator mends decides where its
# records will be, so they are in doubt (as the k3s reader does for both forms of -d).
WONT_START: list[Any] = [
    # systemd: "Service has more than one ExecStart= setting ... Refusing."
    pytest.param(
        {UNIT: "[Service]\nExecStart=containerd --root /a\nExecStart=containerd --root /b\n"},
        C,
        id="two-exec-start-in-a-simple-service",
    ),
    # urfave/cli normalizeFlags: "Cannot use two forms of the same flag".
    pytest.param(
        {UNIT: "[Service]\nExecStart=/usr/bin/containerd -c /a.toml --config /b.toml\n"},
        C,
        id="both-forms-of-config",
    ),
    pytest.param(
        {UNIT: "[Service]\nExecStart=/usr/bin/containerd -a /run/a.sock --address /run/b.sock\n"},
        C,
        id="both-forms-of-address",
    ),
    # After "--", "--root" is containerd's first argument: it prints help and exits.
    pytest.param(
        {UNIT: "[Service]\nExecStart=/usr/bin/containerd -- --root /b\n"},
        C,
        id="flag-after-double-dash",
    ),
    # --log-level takes "--root"; "/b" is an argument: help, and no daemon.
    pytest.param(
        {UNIT: "[Service]\nExecStart=/usr/bin/containerd --log-level --root /b\n"},
        C,
        id="root-as-the-value-of-log-level",
    ),
]


@pytest.mark.parametrize(("files", "runtime"), WONT_START)
def test_a_unit_the_runtime_does_not_start_with_puts_its_records_in_doubt(
    tmp_path: Path, files: dict[str, str | bytes], runtime: Runtime
) -> None:
    configs = tree(tmp_path, files)
    assert in_doubt(configs, runtime), (roots(configs, runtime), configs.warnings)


# --- 4. the environment -----------------------------------------------------------------------

ENVIRONMENT: list[Any] = [
    pytest.param(
        {K3S_UNIT: "[Service]\nEnvironment=K3S_DATA_DIR=/data/k3s\n" + K3S_STOCK[10:]},
        K3S,
        "/data/k3s/agent/containerd",
        id="k3s-data-dir-variable-in-the-unit",
    ),
    # K3S_DATA_DIR=/data/k3s curl -sfL https://get.k3s.io | sh -
    pytest.param(
        {
            K3S_UNIT: "[Service]\nEnvironmentFile=-/etc/systemd/system/k3s.service.env\n"
            + K3S_STOCK[10:],
            f"{SYSTEM}/k3s.service.env": "K3S_DATA_DIR='/data/k3s'\n",
        },
        K3S,
        "/data/k3s/agent/containerd",
        id="k3s-data-dir-variable-in-the-installers-env-file",
    ),
    pytest.param(
        {
            RKE2_UNIT: "[Service]\nEnvironmentFile=-/etc/default/%N\n"
            "ExecStart=/usr/local/bin/rke2 server\n",
            "/etc/default/rke2-server": "RKE2_DATA_DIR=/data/rke2\n",
        },
        RKE2,
        "/data/rke2/agent/containerd",
        id="rke2-data-dir-variable-in-etc-default",
    ),
    # An environment file with a Latin-1 comment: systemd skips the comment and sets the rest.
    pytest.param(
        {
            K3S_UNIT: "[Service]\nEnvironmentFile=-/etc/systemd/system/k3s.service.env\n"
            + K3S_STOCK[10:],
            f"{SYSTEM}/k3s.service.env": b"# r\xe9pertoire\nK3S_CONFIG_FILE=/etc/k3s.yaml\n",
            "/etc/k3s.yaml": "data-dir: /data/k3s\n",
            "/etc/rancher/k3s/config.yaml": "write-kubeconfig-mode: '0644'\n",
        },
        K3S,
        "/data/k3s/agent/containerd",
        id="environment-file-not-read-is-no-doubt",
    ),
    # EnvironmentFile= takes a glob.
    pytest.param(
        {
            K3S_UNIT: "[Service]\nEnvironmentFile=-/etc/k3s/*.env\n" + K3S_STOCK[10:],
            "/etc/k3s/node.env": "K3S_CONFIG_FILE=/etc/k3s.yaml\n",
            "/etc/k3s.yaml": "data-dir: /data/k3s\n",
            "/etc/rancher/k3s/config.yaml": "write-kubeconfig-mode: '0644'\n",
        },
        K3S,
        "/data/k3s/agent/containerd",
        id="environment-file-glob",
    ),
    # Environment= words are C-unescaped like ExecStart='s.
    pytest.param(
        {
            K3S_UNIT: "[Service]\nEnvironment=K3S_CONFIG_\\x46ILE=/etc/k3s.yaml\n" + K3S_STOCK[10:],
            "/etc/k3s.yaml": "data-dir: /data/k3s\n",
            "/etc/rancher/k3s/config.yaml": "write-kubeconfig-mode: '0644'\n",
        },
        K3S,
        "/data/k3s/agent/containerd",
        id="config-variable-name-with-a-c-escape",
    ),
]


@pytest.mark.parametrize(("files", "runtime", "real"), ENVIRONMENT)
def test_the_environment_that_moves_the_data_dir_is_followed_or_doubted(
    tmp_path: Path, files: dict[str, str | bytes], runtime: Runtime, real: str
) -> None:
    assert_reads_or_doubts(tree(tmp_path, files), runtime, real)


# --- 5. liveness: the socket the running runtime answers on ------------------------------------

LIVE: list[Any] = [
    pytest.param(
        {UNIT: "[Service]\nExecStart=/usr/bin/containerd \\\n# old socket\n  -a /run/c/c.sock\n"},
        id="address-after-a-comment-in-a-continuation",
    ),
    pytest.param(
        {UNIT: "\ufeff[Service]\nExecStart=/usr/bin/containerd -a /run/c/c.sock\n"},
        id="byte-order-mark",
    ),
    pytest.param(
        {UNIT: "[Service]\nEnvironment=A=b\0ExecStart=/usr/bin/containerd -a /run/c/c.sock\n"},
        id="nul-ends-a-line",
    ),
    pytest.param(
        {
            VENDOR_UNIT: STOCK,
            DROP_IN: "[Service]\nExecStart=\n# \\\n"
            "ExecStart=/usr/bin/containerd -a /run/c/c.sock\n",
        },
        id="comment-ending-in-backslash",
    ),
    pytest.param(
        {UNIT: "[Service]\nExecStart=/usr/bin/containerd --addr\\x65ss=/run/c/c.sock\n"},
        id="c-escape-in-the-flag-name",
    ),
]


@pytest.mark.parametrize("files", LIVE)
def test_the_socket_containerd_listens_on_is_watched(
    tmp_path: Path, files: dict[str, str | bytes]
) -> None:
    """Watched, or, where the unit is not plain enough to follow, its records in doubt: a
    containerd running on a socket not watched is still found by its process (liveness.py
    looks for runtime processes on this root in /proc whatever their sockets)."""
    configs = tree(tmp_path, files)
    watched = "/run/c/c.sock" in sockets(configs, C)
    assert watched or in_doubt(configs, C), (sockets(configs, C), configs.warnings)


# --- 6. crashes, time, and the root's edge -----------------------------------------------------


def test_a_nul_in_a_config_path_is_a_warning_not_a_crash(tmp_path: Path) -> None:
    """The reader keeps the NUL that systemd would end the line at, and hands the path to
    os.stat: ValueError out of config.load, the run ends as an internal error."""
    write(tmp_path, UNIT, "[Service]\nExecStart=/usr/bin/containerd -c /etc/a\0b.toml\n")
    configs = config.load(str(tmp_path))
    assert in_doubt(configs, C) or CONTAINERD_DEFAULT in roots(configs, C)


def test_a_nul_in_an_environment_file_path_is_not_a_crash(tmp_path: Path) -> None:
    write(tmp_path, "/etc/default/k3s", "")
    unit = "[Service]\nEnvironmentFile=-/etc/default/k\0s\n" + K3S_STOCK[10:]
    write(tmp_path, K3S_UNIT, unit)
    config.load(str(tmp_path))


def test_a_nul_in_a_root_path_is_not_a_crash_of_the_inventory(tmp_path: Path) -> None:
    (tmp_path / "srv").mkdir()
    write(tmp_path, UNIT, "[Service]\nExecStart=/usr/bin/containerd --root /srv/a\0b\n")
    configs = config.load(str(tmp_path))
    inventory.load(str(tmp_path), configs)


def test_a_long_continued_line_is_read_whole(tmp_path: Path) -> None:
    """1 MiB of continuation lines (the most a unit file is read): joined with
    `pending + raw` line by line, quadratic, ~9 s here; a drop-in dir may hold 4096."""
    body = "\\\n" * ((config.MAX_CONFIG_BYTES - 64) // 2)
    write(tmp_path, DROP_IN, "[Service]\nExecStart=/usr/bin/containerd \\\n" + body)
    write(tmp_path, VENDOR_UNIT, STOCK)
    configs = config.load(str(tmp_path))
    assert_reads_or_doubts(configs, C, CONTAINERD_DEFAULT)


def test_units_outside_the_root_are_not_read(tmp_path: Path) -> None:
    """A drop-in dir and a drop-in file that lead out of the root: warnings, doubt, and the
    outside value never used."""
    outside = tmp_path / "outside"
    write(outside, "/x.conf", "[Service]\nExecStart=\nExecStart=containerd --root /outside\n")
    root = tmp_path / "root"
    write(root, VENDOR_UNIT, STOCK)
    (root / "etc/systemd/system/containerd.service.d").mkdir(parents=True)
    (root / "etc/systemd/system/containerd.service.d/x.conf").symlink_to(
        "../../../../../outside/x.conf"
    )
    (root / "etc/systemd/system/k3s.service.d").symlink_to("../../../../outside")
    configs = config.load(str(root))
    assert "/outside" not in roots(configs, C)
    assert in_doubt(configs, C) and in_doubt(configs, K3S)


def test_a_config_named_on_the_command_line_out_of_the_root_is_doubt(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    write(outside, "/c.toml", "root = '/outside'\n")
    root = tmp_path / "root"
    write(root, UNIT, "[Service]\nExecStart=/usr/bin/containerd -c /etc/c.toml\n")
    (root / "etc/c.toml").symlink_to("../../outside/c.toml")
    configs = config.load(str(root))
    assert "/outside" not in roots(configs, C) and in_doubt(configs, C)


# --- 7. scenarios that hold -----------------------------------------------------------------

HOLDS: list[Any] = [
    # /etc/systemd/system comes before /run/systemd/system.
    pytest.param(
        {UNIT: STOCK, "/run/systemd/system/containerd.service": STOCK[:-1] + " --root /r\n"},
        CONTAINERD_DEFAULT,
        id="etc-unit-over-run-unit",
    ),
    # A drop-in of the same name in an earlier dir hides the later one.
    pytest.param(
        {
            VENDOR_UNIT: STOCK,
            DROP_IN: "[Service]\nExecStart=\nExecStart=/usr/bin/containerd --root /etc-c\n",
            f"{LIB}/containerd.service.d/10-root.conf": "[Service]\nExecStart=\n"
            "ExecStart=/usr/bin/containerd --root /lib-c\n",
        },
        "/etc-c",
        id="same-name-drop-in-earlier-dir-wins",
    ),
    # All drop-ins by name, whatever their dir: the vendor's 99 comes after the admin's 10.
    pytest.param(
        {
            VENDOR_UNIT: STOCK,
            DROP_IN: "[Service]\nExecStart=\nExecStart=/usr/bin/containerd --root /admin\n",
            f"{LIB}/containerd.service.d/99-vendor.conf": "[Service]\nExecStart=\n"
            "ExecStart=/usr/bin/containerd --root /vendor\n",
        },
        "/vendor",
        id="drop-ins-sorted-by-name-across-dirs",
    ),
    pytest.param(
        {UNIT: "[Service]\r\nExecStart=/usr/bin/containerd \\\r\n --root /crlf\r\n"},
        "/crlf",
        id="crlf",
    ),
    pytest.param(
        {UNIT: "[Service]\rEnvironment=A=1\rExecStart=/usr/bin/containerd --root /cr\r"},
        "/cr",
        id="lone-cr-ends-a-line-for-both",
    ),
    pytest.param(
        {UNIT: "[Service]\nExecStart =  /usr/bin/containerd\t--root\t/sp  \n"},
        "/sp",
        id="blanks-around-key-and-tabs-between-words",
    ),
    pytest.param(
        {
            UNIT: "[Service]\nexecstart=/usr/bin/containerd --root /x\n[service]\n"
            "ExecStart=/usr/bin/containerd --root /y\n"
        },
        CONTAINERD_DEFAULT,
        id="keys-and-sections-are-case-sensitive",
    ),
    pytest.param(
        {
            UNIT: "[Unit]\nExecStart=/usr/bin/containerd --root /x\n[Service]\n"
            "ExecStart=/usr/bin/containerd\n[Install]\nExecStart=containerd --root /y\n"
        },
        CONTAINERD_DEFAULT,
        id="exec-start-outside-service-ignored",
    ),
    pytest.param(
        {
            UNIT: "[Service]\nExecStart=\n[Unit]\nDescription=x\n[Service]\n"
            "ExecStart=/usr/bin/containerd --root /again\n"
        },
        "/again",
        id="service-section-repeated",
    ),
    pytest.param(
        {UNIT: "[Service]\nExecStart=/usr/bin/containerd --root /a --root=/b\n"},
        "/b",
        id="later-root-wins",
    ),
    pytest.param(
        {UNIT: "[Service]\nExecStart=/usr/bin/containerd --root --state=/x\n"},
        "/--state=/x",
        id="state-flag-taken-as-roots-value",
    ),
    pytest.param(
        {UNIT: "[Service]\nExecStart=!!/usr/bin/containerd '--root' \"/q\"\n"},
        "/q",
        id="bang-bang-prefix-and-quoted-words",
    ),
    pytest.param(
        {UNIT: "[Service]\nExecStart=/usr/bin/containerd --root relative\n"},
        "/relative",
        id="relative-root-from-the-default-working-directory",
    ),
    pytest.param(
        {
            UNIT: "[Service]\nExecStart=/usr/bin/containerd --root /s\n",
            f"{SYSTEM}/containerd.service.d/x.conf.bak": "[Service]\nExecStart=\n",
            f"{SYSTEM}/containerd.service.d/dir.conf/a.conf": "[Service]\nExecStart=\n",
        },
        "/s",
        id="not-conf-and-dir-named-conf-ignored",
    ),
]


@pytest.mark.parametrize(("files", "real"), HOLDS)
def test_what_holds(tmp_path: Path, files: dict[str, str | bytes], real: str) -> None:
    configs = tree(tmp_path, files)
    assert real in roots(configs, C) or in_doubt(configs, C), (roots(configs, C), configs.warnings)


DOUBTED: list[Any] = [
    pytest.param({UNIT: "[Service]\nExecStart=@/usr/bin/containerd containerd --root /x\n"}),
    pytest.param({UNIT: '[Service]\nExecStart=/usr/bin/containerd --root="/x"\n'}),
    pytest.param({UNIT: "[Service]\nExecStart=/usr/bin/containerd --root ${ROOT}\n"}),
    pytest.param({UNIT: "[Service]\nExecStart=/usr/bin/containerd --root /x%n\n"}),
    pytest.param({UNIT: "[Service]\nExecStart=/usr/bin/containerd --root\n"}),
    pytest.param({UNIT: "[Service]\nExecStart=/usr/bin/containerd -c /etc/containerd\n"}),
]


@pytest.mark.parametrize("files", DOUBTED)
def test_what_is_not_plain_is_doubted(tmp_path: Path, files: dict[str, str | bytes]) -> None:
    (tmp_path / "etc/containerd").mkdir(parents=True)
    configs = tree(tmp_path, files)
    assert in_doubt(configs, C), (roots(configs, C), configs.warnings)


def test_masks_hold(tmp_path: Path) -> None:
    """A unit masked by a symlink to /dev/null (absolute or relative) with drop-ins: nothing
    is followed (relative: doubt, the target not being read); a masked drop-in: doubt."""
    write(tmp_path, VENDOR_UNIT, STOCK)
    write(tmp_path, DROP_IN, "[Service]\nExecStart=\nExecStart=containerd --root /masked\n")
    unit = tmp_path / UNIT.lstrip("/")
    for target in ("/dev/null", "../../../dev/null"):
        unit.symlink_to(target)
        configs = config.load(str(tmp_path))
        assert "/masked" not in roots(configs, C) or in_doubt(configs, C)
        unit.unlink()
    os.unlink(tmp_path / DROP_IN.lstrip("/"))
    (tmp_path / DROP_IN.lstrip("/")).symlink_to("/dev/null")
    write(tmp_path, f"{LIB}/containerd.service.d/10-root.conf", "[Service]\nExecStart=\n")
    configs = config.load(str(tmp_path))
    assert CONTAINERD_DEFAULT in roots(configs, C) or in_doubt(configs, C)


def test_a_fifo_drop_in_does_not_hang(tmp_path: Path) -> None:
    write(tmp_path, VENDOR_UNIT, STOCK)
    (tmp_path / "etc/systemd/system/containerd.service.d").mkdir(parents=True)
    os.mkfifo(tmp_path / "etc/systemd/system/containerd.service.d/10.conf")
    configs = config.load(str(tmp_path))
    assert in_doubt(configs, C)


# --- 8. end to end: a sandbox the runtime still knows, planned for DEL ------------------------


# (the units and configs, where the runtime keeps KNOWN, where stale records lie)
END_TO_END: list[Any] = [
    pytest.param(
        {
            VENDOR_UNIT: STOCK,
            "/etc/containerd/config.toml": "version = 2\n",
            DROP_IN: "[Service]\nExecStart=\n# moved to the data volume \\\n"
            "ExecStart=/usr/bin/containerd --root /data/containerd\n",
        },
        "/data/containerd",
        CONTAINERD_DEFAULT,
        id="comment-ending-in-backslash",
    ),
    pytest.param(
        {
            K3S_UNIT: "[Service]\nEnvironmentFile=-/etc/systemd/system/k3s.service.env\n"
            + K3S_STOCK[10:],
            f"{SYSTEM}/k3s.service.env": "K3S_DATA_DIR='/data/k3s'\n",
        },
        "/data/k3s/agent/containerd",
        K3S_DEFAULT,
        id="k3s-data-dir-in-the-installers-env-file",
    ),
    pytest.param(
        {
            UNIT: "[Service]\nExecStart=-@/usr/bin/containerd --root=/data/old\n",
            "/etc/containerd/config.toml": "version = 2\n",
        },
        CONTAINERD_DEFAULT,
        "/data/old",
        id="dash-at-prefix",
    ),
    pytest.param(
        {
            UNIT: "[Service]\nExecStart=/usr/bin/taskset -c 0-3 /usr/bin/containerd\n",
            "/etc/containerd/config.toml": "version = 2\nroot = '/data/containerd'\n",
        },
        "/data/containerd",
        CONTAINERD_DEFAULT,
        id="wrapper-flag",
    ),
]


@pytest.mark.parametrize(("files", "real", "stale"), END_TO_END)
def test_a_sandbox_the_runtime_still_knows_is_never_planned_for_del(
    node: NodeTree, t0: float, files: dict[str, str | bytes], real: str, stale: str
) -> None:
    name = earlier_boots_entry(node, t0, KNOWN)
    for node_path, data in files.items():
        write(node.root, node_path, data)
    knows(node, real, KNOWN)
    knows(node, stale, STALE)

    report = dry_run(node, t0)

    entry = by_path(report)[name]
    assert entry["action"] == "keep", (entry["reason"], report["runtime_records"])
