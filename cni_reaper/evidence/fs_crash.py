"""The file system's own crash record: was the results dir's file system replayed at mount?

A journaling file system that was not unmounted cleanly replays its journal at the next mount,
and the kernel says so in its log, naming the block device by its kernel name:

- ext4 (also ext3 and a journaled ext2 mounted by the ext4 driver): `EXT4-fs (sda1): recovery
  complete` before `EXT4-fs (sda1): mounted filesystem <uuid> r/w with ordered data mode...`;
  a read-only mount that needs it says `INFO: recovery required on readonly filesystem`;
- XFS: `XFS (sda1): Mounting V5 Filesystem <uuid>`, then `Starting recovery (logdev: internal)`
  and `Ending recovery (logdev: internal)`, or `Ending clean mount`;
- btrfs: `BTRFS info (device sda1): first mount of filesystem <uuid>`, then `start tree-log
  replay` when the fsync log holds anything.

A replay proves the file system holding the results dir was not unmounted cleanly, without
reading any clock. The log is read from /dev/kmsg (this boot's ring buffer, from its start,
non-blocking); where that cannot be read (the unit's PrivateDevices= and ProtectKernelLogs= hide
it) or no longer holds the mount (the ring has rotated), from this boot's kernel messages as
journald keeps them (_TRANSPORT=kernel), with systemd-python's C reader, in bounded time. The
live kernel log and udev describe the running machine: under a --root other than `/`, the record
names no device and gives no verdict.

The kernel name comes from sysfs (/sys/dev/block/<maj:min>); pyudev is imported only here,
only when sysfs cannot name the device or mountinfo does not give the file system's type (udev's
ID_FS_TYPE then); without it the record says so.
"""

from __future__ import annotations

import errno
import importlib
import os
import re
import stat
import time
from collections.abc import Callable, Iterable, Iterator

from cni_reaper.choice import Choice
from cni_reaper.evidence.journal_files import JournalUnavailable, open_journal
from cni_reaper.record import Record

KMSG = "/dev/kmsg"
MOUNTINFO = "/proc/self/mountinfo"
_MAX_RECORDS = 1 << 20  # the ring holds far fewer; a bound, so that a reader never spins
# This boot's kernel messages in the journal: read in at most this many seconds, at most this
# many entries (a boot's kernel log is a few thousand; a bound, not a target).
JOURNAL_DEADLINE = 1.0
_MAX_JOURNAL_ENTRIES = 200_000
# Only lines that can name a mount are kept: the families' prefixes, as plain text.
_MOUNT_TEXT = ("EXT4-fs (", "XFS (", "BTRFS ")


class Verdict(str, Choice):
    REPLAYED = "replayed"  # the journal was replayed at this boot's mount: not unmounted cleanly
    CLEAN = "clean"  # this boot's mount was seen, without a replay
    UNKNOWN = "unknown"


class _Kind(Choice):
    START = "start"  # a mount begins (XFS, btrfs)
    MOUNTED = "mounted"  # a mount is done (ext4)
    REPLAY = "replay"
    CLEAN = "clean"  # the file system says outright that the mount was clean (XFS)
    NO_JOURNAL = "no-journal"


class _Family(Record):
    name: str
    prefix: re.Pattern[str]  # group 1: the kernel name of the device
    events: tuple[tuple[re.Pattern[str], _Kind], ...]
    starts_episode: bool  # the episode opens with START (XFS, btrfs) or closes with MOUNTED


_EXT4 = _Family(
    "ext4",
    re.compile(r"EXT4-fs \(([^)\s]+)\): (.*)"),
    (
        (re.compile(r"^recovery complete"), _Kind.REPLAY),
        (re.compile(r"^INFO: recovery required on readonly filesystem"), _Kind.REPLAY),
        (re.compile(r"^mounted filesystem .*without journal"), _Kind.NO_JOURNAL),
        (re.compile(r"^mounted filesystem"), _Kind.MOUNTED),
    ),
    starts_episode=False,
)
_XFS = _Family(
    "xfs",
    re.compile(r"XFS \(([^)\s]+)\): (.*)"),
    (
        (re.compile(r"^Mounting V\d+ [Ff]ilesystem"), _Kind.START),
        (re.compile(r"^Starting recovery \(logdev: "), _Kind.REPLAY),
        (re.compile(r"^Ending recovery \(logdev: "), _Kind.REPLAY),
        (re.compile(r"^Ending clean mount"), _Kind.CLEAN),
    ),
    starts_episode=True,
)
_BTRFS = _Family(
    "btrfs",
    re.compile(r"BTRFS \w+ \(device ([^)\s]+)[^)]*\): (.*)"),  # "(device sda1 state M)"
    (
        (re.compile(r"^first mount of filesystem"), _Kind.START),
        (re.compile(r"^start tree-log replay"), _Kind.REPLAY),
    ),
    starts_episode=True,
)
_FAMILIES = {"ext4": _EXT4, "ext3": _EXT4, "ext2": _EXT4, "xfs": _XFS, "btrfs": _BTRFS}


