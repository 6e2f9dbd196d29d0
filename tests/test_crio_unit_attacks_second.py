"""Second attack pass on the reading of CRI-O's unit and what a555821 changed (runtime/units.py:
`_assignments`/`_ASSIGNMENT`, `_aliases` over `_ConfigFiles.links`, `_default_environment`
reading system.conf under /run, /usr/local/lib, /usr/lib and /proc/cmdline; config.py: the
narrowed CONTAINER_* `variables`). The first pass is tests/test_crio_unit_attacks.py; nothing
here repeats it.

Each test asserts the safe property: the graph root CRI-O really uses is among the roots whose
records are read, or CRI-O's (or that runtime's) records are in doubt. A failing test is a hole.
The over-doubt tests assert that stock nodes are not doubted.

systemd facts (read from systemd main, facts only):
- src/core/load-fragment.c config_parse_environ: each word of Environment= (and, with no unit,
  of system.conf's DefaultEnvironment=) is split by extract_first_word with
  EXTRACT_CUNESCAPE|EXTRACT_UNQUOTE, so a quote may open and close anywhere in a word, the name
  included; then, for a unit, unit_env_printf resolves specifiers in the word.
  config_parse_unset_environ: the same splitting and specifiers for UnsetEnvironment=.
- src/shared/unit-printf.c: `%i` is specifier_string of u->instance, and specifier_string
  gives strempty(NULL), "", for a unit that is no instance (crio.service).
- src/basic/proc-cmdline.c: the kernel command line is split with extract_first_word and
  EXTRACT_UNQUOTE (EXTRACT_QUOTES in older releases): quotes in a word are removed.
- src/basic/unit-file.c: unit_file_resolve_symlink keeps a symlink inside the search path as an
  alias to its target's *file name*; unit_ids_map_get follows such names up to FOLLOW_MAX (8)
  hops; unit_file_build_name_map then files every name under the file name of the fragment it
  finally resolves to, so a chain a -> b -> crio.service makes `a` a name of crio.service
  (and its drop-in dirs count, systemd.unit(5)).
- src/basic/constants.h (v254 and earlier, HAVE_SPLIT_USR builds): CONF_PATHS adds
  "/lib/<n>" after /usr/lib, so /lib/systemd/system.conf.d is read where /lib is a dir of its
  own (Debian before the /usr merge).
- systemd.environment-generator(7), src/core/manager.c manager_run_environment_generators: the
  system manager runs /etc, /run, /usr/local/lib and /usr/lib
  systemd/system-environment-generators/* at start; what they print joins the manager's
  transient environment, which every service gets.
CRI-O facts: internal/criocli/criocli.go at the cri-o mirror's HEAD (EnvVars of each flag).

Only config.load: nothing runs a plugin or needs root.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

from cni_reaper.runtime import config
from cni_reaper.runtime.config import Runtime
from tests.runtime_layouts import (
    CONTAINERD_DEFAULT,
    K3S_DEFAULT,
    assert_reads_or_doubts,
    in_doubt,
    roots,
    write,
)
from tests.runtime_layouts import (
    CRIO_DEFAULT_ROOT as DEFAULT_ROOT,
)
from tests.runtime_layouts import (
    CRIO_DROP_IN as DROP_IN,
)
from tests.runtime_layouts import (
    CRIO_STOCK_SYSCONFIG as STOCK_SYSCONFIG,
)
from tests.runtime_layouts import (
    CRIO_SYSCONFIG as SYSCONFIG,
)
from tests.runtime_layouts import (
    CRIO_UNIT as VENDOR_UNIT,
)
from tests.test_crio_unit_attacks import ALIAS_DROP_IN, DATA, OPTIONS, crio_node, link

CRIO = Runtime.CRIO
ETC = "/etc/systemd/system"


# --- 1. Environment= names unquoted or specifier-resolved by systemd ------------------------------

ENVIRONMENT_NAMES: list[Any] = [
    # A quote opening inside the name: EXTRACT_UNQUOTE removes it, the name is whole again.
    pytest.param(f'CRIO_"STORAGE_OPTIONS=--root {DATA}"', id="quote-in-name"),
    pytest.param(f"'CRIO_STORAGE'_OPTIONS='--root {DATA}'", id="two-quoted-parts"),
    # %i is "" for crio.service: the name is CRIO_STORAGE_OPTIONS once resolved.
    pytest.param(f'"CRIO_STORAGE_%iOPTIONS=--root {DATA}"', id="empty-instance-specifier"),
]


@pytest.mark.parametrize("setting", ENVIRONMENT_NAMES)
def test_an_expanded_variable_named_in_parts(tmp_path: Path, setting: str) -> None:
    """config_parse_environ (load-fragment.c): EXTRACT_CUNESCAPE|EXTRACT_UNQUOTE over the
    whole word, then unit_env_printf. `Environment=CRIO_"STORAGE_OPTIONS=--root /data/crio"`
    sets CRIO_STORAGE_OPTIONS, which the packaged ExecStart= expands: CRI-O uses /data/crio.
    The reaper looks for the variable's name as written before it unquotes."""
    configs = crio_node(tmp_path, {DROP_IN: f"[Service]\nEnvironment={setting}\n"})
    assert_reads_or_doubts(configs, CRIO, DATA)


