"""The runtimes' own configs, read from real files in a node tree: containerd with imports in
config versions 2 and 3, k3s and RKE2, CRI-O with drop-ins and storage.conf, for their sockets,
state and the CNI conf and plugin dirs they use, and every way a config can be unusable, which
must give a warning naming the file and the defaults."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni_reaper.node_root import BadPattern, canonical, glob_inside, go_pattern
from cni_reaper.runtime import config, units
from cni_reaper.runtime.config import LocatedPath, PathKind, Runtime, RuntimeConfigs


def write(root: Path, node_path: str, text: str) -> Path:
    path = root / node_path.lstrip("/")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def located(
    configs: RuntimeConfigs, kind: PathKind, runtime: Runtime | None = None
) -> dict[str, LocatedPath]:
    """The paths of a kind by node path."""
    return {
        p.node_path: p
        for p in configs.all_paths
        if p.kind == kind and (runtime is None or p.runtime == runtime)
    }


def in_effect(configs: RuntimeConfigs, kind: PathKind, runtime: Runtime) -> list[str]:
    return [p.node_path for p in located(configs, kind, runtime).values() if p.in_effect]


def test_an_empty_node_gets_every_default_under_its_root(tmp_path: Path) -> None:
    configs = config.load(str(tmp_path))
    assert configs.warnings == ()
    assert configs.files_read == ()
    sockets = located(configs, PathKind.SOCKET)
    assert sockets["/run/containerd/containerd.sock"].source == "default"
    assert sockets["/run/containerd/containerd.sock"].path == str(
        tmp_path / "run/containerd/containerd.sock"
    )
    assert {"/run/k3s/containerd/containerd.sock", "/run/crio/crio.sock"} <= set(sockets)
    activation = located(configs, PathKind.ACTIVATION_SOCKET)
    assert set(activation) == {"/run/docker.sock", "/run/cri-dockerd.sock"}
    live = {p.node_path for p in configs.live_state_dirs}
    assert live == {
        "/run/containerd",
        "/run/containerd/runc",
        "/run/k3s/containerd",
        "/run/crio",
        "/run/containers/storage",
        "/run/crun",
        "/run/runc",
        "/run/docker",
        "/run/docker/containerd/daemon",
        "/run/libpod",
    }
    assert [p.node_path for p in configs.start_markers] == ["/run/crio/version"]
    assert [p.node_path for p in configs.netns_dirs] == ["/run/netns"]
    roots = located(configs, PathKind.PERSISTENT_ROOT)
    assert "/var/lib/rancher/rke2/agent/containerd" in roots
    assert all(p.path.startswith(str(tmp_path) + "/") for p in configs.all_paths)


def test_containerd_v2_imports_merge_breadth_first_later_files_winning(tmp_path: Path) -> None:
    write(
        tmp_path,
        "/etc/containerd/config.toml",
        'version = 2\nstate = "/run/main-state"\n'
        'imports = ["conf.d/*.toml", "/etc/containerd/last.toml"]\n'
        '[grpc]\naddress = "/run/main.sock"\n',
    )
    # A relative import names a file beside the one importing it, a glob too.
    write(
        tmp_path,
        "/etc/containerd/conf.d/10-a.toml",
        'version = 2\nroot = "/data/a"\nimports = ["../nested.toml"]\n',
    )
    write(
        tmp_path,
        "/etc/containerd/conf.d/20-b.toml",
        'version = 2\nroot = "/data/b"\nstate = ""\n[grpc]\naddress = "/var/run/b.sock"\n',
    )
    write(tmp_path, "/etc/containerd/conf.d/30-c.conf", "not TOML, and no *.toml either")
    write(tmp_path, "/etc/containerd/last.toml", 'state = "/run/last-state"\n')
    # Imported by 10-a, so queued after last.toml: loaded last, it wins.
    write(tmp_path, "/etc/containerd/nested.toml", 'root = "/data/nested"\n')

    configs = config.load(str(tmp_path))

    assert configs.warnings == ()
    etc = tmp_path / "etc/containerd"
    load_order = ("config.toml", "conf.d/10-a.toml", "conf.d/20-b.toml", "last.toml", "nested.toml")
    assert configs.files_read == tuple(str(etc / name) for name in load_order)
    state = located(configs, PathKind.TASK_STATE, Runtime.CONTAINERD)
    # An empty string does not override, as in containerd's merge.
    assert state["/run/last-state"].source == f"{etc / 'last.toml'}: state"
    assert state["/run/last-state"].in_effect
    assert "/run/main-state" not in state
    # The default stays watched: a containerd started before the edit still uses it.
    assert not state["/run/containerd"].in_effect
    sockets = located(configs, PathKind.SOCKET, Runtime.CONTAINERD)
    assert sockets["/run/b.sock"].source == f"{etc / 'conf.d/20-b.toml'}: [grpc] address"
    assert sockets["/run/b.sock"].path == str(tmp_path / "run/b.sock")
    roots = located(configs, PathKind.PERSISTENT_ROOT, Runtime.CONTAINERD)
    assert roots["/data/nested"].in_effect
    assert roots["/data/nested"].source == f"{etc / 'nested.toml'}: root"


def test_containerd_v3_keys_and_the_v4_grpc_plugin(tmp_path: Path) -> None:
    write(
        tmp_path,
        "/etc/containerd/config.toml",
        'version = 3\nroot = "/srv/containerd"\nimports = ["v4.toml"]\n'
        '[grpc]\naddress = "/run/v3.sock"\n'
        '[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]\n'
        'Root = "/run/my-runc"\n',
    )
    write(
        tmp_path,
        "/etc/containerd/v4.toml",
        "version = 4\n"
        '[grpc]\naddress = "/run/legacy.sock"\n'
        '[plugins."io.containerd.server.v1.grpc"]\naddress = "/run/v4.sock"\n',
    )
    configs = config.load(str(tmp_path))
    assert configs.warnings == ()
    v4 = tmp_path / "etc/containerd/v4.toml"
    assert in_effect(configs, PathKind.SOCKET, Runtime.CONTAINERD) == ["/run/v4.sock"]
    sockets = located(configs, PathKind.SOCKET, Runtime.CONTAINERD)
    assert sockets["/run/v4.sock"].source == (
        f'{v4}: [plugins."io.containerd.server.v1.grpc"] address'
    )
    runc = located(configs, PathKind.NAMESPACED_OCI_ROOT, Runtime.CONTAINERD)
    assert set(runc) == {"/run/containerd/runc", "/run/my-runc"}
    assert in_effect(configs, PathKind.PERSISTENT_ROOT, Runtime.CONTAINERD) == ["/srv/containerd"]


def test_import_loops_load_each_file_once_and_missing_imports_warn(tmp_path: Path) -> None:
    write(tmp_path, "/etc/containerd/config.toml", 'imports = ["a.toml", "gone.toml"]\n')
    write(tmp_path, "/etc/containerd/a.toml", 'imports = ["config.toml"]\nstate = "/run/a"\n')
    configs = config.load(str(tmp_path))
    assert len(configs.files_read) == 2
    gone = tmp_path / "etc/containerd/gone.toml"
    assert configs.warnings == (f"{gone}: does not exist",)
    assert in_effect(configs, PathKind.TASK_STATE, Runtime.CONTAINERD) == ["/run/a"]


def test_k3s_flags_win_over_its_generated_config_which_stays_watched(tmp_path: Path) -> None:
    k3s = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml"
    write(tmp_path, k3s, 'version = 2\nstate = "/run/k3s/elsewhere"\n')
    rke2 = "/var/lib/rancher/rke2/agent/etc/containerd/config.toml"
    write(tmp_path, rke2, 'version = 3\n[grpc]\naddress = "/run/rke2.sock"\n')
    configs = config.load(str(tmp_path))
    assert configs.warnings == ()
    state = located(configs, PathKind.TASK_STATE)
    assert state["/run/k3s/containerd"].in_effect
    assert state["/run/k3s/containerd"].runtime == Runtime.K3S
    assert not state["/run/k3s/elsewhere"].in_effect
    assert "--state" in state["/run/k3s/elsewhere"].source
    sockets = located(configs, PathKind.SOCKET)
    assert sockets["/run/k3s/containerd/containerd.sock"].in_effect
    assert sockets["/run/rke2.sock"].runtime == Runtime.RKE2
    assert sockets["/run/rke2.sock"].source.startswith(f"{tmp_path / rke2.lstrip('/')}: ")
    assert not sockets["/run/rke2.sock"].in_effect


def test_crio_drop_ins_in_name_order_later_values_winning(tmp_path: Path) -> None:
    write(
        tmp_path,
        "/etc/crio/crio.conf",
        '[crio]\nrunroot = "/var/run/containers/main"\n'
        '[crio.api]\nlisten = "/var/run/crio/main.sock"\n',
    )
    write(tmp_path, "/etc/crio/crio.conf.d/20-b.conf", '[crio.api]\nlisten = "/run/crio/b.sock"\n')
    write(tmp_path, "/etc/crio/crio.conf.d/10-a.conf", '[crio.api]\nlisten = "/run/crio/a.sock"\n')
    # CRI-O walks the whole dir: a subdir's files come at the subdir's place in name order,
    # and a file is read whatever its name.
    write(
        tmp_path,
        "/etc/crio/crio.conf.d/15-sub/x.toml",
        '[crio]\nversion_file = "/var/run/crio/v"\n'
        '[crio.runtime]\nnamespaces_dir = "/var/run/pins"\n'
        '[crio.runtime.runtimes.kata]\nruntime_root = "/run/kata"\n',
    )
    configs = config.load(str(tmp_path))
    assert configs.warnings == ()
    drop_ins = tmp_path / "etc/crio/crio.conf.d"
    assert configs.files_read == (
        str(tmp_path / "etc/crio/crio.conf"),
        str(drop_ins / "10-a.conf"),
        str(drop_ins / "15-sub/x.toml"),
        str(drop_ins / "20-b.conf"),
    )
    sockets = located(configs, PathKind.SOCKET, Runtime.CRIO)
    assert in_effect(configs, PathKind.SOCKET, Runtime.CRIO) == ["/run/crio/b.sock"]
    assert sockets["/run/crio/b.sock"].source == f"{drop_ins / '20-b.conf'}: [crio.api] listen"
    # /var/run is taken as /run, inside the root.
    runroot = located(configs, PathKind.STORAGE_RUNROOT, Runtime.CRIO)["/run/containers/main"]
    assert runroot.path == str(tmp_path / "run/containers/main")
    assert runroot.source == f"{tmp_path / 'etc/crio/crio.conf'}: [crio] runroot"
    assert in_effect(configs, PathKind.START_MARKER, Runtime.CRIO) == ["/run/crio/v"]
    assert in_effect(configs, PathKind.NETNS_DIR, Runtime.CRIO) == ["/run/pins/netns"]
    assert "/run/kata" in located(configs, PathKind.OCI_ROOT, Runtime.CRIO)


def test_storage_conf_gives_crio_and_podman_their_run_root(tmp_path: Path) -> None:
    write(tmp_path, "/usr/share/containers/storage.conf", '[storage]\nrunroot = "/run/vendor"\n')
    configs = config.load(str(tmp_path))
    assert in_effect(configs, PathKind.STORAGE_RUNROOT, Runtime.CRIO) == ["/run/vendor"]

    # /etc/containers/storage.conf, when it exists, replaces the vendor file.
    write(
        tmp_path,
        "/etc/containers/storage.conf",
        '[storage]\ndriver = "overlay"\nrunroot = "/var/run/admin"\ngraphroot = "/srv/graph"\n',
    )
    configs = config.load(str(tmp_path))
    runroot = located(configs, PathKind.STORAGE_RUNROOT)["/run/admin"]
    assert runroot.source == f"{tmp_path / 'etc/containers/storage.conf'}: [storage] runroot"
    assert "/run/vendor" not in located(configs, PathKind.STORAGE_RUNROOT)
    assert "/srv/graph" in in_effect(configs, PathKind.PERSISTENT_ROOT, Runtime.CRIO)


def test_a_config_symlinked_out_of_the_root_is_not_followed(tmp_path: Path) -> None:
    node = tmp_path / "node"
    outside = write(tmp_path, "/outside/config.toml", 'state = "/run/from-outside"\n')
    # An absolute target is the node's own path: here one that does not exist in the node.
    (node / "etc/containerd").mkdir(parents=True)
    (node / "etc/containerd/config.toml").symlink_to(outside)
    # A relative target that climbs above the root.
    (node / "etc/crio").mkdir(parents=True)
    (node / "etc/crio/crio.conf").symlink_to("../../../outside/config.toml")
    configs = config.load(str(node))
    assert configs.files_read == ()
    assert len(configs.warnings) == 2
    containerd_warning, crio_warning = configs.warnings
    assert containerd_warning.startswith(
        f"{node / 'etc/containerd/config.toml'}: a symlink whose target does not exist inside"
    )
    assert crio_warning == (
        f"{node / 'etc/crio/crio.conf'}: a symlink that leads out of {node}; not read"
    )
    assert "/run/from-outside" not in located(configs, PathKind.TASK_STATE)


def test_a_config_symlinked_inside_the_root_is_read_as_the_node_sees_it(tmp_path: Path) -> None:
    write(tmp_path, "/srv/real.toml", 'state = "/run/real"\n')
    (tmp_path / "etc/containerd").mkdir(parents=True)
    # Absolute, as the node names it: resolved under the root, not on this machine.
    (tmp_path / "etc/containerd/config.toml").symlink_to("/srv/real.toml")
    configs = config.load(str(tmp_path))
    assert configs.warnings == ()
    assert in_effect(configs, PathKind.TASK_STATE, Runtime.CONTAINERD) == ["/run/real"]


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        (lambda p: p.write_text("state = \n"), "not valid TOML"),
        (lambda p: p.write_bytes(b'state = "\xff"\n'), "not UTF-8"),
        (lambda p: p.mkdir(), "not a regular file"),
        (os.mkfifo, "not a regular file"),
        (lambda p: p.write_bytes(b"# " + b"x" * (2 << 20) + b"\n"), "larger than 1048576 bytes"),
        (lambda p: p.write_text("state = 5\n"), "state is not a string; ignored"),
        (lambda p: p.write_text('[crio]\nstate = "x"\n'), None),
    ],
    ids=["invalid", "not-utf8", "directory", "fifo", "2-MiB", "not-a-string", "unknown-key"],
)
def test_an_unusable_config_is_a_warning_naming_it_and_the_defaults(
    tmp_path: Path, make: Callable[[Path], object], reason: str | None
) -> None:
    path = tmp_path / "etc/containerd/config.toml"
    path.parent.mkdir(parents=True)
    make(path)
    configs = config.load(str(tmp_path))
    if reason is None:
        assert configs.warnings == ()
    else:
        assert len(configs.warnings) == 1
        assert configs.warnings[0].startswith(f"{path}: ")
        assert reason in configs.warnings[0]
    assert in_effect(configs, PathKind.TASK_STATE, Runtime.CONTAINERD) == ["/run/containerd"]


@pytest.mark.skipif(sys.version_info >= (3, 11), reason="tomllib is in the standard library")
def test_without_tomli_a_config_is_a_warning_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only a config outside plain TOML (runtime/plain_toml.py) needs tomli: here an escape."""
    monkeypatch.setitem(sys.modules, "tomli", None)  # what an absent package does to import
    path = write(tmp_path, "/etc/containerd/config.toml", 'state = "/run/x\\u0079"\n')
    configs = config.load(str(tmp_path))
    assert configs.warnings == (f"{path}: not read: TOML needs the tomli package before 3.11",)
    assert in_effect(configs, PathKind.TASK_STATE, Runtime.CONTAINERD) == ["/run/containerd"]
    write(tmp_path, "/etc/containerd/config.toml", 'state = "/run/x"\n')
    configs = config.load(str(tmp_path))
    assert configs.warnings == ()
    assert in_effect(configs, PathKind.TASK_STATE, Runtime.CONTAINERD) == ["/run/x"]


