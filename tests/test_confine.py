"""Plugins confined to a --root's CNI state (cni_reaper/repair/confine.py).

The layout rules are checked here directly. Everything that mounts runs as root in a
subprocess with a private mount namespace (tests/confine_scenario.py), whose "host" CNI state is
a tmpfs holding decoys: a bug can neither leave a mount on the machine nor touch its files.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni_reaper import host_local
from cni_reaper.netconf import NetworkConfigs, NetworkList
from cni_reaper.node_root import (
    PLUGIN_STATE_DIRS,
    RootBinds,
    bind_refusal,
    lies_in,
    nesting_refusal,
)
from cni_reaper.repair import confine
from tests.confine_scenario import HOST_STORE, IP, NETWORK, RESERVATION
from tests.nodetree import CONTAINER_IDS, have_plugins
from tests.private_node import cannot_run, unshare

REPO = Path(__file__).resolve().parent.parent
CONFINED_THREAD = confine.CONFINED_THREAD_NAME


def run_case(case: str, workdir: Path, *, unprivileged: bool = False) -> dict[str, Any]:
    if os.geteuid() != 0:
        cannot_run("needs root to make a private mount namespace")
    tools = ("unshare", "mount", "find", *(["setpriv"] if unprivileged else []))
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        cannot_run(f"needs {', '.join(missing)}")
    argv = [*unshare(), sys.executable]
    argv += ["-m", "tests.confine_scenario", case, str(workdir)]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def needs_host_local() -> None:
    if not have_plugins():
        cannot_run("needs Debian's containernetworking-plugins in /usr/lib/cni")


# The layout: pure, no privilege needed.


def test_root_slash_needs_no_confinement(tmp_path: Path) -> None:
    assert not confine.needs_confinement("/")
    assert not confine.needs_confinement("/.")
    assert confine.needs_confinement(str(tmp_path))
    with pytest.raises(ValueError, match="root / is the host itself"):
        confine.standard_binds("/")


def test_standard_binds_come_from_the_resolved_root_and_nested_targets_are_covered(
    tmp_path: Path,
) -> None:
    real = tmp_path / "disk"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    extra = [
        "/var/lib/cni/networks",
        "/var/lib/cni-ipam/",
        "/var/lib/cni-ipam/inner",
        "/run/cni-other",
    ]
    binds = confine.standard_binds(str(tmp_path / "link"), extra)
    assert {b.target for b in binds} == {
        "/var/lib/cni",
        "/etc/cni",
        "/run/netns",
        "/run/cni",
        "/var/lib/cni-ipam",
        "/run/cni-other",
    }
    for bind in binds:
        assert bind.source == str(real) + bind.target


@pytest.mark.parametrize(
    ("target", "why"),
    [
        ("/etc", "/etc is not in a dir of CNI's own"),  # ld.so.preload, for every loader
        ("/usr/lib/python3", "/usr/lib/python3 is not in a dir of CNI's own"),
        ("/srv/ipam", "/srv/ipam is not in a dir of CNI's own"),
        ("/var/lib", "/var/lib is not in a dir of CNI's own"),
        ("/var/lib/sss", "/var/lib/sss is not in a dir of CNI's own"),  # NSS's user database
        ("/run/systemd/journal", "is not in a dir of CNI's own"),  # the journal's socket
        ("/var/usrlocal/sbin", "is not in a dir of CNI's own"),  # /usr/local/sbin on ostree
        ("/var/lib/cni-app", "/var/lib/cni-app holds or lies in /var/lib/cni-app/site"),
        ("/var/lib/cni-app/site/cni_reaper", "lies in /var/lib/cni-app/site"),
    ],
)
def test_a_target_over_this_machines_code_or_config_is_never_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, target: str, why: str
) -> None:
    """Bound from a --root, a dir the node's config names stands for this machine's own in
    the namespace where the plugins and the reaper's thread run as root: only a place of
    variable state is, and none that holds or lies in a dir this interpreter imports from."""
    monkeypatch.syspath_prepend("/var/lib/cni-app/site")
    assert why in (bind_refusal(target) or "")
    with pytest.raises(confine.ConfineError, match="cannot confine plugins to"):
        confine.standard_binds(str(tmp_path), [target])
    ipam = {"type": "host-local", "dataDir": target}
    netlist = NetworkList("n", "1.0.0", ({"type": "bridge", "ipam": ipam},), "(test)")
    configs = NetworkConfigs({"n": netlist}, ())
    binds = RootBinds(str(tmp_path), host_local.data_dirs(configs))
    assert binds.data_dirs == ()
    assert why in host_local.store_problems(configs, binds)["n"]
    assert host_local.store_problems(configs, RootBinds("/", host_local.data_dirs(configs))) == {}


def test_a_target_given_by_an_iterator_is_refused_all_the_same(tmp_path: Path) -> None:
    """The targets are read twice, for the binds and for the refusal: an iterator's second
    reading is empty (found by the review of the change: /etc was bound)."""
    with pytest.raises(confine.ConfineError, match="/etc is not in a dir of CNI's own"):
        confine.standard_binds(str(tmp_path), (target for target in ["/etc"]))


@pytest.mark.parametrize("cwd", ["/var/lib/cni", "/etc/cni/net.d", "/run/cni"])
def test_a_standard_target_over_a_dir_python_imports_from_refuses_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cwd: str
) -> None:
    """`cd /var/lib/cni && python3 -m cni_reaper --root ...` puts /var/lib/cni first on
    sys.path: the root's dir mounted there would be imported from, as root, by the confined
    thread's first import of a module (found by the attack review of the binds: the node's
    queue.py ran). The run is refused, with what to do instead."""
    monkeypatch.syspath_prepend(cwd)
    with pytest.raises(confine.ConfineError) as refused:
        confine.standard_binds(str(tmp_path))
    assert "holds or lies in" in str(refused.value) and cwd in str(refused.value)
    assert str(refused.value).endswith("run it from another dir, or as the installed command")


def test_a_mount_point_that_cannot_be_made_is_told_before_the_run(tmp_path: Path) -> None:
    """What _hold_mount_point() would refuse the whole run for, told beforehand, so that a
    run leaves only that dataDir's network alone (the attack review of 2dee816, F5)."""
    (tmp_path / "file").write_bytes(b"")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    (tmp_path / "dir").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "dir")
    problem = confine.mount_point_problem
    assert problem(str(tmp_path / "file/ipam")) == (
        f"the mount point {tmp_path}/file/ipam cannot be made: {tmp_path}/file is no directory"
    )
    assert "file is no directory" in (problem(str(tmp_path / "file")) or "")
    assert problem(str(tmp_path / "dangling/ipam")) == (
        f"the mount point {tmp_path}/dangling/ipam cannot be made: {tmp_path}/dangling is a "
        "symbolic link to nothing"
    )
    for fine in ("dir", "dir/a/b", "link", "link/a", "new/a"):
        assert problem(str(tmp_path / fine)) is None, fine
    # The layout's own refusals, for one bind.
    assert "lies in the root itself" in (
        confine.bind_problem(str(tmp_path), str(tmp_path / "d")) or ""
    )
    kept = str(tmp_path / "dir/state")
    why = confine.bind_problem("/mnt/node", str(tmp_path / "dir"), [kept])
    assert why is not None and why.startswith(f"{kept}, which the reaper itself uses, lies under")


