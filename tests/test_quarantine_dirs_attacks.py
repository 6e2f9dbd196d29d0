"""An attacker's and an unlucky operator's review of a662338 and aa308a8: every dir a quarantine
move writes to (the quarantine dir, the boot's dir, Multus's box, host-local's box and its
network's dir) is opened one component at a time (quarantine._our_dir, _open_dir_chain), made
0700 when missing and refused unless only root (or the reaper's user) may write it; settle's
copy lookup (copy_finder, _copy_in) opens its dirs the same way and names the dir it could not
search.

Each scenario asserts what someone would care about: where a file's bytes are, an exit code, a
report or error line. Three defects were found, mended in the commit after aa308a8 (what went
wrong is said above each scenario): a quarantine path with ".." after a symlink sent the file to
one dir while its reported path (and its sidecar) named another; a boot id or box holding "/"
or ".." was opened as a path, through a symlink and out of the quarantine dir; and a batch in
which no file moves still made the boot's dir. The first two were reached through the
Quarantine API only: the CLI makes the state dir absolute and takes a boot id only when it is a
UUID (see the CLI scenarios). Everything else held: FIFOs, sockets, devices and files where a
dir should be (no hang), ACLs, sticky dirs, mounts, a racing swap of the quarantine dir, runs
without CAP_DAC_OVERRIDE, and full CLI runs. A run that must lack CAP_DAC_OVERRIDE or needs a
mount is made in a child process.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import struct
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cni_reaper import cli
from cni_reaper.errors import ExitCode
from cni_reaper.filestat import FileStat
from cni_reaper.repair.quarantine import Move, Quarantine, QuarantineError
from tests.crashed import Crashed
from tests.private_node import cannot_run, unshare
from tests.test_leaving import NAME as HIDDEN_NAME
from tests.test_leaving_attacks import hidden
from tests.test_leaving_cross_boot_attacks import (
    DATA,
    EARLIER,
    THIS_BOOT,
    a_hidden_file,
    child,
    plant,
    settle_in_child,
)
from tests.test_multus_scratch_attacks import no_longer_than
from tests.test_quarantine_dirs import NAME, move_one

BYTES = b'{"kind":"cniCacheV1"'
OTHER_UID = 1000
NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
BOOT_ID = "11111111-2222-3333-4444-555555555555"  # tests/nodetree.py's


@pytest.fixture(autouse=True)
def _as_root() -> None:
    if os.geteuid() != 0:
        cannot_run("needs root: chown to another user, ACLs, mounts, capabilities dropped")


# --- helpers ------------------------------------------------------------------------------


def a_results_file(tmp_path: Path, data: bytes = BYTES) -> Path:
    results = tmp_path / "results"
    results.mkdir(exist_ok=True)
    (results / NAME).write_bytes(data)
    return results


def files_under(root: Path) -> dict[str, bytes]:
    """Every regular file under root (symlinks not followed): its bytes."""
    found: dict[str, bytes] = {}
    if not root.exists():
        return found
    for dirpath, _dirs, names in os.walk(root):
        for name in names:
            path = Path(dirpath, name)
            if stat.S_ISREG(os.lstat(path).st_mode):
                found[str(path.relative_to(root))] = path.read_bytes()
    return found


def acl(*entries: tuple[int, int, int]) -> bytes:
    """A POSIX ACL as the kernel's xattr holds it: (tag, perm, id) entries, in tag order."""
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


_UNDEFINED = 0xFFFFFFFF
USER_OBJ, USER, GROUP_OBJ, MASK, OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
# The owner and uid 1000 may do everything; the group and others nothing.
USER_1000_MAY_WRITE = acl(
    (USER_OBJ, 7, _UNDEFINED),
    (USER, 7, OTHER_UID),
    (GROUP_OBJ, 0, _UNDEFINED),
    (MASK, 7, _UNDEFINED),
    (OTHER, 0, _UNDEFINED),
)


def set_acl(path: Path, name: str, value: bytes) -> None:
    try:
        os.setxattr(path, name, value)
    except OSError as e:
        if e.errno == errno.EOPNOTSUPP:
            cannot_run(f"the file system of {path} has no POSIX ACLs")
        raise


