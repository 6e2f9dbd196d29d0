"""Attacks on the data dir the reaper reads from k3s's and RKE2's config.yaml and config.yaml.d.

Each test asserts the safe behaviour: the reaper reads the data dir k3s would use, or says its
records are in doubt (then no sandbox is called forgotten). What k3s would use was worked out
from k3s's pkg/configfilearg (readConfigFile: each key and value through wrangler's
convert.ToString, which is strings.TrimSpace(fmt.Sprint(v)); a key becomes `--key=value`;
stripInvalidFlags keeps what `^-+([^=]*)=` names as a known flag), go-yaml v2.4.0 (k3s's
go.mod), Go's flag package (the first "=" splits name and value) and urfave/cli's
normalizeFlags (v1.22 and v2.27: two forms of one flag set is an error), and checked by
running those with go-yaml v2.4.0 over the same files.

Only dry runs here: nothing runs a plugin, nothing needs root or a namespace.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from cni_reaper.runtime import config, inventory
from cni_reaper.runtime.config import PathKind, Runtime, RuntimeConfigs
from cni_reaper.runtime.plain_yaml import Unreadable, settings
from tests.crashed import by_path
from tests.nodetree import CONTAINER_IDS, NodeTree
from tests.runtime_layouts import dry_run, earlier_boots_entry, in_doubt, knows, write

K3S_CONFIG = "/etc/rancher/k3s/config.yaml"
K3S_DEFAULT = "/var/lib/rancher/k3s"
KNOWN, STALE, OTHER = CONTAINER_IDS[0], CONTAINER_IDS[5], CONTAINER_IDS[6]


def write_k3s_config(root: Path, files: dict[str, str | bytes]) -> None:
    """files by name under /etc/rancher/k3s: config.yaml, config.yaml.d/<name>."""
    for name, data in files.items():
        write(root, f"/etc/rancher/k3s/{name}", data)


def k3s_roots_in_effect(configs: RuntimeConfigs, runtime: Runtime = Runtime.K3S) -> list[str]:
    return [
        p.node_path
        for p in configs.persistent_roots
        if p.runtime is runtime and p.kind is PathKind.PERSISTENT_ROOT and p.in_effect
    ]


def assert_reads_or_doubts(configs: RuntimeConfigs, data_dir: str) -> None:
    """Safe: the records read are where k3s keeps them, or they are in doubt."""
    if in_doubt(configs):
        return
    assert k3s_roots_in_effect(configs) == [f"{data_dir}/agent/containerd"], configs.warnings


# --- 1. k3s trims what the reader keeps, and takes a flag name from before the first "=" ------

# Each: the files, and the data dir k3s starts with (checked with go-yaml v2.4.0 and k3s's code).
TRIMMED_OR_SPLIT: list[tuple[dict[str, str | bytes], str]] = [
    # convert.ToString trims the key: a quoted key with a blank is the flag all the same.
    ({"config.yaml": '"data-dir ": /srv/k3s\n'}, "/srv/k3s"),
    ({"config.yaml": "' d': /srv/k3s\n"}, "/srv/k3s"),
    ({"config.yaml": '"data-dir+ ": /srv/k3s\n'}, "/srv/k3s"),
    # ... and Unicode blanks, which YAML takes into a plain key: invisible in an editor.
    ({"config.yaml": "data-dir\u00a0: /srv/k3s\n"}, "/srv/k3s"),
    ({"config.yaml": "\u3000d: /srv/k3s\n"}, "/srv/k3s"),
    # It trims the value too: the reader keeps the blank, and reads another dir.
    ({"config.yaml": 'data-dir: "/srv/k3s "\n'}, "/srv/k3s"),
    ({"config.yaml": "data-dir: '/srv/k3s\t'\n"}, "/srv/k3s"),
    ({"config.yaml": "data-dir: /srv/k3s\u00a0\n"}, "/srv/k3s"),
    # A later drop-in's trimmed key wins over the config.yaml the reader believes.
    (
        {"config.yaml": "data-dir: /srv/k3s\n", "config.yaml.d/50.yaml": '"data-dir ": /srv/b\n'},
        "/srv/b",
    ),
    # `--data-dir=/srv=k3s`: stripInvalidFlags and Go's flag package take the name before the
    # first "=", and the rest, the value included, as the data dir.
    ({"config.yaml": "data-dir=/srv: k3s\n"}, "/srv=k3s"),
    ({"config.yaml": "d=/srv/k3s: ''\n"}, "/srv/k3s="),
]


TRIMMED_IDS = [
    "quoted-key-trailing-blank",
    "single-quoted-key-leading-blank",
    "quoted-append-key-trailing-blank",
    "plain-key-nbsp",
    "plain-key-ideographic-space",
    "double-quoted-value-trailing-blank",
    "single-quoted-value-trailing-tab",
    "plain-value-trailing-nbsp",
    "drop-in-trimmed-key-over-config-yaml",
    "key-with-equals",
    "short-key-with-equals",
]


@pytest.mark.parametrize(("files", "data_dir"), TRIMMED_OR_SPLIT, ids=TRIMMED_IDS)
def test_a_key_or_value_k3s_trims_or_splits_is_read_as_k3s_reads_it_or_doubted(
    tmp_path: Path, files: dict[str, str | bytes], data_dir: str
) -> None:
    write_k3s_config(tmp_path, files)
    configs = config.load(str(tmp_path))
    assert_reads_or_doubts(configs, data_dir)


def test_rke2_reads_its_config_as_k3s_does(tmp_path: Path) -> None:
    write(tmp_path, "/etc/rancher/rke2/config.yaml", '"data-dir ": /srv/rke2\n')
    configs = config.load(str(tmp_path))
    assert in_doubt(configs, Runtime.RKE2) or k3s_roots_in_effect(configs, Runtime.RKE2) == [
        "/srv/rke2/agent/containerd"
    ]


# --- 2. the same, end to end: a sandbox k3s still knows is planned for DEL ---------------------


def stale_default_records(node: NodeTree) -> None:
    """The operator moved k3s's data dir; the old one, with its last records, was kept."""
    knows(node, f"{K3S_DEFAULT}/agent/containerd", STALE)


