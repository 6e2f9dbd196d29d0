"""The wtmpdb witness against databases laid out with wtmpdb's schema (lib/sqlite.c), written
here with the standard library's sqlite3 as wtmpdb writes them: boot rows, logouts, soft
reboots, rotated files, and the databases a node can hold instead (locked, corrupt, newer,
a symlink or a FIFO)."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Optional

import pytest

from cni_reaper import boot, cli
from cni_reaper.boot import BootEnd, boots_from_wtmpdb
from cni_reaper.evidence import wtmpdb
from cni_reaper.paths import DEFAULT_WTMPDB_PATH, NodePaths
from tests.crashed import Crashed
from tests.nodetree import CONTAINER_IDS, NodeTree

T = 1_790_000_000.0
# wtmpdb creates the table STRICT, which needs SQLite >= 3.37 even to open the file; Python
# 3.9's sqlite3 may link an older one, so the tests lay out the same columns without STRICT
# there.
STRICT = " STRICT" if sqlite3.sqlite_version_info >= (3, 37) else ""
SCHEMA = (
    "CREATE TABLE wtmp(ID INTEGER PRIMARY KEY, Type INTEGER, User TEXT NOT NULL, "
    f"Login INTEGER, Logout INTEGER, TTY TEXT, RemoteHost TEXT, Service TEXT){STRICT}"
)

# (Type, User, Login s, Logout s or None, TTY)
Row = tuple[int, str, float, Optional[float], str]


def boot_row(login: float, logout: float | None = None, user: str = "reboot") -> Row:
    return (1, user, login, logout, "~")


def login_row(login: float, logout: float | None = None) -> Row:
    return (3, "admin", login, logout, "pts/0")


def write_db(path: Path, rows: Sequence[Row], schema: str = SCHEMA) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(path) as db:
        db.execute(schema)
        db.executemany(
            "INSERT INTO wtmp (Type, User, Login, Logout, TTY, RemoteHost) "
            "VALUES (?, ?, ?, ?, ?, '6.12.0-test')",
            [
                (t, u, int(login * 1e6), None if out is None else int(out * 1e6), tty)
                for t, u, login, out, tty in rows
            ],
        )
    db.close()


def read_boots(
    root: Path, node_path: str = DEFAULT_WTMPDB_PATH
) -> tuple[list[boot.Boot], list[str]]:
    rows, _, warnings = wtmpdb.read(str(root), node_path)
    return boots_from_wtmpdb(rows), warnings


def db_path(root: Path) -> Path:
    return root / DEFAULT_WTMPDB_PATH.lstrip("/")


def test_a_boot_with_a_logout_ended_cleanly_one_without_crashed(tmp_path: Path) -> None:
    write_db(
        db_path(tmp_path),
        [
            boot_row(T, T + 100),
            login_row(T + 10, T + 20),
            boot_row(T + 200),
            login_row(T + 210, T + 290),
            boot_row(T + 300),
        ],
    )
    boots, warnings = read_boots(tmp_path)
    assert warnings == []
    assert [(b.start, b.end, b.shutdown, b.source) for b in boots] == [
        (T, BootEnd.CLEAN, T + 100, "wtmpdb"),
        (T + 200, BootEnd.CRASHED, None, "wtmpdb"),
        (T + 300, BootEnd.RUNNING, None, "wtmpdb"),
    ]
    assert boots[1].last_record == T + 290  # the newest time of any row in that boot
    assert boots[0].kernel == "6.12.0-test"


def test_a_soft_reboot_is_the_same_kernel_boot_and_its_logout_ends_it(tmp_path: Path) -> None:
    write_db(
        db_path(tmp_path),
        [
            boot_row(T, T + 50),
            boot_row(T + 50, T + 100, user="soft-reboot"),
            boot_row(T + 200),
            boot_row(T + 250, user="soft-reboot"),
            boot_row(T + 400),
        ],
    )
    boots, _ = read_boots(tmp_path)
    assert [(b.start, b.end) for b in boots] == [
        (T, BootEnd.CLEAN),
        (T + 200, BootEnd.CRASHED),  # closed at its soft reboot, crashed after it
        (T + 400, BootEnd.RUNNING),
    ]


def test_rotated_databases_come_first_oldest_first(tmp_path: Path) -> None:
    live = db_path(tmp_path)
    write_db(live.parent / "wtmp_20250101.db", [boot_row(T, T + 10)])
    write_db(live.parent / "wtmp_20260101.db", [boot_row(T + 100)])
    write_db(live, [boot_row(T + 200, T + 210), boot_row(T + 300)])
    rows, read_from, warnings = wtmpdb.read(str(tmp_path), DEFAULT_WTMPDB_PATH)
    assert warnings == []
    assert [Path(p).name for p in read_from] == ["wtmp_20250101.db", "wtmp_20260101.db", "wtmp.db"]
    assert [(b.start, b.end) for b in boots_from_wtmpdb(rows)] == [
        (T, BootEnd.CLEAN),
        (T + 100, BootEnd.CRASHED),
        (T + 200, BootEnd.CLEAN),
        (T + 300, BootEnd.RUNNING),
    ]


def test_debians_layout_a_symlink_inside_the_root_and_an_empty_live_file(tmp_path: Path) -> None:
    """Debian 13: /var/lib/wtmpdb/wtmp.db -> ../../log/wtmp.db; after logrotate the live file
    is empty and the history is in wtmp.db.1."""
    log = tmp_path / "var/log"
    write_db(log / "wtmp.db.1", [boot_row(T), boot_row(T + 100)])
    (log / "wtmp.db").write_bytes(b"")
    link = db_path(tmp_path)
    link.parent.mkdir(parents=True)
    link.symlink_to("../../log/wtmp.db")
    # The node's link is followed inside the root; the rotated file is looked for beside its
    # target.
    boots, warnings = read_boots(tmp_path, "/var/log/wtmp.db")
    assert warnings == []
    assert [(b.start, b.end) for b in boots] == [(T, BootEnd.CRASHED), (T + 100, BootEnd.RUNNING)]
    assert read_boots(tmp_path) == (boots, [])


def test_a_symlink_out_of_the_root_is_refused_an_absolute_one_stays_inside(
    tmp_path: Path,
) -> None:
    root = tmp_path / "node"
    outside = tmp_path / "host.db"
    write_db(outside, [boot_row(T), boot_row(T + 100)])
    link = db_path(root)
    link.parent.mkdir(parents=True)
    link.symlink_to("../" * 6 + "host.db")
    boots, warnings = read_boots(root)
    assert boots == []
    assert len(warnings) == 1 and "refused" in warnings[0] and "leads out of" in warnings[0]

    link.unlink()
    link.symlink_to(outside)  # absolute: the node's own path, under the root
    boots, warnings = read_boots(root)
    assert (boots, warnings) == ([], [])


def test_a_fifo_is_not_read_and_does_not_hang(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    boots, warnings = read_boots(tmp_path)
    assert boots == []
    assert warnings == [f"wtmpdb {path} is not a regular file (a FIFO, never opened); ignored"]


def test_corrupt_bytes_are_a_warning(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    write_db(path, [boot_row(T), boot_row(T + 100)])
    data = bytearray(path.read_bytes())
    data[100:] = b"\xa5" * (len(data) - 100)  # the header kept, every page garbage
    path.write_bytes(bytes(data))
    boots, warnings = read_boots(tmp_path)
    assert boots == []
    assert len(warnings) == 1 and warnings[0].startswith(f"wtmpdb {path}: ")

    path.write_bytes(b"not a database at all" * 100)
    boots, warnings = read_boots(tmp_path)
    assert boots == [] and len(warnings) == 1


def test_a_newer_schema_with_more_columns_is_read_one_without_the_table_is_a_warning(
    tmp_path: Path,
) -> None:
    path = db_path(tmp_path)
    write_db(
        path,
        [boot_row(T, T + 5), boot_row(T + 100)],
        SCHEMA.replace("Service TEXT)", "Service TEXT, BootId TEXT, Extra BLOB)"),
    )
    boots, warnings = read_boots(tmp_path)
    assert warnings == []
    assert [(b.start, b.end) for b in boots] == [(T, BootEnd.CLEAN), (T + 100, BootEnd.RUNNING)]

    path.unlink()
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE boots(ID INTEGER PRIMARY KEY, Login INTEGER)")
    db.close()
    boots, warnings = read_boots(tmp_path)
    assert boots == []
    assert warnings == [f"wtmpdb {path}: not readable as wtmpdb's table: no such table: wtmp"]


def test_rows_of_the_wrong_types_are_skipped(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    path.parent.mkdir(parents=True)
    with sqlite3.connect(path) as db:
        db.execute(SCHEMA.replace(STRICT, ""))  # only a non-STRICT table holds these
        db.execute("INSERT INTO wtmp VALUES (1, 1, 'reboot', 'yesterday', NULL, '~', 'k', NULL)")
        db.execute("INSERT INTO wtmp VALUES (2, 1, 'reboot', 5, x'00', '~', 'k', NULL)")
        db.execute(
            "INSERT INTO wtmp VALUES (3, 1, 'reboot', ?, NULL, '~', x'07', NULL)", (int(T * 1e6),)
        )
    db.close()
    boots, warnings = read_boots(tmp_path)
    assert warnings == []
    assert [(b.start, b.kernel) for b in boots] == [(T, "")]


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    path = db_path(tmp_path)
    write_db(path, [boot_row(T), boot_row(T + 100)])
    db = sqlite3.connect(path, isolation_level=None)
    yield db
    db.close()


def test_a_writer_with_a_pending_change_does_not_stop_the_reader(
    tmp_path: Path, writer: sqlite3.Connection
) -> None:
    writer.execute("BEGIN IMMEDIATE")
    writer.execute("UPDATE wtmp SET Logout = 1 WHERE ID = 1")
    boots, warnings = read_boots(tmp_path)
    assert warnings == []
    assert [b.end for b in boots] == [BootEnd.CRASHED, BootEnd.RUNNING]  # only what is committed
    writer.execute("ROLLBACK")


def test_a_database_locked_by_a_writer_is_a_warning_at_once(
    tmp_path: Path, writer: sqlite3.Connection
) -> None:
    writer.execute("BEGIN EXCLUSIVE")
    writer.execute("UPDATE wtmp SET Logout = 1 WHERE ID = 1")
    began = time.monotonic()
    boots, warnings = read_boots(tmp_path)
    assert time.monotonic() - began < 2
    assert boots == []
    assert warnings == [f"wtmpdb {db_path(tmp_path)}: locked by a writer; not read"]
    writer.execute("ROLLBACK")
    assert read_boots(tmp_path)[1] == []


def test_the_reader_writes_nothing(tmp_path: Path) -> None:
    path = db_path(tmp_path)
    write_db(path, [boot_row(T), boot_row(T + 100)])
    before = {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in path.parent.iterdir()}
    read_boots(tmp_path)
    after = {p.name: (p.stat().st_mtime_ns, p.stat().st_size) for p in path.parent.iterdir()}
    assert after == before  # no journal, no -wal or -shm, no change


def test_a_huge_database_is_read_in_bounded_rows(tmp_path: Path) -> None:
    rows = [login_row(T + i, T + i + 1) for i in range(wtmpdb.MAX_ROWS + 5000)]
    rows[0] = boot_row(T)
    rows[-1] = boot_row(T + 10**6)
    write_db(db_path(tmp_path), rows)
    began = time.monotonic()
    read, _, warnings = wtmpdb.read(str(tmp_path), DEFAULT_WTMPDB_PATH)
    assert time.monotonic() - began < 5
    assert warnings == []
    assert len(read) == wtmpdb.MAX_ROWS  # the newest: the old boot row is beyond the cap
    assert [b.start for b in boots_from_wtmpdb(read)] == [T + 10**6]


def test_load_takes_the_boots_from_wtmpdb_when_there_is_no_wtmp(tmp_path: Path) -> None:
    node = NodeTree(tmp_path)
    node.write_boot_world(btime=T + 1000)
    (tmp_path / "var/log/wtmp").unlink()
    write_db(db_path(tmp_path), [boot_row(T, T + 500), boot_row(T + 600), boot_row(T + 1000)])
    ctx = boot.load(NodePaths.build(root=str(tmp_path)), lambda: T + 1100)
    assert ctx.boots_source == "wtmpdb"
    assert ctx.current_start == T + 1000
    assert [(b.start, b.end) for b in ctx.previous_boots] == [
        (T, BootEnd.CLEAN),
        (T + 600, BootEnd.CRASHED),
    ]
    assert ctx.previous_boot_crashed is True
    assert ctx.warnings == ()
    assert dict(ctx.witnesses)["wtmp"] == "not found"


def test_load_says_when_wtmp_and_wtmpdb_agree_and_when_they_do_not(tmp_path: Path) -> None:
    node = NodeTree(tmp_path)
    node.boot(T + 20)  # PID 1's start, after the kernel's
    node.shutdown(T + 500)
    node.boot(T + 1010)
    node.write_boot_world(btime=T + 1000)
    write_db(db_path(tmp_path), [boot_row(T, T + 500), boot_row(T + 1000)])
    paths = NodePaths.build(root=str(tmp_path))
    ctx = boot.load(paths, lambda: T + 1100)
    assert (ctx.boots_source, ctx.warnings, ctx.previous_boot_crashed) == ("wtmp+wtmpdb", (), False)

    db_path(tmp_path).unlink()
    write_db(db_path(tmp_path), [boot_row(T), boot_row(T + 1000)])
    ctx = boot.load(paths, lambda: T + 1100)
    assert ctx.boots_source == "wtmp"  # its account is used, and the disagreement said
    assert ctx.previous_boot_crashed is False
    assert ctx.warnings == (
        "wtmp and wtmpdb disagree about the previous boot: wtmp's account is used",
    )


def test_a_crashed_node_with_only_wtmpdb_is_repaired(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """Debian 13: no wtmp, wtmpdb in /var/log/wtmp.db behind its symlink; the previous boot's
    row has no Logout. The crash left one results entry and an address whose entry is gone."""
    kept, lost = CONTAINER_IDS[:2]
    crashed.add(kept)
    os.unlink(crashed.add(lost))
    held = crashed.ips()
    assert len(held) == 2
    crashed.reboot()
    root, t0 = crashed.node.root, crashed.t0
    (root / "var/log/wtmp").unlink()
    write_db(
        root / "var/log/wtmp.db",
        [
            boot_row(t0 - 7200, t0 - 7000),
            boot_row(t0 - 3600),
            login_row(t0 - 3500),
            boot_row(t0 + 5),
        ],
    )
    link = db_path(root)
    link.parent.mkdir(parents=True)
    link.symlink_to("../../log/wtmp.db")

    code, report = crashed.run(capsys)

    assert code == 0
    prev = report["boot"]["previous_boots"][-1]
    assert report["boot"]["previous_boot_crashed"] is True
    assert report["boot"]["previous_boots_source"] == "wtmpdb"
    assert (prev["source"], prev["end"]) == ("wtmpdb", "crashed")
    assert {"source": "wtmp", "says": "not found"} in report["boot"]["boot_records"]
    (entry,) = report["entries"]
    assert entry["written"] == "previous-boot"
    assert "which crashed" in entry["evidence"] and "wtmpdb record" in entry["evidence"]
    assert entry["action"] == "keep"  # libcni reads it: the runtime's own DEL will use it
    # The address the crash left with no entry is released, the one with an entry stays.
    (reservation,) = report["host_local"]
    assert (reservation["action"], reservation["outcome"]) == ("del", "done")
    assert list(crashed.ips().values()) == [f"{kept}\r\neth0"]

    assert cli.run(crashed.argv("--dry-run"), clock=lambda: t0 + 60, environ={}) == 0
    assert "(wtmpdb) and crashed" in capsys.readouterr().out
