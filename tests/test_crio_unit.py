"""CRI-O's unit: its packaged crio.service expands $CRIO_*_OPTIONS from /etc/sysconfig/crio.
The flags that move its records (--root, --runroot, --listen) are followed where the unit, its
environment and its environment files are plain; anything else that may move what the reaper
reads of CRI-O puts its records in doubt, so no sandbox is called forgotten."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cni_reaper.runtime import config
from cni_reaper.runtime.config import LocatedPath, PathKind, Runtime, RuntimeConfigs
from cni_reaper.runtime.units import _NotPlain, environment_file
from tests.crashed import by_path
from tests.nodetree import NodeTree
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
    CRIO_UNIT as UNIT,
)
from tests.runtime_layouts import (
    KNOWN,
    STALE,
    crio_knows,
    crio_node,
    dry_run,
    earlier_boots_entry,
    in_doubt,
    roots,
    tree,
    write,
)

CRIO = Runtime.CRIO


def in_effect(configs: RuntimeConfigs, kind: PathKind) -> list[LocatedPath]:
    return [
        p
        for p in (*configs.sockets, *configs.live_state_dirs, *configs.persistent_roots)
        if p.runtime is CRIO and p.kind is kind and p.in_effect
    ]


def test_the_packaged_unit_with_its_stock_options_changes_nothing(tmp_path: Path) -> None:
    configs = crio_node(tmp_path, {SYSCONFIG: STOCK_SYSCONFIG})
    assert roots(configs, CRIO) == [DEFAULT_ROOT]
    assert not in_doubt(configs, CRIO), configs.warnings
    assert configs.records_in_doubt == ()


def test_the_options_in_sysconfig_move_root_run_root_and_socket(tmp_path: Path) -> None:
    options = (
        'CRIO_STORAGE_OPTIONS="--root /data/crio --runroot=/run/data-crio"\n'
        "CRIO_NETWORK_OPTIONS='--listen /run/c/crio.sock'\n"
        "CRIO_METRICS_OPTIONS=--enable-metrics --metrics-port 9537\n"
    )
    configs = crio_node(tmp_path, {SYSCONFIG: STOCK_SYSCONFIG + options}, "/data/crio")
    assert not in_doubt(configs, CRIO), configs.warnings
    assert roots(configs, CRIO) == ["/data/crio"]
    (root,) = in_effect(configs, PathKind.PERSISTENT_ROOT)
    assert root.source.startswith(str(tmp_path / UNIT.lstrip("/"))), root.source
    assert [p.node_path for p in in_effect(configs, PathKind.STORAGE_RUNROOT)] == ["/run/data-crio"]
    assert [p.node_path for p in in_effect(configs, PathKind.SOCKET)] == ["/run/c/crio.sock"]
    # The defaults are still watched: a CRI-O started otherwise stops a DEL there too.
    watched = [p.node_path for p in configs.sockets if p.runtime is CRIO]
    assert "/run/crio/crio.sock" in watched


def test_the_flag_wins_over_the_config(tmp_path: Path) -> None:
    files = {
        "/etc/crio/crio.conf.d/10-root.conf": "[crio]\nroot = '/srv/crio'\n",
        SYSCONFIG: "CRIO_STORAGE_OPTIONS=-r /data/crio\n",
    }
    configs = crio_node(tmp_path, files, "/data/crio")
    assert roots(configs, CRIO) == ["/data/crio"]
    watched = [p for p in configs.persistent_roots if p.runtime is CRIO and not p.in_effect]
    assert {p.node_path for p in watched} == {"/srv/crio", DEFAULT_ROOT}
    assert any("the unit's flag wins" in p.source for p in watched)


def test_environment_files_override_environment_and_a_later_file_wins(tmp_path: Path) -> None:
    files = {
        DROP_IN: '[Service]\nEnvironment="CRIO_STORAGE_OPTIONS=--root /from-environment"\n'
        "EnvironmentFile=/etc/crio/more.env\n",
        SYSCONFIG: "CRIO_STORAGE_OPTIONS=--root /from-sysconfig\n",
        "/etc/crio/more.env": "CRIO_STORAGE_OPTIONS=--root /from-more\n",
    }
    configs = crio_node(tmp_path, files, "/from-more")
    assert roots(configs, CRIO) == ["/from-more"], configs.warnings


def test_crios_own_flags_before_the_root_are_skipped_as_its_parser_does(tmp_path: Path) -> None:
    """--selinux takes no value, --log-level and -s take the next word (criocli.go)."""
    options = (
        "CRIO_RUNTIME_OPTIONS=--selinux --log-level debug -s overlay --enable-metrics\n"
        "CRIO_STORAGE_OPTIONS=--root /data/crio\n"
    )
    configs = crio_node(tmp_path, {SYSCONFIG: options}, "/data/crio")
    assert roots(configs, CRIO) == ["/data/crio"] and not in_doubt(configs, CRIO), configs.warnings


def test_environment_alone_is_followed(tmp_path: Path) -> None:
    files = {DROP_IN: '[Service]\nEnvironment="CRIO_STORAGE_OPTIONS=--root /data/crio" A=b\n'}
    configs = crio_node(tmp_path, files, "/data/crio")
    assert roots(configs, CRIO) == ["/data/crio"], configs.warnings


def test_an_empty_environment_file_setting_drops_the_files_before(tmp_path: Path) -> None:
    """systemd.exec(5): an empty EnvironmentFile= resets the list; sysconfig is not read."""
    files = {
        DROP_IN: "[Service]\nEnvironmentFile=\n",
        SYSCONFIG: "CRIO_STORAGE_OPTIONS=--root /data/crio\n",
    }
    configs = crio_node(tmp_path, files, "/data/crio")
    assert roots(configs, CRIO) == [DEFAULT_ROOT], configs.warnings


DOUBTED: list[Any] = [
    # systemd reads a backslash at a line's end as a continuation, in a comment too: the
    # second line is part of the first, and --root is not passed.
    pytest.param({SYSCONFIG: "# a note \\\nCRIO_STORAGE_OPTIONS=--root /data/crio\n"}, id="cont"),
    pytest.param({SYSCONFIG: "CRIO_STORAGE_OPTIONS = --root /data/crio\n"}, id="blanks-in-key"),
    pytest.param({SYSCONFIG: "export CRIO_STORAGE_OPTIONS=--root /data/crio\n"}, id="export"),
    pytest.param({SYSCONFIG: "CRIO_STORAGE_OPTIONS=\"--root\" '/data/crio'\n"}, id="quotes"),
    pytest.param({SYSCONFIG: "CRIO_STORAGE_OPTIONS=--root $ROOT\n"}, id="dollar-in-value"),
    pytest.param({SYSCONFIG: 'CRIO_STORAGE_OPTIONS="--root\n/data/crio"\n'}, id="multi-line"),
    pytest.param({SYSCONFIG: "CONTAINER_ROOT=/data/crio\n"}, id="urfave-env-var"),
    pytest.param({SYSCONFIG: "CRIO_CONFIG_OPTIONS=--config /etc/crio/node.conf\n"}, id="config"),
    pytest.param({SYSCONFIG: "CRIO_CONFIG_OPTIONS=-d /etc/crio/more.d\n"}, id="config-dir"),
    # A flag whose type the reaper does not know (--imagestore takes a value), and one that
    # takes --root as its value, before it.
    pytest.param({SYSCONFIG: "CRIO_RUNTIME_OPTIONS=--imagestore /i\nCRIO_STORAGE_OPTIONS=-r /x\n"}),
    pytest.param({SYSCONFIG: "CRIO_RUNTIME_OPTIONS=--log-level\nCRIO_STORAGE_OPTIONS=-r /x\n"}),
    pytest.param({SYSCONFIG: "CRIO_STORAGE_OPTIONS=--root data/crio\n"}, id="relative"),
    pytest.param({SYSCONFIG: "CRIO_STORAGE_OPTIONS=--root /a --r /b\n"}, id="both-forms"),
    pytest.param({SYSCONFIG: "CRIO_NETWORK_OPTIONS=--namespaces-dir /srv/ns\n"}, id="ns-dir"),
    pytest.param({SYSCONFIG: "CRIO_RUNTIME_OPTIONS=--internal-wipe=false\n"}, id="wipe"),
    pytest.param({SYSCONFIG: "CRIO_STORAGE_OPTIONS=--root /missing\n"}, id="root-missing"),
    pytest.param({DROP_IN: "[Service]\nEnvironment=CRIO_STORAGE_OPTIONS=--root\\x20/x\n"}),
    pytest.param({DROP_IN: "[Service]\nEnvironment=CRIO_STORAGE_OPTIONS=--root /x\n"}),
    pytest.param({DROP_IN: "[Service]\nUnsetEnvironment=CRIO_STORAGE_OPTIONS\n"}, id="unset"),
    pytest.param({DROP_IN: "[Service]\nPassEnvironment=CRIO_STORAGE_OPTIONS\n"}, id="pass"),
    pytest.param({DROP_IN: "[Service]\nEnvironmentFile=/etc/crio/absent.env\n"}, id="no-file"),
    pytest.param({DROP_IN: "[Service]\nEnvironmentFile=-/etc/crio/*.env\n"}, id="glob"),
    pytest.param(
        {"/etc/systemd/system.conf": "[Manager]\nDefaultEnvironment=CRIO_STORAGE_OPTIONS=-r/x\n"},
        id="default-environment",
    ),
    pytest.param(
        {UNIT: PACKAGED.replace("$CRIO_STORAGE_OPTIONS", "${CRIO_STORAGE_OPTIONS}")}, id="braces"
    ),
    pytest.param({UNIT: PACKAGED.replace("$CRIO_STORAGE_OPTIONS", "$STORAGE")}, id="other-var"),
    pytest.param(
        {UNIT: PACKAGED.replace("$CRIO_STORAGE_OPTIONS", '"$CRIO_STORAGE_OPTIONS"')}, id="quoted"
    ),
    pytest.param({UNIT: PACKAGED.replace("crio \\", "crio --root=$CRIO_ROOT \\")}, id="in-word"),
    pytest.param({UNIT: PACKAGED.replace("\n          $CRIO_CONFIG_OPTIONS", " wipe")}, id="sub"),
]


@pytest.mark.parametrize("files", DOUBTED)
def test_what_may_be_read_otherwise_is_doubt(tmp_path: Path, files: dict[str, str]) -> None:
    files = {SYSCONFIG: "CRIO_STORAGE_OPTIONS=--root /data/crio\n", **files}
    configs = crio_node(tmp_path, files, "/data/crio", "/x", "/a")
    assert in_doubt(configs, CRIO), (roots(configs, CRIO), configs.warnings)
    # The warning says why: a unit's setting not followed, or a root not there.
    said = ("which the reaper does not follow", "not mounted yet")
    assert any(why in w for w in configs.warnings for why in said), configs.warnings


def test_an_alias_with_drop_ins_of_its_own_is_doubt(tmp_path: Path) -> None:
    """The packaged Alias=cri-o.service, enabled: a link without drop-ins adds nothing, but
    cri-o.service.d's drop-ins are read by systemd for crio.service too."""
    files = {SYSCONFIG: "CRIO_STORAGE_OPTIONS=--root /data/crio\n"}
    configs = crio_node(tmp_path, files, "/data/crio")
    alias = tmp_path / "etc/systemd/system/cri-o.service"
    alias.parent.mkdir(parents=True)
    alias.symlink_to(UNIT)
    configs = config.load(str(tmp_path))
    assert roots(configs, CRIO) == ["/data/crio"] and not in_doubt(configs, CRIO)
    write(tmp_path, "/etc/systemd/system/cri-o.service.d/10-root.conf", "[Service]\n")
    configs = config.load(str(tmp_path))
    assert in_doubt(configs, CRIO), configs.warnings
    assert any("drop-ins of cri-o.service" in w for w in configs.warnings), configs.warnings