class KernelLogVerdict(Record):
    verdict: Verdict
    evidence: str | None  # the kernel's line that decided it
    detail: str


class FsCrashRecord(Record):
    path: str
    device: str | None  # "major:minor" of the block device holding path
    kernel_name: str | None  # "sda1", "loop0", "dm-0"
    fs_type: str | None
    device_source: str  # "pyudev", "sysfs" (pyudev missing or failed), or why neither
    verdict: Verdict
    evidence: str | None
    detail: str
    log: str | None = None  # the kernel log that decided: "kmsg" or "journal"
    consulted: bool = True  # False under a --root other than "/": detail says why

    def to_json(self) -> dict[str, object]:
        doc = self._asdict()
        doc["verdict"] = self.verdict.value
        return doc


def judge_kernel_log(lines: Iterable[str], kernel_name: str, fs_type: str) -> KernelLogVerdict:
    """What this boot's kernel log says of the latest mount of kernel_name as fs_type.

    Only the latest mount counts: a loop device or a partition may be mounted several times in a
    boot, and an earlier mount's replay says nothing of the file system mounted there now."""
    family = _FAMILIES.get(fs_type)
    if family is None:
        return KernelLogVerdict(
            Verdict.UNKNOWN, None, f"{fs_type}: no journal replay message known for this type"
        )
    episodes: list[list[tuple[_Kind, str]]] = []
    current: list[tuple[_Kind, str]] = []
    for line in lines:
        found = family.prefix.search(line)
        if found is None or found.group(1) != kernel_name:
            continue
        message = found.group(2)
        kind = next((k for pattern, k in family.events if pattern.match(message)), None)
        if kind is None:
            continue
        if family.starts_episode:
            if kind is _Kind.START:
                current = []
                episodes.append(current)
            elif not episodes:  # the mount's first line was lost: still this device's events
                episodes.append(current)
            current.append((kind, line))
        else:
            current.append((kind, line))
            if kind in (_Kind.MOUNTED, _Kind.NO_JOURNAL):
                episodes.append(current)
                current = []
    if not episodes:
        return KernelLogVerdict(
            Verdict.UNKNOWN, None, f"no {family.name} mount of {kernel_name} in this boot's log"
        )
    last = episodes[-1]
    for kind, line in last:
        if kind is _Kind.REPLAY:
            return KernelLogVerdict(Verdict.REPLAYED, line, "the journal was replayed at mount")
    if any(kind is _Kind.NO_JOURNAL for kind, _ in last):
        return KernelLogVerdict(
            Verdict.UNKNOWN, last[-1][1], "mounted without a journal: nothing to replay"
        )
    if family.starts_episode and last[0][0] is not _Kind.START:
        return KernelLogVerdict(
            Verdict.UNKNOWN, last[0][1], "the start of the latest mount is not in the log"
        )
    return KernelLogVerdict(Verdict.CLEAN, last[-1][1], "mounted this boot without a replay")


class KernelLogUnreadable(Exception):
    pass


def read_kmsg(path: str = KMSG) -> Iterator[str]:
    """This boot's kernel log, from the oldest record the ring still holds, without blocking:
    the message text of each record (its dictionary lines left out)."""
    for _seq, message in _kmsg_records(path):
        yield message


def _kmsg_records(path: str) -> Iterator[tuple[int, str]]:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        raise KernelLogUnreadable(f"{path}: {os.strerror(e.errno or 0)}") from e
    try:
        for _ in range(_MAX_RECORDS):
            try:
                record = os.read(fd, 8192)
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno == errno.EPIPE:  # overwritten while we read: the next one follows
                    continue
                # EINVAL: a record longer than the buffer, which the kernel does not skip.
                # A log with a hole could hide the latest mount: no log at all is safer.
                raise KernelLogUnreadable(f"{path}: {os.strerror(e.errno or 0)}") from e
            if not record:
                return
            head, _, rest = record.decode("utf-8", "replace").partition(";")
            fields = head.split(",")
            try:
                seq = int(fields[1])
            except (IndexError, ValueError):
                continue
            yield seq, rest.split("\n", 1)[0]
    finally:
        os.close(fd)