def test_a_data_dir_this_machines_symlinks_nest_otherwise_than_its_name_is_not_bound(
    tmp_path: Path,
) -> None:
    """confine.standard_binds leaves out a target that lies in another as this machine
    resolves them: the plugins then see the outer one's dir of the root, not the one read
    for the dataDir. So a dataDir is bound only where its name nests as its resolved path
    does (found by the attack review of 290d74f: a machine's /var/lib/cni-b -> cni-a had
    the DEL act on the root's cni-a store while cni-b's was read)."""
    (tmp_path / "cni-a").mkdir()
    (tmp_path / "cni-b").symlink_to(tmp_path / "cni-a")
    a, b = str(tmp_path / "cni-a"), str(tmp_path / "cni-b")
    assert nesting_refusal(a, [a, b]) is None
    why = nesting_refusal(b, [a, b])
    assert why is not None and why.startswith(f"{b} and {a} nest otherwise on this machine")
    if os.path.realpath("/var/run") == "/run":
        why = nesting_refusal("/var/run/cni/x", [])
        assert why is not None and why.startswith("/var/run/cni/x and /run/cni nest otherwise")
        binds = RootBinds("/mnt/node", ["/var/run/cni/x", "/run/cni/y"])
        assert binds.data_dirs == ("/run/cni/y",) and not binds.covers("/var/run/cni/x/n")