def acl_entries(path: Path) -> list[tuple[int, int, int]]:
    raw = os.getxattr(path, "system.posix_acl_access")
    return [struct.unpack_from("<HHI", raw, 4 + 8 * i) for i in range((len(raw) - 4) // 8)]


MOVE_IN_CHILD = r"""
import json, os, subprocess, sys
from cni_reaper.filestat import FileStat
from cni_reaper.repair.quarantine import Move, Quarantine
args = json.loads(sys.argv[1])
for command in args["mounts"]:
    subprocess.run(command, check=True)
results, name = args["results"], args["name"]
scanned = FileStat.of(os.stat(os.path.join(results, name), follow_symlinks=False))
dir_fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY)
place = Quarantine(args["top"], args["boot"], *args["box"])
(outcome,) = place.move_all([Move(dir_fd, name, scanned, lambda d, s: {"path": name, "to": d})])
place.close()
found = {}
for dirpath, _dirs, names in os.walk(args["top"]):
    for n in names:
        path = os.path.join(dirpath, n)
        with open(path, "rb") as f:
            found[path] = f.read().decode("latin-1")
print(json.dumps({
    "moved": outcome if isinstance(outcome, str) else None,
    "error": None if isinstance(outcome, str) else str(outcome),
    "left": os.path.exists(os.path.join(results, name)),
    "found": found,
}))
"""


def move_in_child(
    results: Path,
    top: Path,
    boot: str,
    box: tuple[str, ...] = (),
    prefix: list[str] | None = None,
    mounts: list[list[str]] | None = None,
) -> dict[str, Any]:
    """move_one in a child process (under prefix, after mounts): what became of the file, and
    every file under top as the child saw it (its mounts are its own)."""
    args = {
        "results": str(results),
        "name": NAME,
        "top": str(top),
        "boot": boot,
        "box": list(box),
        "mounts": mounts or [],
    }
    code, out = child(MOVE_IN_CHILD, args, prefix or [], timeout=30)
    assert code == 0, out
    found: dict[str, Any] = json.loads(out.splitlines()[-1])
    return found


def in_namespace(*mounts: list[str]) -> tuple[list[str], list[list[str]]]:
    if not Path("/usr/bin/unshare").exists() and not Path("/bin/unshare").exists():
        cannot_run("needs unshare(1) for a private mount namespace")
    return unshare(), list(mounts)


# --- what the change set out to refuse: held ------------------------------------------------


@pytest.mark.parametrize("kind", ["fifo", "fifo-with-a-writer", "socket", "char-device", "file"])
@pytest.mark.parametrize(
    ("box", "at"),
    [((), ("boot",)), (("multus",), ("boot", "multus")), (("host-local", "n"), ("boot",))],
)
def test_no_dir_where_a_quarantine_dir_should_be_is_refused_at_once_and_named(
    tmp_path: Path, kind: str, box: tuple[str, ...], at: tuple[str, ...]
) -> None:
    """A FIFO (none is ever opened: an open of one waits for a writer), a socket, a device (its
    open may act) or a regular file at the boot's dir or a box: the move is refused at once,
    naming that path; the file stays and nothing is written anywhere."""
    results = a_results_file(tmp_path)
    top = tmp_path / "state" / "quarantine"
    where = top.joinpath(*at)
    where.parent.mkdir(parents=True)
    writer = -1
    if kind.startswith("fifo"):
        os.mkfifo(where)
        if kind == "fifo-with-a-writer":
            writer = os.open(where, os.O_RDWR | os.O_NONBLOCK)
    elif kind == "socket":
        os.mknod(where, stat.S_IFSOCK | 0o600)
    elif kind == "char-device":
        os.mknod(where, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # as /dev/null
    else:
        where.write_bytes(b"")
    try:
        outcome = move_one(results, Quarantine(str(top), "boot", *box))
    finally:
        if writer >= 0:
            os.close(writer)

    assert isinstance(outcome, QuarantineError), outcome
    assert outcome.errno == errno.ENOTDIR
    assert f"cannot open quarantine dir {where}: " in str(outcome), outcome
    assert (results / NAME).read_bytes() == BYTES
    assert files_under(top) == ({} if kind != "file" else {str(where.relative_to(top)): b""})


@pytest.mark.parametrize("at", ["quarantine", "boot", "multus"])
@pytest.mark.parametrize("how", ["acl-grants-uid-1000-write", "sticky-open-to-all"])
def test_a_root_dir_that_an_acl_or_a_sticky_bit_opens_to_others_is_refused(
    tmp_path: Path, at: str, how: str
) -> None:
    """Owned by root, but uid 1000 may write it through an ACL (its mask shows in the group
    bits), or it is sticky and open to all like /tmp (anyone may still add a FIFO under a
    sidecar's temp name): refused, named; nothing lands in it."""
    results = a_results_file(tmp_path)
    top = tmp_path / "state" / "quarantine"
    chain = {"quarantine": top, "boot": top / "boot", "multus": top / "boot" / "multus"}
    chain["multus"].mkdir(parents=True, mode=0o700)
    opened = chain[at]
    if how.startswith("acl"):
        set_acl(opened, "system.posix_acl_access", USER_1000_MAY_WRITE)
    else:
        opened.chmod(0o1777)
    os.mkfifo(opened / f".{NAME}.json.tmp")  # what uid 1000 could have planted

    outcome = move_one(results, Quarantine(str(top), "boot", "multus"))

    assert isinstance(outcome, QuarantineError), outcome
    assert outcome.errno == errno.EPERM
    assert f"cannot open quarantine dir {opened}: " in str(outcome), outcome
    assert "not trusted to hold a quarantine" in str(outcome), outcome
    assert (results / NAME).read_bytes() == BYTES
    assert files_under(top) == {}


def test_a_default_acl_on_the_state_dir_never_lets_anyone_write_the_dirs_made_below_it(
    tmp_path: Path,
) -> None:
    """An operator gave a monitoring user rwx by a default ACL on the state dir. The dirs the
    reaper makes inherit the ACL, but mkdir's 0700 masks it: no one but root may write them,
    and the move goes through."""
    results = a_results_file(tmp_path)
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    set_acl(state, "system.posix_acl_default", USER_1000_MAY_WRITE)

    outcome = move_one(results, Quarantine(str(state / "quarantine"), "boot", "multus"))

    where = state / "quarantine" / "boot" / "multus"
    assert outcome == str(where / NAME)
    assert (where / NAME).read_bytes() == BYTES
    for made in (state / "quarantine", state / "quarantine" / "boot", where):
        assert stat.S_IMODE(made.stat().st_mode) == 0o700
        masks = [perm for tag, perm, _ in acl_entries(made) if tag == MASK]
        assert masks == [0], (made, acl_entries(made))  # uid 1000's rwx masked to nothing


def test_a_quarantine_dir_swapped_by_whoever_may_write_the_state_dir_never_takes_a_file(
    tmp_path: Path,
) -> None:
    """The state dir is open to all (an operator's mistake), the quarantine dir in it root's.
    While files are moved, an attacker keeps swapping the quarantine dir for a symlink to a dir
    of theirs, or for a dir they own holding a boot's dir (renamed over an empty one the reaper
    just made, too): not one file lands in a dir they may write or through their symlink; each
    file's bytes are in exactly one place, a dir of root's or still the results dir."""
    results = tmp_path / "results"
    results.mkdir()
    state = tmp_path / "state"
    (state / "quarantine" / "boot").mkdir(parents=True, mode=0o700)
    state.chmod(0o777)
    theirs = tmp_path / "theirs"
    (theirs / "boot").mkdir(parents=True)
    (state / "their-dir" / "boot").mkdir(parents=True)
    for path in (theirs, theirs / "boot", state / "their-dir", state / "their-dir" / "boot"):
        os.chown(path, OTHER_UID, OTHER_UID)
    (state / "their-link").symlink_to(theirs)
    stop = threading.Event()

    def swap() -> None:
        q = state / "quarantine"
        n = 0
        while not stop.is_set():
            n += 1
            decoy = state / ("their-link", "their-dir")[n % 2]
            with contextlib.suppress(OSError):
                os.rename(q, state / f"root-s-{n}")
            with contextlib.suppress(OSError):
                os.rename(decoy, q)  # over an empty dir the reaper just made, too
            time.sleep(0.0005)
            with contextlib.suppress(OSError):
                os.rename(q, decoy)

    attacker = threading.Thread(target=swap)
    attacker.start()
    outcomes = []
    try:
        for i in range(300):
            name = f"{NAME}-{i}"
            (results / name).write_bytes(BYTES + str(i).encode())
            outcomes.append(move_one(results, Quarantine(str(state / "quarantine"), "boot"), name))
    finally:
        stop.set()
        attacker.join()

    assert files_under(theirs) == {}
    everywhere = files_under(tmp_path)
    for i, outcome in enumerate(outcomes):
        name, data = f"{NAME}-{i}", BYTES + str(i).encode()
        holding = [p for p, d in everywhere.items() if d == data and Path(p).name == name]
        assert len(holding) == 1, (outcome, holding)
        (where,) = holding
        if where != f"results/{name}":
            assert isinstance(outcome, str), outcome
            for parent in Path(tmp_path, where).parents:
                if parent == state:
                    break
                st = parent.stat()
                assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (0, 0o700), (parent, outcome)
        else:
            assert isinstance(outcome, QuarantineError), outcome
    assert any(isinstance(o, QuarantineError) for o in outcomes), "the swap never raced a move"


def test_a_missing_quarantine_dir_under_another_user_s_state_dir_is_made_root_s_and_private(
    tmp_path: Path,
) -> None:
    """The state dir belongs to uid 1000 (above the quarantine dir: the system's). The quarantine
    dir is made below it, root's and 0700, and the file lands there."""
    results = a_results_file(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    os.chown(state, OTHER_UID, OTHER_UID)

    outcome = move_one(results, Quarantine(str(state / "quarantine"), "boot"))

    assert outcome == str(state / "quarantine" / "boot" / NAME)
    made = (state / "quarantine").stat()
    assert (made.st_uid, stat.S_IMODE(made.st_mode)) == (0, 0o700)
    assert (state / "quarantine" / "boot" / NAME).read_bytes() == BYTES


def test_a_relative_quarantine_path_lands_where_it_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = a_results_file(tmp_path)
    monkeypatch.chdir(tmp_path)

    outcome = move_one(results, Quarantine(os.path.join("state", "quarantine"), "boot"))

    assert isinstance(outcome, str), outcome
    assert Path(outcome).read_bytes() == BYTES
    assert (tmp_path / "state" / "quarantine" / "boot" / NAME).read_bytes() == BYTES


# --- mounts (in a private mount namespace) ---------------------------------------------------


def test_a_tmpfs_with_its_default_mode_at_the_quarantine_dir_is_refused(tmp_path: Path) -> None:
    """A tmpfs mounted at the quarantine dir without mode= is 1777: open to all, refused."""
    results = a_results_file(tmp_path)
    top = tmp_path / "state" / "quarantine"
    top.mkdir(parents=True)
    prefix, mounts = in_namespace(["mount", "-t", "tmpfs", "tmpfs", str(top)])

    out = move_in_child(results, top, "boot", prefix=prefix, mounts=mounts)

    assert out["moved"] is None
    assert f"cannot open quarantine dir {top}: is writable by group or others" in out["error"]
    assert out["left"] is True
    assert out["found"] == {}
    assert (results / NAME).read_bytes() == BYTES


def test_a_private_file_system_mounted_at_the_boot_dir_gets_a_true_copy(tmp_path: Path) -> None:
    """Another file system (a tmpfs made 0700) at the boot's dir: the move is a copy, its
    sidecar beside it, and the original goes only then."""
    results = a_results_file(tmp_path)
    top = tmp_path / "state" / "quarantine"
    (top / "boot").mkdir(parents=True, mode=0o700)
    prefix, mounts = in_namespace(
        ["mount", "-t", "tmpfs", "-o", "mode=0700", "t", str(top / "boot")]
    )

    out = move_in_child(results, top, "boot", ("multus",), prefix=prefix, mounts=mounts)

    copy = str(top / "boot" / "multus" / NAME)
    assert out["moved"] == copy, out
    assert out["left"] is False
    assert out["found"][copy] == BYTES.decode("latin-1")
    assert json.loads(out["found"][copy + ".json"])["to"] == copy


def test_another_user_s_dir_bind_mounted_at_the_boot_dir_is_refused(tmp_path: Path) -> None:
    results = a_results_file(tmp_path)
    top = tmp_path / "state" / "quarantine"
    (top / "boot").mkdir(parents=True, mode=0o700)
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    prefix, mounts = in_namespace(["mount", "--bind", str(theirs), str(top / "boot")])

    out = move_in_child(results, top, "boot", prefix=prefix, mounts=mounts)

    assert out["moved"] is None
    assert f"{top / 'boot'}: is owned by uid {OTHER_UID}" in out["error"], out
    assert out["left"] is True
    assert files_under(theirs) == {}


# --- without CAP_DAC_OVERRIDE, as the unit runs -----------------------------------------------


def test_without_dac_override_the_dirs_the_reaper_makes_are_its_own_to_write(
    tmp_path: Path,
) -> None:
    results = a_results_file(tmp_path)
    top = tmp_path / "state" / "quarantine"

    out = move_in_child(results, top, "boot", ("host-local", "n"), prefix=NO_DAC)

    assert out["moved"] == str(top / "boot" / "host-local" / "n" / NAME), out
    assert out["left"] is False


@pytest.mark.parametrize("at", ["quarantine", "boot"])
def test_without_dac_override_a_read_only_dir_of_root_s_names_the_dir_it_cannot_make(
    tmp_path: Path, at: str
) -> None:
    """The quarantine dir (or the boot's dir) made 0500 by an operator: the dir that cannot be
    made below it is named, the file stays."""
    results = a_results_file(tmp_path)
    top = tmp_path / "state" / "quarantine"
    (top / "boot").mkdir(parents=True, mode=0o700)
    locked = top if at == "quarantine" else top / "boot"
    below = ("boot2", "multus") if at == "quarantine" else ("boot", "multus")
    locked.chmod(0o500)
    try:
        out = move_in_child(results, top, below[0], below[1:], prefix=NO_DAC)
    finally:
        locked.chmod(0o700)

    cannot = top / below[0] if at == "quarantine" else top / "boot" / "multus"
    assert out["moved"] is None
    assert out["error"].endswith(f"cannot open quarantine dir {cannot}: Permission denied"), out
    assert out["left"] is True


@pytest.mark.parametrize("which", ["boot", "box"])
def test_settle_without_dac_override_names_the_dir_it_could_not_search(
    tmp_path: Path, which: str
) -> None:
    """A Multus dir's hidden file, a true copy in an earlier boot's box; the boot's dir or the
    box is 0000, which root without CAP_DAC_OVERRIDE may not search: the note names that very
    dir, the file goes back, the copy stays."""
    results, top = tmp_path / "results", tmp_path / "q"
    a_hidden_file(results)
    copy = plant(top / EARLIER / "multus", HIDDEN_NAME, DATA, str(results / HIDDEN_NAME))
    closed = top / EARLIER if which == "boot" else top / EARLIER / "multus"
    closed.chmod(0o000)
    try:
        code, out = settle_in_child(results, top, THIS_BOOT, "multus", prefix=NO_DAC)
    finally:
        closed.chmod(0o700)

    assert code == 0, out
    (line,) = out["said"]
    assert f"({closed} not searched: Permission denied)" in line, line
    assert out["put_back"] == [HIDDEN_NAME]
    assert (results / HIDDEN_NAME).read_bytes() == DATA
    assert not (results / hidden(HIDDEN_NAME)).exists()
    assert copy.read_bytes() == DATA


# --- full runs ------------------------------------------------------------------------------


def damaged_entry(crashed: Crashed) -> Path:
    entry = crashed.add("ab" * 32)
    entry.write_bytes(b"")
    crashed.reboot()
    return entry


@pytest.mark.parametrize("how", ["open-to-all", "fifo-at-the-boot-dir"])
def test_a_run_whose_quarantine_dir_is_refused_exits_73_and_keeps_the_file(
    crashed: Crashed, capsys: pytest.CaptureFixture[str], how: str
) -> None:
    entry = damaged_entry(crashed)
    top = crashed.node.root / "var/lib/cni-reaper/quarantine"
    top.mkdir(parents=True)
    if how == "open-to-all":
        top.chmod(0o777)
        refused = top
    else:
        refused = top / BOOT_ID
        os.mkfifo(refused)

    with no_longer_than(60):
        code, report = crashed.run(capsys)

    assert code == ExitCode.ACTION_FAILED
    (row,) = report["entries"]
    assert row["outcome"] == "failed"
    assert f"cannot open quarantine dir {refused}" in json.dumps(row), row
    assert entry.read_bytes() == b""
    assert files_under(top) == {}


def test_a_boot_id_that_is_no_uuid_never_names_a_quarantine_dir(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """A root's boot_id file holding a path: the run has no boot id, leaves the file (exit 65),
    and makes nothing in or above the state dir."""
    entry = damaged_entry(crashed)
    (crashed.node.root / "proc/sys/kernel/random/boot_id").write_text("../../../escape\n")
    before = files_under(crashed.node.root.parent)

    code = cli.main(crashed.argv("--json"), clock=lambda: crashed.t0 + 60, environ={})
    capsys.readouterr()

    assert code == ExitCode.DATA
    assert entry.read_bytes() == b""
    assert not (crashed.node.root / "var/lib/cni-reaper/quarantine").exists()
    after = files_under(crashed.node.root.parent)
    assert [p for p in after if p not in before and "cni-reaper" not in p] == []


# --- defects, mended -------------------------------------------------------------------------


# The path was normalized (os.path.abspath) before its open: the file landed under the lexical
# path, while its reported path and sidecar named the one the kernel resolves, where it was not.
def test_a_quarantine_path_with_dot_dot_after_a_symlink_reports_where_the_file_is(
    tmp_path: Path,
) -> None:
    results = a_results_file(tmp_path)
    state = tmp_path / "state"
    state.mkdir()
    (tmp_path / "disk" / "sub").mkdir(parents=True)
    (state / "link").symlink_to(tmp_path / "disk" / "sub")
    top = state / "link" / ".." / "quarantine"  # the kernel: disk/quarantine

    outcome = move_one(results, Quarantine(str(top), "boot"))

    assert isinstance(outcome, str), outcome
    assert not (results / NAME).exists()
    assert Path(outcome).read_bytes() == BYTES  # the path said is where the bytes are


# A boot id or box was opened as a path, not as one name: ".." landed the file in the state dir,
# and "a/b" followed a symlink "a" out of the quarantine dir.
@pytest.mark.parametrize("boot", ["..", "a/b"])
def test_a_boot_id_that_is_no_single_name_never_takes_a_file_out_of_the_quarantine_dir(
    tmp_path: Path, boot: str
) -> None:
    results = a_results_file(tmp_path)
    top = tmp_path / "state" / "quarantine"
    top.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    (top / "a").symlink_to(outside)

    outcome = move_one(results, Quarantine(str(top), boot))

    escaped = {**files_under(tmp_path / "state"), **files_under(outside)}
    assert files_under(outside) == {}
    assert [p for p in escaped if not p.startswith("quarantine/")] == []
    if isinstance(outcome, str):
        assert os.path.commonpath([os.path.realpath(outcome), str(top)]) == str(top), outcome
    else:
        assert isinstance(outcome, QuarantineError), outcome


# The quarantine dirs were made before any file was held: a batch whose every file changed since
# the scan left an empty quarantine/<boot>/ behind, as if something had moved.
def test_a_batch_in_which_no_file_moves_makes_no_quarantine_dir(tmp_path: Path) -> None:
    results = a_results_file(tmp_path)
    scanned = FileStat.of(os.stat(results / NAME, follow_symlinks=False))
    (results / NAME).unlink()  # gone since the scan
    top = tmp_path / "state" / "quarantine"
    dir_fd = os.open(results, os.O_RDONLY | os.O_DIRECTORY)
    place = Quarantine(str(top), "boot", "multus")
    try:
        (outcome,) = place.move_all([Move(dir_fd, NAME, scanned, lambda d, s: {})])
    finally:
        place.close()
        os.close(dir_fd)

    assert "gone since the scan" in str(outcome)
    assert not (top / "boot").exists()
