"""Every plugin a DEL runs, delegated IPAM plugins included, comes from a vetted plugin dir, and
CNI_PATH holds vetted dirs only: plugins exec other plugins from it. Real dirs, modes, owners and
symlinks; real plugins (bridge execs its IPAM plugin from CNI_PATH on DEL) and canaries."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from cni_reaper.netconf import NetworkList
from cni_reaper.plugin import (
    ChainPlugin,
    PluginDirs,
    PluginRefused,
    ProcessRunner,
    find_plugin,
    resolve_chain,
    vet_plugin_dirs,
)
from cni_reaper.repair.replay import Attachment, delete, plugin_env
from tests.libcni import add_network_list, reserved_ips
from tests.nodetree import CONTAINER_IDS, PLUGIN_DIR, have_plugins
from tests.private_node import cannot_run

NOBODY = 65534
CID = CONTAINER_IDS[3]


@pytest.fixture(autouse=True)
def _real_plugins() -> None:
    if not have_plugins():
        cannot_run(f"containernetworking-plugins is not installed in {PLUGIN_DIR}")


def need_root() -> None:
    if os.geteuid() != 0:
        cannot_run("giving a file to another user (chown) needs root")


def script(path: Path, body: str, mode: int = 0o755) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(mode)
    return path


def canary(path: Path, mode: int = 0o755) -> Path:
    """A plugin that leaves a file behind if anything ever runs it, and succeeds."""
    ran = path.parent.parent / f"{path.name}.ran"
    script(path, f"touch {ran}\n", mode)
    return ran


def tracer(bin_dir: Path, log: Path) -> None:
    """A chained plugin (as portmap is) that notes each DEL it takes part in."""
    script(bin_dir / "tracer", f'echo "$CNI_COMMAND $CNI_PATH" >> {log}\n')


def chain(ipam: dict[str, Any], name: str = "chain") -> NetworkList:
    """bridge with ipam, then a chained plugin: the shape of most node images' conflist."""
    plugins = ({"type": "bridge", "bridge": "cni-test0", "ipam": ipam}, {"type": "tracer"})
    return NetworkList(name, "1.0.0", plugins, "test")


def test_vetting_keeps_trusted_dirs_in_order_and_says_why_others_are_left_out(
    tmp_path: Path,
) -> None:
    good = tmp_path / "good"
    canary(good / "bridge")
    (good / "README").write_text("")
    (good / "README").chmod(0o666)  # nobody can make it executable: harmless
    (good / "subdir").mkdir(mode=0o777)  # not a plugin: a plugin name has no '/'
    (good / "subdir").chmod(0o777)
    (good / "dangling").symlink_to("gone")  # only root could create "gone" here
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    open_dir = tmp_path / "open"
    canary(open_dir / "bridge")
    open_dir.chmod(0o777)
    loose = tmp_path / "loose"
    canary(loose / "bridge", mode=0o775)
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "bridge").symlink_to(open_dir / "bridge")
    later = tmp_path / "later"
    later.mkdir()
    (later / "bridge").symlink_to(shared / "bridge")  # anyone could create it
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    colon = tmp_path / "x:y"
    colon.mkdir()

    vetted = vet_plugin_dirs(
        [
            str(good),
            str(tmp_path / "missing"),
            str(open_dir),
            str(loose),
            str(linked),
            str(later),
            str(a_file),
            str(colon),
            "relative/bin",
            str(good),
        ]
    )

    assert vetted.trusted == (str(good),)
    assert vetted.cni_path == str(good)
    assert vetted.missing == (str(tmp_path / "missing"),)
    assert dict(vetted.refused) == {
        str(open_dir): f"{open_dir} is writable by group or others (mode 0777)",
        str(loose): f"{loose / 'bridge'} is writable by group or others (mode 0775)",
        str(linked): f"{linked / 'bridge'} is a symlink, and {open_dir} is writable by group or "
        "others (mode 0777)",
        str(later): f"{later / 'bridge'} is a symlink, and {shared / 'bridge'} does not exist in "
        f"sticky dir {shared}, where anyone could create it",
        str(a_file): f"{a_file} is not a directory",
        str(colon): "its name cannot be put in CNI_PATH",
        "relative/bin": "'relative/bin' is not an absolute path",
    }
    assert vetted.to_json()["refused"][0] == {
        "dir": str(open_dir),
        "why": f"{open_dir} is writable by group or others (mode 0777)",
    }
    assert vetted.problems[0] == (
        f"plugin dir {open_dir} left out of CNI_PATH: {open_dir} is writable by group or others "
        "(mode 0777)"
    )


def test_vetting_refuses_a_dir_with_another_users_file(tmp_path: Path) -> None:
    need_root()
    theirs = tmp_path / "theirs"
    (theirs / "notes").parent.mkdir()
    (theirs / "notes").write_text("")
    (theirs / "notes").chmod(0o644)
    os.chown(theirs / "notes", NOBODY, NOBODY)  # not executable, until they chmod it

    vetted = vet_plugin_dirs([str(theirs)])

    assert vetted.refused == ((str(theirs), f"{theirs / 'notes'} is owned by uid {NOBODY}"),)