def system_containerd_records(node: NodeTree) -> None:
    """containerd from the distribution was used for pods once (kubeadm before k3s)."""
    write(node.root, "/etc/containerd/config.toml", "version = 2\n")
    knows(node, "/var/lib/containerd", OTHER)


SCENARIOS = [
    pytest.param(
        {"config.yaml": '"data-dir ": /data/k3s\n'},
        "/data/k3s",
        stale_default_records,
        id="quoted-key-with-a-blank",
    ),
    pytest.param(
        {"config.yaml": "data-dir\u00a0: /data/k3s\n"},
        "/data/k3s",
        stale_default_records,
        id="plain-key-with-a-no-break-space",
    ),
    pytest.param(
        {"config.yaml": 'data-dir: "/data/k3s "\n'},
        "/data/k3s",
        system_containerd_records,
        id="value-with-a-trailing-blank",
    ),
    pytest.param(
        {"config.yaml": "data-dir=/data: k3s\n"},
        "/data=k3s",
        stale_default_records,
        id="key-with-an-equals-sign",
    ),
    # Only drop-ins, no config.yaml, the default dir gone: a data dir the reader cannot read
    # is a warning, but k3s does not count as found (_runtime_found looks at config.yaml,
    # not config.yaml.d), so its records are not put in doubt.
    pytest.param(
        {"config.yaml.d/50-data.yaml": "data-dir: &v /data/k3s\n"},
        "/data/k3s",
        system_containerd_records,
        id="drop-in-only-with-an-anchor",
    ),
    pytest.param(
        {"config.yaml.d/50-data.yaml": "tls-san:\n- k3s.example\ndata-dir: /data/k3s\n"},
        "/data/k3s",
        system_containerd_records,
        id="drop-in-only-with-a-list-at-column-0",
    ),
]


@pytest.mark.parametrize(("files", "data_dir", "other_records"), SCENARIOS)
def test_a_sandbox_k3s_still_knows_is_never_planned_for_del(
    node: NodeTree,
    t0: float,
    files: dict[str, str | bytes],
    data_dir: str,
    other_records: Callable[[NodeTree], None],
) -> None:
    """k3s keeps the sandbox's record under the data dir it starts with; the reaper reads
    other records (a stale default dir, the system containerd's). Called forgotten, the whole
    entry would be DEL'd and moved away from under k3s."""
    name = earlier_boots_entry(node, t0, KNOWN)
    write_k3s_config(node.root, files)
    knows(node, f"{data_dir}/agent/containerd", KNOWN)
    other_records(node)

    report = dry_run(node, t0)

    entry = by_path(report)[name]
    assert entry["action"] == "keep", (entry["reason"], report["runtime_records"])