@pytest.mark.parametrize(
    ("text", "assignments"),
    [
        ("A=1\n# B=2\n ; C=3\n\n", [("A", "1")]),
        ("A=\"x y\"\nB='z'\nC=  w v  \n", [("A", "x y"), ("B", "z"), ("C", "w v")]),
        ("A=1\r\nA=2\r\n", [("A", "1"), ("A", "2")]),
        ("A=\n", [("A", "")]),
    ],
)
def test_a_plain_environment_file(text: str, assignments: list[tuple[str, str]]) -> None:
    assert environment_file(text) == assignments


@pytest.mark.parametrize(
    "text",
    ["A=\\\n", "A=1 # note\n", "A='x\n", "A=x'y'\n", "1A=x\n", "A\n", "A=\x00\n", "\ufeffA=1\n"],
)
def test_an_environment_file_read_otherwise_is_not_plain(text: str) -> None:
    with pytest.raises(_NotPlain):
        environment_file(text)


def test_a_sandbox_crio_knows_under_its_moved_root_is_never_planned_for_del(
    node: NodeTree, t0: float
) -> None:
    """The default graph root holds records from before the move, which do not know the
    sandbox; the root the packaged unit's options name does."""
    name = earlier_boots_entry(node, t0, KNOWN)
    options = "CRIO_STORAGE_OPTIONS='--root /data/crio'\n"
    for node_path, data in {UNIT: PACKAGED, SYSCONFIG: options, "/etc/crio/crio.conf": ""}.items():
        write(node.root, node_path, data)
    crio_knows(node.root, "/data/crio", KNOWN)
    crio_knows(node.root, DEFAULT_ROOT, STALE)

    report = dry_run(node, t0)

    entry = by_path(report)[name]
    assert entry["action"] == "keep", (entry["reason"], report["runtime_records"])
    assert any("/data/crio" in line and "1 sandbox" in line for line in report["runtime_records"])


