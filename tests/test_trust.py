"""The trusted-path walk (trust.resolve_trusted) on real dirs, files, modes, owners and symlinks:
it resolves a path as the kernel does, and names the first thing on the way that someone other
than root could have changed."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni_reaper.trust import MAX_SYMLINKS, resolve_trusted, untrusted, untrusted_path
from tests.private_node import cannot_run

NOBODY = 65534


def need_root() -> None:
    if os.geteuid() != 0:
        cannot_run("giving a file to another user (chown) needs root")


def plugin_in(directory: Path, name: str = "plugin") -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    plugin = directory / name
    plugin.write_text("#!/bin/sh\n")
    plugin.chmod(0o755)
    return plugin


def test_a_trusted_path_is_resolved_to_itself(tmp_path: Path) -> None:
    plugin = plugin_in(tmp_path / "opt/cni/bin")

    found = resolve_trusted(str(plugin))

    assert (found.resolved, found.problem, found.exists) == (str(plugin), None, True)
    assert untrusted_path(str(plugin)) is None
    # /tmp, 1777, is passed through: its next component is root's (or the reaper user's).
    assert str(tmp_path).startswith(tempfile.gettempdir())


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_dir_others_can_write_anywhere_up_the_path_is_named(tmp_path: Path, mode: int) -> None:
    """Whoever may write /opt can rename /opt/cni away and put a cni/bin/plugin of their own in
    its place: the plugin and its own dir being root's 0755 is worth nothing."""
    plugin = plugin_in(tmp_path / "opt/cni/bin")
    (tmp_path / "opt").chmod(mode)

    problem = untrusted_path(str(plugin))

    assert problem == f"{tmp_path / 'opt'} is writable by group or others (mode {mode:04o})"


def test_the_object_at_the_end_must_be_trusted(tmp_path: Path) -> None:
    plugin = plugin_in(tmp_path / "bin")
    plugin.chmod(0o757)
    assert untrusted_path(str(plugin)) == f"{plugin} is writable by group or others (mode 0757)"
    plugin.chmod(0o755)
    (tmp_path / "bin").chmod(0o1777)  # sticky, but as the object asked for it is plain shared
    assert untrusted_path(str(tmp_path / "bin")) == (
        f"{tmp_path / 'bin'} is writable by group or others (mode 1777)"
    )


def test_dirs_and_files_of_another_user(tmp_path: Path) -> None:
    need_root()
    plugin = plugin_in(tmp_path / "opt/cni/bin")
    os.chown(tmp_path / "opt/cni", NOBODY, NOBODY)
    assert untrusted_path(str(plugin)) == f"{tmp_path / 'opt/cni'} is owned by uid {NOBODY}"
    os.chown(tmp_path / "opt/cni", 0, 0)
    os.chown(plugin, NOBODY, NOBODY)
    assert untrusted_path(str(plugin)) == f"{plugin} is owned by uid {NOBODY}"


def test_a_sticky_dir_is_passed_only_to_what_root_owns_in_it(tmp_path: Path) -> None:
    need_root()
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    mine = plugin_in(shared / "mine")
    theirs = plugin_in(shared / "theirs")
    os.chown(shared / "theirs", NOBODY, NOBODY)
    (shared / "their-link").symlink_to("mine")
    os.lchown(shared / "their-link", NOBODY, NOBODY)

    assert untrusted_path(str(mine)) is None
    assert untrusted_path(str(theirs)) == (
        f"{shared / 'theirs'} is owned by uid {NOBODY} in sticky dir {shared}"
    )
    # They may not rename "mine" away, but their own link they may point anywhere at any time.
    assert untrusted_path(str(shared / "their-link/plugin")) == (
        f"{shared / 'their-link'} is owned by uid {NOBODY} in sticky dir {shared}"
    )
    # A name not yet there is theirs to create.
    found = resolve_trusted(str(shared / "later/plugin"))
    assert not found.exists
    assert found.problem == (
        f"{shared / 'later'} does not exist in sticky dir {shared}, where anyone could create it"
    )
    os.chown(shared, NOBODY, NOBODY)  # its owner may remove anything in it
    assert untrusted_path(str(mine)) == f"sticky dir {shared} is owned by uid {NOBODY}"


def test_a_symlink_in_a_trusted_dir_into_a_dir_others_write(tmp_path: Path) -> None:
    evil = plugin_in(tmp_path / "evil", "bridge")
    (tmp_path / "evil").chmod(0o777)
    bin_dir = tmp_path / "opt/cni/bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "absolute").symlink_to(evil)
    (bin_dir / "relative").symlink_to("../../../evil/bridge")
    (bin_dir / "dotdot-dir").symlink_to("..")

    expected = f"{tmp_path / 'evil'} is writable by group or others (mode 0777)"
    assert untrusted_path(str(bin_dir / "absolute")) == expected
    assert untrusted_path(str(bin_dir / "relative")) == expected
    # `..` is taken from where the link leads, not by trimming the text of the path.
    assert untrusted_path(str(bin_dir / "dotdot-dir/../../evil/bridge")) == expected


