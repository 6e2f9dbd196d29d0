"""wtmpdb's sqlite database: the boot rows where Debian 13 and openSUSE no longer write wtmp.

Facts in shared/reference/boot-records.md section 3 and thkukuk/wtmpdb lib/sqlite.c: one table
wtmp(ID, Type, User, Login, Logout, TTY, RemoteHost, Service); times in microseconds since the
epoch; a boot row is Type 1 with TTY "~", User "reboot" for a kernel boot and "soft-reboot" for
systemd's soft reboot (same kernel); `wtmpdb shutdown` sets Logout on the newest open "~" row.
`wtmpdb rotate` moves old rows, renumbered, into <dir>/wtmp_<yyyymmdd>.db beside the live file.

Opened read-only (mode=ro), never immutable=1: immutable skips locking and change detection,
so a row being written at boot, or a hot journal left by the crash this reader is asked about,
could be read half-applied. A read-only connection writes nothing; it takes a shared lock for
the few milliseconds of a bounded read and does not wait for a writer (a locked database is a
warning).
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence

from cni_reaper.node_root import LeavesRoot, host_path, open_inside
from cni_reaper.record import Record
from cni_reaper.unopened import NotRegularFile, refuse_unless_regular

BOOT_TIME = 1  # wtmpdb's own enum (include/wtmpdb.h), not utmp's
BOOT_TTY = "~"
KERNEL_BOOT = "reboot"
SOFT_REBOOT = "soft-reboot"
# Rows read per database, newest first: enough for many boots of a busy login host, bounded
# so that a huge database cannot hold the boot back.
MAX_ROWS = 20_000
# sqlite virtual-machine steps per query before it is interrupted: the time bound.
MAX_STEPS = 5_000_000
# How long to wait for a writer holding the database: not at all, in effect.
BUSY_TIMEOUT = 0.05
_ROTATED = re.compile(r"_[0-9]{8}\.db\Z")


class WtmpdbRow(Record):
    id: int
    type: int
    user: str
    login: float  # seconds since the epoch
    logout: float | None
    tty: str
    host: str

    @property
    def is_boot(self) -> bool:
        return self.type == BOOT_TIME and self.tty == BOOT_TTY and self.user == KERNEL_BOOT

    @property
    def is_soft_reboot(self) -> bool:
        return self.type == BOOT_TIME and self.tty == BOOT_TTY and self.user == SOFT_REBOOT


def rotated_names(names: Sequence[str], live: str) -> list[str]:
    """The rotated databases of the live one among names, oldest first: Debian's logrotate
    names (wtmp.db.4 ... wtmp.db.1), then upstream's dated ones (wtmp_<yyyymmdd>.db, which
    sort by date)."""
    stem = live[:-3] if live.endswith(".db") else live
    numbered = sorted(
        (int(n[len(live) + 1 :]), n)
        for n in names
        if n.startswith(live + ".") and n[len(live) + 1 :].isdigit() and len(n) - len(live) < 6
    )
    dated = sorted(
        n for n in names if n.startswith(stem) and _ROTATED.match(n, len(stem)) is not None
    )
    return [n for _, n in reversed(numbered)] + dated


def read(root: str, node_path: str) -> tuple[list[WtmpdbRow], list[str], list[str]]:
    """Rows of the rotated databases then the live one, oldest first; the databases read and
    the warnings. Nothing here raises: every failure is a warning and fewer rows."""
    rows: list[WtmpdbRow] = []
    warnings: list[str] = []
    read_from: list[str] = []
    try:  # the node's own symlinks followed inside the root: rotated files lie beside the target
        fd, node_path = open_inside(root, node_path)
        os.close(fd)
    except (OSError, LeavesRoot):
        pass  # said again when the live file itself is read
    parent, live = os.path.split(node_path)
    names: list[str] = []
    try:
        fd, _ = open_inside(root, parent, directory=True)
    except FileNotFoundError:
        return rows, read_from, warnings
    except (OSError, LeavesRoot) as e:
        return rows, read_from, [f"cannot read wtmpdb's dir {host_path(root, parent)}: {e}"]
    try:
        names = os.listdir(fd)
    except OSError as e:
        warnings.append(f"cannot list {host_path(root, parent)}: {e.strerror}")
    finally:
        os.close(fd)
    for name in [*rotated_names(names, live), live]:
        found, more, why = _read_one(root, os.path.join(parent, name))
        if why:
            warnings.append(why)
        if found:
            read_from.append(host_path(root, os.path.join(parent, name)))
            rows.extend(more)
    return rows, read_from, warnings


def _read_one(root: str, node_path: str) -> tuple[bool, list[WtmpdbRow], str]:
    """(whether the database was read, its rows oldest first, a warning or "")."""
    shown = host_path(root, node_path)
    try:
        fd, resolved = open_inside(root, node_path)
    except FileNotFoundError:
        return False, [], ""
    except LeavesRoot as e:
        return False, [], f"wtmpdb {shown} refused: {e}"
    except NotRegularFile as e:
        return (
            False,
            [],
            f"wtmpdb {shown} is not a regular file (a {e.kind}, never opened); ignored",
        )
    except OSError as e:
        return False, [], f"cannot read wtmpdb {shown}: {e.strerror or e}"
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            return False, [], f"wtmpdb {shown} is not a regular file; ignored"
        if before.st_size == 0:
            return True, [], ""  # Debian's logrotate leaves an empty live file: an empty table
        # sqlite opens by name: the name the node's symlinks resolved to, with none left on the
        # way, checked to still be the file looked at.
        path = host_path(root, resolved)
        if not _same(path, before):
            return False, [], f"wtmpdb {shown} changed while being opened; ignored"
        odd = _odd_side_file(path)
        if odd:
            return False, [], f"wtmpdb {shown}: {odd}; ignored"
        rows, why = _query(path)
        if why:
            return False, [], f"wtmpdb {shown}: {why}"
        if not _same(path, before):
            return False, [], f"wtmpdb {shown} was replaced while being read; ignored"
        return True, rows, ""
    finally:
        os.close(fd)


# The files sqlite opens beside a database by itself: a WAL's (read and write, made if absent)
# and a rollback journal's.
_SIDE_FILES = ("-wal", "-shm", "-journal")


def _odd_side_file(path: str) -> str:
    """Which of the database's side files is no regular file (sqlite would open it, a device
    a node's disk put there included), or ""."""
    for suffix in _SIDE_FILES:
        try:
            refuse_unless_regular(path + suffix)
        except FileNotFoundError:
            continue
        except NotRegularFile as e:
            return f"its {suffix[1:]} file is not a regular file (a {e.kind}, never opened)"
        except OSError as e:
            return f"its {suffix[1:]} file cannot be looked at: {e.strerror or e}"
    return ""


