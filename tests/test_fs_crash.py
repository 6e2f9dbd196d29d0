"""The file system's own crash record (cni_reaper/evidence/fs_crash.py): the kernel's replay
messages for ext4, XFS and btrfs, the --root rule, and a real ext4 crashed and replayed on a
loop device (tests/fs_crash_scenario.py, in a private mount namespace)."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cni_reaper.evidence import fs_crash
from cni_reaper.evidence.fs_crash import Verdict, crash_record, judge_kernel_log
from tests import journal_files
from tests.private_node import cannot_run, unshare

REPO = Path(__file__).resolve().parent.parent

# Lines as the kernel writes them (message text of /dev/kmsg records).
EXT4_CRASHED_THEN_CLEAN = [
    "loop0: detected capacity change from 0 to 131072",
    "EXT4-fs (loop0): recovery complete",
    "EXT4-fs (loop0): mounted filesystem 4c20bba5-8340-436b-a0b3-4e4dbdffb4c0 r/w with ordered"
    " data mode. Quota mode: none.",
    "EXT4-fs (loop0): unmounting filesystem 4c20bba5-8340-436b-a0b3-4e4dbdffb4c0.",
    "EXT4-fs (loop0): mounted filesystem 4c20bba5-8340-436b-a0b3-4e4dbdffb4c0 r/w with ordered"
    " data mode. Quota mode: none.",
]
XFS_REPLAYED = [
    "XFS (sdb1): Mounting V5 Filesystem 2f1f6a3e-8c1b-4a43-9a53-0b1f5b2bd2a1",
    "XFS (sdb1): Starting recovery (logdev: internal)",
    "XFS (sdb1): Ending recovery (logdev: internal)",
]
XFS_CLEAN = [
    "XFS (sdb1): Mounting V5 Filesystem 2f1f6a3e-8c1b-4a43-9a53-0b1f5b2bd2a1",
    "XFS (sdb1): Ending clean mount",
]
BTRFS_REPLAYED = [
    "BTRFS: device fsid 0d6e2f7b-1e2a-4c53-8a7e-5a9b3c1d2e4f devid 1 transid 12 /dev/dm-0"
    " scanned by mount (812)",
    "BTRFS info (device dm-0): first mount of filesystem 0d6e2f7b-1e2a-4c53-8a7e-5a9b3c1d2e4f",
    "BTRFS info (device dm-0): using crc32c (crc32c-generic) checksum algorithm",
    "BTRFS info (device dm-0): start tree-log replay",
]


def test_ext4_only_the_latest_mount_counts() -> None:
    judged = judge_kernel_log(EXT4_CRASHED_THEN_CLEAN, "loop0", "ext4")
    assert judged.verdict is Verdict.CLEAN
    assert judged.evidence == EXT4_CRASHED_THEN_CLEAN[-1]
    judged = judge_kernel_log(EXT4_CRASHED_THEN_CLEAN[:3], "loop0", "ext4")
    assert judged.verdict is Verdict.REPLAYED
    assert judged.evidence == "EXT4-fs (loop0): recovery complete"


def test_ext4_other_devices_and_names_that_share_a_prefix_do_not_count() -> None:
    lines = [line.replace("loop0", "loop1") for line in EXT4_CRASHED_THEN_CLEAN[:3]]
    assert judge_kernel_log(lines, "loop0", "ext4").verdict is Verdict.UNKNOWN
    lines = [line.replace("loop0", "loop10") for line in EXT4_CRASHED_THEN_CLEAN[:3]]
    assert judge_kernel_log(lines, "loop1", "ext4").verdict is Verdict.UNKNOWN
    # ext3 is mounted by the ext4 driver, which names itself EXT4-fs
    assert judge_kernel_log(EXT4_CRASHED_THEN_CLEAN[:3], "loop0", "ext3").verdict is (
        Verdict.REPLAYED
    )


def test_ext4_read_only_recovery_and_no_journal() -> None:
    ro = [
        "EXT4-fs (sda1): INFO: recovery required on readonly filesystem",
        "EXT4-fs (sda1): write access will be enabled during recovery",
        "EXT4-fs (sda1): recovery complete",
        "EXT4-fs (sda1): mounted filesystem 11111111-2222-3333-4444-555555555555 ro with ordered"
        " data mode. Quota mode: none.",
    ]
    assert judge_kernel_log(ro, "sda1", "ext4").verdict is Verdict.REPLAYED
    bare = ["EXT4-fs (sda1): mounted filesystem without journal. Quota mode: none."]
    judged = judge_kernel_log(bare, "sda1", "ext2")
    assert judged.verdict is Verdict.UNKNOWN
    assert "without a journal" in judged.detail


def test_xfs_recovery_and_clean_mount() -> None:
    judged = judge_kernel_log(XFS_REPLAYED, "sdb1", "xfs")
    assert judged.verdict is Verdict.REPLAYED
    assert judged.evidence == "XFS (sdb1): Starting recovery (logdev: internal)"
    assert judge_kernel_log(XFS_CLEAN, "sdb1", "xfs").verdict is Verdict.CLEAN
    assert judge_kernel_log(XFS_REPLAYED + XFS_CLEAN, "sdb1", "xfs").verdict is Verdict.CLEAN
    assert judge_kernel_log(XFS_CLEAN + XFS_REPLAYED, "sdb1", "xfs").verdict is Verdict.REPLAYED
    # the mount's first line rotated out of the ring: a replay line still stands, a clean one
    # alone says too little
    assert judge_kernel_log(XFS_REPLAYED[1:], "sdb1", "xfs").verdict is Verdict.REPLAYED
    assert judge_kernel_log(XFS_CLEAN[1:], "sdb1", "xfs").verdict is Verdict.UNKNOWN


def test_btrfs_tree_log_replay() -> None:
    judged = judge_kernel_log(BTRFS_REPLAYED, "dm-0", "btrfs")
    assert judged.verdict is Verdict.REPLAYED
    assert judged.evidence == "BTRFS info (device dm-0): start tree-log replay"
    assert judge_kernel_log(BTRFS_REPLAYED[:3], "dm-0", "btrfs").verdict is Verdict.CLEAN
    # newer kernels add the file system's state inside the parentheses
    stated = [line.replace("(device dm-0)", "(device dm-0 state M)") for line in BTRFS_REPLAYED]
    assert judge_kernel_log(stated, "dm-0", "btrfs").verdict is Verdict.REPLAYED


def test_a_type_without_a_replay_message_is_unknown() -> None:
    judged = judge_kernel_log(EXT4_CRASHED_THEN_CLEAN, "loop0", "f2fs")
    assert judged.verdict is Verdict.UNKNOWN
    assert "f2fs" in judged.detail


def test_a_root_other_than_slash_gets_no_verdict(tmp_path: Path) -> None:
    def log() -> list[str]:
        raise AssertionError("the live kernel log must not be read for another root")

    record = crash_record(str(tmp_path), root=str(tmp_path), kernel_log=log)
    assert record.verdict is Verdict.UNKNOWN
    assert "describe this machine" in record.detail
    assert record.consulted is False
    assert record.kernel_name is None  # udev was not asked either


def test_a_mount_with_no_block_device_is_unknown(tmp_path: Path) -> None:
    # /proc is never on a block device
    record = crash_record("/proc", kernel_log=list)
    assert record.verdict is Verdict.UNKNOWN
    assert record.device is None
    assert record.fs_type == "proc"


def _imports_seen(monkeypatch: pytest.MonkeyPatch, refused: str = "") -> list[str]:
    """The modules asked of importlib from now on; `refused` ones raise ImportError."""
    seen: list[str] = []
    real_import = importlib.import_module

    def watched(name: str, package: str | None = None) -> Any:
        seen.append(name)
        if refused and name == refused:
            raise ImportError(name)
        return real_import(name, package)

    monkeypatch.setattr(importlib, "import_module", watched)
    return seen


def _on_a_block_device(record: fs_crash.FsCrashRecord) -> None:
    if record.device is None:
        pytest.skip(f"the repo is on no block device: {record.detail}")


@pytest.fixture
def untyped_mountinfo(tmp_path: Path) -> str:
    """A mountinfo that names no mount, so gives no file system type."""
    if not Path("/sys/dev/block").is_dir():
        pytest.skip("no /sys/dev/block")
    empty = tmp_path / "mountinfo"
    empty.write_text("")
    return str(empty)


def test_sysfs_names_the_device_as_udev_does_and_pyudev_is_not_loaded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if not Path("/sys/dev/block").is_dir():
        pytest.skip("no /sys/dev/block")
    seen = _imports_seen(monkeypatch)
    record = crash_record(str(REPO), kernel_log=list)
    _on_a_block_device(record)
    # mountinfo gave the type: one readlink named the device, at boot, without pyudev.
    assert (record.device_source, "pyudev" in seen) == ("sysfs", False)
    assert Path(f"/sys/class/block/{record.kernel_name}").exists()
    pyudev = pytest.importorskip("pyudev")
    major, minor = map(int, str(record.device).split(":"))
    udev = pyudev.Devices.from_device_number(pyudev.Context(), "block", os.makedev(major, minor))
    assert record.kernel_name == udev.sys_name


def test_without_a_type_in_mountinfo_udev_is_asked(
    untyped_mountinfo: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("pyudev")
    seen = _imports_seen(monkeypatch)
    record = crash_record(str(REPO), kernel_log=list, mountinfo=untyped_mountinfo)
    _on_a_block_device(record)
    assert (record.device_source, "pyudev" in seen) == ("pyudev", True)
    assert record.kernel_name and Path(f"/sys/class/block/{record.kernel_name}").exists()


def test_without_pyudev_and_a_type_the_record_says_what_it_lacks(
    untyped_mountinfo: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    _imports_seen(monkeypatch, refused="pyudev")
    record = crash_record(str(REPO), kernel_log=list, mountinfo=untyped_mountinfo)
    _on_a_block_device(record)
    assert record.device_source == "sysfs (pyudev is not installed)"
    assert (record.verdict, record.detail) == (
        Verdict.UNKNOWN,
        "file system type unknown (not in mountinfo)",
    )


def test_an_unreadable_kernel_log_is_unknown(tmp_path: Path) -> None:
    def log() -> list[str]:
        raise fs_crash.KernelLogUnreadable("/dev/kmsg: Operation not permitted")

    record = crash_record(str(REPO), kernel_log=log)
    assert record.verdict is Verdict.UNKNOWN
    if record.device is not None and record.kernel_name is not None:
        assert "no kernel log" in record.detail


def _why_not() -> str | None:
    missing_tool = journal_files.why_not()
    if missing_tool:
        return missing_tool
    if os.geteuid() != 0:
        return "needs root for loop devices and unshare --mount"
    if not Path("/dev/loop-control").exists():
        return "needs loop devices (/dev/loop-control)"
    for tool in ("unshare", "mkfs.ext4", "dumpe2fs", "e2fsck", "findmnt"):
        if shutil.which(tool) is None:
            return f"needs {tool} (util-linux, e2fsprogs)"
    return None


@pytest.fixture(scope="module")
def crashed_ext4(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    reason = _why_not()
    if reason:
        cannot_run(reason)
    work = tmp_path_factory.mktemp("fscrash")
    proc = subprocess.run(
        [*unshare(), sys.executable, "-m", "tests.fs_crash_scenario", str(work)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0 and "mount" in proc.stderr and "loop" in proc.stderr:
        cannot_run(f"cannot loop-mount an image here: {proc.stderr.strip()[-300:]}")
    assert proc.returncode == 0, proc.stderr
    doc: dict[str, Any] = json.loads(proc.stdout)
    return doc


def test_the_copy_was_really_crashed(crashed_ext4: dict[str, Any]) -> None:
    assert "needs_recovery" in crashed_ext4["crashed_features"]
    assert "needs_recovery" not in crashed_ext4["clean_features"]
    assert "skipping journal recovery" in crashed_ext4["crashed_fsck"]
    # the files the crash left existed only in the journal, and the replay brought them back
    assert len(crashed_ext4["crashed"]["entries"]) == 20


def test_a_replayed_ext4_says_replayed_with_the_kernel_line(crashed_ext4: dict[str, Any]) -> None:
    seen = crashed_ext4["crashed"]
    record = seen["record"]
    name = Path(seen["source"]).name
    assert name.startswith("loop")
    assert record["kernel_name"] == name
    assert record["fs_type"] == "ext4"
    assert record["verdict"] == "replayed", record
    assert record["evidence"] == f"EXT4-fs ({name}): recovery complete"


def test_a_cleanly_unmounted_ext4_says_clean(crashed_ext4: dict[str, Any]) -> None:
    seen = crashed_ext4["clean"]
    record = seen["record"]
    assert record["kernel_name"] == Path(seen["source"]).name
    assert record["verdict"] == "clean", record
    assert record["evidence"].startswith(f"EXT4-fs ({record['kernel_name']}): mounted filesystem")


def test_where_kmsg_is_hidden_this_boots_kernel_lines_in_the_journal_decide(
    crashed_ext4: dict[str, Any],
) -> None:
    # As under the unit (PrivateDevices=, ProtectKernelLogs=): no /dev/kmsg, and the journal
    # holds this boot's lines and another boot's, which say otherwise and must not count.
    for case, verdict in (("crashed", "replayed"), ("clean", "clean")):
        seen = crashed_ext4[case]
        record = seen["from_journal"]
        assert record["verdict"] == verdict, record
        assert record["log"] == "journal"
        assert record["evidence"] == seen["record"]["evidence"]
        assert record["detail"].endswith("(journal)")
        assert seen["record"]["log"] == "kmsg"


# --- this boot's kernel log as journald keeps it ----------------------------------------------


def _kernel_entries(boot: str, lines: list[str], at: int) -> list[dict[str, str]]:
    return [
        {
            "__REALTIME_TIMESTAMP": str(at + n),
            "__MONOTONIC_TIMESTAMP": str(1_000_000 + n),
            "_BOOT_ID": boot,
            "_TRANSPORT": "kernel",
            "MESSAGE": line,
        }
        for n, line in enumerate(lines)
    ]


@pytest.fixture
def two_boots_journal(tmp_path: Path) -> tuple[Path, str, str]:
    reason = journal_files.why_not()
    if reason:
        cannot_run(reason)
    earlier, this = "1" * 32, "2" * 32
    entries = _kernel_entries(earlier, ["EXT4-fs (vda): recovery complete"], 1_700_000_000_000_000)
    entries += _kernel_entries(
        this,
        ["Linux version 6.12.0", *EXT4_CRASHED_THEN_CLEAN, "virtio_net virtio0 eth0: renamed"],
        1_790_000_000_000_000,
    )
    # A message of this boot that did not come from the kernel names no mount.
    entries.append(
        {
            "__REALTIME_TIMESTAMP": "1790000000000100",
            "__MONOTONIC_TIMESTAMP": "1000100",
            "_BOOT_ID": this,
            "_TRANSPORT": "syslog",
            "MESSAGE": "EXT4-fs (loop0): recovery complete",
        }
    )
    write = journal_files.write_journal(tmp_path / "journal", entries)
    return write.parent, earlier, this


def test_the_journal_gives_this_boots_kernel_lines_that_name_a_mount(
    two_boots_journal: tuple[Path, str, str],
) -> None:
    directory, _, this = two_boots_journal
    boot_id = f"{this[:8]}-{this[8:12]}-{this[12:16]}-{this[16:20]}-{this[20:]}"
    lines = fs_crash.journal_kernel_log(boot_id, directory=str(directory))
    assert lines == [line for line in EXT4_CRASHED_THEN_CLEAN if line.startswith("EXT4-fs")]


def test_another_boots_replay_in_the_journal_is_not_this_boots(
    two_boots_journal: tuple[Path, str, str],
) -> None:
    directory, earlier, _ = two_boots_journal
    # Read as the earlier boot, its one line is all there is: no mount of vda completed.
    assert fs_crash.journal_kernel_log(earlier, directory=str(directory)) == [
        "EXT4-fs (vda): recovery complete"
    ]
    assert fs_crash.journal_kernel_log("3" * 32, directory=str(directory)) == []


def test_a_journal_read_that_runs_out_of_time_is_no_log(
    two_boots_journal: tuple[Path, str, str],
) -> None:
    directory, _, this = two_boots_journal
    ticks = iter(range(0, 1000, 5))
    with pytest.raises(fs_crash.KernelLogUnreadable, match=r"not read in 1\.0 s"):
        fs_crash.journal_kernel_log(this, directory=str(directory), clock=lambda: next(ticks))


def test_without_a_boot_id_or_systemd_python_the_journal_is_no_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(fs_crash.KernelLogUnreadable, match="no boot id"):
        fs_crash.journal_kernel_log("", directory=str(tmp_path))
    real_import = importlib.import_module

    def no_systemd(name: str) -> Any:
        if name.startswith("systemd"):
            raise ImportError(name)
        return real_import(name)

    monkeypatch.setattr(importlib, "import_module", no_systemd)
    with pytest.raises(fs_crash.KernelLogUnreadable, match="systemd-python not installed"):
        fs_crash.journal_kernel_log("2" * 32, directory=str(tmp_path))
