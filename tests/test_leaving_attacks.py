"""An attacker's and an unlucky operator's review of 7698df7: a copy's original leaves its dir by
way of a hidden name (.<name>.<8 hex>.cni-reaper-leaving), and the next real run settles what a
run killed in that step left (leaving.settle, quarantine.copy_finder, cache.inspect_all,
cli._settling).

Each scenario asserts what someone would care about: where a file is, its bytes, an exit code,
a report line. The review (2026-12-06) found four defects, each a strict xfail until mended and
a plain test since:
- a leftover hidden name the run may not remove (a read-only results dir, an immutable file, an
  append-only dir) ended the run as an internal error with a traceback, every time: it is now a
  failure said with the system's words (exit 73), and the run goes on;
- a settle that leaves a file for the operator to compare by hand ended with exit 0: now 65;
- a name that only looked hidden was trusted on its shape: a file this boot wrote after the
  runtime started was renamed (now a later run of the boot settles only a file its pre-runtime
  record holds under the original's name), and a file in Multus's dir that is no scratch file
  was renamed (now only a name the scan would take is settled).
Real runs are made as root in a private mount namespace (run_private), in-process settles on
temp dirs otherwise; a move killed in process is had by raising at quarantine.original-hidden.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cni_reaper import cache, failpoint, leaving
from cni_reaper.content import ContentVerdict, Identity
from cni_reaper.errors import ExitCode
from cni_reaper.filestat import FileStat
from cni_reaper.read_only import READ_ONLY_HINT
from cni_reaper.repair.quarantine import ORIGINAL_HIDDEN, Move, Quarantine, copy_finder
from tests.nodetree import CONTAINER_IDS, NodeTree, snapshot
from tests.private_node import cannot_run
from tests.test_leaving import (
    FIRST_BOOT,
    NAME,
    NEXT_BOOT,
    crashed_in_the_last_step,
    cut_short,
    earlier_boots_node,
    hidden_in,
)
from tests.test_move_cleanup_attacks import (
    DEL_DONE,
    OLD,
    Ran,
    assert_every_copy_has_a_true_sidecar,
    files_under,
    json_run_argv,
    other_fs,
    read_only,
    run_private,
    sha,
)

__all__ = ["other_fs"]  # the fixture, used by name

TAG = "0123abcd"
SCRATCH_ID = CONTAINER_IDS[2]
DELEGATE = f"net-{CONTAINER_IDS[3]}-eth0"


@pytest.fixture(autouse=True)
def _as_root() -> None:
    if os.geteuid() != 0:
        cannot_run("needs root: real runs in a private mount namespace, chattr")


def hidden(original: str) -> str:
    return f".{original}.{TAG}{leaving.SUFFIX}"


class _Killed(BaseException):
    """What SIGKILL is to a run, in process: nothing after the point runs."""


@pytest.fixture
def killed_once_hidden() -> Iterator[None]:
    def kill() -> None:
        raise _Killed

    failpoint.interfere(ORIGINAL_HIDDEN, kill)
    yield
    failpoint.interfere(ORIGINAL_HIDDEN, None)


def begin_move(results: Path, qbase: Path, name: str, data: bytes) -> None:
    """A move of results/name across file systems, in process, cut short where a kill at
    quarantine.original-hidden cuts it (when it gets there)."""
    results.mkdir(exist_ok=True)
    path = results / name
    path.write_bytes(data)
    os.utime(path, (OLD, OLD))
    scanned = FileStat.of(os.stat(path, follow_symlinks=False))

    def record(dest: str, digest: str) -> dict[str, object]:
        return {"sha256": digest, "path": name, "to": dest}

    place = Quarantine(str(qbase), "boot")
    dir_fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY)
    try:
        place.move_all([Move(dir_fd, name, scanned, record)])
    except _Killed:
        pass
    finally:
        place.close()
        os.close(dir_fd)


def anything(st: os.stat_result, original: str) -> str | None:
    """As a run taking this boot's record judges: every file predates the runtime."""
    return None