def test_a_bad_import_pattern_is_a_warning(tmp_path: Path) -> None:
    path = write(tmp_path, "/etc/containerd/config.toml", 'imports = ["/etc/*[.toml"]\n')
    configs = config.load(str(tmp_path))
    assert configs.warnings == (f"{path}: imports: bad pattern '/etc/*[.toml'",)


def test_node_paths_are_canonical_with_var_run_taken_as_run() -> None:
    assert canonical("/var/run/crio/crio.sock") == "/run/crio/crio.sock"
    assert canonical("var/run") == "/run"
    assert canonical("/var/runner/x") == "/var/runner/x"
    assert canonical("//run/../../etc/x") == "/etc/x"


def test_globs_follow_go_filepath_match(tmp_path: Path) -> None:
    for name in ("b.toml", "a.toml", ".hidden.toml", "c.txt", "Z.toml"):
        write(tmp_path, f"/d/{name}", "")
    # Go's * matches a leading dot too; matches come in byte order.
    assert glob_inside(str(tmp_path), "/d/*.toml") == [
        "/d/.hidden.toml",
        "/d/Z.toml",
        "/d/a.toml",
        "/d/b.toml",
    ]
    assert glob_inside(str(tmp_path), "/d/[^a-b].toml") == ["/d/Z.toml"]
    assert glob_inside(str(tmp_path), "/*/a.toml") == ["/d/a.toml"]
    assert glob_inside(str(tmp_path), "/nowhere/*") == []
    for bad in ("[]", "[^]", "a[", "[a-", "\\"):
        with pytest.raises(BadPattern):
            go_pattern(bad)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.text("ab-_0", min_size=1, max_size=4), st.sampled_from(["", "x", "y", "z"])),
        max_size=6,
        unique_by=lambda file: file[0],
    ),
    st.sampled_from(["", "main"]),
)
def test_containerd_takes_the_last_non_empty_state_of_its_imports_in_glob_order(
    imports: list[tuple[str, str]], main_state: str
) -> None:
    with tempfile.TemporaryDirectory() as root:
        write(
            Path(root),
            "/etc/containerd/config.toml",
            f'state = "{main_state and "/run/" + main_state}"\nimports = ["conf.d/*.toml"]\n',
        )
        for name, state in imports:
            value = state and f"/run/{state}"
            write(Path(root), f"/etc/containerd/conf.d/{name}.toml", f'state = "{value}"\n')
        configs = config.load(root)
    ordered = [state for _, state in sorted(imports, key=lambda file: f"{file[0]}.toml".encode())]
    expected = next((s for s in reversed([main_state, *ordered]) if s), "containerd")
    assert in_effect(configs, PathKind.TASK_STATE, Runtime.CONTAINERD) == [f"/run/{expected}"]