def test_the_chain_in_the_order_a_del_execs_it(tmp_path: Path) -> None:
    netlist = NetworkList(
        "n",
        "1.0.0",
        (
            {"type": "bridge", "ipam": {"type": "host-local"}},
            {"type": "macvlan", "ipam": {"type": "static"}},
            {"type": "portmap", "ipam": {"type": ""}},  # no IPAM, as bridge reads ""
        ),
        "test",
    )

    resolution = resolve_chain(netlist, vet_plugin_dirs([PLUGIN_DIR]))

    assert resolution.plugins == (
        ChainPlugin("portmap", 2, f"{PLUGIN_DIR}/portmap", None),
        ChainPlugin("macvlan", 1, f"{PLUGIN_DIR}/macvlan", None),
        ChainPlugin("static", 1, f"{PLUGIN_DIR}/static", None, ipam_of="macvlan"),
        ChainPlugin("bridge", 0, f"{PLUGIN_DIR}/bridge", None),
        ChainPlugin("host-local", 0, f"{PLUGIN_DIR}/host-local", None, ipam_of="bridge"),
    )
    assert resolution.problem is None
    assert resolution.to_json()["plugins"][2] == {
        "type": "static",
        "ipam_of": "macvlan",
        "path": f"{PLUGIN_DIR}/static",
        "problem": None,
    }


@pytest.mark.parametrize(
    ("ipam", "problem"),
    [
        (
            {"type": "nope"},
            f"ipam plugin 'nope' of 'bridge': failed to find plugin 'nope' in path "
            f"['{PLUGIN_DIR}']",
        ),
        ({"type": "../host-local"}, "ipam plugin '../host-local' of 'bridge': invalid plugin name"),
        ({"type": 5}, "ipam plugin '5' of 'bridge': invalid plugin name: 5"),
        ("host-local", "plugin 'bridge': its 'ipam' is not an object"),
    ],
)
def test_the_first_plugin_that_cannot_be_resolved_is_named(ipam: Any, problem: str) -> None:
    netlist = NetworkList("n", "1.0.0", ({"type": "bridge", "ipam": ipam},), "test")
    resolution = resolve_chain(netlist, vet_plugin_dirs([PLUGIN_DIR]))
    assert resolution.problem is not None
    assert resolution.problem.startswith(problem)


def untrusted_dir(tmp_path: Path, how: str) -> tuple[Path, Path]:
    """A plugin dir holding the canary "canary-ipam", untrusted in the way named."""
    evil = tmp_path / "evil"
    ran = canary(evil / "canary-ipam")
    if how == "world-writable-dir":
        evil.chmod(0o777)
    elif how == "group-writable-plugin":
        (evil / "canary-ipam").chmod(0o775)
    elif how == "writable-parent":
        # Whoever may write srv can rename evil away and put their own in its place.
        parent = tmp_path / "srv"
        parent.mkdir(mode=0o777)
        parent.chmod(0o777)
        evil = evil.rename(parent / "evil")
    elif how == "symlink-into-open-dir":
        open_dir = tmp_path / "open"
        open_dir.mkdir()
        (evil / "canary-ipam").rename(open_dir / "canary-ipam")
        open_dir.chmod(0o777)
        (evil / "canary-ipam").symlink_to("../open/canary-ipam")
    elif how == "owned-by-nobody":
        need_root()
        os.chown(evil / "canary-ipam", NOBODY, NOBODY)
    elif how != "trusted":
        raise ValueError(how)
    return evil, ran


UNTRUSTED = [
    "world-writable-dir",
    "group-writable-plugin",
    "writable-parent",
    "symlink-into-open-dir",
    "owned-by-nobody",
]


@pytest.mark.parametrize("how", UNTRUSTED)
def test_a_delegated_ipam_plugin_from_an_untrusted_dir_never_runs_nor_does_its_chain(
    tmp_path: Path, how: str
) -> None:
    """The canary is the IPAM type of a bridge chain: bridge would exec it from CNI_PATH. Its
    dir is left out, so it is not found, and no plugin of the chain runs: not even tracer,
    which a DEL runs first."""
    trusted = tmp_path / "trusted"
    log = tmp_path / "tracer.log"
    tracer(trusted, log)
    evil, ran = untrusted_dir(tmp_path, how)
    netlist = chain({"type": "canary-ipam"})
    vetted = vet_plugin_dirs([PLUGIN_DIR, str(trusted), str(evil)])
    planned = resolve_chain(netlist, vetted)

    outcome = delete(netlist, Attachment(CID, "eth0"), ProcessRunner(), vetted, timeout=10)

    assert not ran.exists()
    assert not log.exists()
    assert outcome.plugins_run == ()
    assert [(e.plugin, e.msg) for e in outcome.errors] == [("canary-ipam", planned.problem)]
    assert str(planned.problem).startswith(
        f"ipam plugin 'canary-ipam' of 'bridge': failed to find plugin 'canary-ipam' in path "
        f"['{PLUGIN_DIR}', '{trusted}']; plugin dir {evil} left out of CNI_PATH: "
    )
    assert str(evil) not in plugin_env(Attachment(CID, "eth0"), vetted)["CNI_PATH"].split(":")