def settle_in(
    results: Path, top: Path, boot: str, dry_run: bool = False
) -> tuple[list[str], list[str]]:
    """leaving.settle of results' hidden names against the quarantine at top in boot, as
    cli._settling wires it for the results dir (a sidecar names a file by its bare name)."""
    dir_fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY)
    try:
        names = leaving.hidden_among(sorted(os.listdir(dir_fd)))
        copy_of = copy_finder(str(top), boot, None, dir_fd, lambda name: name)
        put_back, said = leaving.settle(dir_fd, str(results), names, copy_of, anything, dry_run)
        return put_back, [settled.line for settled in said]
    finally:
        os.close(dir_fd)


def scan_handing(
    results: Path,
) -> tuple[list[list[str]], list[tuple[str, FileStat, ContentVerdict | Identity]]]:
    """A scan of results (cache.inspect_all): the hidden names it handed to settle, which
    settles nothing, and what it judged."""
    handed: list[list[str]] = []

    def settle(found: list[str]) -> list[str]:
        handed.append(found)
        return []

    dir_fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return handed, list(cache.inspect_all(dir_fd, settle=settle))
    finally:
        os.close(dir_fd)


def tree(root: Path) -> dict[str, tuple[int, int, bytes]]:
    """Every entry under root: (inode, mode, bytes or link target)."""
    found: dict[str, tuple[int, int, bytes]] = {}
    if not root.exists():
        return found
    for path in [root, *root.rglob("*")]:
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode):
            data = path.read_bytes()
        elif stat.S_ISLNK(st.st_mode):
            data = os.readlink(path).encode()
        else:
            data = b""
        found[str(path.relative_to(root))] = (st.st_ino, st.st_mode, data)
    return found


# --- names that look hidden ---------------------------------------------------------------


@pytest.mark.parametrize("original", ["..", "."])
def test_a_hidden_name_of_dot_or_dot_dot_is_left_and_nothing_outside_moves(
    tmp_path: Path, other_fs: Path, original: str
) -> None:
    """'...0123abcd.cni-reaper-leaving' reads as the hidden name of '..': its name is the
    parent dir, another file, so both are left; link() never reaches out of the dir."""
    results = tmp_path / "results"
    results.mkdir()
    planted = results / hidden(original)
    planted.write_bytes(b"planted")
    before = tree(tmp_path)

    put_back, said = settle_in(results, other_fs / "q", "boot")

    assert put_back == []
    assert tree(tmp_path) == before
    assert said == [
        f"{planted}: left by a move cut short before its last step; {original} is another "
        "file now, and no boot's quarantine holds a copy of it: both left; compare them by "
        "hand"
    ]
    assert not (other_fs / "q").exists()


def test_a_name_that_lacks_the_tag_or_has_an_upper_case_one_is_judged_as_any_file(
    tmp_path: Path,
) -> None:
    results = tmp_path / "results"
    results.mkdir()
    names = [f".{NAME}.0123ABCD{leaving.SUFFIX}", f".{NAME}{leaving.SUFFIX}", f"{NAME}{TAG}"]
    for name in names:
        (results / name).write_bytes(b"")
    handed, found = scan_handing(results)
    judged = [name for name, _, _ in found]
    assert handed == []
    assert judged == sorted(names)


def test_only_a_regular_file_is_handed_to_settle_and_a_fifo_never_blocks_the_scan(
    tmp_path: Path,
) -> None:
    """A FIFO, a dir, a symlink under hidden names: judged as what they are (not a file), never
    opened, never renamed; the regular one alone is settled."""
    results = tmp_path / "results"
    results.mkdir()
    outside = tmp_path / "outside"
    outside.write_bytes(b"not the reaper's")
    os.mkfifo(results / hidden("fifo"))
    (results / hidden("dir")).mkdir()
    os.symlink(outside, results / hidden("link"))
    (results / hidden("file")).write_bytes(b"x")
    handed, found = scan_handing(results)
    judged = {
        name: verdict.content.value
        for name, _, verdict in found
        if isinstance(verdict, ContentVerdict)
    }
    assert handed == [[hidden("file")]]
    assert judged == {hidden(n): "not-a-file" for n in ("dir", "fifo", "link")}
    assert stat.S_ISFIFO(os.lstat(results / hidden("fifo")).st_mode)
    assert outside.read_bytes() == b"not the reaper's"