def test_a_mount_point_whose_name_is_too_long_is_told_before_the_run(tmp_path: Path) -> None:
    """mkdir would fail with ENAMETOOLONG and refuse the whole run (the attack review of
    290d74f: a node's config naming such a dataDir denied every network its repair)."""
    long_name = str(tmp_path / ("a" * 300) / "ipam")
    assert (confine.mount_point_problem(long_name) or "").endswith(
        f"is longer than {tmp_path} takes"
    )


_DATA_DIRS = st.sampled_from(
    [
        "/var/lib/cni/networks",
        "/var/lib/cni/x",
        "/var/lib/cni-a",
        "/var/lib/cni-a/b",
        "/var/lib/cni-a/b/c",
        "/var/lib/cni-b",
        "/run/cni-c",
        "/run/cni-c/d",
        "/run/cni/e",
        "/etc/cni-f",
        "/srv/cni-g",
        "/var/lib/sss",
    ]
)


@settings(max_examples=300, deadline=None)
@given(data_dirs=st.lists(_DATA_DIRS, max_size=8), blocked=st.sets(_DATA_DIRS, max_size=4))
def test_a_data_dir_is_bound_only_where_its_own_bind_is_sound(
    data_dirs: list[str], blocked: set[str]
) -> None:
    """Over every set of dataDirs and every set of places whose mount point cannot be made:
    each dataDir is seen by the plugins as the root has it, or refused with why, never both;
    none is bound that bind_refusal() refuses; one bound by a bind of its own (in no standard
    dir or other dataDir bound) is one cannot_bind() finds nothing against; and the binds
    made from them refuse no run."""
    asked: list[str] = []

    def cannot_bind(target: str) -> str | None:
        asked.append(target)
        hit = [b for b in blocked if target == b or target.startswith(b + "/")]
        return f"{hit[0]} is in the way" if hit else None

    binds = RootBinds("/mnt/node", data_dirs, cannot_bind)

    for data_dir in data_dirs:
        assert binds.covers(data_dir) != (data_dir in binds.refused), data_dir
    for data_dir in binds.data_dirs:
        assert bind_refusal(data_dir) is None and nesting_refusal(data_dir, data_dirs) is None
        outer = (*PLUGIN_STATE_DIRS, *(d for d in binds.data_dirs if d != data_dir))
        if not any(lies_in(data_dir, d) for d in outer):
            assert data_dir in asked and cannot_bind(data_dir) is None
    for data_dir, why in binds.refused.items():
        nesting = nesting_refusal(data_dir, data_dirs)
        assert why in (bind_refusal(data_dir), nesting, cannot_bind(data_dir))
    binds_made = confine.standard_binds("/mnt/node", binds.data_dirs)
    assert {b.target for b in binds_made} <= {*PLUGIN_STATE_DIRS, *binds.data_dirs}
    assert RootBinds("/", data_dirs, cannot_bind).covers("/anywhere")