@pytest.mark.parametrize(
    "setting",
    [
        pytest.param(f'CONTAINER_"ROOT={DATA}"', id="quote-in-name"),
        pytest.param(f"CONTAINER_R%iOOT={DATA}", id="empty-instance-specifier"),
        pytest.param(f"'CONTAINER_'ROOT={DATA}", id="quoted-prefix"),
    ],
)
def test_a_container_variable_named_in_parts(tmp_path: Path, setting: str) -> None:
    """criocli.go: --root has EnvVars CONTAINER_ROOT (urfave/cli v2 reads it when the flag is
    not given). The Environment= word, unquoted and specifier-resolved as systemd does, is
    CONTAINER_ROOT=/data/crio; CRI-O keeps its records there. The reaper's check of
    Environment= for CONTAINER_* names is a substring of the text as written."""
    configs = crio_node(tmp_path, {DROP_IN: f"[Service]\nEnvironment={setting}\n"})
    assert_reads_or_doubts(configs, CRIO, DATA)


@pytest.mark.parametrize(
    "setting",
    [
        pytest.param('CRIO_STORAGE_"OPTIONS"', id="quote-in-name"),
        pytest.param("CRIO_STORAGE_%iOPTIONS", id="empty-instance-specifier"),
    ],
)
def test_unset_environment_named_in_parts(tmp_path: Path, setting: str) -> None:
    """config_parse_unset_environ: EXTRACT_CUNESCAPE|EXTRACT_UNQUOTE, then unit_env_printf:
    this unsets CRIO_STORAGE_OPTIONS, the sysconfig's --root is never expanded and CRI-O
    keeps its default root, while the reaper follows /data/crio (the first pass tested only
    a whole quoted name and an escape)."""
    drop_in = f"[Service]\nUnsetEnvironment={setting}\n"
    configs = crio_node(tmp_path, {SYSCONFIG: OPTIONS, DROP_IN: drop_in})
    assert_reads_or_doubts(configs, CRIO, DEFAULT_ROOT)


def test_environment_with_a_quoted_value_stays_plain(tmp_path: Path) -> None:
    """Over-doubt check of `_ASSIGNMENT`: a whole quoted word and NAME='value' are read as
    systemd does, and another variable's word beside them is no reason to doubt."""
    drop_in = f"[Service]\nEnvironment=GOTRACEBACK=crash CRIO_STORAGE_OPTIONS='--root {DATA}'\n"
    configs = crio_node(tmp_path, {DROP_IN: drop_in})
    assert roots(configs, CRIO) == [DATA], configs.warnings
    assert not in_doubt(configs, CRIO), configs.warnings


# --- 2. the manager's own environment -------------------------------------------------------------

DEFAULT_ENVIRONMENTS: list[Any] = [
    # EXTRACT_CUNESCAPE: \x53 is "S".
    pytest.param(f"CRIO_STORAGE_OPTION\\x53=--root={DATA}", id="escape"),
    pytest.param(f'CRIO_"STORAGE_OPTIONS=--root={DATA}"', id="quote-in-name"),
    pytest.param(f"CONTAINER_\\x52OOT={DATA}", id="container-root-escape"),
]