def test_a_hidden_hard_link_to_a_file_outside_the_dir_goes_back_and_the_outside_file_stays(
    tmp_path: Path, other_fs: Path
) -> None:
    results = tmp_path / "results"
    results.mkdir()
    outside = tmp_path / "outside"
    outside.write_bytes(b"outside bytes")
    os.link(outside, results / hidden(NAME))

    put_back, _ = settle_in(results, other_fs / "q", "boot")

    assert put_back == [NAME]
    assert os.listdir(results) == [NAME]
    assert outside.read_bytes() == (results / NAME).read_bytes() == b"outside bytes"
    assert os.stat(outside).st_nlink == 2


# --- planted copies in the quarantine -------------------------------------------------------


def _plant(qdir: Path, name: str, copy: bytes | None, record: str) -> None:
    qdir.mkdir(parents=True, exist_ok=True)
    if copy is not None:
        (qdir / name).write_bytes(copy)
    (qdir / f"{name}.json").write_text(record)


@pytest.mark.parametrize(
    "plant",
    ["other-path", "sidecar-lies", "symlink-copy", "fifo-copy", "symlink-sidecar", "no-sidecar"],
)
def test_a_planted_copy_or_sidecar_never_has_a_hidden_file_dropped(
    tmp_path: Path, other_fs: Path, plant: str
) -> None:
    """copy_of drops a hidden file only for a regular copy with its very bytes, whose sidecar
    (a regular file) says those bytes and its name: anything else and it goes back."""
    results = tmp_path / "results"
    results.mkdir()
    data = b'{"kind":"cniCacheV1"'
    (results / hidden(NAME)).write_bytes(data)
    qdir = other_fs / "q/boot"
    true_record = f'{{"sha256":"{sha(data)}","path":"{NAME}"}}'
    elsewhere = tmp_path / "same-bytes"
    elsewhere.write_bytes(data)
    if plant == "other-path":
        _plant(qdir, NAME, data, f'{{"sha256":"{sha(data)}","path":"other"}}')
    elif plant == "sidecar-lies":
        _plant(qdir, NAME, b"other bytes", true_record)
    elif plant == "symlink-copy":
        _plant(qdir, NAME, None, true_record)
        os.symlink(elsewhere, qdir / NAME)
    elif plant == "fifo-copy":
        _plant(qdir, NAME, None, true_record)
        os.mkfifo(qdir / NAME)
    elif plant == "symlink-sidecar":
        _plant(qdir, NAME, data, "")
        os.unlink(qdir / f"{NAME}.json")
        (tmp_path / "sidecar").write_text(true_record)
        os.symlink(tmp_path / "sidecar", qdir / f"{NAME}.json")
    else:
        qdir.mkdir(parents=True)
        (qdir / NAME).write_bytes(data)

    put_back, said = settle_in(results, other_fs / "q", "boot")

    assert put_back == [NAME]
    assert os.listdir(results) == [NAME]
    assert (results / NAME).read_bytes() == data
    assert said[0].endswith(f"no copy of it in the quarantine: put back as {NAME}")


# --- the dry run ------------------------------------------------------------------------------


def test_a_dry_run_settles_nothing_in_any_state_and_makes_no_quarantine_dir(
    tmp_path: Path, other_fs: Path
) -> None:
    """Four hidden names, one of each kind (a copy of it, its name holding it again, its name
    free, its name taken): a dry run says four things and changes nothing, anywhere."""
    results = tmp_path / "results"
    results.mkdir()
    copied = b"copied"
    (results / hidden("a")).write_bytes(copied)
    _plant(other_fs / "q/boot", "a", copied, f'{{"sha256":"{sha(copied)}","path":"a"}}')
    (results / "b").write_bytes(b"b")
    os.link(results / "b", results / hidden("b"))
    (results / hidden("c")).write_bytes(b"c")
    (results / hidden("d")).write_bytes(b"d")
    (results / "d").write_bytes(b"another d")
    before = (tree(tmp_path), tree(other_fs))

    put_back, said = settle_in(results, other_fs / "q", "boot", dry_run=True)
    _, said_of_next_boot = settle_in(results, other_fs / "q", "next-boot", dry_run=True)

    assert (tree(tmp_path), tree(other_fs)) == before
    assert not (other_fs / "q/next-boot").exists()
    assert put_back == []
    at = f"{results}/.%s.{TAG}{leaving.SUFFIX}: left by a move cut short before its last step"
    assert said == [
        f"{at % 'a'}; its bytes are in {other_fs}/q/boot/a: a real run removes it",
        f"{at % 'b'}; b holds the same file again: a real run removes it",
        f"{at % 'c'}; no copy of it in the quarantine: a real run puts it back",
        f"{at % 'd'}; d is another file now, and no boot's quarantine holds a copy of it: "
        "both left; compare them by hand",
    ]
    # The next boot finds the copy in the dir of the boot whose run was cut short.
    assert (
        said_of_next_boot[0]
        == f"{at % 'a'}; its bytes are in {other_fs}/q/boot/a: a real run removes it"
    )