def test_a_config_file_named_by_k3s_unit_environment(node: NodeTree, t0: float) -> None:
    """Not this change's own: K3S_CONFIG_FILE (k3s.service.env, as the install script writes
    it) names another config file, which moves the data dir; /etc/rancher/k3s/config.yaml is a
    leftover k3s does not read. The reaper reads no unit, takes the leftover as k3s's config and
    the stale default dir as its records."""
    name = earlier_boots_entry(node, t0, KNOWN)
    unit = "[Service]\nEnvironmentFile=-/etc/systemd/system/k3s.service.env\nExecStart=k3s server\n"
    write(node.root, "/etc/systemd/system/k3s.service", unit)
    write(node.root, "/etc/systemd/system/k3s.service.env", "K3S_CONFIG_FILE=/etc/k3s.yaml\n")
    write(node.root, "/etc/k3s.yaml", "data-dir: /data/k3s\n")
    write(node.root, K3S_CONFIG, "write-kubeconfig-mode: '0644'\n")
    knows(node, "/data/k3s/agent/containerd", KNOWN)
    stale_default_records(node)

    report = dry_run(node, t0)

    entry = by_path(report)[name]
    assert entry["action"] == "keep", (entry["reason"], report["runtime_records"])


# --- 3. files k3s cannot start with, taken as sure -----------------------------------------------

WONT_START: list[tuple[dict[str, str | bytes], str]] = [
    # urfave/cli's normalizeFlags: "Cannot use two forms of the same flag: d data-dir". The
    # reader (and test_rke2_data_dir_as_its_flags_come_out) takes the last one instead.
    ({"config.yaml": "data-dir: /a\nd: /b\n"}, "two forms of one flag"),
    ({"config.yaml": "d: /b\n", "config.yaml.d/1.yaml": "data-dir: /a\n"}, "two forms, two files"),
    # go-yaml v2 is YAML 1.1: no \/ escape ("found unknown escape character"); PyYAML has it.
    ({"config.yaml": 'data-dir: "/srv\\/k3s"\n'}, "escaped slash"),
    # go-yaml: "control characters are not allowed".
    ({"config.yaml": "data-dir: /srv/k3s\x01\n"}, "control character"),
    ({"config.yaml": "data-dir: /srv/k3s\x00\n"}, "NUL"),
    # go-yaml: "found a tab character that violates indentation"; the reader skips the line
    # as another key's value.
    ({"config.yaml": "token: x\n\tdata-dir: /srv/k3s\n"}, "tab-indented key"),
]


@pytest.mark.parametrize(
    ("files", "why"), WONT_START, ids=[why for _, why in WONT_START]
)  # fmt: skip
def test_a_config_k3s_cannot_start_with_puts_its_records_in_doubt(
    tmp_path: Path, files: dict[str, str | bytes], why: str
) -> None:
    """The data dir k3s starts with once the file is fixed is not in the file."""
    write_k3s_config(tmp_path, files)
    (tmp_path / K3S_DEFAULT.lstrip("/") / "agent/containerd").mkdir(parents=True)
    configs = config.load(str(tmp_path))
    assert in_doubt(configs), (why, k3s_roots_in_effect(configs))


# --- 4. what held ---------------------------------------------------------------------------------

AGREED: list[tuple[dict[str, str | bytes], str]] = [
    # A BOM opens the file: both drop it.
    ({"config.yaml": "\ufeffdata-dir: /srv/k3s\r\n"}, "/srv/k3s"),
    # A BOM opening a later line: go-yaml keeps it in the key, as the reader does.
    ({"config.yaml": "token: x\n\ufeffdata-dir: /srv/k3s\n"}, K3S_DEFAULT),
    # Lone CR line breaks.
    ({"config.yaml": "data-dir: /srv/k3s\rtoken: x\r"}, "/srv/k3s"),
    # ".." and "." cleaned as filepath.Abs cleans them.
    ({"config.yaml": "data-dir: /srv/../k3s/./x/\n"}, "/k3s/x"),
    # A later drop-in wins; "+" appends, and the last flag of the key wins.
    ({"config.yaml": "data-dir: /a\n", "config.yaml.d/50.yaml": "data-dir: /b\n"}, "/b"),
    ({"config.yaml": "d: /a\n", "config.yaml.d/50.yml": "d+: /b\n"}, "/b"),
    # Names that are not .yaml/.yml (any case) are not k3s's.
    ({"config.yaml": "d: /a\n", "config.yaml.d/50.yaml.bak": "d: /b\n"}, "/a"),
    ({"config.yaml": "d: /a\n", "config.yaml.d/50.YmL": "d: /b\n"}, "/b"),
    # A second document is not read by k3s either.
    ({"config.yaml": "d: /a\n---\nd: /b\n"}, "/a"),
    ({"config.yaml": "d: /a\n...\nd: /b\n"}, "/a"),
    # A "+" key after a trimmed key name: k3s trims first, then drops the "+": "data-dir ".
    ({"config.yaml": '"data-dir +": /b\n'}, K3S_DEFAULT),
]