@pytest.mark.parametrize("setting", DEFAULT_ENVIRONMENTS)
def test_default_environment_named_in_parts(tmp_path: Path, setting: str) -> None:
    """config_parse_environ without a unit (system.conf's DefaultEnvironment=): the same
    EXTRACT_CUNESCAPE|EXTRACT_UNQUOTE splitting, so the name is whole once unescaped or
    unquoted, and every service gets it (systemd-system.conf(5)). `_sets` looks for the name
    as a substring of the file's text."""
    conf = f"[Manager]\nDefaultEnvironment={setting}\n"
    configs = crio_node(tmp_path, {"/etc/systemd/system.conf.d/50-crio.conf": conf})
    assert_reads_or_doubts(configs, CRIO, DATA)


def test_kernel_setenv_with_a_quote_in_the_name(tmp_path: Path) -> None:
    """proc-cmdline.c: each word of the kernel command line is unquoted (EXTRACT_UNQUOTE), so
    `systemd.setenv=CRIO_"STORAGE_OPTIONS=--root=/data/crio"` sets CRIO_STORAGE_OPTIONS for
    every service (kernel-command-line(7))."""
    cmdline = f'BOOT_IMAGE=/vmlinuz systemd.setenv=CRIO_"STORAGE_OPTIONS=--root={DATA}"\n'
    configs = crio_node(tmp_path, {"/proc/cmdline": cmdline})
    assert_reads_or_doubts(configs, CRIO, DATA)


def test_default_environment_in_split_usr_lib(tmp_path: Path) -> None:
    """constants.h, HAVE_SPLIT_USR (systemd up to v254 built with split-usr, as Debian's was
    before the /usr merge): CONF_PATHS ends in /lib/<n>, so /lib/systemd/system.conf.d/*.conf
    is read for DefaultEnvironment= where /lib is a dir of its own. The reaper reads /lib's
    unit dir (UNIT_DIRS) but not its system.conf.d."""
    conf = f"[Manager]\nDefaultEnvironment=CRIO_STORAGE_OPTIONS=--root={DATA}\n"
    configs = crio_node(tmp_path, {"/lib/systemd/system.conf.d/50-crio.conf": conf})
    assert_reads_or_doubts(configs, CRIO, DATA)


def test_a_system_environment_generator(tmp_path: Path) -> None:
    """systemd.environment-generator(7): executables in
    /etc/systemd/system-environment-generators/ run when the system manager starts and what
    they print joins its transient environment, passed to every service (manager.c,
    manager_run_environment_generators). Here a script prints the variable by name; the
    reaper, which cannot run it, could at least read it (or doubt its presence)."""
    script = f"#!/bin/sh\necho 'CRIO_STORAGE_OPTIONS=--root {DATA}'\n"
    path = write(tmp_path, "/etc/systemd/system-environment-generators/50-crio", script)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    configs = crio_node(tmp_path, {})
    assert_reads_or_doubts(configs, CRIO, DATA)


# --- 3. other names of the unit: _aliases over links ----------------------------------------------


def test_an_alias_through_a_chain_of_links(tmp_path: Path) -> None:
    """unit-file.c: an alias symlink keeps only its target's file name; unit_ids_map_get follows
    names up to 8 hops and the reverse map files each name under the fragment it ends at. So
    cri-o.service -> crio-runtime.service -> crio.service makes cri-o.service a name of
    crio.service, and cri-o.service.d/ applies. `_aliases` takes only the first hop's name."""
    link(tmp_path, f"{ETC}/crio-runtime.service", VENDOR_UNIT)
    link(tmp_path, f"{ETC}/cri-o.service", "crio-runtime.service")
    drop_in = f'[Service]\nEnvironment="CRIO_STORAGE_OPTIONS=--root {DATA}"\n'
    configs = crio_node(tmp_path, {SYSCONFIG: STOCK_SYSCONFIG, ALIAS_DROP_IN: drop_in})
    assert_reads_or_doubts(configs, CRIO, DATA)


def test_an_alias_in_another_unit_dir_through_a_relative_chain(tmp_path: Path) -> None:
    """The same chain across dirs, each link relative: /run/systemd/system/cri-o.service ->
    ../../../etc/systemd/system/crio-x.service -> crio.service (unit_file_resolve_symlink joins
    a relative target to the link's dir and cleans it: still inside the search path)."""
    link(tmp_path, f"{ETC}/crio-x.service", "crio.service")
    link(
        tmp_path, "/run/systemd/system/cri-o.service", "../../../etc/systemd/system/crio-x.service"
    )
    drop_in = f'[Service]\nEnvironment="CRIO_STORAGE_OPTIONS=--root {DATA}"\n'
    files = {SYSCONFIG: STOCK_SYSCONFIG, "/run/systemd/system/cri-o.service.d/1.conf": drop_in}
    configs = crio_node(tmp_path, files)
    assert_reads_or_doubts(configs, CRIO, DATA)


