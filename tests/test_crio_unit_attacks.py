"""Attack pass on the reading of CRI-O's packaged unit (runtime/units.py: `_expanded`,
`environment_file`, `command_words`, `_aliases`; config.py: CRIO_UNITS, `_crio`): the unit runs
`crio $CRIO_CONFIG_OPTIONS $CRIO_RUNTIME_OPTIONS $CRIO_STORAGE_OPTIONS $CRIO_NETWORK_OPTIONS
$CRIO_METRICS_OPTIONS`, the variables set by Environment= and EnvironmentFile=.

Each test asserts the safe property: the graph root CRI-O really uses is among the roots whose
records are read, or CRI-O's records are in doubt (RuntimeConfigs.records_in_doubt has a
"cri-o:" line; then no sandbox is called forgotten). A failing test is a hole. Tests marked
xfail(strict) were over-doubt on realistic nodes (safe, but the reaper then did nothing there);
all three are mended.

Sources read (facts only):
- systemd main: src/basic/env-file.c (parse_env_file_internal, load_env_file_push,
  check_utf8ness_and_warn), src/basic/env-util.c (env_name_is_valid, env_assignment_is_valid,
  strv_env_clean_with_callback, replace_env_argv), src/core/load-fragment.c
  (config_parse_unit_env_file, config_parse_environ, config_parse_unset_environ,
  config_parse_pass_environ), src/basic/path-util.c (path_simplify_and_warn), src/core/execute.c
  (exec_context_load_environment, an older one: a file that fails to load is skipped whole when
  its name has "-", and its invalid assignments are dropped by strv_env_clean_with_callback),
  systemd.service(5) (the ":" prefix), systemd-system.conf(5) of v256 and later (the main file
  is the first of /etc, /run, /usr/local/lib, /usr/lib), kernel-command-line(7)
  (systemd.setenv=).
- CRI-O HEAD (f954a17e, 2026-08-21): contrib/systemd/crio.service, contrib/sysconfig/crio,
  internal/criocli/criocli.go (flags, aliases, EnvVars), cmd/crio/main.go (an argument that is
  no flag: "command %q not supported", CRI-O does not start), vendor/github.com/urfave/cli/v2
  (flag.go normalizeFlags: both forms of one flag fail; flag_string.go: EnvVars).
- cri-o/packaging (pkgs.k8s.io): templates/latest/cri-o/cri-o.spec (the deb and rpm install
  contrib/crio.service with /usr/local/bin made /usr/bin into /usr/lib/systemd/system, no
  /etc/sysconfig/crio, /etc/crio/crio.conf.d/10-crio.conf), templates/latest/cri-o/bundle/install
  and bundle/crio.service (the tarball: /usr/local/lib/systemd/system, or /etc/systemd/system
  on Fedora CoreOS and RHCOS; /etc/crio/crio.conf.d/10-crun.conf).

Only config.load and dry runs: nothing runs a plugin or needs root.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from cni_reaper.runtime.config import Runtime, RuntimeConfigs
from tests import runtime_layouts
from tests.crashed import by_path
from tests.nodetree import NodeTree
from tests.runtime_layouts import (
    CRIO_COMMAND as COMMAND,
)
from tests.runtime_layouts import (
    CRIO_DEFAULT_ROOT as DEFAULT_ROOT,
)
from tests.runtime_layouts import (
    CRIO_DROP_IN as DROP_IN,
)
from tests.runtime_layouts import (
    CRIO_PACKAGED_UNIT as PACKAGED,
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
from tests.runtime_layouts import (
    KNOWN,
    STALE,
    assert_reads_or_doubts,
    crio_knows,
    dry_run,
    earlier_boots_entry,
    in_doubt,
    roots,
    tree,
    write,
)

CRIO = Runtime.CRIO
ALIAS = "/etc/systemd/system/cri-o.service"
ALIAS_DROP_IN = "/etc/systemd/system/cri-o.service.d/override.conf"
DATA = "/data/crio"
OPTIONS = f"CRIO_STORAGE_OPTIONS=--root {DATA}\n"
# pkgs.k8s.io's /etc/crio/crio.conf.d/10-crio.conf (bundle/10-crio.conf), abridged.
PKGS_DROP_IN = (
    '[crio.runtime]\ndefault_runtime = "crun"\n\n[crio.runtime.runtimes.crun]\n'
    'runtime_path = "/usr/libexec/crio/crun"\nruntime_root = "/run/crun"\n'
)


def crio_node(tmp_path: Path, files: Mapping[str, str | bytes], *dirs: str) -> RuntimeConfigs:
    """A Fedora-packaged CRI-O node (runtime_layouts.crio_node) where /data/crio exists too."""
    return runtime_layouts.crio_node(tmp_path, files, DATA, *dirs)


def link(root: Path, node_path: str, target: str) -> None:
    path = root / node_path.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target)


def enabled_alias(tmp_path: Path) -> None:
    """`systemctl enable crio` links the packaged Alias=cri-o.service in /etc."""
    link(tmp_path, ALIAS, VENDOR_UNIT)


# --- 1. stock nodes: nothing moved, nothing doubted ---------------------------------------------


def test_fedora_rpm_enabled_with_its_stock_sysconfig(tmp_path: Path) -> None:
    """Fedora's cri-o RPM: the unit in /usr/lib/systemd/system, contrib/sysconfig/crio as
    /etc/sysconfig/crio, `systemctl enable crio` links cri-o.service (Alias=)."""
    enabled_alias(tmp_path)
    configs = crio_node(tmp_path, {SYSCONFIG: STOCK_SYSCONFIG})
    assert roots(configs, CRIO) == [DEFAULT_ROOT], configs.warnings
    assert not in_doubt(configs, CRIO), configs.warnings


def test_pkgs_k8s_io_package_without_sysconfig(tmp_path: Path) -> None:
    """cri-o/packaging's cri-o.spec (deb and rpm from pkgs.k8s.io): contrib/crio.service with
    /usr/bin/crio in /usr/lib/systemd/system, no /etc/sysconfig/crio, no crio.conf: only
    /etc/crio/crio.conf.d/10-crio.conf."""
    (tmp_path / DEFAULT_ROOT.lstrip("/")).mkdir(parents=True)
    configs = tree(
        tmp_path, {VENDOR_UNIT: PACKAGED, "/etc/crio/crio.conf.d/10-crio.conf": PKGS_DROP_IN}
    )
    assert roots(configs, CRIO) == [DEFAULT_ROOT], configs.warnings
    assert not in_doubt(configs, CRIO), configs.warnings


@pytest.mark.parametrize(
    "unit_dir",
    ["/usr/local/lib/systemd/system", "/etc/systemd/system"],
    ids=["usr-local", "coreos"],
)
def test_the_install_bundle(tmp_path: Path, unit_dir: str) -> None:
    """cri-o/packaging's bundle/install: /usr/local/bin/crio, the unit in
    $PREFIX/lib/systemd/system (/etc/systemd/system on Fedora CoreOS and RHCOS),
    /etc/crio/crio.conf.d/10-crun.conf, no sysconfig."""
    (tmp_path / DEFAULT_ROOT.lstrip("/")).mkdir(parents=True)
    unit = PACKAGED.replace("/usr/bin/crio", "/usr/local/bin/crio")
    files = {f"{unit_dir}/crio.service": unit, "/etc/crio/crio.conf.d/10-crun.conf": PKGS_DROP_IN}
    configs = tree(tmp_path, files)
    assert roots(configs, CRIO) == [DEFAULT_ROOT], configs.warnings
    assert not in_doubt(configs, CRIO), configs.warnings


def test_rhel_style_unit_with_one_environment_file_per_group(tmp_path: Path) -> None:
    """The unit before CRI-O's 2018 change (cce25da96f) and RHEL-derived ones: one optional
    EnvironmentFile= per group of options; absent files are skipped (systemd.exec(5), "-")."""
    unit = PACKAGED.replace(
        "EnvironmentFile=-/etc/sysconfig/crio\n",
        "EnvironmentFile=-/etc/sysconfig/crio\nEnvironmentFile=-/etc/sysconfig/crio-metrics\n"
        "EnvironmentFile=-/etc/sysconfig/crio-network\nEnvironmentFile=-/etc/sysconfig/crio-storage\n",
    )
    storage = "CRIO_STORAGE_OPTIONS=--root=/data/crio --runroot=/run/data-crio\n"
    configs = crio_node(tmp_path, {VENDOR_UNIT: unit, "/etc/sysconfig/crio-storage": storage})
    assert roots(configs, CRIO) == [DATA], configs.warnings
    assert not in_doubt(configs, CRIO), configs.warnings


def test_metrics_enabled_as_the_stock_sysconfig_suggests(tmp_path: Path) -> None:
    """contrib/sysconfig/crio's own example uncommented, with the root moved: the metrics flags
    come last on the command line, after --root."""
    sysconfig = STOCK_SYSCONFIG + 'CRIO_METRICS_OPTIONS="--enable-metrics"\n' + OPTIONS
    configs = crio_node(tmp_path, {SYSCONFIG: sysconfig})
    assert roots(configs, CRIO) == [DATA], configs.warnings
    assert not in_doubt(configs, CRIO), configs.warnings


def test_debug_logging_before_the_moved_root(tmp_path: Path) -> None:
    """$CRIO_RUNTIME_OPTIONS comes before $CRIO_STORAGE_OPTIONS in the packaged unit;
    `--log-level debug` (criocli.go: a StringFlag, alias -l) is a common thing to set there."""
    sysconfig = "CRIO_RUNTIME_OPTIONS=--log-level debug\n" + OPTIONS
    configs = crio_node(tmp_path, {SYSCONFIG: sysconfig})
    assert_reads_or_doubts(configs, CRIO, DATA)
    assert not in_doubt(configs, CRIO), configs.warnings


def test_openshift_node_ip_drop_in(tmp_path: Path) -> None:
    """OpenShift's nodeip-configuration writes crio.service.d/20-nodenet.conf with
    Environment="CONTAINER_STREAM_ADDRESS=<node IP>" (from memory of the MCO's templates; not
    read from source here)."""
    nodenet = '[Service]\nEnvironment="CONTAINER_STREAM_ADDRESS=10.0.0.5"\n'
    files = {
        SYSCONFIG: STOCK_SYSCONFIG,
        "/etc/systemd/system/crio.service.d/20-nodenet.conf": nodenet,
    }
    configs = crio_node(tmp_path, files)
    assert roots(configs, CRIO) == [DEFAULT_ROOT]
    assert not in_doubt(configs, CRIO), configs.warnings


def test_environment_quoted_inside_the_word(tmp_path: Path) -> None:
    """config_parse_environ (load-fragment.c): each word with EXTRACT_CUNESCAPE|EXTRACT_UNQUOTE,
    so `Environment=CRIO_STORAGE_OPTIONS="--root /data/crio"` sets `--root /data/crio`; a
    common way to write it in a drop-in."""
    drop_in = '[Service]\nEnvironment=CRIO_STORAGE_OPTIONS="--root /data/crio"\n'
    configs = crio_node(tmp_path, {DROP_IN: drop_in})
    assert_reads_or_doubts(configs, CRIO, DATA)
    assert not in_doubt(configs, CRIO), configs.warnings


# --- 2. environment files (env-file.c) ----------------------------------------------------------


def test_a_byte_order_mark_is_part_of_the_first_key(tmp_path: Path) -> None:
    """parse_env_file_internal (env-file.c) reads the file with read_full_stream and never
    drops a UTF-8 byte order mark: the first key is "\\ufeffCRIO_STORAGE_OPTIONS", which
    env_name_is_valid (env-util.c: only [A-Za-z0-9_]) rejects, and
    strv_env_clean_with_callback drops that assignment. $CRIO_STORAGE_OPTIONS stays unset:
    CRI-O keeps its default root. (A file saved by an editor that writes a BOM.)"""
    configs = crio_node(tmp_path, {SYSCONFIG: "\ufeff" + OPTIONS})
    assert_reads_or_doubts(configs, CRIO, DEFAULT_ROOT)


def test_a_byte_order_mark_before_a_comment_is_harmless(tmp_path: Path) -> None:
    """Same BOM, the file starting with a comment: the BOM makes "\\ufeff#..." a key that has
    no "=" (env-file.c's KEY state drops it at the newline); the next line is read as usual."""
    configs = crio_node(tmp_path, {SYSCONFIG: "\ufeff# options\n" + OPTIONS})
    assert_reads_or_doubts(configs, CRIO, DATA)


def test_invalid_utf8_drops_an_optional_file_whole(tmp_path: Path) -> None:
    """load_env_file_push fails on invalid UTF-8 in any key or value (check_utf8ness_and_warn),
    load_env_file fails, and exec_context_load_environment skips a "-" file whole: none of
    its assignments apply, the root stays the default."""
    data = OPTIONS.encode() + b"CRIO_METRICS_OPTIONS=--metrics-host caf\xe9\n"
    configs = crio_node(tmp_path, {SYSCONFIG: data})
    assert_reads_or_doubts(configs, CRIO, DEFAULT_ROOT)


def test_invalid_utf8_in_a_comment_only(tmp_path: Path) -> None:
    """Comments are never checked for UTF-8 (env-file.c's COMMENT state keeps nothing): the
    file loads, the root moves."""
    data = b"# maintained by Jos\xe9\n" + OPTIONS.encode()
    configs = crio_node(tmp_path, {SYSCONFIG: data})
    assert_reads_or_doubts(configs, CRIO, DATA)


ENV_FILE_FORMS: list[Any] = [
    # After a closing quote the state is PRE_VALUE: `"--root" /x` is "--root/x".
    pytest.param('CRIO_STORAGE_OPTIONS="--root" /data/crio\n', DEFAULT_ROOT, id="quote-then-more"),
    # Blanks before "=" end the key (last_key_whitespace): the key is CRIO_STORAGE_OPTIONS.
    pytest.param("CRIO_STORAGE_OPTIONS   =--root /data/crio\n", DATA, id="blank-before-equals"),
    # A "#" inside a value is kept: crio gets "#" and "note", arguments: it does not start.
    pytest.param("CRIO_STORAGE_OPTIONS=--root /data/crio # note\n", DATA, id="hash-in-value"),
    # Single quotes keep a backslash; no continuation.
    pytest.param("CRIO_STORAGE_OPTIONS='--root /data/crio'\n", DATA, id="single-quoted"),
    # CR is a newline too (NEWLINE "\n\r"): two assignments, the second wins.
    pytest.param(
        "CRIO_STORAGE_OPTIONS=--root /elsewhere\rCRIO_STORAGE_OPTIONS=--root /data/crio\r",
        DATA,
        id="cr-line-ends",
    ),
    # `export` makes the key "export CRIO_STORAGE_OPTIONS": not a valid name, dropped.
    pytest.param("export CRIO_STORAGE_OPTIONS=--root /data/crio\n", DEFAULT_ROOT, id="export"),
    # Tab-separated words: systemd splits a $VAR at WHITESPACE (" \t\n\r").
    pytest.param("CRIO_STORAGE_OPTIONS=--root\t/data/crio\n", DATA, id="tab"),
    # An empty assignment in a later line wins: no flags.
    pytest.param(OPTIONS + "CRIO_STORAGE_OPTIONS=\n", DEFAULT_ROOT, id="emptied-later"),
]


@pytest.mark.parametrize(("sysconfig", "real"), ENV_FILE_FORMS)
def test_environment_file_forms(tmp_path: Path, sysconfig: str, real: str) -> None:
    """env-file.c's parser on shapes an operator writes; real is the root CRI-O then uses."""
    configs = crio_node(tmp_path, {SYSCONFIG: sysconfig}, "/elsewhere")
    assert_reads_or_doubts(configs, CRIO, real)


# --- 3. which environment files systemd reads (load-fragment.c, execute.c) ----------------------


def test_an_environment_file_path_with_dot_dot_is_ignored(tmp_path: Path) -> None:
    """config_parse_unit_env_file runs path_simplify_and_warn(PATH_CHECK_ABSOLUTE), which
    rejects a path that is not normalized (a ".." in it: path_is_normalized): the setting is
    ignored, the file never read. The reaper cleans the path lexically and reads it."""
    drop_in = "[Service]\nEnvironmentFile=-/etc/sysconfig/../crio/crio.env\n"
    files = {SYSCONFIG: STOCK_SYSCONFIG, DROP_IN: drop_in, "/etc/crio/crio.env": OPTIONS}
    configs = crio_node(tmp_path, files)
    assert_reads_or_doubts(configs, CRIO, DEFAULT_ROOT)


def test_an_environment_file_path_with_double_slashes_is_simplified(tmp_path: Path) -> None:
    """path_simplify_and_warn collapses "//" and "/./": systemd reads /etc/crio/crio.env."""
    drop_in = "[Service]\nEnvironmentFile=-//etc/crio/./crio.env\n"
    files = {DROP_IN: drop_in, "/etc/crio/crio.env": OPTIONS}
    configs = crio_node(tmp_path, files)
    assert_reads_or_doubts(configs, CRIO, DATA)


def test_an_environment_file_named_by_its_unit_specifier(tmp_path: Path) -> None:
    """EnvironmentFile= takes specifiers (unit_full_printf): %N of crio.service is "crio"."""
    drop_in = "[Service]\nEnvironmentFile=-/etc/crio/%N.env\n"
    configs = crio_node(tmp_path, {DROP_IN: drop_in, "/etc/crio/crio.env": OPTIONS})
    assert_reads_or_doubts(configs, CRIO, DATA)


def test_an_environment_file_name_is_not_unescaped(tmp_path: Path) -> None:
    """config_parse_unit_env_file does no C unescaping: `cri\\x6f.env` is that literal name,
    absent and optional; /etc/crio/crio.env is not read."""
    drop_in = "[Service]\nEnvironmentFile=-/etc/crio/cri\\x6f.env\n"
    configs = crio_node(tmp_path, {DROP_IN: drop_in, "/etc/crio/crio.env": OPTIONS})
    assert_reads_or_doubts(configs, CRIO, DEFAULT_ROOT)


def test_an_environment_file_that_is_a_directory(tmp_path: Path) -> None:
    """A "-" file that cannot be loaded (EISDIR) is skipped: the default root."""
    (tmp_path / "etc/sysconfig/crio").mkdir(parents=True)
    configs = crio_node(tmp_path, {})
    assert_reads_or_doubts(configs, CRIO, DEFAULT_ROOT)


def test_an_environment_file_linked_to_another(tmp_path: Path) -> None:
    """systemd opens the file and follows its symlink: the options of its target."""
    link(tmp_path, SYSCONFIG, "/etc/crio/options.env")
    configs = crio_node(tmp_path, {"/etc/crio/options.env": OPTIONS})
    assert_reads_or_doubts(configs, CRIO, DATA)


# --- 4. Environment=, UnsetEnvironment=, PassEnvironment= (load-fragment.c) ---------------------


def test_unset_environment_unescapes_its_names(tmp_path: Path) -> None:
    """config_parse_unset_environ splits with EXTRACT_CUNESCAPE|EXTRACT_UNQUOTE: `\\x53` is
    "S", so this unsets CRIO_STORAGE_OPTIONS, applied before ExecStart= is expanded: CRI-O
    keeps its default root. The reaper looks for the name as written."""
    drop_in = "[Service]\nUnsetEnvironment=CRIO_STORAGE_OPTION\\x53\n"
    configs = crio_node(tmp_path, {SYSCONFIG: OPTIONS, DROP_IN: drop_in})
    assert_reads_or_doubts(configs, CRIO, DEFAULT_ROOT)


def test_unset_environment_quoted(tmp_path: Path) -> None:
    """Same, quoted (EXTRACT_UNQUOTE): the name is in the text, the reaper sees it."""
    drop_in = '[Service]\nUnsetEnvironment="CRIO_STORAGE_OPTIONS"\n'
    configs = crio_node(tmp_path, {SYSCONFIG: OPTIONS, DROP_IN: drop_in})
    assert_reads_or_doubts(configs, CRIO, DEFAULT_ROOT)


def test_pass_environment_of_a_container_variable(tmp_path: Path) -> None:
    """config_parse_pass_environ: PassEnvironment=CONTAINER_ROOT passes the manager's own
    CONTAINER_ROOT, which urfave/cli v2 reads for --root (criocli.go: EnvVars
    CONTAINER_ROOT; flag_string.go: Apply). The manager's environment is not on disk in any
    unit file (here: the kernel passes an unknown `NAME=value` argument to init's
    environment; that PID 1 keeps it for PassEnvironment= was not read from systemd's
    source). The reaper should doubt a PassEnvironment= of a CONTAINER_ variable."""
    drop_in = "[Service]\nPassEnvironment=CONTAINER_ROOT\n"
    files = {DROP_IN: drop_in, "/proc/cmdline": "root=/dev/vda1 CONTAINER_ROOT=/data/crio\n"}
    configs = crio_node(tmp_path, files)
    assert_reads_or_doubts(configs, CRIO, DATA)


def test_environment_reset_in_a_drop_in(tmp_path: Path) -> None:
    """An empty Environment= drops those before (config_parse_environ); the env file's value
    still applies (it overrides Environment= anyway)."""
    drop_in = '[Service]\nEnvironment=\nEnvironment="CRIO_STORAGE_OPTIONS=--root /elsewhere"\n'
    configs = crio_node(tmp_path, {SYSCONFIG: OPTIONS, DROP_IN: drop_in}, "/elsewhere")
    assert_reads_or_doubts(configs, CRIO, DATA)


def test_an_invalid_environment_word_is_ignored_alone(tmp_path: Path) -> None:
    """config_parse_environ ignores a word that is no valid assignment ("1X=y": a name must not
    start with a digit) and keeps the others of the line."""
    drop_in = '[Service]\nEnvironment="1X=y" "CRIO_STORAGE_OPTIONS=--root /data/crio"\n'
    configs = crio_node(tmp_path, {DROP_IN: drop_in})
    assert_reads_or_doubts(configs, CRIO, DATA)


# --- 5. the service manager's own environment ---------------------------------------------------


@pytest.mark.parametrize("main", ["/usr/lib/systemd/system.conf", "/run/systemd/system.conf"])
def test_default_environment_in_the_main_config_outside_etc(tmp_path: Path, main: str) -> None:
    """systemd-system.conf(5), v256 and later: the main file is the first of /etc/systemd/,
    /run/systemd/, /usr/local/lib/systemd/, /usr/lib/systemd/ (openSUSE ships it in /usr/lib).
    Its DefaultEnvironment= is every service's: $CRIO_STORAGE_OPTIONS there moves the root
    when /etc/systemd/system.conf does not exist."""
    conf = f"[Manager]\nDefaultEnvironment=CRIO_STORAGE_OPTIONS=--root={DATA}\n"
    configs = crio_node(tmp_path, {main: conf})
    assert_reads_or_doubts(configs, CRIO, DATA)


def test_default_environment_in_a_system_conf_drop_in(tmp_path: Path) -> None:
    """system.conf.d/*.conf: the same DefaultEnvironment=, read."""
    conf = f"[Manager]\nDefaultEnvironment=CRIO_STORAGE_OPTIONS=--root={DATA}\n"
    configs = crio_node(tmp_path, {"/usr/lib/systemd/system.conf.d/50-crio.conf": conf})
    assert_reads_or_doubts(configs, CRIO, DATA)


def test_default_environment_from_the_kernel_command_line(tmp_path: Path) -> None:
    """kernel-command-line(7): systemd.setenv=NAME=value sets a default environment variable
    for the processes PID 1 forks, as DefaultEnvironment= does. The reaper reads /proc under
    its root for other things; it does not read /proc/cmdline for this."""
    cmdline = (
        f"BOOT_IMAGE=/vmlinuz root=/dev/vda1 systemd.setenv=CRIO_STORAGE_OPTIONS=--root={DATA}\n"
    )
    configs = crio_node(tmp_path, {"/proc/cmdline": cmdline})
    assert_reads_or_doubts(configs, CRIO, DATA)


# --- 6. ExecStart= (systemd.service(5), replace_env_argv) ---------------------------------------


def test_the_colon_prefix_turns_expansion_off(tmp_path: Path) -> None:
    """systemd.service(5): with ":" before the path, environment variable substitution is not
    applied: crio gets the literal word "$CRIO_CONFIG_OPTIONS", which is no flag, and
    cmd/crio/main.go fails ("command %q not supported"): CRI-O does not start with /data/crio
    at all. The reaper expands anyway and follows it; by its own rule for a command line
    CRI-O does not start with (both forms of a flag), that is doubt."""
    unit = PACKAGED.replace("ExecStart=/usr/bin/crio", "ExecStart=:/usr/bin/crio")
    configs = crio_node(tmp_path, {VENDOR_UNIT: unit, SYSCONFIG: OPTIONS})
    assert in_doubt(configs, CRIO) or roots(configs, CRIO) == [DEFAULT_ROOT], (
        roots(configs, CRIO),
        configs.warnings,
    )


def test_a_variable_as_the_executable(tmp_path: Path) -> None:
    """The executable may not be a variable (systemd.service(5) "Command lines"; systemd issue
    #1274: the service does not start): `ExecStart=$CRIO_CONFIG_OPTIONS` never runs
    `/usr/bin/crio --root /data/crio`."""
    unit = PACKAGED.replace(
        COMMAND.format(crio="/usr/bin/crio"), "ExecStart=$CRIO_CONFIG_OPTIONS\n"
    )
    sysconfig = f"CRIO_CONFIG_OPTIONS=/usr/bin/crio --root {DATA}\n"
    configs = crio_node(tmp_path, {VENDOR_UNIT: unit, SYSCONFIG: sysconfig})
    assert in_doubt(configs, CRIO) or roots(configs, CRIO) == [DEFAULT_ROOT], (
        roots(configs, CRIO),
        configs.warnings,
    )


EXPANDED: list[Any] = [
    # One flag split over two variables: replace_env_argv splices the words in order.
    pytest.param(
        {"CRIO_STORAGE_OPTIONS": "--root", "CRIO_NETWORK_OPTIONS": DATA}, DATA, id="split"
    ),
    # Go's flag package: one dash or two, "=" or the next word; the last one wins.
    pytest.param({"CRIO_STORAGE_OPTIONS": f"-root={DATA}"}, DATA, id="one-dash"),
    pytest.param({"CRIO_STORAGE_OPTIONS": f"--r {DATA}"}, DATA, id="short-two-dashes"),
    pytest.param({"CRIO_STORAGE_OPTIONS": f"--root /elsewhere -r={DATA}"}, DATA, id="both-forms"),
    pytest.param(
        {"CRIO_CONFIG_OPTIONS": "--root /elsewhere", "CRIO_STORAGE_OPTIONS": f"--root {DATA}"},
        DATA,
        id="last-wins",
    ),
    # A trailing slash: the same directory.
    pytest.param({"CRIO_STORAGE_OPTIONS": f"--root {DATA}/"}, DATA, id="trailing-slash"),
    # --storage-driver (-s) moves containers.json to <root>/<driver>-containers.
    pytest.param({"CRIO_STORAGE_OPTIONS": f"--root {DATA} -s vfs"}, DATA, id="driver"),
    # A bool flag (urfave BoolFlag: never takes the next word) before --root.
    pytest.param(
        {"CRIO_RUNTIME_OPTIONS": "--selinux", "CRIO_STORAGE_OPTIONS": f"--root {DATA}"},
        DATA,
        id="bool-before",
    ),
    # "--" ends the flags: `--root /data/crio` are arguments, crio does not start.
    pytest.param({"CRIO_RUNTIME_OPTIONS": "--", "CRIO_STORAGE_OPTIONS": f"--root {DATA}"}, DATA),
    # urfave/cli's help flag: crio prints and exits.
    pytest.param({"CRIO_STORAGE_OPTIONS": f"--root {DATA}", "CRIO_METRICS_OPTIONS": "-h"}, DATA),
    # --config moves crio.conf, whose root may differ (doubted flag).
    pytest.param({"CRIO_CONFIG_OPTIONS": "-c /etc/crio/other.conf"}, DATA, id="config"),
    # --imagestore (criocli.go) keeps images elsewhere; containers stay under --root.
    pytest.param({"CRIO_STORAGE_OPTIONS": f"--imagestore /images --root {DATA}"}, DATA),
]


@pytest.mark.parametrize(("assigned", "real"), EXPANDED)
def test_expanded_command_lines(tmp_path: Path, assigned: dict[str, str], real: str) -> None:
    """The sysconfig's options, spliced in as replace_env_argv does (split at whitespace, no
    word for an empty or unset one), then parsed as urfave/cli v2 (Go's flag package) does."""
    sysconfig = "".join(f"{name}={value}\n" for name, value in assigned.items())
    configs = crio_node(tmp_path, {SYSCONFIG: sysconfig, "/etc/crio/other.conf": ""}, "/elsewhere")
    assert_reads_or_doubts(configs, CRIO, real)


def test_a_root_that_is_a_symlink(tmp_path: Path) -> None:
    """--root /data/crio, a link to the disk's mount point: CRI-O opens it through the link."""
    (tmp_path / "mnt/disk/crio/overlay-containers").mkdir(parents=True)
    link(tmp_path, "/srv/crio", "/mnt/disk/crio")
    configs = crio_node(tmp_path, {SYSCONFIG: "CRIO_STORAGE_OPTIONS=--root /srv/crio\n"})
    assert_reads_or_doubts(configs, CRIO, "/srv/crio")


# --- 7. other names of the unit (unit-file.c's name map; systemd.unit(5) Alias=) ---------------


ALIAS_DROP_INS: list[Any] = [
    pytest.param(f'[Service]\nEnvironment="CRIO_STORAGE_OPTIONS=--root {DATA}"\n', id="env"),
    pytest.param(
        f"[Service]\nExecStart=\nExecStart=/usr/bin/crio --root {DATA}\n", id="exec-start"
    ),
    pytest.param("[Service]\nEnvironmentFile=/etc/crio/crio.env\n", id="env-file"),
    pytest.param(f'[Service]\nEnvironment="CONTAINER_ROOT={DATA}"\n', id="container-root"),
]


@pytest.mark.parametrize("drop_in", ALIAS_DROP_INS)
def test_a_drop_in_of_the_enabled_alias_alone(tmp_path: Path, drop_in: str) -> None:
    """Once enabled, cri-o.service (the packaged Alias=) links to crio.service, and systemd
    reads the drop-ins of every name of a unit: cri-o.service.d/*.conf applies to crio.service
    (systemd.unit(5), "Along with a unit file foo.service, ... the drop-in directories of its
    aliases"). Here the only change is there (`systemctl edit cri-o`, or by hand): the sysconfig
    is stock, so the unit's command line alone sets no flag."""
    enabled_alias(tmp_path)
    files = {SYSCONFIG: STOCK_SYSCONFIG, ALIAS_DROP_IN: drop_in, "/etc/crio/crio.env": OPTIONS}
    configs = crio_node(tmp_path, files)
    assert_reads_or_doubts(configs, CRIO, DATA)


def test_a_drop_in_of_the_alias_over_options_in_sysconfig(tmp_path: Path) -> None:
    """The same alias drop-in, sysconfig moving the root too: already doubted."""
    enabled_alias(tmp_path)
    drop_in = "[Service]\nUnsetEnvironment=CRIO_STORAGE_OPTIONS\n"
    configs = crio_node(tmp_path, {SYSCONFIG: OPTIONS, ALIAS_DROP_IN: drop_in})
    assert_reads_or_doubts(configs, CRIO, DEFAULT_ROOT)


def test_a_dash_prefix_drop_in_of_the_alias(tmp_path: Path) -> None:
    """cri-.service.d is a drop-in dir of cri-o.service (its dash prefix), not of crio.service."""
    enabled_alias(tmp_path)
    drop_in = "[Service]\nUnsetEnvironment=CRIO_STORAGE_OPTIONS\n"
    files = {SYSCONFIG: OPTIONS, "/etc/systemd/system/cri-.service.d/10.conf": drop_in}
    configs = crio_node(tmp_path, files)
    assert_reads_or_doubts(configs, CRIO, DEFAULT_ROOT)


def test_a_unit_copied_to_etc_wins(tmp_path: Path) -> None:
    """A unit in /etc/systemd/system hides the vendor one (the unit search path's order)."""
    own = PACKAGED.replace(COMMAND.format(crio="/usr/bin/crio"), "ExecStart=/usr/bin/crio\n")
    files = {SYSCONFIG: OPTIONS, "/etc/systemd/system/crio.service": own}
    configs = crio_node(tmp_path, files)
    assert_reads_or_doubts(configs, CRIO, DEFAULT_ROOT)


# --- 8. odd inputs: no exception, and safe ------------------------------------------------------

ODD: list[Any] = [
    pytest.param({DROP_IN: "[Service]\nEnvironmentFile=-\n"}, id="lone-dash"),
    pytest.param({DROP_IN: "[Service]\nEnvironmentFile=--/etc/sysconfig/crio\n"}, id="two-dashes"),
    pytest.param({VENDOR_UNIT: PACKAGED.replace("$CRIO_CONFIG_OPTIONS", "$")}, id="lone-dollar"),
    pytest.param({VENDOR_UNIT: PACKAGED.replace("$CRIO_CONFIG_OPTIONS", "$$")}, id="dollars"),
    pytest.param({DROP_IN: '[Service]\nEnvironment="CRIO_STORAGE_OPTIONS=--root /x\n'}, id="quote"),
    pytest.param({DROP_IN: "[Service]\nEnvironment=CRIO_STORAGE_OPTIONS\n"}, id="no-equals"),
    pytest.param({SYSCONFIG: "CRIO_STORAGE_OPTIONS\n=--root /data/crio\n"}, id="split-key"),
    pytest.param({SYSCONFIG: "=--root /data/crio\n"}, id="no-key"),
    pytest.param({VENDOR_UNIT: PACKAGED.replace("/usr/bin/crio", "-")}, id="only-a-prefix"),
    pytest.param({DROP_IN: "[Service]\nEnvironmentFile=/etc/sysconfig/crio/\n"}, id="slash"),
]


@pytest.mark.parametrize("files", ODD)
def test_odd_inputs_neither_crash_nor_mislead(tmp_path: Path, files: dict[str, str]) -> None:
    """Whatever CRI-O then does (here it keeps its default root, or does not start), the
    reaper reads that root or doubts; config.load raises nothing."""
    configs = crio_node(tmp_path, {SYSCONFIG: STOCK_SYSCONFIG, **files})
    assert_reads_or_doubts(configs, CRIO, DEFAULT_ROOT)


def test_a_long_value(tmp_path: Path) -> None:
    """360 KB of `--root /data/crio`: under ARG_MAX (env_value_is_valid), each word short:
    the last one wins, CRI-O uses /data/crio."""
    sysconfig = "CRIO_STORAGE_OPTIONS=" + "--root /data/crio " * 20000 + "\n"
    configs = crio_node(tmp_path, {SYSCONFIG: sysconfig})
    assert_reads_or_doubts(configs, CRIO, DATA)


def test_an_environment_file_that_loops(tmp_path: Path) -> None:
    """A link to itself: open fails (ELOOP), a "-" file is skipped by systemd."""
    link(tmp_path, SYSCONFIG, SYSCONFIG)
    configs = crio_node(tmp_path, {})
    assert_reads_or_doubts(configs, CRIO, DEFAULT_ROOT)


# --- 9. what a hole does: a sandbox CRI-O knows planned for DEL ---------------------------------


@pytest.mark.parametrize(
    "moved",
    [
        pytest.param(
            {ALIAS_DROP_IN: f'[Service]\nEnvironment="CRIO_STORAGE_OPTIONS=--root {DATA}"\n'}
        ),
        pytest.param(
            {
                "/usr/lib/systemd/system.conf": f"[Manager]\nDefaultEnvironment="
                f"CRIO_STORAGE_OPTIONS=--root={DATA}\n"
            }
        ),
    ],
    ids=["alias-drop-in", "vendor-system-conf"],
)
def test_a_sandbox_crio_knows_is_never_planned_for_del(
    node: NodeTree, t0: float, moved: dict[str, str]
) -> None:
    """CRI-O keeps its records under /data/crio (the move above); the default graph root still
    holds records of an earlier CRI-O there, which do not know the sandbox. Reading only the
    default root, the reaper would call the sandbox forgotten and DEL it under CRI-O."""
    name = earlier_boots_entry(node, t0, KNOWN)
    files = {VENDOR_UNIT: PACKAGED, SYSCONFIG: STOCK_SYSCONFIG, "/etc/crio/crio.conf": "", **moved}
    for node_path, data in files.items():
        write(node.root, node_path, data)
    link(node.root, ALIAS, VENDOR_UNIT)
    crio_knows(node.root, DATA, KNOWN)
    crio_knows(node.root, DEFAULT_ROOT, STALE)

    report = dry_run(node, t0)

    entry = by_path(report)[name]
    assert entry["action"] == "keep", (entry["reason"], report["runtime_records"])
