"""glibc wtmp records: the two on-disk layouts, read as one stream, and written for tests.

Layouts and field offsets: shared/reference/boot-records.md section 1.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable, Iterator

from cni_reaper.choice import IntChoice
from cni_reaper.record import Record

# 384 bytes (x86_64, i386, ppc64el, riscv64, armhf): 32-bit time, read as unsigned since glibc 2.40.
LAYOUT_384 = struct.Struct("<h2xi32s4s32s256shhiIi16s20s")
# 400 bytes (aarch64, s390x, musl): 64-bit session and timeval.
LAYOUT_400 = struct.Struct("<h2xi32s4s32s256shhqqq16s20s4x")

MAX_UT_TYPE = 9


class UtType(IntChoice):
    EMPTY = 0
    RUN_LVL = 1
    BOOT_TIME = 2
    NEW_TIME = 3
    OLD_TIME = 4
    INIT_PROCESS = 5
    LOGIN_PROCESS = 6
    USER_PROCESS = 7
    DEAD_PROCESS = 8
    ACCOUNTING = 9


class WtmpRecord(Record):
    ut_type: int
    pid: int
    line: str
    ut_id: str
    user: str
    host: str
    time: float  # seconds since the epoch

    @property
    def is_boot(self) -> bool:
        # last(1) re-types records on line "~" by their user, whatever ut_type says.
        if self.line == "~":
            return self.user == "reboot"
        return self.ut_type == UtType.BOOT_TIME

    @property
    def is_shutdown(self) -> bool:
        if self.line == "~" and self.user == "shutdown":
            return True
        # SysV init wrote runlevel 0 (halt) or 6 (reboot) as the shutdown.
        return self.ut_type == UtType.RUN_LVL and chr(self.pid & 0xFF) in "06"


def _text(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def native_layout() -> struct.Struct:
    """The layout the userland writes: 400 bytes only for 64-bit aarch64/s390x userlands."""
    machine = os.uname().machine.lower()
    if machine in ("aarch64", "arm64", "s390x") and struct.calcsize("P") == 8:
        return LAYOUT_400
    return LAYOUT_384


def _decode(layout: struct.Struct, chunk: bytes) -> WtmpRecord:
    fields = layout.unpack(chunk)
    ut_type, pid, line, ut_id, user, host = fields[:6]
    # fields 6, 7 are ut_exit; 8 is the session; 9, 10 the timeval.
    tv_sec, tv_usec = fields[9], fields[10]
    return WtmpRecord(
        ut_type=ut_type,
        pid=pid,
        line=_text(line),
        ut_id=_text(ut_id),
        user=_text(user),
        host=_text(host),
        time=tv_sec + tv_usec / 1_000_000,
    )


def _plausible(layout: struct.Struct, data: bytes) -> bool:
    usable = len(data) - len(data) % layout.size
    for offset in range(0, usable, layout.size):
        ut_type = struct.unpack_from("<h", data, offset)[0]
        if not 0 <= ut_type <= MAX_UT_TYPE:
            return False
    return True


def pick_layout(data: bytes, preferred: struct.Struct | None = None) -> struct.Struct:
    """The native layout unless the data only makes sense in the other one."""
    first = preferred or native_layout()
    other = LAYOUT_400 if first is LAYOUT_384 else LAYOUT_384
    if _plausible(first, data):
        return first
    if _plausible(other, data):
        return other
    return first


def parse(data: bytes, layout: struct.Struct | None = None) -> Iterator[WtmpRecord]:
    """Records in file order; EMPTY records and a torn tail (a crash mid-append) are skipped."""
    layout = layout or pick_layout(data)
    usable = len(data) - len(data) % layout.size
    for offset in range(0, usable, layout.size):
        record = _decode(layout, data[offset : offset + layout.size])
        if record.ut_type == UtType.EMPTY:
            continue
        if not 0 <= record.ut_type <= MAX_UT_TYPE:
            continue
        yield record


def encode(record: WtmpRecord, layout: struct.Struct = LAYOUT_384) -> bytes:
    """One record as glibc writes it; used by tests and example builders."""
    seconds = int(record.time)
    micros = round((record.time - seconds) * 1_000_000)
    return layout.pack(
        record.ut_type,
        record.pid,
        record.line.encode(),
        record.ut_id.encode(),
        record.user.encode(),
        record.host.encode(),
        0,
        0,
        0,
        seconds,
        micros,
        b"",
        b"",
    )


def boot_record(time: float, kernel: str = "6.1.0-test") -> WtmpRecord:
    """What systemd-update-utmp writes at boot."""
    return WtmpRecord(UtType.BOOT_TIME, 0, "~", "~~", "reboot", kernel, time)


def shutdown_record(time: float, kernel: str = "6.1.0-test") -> WtmpRecord:
    """What systemd-update-utmp writes at shutdown."""
    return WtmpRecord(UtType.RUN_LVL, 0, "~", "~~", "shutdown", kernel, time)


def encode_all(records: Iterable[WtmpRecord], layout: struct.Struct = LAYOUT_384) -> bytes:
    return b"".join(encode(r, layout) for r in records)