def test_an_alias_of_a_unit_that_is_itself_a_link(tmp_path: Path) -> None:
    """crio.service in /etc linked to the vendor file (same name: not an alias), and
    cri-o.service linked to the /etc link: its drop-in applies to crio.service."""
    link(tmp_path, f"{ETC}/crio.service", VENDOR_UNIT)
    link(tmp_path, f"{ETC}/cri-o.service", f"{ETC}/crio.service")
    drop_in = f'[Service]\nEnvironment="CRIO_STORAGE_OPTIONS=--root {DATA}"\n'
    configs = crio_node(tmp_path, {SYSCONFIG: STOCK_SYSCONFIG, ALIAS_DROP_IN: drop_in})
    assert_reads_or_doubts(configs, CRIO, DATA)


def test_an_alias_drop_in_in_system_control(tmp_path: Path) -> None:
    """`systemctl set-property cri-o.service ...` writes to
    /etc/systemd/system.control/cri-o.service.d/ (a unit dir of the search path): the alias'
    drop-in dir is looked for in every unit dir."""
    link(tmp_path, f"{ETC}/cri-o.service", VENDOR_UNIT)
    drop_in = "[Service]\nUnsetEnvironment=CRIO_STORAGE_OPTIONS\n"
    files = {SYSCONFIG: OPTIONS, "/etc/systemd/system.control/cri-o.service.d/50-x.conf": drop_in}
    configs = crio_node(tmp_path, files)
    assert_reads_or_doubts(configs, CRIO, DEFAULT_ROOT)


# --- 4. over-doubt on stock nodes now that _aliases runs for every runtime ------------------------


def _stock_links(root: Path) -> None:
    """What a Debian or Ubuntu root holds besides: aliases of other units at the top of the
    unit dirs, and `systemctl enable` links in .wants dirs."""
    link(root, "/lib/systemd/system/dbus-org.freedesktop.login1.service", "systemd-logind.service")
    link(root, f"{ETC}/sshd.service", "/lib/systemd/system/ssh.service")
    link(root, f"{ETC}/dbus-org.freedesktop.timesync1.service", "/lib/systemd/system/x.service")
    link(root, f"{ETC}/syslog.service", "/lib/systemd/system/rsyslog.service")


def test_debians_containerd_package_is_not_doubted(tmp_path: Path) -> None:
    """Debian's containerd: /lib/systemd/system/containerd.service (ExecStart=/usr/bin/
    containerd), enabled by a link in multi-user.target.wants, no alias."""
    unit = (
        "[Unit]\nDescription=containerd container runtime\n\n[Service]\n"
        "ExecStartPre=-/sbin/modprobe overlay\nExecStart=/usr/bin/containerd\nType=notify\n"
        "Delegate=yes\nKillMode=process\nRestart=always\n\n[Install]\n"
        "WantedBy=multi-user.target\n"
    )
    write(tmp_path, "/lib/systemd/system/containerd.service", unit)
    link(
        tmp_path,
        f"{ETC}/multi-user.target.wants/containerd.service",
        "/lib/systemd/system/containerd.service",
    )
    _stock_links(tmp_path)
    (tmp_path / CONTAINERD_DEFAULT.lstrip("/")).mkdir(parents=True)
    configs = config.load(str(tmp_path))
    assert not in_doubt(configs, Runtime.CONTAINERD), configs.warnings
    assert roots(configs, Runtime.CONTAINERD) == [CONTAINERD_DEFAULT]