@pytest.mark.parametrize(("files", "data_dir"), AGREED)
def test_what_k3s_reads_the_reader_reads(
    tmp_path: Path, files: dict[str, str | bytes], data_dir: str
) -> None:
    write_k3s_config(tmp_path, files)
    configs = config.load(str(tmp_path))
    assert_reads_or_doubts(configs, data_dir)
    assert not in_doubt(configs)


DOUBTED: list[tuple[dict[str, str | bytes], str]] = [
    ({"config.yaml": b"\xff\xfed\x00:\x00 \x00/\x00x\x00\n\x00"}, "UTF-16 with a BOM"),
    ({"config.yaml": b"# r\xe9pertoire\ndata-dir: /srv/k3s\n"}, "Latin-1"),
    ({"config.yaml": "data-dir: relative/k3s\n"}, "relative"),
    ({"config.yaml": "data-dir: ~/k3s\n"}, "home"),
    ({"config.yaml": "data-dir: ''\n"}, "empty: k3s takes its default, the reader doubts"),
    ({"config.yaml": "data-dir: /srv/\u0085k3s\n"}, "NEL"),
    ({"config.yaml": "<<: {data-dir: /srv/k3s}\n"}, "merge key"),
    ({"config.yaml": "data-dir: [/a, /b]\n"}, "list"),
    ({"config.yaml": "data-dir: /a\n  /b\n"}, "plain value going on"),
    ({"config.yaml": "d: /a\n" + "x" * config.MAX_CONFIG_BYTES + ": y\n"}, "over 1 MiB"),
]


@pytest.mark.parametrize(("files", "why"), DOUBTED, ids=[why for _, why in DOUBTED])
def test_what_the_reader_cannot_be_sure_of_is_in_doubt(
    tmp_path: Path, files: dict[str, str | bytes], why: str
) -> None:
    write_k3s_config(tmp_path, files)
    configs = config.load(str(tmp_path))
    assert in_doubt(configs), why
    assert k3s_roots_in_effect(configs) == [f"{K3S_DEFAULT}/agent/containerd"]


def test_a_list_at_column_0_below_another_key_is_read_past(tmp_path: Path) -> None:
    """Valid, common YAML (the review found it put k3s's records in doubt): read past."""
    write_k3s_config(tmp_path, {"config.yaml": "tls-san:\n- a.example\n-  'b'\ndata-dir: /srv\n"})
    configs = config.load(str(tmp_path))
    assert not in_doubt(configs)
    assert k3s_roots_in_effect(configs) == ["/srv/agent/containerd"]


def test_symlinked_configs_are_followed_inside_the_root_only(tmp_path: Path) -> None:
    etc = tmp_path / "etc/rancher/k3s"
    write(tmp_path, "/opt/cfg/k3s.yaml", "data-dir: /srv/k3s\n")
    etc.mkdir(parents=True)
    (etc / "config.yaml").symlink_to("/opt/cfg/k3s.yaml")  # the node's own path
    configs = config.load(str(tmp_path))
    assert k3s_roots_in_effect(configs) == ["/srv/k3s/agent/containerd"]
    assert not in_doubt(configs)

    (etc / "config.yaml").unlink()
    (etc / "config.yaml").symlink_to("../" * 12 + "etc/passwd")  # above the root
    assert in_doubt(config.load(str(tmp_path)))

    (etc / "config.yaml").unlink()
    (etc / "config.yaml").symlink_to("/nowhere.yaml")  # dangling
    assert in_doubt(config.load(str(tmp_path)))

    (etc / "config.yaml").unlink()
    write(tmp_path, K3S_CONFIG, "token: x\n")
    (etc / "config.yaml.d").symlink_to("../" * 12 + "tmp")
    assert in_doubt(config.load(str(tmp_path)))