# --- a settle never overwrites, never loses bytes ---------------------------------------------


def test_a_file_that_takes_the_name_while_settle_looks_for_a_copy_is_never_overwritten(
    tmp_path: Path,
) -> None:
    """libcni writes the name between settle's look at it and the put-back: link() refuses,
    both are left, and said."""
    results = tmp_path / "results"
    results.mkdir()
    (results / hidden(NAME)).write_bytes(b"old")
    dir_fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY)

    def libcni_writes_meanwhile(name: str, original: str) -> tuple[str | None, str]:
        (results / original).write_bytes(b"new")
        return None, ""

    try:
        put_back, settled = leaving.settle(
            dir_fd, str(results), [hidden(NAME)], libcni_writes_meanwhile, anything, False
        )
        said = [s.line for s in settled]
    finally:
        os.close(dir_fd)
    assert put_back == []
    assert (results / NAME).read_bytes() == b"new"
    assert (results / hidden(NAME)).read_bytes() == b"old"
    assert said == [
        f"{results / hidden(NAME)}: left by a move cut short before its last step; no copy of "
        f"it in the quarantine; {NAME} appeared meanwhile: both left; compare them by hand"
    ]


def test_two_hidden_names_of_one_original_keep_both_files(tmp_path: Path, other_fs: Path) -> None:
    results = tmp_path / "results"
    results.mkdir()
    (results / f".{NAME}.00000000{leaving.SUFFIX}").write_bytes(b"first")
    (results / f".{NAME}.ffffffff{leaving.SUFFIX}").write_bytes(b"second")

    put_back, said = settle_in(results, other_fs / "q", "boot")

    assert put_back == [NAME]
    assert sorted(files_under(results).values()) == [b"first", b"second"]
    assert (results / NAME).read_bytes() == b"first"
    assert said[1].endswith("both left; compare them by hand")


# --- names near the length limits -------------------------------------------------------------


def test_a_killed_move_of_a_name_the_quarantine_shortens_is_finished_by_the_next_settle(
    tmp_path: Path, other_fs: Path, killed_once_hidden: None
) -> None:
    """210 bytes: room for a hidden name (226 at most), but past the quarantine's 200, where
    the copy's name is shortened. The copy is found under its short name all the same."""
    results = tmp_path / "results"
    long_name = "n" * 210
    begin_move(results, other_fs / "q", long_name, b"long")
    (left,) = hidden_in(results)
    assert leaving.original_of(left) == long_name

    put_back, said = settle_in(results, other_fs / "q", "boot")

    assert put_back == []
    assert os.listdir(results) == []
    (copy,) = assert_every_copy_has_a_true_sidecar(other_fs / "q").items()
    assert copy[1] == b"long" and len(copy[0]) < len("boot/" + long_name)
    assert said[0].endswith(f"its bytes are in {other_fs}/q/{copy[0]}: removed it")


def test_a_name_with_no_room_for_the_suffix_leaves_by_name_and_no_hidden_name_is_made(
    tmp_path: Path, other_fs: Path, killed_once_hidden: None
) -> None:
    results = tmp_path / "results"
    too_long = "n" * 227
    begin_move(results, other_fs / "q", too_long, b"long")
    assert os.listdir(results) == []
    assert list(assert_every_copy_has_a_true_sidecar(other_fs / "q").values()) == [b"long"]