def test_a_relative_target_is_a_bug(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not an absolute path"):
        confine.standard_binds(str(tmp_path), ["var/lib/ipam"])


def test_a_root_under_a_target_is_refused() -> None:
    with pytest.raises(confine.ConfineError) as refused:
        confine.standard_binds("/var/lib/cni/x")
    message = str(refused.value)
    assert message.startswith("cannot confine plugins to /var/lib/cni/x: the root lies under")
    assert "mount the node's disk somewhere outside /var/lib/cni" in message


def test_a_target_in_the_root_is_refused(tmp_path: Path) -> None:
    with pytest.raises(confine.ConfineError, match="/var/lib/cni lies in the root itself"):
        confine.standard_binds("/var")
    # A dataDir inside the root (here: the root itself) would hide the root's own files.
    with pytest.raises(confine.ConfineError, match="lies in the root itself"):
        confine.standard_binds(str(tmp_path), [str(tmp_path / "ipam")])
    with pytest.raises(confine.ConfineError, match="the root lies under /"):
        confine.standard_binds(str(tmp_path), ["/"])


def test_a_path_the_reaper_keeps_using_under_a_target_is_refused(tmp_path: Path) -> None:
    kept = ["/var/lib/cni/reaper-quarantine", str(tmp_path / "results")]
    with pytest.raises(confine.ConfineError) as refused:
        confine.standard_binds(str(tmp_path), kept_paths=kept)
    assert "/var/lib/cni/reaper-quarantine, which the reaper itself uses, lies under" in str(
        refused.value
    )
    confine.standard_binds(str(tmp_path), kept_paths=kept[1:])


def test_importing_it_loads_no_ctypes() -> None:
    """A boot-time run with root / never confines: it must not pay for ctypes."""
    code = "import sys, cni_reaper.repair.confine; print('ctypes' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# Real namespaces and mounts.


def test_host_local_del_releases_in_the_root_and_never_on_the_host(tmp_path: Path) -> None:
    needs_host_local()
    seen = run_case("release-in-root", tmp_path)
    assert seen["del_ok"], seen["del_errors"]
    # The real plugin, config without dataDir, released the root's reservation ...
    assert IP not in seen["root_store_after"]
    # ... and the host's identical one is untouched, before and after.
    assert seen["host_before"][str(HOST_STORE / IP)] == RESERVATION
    assert seen["host_after"] == seen["host_before"]
    root = seen["root"]
    assert f"/var/lib/cni/networks/{NETWORK}/lock" in seen["plugin_view"]
    assert "/etc/cni/net.d" in seen["plugin_view"]
    assert not [p for p in seen["plugin_view"] if "decoy" in p]
    assert seen["write_etc_cni_ok"]
    assert (Path(root) / "etc/cni/new-file").exists()
    # The root has no run/cni: an empty tmpfs stands there, and says so.
    assert seen["notes"] == [
        f"{root}/run/cni is missing: plugins see an empty /run/cni, whose writes are dropped"
    ]


def test_a_run_done_first_never_pulls_the_mount_point_from_under_another(
    tmp_path: Path,
) -> None:
    """Two runs on two roots at once (a rescue box repairing two disks), one dataDir missing
    on the host. The run that made its mount point ends while the other still stands on it:
    removing it would detach the other's mount (Linux 3.18 on), and the other's DEL would then
    make the dataDir on the host and release nothing in its root."""
    needs_host_local()
    seen = run_case("two-runs-one-mount-point", tmp_path)
    assert seen["first_in"] and seen["first_done_first"]
    assert seen["del_ok"], seen["del_errors"]
    # The DEL released the second root's reservation, and only that.
    assert seen["second_store_after"] == ["lock"], seen
    assert seen["first_store_after"] == [IP]
    assert IP not in seen["plugin_view"] and "lock" in seen["plugin_view"]
    # The mount point, still stood on when its maker ended, was left to the second run, which
    # removed it when it was done: it is marked as made by a run in this boot.
    assert seen["host_data_dir_after"] is None


def test_only_the_confined_threads_and_their_processes_see_the_root(tmp_path: Path) -> None:
    needs_host_local()
    seen = run_case("release-in-root", tmp_path)
    caller = seen["caller_namespace_before"]
    assert seen["work_namespace"] != caller
    assert seen["namespace"] == seen["work_namespace"]  # a thread work() started
    # While work() was inside, a thread of the caller's still saw the host's store, as did
    # a process it started.
    assert seen["outside"]["namespace"] == caller
    assert IP in seen["outside"]["store"]
    assert seen["outside"]["cat"] == RESERVATION
    assert seen["caller_namespace_after"] == caller
    assert seen["caller_mounts_unchanged"]
    # The confined thread went to / (it has a working directory of its own): the caller's
    # is where it was.
    assert seen["cwd"] == "/"
    assert seen["caller_cwd_unchanged"]


def test_untrusted_sources_become_empty_read_only_tmpfs_with_a_note(tmp_path: Path) -> None:
    needs_host_local()
    seen = run_case("untrusted-sources", tmp_path)
    root = str(tmp_path / "root")
    empty = "plugins see an empty, read-only"
    assert sorted(seen["notes"]) == sorted(
        [
            f"{root}/etc/cni is not a directory: {empty} /etc/cni",
            f"{root}/run/cni is reached through a symbolic link ({root}/run): {empty} /run/cni",
            f"{root}/run/netns is reached through a symbolic link ({root}/run): {empty} /run/netns",
            f"{root}/var/lib/cni is reached through a symbolic link: {empty} /var/lib/cni",
        ]
    )
    assert seen["plugin_view"] == []  # no host file, though every symlink pointed at one
    assert not seen["write_etc_cni_ok"]
    # host-local found no store it could write to; the host's reservation stays.
    assert not seen["del_ok"]
    assert seen["host_after"] == seen["host_before"]


def test_without_privilege_it_refuses_with_a_sentence(tmp_path: Path) -> None:
    seen = run_case("unprivileged", tmp_path, unprivileged=True)
    assert seen["uid"] == 65534
    assert not seen["work_ran"]
    assert seen["error"] == (
        f"cannot confine plugins to {tmp_path / 'root'}: cannot make a private mount namespace "
        "(unshare: Operation not permitted; it needs root with CAP_SYS_ADMIN); "
        f"{confine.ADVICE}"
    )


def test_a_mount_point_the_host_cannot_make_refuses_and_leaves_nothing(tmp_path: Path) -> None:
    seen = run_case("read-only-host", tmp_path)
    assert seen["error"] == (
        f"cannot confine plugins to {tmp_path / 'root'}: cannot make the mount point "
        f"/run/cni-read-only/ipam: Read-only file system; {confine.ADVICE}"
    )
    assert not seen["work_ran"]
    assert seen["caller_mounts_unchanged"]
    assert not seen["made_here_left"]  # made for the first dataDir, removed again


def test_an_exception_in_work_is_raised_in_the_caller(tmp_path: Path) -> None:
    seen = run_case("work-raises", tmp_path)
    assert seen["raised"] == "LookupError"
    assert seen["message"] != f"raised in {seen['caller_namespace_before']}"
    assert seen["caller_namespace_after"] == seen["caller_namespace_before"]
    assert CONFINED_THREAD not in seen["threads_left"]


def test_an_interrupt_cancels_the_work_and_waits_for_it(tmp_path: Path) -> None:
    seen = run_case("interrupted", tmp_path)
    assert seen["interrupted"]
    times = seen["times"]
    assert times["cancel_seen"] >= times["interrupt_sent"]
    assert times["work_done"] <= times["caught"]
    assert CONFINED_THREAD not in seen["threads_at_catch"]


# The whole reaper, as an operator runs it on a rescue machine.


def test_the_reaper_repairs_a_rescued_disk_and_never_the_machine_it_runs_on(
    tmp_path: Path,
) -> None:
    needs_host_local()
    seen = run_case("rescued-disk", tmp_path)
    assert seen["exit"] == 0, seen["stderr"]
    (entry,) = seen["report"]["entries"]
    assert (entry["action"], entry["outcome"]) == ("del-and-quarantine", "done")
    assert entry["del"]["released"] == [IP]
    assert seen["root_store_after"] == ["last_reserved_ip.0", "lock"] or seen[
        "root_store_after"
    ] == ["lock"]
    assert seen["host_after"] == seen["host_before"]
    assert seen["host_after"][str(HOST_STORE / IP)] == RESERVATION


def test_the_reaper_refuses_a_rescued_disk_it_cannot_confine(tmp_path: Path) -> None:
    seen = run_case("rescued-disk-without-sys-admin", tmp_path, unprivileged=True)
    assert seen["exit"] == 75, seen["stderr"]
    assert "cannot make a private mount namespace" in seen["stderr"]
    assert seen["report"]["error"]["exit_code"] == 75
    assert "cannot confine plugins" in seen["report"]["error"]["message"]
    assert seen["results_after"] == [f"{NETWORK}-{CONTAINER_IDS[0]}-eth0"]
    assert seen["root_store_after"] == [IP]


# Attacks on the shared mount points (several runs on several roots at once).

MADE_HERE = "/run/cni-made-here"
SHARED = f"{MADE_HERE}/ipam"


def released_in_own_root(run: dict[str, Any]) -> None:
    assert run["error"] is None, run
    assert run["del_ok"], run["del_errors"]
    assert run["store_after"] == ["lock"], run
    assert run["plugin_view"] == ["lock"], run


def test_three_runs_one_mount_point_each_releases_in_its_own_root(tmp_path: Path) -> None:
    """A makes the dataDir, B and C mount on it; A is done, then B, then C, each DEL after
    the runs before it were done."""
    needs_host_local()
    seen = run_case("three-runs-one-mount-point", tmp_path)
    assert seen["entered"] == [True] * 3 and seen["finished"] == [True] * 3
    for run in seen["runs"].values():
        released_in_own_root(run)
    assert seen["host_after"][str(HOST_STORE / IP)] == RESERVATION
    # The maker was done first, while others stood on its mount points: the last run out
    # removed them.
    assert seen["made_here_left"] == []
    assert seen["host_data_dir_after"] is None


def test_the_maker_done_last_removes_what_it_made(tmp_path: Path) -> None:
    needs_host_local()
    seen = run_case("maker-outlives-the-other", tmp_path)
    assert seen["entered"] == [True, True] and seen["finished"] == [True, True]
    released_in_own_root(seen["a"])
    released_in_own_root(seen["b"])
    assert seen["made_here_left"] == []


@pytest.mark.parametrize("order", ["outer-first", "inner-first"])
def test_nested_targets_of_two_runs_each_release_in_its_own_root(
    tmp_path: Path, order: str
) -> None:
    """One run's dataDir (/run/cni-made-here) is a parent of the other's (/run/cni-made-here/ipam);
    the one in first is done first, then the other DELs."""
    needs_host_local()
    seen = run_case(f"nested-{order}", tmp_path)
    assert seen["entered"] == [True, True] and seen["finished"] == [True, True]
    released_in_own_root(seen["outer"])
    released_in_own_root(seen["inner"])


@pytest.mark.parametrize("order", ["outer-first", "inner-first"])
def test_nested_targets_of_two_runs_leave_nothing(tmp_path: Path, order: str) -> None:
    """When the first run was done, the other's dir was still in /run/cni-made-here (or the other
    stood on it), so the first left it; the other, done last, removes it with its own, made
    by a run in this boot. Until marks (2026-12-03) it was left behind, empty."""
    needs_host_local()
    seen = run_case(f"nested-{order}", tmp_path)
    assert seen["left_while_second_in"] != []
    assert seen["made_here_left"] == []


def test_a_maker_whose_work_raises_leaves_the_other_its_mount(tmp_path: Path) -> None:
    needs_host_local()
    seen = run_case("work-raises-while-another-stands", tmp_path)
    assert seen["a"]["error"] == "LookupError: work failed"
    assert seen["left_while_b_in"] == [MADE_HERE, SHARED]
    released_in_own_root(seen["b"])


def test_an_interrupted_maker_leaves_the_other_its_mount(tmp_path: Path) -> None:
    needs_host_local()
    seen = run_case("interrupted-while-another-stands", tmp_path)
    assert seen["a_interrupted"] and seen["cancel_seen"] and seen["b_entered"]
    assert seen["left_while_b_in"] == [MADE_HERE, SHARED]
    released_in_own_root(seen["b"])


def test_two_runs_racing_to_make_the_same_mount_points(tmp_path: Path) -> None:
    """Each mkdir of /run/cni-made-here and /run/cni-made-here/ipam waits for the other
    run's: one of each pair gets FileExistsError, and neither run is refused."""
    needs_host_local()
    seen = run_case("racing-mkdir", tmp_path)
    assert seen["entered"] == [True, True] and seen["finished"] == [True, True]
    outcomes = sorted(what for _, _, what in seen["mkdir"])
    assert outcomes == ["FileExistsError", "FileExistsError", "made", "made"], seen["mkdir"]
    released_in_own_root(seen["a"])
    released_in_own_root(seen["b"])


def test_a_mount_point_chain_made_by_two_runs_leaves_nothing(tmp_path: Path) -> None:
    """A made /run/cni-made-here, B made /run/cni-made-here/ipam in it (A's mkdir: FileExistsError).
    A is done first, while B stands on ipam: made-here must stay while B is in. Once B is
    done, B removes the ipam it made, and made-here, A's, marked as made in this boot."""
    needs_host_local()
    seen = run_case("split-chain", tmp_path)
    assert seen["mkdir"] == [
        ["a", MADE_HERE, "made"],
        ["b", SHARED, "made"],
        ["a", SHARED, "FileExistsError"],
    ]
    released_in_own_root(seen["a"])
    released_in_own_root(seen["b"])
    assert seen["left_while_b_in"] == [MADE_HERE, SHARED]
    assert seen["made_here_left"] == []


def test_the_hosts_own_symlinks_are_followed_as_before(tmp_path: Path) -> None:
    needs_host_local()
    seen = run_case("symlinked-host-paths", tmp_path)
    released_in_own_root(seen["linked"])
    released_in_own_root(seen["under_link"])
    assert seen["host_decoy"] == RESERVATION.replace("\r", "") or seen["host_decoy"] == RESERVATION
    assert seen["real_parent_after"] == []  # made through the symlink, removed again
    assert seen["linked_is_symlink"]


def test_a_target_that_is_a_host_mount_point(tmp_path: Path) -> None:
    needs_host_local()
    seen = run_case("host-mount-point-target", tmp_path)
    released_in_own_root(seen["run"])
    assert seen["host_decoy"] in (RESERVATION, RESERVATION.replace("\r", ""))
    assert seen["still_mounted"]


def test_a_parent_removed_while_the_run_makes_the_mount_point(tmp_path: Path) -> None:
    needs_host_local()
    seen = run_case("parent-removed-while-making", tmp_path)
    released_in_own_root(seen["once"])
    assert seen["left_after_once"] == []
    assert seen["always"]["error"].startswith("ConfineError: ")
    assert "kept being removed" in seen["always"]["error"]
    assert not seen["always_work_ran"]
    assert seen["always_seconds"] < 1.0 + 1.5  # MOUNT_POINT_WAIT, set to 1.0 in the case
    assert seen["fds_leaked"] == []
    assert seen["left_after_always"] == []
    assert seen["always"]["store_after"] == [IP]


def test_no_descriptor_or_lock_is_left_whatever_the_outcome(tmp_path: Path) -> None:
    seen = run_case("no-fd-or-lock-left", tmp_path)
    outcomes = seen["outcomes"]
    assert outcomes["ok"] is None
    assert outcomes["raises"] == "LookupError: boom"
    assert outcomes["read_only"].startswith("ConfineError: ")
    assert outcomes["held_exclusively"].startswith("ConfineError: ")
    assert "another process held it exclusively (flock)" in outcomes["held_exclusively"]
    assert seen["seconds"]["held_exclusively"] < 0.5 + 1.5  # MOUNT_POINT_WAIT 0.5 here
    assert seen["fds_leaked"] == []
    assert seen["locks_after"] == seen["locks_before"]  # only the case's own blocker
    assert all(seen["lockable_after"].values()), seen["lockable_after"]
    assert seen["made_here_left"] == [MADE_HERE, f"{MADE_HERE}/held"]  # the case's own


def test_a_dangling_symlink_target_is_refused_at_once(tmp_path: Path) -> None:
    """Before the fix, mount (or mkdir under it) failed with ENOENT at once; it must still be
    a ConfineError, not a wait for a removal that never happens."""
    seen = run_case("dangling-symlink-target", tmp_path)
    for name in ("dangling", "under_dangling"):
        assert seen[name]["error"].startswith("ConfineError: "), seen[name]
        assert not seen[name]["work_ran"]
        assert "kept being removed" not in seen[name]["error"], seen[name]["error"]
        assert seen[name]["seconds"] < 1.0, seen[name]
    assert not seen["nowhere_made"]


def test_a_mount_point_no_run_stands_on_is_not_left_behind(tmp_path: Path) -> None:
    """A made /run/cni-made-here/a and /run/cni-made-here/b; B stood on b only. b stays
    for B while B is in; a, which no run stands on, must go when A is done."""
    needs_host_local()
    seen = run_case("left-behind-when-none-stands", tmp_path)
    released_in_own_root(seen["a"])
    released_in_own_root(seen["b"])
    assert f"{MADE_HERE}/a" not in seen["left_while_b_in"], seen["left_while_b_in"]
    assert f"{MADE_HERE}/a" not in seen["made_here_left"], seen["made_here_left"]


def test_many_runs_at_random_moments_each_release_in_their_own_root(tmp_path: Path) -> None:
    needs_host_local()
    seen = run_case("many-runs-at-random", tmp_path)
    assert seen["failures"] == []
    assert seen["host_after"] == seen["host_before"]
    # Runs in and out at random: a mark left before a run came is not its to act on, and a
    # run done while another's namespace still shows a mount there leaves it. What stays is
    # an empty dir, never a mount detached from under a run.
    assert seen["host_data_dir_after"] in (None, [])


def test_a_mount_point_left_in_another_boot_is_left(tmp_path: Path) -> None:
    """Only a mark of this boot hands a mount point to whichever run is last out: one left in
    another boot may be anyone's since."""
    needs_host_local()
    seen = run_case("marked-in-another-boot", tmp_path)
    assert seen["entered"] and seen["finished"]
    released_in_own_root(seen["a"])
    assert seen["made_here_left"] == [MADE_HERE, SHARED]


def test_where_no_mark_can_be_kept_only_the_maker_removes(tmp_path: Path) -> None:
    """A ramfs keeps no extended attribute: the maker, done while the other stood on its
    mount points, leaves them, and the other, which did not make them, leaves them too."""
    needs_host_local()
    seen = run_case("unmarkable-mount-points", tmp_path)
    assert seen["entered"] == [True, True] and seen["finished"] == [True, True]
    released_in_own_root(seen["a"])
    released_in_own_root(seen["b"])
    assert seen["left"] == ["/run/cni-no-marks/made", "/run/cni-no-marks/made/ipam"]


def test_a_killed_runs_mount_point_is_not_adopted_by_a_later_run(tmp_path: Path) -> None:
    """A run killed while it stood on a mount point it made marked nothing: a later run on
    another root leaves it, and a service that mounted on it since keeps its mount."""
    needs_host_local()
    seen = run_case("crashed-maker-not-adopted", tmp_path)
    assert seen["killed_status"] == -9
    assert seen["left_by_the_crash"] == [MADE_HERE, SHARED]
    assert seen["service_up"] == "up"
    assert seen["entered"] and seen["finished"]
    released_in_own_root(seen["later"])
    assert seen["service_sees"] == "live"
    assert seen["made_here_left"] == [MADE_HERE, SHARED]


def test_a_mark_found_on_coming_is_not_acted_on(tmp_path: Path) -> None:
    """A left its mount point to B, which was then killed: nothing says that no one mounted
    on it since. C, which found the mark when it came, leaves it, and a service that
    mounted on it in the meantime keeps its mount."""
    needs_host_local()
    seen = run_case("killed-stander-not-adopted", tmp_path)
    assert seen["a_in"] and seen["b_in"] == "in" and seen["a_finished"]
    released_in_own_root(seen["a"])
    assert seen["left_after_a"] == [MADE_HERE, SHARED]  # B still stood on it
    assert seen["b_status"] == -9
    assert seen["service_up"] == "up"
    assert seen["c_in"] and seen["c_finished"]
    released_in_own_root(seen["c"])
    assert seen["service_sees"] == "live"
    assert seen["made_here_left"] == [MADE_HERE, SHARED]


def test_a_mount_another_namespace_made_on_a_mount_point_is_never_detached(
    tmp_path: Path,
) -> None:
    """The run that made a mount point leaves it where another mount namespace, not a run's,
    has mounted on it since: the rmdir would detach that mount there."""
    needs_host_local()
    seen = run_case("service-mounts-while-a-run-stands", tmp_path)
    assert seen["entered"] and seen["service_up"] == "up" and seen["finished"]
    released_in_own_root(seen["a"])
    assert seen["service_sees"] == "live"
    assert seen["made_here_left"] == [MADE_HERE, SHARED]


def test_two_runs_done_at_once_leave_no_shared_parent(tmp_path: Path) -> None:
    """A holds the shared parent exclusively for a moment, its rmdir failing, just when B
    is done: B waits that moment out and removes the parent A left to it."""
    needs_host_local()
    seen = run_case("finishing-together", tmp_path)
    assert seen["entered"] == [True, True] and seen["finished"] == [True, True]
    assert seen["a_failed_in_time"]
    released_in_own_root(seen["a"])
    released_in_own_root(seen["b"])
    assert seen["made_here_left"] == []


def test_a_host_symlink_swapped_before_the_rmdir_never_costs_the_admin_a_dir(
    tmp_path: Path,
) -> None:
    needs_host_local()
    seen = run_case("symlink-swapped-before-rmdir", tmp_path)
    assert seen["entered"] and seen["finished"]
    assert seen["swapped"], "the rmdir the swap waits for never came"
    released_in_own_root(seen["a"])
    root = MADE_HERE
    # The dir the run made, through the link as it was, is gone; the admin's is there.
    assert seen["made_here_left"] == [
        root,
        f"{root}/link",
        f"{root}/real1",
        f"{root}/real2",
        f"{root}/real2/ipam",
    ]