def _same(path: str, st: os.stat_result) -> bool:
    try:
        now = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino) and stat.S_ISREG(now.st_mode)


def _query(path: str) -> tuple[list[WtmpdbRow], str]:
    # Loaded only where a wtmpdb exists: sqlite3 (with datetime) and urllib.parse took about
    # 3 ms of every run's start-up.
    import sqlite3  # noqa: PLC0415
    import urllib.parse  # noqa: PLC0415

    uri = f"file:{urllib.parse.quote(path)}?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT, isolation_level=None)
    except sqlite3.Error as e:
        return [], f"cannot open: {e}"
    steps = [0]

    def progress() -> int:
        steps[0] += 1
        return 1 if steps[0] * 1000 > MAX_STEPS else 0

    try:
        conn.set_progress_handler(progress, 1000)
        cursor = conn.execute(
            "SELECT ID, Type, User, Login, Logout, TTY, RemoteHost FROM wtmp "
            "ORDER BY ID DESC LIMIT ?",
            (MAX_ROWS,),
        )
        raw = cursor.fetchall()
    except sqlite3.OperationalError as e:
        text = str(e)
        if "locked" in text or "busy" in text:
            return [], "locked by a writer; not read"
        if "interrupted" in text:
            return [], f"not read within {MAX_STEPS} sqlite steps"
        return [], f"not readable as wtmpdb's table: {text}"
    except sqlite3.Error as e:
        return [], f"not readable: {e}"
    finally:
        conn.close()
    rows = [r for r in map(_row, raw) if r is not None]
    rows.reverse()
    return rows, ""


def _row(raw: tuple[object, ...]) -> WtmpdbRow | None:
    rid, rtype, user, login, logout, tty, host = raw
    if not isinstance(rid, int) or not isinstance(rtype, int) or not isinstance(login, int):
        return None
    if logout is not None and not isinstance(logout, int):
        return None
    return WtmpdbRow(
        rid,
        rtype,
        user if isinstance(user, str) else "",
        login / 1e6,
        logout / 1e6 if logout is not None else None,
        tty if isinstance(tty, str) else "",
        host if isinstance(host, str) else "",
    )