# --- real runs: what a kill at quarantine.original-hidden leaves ------------------------------


def test_a_dry_run_after_the_kill_in_the_same_boot_changes_nothing_and_says_what_a_run_does(
    tmp_path: Path, other_fs: Path
) -> None:
    node, argv = crashed_in_the_last_step(tmp_path, other_fs)
    (left,) = hidden_in(node.results)
    before = (snapshot(node.root), files_under(other_fs))

    dry = run_private({"argv": [*argv, "--dry-run"]})

    assert dry.code == ExitCode.OK, dry.stderr
    assert (snapshot(node.root), files_under(other_fs)) == before
    copy = other_fs / "state/quarantine" / FIRST_BOOT / str(leaving.original_of(left))
    assert cut_short(dry) == [
        f"{node.results / left}: left by a move cut short before its last step; its bytes are "
        f"in {copy}: a real run removes it"
    ]


def copies_removed_by_hand(other_fs: Path) -> None:
    """The earlier boot's quarantine dir removed, as the README lets an operator do once it is
    no longer needed as evidence: no boot's quarantine holds the killed run's copy."""
    shutil.rmtree(other_fs / "state/quarantine" / FIRST_BOOT)


def _multus_node(tmp_path: Path) -> tuple[NodeTree, Path, Path, Path]:
    """A node whose only damage is Multus's: an empty scratch file and an empty delegate
    result, both of the earlier boot; the scratch dir, the delegate's dir, the plugin dir."""
    node = NodeTree(tmp_path / "node")
    node.write_boot_world(btime=1_700_000_000)
    bin_dir = node.fake_plugin_network("net", "done", DEL_DONE)
    node.results.mkdir(parents=True, mode=0o700)
    multus = node.root / "var/lib/cni/multus"
    (multus / "results").mkdir(parents=True, mode=0o700)
    multus.chmod(0o700)
    for path in (multus / SCRATCH_ID, multus / "results" / DELEGATE):
        path.write_bytes(b"")
        path.chmod(0o600)
        os.utime(path, (OLD, OLD))
    return node, bin_dir, multus, multus / "results"


@pytest.mark.parametrize("which", ["scratch", "delegate"])
def test_a_kill_in_a_multus_move_is_finished_in_the_same_boot_and_in_the_next(
    tmp_path: Path, other_fs: Path, which: str
) -> None:
    node, bin_dir, scratch_dir, delegates = _multus_node(tmp_path)
    argv = json_run_argv(node, bin_dir, other_fs / "state")
    # The delegate results are moved first, then the scratch files.
    nth = "1" if which == "delegate" else "2"
    killed = run_private({"argv": argv}, {failpoint.ENV: f"quarantine.original-hidden#{nth}"})
    assert killed.code == -9, killed.stderr
    where, name = (scratch_dir, SCRATCH_ID) if which == "scratch" else (delegates, DELEGATE)
    (left,) = hidden_in(where)
    assert leaving.original_of(left) == name
    box = other_fs / "state/quarantine" / FIRST_BOOT / "multus"

    again = run_private({"argv": argv})

    assert again.code == ExitCode.OK, again.stderr
    assert cut_short(again) == [
        f"{where / left}: left by a move cut short before its last step; its bytes are in "
        f"{box / name}: removed it"
    ]
    assert hidden_in(scratch_dir) == hidden_in(delegates) == []
    assert not (where / name).exists()
    copies = assert_every_copy_has_a_true_sidecar(other_fs / "state/quarantine")
    assert sorted(copies) == sorted(f"{FIRST_BOOT}/multus/{n}" for n in (SCRATCH_ID, DELEGATE))

    # The same state in the next boot: the copy is in the earlier boot's box, and the hidden
    # file goes, with no second copy.
    (where / left).write_bytes(b"")
    os.utime(where / left, (OLD, OLD))
    node.write_boot_world(btime=1_700_000_600, boot_id=NEXT_BOOT)
    next_boot = run_private({"argv": argv})
    assert next_boot.code == ExitCode.OK, next_boot.stderr
    assert cut_short(next_boot) == [
        f"{where / left}: left by a move cut short before its last step; its bytes are in "
        f"{box / name}: removed it"
    ]
    assert os.listdir(where) == (["results"] if which == "scratch" else [])
    copies = assert_every_copy_has_a_true_sidecar(other_fs / "state/quarantine")
    assert sorted(copies) == sorted(f"{FIRST_BOOT}/multus/{n}" for n in (SCRATCH_ID, DELEGATE))