def test_the_k3s_installer_enabled_is_not_doubted(tmp_path: Path) -> None:
    """get.k3s.io: /etc/systemd/system/k3s.service and k3s.service.env, enabled by
    `systemctl enable k3s` (a link in multi-user.target.wants to the unit in /etc)."""
    unit = (
        "[Service]\nType=notify\nEnvironmentFile=-/etc/default/%N\n"
        "EnvironmentFile=-/etc/sysconfig/%N\nEnvironmentFile=-/etc/systemd/system/k3s.service.env\n"
        "ExecStart=/usr/local/bin/k3s \\\n    server \\\n\n"
    )
    write(tmp_path, f"{ETC}/k3s.service", unit)
    write(tmp_path, f"{ETC}/k3s.service.env", "K3S_TOKEN=x\n")
    link(tmp_path, f"{ETC}/multi-user.target.wants/k3s.service", f"{ETC}/k3s.service")
    _stock_links(tmp_path)
    (tmp_path / K3S_DEFAULT.lstrip("/")).mkdir(parents=True)
    configs = config.load(str(tmp_path))
    assert not in_doubt(configs, Runtime.K3S), configs.warnings
    assert roots(configs, Runtime.K3S) == [K3S_DEFAULT]


def test_rke2s_tarball_enabled_is_not_doubted(tmp_path: Path) -> None:
    """RKE2's install.sh (tarball): /usr/local/lib/systemd/system/rke2-server.service and
    rke2-agent.service, the server enabled by a link in /etc's multi-user.target.wants."""
    lib = "/usr/local/lib/systemd/system"
    for kind in ("server", "agent"):
        unit = (
            f"[Service]\nEnvironmentFile=-/etc/default/%N\nExecStart=/usr/local/bin/rke2 {kind}\n"
        )
        write(tmp_path, f"{lib}/rke2-{kind}.service", unit)
    link(
        tmp_path, f"{ETC}/multi-user.target.wants/rke2-server.service", f"{lib}/rke2-server.service"
    )
    _stock_links(tmp_path)
    rke2_root = "/var/lib/rancher/rke2/agent/containerd"
    (tmp_path / rke2_root.lstrip("/")).mkdir(parents=True)
    configs = config.load(str(tmp_path))
    # Both units are there; only one starts on a real node, and which is not on disk.
    assert rke2_root in roots(configs, Runtime.RKE2) or in_doubt(configs, Runtime.RKE2)
    assert not [line for line in configs.warnings if "names of" in line], configs.warnings


def test_fedoras_enabled_alias_with_its_empty_wants_dir(tmp_path: Path) -> None:
    """Fedora's cri-o enabled: cri-o.service -> the vendor unit, and the wants link. No
    drop-in dir of the alias: no doubt (the alias' .wants dir is no drop-in dir)."""
    link(tmp_path, f"{ETC}/cri-o.service", VENDOR_UNIT)
    link(tmp_path, f"{ETC}/multi-user.target.wants/crio.service", VENDOR_UNIT)
    (tmp_path / f"{ETC}/cri-o.service.wants".lstrip("/")).mkdir(parents=True)
    configs = crio_node(tmp_path, {SYSCONFIG: STOCK_SYSCONFIG})
    assert roots(configs, CRIO) == [DEFAULT_ROOT], configs.warnings
    assert not in_doubt(configs, CRIO), configs.warnings


# --- 5. the narrowed CONTAINER_* list (criocli.go EnvVars) ----------------------------------------

CONTAINER_VARIABLES: list[Any] = [
    # Each the EnvVars of a flag that moves what the reaper reads (criocli.go at HEAD).
    pytest.param("CONTAINER_CONFIG_DIR=/etc/crio/other.d", id="config-dir"),
    pytest.param("CONTAINER_VERSION_FILE_PERSIST=/data/version", id="version-file-persist"),
    pytest.param("CONTAINER_INTERNAL_REPAIR=true", id="internal-repair"),
    pytest.param("CONTAINER_CNI_PLUGIN_DIR=/data/cni", id="cni-plugin-dir"),
    pytest.param("CONTAINERS_STORAGE_CONF=/etc/containers/other.conf", id="storage-conf"),
]


@pytest.mark.parametrize("setting", CONTAINER_VARIABLES)
def test_container_variables_that_move_what_is_read(tmp_path: Path, setting: str) -> None:
    """A variable in the unit's own environment file (not the packaged sysconfig's names):
    doubt, since it moves a config, a start marker, a wipe or a CNI dir."""
    files = {SYSCONFIG: STOCK_SYSCONFIG + setting + "\n"}
    configs = crio_node(tmp_path, files)
    assert in_doubt(configs, CRIO), configs.warnings