def test_environment_generators_that_do_not_name_the_options_change_nothing(
    tmp_path: Path,
) -> None:
    """Ubuntu's snapd ships a compiled environment generator, Fedora's flatpak a script: read
    as bytes, neither names CRI-O's variables, and the moved root is followed."""
    generators = "/usr/lib/systemd/system-environment-generators"
    files = {
        f"{generators}/snapd-env-generator": "\x7fELF\x02\x01\x01\x00PATH=/snap/bin\xff\x00",
        f"{generators}/60-flatpak-system-only": "#!/bin/sh\necho XDG_DATA_DIRS=/var/lib/flatpak\n",
        SYSCONFIG: "CRIO_STORAGE_OPTIONS=--root /data/crio\n",
    }
    configs = crio_node(tmp_path, files, "/data/crio")
    assert roots(configs, CRIO) == ["/data/crio"] and not in_doubt(configs, CRIO), configs.warnings


def test_an_installed_crio_never_started_puts_nothing_in_doubt(tmp_path: Path) -> None:
    """An image with both runtimes, containerd's in use: CRI-O's packaged unit and config are
    there, but neither its graph root nor its clean-shutdown file's dir, which it makes at
    every start. Its root not being there says it never ran, not that a volume is missing."""
    configs = tree(tmp_path, {"/etc/crio/crio.conf": "[crio]\n", UNIT: PACKAGED})
    assert configs.records_in_doubt == (), configs.warnings
    # Once it has run, a root not there is one not mounted yet.
    (tmp_path / "var/lib/crio").mkdir(parents=True)
    assert in_doubt(config.load(str(tmp_path)), CRIO)