@settings(max_examples=40, deadline=None)
@given(
    st.dictionaries(
        st.text("abc09-", min_size=1, max_size=4), st.sampled_from(["", "p", "q"]), max_size=6
    )
)
def test_crio_takes_the_listen_of_the_drop_in_last_in_name_order(drop_ins: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory() as root:
        for name, listen in drop_ins.items():
            body = f'[crio.api]\nlisten = "/run/{listen}.sock"\n' if listen else "[crio]\n"
            write(Path(root), f"/etc/crio/crio.conf.d/{name}.conf", body)
        configs = config.load(root)
    by_file_name = sorted(drop_ins, key=lambda name: f"{name}.conf".encode())
    ordered = [drop_ins[name] for name in by_file_name if drop_ins[name]]
    expected = f"/run/{ordered[-1]}.sock" if ordered else "/run/crio/crio.sock"
    assert in_effect(configs, PathKind.SOCKET, Runtime.CRIO) == [expected]


# The CNI conf and plugin dirs the runtimes use.

CRI_V2 = 'plugins."io.containerd.grpc.v1.cri"'
CRI_V3 = 'plugins."io.containerd.cri.v1.runtime"'


def cni_dirs(configs: RuntimeConfigs) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The conf dirs and the plugin dirs, each (node path, runtime: source)."""
    dirs = configs.cni_dirs
    return (
        [(d.node_path, d.describe()) for d in dirs.conf_dirs],
        [(d.node_path, d.describe()) for d in dirs.bin_dirs],
    )


def test_no_runtime_on_the_node_names_no_cni_dir(tmp_path: Path) -> None:
    # Its storage root is podman's as much as CRI-O's: no evidence of CRI-O.
    (tmp_path / "var/lib/containers/storage").mkdir(parents=True)
    configs = config.load(str(tmp_path))
    assert configs.cni_dirs == config.CniDirs()


def test_a_runtime_without_config_counts_by_its_root_with_its_own_defaults(tmp_path: Path) -> None:
    (tmp_path / "var/lib/containerd").mkdir(parents=True)
    (tmp_path / "var/lib/crio").mkdir(parents=True)
    configs = config.load(str(tmp_path))
    assert configs.warnings == ()
    assert configs.cni_dirs.found == (
        (Runtime.CONTAINERD, f"{tmp_path / 'var/lib/containerd'} exists"),
        (Runtime.CRIO, f"{tmp_path / 'var/lib/crio'} exists"),
    )
    assert cni_dirs(configs) == (
        [("/etc/cni/net.d", "containerd: default"), ("/etc/cni/net.d", "cri-o: default")],
        [("/opt/cni/bin", "containerd: default"), ("/opt/cni/bin", "cri-o: default")],
    )
    assert configs.cni_dirs.bin_dirs[0].path == str(tmp_path / "opt/cni/bin")


def test_containerd_v2_cni_table_replaced_by_an_import(tmp_path: Path) -> None:
    """Debian's shipped config, and an import that sets the whole cni table again: 1.6/1.7
    and 2.x read it alike."""
    write(
        tmp_path,
        "/etc/containerd/config.toml",
        f'version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n[{CRI_V2}.cni]\n'
        'bin_dir = "/usr/lib/cni"\nconf_dir = "/etc/cni/net.d"\n',
    )
    write(
        tmp_path,
        "/etc/containerd/conf.d/50-cni.toml",
        f'version = 2\n[{CRI_V2}.cni]\nbin_dir = "/opt/site/bin"\nconf_dir = "/etc/site/net.d"\n'
        f'[{CRI_V2}.containerd.runtimes.kata]\ncni_conf_dir = "/etc/kata/net.d"\n',
    )
    configs = config.load(str(tmp_path))
    assert configs.warnings == ()
    imported = tmp_path / "etc/containerd/conf.d/50-cni.toml"
    assert cni_dirs(configs) == (
        [
            ("/etc/site/net.d", f"containerd: {imported}: [{CRI_V2}.cni] conf_dir"),
            (
                "/etc/kata/net.d",
                f"containerd: {imported}: [{CRI_V2}.containerd.runtimes.kata] cni_conf_dir",
            ),
        ],
        [("/opt/site/bin", f"containerd: {imported}: [{CRI_V2}.cni] bin_dir")],
    )


def test_containerd_v2_import_with_another_cri_table_is_read_both_ways(tmp_path: Path) -> None:
    """An import that sets only the registry: 1.6/1.7 take its CRI table whole, which has no
    cni table, so containerd's defaults; 2.x merges the tables key by key."""
    main = write(
        tmp_path,
        "/etc/containerd/config.toml",
        f'version = 2\nimports = ["registry.toml"]\n[{CRI_V2}.cni]\nbin_dir = "/usr/lib/cni"\n',
    )
    write(
        tmp_path,
        "/etc/containerd/registry.toml",
        f'version = 2\n[{CRI_V2}.registry]\nconfig_path = "/etc/containerd/certs.d"\n',
    )
    configs = config.load(str(tmp_path))
    assert configs.warnings == ()
    old, new = "(as containerd 1.6/1.7 reads it)", "(as containerd 2.x reads it)"
    assert cni_dirs(configs) == (
        [
            ("/etc/cni/net.d", f"containerd: default {old}"),
            ("/etc/cni/net.d", f"containerd: default {new}"),
        ],
        [
            ("/opt/cni/bin", f"containerd: default {old}"),
            ("/usr/lib/cni", f"containerd: {main}: [{CRI_V2}.cni] bin_dir {new}"),
        ],
    )


def test_containerd_v3_bin_dirs_and_an_import_overriding_them(tmp_path: Path) -> None:
    write(
        tmp_path,
        "/etc/containerd/config.toml",
        f'version = 3\nimports = ["conf.d/*.toml"]\n[{CRI_V3}.cni]\n'
        'bin_dirs = ["/opt/cni/bin", "/usr/lib/cni"]\nconf_dir = "/etc/cni/net.d"\n',
    )
    # A version 2 import: 2.x migrates its table, and the v3 keys it sets itself win.
    write(
        tmp_path,
        "/etc/containerd/conf.d/10-v2.toml",
        f'version = 2\n[{CRI_V2}.cni]\nbin_dir = "/opt/v2/bin"\nconf_dir = "/etc/v2/net.d"\n'
        f'[{CRI_V3}.cni]\nconf_dir = "/etc/v3/net.d"\n',
    )
    write(tmp_path, "/etc/containerd/conf.d/20-v3.toml", f"version = 3\n[{CRI_V3}.cni]\n")
    configs = config.load(str(tmp_path))
    assert configs.warnings == ()
    v2 = tmp_path / "etc/containerd/conf.d/10-v2.toml"
    assert cni_dirs(configs) == (
        [("/etc/v3/net.d", f"containerd: {v2}: [{CRI_V3}.cni] conf_dir")],
        [("/opt/v2/bin", f"containerd: {v2}: [{CRI_V2}.cni] bin_dir")],
    )


@pytest.mark.parametrize(
    ("cni_table", "bin_dirs", "warned"),
    [
        ('bin_dir = "/opt/old"\n', ["/opt/old"], False),
        ('bin_dir = "/opt/old"\nbin_dirs = ["/opt/cni/bin"]\n', ["/opt/old"], False),
        ('bin_dir = "/opt/old"\nbin_dirs = ["/opt/a", "", "/opt/b"]\n', ["/opt/a", "/opt/b"], True),
        ("bin_dirs = []\n", ["/opt/cni/bin"], False),
    ],
    ids=["bin_dir", "bin_dir-over-default", "both", "empty"],
)
def test_containerd_2_takes_the_deprecated_bin_dir_as_it_validates_it(
    tmp_path: Path, cni_table: str, bin_dirs: list[str], warned: bool
) -> None:
    path = write(
        tmp_path, "/etc/containerd/config.toml", f"version = 3\n[{CRI_V3}.cni]\n{cni_table}"
    )
    configs = config.load(str(tmp_path))
    assert [d.node_path for d in configs.cni_dirs.bin_dirs] == bin_dirs + (
        ["/opt/cni/bin", "/usr/lib/cni", "/usr/libexec/cni"] if warned else []
    )
    if warned:
        assert configs.warnings == (
            f"{path}: [{CRI_V3}.cni] bin_dirs and {path}: [{CRI_V3}.cni] bin_dir are both set: "
            "containerd 2.x refuses to start with both; bin_dirs taken",
        )


@pytest.mark.parametrize(
    "disabled", ['["cri"]', '["io.containerd.grpc.v1.cri"]', '["io.containerd.cri.v1.runtime"]']
)
def test_a_containerd_without_its_cri_plugin_names_no_cni_dir(
    tmp_path: Path, disabled: str
) -> None:
    """Docker's containerd.io ships a config that disables CRI: it sets up no pod network."""
    write(tmp_path, "/etc/containerd/config.toml", f"disabled_plugins = {disabled}\n")
    (tmp_path / "var/lib/containerd").mkdir(parents=True)
    configs = config.load(str(tmp_path))
    assert configs.cni_dirs == config.CniDirs()


K3S_CONFIG = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml"
RKE2_CONFIG = "/var/lib/rancher/rke2/agent/etc/containerd/config.toml"
K3S_HASH_BIN = "/var/lib/rancher/k3s/data/0123abcd/bin"


def k3s_generated_config(version: int) -> str:
    """What k3s's template writes with its own flannel (pkg/agent/templates)."""
    cri = CRI_V2 if version == 2 else "plugins.'io.containerd.cri.v1.runtime'"
    return (
        f"# File generated by k3s. DO NOT EDIT. Use config.toml.tmpl instead.\n"
        f"version = {version}\n"
        '[plugins."io.containerd.internal.v1.opt"]\n'
        '  path = "/var/lib/rancher/k3s/agent/containerd"\n'
        f"[{cri}.cni]\n"
        f'  bin_dir = "{K3S_HASH_BIN}"\n'
        '  conf_dir = "/var/lib/rancher/k3s/agent/etc/cni/net.d"\n'
        f"[{cri}.containerd.runtimes.runc]\n"
        '  runtime_type = "io.containerd.runc.v2"\n'
    )


@pytest.mark.parametrize("version", [2, 3])
def test_k3s_generated_config_names_its_own_cni_dirs(tmp_path: Path, version: int) -> None:
    path = write(tmp_path, K3S_CONFIG, k3s_generated_config(version))
    # RKE2 never runs k3s's flannel: its generated config has no cni table.
    write(tmp_path, RKE2_CONFIG, f"version = 2\n[{CRI_V2}]\n  enable_selinux = false\n")
    configs = config.load(str(tmp_path))
    assert configs.warnings == ()
    assert [r for r, _ in configs.cni_dirs.found] == [Runtime.K3S, Runtime.RKE2]
    cri = CRI_V2 if version == 2 else f'plugins."{config.CRI_RUNTIME_PLUGIN}"'
    assert cni_dirs(configs) == (
        [
            ("/var/lib/rancher/k3s/agent/etc/cni/net.d", f"k3s: {path}: [{cri}.cni] conf_dir"),
            ("/etc/cni/net.d", "rke2: default"),
        ],
        [(K3S_HASH_BIN, f"k3s: {path}: [{cri}.cni] bin_dir"), ("/opt/cni/bin", "rke2: default")],
    )


def test_k3s_and_rke2_without_a_generated_config_get_their_defaults(tmp_path: Path) -> None:
    for runtime in ("k3s", "rke2"):
        (tmp_path / f"var/lib/rancher/{runtime}/agent/containerd").mkdir(parents=True)
    # k3s points data/current at the data dir it runs from; an absolute target is the node's.
    (tmp_path / "var/lib/rancher/k3s/data/0123abcd/bin").mkdir(parents=True)
    (tmp_path / "var/lib/rancher/k3s/data/current").symlink_to("/var/lib/rancher/k3s/data/0123abcd")
    configs = config.load(str(tmp_path))
    assert configs.warnings == ()
    k3s = "k3s: default (k3s with its own flannel)"
    rke2 = "rke2: default (RKE2 leaves them to containerd)"
    assert cni_dirs(configs) == (
        [("/var/lib/rancher/k3s/agent/etc/cni/net.d", k3s), ("/etc/cni/net.d", rke2)],
        [("/var/lib/rancher/k3s/data/current/bin", k3s), ("/opt/cni/bin", rke2)],
    )
    # Where it is from here: through the node's own link, inside the root.
    assert configs.cni_dirs.bin_dirs[0].path == str(tmp_path / K3S_HASH_BIN.lstrip("/"))


def test_k3s_config_yaml_moves_its_data_dir_and_all_that_lies_in_it(tmp_path: Path) -> None:
    main = write(tmp_path, "/etc/rancher/k3s/config.yaml", "write-kubeconfig-mode: '0644'\n")
    # The drop-ins in name order, .yaml and .yml in any case; other names are not k3s's.
    write(tmp_path, "/etc/rancher/k3s/config.yaml.d/10-data.yaml", "data-dir: /srv/first\n")
    later = write(
        tmp_path, "/etc/rancher/k3s/config.yaml.d/20-data.YML", "data-dir: /srv/k3s # ok\n"
    )
    write(tmp_path, "/etc/rancher/k3s/config.yaml.d/30-off.yaml.bak", "data-dir: /srv/not\n")
    (tmp_path / "srv/k3s/agent/containerd").mkdir(parents=True)
    configs = config.load(str(tmp_path))
    assert configs.warnings == () and configs.records_in_doubt == ()
    assert str(main) in configs.files_read and str(later) in configs.files_read
    roots = located(configs, PathKind.PERSISTENT_ROOT, Runtime.K3S)
    assert in_effect(configs, PathKind.PERSISTENT_ROOT, Runtime.K3S) == [
        "/srv/k3s/agent/containerd"
    ]
    assert roots["/srv/k3s/agent/containerd"].source.startswith(f"{later}: data-dir (line 1)")
    assert not roots["/var/lib/rancher/k3s/agent/containerd"].in_effect  # still watched
    k3s = "k3s: default (k3s with its own flannel)"
    assert cni_dirs(configs) == (
        [("/srv/k3s/agent/etc/cni/net.d", k3s)],
        [("/srv/k3s/data/current/bin", k3s)],
    )


def test_k3s_generated_config_is_read_from_the_moved_data_dir(tmp_path: Path) -> None:
    write(tmp_path, "/etc/rancher/k3s/config.yaml", "data-dir: /srv/k3s\n")
    moved = k3s_generated_config(2).replace("/var/lib/rancher/k3s", "/srv/k3s")
    path = write(tmp_path, "/srv/k3s/agent/etc/containerd/config.toml", moved)
    configs = config.load(str(tmp_path))
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    assert cni_dirs(configs)[0] == [
        ("/srv/k3s/agent/etc/cni/net.d", f"k3s: {path}: [{cri}.cni] conf_dir")
    ]


@pytest.mark.parametrize(
    ("files", "data_dir"),
    [
        # A later file's value wins; "+" appends, and the last value is the flag's.
        ({"config.yaml": "data-dir: /a\n", "config.yaml.d/1.yaml": "data-dir: /c\n"}, "/c"),
        ({"config.yaml": "data-dir: /a\n", "config.yaml.d/2.yml": "data-dir+: /c\n"}, "/c"),
        ({"config.yaml": "d: /b\n"}, "/b"),
        ({"config.yaml": "tls-san:\n- x\nd: /b # short\n"}, "/b"),
        ({"config.yaml": "token: x\n"}, "/var/lib/rancher/rke2"),
    ],
)  # fmt: skip
def test_rke2_data_dir_as_its_flags_come_out(
    tmp_path: Path, files: dict[str, str], data_dir: str
) -> None:
    for name, text in files.items():
        write(tmp_path, f"/etc/rancher/rke2/{name}", text)
    configs = config.load(str(tmp_path))
    assert configs.warnings == ()
    assert in_effect(configs, PathKind.PERSISTENT_ROOT, Runtime.RKE2) == [
        f"{data_dir}/agent/containerd"
    ]


@pytest.mark.parametrize(
    "text",
    [
        "data-dir: &dir /srv/k3s\n",
        "data-dir:\n  /srv/k3s\n",
        "data-dir: relative/k3s\n",
        "data-dir: '/srv/\n  k3s'\n",
        "  data-dir: /srv/k3s\n",
        "data-dir: /srv/k3s\nd: /srv/k3s\n",  # both forms of one flag: k3s does not start
        "'data-dir ': /srv/k3s\n",  # k3s trims the key
        "data-dir=/srv: k3s\n",  # k3s's flag data-dir, /srv=k3s
        "\xff",
    ],
)
def test_a_data_dir_not_read_puts_k3s_records_in_doubt(tmp_path: Path, text: str) -> None:
    path = tmp_path / "etc/rancher/k3s/config.yaml"
    path.parent.mkdir(parents=True)
    path.write_bytes(text.encode("utf-8", "surrogateescape") if text != "\xff" else b"\xff")
    configs = config.load(str(tmp_path))
    assert any(w.startswith(str(path)) or str(path) in w for w in configs.warnings)
    (doubt,) = configs.records_in_doubt
    assert doubt.startswith("k3s: its data-dir")
    # What it watches and reads meanwhile is the default's.
    assert in_effect(configs, PathKind.PERSISTENT_ROOT, Runtime.K3S) == [
        "/var/lib/rancher/k3s/agent/containerd"
    ]


def test_crio_network_dirs_from_its_drop_ins_in_order(tmp_path: Path) -> None:
    write(
        tmp_path,
        "/etc/crio/crio.conf",
        '[crio.network]\nnetwork_dir = "/etc/cni/net.d/"\nplugin_dirs = ["/opt/cni/bin/"]\n',
    )
    write(
        tmp_path,
        "/etc/crio/crio.conf.d/10-crio.conf",
        '[crio.network]\nplugin_dirs = ["/usr/libexec/cni", "/opt/cni/bin"]\n',
    )
    write(
        tmp_path,
        "/etc/crio/crio.conf.d/20-site.conf",
        '[crio.network]\nnetwork_dir = "/etc/site/net.d"\nplugin_dir = "/opt/site/bin"\n',
    )
    write(tmp_path, "/etc/crio/crio.conf.d/30-other.conf", '[crio.api]\nlisten = "/run/c.sock"\n')
    configs = config.load(str(tmp_path))
    assert configs.warnings == ()
    drop_ins = tmp_path / "etc/crio/crio.conf.d"
    ten, twenty = drop_ins / "10-crio.conf", drop_ins / "20-site.conf"
    assert cni_dirs(configs) == (
        [("/etc/site/net.d", f"cri-o: {twenty}: [crio.network] network_dir")],
        [
            ("/usr/libexec/cni", f"cri-o: {ten}: [crio.network] plugin_dirs"),
            ("/opt/cni/bin", f"cri-o: {ten}: [crio.network] plugin_dirs"),
            ("/opt/site/bin", f"cri-o: {twenty}: [crio.network] plugin_dir"),
        ],
    )
    assert configs.cni_dirs.found == ((Runtime.CRIO, f"{tmp_path / 'etc/crio/crio.conf'} exists"),)


FALLBACK = (
    [("/etc/cni/net.d", "{r}: default (its config could not all be read)")],
    [
        (d, "{r}: default (its config could not all be read)")
        for d in ("/opt/cni/bin", "/usr/lib/cni", "/usr/libexec/cni")
    ],
)


@pytest.mark.parametrize(
    ("node_path", "text", "reason", "read"),
    [
        (
            "/etc/containerd/config.toml",
            f'version = 3\n[{CRI_V3}.cni]\nbin_dirs = "/opt/x"\nconf_dir = "/etc/x"\n',
            f"[{CRI_V3}.cni] bin_dirs is not a list of strings; ignored",
            (["/etc/x"], ["/opt/cni/bin"]),
        ),
        (
            "/etc/containerd/config.toml",
            f'version = 2\n[{CRI_V2}.cni]\nbin_dir = ["/opt/x"]\nconf_dir = 5\n',
            f"[{CRI_V2}.cni] conf_dir is not a string; ignored",
            (["/etc/cni/net.d"], ["/opt/cni/bin"]),
        ),
        (
            "/etc/containerd/config.toml",
            f'version = "2"\n[{CRI_V2}.cni]\nbin_dir = "/opt/x"\n',
            "version is not an integer; ignored",
            (["/etc/cni/net.d"], ["/opt/cni/bin"]),  # version 1 reads only [plugins.cri]
        ),
        (
            "/etc/containerd/config.toml",
            "[plugins\n",
            "not valid TOML",
            (["/etc/cni/net.d"], ["/opt/cni/bin"]),  # containerd's own, as with no config
        ),
        (
            "/etc/crio/crio.conf.d/10-x.conf",
            '[crio.network]\nplugin_dirs = ["/opt/x", 7]\nnetwork_dir = "/etc/x"\n',
            "[crio.network] plugin_dirs is not a list of strings; ignored",
            (["/etc/x"], ["/opt/cni/bin"]),
        ),
        (
            K3S_CONFIG,
            b"version = 2\n# \xff\n",
            "not UTF-8, so not TOML; not read",
            (
                ["/var/lib/rancher/k3s/agent/etc/cni/net.d"],
                ["/var/lib/rancher/k3s/data/current/bin"],
            ),
        ),
    ],
    ids=[
        "v3-bin_dirs-a-string",
        "v2-conf_dir-a-number",
        "version-a-string",
        "containerd-invalid",
        "crio-plugin_dirs-mixed",
        "k3s-not-utf8",
    ],
)
def test_a_cni_setting_that_cannot_be_read_is_a_warning_and_the_defaults_too(
    tmp_path: Path,
    node_path: str,
    text: str | bytes,
    reason: str,
    read: tuple[list[str], list[str]],
) -> None:
    """What the runtime reads there is unknown: the dirs read are kept, then the defaults the
    reaper would use with no runtime at all."""
    path = tmp_path / node_path.lstrip("/")
    path.parent.mkdir(parents=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    configs = config.load(str(tmp_path))
    (warning,) = [w for w in configs.warnings if reason in w]
    assert warning.startswith(f"{path}: ")
    ((runtime, _),) = configs.cni_dirs.found
    conf_dirs, bin_dirs = cni_dirs(configs)
    fallback_conf, fallback_bin = (
        [(d, s.format(r=runtime.value)) for d, s in dirs] for dirs in FALLBACK
    )
    assert conf_dirs[len(read[0]) :] == fallback_conf
    assert bin_dirs[len(read[1]) :] == fallback_bin
    assert [d for d, _ in conf_dirs[: len(read[0])]] == read[0]
    assert [d for d, _ in bin_dirs[: len(read[1])]] == read[1]


def test_cni_dirs_a_config_names_stay_inside_the_root(tmp_path: Path) -> None:
    node = tmp_path / "node"
    # The config itself is a symlink, absolute as the node names it: read inside the root.
    write(
        node,
        "/srv/containerd.toml",
        f'version = 2\n[{CRI_V2}.cni]\nbin_dir = "/opt/cni/bin"\nconf_dir = "/var/cni/net.d"\n'
        f'[{CRI_V2}.containerd.runtimes.kata]\ncni_conf_dir = "/etc/kata/../../../../outside"\n',
    )
    (node / "etc/containerd").mkdir(parents=True)
    (node / "etc/containerd/config.toml").symlink_to("/srv/containerd.toml")
    # /opt is an absolute symlink on the node: followed from here it would be this machine's.
    (node / "data/opt/cni/bin").mkdir(parents=True)
    (node / "opt").symlink_to("/data/opt")
    # A dir that a relative symlink takes out of the root is not used at all.
    (tmp_path / "outside-net.d").mkdir()
    (node / "var").mkdir()
    (node / "var/cni").symlink_to("../../outside-net.d")
    configs = config.load(str(node))
    source = f"{node / 'etc/containerd/config.toml'}: [{CRI_V2}.cni]"
    assert configs.warnings == (
        f"{source} conf_dir names /var/cni/net.d: "
        f"{node / 'var/cni/net.d'} leads out of {node}; not used",
    )
    conf_dirs, bin_dirs = configs.cni_dirs.conf_dirs, configs.cni_dirs.bin_dirs
    # ".." of a path named by a config stops at the node's own root, as the kernel's does.
    assert [(d.node_path, d.path) for d in conf_dirs] == [("/outside", str(node / "outside"))]
    assert [(d.node_path, d.path) for d in bin_dirs] == [
        ("/opt/cni/bin", str(node / "data/opt/cni/bin"))
    ]


# The runtimes' systemd units: a flag on the command line that moves the records, which the
# reaper does not follow, puts them in doubt; the stock units pass none.

K3S_INSTALLER_UNIT = """[Unit]
Description=Lightweight Kubernetes
Wants=network-online.target

[Install]
WantedBy=multi-user.target

[Service]
Type=notify
EnvironmentFile=-/etc/default/%N
EnvironmentFile=-/etc/sysconfig/%N
EnvironmentFile=-/etc/systemd/system/k3s.service.env
KillMode=process
ExecStartPre=/bin/sh -xc '! /usr/bin/systemctl is-enabled --quiet nm-cloud-setup.service'
ExecStartPre=-/sbin/modprobe br_netfilter
ExecStart=/usr/local/bin/k3s \\
    server \\
"""


def test_the_stock_units_move_nothing(tmp_path: Path) -> None:
    write(
        tmp_path,
        "/lib/systemd/system/containerd.service",
        "[Service]\nExecStart=/usr/bin/containerd\n",
    )
    write(tmp_path, "/etc/systemd/system/k3s.service", K3S_INSTALLER_UNIT)
    write(tmp_path, "/etc/systemd/system/k3s.service.env", "K3S_TOKEN=secret\n")
    write(tmp_path, "/etc/default/k3s", "")
    for root in ("/var/lib/containerd", "/var/lib/rancher/k3s/agent/containerd"):
        (tmp_path / root.lstrip("/")).mkdir(parents=True)
    configs = config.load(str(tmp_path))
    assert (configs.warnings, configs.records_in_doubt) == ((), ())


SERVICE = "[Service]\nExecStart="
ENVIRONMENT = "[Service]\nEnvironment="
SYSTEM = "/etc/systemd/system"


K3S_UNIT, K3S_AGENT = f"{SYSTEM}/k3s.service", f"{SYSTEM}/k3s-agent.service"
CONTAINERD_UNIT, CONTAINERD_DROP_IN = (
    f"{SYSTEM}/containerd.service",
    f"{SYSTEM}/containerd.service.d/1.conf",
)
RKE2_UNIT, RKE2_YAML = f"{SYSTEM}/rke2-server.service", "/etc/rancher/rke2/config.yaml"
K3S, CONTAINERD, RKE2 = Runtime.K3S, Runtime.CONTAINERD, Runtime.RKE2


@pytest.mark.parametrize(
    ("files", "runtime", "root"),
    [
        (
            {K3S_UNIT: K3S_INSTALLER_UNIT + "\t'--data-dir' \\\n\t'/s'\n"},
            K3S,
            "/s/agent/containerd",
        ),
        ({K3S_AGENT: f"{SERVICE}/usr/local/bin/k3s agent -d=/srv\n"}, K3S, "/srv/agent/containerd"),
        # INSTALL_K3S_EXEC="--disable traefik --cluster-init --data-dir /s": --disable takes
        # the next word, --cluster-init none (server.go), as Go's flag parser reads them.
        (
            {
                K3S_UNIT: K3S_INSTALLER_UNIT
                + "\t'--disable' \\\n\t'traefik' \\\n\t'--cluster-init' \\\n"
                "\t'--data-dir' \\\n\t'/s'\n"
            },
            K3S,
            "/s/agent/containerd",
        ),
        (
            {
                "/lib/systemd/system/containerd.service": f"{SERVICE}/usr/bin/containerd\n",
                CONTAINERD_DROP_IN: f"{SERVICE}\nExecStart=containerd --root /s\n",
            },
            CONTAINERD,
            "/s",
        ),
        (
            {CONTAINERD_UNIT: f"{SERVICE}containerd -c /c.toml\n", "/c.toml": "root = '/r'\n"},
            CONTAINERD,
            "/r",
        ),
        # A drop-in's empty ExecStart= drops the unit's own command line, and its flag.
        (
            {
                CONTAINERD_UNIT: f"{SERVICE}containerd --root /s\n",
                CONTAINERD_DROP_IN: f"{SERVICE}\nExecStart=containerd\n",
            },
            CONTAINERD,
            "/var/lib/containerd",
        ),
        # The command line's flag comes after config.yaml's, and wins.
        (
            {RKE2_UNIT: f"{SERVICE}rke2 server --data-dir=/cli\n", RKE2_YAML: "data-dir: /yaml\n"},
            RKE2,
            "/cli/agent/containerd",
        ),
    ],
)
def test_a_units_plain_command_line_is_followed(
    tmp_path: Path, files: dict[str, str], runtime: Runtime, root: str
) -> None:
    for node_path, text in files.items():
        write(tmp_path, node_path, text)
    (tmp_path / root.lstrip("/")).mkdir(parents=True)
    configs = config.load(str(tmp_path))
    assert (configs.warnings, configs.records_in_doubt) == ((), ())
    assert in_effect(configs, PathKind.PERSISTENT_ROOT, runtime) == [root]


def test_containerds_socket_and_state_on_its_command_line_are_watched(tmp_path: Path) -> None:
    unit = f"{SERVICE}/usr/bin/containerd -a /run/c/c.sock --state=/run/c\n"
    path = write(tmp_path, f"{SYSTEM}/containerd.service", unit)
    configs = config.load(str(tmp_path))
    sockets = located(configs, PathKind.SOCKET, Runtime.CONTAINERD)
    assert sockets["/run/c/c.sock"].in_effect and sockets["/run/c/c.sock"].source.startswith(
        str(path)
    )
    assert not sockets["/run/containerd/containerd.sock"].in_effect  # still watched
    assert in_effect(configs, PathKind.TASK_STATE, Runtime.CONTAINERD) == ["/run/c"]


@pytest.mark.parametrize(
    ("node_path", "text", "said", "runtime"),
    [
        (RKE2_UNIT, f"{SERVICE}/usr/local/bin/rke2 server $RKE2_ARGS\n", "a variable", "rke2"),
        (
            f"{SYSTEM}/rke2-server.service.d/x.conf",
            ENVIRONMENT + "RKE2_CONFIG_FILE=/c\n",
            "RKE2_",
            "rke2",
        ),
        (K3S_UNIT, f"{SERVICE}k3s server --config /k.yaml\n", "config", "k3s"),
        (K3S_UNIT, f"{SERVICE}k3s server --data-dir /x%i\n", "a specifier", "k3s"),
        (K3S_UNIT, f"{SERVICE}k3s server --data-dir\n", "data-dir", "k3s"),
        (K3S_UNIT, f"{SERVICE}k3s server '--data-dir'=/x\n", "a quote inside a word", "k3s"),
        (CONTAINERD_UNIT, f'{SERVICE}containerd --root "/a\\x20b"\n', "an escape", "containerd"),
        (K3S_UNIT, f"{SERVICE}k3s server -d /a\n", "both forms", "k3s"),
        # --node-label takes --data-dir as its value; /x then ends the flags.
        (K3S_UNIT, f"{SERVICE}k3s server --node-label --data-dir /x\n", "is not known", "k3s"),
        # urfave/cli v1 moves -x, no flag of k3s's, to the end: --node-label then takes
        # --data-dir as its value, and /a ends the flags (k3s keeps its default data dir).
        (K3S_UNIT, f"{SERVICE}k3s server --node-label -x --data-dir /a\n", "not known", "k3s"),
        # A flag whose type the reaper does not know.
        (K3S_UNIT, f"{SERVICE}k3s server --kine-tls --data-dir /x\n", "is not known", "k3s"),
    ],
)
def test_a_unit_that_moves_the_records_unplainly_puts_them_in_doubt(
    tmp_path: Path, node_path: str, text: str, said: str, runtime: str
) -> None:
    write(tmp_path, "/etc/rancher/k3s/config.yaml", "data-dir: /yaml\n")  # with -d: both forms
    write(tmp_path, "/lib/systemd/system/rke2-server.service", f"{SERVICE}rke2 server\n")
    path = write(tmp_path, node_path, text)
    configs = config.load(str(tmp_path))
    assert any(said in w for w in configs.warnings), configs.warnings
    assert any(str(path) in w for w in configs.warnings) or said == "both forms"
    assert any(d.startswith(f"{runtime}: ") for d in configs.records_in_doubt)


def test_a_runtime_its_unit_starts_whose_root_is_not_there_is_in_doubt(tmp_path: Path) -> None:
    """Its records on a volume not mounted yet (found by the second review of 2026-12-05)."""
    write(tmp_path, "/etc/systemd/system/k3s.service", K3S_INSTALLER_UNIT + "\t'-d' '/data'\n")
    (tmp_path / "data").mkdir()
    configs = config.load(str(tmp_path))
    assert any("/data/agent/containerd does not exist" in w for w in configs.warnings)
    assert [d for d in configs.records_in_doubt if d.startswith("k3s: ")]


def test_an_environment_file_that_moves_k3s_config_puts_it_in_doubt(tmp_path: Path) -> None:
    write(tmp_path, "/etc/systemd/system/k3s.service", K3S_INSTALLER_UNIT)
    env = write(tmp_path, "/etc/default/k3s", "K3S_CONFIG_FILE=/srv/k3s.yaml\n")
    configs = config.load(str(tmp_path))
    sets = "sets K3S_CONFIG_FILE or K3S_DATA_DIR, which the reaper does not follow"
    assert f"{env}: {sets}" in configs.warnings
    assert len(configs.records_in_doubt) == 1


def test_a_masked_unit_starts_nothing(tmp_path: Path) -> None:
    write(
        tmp_path,
        "/lib/systemd/system/containerd.service",
        "[Service]\nExecStart=/usr/bin/containerd --root /srv\n",
    )
    (tmp_path / "etc/systemd/system").mkdir(parents=True)
    (tmp_path / "etc/systemd/system/containerd.service").symlink_to("/dev/null")
    configs = config.load(str(tmp_path))
    assert (configs.warnings, configs.records_in_doubt) == ((), ())


def test_a_command_line_that_goes_on_to_the_end_of_the_file_is_read_whole() -> None:
    lines = units.read_unit("[Service]\nExecStart=/usr/local/bin/k3s \\\n  server \\\n  -d /x \\\n")
    words = units.command_words(lines.exec_start[0])
    assert words == ["/usr/local/bin/k3s", "server", "-d", "/x"]
    k3s = config.RUNTIME_UNITS[Runtime.K3S]
    assert units.command_flags(lines.exec_start[0], k3s) == [("d", "/x")]


def test_odd_unit_files_are_warnings_or_nothing_never_a_crash(tmp_path: Path) -> None:
    system = tmp_path / "etc/systemd/system"
    (system / "containerd.service").mkdir(parents=True)  # a dir where the unit goes
    (system / "k3s.service.d").write_text("")  # a file where the drop-in dir goes
    (system / "k3s-agent.service").symlink_to("k3s-agent.service")  # a loop
    (system / "rke2-server.service").symlink_to("/../../outside")  # stays inside the root
    os.mkfifo(system / "rke2-agent.service")
    configs = config.load(str(tmp_path))
    assert all("Traceback" not in w for w in configs.warnings)
    # Each unit that could not be read puts its runtime's records in doubt.
    doubted = {d.split(":")[0] for d in configs.records_in_doubt}
    assert doubted == {"containerd", "k3s", "rke2"}, configs.records_in_doubt


def test_a_unit_dir_that_leads_out_of_the_root_is_not_followed(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    write(outside, "/containerd.service", f"{SERVICE}containerd --root /elsewhere\n")
    root = tmp_path / "root"
    (root / "etc/systemd").mkdir(parents=True)
    (root / "etc/systemd/system").symlink_to("../../../outside")
    configs = config.load(str(root))
    assert not [w for w in configs.warnings if "--root" in w]
    assert [d for d in configs.records_in_doubt if d.startswith("containerd")]


def test_a_path_with_a_nul_in_a_config_is_a_warning_never_a_crash(tmp_path: Path) -> None:
    """TOML's \\u0000 makes a NUL in a string: os calls raise ValueError for it (no OSError).
    Found through a unit by the review of 2026-12-05; before, a dry run ended as a bug."""
    toml = (
        'version = 2\nroot = "/r\\u0000"\nstate = "/s\\u0000"\n[grpc]\naddress = "/a\\u0000"\n'
        '[plugins."io.containerd.grpc.v1.cri".cni]\nbin_dir = "/b\\u0000"\n'
    )
    write(tmp_path, "/etc/containerd/config.toml", toml)
    write(tmp_path, "/etc/crio/crio.conf", '[crio.network]\nplugin_dirs = ["/p\\u0000"]\n')
    configs = config.load(str(tmp_path))
    assert len([w for w in configs.warnings if "holds a NUL; ignored" in w]) == 5
    assert [d for d in configs.records_in_doubt if d.startswith("containerd")]
    assert not [p for p in configs.all_paths if "\0" in p.path]