def test_symlinks_resolved_to_where_the_kernel_goes(tmp_path: Path) -> None:
    real = plugin_in(tmp_path / "usr/lib/cni", "bridge")
    (tmp_path / "opt/cni").mkdir(parents=True)
    (tmp_path / "opt/cni/bin").symlink_to("../../usr/lib/cni")
    (tmp_path / "usr/lib/cni/alias").symlink_to(real)

    # bin/.. is usr/lib, where the link leads, not opt/cni.
    for path in ("opt/cni/bin/bridge", "opt/cni/bin/alias", "opt/cni/bin/../cni/bridge"):
        found = resolve_trusted(str(tmp_path / path))
        assert (found.resolved, found.problem) == (str(real), None)
        assert found.resolved == os.path.realpath(tmp_path / path)
    found = resolve_trusted(str(tmp_path / "opt/cni/bin"))
    assert (found.resolved, found.problem) == (str(tmp_path / "usr/lib/cni"), None)
    assert resolve_trusted("/../../" + str(real)).resolved == str(real)


def test_symlink_hops_are_bounded_as_the_kernel_bounds_them(tmp_path: Path) -> None:
    target = plugin_in(tmp_path / "bin")
    for n in range(MAX_SYMLINKS + 1):
        (tmp_path / f"hop{n}").symlink_to(f"hop{n + 1}" if n < MAX_SYMLINKS else target)
    (tmp_path / "loop-a").symlink_to("loop-b")
    (tmp_path / "loop-b").symlink_to("loop-a")

    assert resolve_trusted(str(tmp_path / "hop1")).resolved == str(target)  # 40 links
    assert untrusted_path(str(tmp_path / "hop0")) == (
        f"{tmp_path / 'hop0'}: too many levels of symbolic links"
    )
    assert untrusted_path(str(tmp_path / "loop-a")) == (
        f"{tmp_path / 'loop-a'}: too many levels of symbolic links"
    )
    with pytest.raises(OSError, match="Too many levels"):
        (tmp_path / "hop0").stat()  # the kernel agrees on the bound


def test_what_is_not_there(tmp_path: Path) -> None:
    (tmp_path / "dangling").symlink_to("nowhere/plugin")
    (tmp_path / "file").write_text("")

    found = resolve_trusted(str(tmp_path / "dangling"))
    assert (found.exists, found.problem, found.resolved) == (
        False,
        None,
        str(tmp_path / "nowhere/plugin"),
    )
    assert untrusted_path(str(tmp_path / "dangling")) == (
        f"{tmp_path / 'nowhere/plugin'} does not exist"
    )
    assert (
        untrusted_path(str(tmp_path / "file/plugin")) == f"{tmp_path / 'file'} is not a directory"
    )
    assert untrusted_path("relative/bin") == "'relative/bin' is not an absolute path"


def test_the_walk_leaves_no_descriptor_open(tmp_path: Path) -> None:
    plugin_in(tmp_path / "bin")
    (tmp_path / "loop").symlink_to("loop")
    (tmp_path / "open").mkdir(mode=0o777)
    (tmp_path / "open").chmod(0o777)
    before = sorted(os.listdir("/proc/self/fd"))
    for name in ("bin/plugin", "loop", "open/x", "bin/plugin/x", "missing/x", "bin/.."):
        resolve_trusted(str(tmp_path / name))
    assert sorted(os.listdir("/proc/self/fd")) == before


# Random symlinks (relative and absolute, with ".." and loops) in a fixed tree of dirs: where the
# walk leads is where the kernel leads, as os.path.realpath and os.path.exists see it.
TREE = ["a/b/c", "d"]
LINK_DIRS = ["", "a", "a/b", "d"]
LINK_NAMES = ["l1", "l2", "l3"]
component = st.sampled_from(["a", "b", "c", "d", *LINK_NAMES, "..", "."])
relative = st.lists(component, min_size=1, max_size=4).map("/".join)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    links=st.lists(
        st.tuples(st.sampled_from(LINK_DIRS), st.sampled_from(LINK_NAMES), relative, st.booleans()),
        min_size=1,
        max_size=5,
    ),
    rest=st.lists(component, max_size=3).map("/".join),
)
def test_the_walk_goes_where_the_kernel_goes(
    tmp_path: Path,
    links: list[tuple[str, str, str, bool]],
    rest: str,
) -> None:
    base = Path(tempfile.mkdtemp(dir=tmp_path))
    for tree_dir in TREE:
        (base / tree_dir).mkdir(parents=True)
    for where, name, target, absolute in links:
        link = base / where / name
        if not os.path.lexists(link):
            link.symlink_to(str(base / target) if absolute else target)
    path = os.path.join(base, links[0][0], links[0][1], rest)  # through the first link

    found = resolve_trusted(path)

    if os.path.exists(path):
        assert found.exists
        assert found.resolved == os.path.realpath(path)
        # The way there is trusted (pytest's dirs are 0700, /tmp is sticky), so what decides is
        # the object the link leads to: /tmp, 1777, when ".." leads out of the tree.
        assert (found.problem is None) == (untrusted(os.stat(path)) is None)
    else:
        assert not found.exists