def _kmsg_log(path: str) -> tuple[list[str], str]:
    """The ring's lines, and a note when it has rotated (an early mount may be gone)."""
    lines: list[str] = []
    first: int | None = None
    for seq, message in _kmsg_records(path):
        if first is None:
            first = seq
        lines.append(message)
    rotated = f" (the ring buffer has rotated: its oldest record is number {first})"
    return lines, rotated if first else ""


def journal_kernel_log(
    boot_id: str,
    *,
    directory: str | None = None,
    deadline: float = JOURNAL_DEADLINE,
    clock: Callable[[], float] = time.monotonic,
) -> list[str]:
    """This boot's kernel messages that can name a mount, as journald stored them: from the
    machine's journal (runtime and persistent), or from directory (tests). Raises
    KernelLogUnreadable when it cannot be read in full in time."""
    wanted = boot_id.replace("-", "")
    if len(wanted) != 32:
        raise KernelLogUnreadable("journal: no boot id to select this boot's entries by")
    started = clock()
    try:
        journal = open_journal(directory)
    except JournalUnavailable as e:
        raise KernelLogUnreadable(f"journal: {e}") from None
    except (OSError, ValueError) as e:
        raise KernelLogUnreadable(f"journal: cannot open it: {e}") from None
    lines: list[str] = []
    try:
        journal.match("_BOOT_ID", wanted)
        journal.match("_TRANSPORT", "kernel")
        for n in range(_MAX_JOURNAL_ENTRIES + 1):
            if n == _MAX_JOURNAL_ENTRIES or (n % 256 == 0 and clock() - started > deadline):
                late = f"journal: this boot's kernel log not read in {deadline} s"
                raise KernelLogUnreadable(late)
            if not journal.next():
                return lines
            # Only the message of each entry is fetched, as the journal holds it.
            message = (journal.field("MESSAGE") or b"").decode("utf-8", "replace")
            if any(t in message for t in _MOUNT_TEXT):
                lines.append(message)
    except OSError as e:
        raise KernelLogUnreadable(f"journal: {e}") from None
    finally:
        journal.close()
    return lines


class _Mount(Record):
    device: str  # major:minor as mountinfo gives it
    mount_point: str
    fs_type: str
    source: str