def test_the_text_report_escapes_a_hidden_name_with_a_newline(
    tmp_path: Path, other_fs: Path
) -> None:
    node, bin_dir = earlier_boots_node(tmp_path)
    forged = "x\nwarning: all clean"
    path = node.write_result(hidden(forged), b"kept")
    argv = json_run_argv(node, bin_dir, other_fs / "state")
    argv.remove("--json")

    ran = run_private({"argv": argv})

    assert "\nwarning: all clean" not in ran.stdout
    assert "x\\nwarning: all clean" in ran.stdout
    assert not path.exists()
    assert (node.results / forged).read_bytes() == b"kept"


# --- defects --------------------------------------------------------------------------------


@pytest.fixture
def unchattr(tmp_path: Path) -> Iterator[None]:
    yield
    for path in [tmp_path, *tmp_path.rglob("*")]:
        if not path.is_symlink():
            subprocess.run(["chattr", "-i", "-a", str(path)], check=False, capture_output=True)


@pytest.mark.parametrize("how", ["read-only-dir", "immutable-file"])
def test_a_hidden_name_the_run_may_not_remove_is_said_and_the_run_goes_on(
    tmp_path: Path, other_fs: Path, unchattr: None, how: str
) -> None:
    """Killed at quarantine.original-hidden, rerun in the same boot: the copy is in this boot's
    quarantine, so settle unlinks the hidden name; EROFS (the results dir mounted read-only, as
    a mis-set ReadWritePaths= leaves it) or EPERM (chattr +i) escapes leaving.settle, the scan
    and the run: a traceback and exit 1, at every run, and no report of any entry."""
    node, argv = crashed_in_the_last_step(tmp_path, other_fs)
    (left,) = hidden_in(node.results)
    spec: dict[str, object] = {"argv": argv}
    if how == "read-only-dir":
        spec["mounts"] = read_only(node.results)
    else:
        subprocess.run(["chattr", "+i", str(node.results / left)], check=True)

    ran = run_private(spec)

    assert (node.results / left).read_bytes() == b""
    assert ran.code == ExitCode.ACTION_FAILED, ran.stderr
    (said,) = cut_short(ran)
    assert left in said
    if how == "read-only-dir":
        assert said.endswith(f"cannot remove it: Read-only file system; left; {READ_ONLY_HINT}")
    else:
        assert said.endswith("cannot remove it: Operation not permitted; left")


def test_an_append_only_results_dir_in_the_next_boot_is_said_and_the_run_goes_on(
    tmp_path: Path, other_fs: Path, unchattr: None
) -> None:
    """chattr +a on the results dir: link() succeeds, the unlink of the hidden name fails with
    EPERM and leaves settle; the run ends in a traceback, and (as the code reads) so would
    every later run (both names now hold one file, and the drop of the hidden one fails)."""
    node, argv = crashed_in_the_last_step(tmp_path, other_fs)
    (left,) = hidden_in(node.results)
    node.write_boot_world(btime=1_700_000_600, boot_id=NEXT_BOOT)
    copies_removed_by_hand(other_fs)  # so it is put back: link(), then the unlink
    subprocess.run(["chattr", "+a", str(node.results)], check=True)

    ran = run_private({"argv": argv})

    assert (node.results / left).exists() or (node.results / NAME).exists()
    assert ran.code == ExitCode.ACTION_FAILED, ran.stderr
    assert cut_short(ran)[0].endswith(
        f"put back as {NAME}, but cannot remove it: Operation not permitted; left"
    )