def test_the_same_canary_in_a_trusted_dir_is_run_by_bridge(tmp_path: Path) -> None:
    """The control: from a trusted dir the delegated plugin is found and bridge execs it, so it
    is the vetting alone that keeps it from running above."""
    trusted = tmp_path / "trusted"
    log = tmp_path / "tracer.log"
    tracer(trusted, log)
    evil, ran = untrusted_dir(tmp_path, "trusted")
    netlist = chain({"type": "canary-ipam"})
    vetted = vet_plugin_dirs([PLUGIN_DIR, str(trusted), str(evil)])

    outcome = delete(netlist, Attachment(CID, "eth0"), ProcessRunner(), vetted, timeout=10)

    assert (outcome.ok, outcome.plugins_run) == (True, ("tracer", "bridge"))
    assert ran.exists()


def test_a_trusted_chain_runs_and_bridge_releases_the_address_through_host_local(
    tmp_path: Path,
) -> None:
    """Real plugins: bridge, with no netns, does only its IPAM DEL, execing host-local from
    CNI_PATH; host-local frees the address it reserved on ADD."""
    trusted = tmp_path / "trusted"
    log = tmp_path / "tracer.log"
    tracer(trusted, log)
    data_dir = tmp_path / "ipam"
    ipam = {
        "type": "host-local",
        "ranges": [[{"subnet": "10.66.0.0/24"}]],
        "dataDir": str(data_dir),
    }
    reserve = {
        "cniVersion": "1.0.0",
        "name": "chain",
        "plugins": [{"type": "host-local", "ipam": ipam}],
    }
    add_network_list(json.dumps(reserve).encode(), CID, "eth0", "/run/netns/x", tmp_path / "cni")
    assert reserved_ips(data_dir, "chain") == {"10.66.0.2": f"{CID}\r\neth0"}
    vetted = vet_plugin_dirs([PLUGIN_DIR, str(trusted)])

    outcome = delete(chain(ipam), Attachment(CID, "eth0"), ProcessRunner(), vetted, timeout=10)

    assert (outcome.ok, outcome.plugins_run, outcome.errors) == (True, ("tracer", "bridge"), ())
    assert reserved_ips(data_dir, "chain") == {}
    assert log.read_text() == f"DEL {PLUGIN_DIR}:{trusted}\n"


def test_plain_dirs_handed_to_delete_are_vetted_there(tmp_path: Path) -> None:
    """A caller that has not vetted the dirs once per run still gets no unvetted dir."""
    evil, ran = untrusted_dir(tmp_path, "world-writable-dir")
    netlist = NetworkList("n", "1.0.0", ({"type": "canary-ipam"},), "test")

    outcome = delete(netlist, Attachment(CID, "eth0"), ProcessRunner(), [str(evil)], timeout=10)

    assert not ran.exists()
    assert outcome.errors[0].msg == (
        f"plugin 'canary-ipam': no plugin dirs; plugin dir {evil} left out of CNI_PATH: {evil} is "
        "writable by group or others (mode 0777)"
    )
    env = plugin_env(Attachment(CID, "eth0"), [PLUGIN_DIR, str(evil)])
    assert env["CNI_PATH"] == PLUGIN_DIR
    assert plugin_env(Attachment(CID, "eth0"), PluginDirs(()))["CNI_PATH"] == ""


def test_find_plugin_keeps_to_the_plugin_dirs(tmp_path: Path) -> None:
    bin_dir = tmp_path / "opt/cni/bin"
    other = tmp_path / "other"
    script(other / "elsewhere", "exit 0\n")
    bin_dir.mkdir(parents=True)
    (bin_dir / "bridge").symlink_to(f"{PLUGIN_DIR}/bridge")
    (bin_dir / "escape").symlink_to(other / "elsewhere")
    dirs = [str(bin_dir), PLUGIN_DIR]

    # A link into another plugin dir is run by where it leads.
    assert find_plugin("bridge", dirs) == f"{PLUGIN_DIR}/bridge"
    with pytest.raises(PluginRefused, match="links outside the plugin dirs"):
        find_plugin("escape", dirs)
    for bad in ("a/b", "..", ".", "", "x\0"):
        with pytest.raises(PluginRefused, match="invalid plugin name"):
            find_plugin(bad, dirs)


def test_a_del_with_no_plugin_dir_there_names_the_dirs_it_looked_for(tmp_path: Path) -> None:
    """It said only "no plugin dirs", where an operator needs to know which were looked for
    (a root with none of the default dirs, a runtime config naming another). Found by an
    operator's review."""
    looked_for = [str(tmp_path / "opt/cni/bin"), str(tmp_path / "usr/lib/cni")]
    netlist = NetworkList("n", "1.0.0", ({"type": "ptp"},), "test")

    outcome = delete(netlist, Attachment(CID, "eth0"), ProcessRunner(), looked_for, timeout=10)

    assert outcome.errors[0].msg == (
        f"plugin 'ptp': no plugin dirs; not there: {looked_for[0]}, {looked_for[1]}"
    )
    assert outcome.plugins_run == ()