def _unescape(field: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _mounts(mountinfo: str) -> list[_Mount]:
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
            text = f.read()
    except OSError:
        return []
    mounts = []
    for line in text.splitlines():
        left, sep, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if not sep or len(fields) < 5 or len(tail) < 2:
            continue
        mounts.append(_Mount(fields[2], _unescape(fields[4]), tail[0], _unescape(tail[1])))
    return mounts


def _mount_of(path: str, st_dev: int, mountinfo: str) -> _Mount | None:
    """The mount holding path: of those with its st_dev, the deepest mount point above it."""
    want = f"{os.major(st_dev)}:{os.minor(st_dev)}"
    real = os.path.realpath(path)
    best: _Mount | None = None
    for mount in _mounts(mountinfo):
        if mount.device != want:
            continue
        point = mount.mount_point.rstrip("/") + "/"
        if (real + "/").startswith(point) and (
            best is None or len(point) > len(best.mount_point.rstrip("/") + "/")
        ):
            best = mount
    return best


def _block_device(st_dev: int, mount: _Mount | None) -> int | None:
    """The block device behind st_dev: itself, or for an anonymous device (a btrfs subvolume,
    major 0) the mount's source when that is a block device node."""
    if os.major(st_dev) != 0:
        return st_dev
    if mount is None or not mount.source.startswith("/dev/"):
        return None
    try:
        st = os.stat(mount.source)
    except OSError:
        return None
    return st.st_rdev if stat.S_ISBLK(st.st_mode) else None


def _kernel_name(rdev: int, fs_type_known: bool) -> tuple[str | None, str | None, str]:
    """The name the kernel's log gives a block device, and udev's ID_FS_TYPE for it when
    mountinfo did not give the type. The name comes from sysfs (_sysfs_name); pyudev, which
    reads the same kobject name, is asked only when sysfs cannot name the device or the type
    is wanted: importing it costs some 15 ms, at every boot, for what one readlink gives."""
    name = _sysfs_name(rdev)
    if name is not None and fs_type_known:
        return name, None, "sysfs"
    try:
        pyudev = importlib.import_module("pyudev")
    except ImportError:
        return name, None, "sysfs (pyudev is not installed)"
    try:
        device = pyudev.Devices.from_device_number(pyudev.Context(), "block", rdev)
        fs_type = device.properties.get("ID_FS_TYPE")
        kernel_name = str(device.sys_name).replace("!", "/")
        return kernel_name, str(fs_type) if fs_type else None, "pyudev"
    except Exception as e:  # pyudev raises its own errors and OSError; fall back to sysfs
        return name, None, f"sysfs (pyudev failed: {type(e).__name__}: {e})"


def _sysfs_name(rdev: int) -> str | None:
    """The disk's own name, as the kernel's messages print it (its block device name, never a
    /dev alias udev made): the kobject's, where /sys/dev/block/<maj:min> leads, with the "!"
    the kobject puts for each "/" of the name (cciss/c0d0p1) made "/" again."""
    try:
        target = os.readlink(f"/sys/dev/block/{os.major(rdev)}:{os.minor(rdev)}")
    except OSError:
        return None
    return os.path.basename(target).replace("!", "/") or None


def crash_record(
    path: str,
    *,
    root: str = "/",
    boot_id: str = "",
    kernel_log: Callable[[], Iterable[str]] | None = None,
    mountinfo: str = MOUNTINFO,
    kmsg: str = KMSG,
    journal_dir: str | None = None,
) -> FsCrashRecord:
    """What the file system holding path says of how it was last unmounted.

    path is the results dir as this process sees it (already under root). The kernel log is
    consulted only when root is "/": kmsg first, then this boot's (boot_id) kernel messages in
    the journal. kernel_log, for tests, replaces both; kmsg and journal_dir point them
    elsewhere."""
    if os.path.realpath(root) != "/":
        return FsCrashRecord(
            path,
            None,
            None,
            None,
            "none",
            Verdict.UNKNOWN,
            None,
            f"the root is {root}, and the live kernel log and udev describe this machine, "
            "not the root's",
            consulted=False,
        )
    try:
        st_dev = os.stat(path).st_dev
    except OSError as e:
        return FsCrashRecord(
            path, None, None, None, "none", Verdict.UNKNOWN, None, f"cannot stat: {e.strerror}"
        )
    mount = _mount_of(path, st_dev, mountinfo)
    fs_type = mount.fs_type if mount is not None else None
    rdev = _block_device(st_dev, mount)
    device = f"{os.major(rdev)}:{os.minor(rdev)}" if rdev is not None else None

    def unknown(source: str, name: str | None, detail: str) -> FsCrashRecord:
        return FsCrashRecord(path, device, name, fs_type, source, Verdict.UNKNOWN, None, detail)

    if rdev is None:
        return unknown("none", None, f"{fs_type or 'the file system'} is on no block device")
    name, udev_type, source = _kernel_name(rdev, fs_type is not None)
    fs_type = fs_type or udev_type
    if name is None:
        return unknown(source, None, f"no kernel name for block device {device}")
    if fs_type is None:
        return unknown(source, name, "file system type unknown (not in mountinfo)")
    logs: list[tuple[str, Callable[[], tuple[list[str], str]]]]
    if kernel_log is not None:
        given = kernel_log
        logs = [("kernel log", lambda: (list(given()), ""))]
    else:
        logs = [
            ("kmsg", lambda: _kmsg_log(kmsg)),
            ("journal", lambda: (journal_kernel_log(boot_id, directory=journal_dir), "")),
        ]
    notes: list[str] = []
    for label, read in logs:
        try:
            lines, rotated = read()
        except KernelLogUnreadable as e:
            notes.append(f"no kernel log: {e}")
            continue
        judged = judge_kernel_log(lines, name, fs_type)
        if judged.verdict is not Verdict.UNKNOWN:
            return FsCrashRecord(
                path,
                device,
                name,
                fs_type,
                source,
                judged.verdict,
                judged.evidence,
                f"{judged.detail} ({label})",
                label,
            )
        notes.append(f"{label}: {judged.detail}{rotated}")
    return unknown(source, name, "; ".join(notes))