def test_drop_ins_alone_that_cannot_be_read_put_k3s_records_in_doubt(tmp_path: Path) -> None:
    """No config.yaml (k3s needs none when config.yaml.d has files), its data dir on a volume:
    config.yaml.d linked out of the root is a warning, but k3s does not count as found, so
    nothing is put in doubt and the system containerd's records alone decide."""
    write(tmp_path, "/etc/containerd/config.toml", "version = 2\n")
    (tmp_path / "data/k3s/agent/containerd").mkdir(parents=True)
    (tmp_path / "etc/rancher/k3s").mkdir(parents=True)
    (tmp_path / "etc/rancher/k3s/config.yaml.d").symlink_to("../" * 12 + "tmp")
    configs = config.load(str(tmp_path))
    assert configs.warnings
    assert in_doubt(configs), configs.warnings


@pytest.mark.parametrize("kind", ["fifo", "dir-link", "dangling", "directory"])
def test_a_drop_in_that_is_no_regular_file(tmp_path: Path, kind: str) -> None:
    """k3s reads every non-directory entry (its DirEntry.IsDir does not follow links): a FIFO
    hangs it, a link to a dir or nowhere fails it. The reader must neither hang nor trust."""
    write(tmp_path, K3S_CONFIG, "data-dir: /srv/k3s\n")
    drop_ins = tmp_path / "etc/rancher/k3s/config.yaml.d"
    drop_ins.mkdir()
    entry = drop_ins / "50.yaml"
    if kind == "fifo":
        os.mkfifo(entry)
    elif kind == "dir-link":
        entry.symlink_to("/etc")
        (tmp_path / "etc").mkdir(exist_ok=True)
    elif kind == "dangling":
        entry.symlink_to("/nowhere.yaml")
    else:  # a directory is skipped by k3s and the reader alike
        entry.mkdir()
    configs = config.load(str(tmp_path))
    if kind == "directory":
        assert not in_doubt(configs)
        assert k3s_roots_in_effect(configs) == ["/srv/k3s/agent/containerd"]
    else:
        assert in_doubt(configs)


def test_more_drop_ins_than_read_are_in_doubt(tmp_path: Path) -> None:
    for i in range(config.MAX_CONFIG_FILES + 1):
        write(tmp_path, f"/etc/rancher/k3s/config.yaml.d/{i:03}.txt", "")
    write(tmp_path, K3S_CONFIG, "data-dir: /srv/k3s\n")
    assert in_doubt(config.load(str(tmp_path)))


def test_a_data_dir_linked_out_of_the_root_makes_its_records_unreadable(tmp_path: Path) -> None:
    write(tmp_path, K3S_CONFIG, "data-dir: /data/k3s\n")
    (tmp_path / "data").mkdir()
    (tmp_path / "data/k3s").symlink_to("../" * 12 + "tmp")
    configs = config.load(str(tmp_path))
    found = inventory.load(str(tmp_path), configs)
    assert found.knows(KNOWN) is None
    assert any("leads out of" in line for line in found.unreadable)


@pytest.mark.parametrize(
    "text",
    [
        "k" + ":x" * (1 << 19) + ": /v\n",
        "a: b\n" * ((1 << 20) // 5),
        "token: " + "[" * ((1 << 20) - 20) + "\n",
        'token: "' + "\\\\" * ((1 << 19) - 10) + '"\n',
        "token: [" + "'a'," * ((1 << 18) - 4) + "]\n",
        "data-dir: /" + " x" * ((1 << 19) - 10) + "\n",
    ],
    ids=["colons", "lines", "brackets", "escapes", "quotes", "blanks"],
)
def test_a_file_of_the_largest_size_read_is_read_quickly(text: str) -> None:
    with contextlib.suppress(Unreadable):
        settings(text, {"data-dir", "d"})


def test_names_and_values_no_utf_8_can_spell_crash_no_run(node: NodeTree, t0: float) -> None:
    """A drop-in named in Latin-1 that is a FIFO, and a NUL in a value: warnings, no crash."""
    drop_ins = node.root / "etc/rancher/k3s/config.yaml.d"
    drop_ins.mkdir(parents=True)
    os.mkfifo(os.fsencode(drop_ins) + b"/r\xe9seau.yaml")
    write(node.root, K3S_CONFIG, b"data-dir: /srv/k3s\x00x\n")
    node.boot(t0 - 7200)
    node.boot(t0 - 55)
    node.write_boot_world(btime=t0 - 60)
    report = dry_run(node, t0)
    assert any("seau.yaml: not a regular file" in w for w in report["warnings"])