def test_a_hidden_file_left_beside_another_of_its_name_is_no_clean_exit(
    tmp_path: Path, other_fs: Path
) -> None:
    """The killed run's hidden file in the next boot, its name taken by another file: both are
    left, and the operator must compare them by hand. The run exits 0, 'clean or repaired',
    where a planted symlink under the same hidden name is 'left alone' and exits 65."""
    node, argv = crashed_in_the_last_step(tmp_path, other_fs)
    (left,) = hidden_in(node.results)
    node.write_boot_world(btime=1_700_000_600, boot_id=NEXT_BOOT)
    copies_removed_by_hand(other_fs)
    (node.results / NAME).write_bytes(b"another")

    ran = run_private({"argv": argv})

    assert (node.results / left).read_bytes() == b""
    assert cut_short(ran)[0].endswith("both left; compare them by hand")
    assert ran.code == ExitCode.DATA


def _runtime_running_node(tmp_path: Path) -> NodeTree:
    """This boot's first run recorded the results dir, then containerd started."""
    node = NodeTree(tmp_path / "node")
    now = time.time()
    node.write_boot_world(btime=now - 600)
    node.results.mkdir(parents=True, mode=0o700)
    node.record_before_runtime(now - 300)
    node.runtime_starts()
    return node


def test_a_file_this_boot_wrote_under_a_name_that_looks_hidden_is_not_renamed(
    tmp_path: Path, other_fs: Path
) -> None:
    """'.net-x.0123abcd.cni-reaper-leaving' is libcni's name for network '.net', container
    'x.0123abcd.cni', ifname 'reaper-leaving' (a libcni before 0.8 checked no name). Written
    after the runtime started, after this boot's record, it cannot be a file the reaper hid
    (it hides only files that predate the boot, and a rename keeps the mtime); yet the run
    renames it to 'net-x', where libcni's DEL will not find it."""
    node = _runtime_running_node(tmp_path)
    bin_dir = node.fake_plugin_network("net", "done", DEL_DONE)
    name = f".net-x.{TAG}{leaving.SUFFIX}"
    node.write_result(name, b'{"kind":"cniCacheV1","containerId":"x.0123abcd.cni"}')

    ran = run_private({"argv": [*json_run_argv(node, bin_dir, other_fs / "state"), "--force"]})

    assert ran.code == ExitCode.DATA, ran.stderr
    assert os.listdir(node.results) == [name]
    assert cut_short(ran) == [
        f"{node.results / name}: left by a move cut short before its last step; not the file "
        "this boot's pre-runtime record holds as net-x: left alone"
    ]


def test_a_hidden_looking_file_in_multus_dir_that_is_no_scratch_file_is_not_renamed(
    tmp_path: Path, other_fs: Path
) -> None:
    """Only files named by a container ID are Multus's scratch (cache.is_container_id): the
    reaper moves nothing else there, so it never hid '.notes.0123abcd.cni-reaper-leaving'. The
    run renames it to 'notes' all the same."""
    node, bin_dir, scratch_dir, _ = _multus_node(tmp_path)
    planted = scratch_dir / hidden("notes")
    planted.write_bytes(b"an operator's notes")

    ran = run_private({"argv": json_run_argv(node, bin_dir, other_fs / "state")})

    assert ran.code == ExitCode.OK, ran.stderr
    assert planted.read_bytes() == b"an operator's notes"
    assert not (scratch_dir / "notes").exists()


def test_a_kill_then_a_rerun_in_the_same_boot_leaves_one_copy_and_exit_0(
    tmp_path: Path, other_fs: Path
) -> None:
    """The results dir: a second kill at the same point of the rerun, then a third run; each
    file is copied once, nothing is left in the results dir."""
    node, argv = crashed_in_the_last_step(tmp_path, other_fs)
    killed = run_private({"argv": argv}, {failpoint.ENV: "quarantine.original-hidden"})
    assert killed.code == -9, killed.stderr

    again: Ran = run_private({"argv": argv})

    assert again.code == ExitCode.OK, again.stderr
    assert os.listdir(node.results) == []
    copies = assert_every_copy_has_a_true_sidecar(other_fs / "state/quarantine")
    assert sorted(copies) == sorted(
        f"{FIRST_BOOT}/{n}" for n in (NAME, f"net-{CONTAINER_IDS[1]}-eth0")
    )
