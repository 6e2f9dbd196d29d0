"""A command run as systemd runs a service, against a real systemd-journald of its own; run by
tests/test_journal.py.

Usage: unshare --mount --pid --fork --kill-child --mount-proc --propagation private \
           python -m tests.journald_scenario OUT.json -- COMMAND...

journald runs outside PID 1 here, its sockets and journal on tmpfs private to this mount
namespace. The command's stderr is a stream connection to journald, exactly as systemd hands it
to a service, with $JOURNAL_STREAM naming it; its stdout is kept. Every journal record the
command made is read back with journalctl and written to OUT.json with the command's exit code.
With $JOURNAL_COPY set, the journal files are also copied there, for journalctl to read later
(with a message catalog, say).

journald rate-limits a unit: the source it counts is the sender's unit, which it reads from the
sender's cgroup. A command run here sits in this namespace's root cgroup, which names no unit,
so nothing it sends is ever limited. With $JOURNAL_UNIT (a name such as cni-reaper-test.service)
the command runs in a cgroup of that name, made for it and removed after, as systemd runs a
service: journald then limits it as that unit. $JOURNALD_CONF is a journald.conf drop-in for
this journald (in /run/systemd/journald.conf.d/, which it reads), $JOURNAL_SIZE the size of the
tmpfs its journal is kept on (journald's burst grows with the journal's free room).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.private_node import private_tmpfs

JOURNALD = Path("/lib/systemd/systemd-journald")
SOCKETS = Path("/run/systemd/journal")
END_OF_STREAM = "journald_scenario: the command has exited"


def wait_for(path: Path, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"journald made no {path} within {seconds} s")
        time.sleep(0.05)


def stream_to_journald(identifier: str) -> socket.socket:
    """What systemd connects a service's stdout/stderr to: journald's stdout stream socket."""
    stream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stream.connect(str(SOCKETS / "stdout"))
    # identifier, unit id, priority, level prefix, forward to syslog, kmsg, console; a
    # service's own defaults: info, and a leading <N> read as the line's priority
    # (SyslogLevelPrefix=yes).
    stream.sendall(f"{identifier}\n\n6\n1\n0\n0\n0\n".encode())
    stream.shutdown(socket.SHUT_RD)
    return stream


def reaper_in_journald(
    root: Path, out: Path, *extra: str, journal_copy: Path | None = None
) -> dict[str, Any]:
    """The installed cni-reaper on root with the real plugins, as systemd runs it with a
    journald of its own (this module, run in a private mount and PID namespace): its exit
    code, its stdout and its journal records; with journal_copy, the journal's files too."""
    from tests.nodetree import PLUGIN_DIR  # noqa: PLC0415
    from tests.private_node import reaper_command, unshare  # noqa: PLC0415

    scenario = [*unshare(pid=True), sys.executable, "-m", "tests.journald_scenario", str(out)]
    reaper = [*reaper_command(), "--root", str(root), "--bin-dir", PLUGIN_DIR, *extra]
    env = {**os.environ, "JOURNAL_COPY": str(journal_copy)} if journal_copy else None
    proc = subprocess.run(
        [*scenario, "--", *reaper],
        env=env,
        cwd=Path(__file__).resolve().parent.parent,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def unified_cgroup_mount() -> Path:
    """Where the cgroup v2 hierarchy is that systemd (and journald) reads units from: the
    cgroup mount itself, or on a hybrid layout its "unified" part."""
    root = Path("/sys/fs/cgroup")
    return root if (root / "cgroup.procs").exists() else root / "unified"


def main(out: Path, command: list[str]) -> None:
    # The scenario's, not the command's.
    copy = os.environ.pop("JOURNAL_COPY", None)
    unit = os.environ.pop("JOURNAL_UNIT", None)
    conf = os.environ.pop("JOURNALD_CONF", None)
    size = os.environ.pop("JOURNAL_SIZE", None)
    for path in (Path("/run/systemd"), Path("/run/log"), Path("/var/log/journal")):
        if path.exists() or path.parent.exists():
            private_tmpfs(path)
    if size:
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"mode=0755,size={size}", "tmpfs", "/run/log"],
            check=True,
        )
    if conf:
        drop_ins = Path("/run/systemd/journald.conf.d")
        drop_ins.mkdir(parents=True, exist_ok=True)
        (drop_ins / "scenario.conf").write_text(conf)
    cgroup = unified_cgroup_mount() / unit if unit else None
    if cgroup is not None:
        cgroup.mkdir()
    journald = subprocess.Popen([str(JOURNALD)], stdout=subprocess.DEVNULL)
    try:
        for name in ("socket", "stdout"):
            wait_for(SOCKETS / name)
        stream = stream_to_journald("cni-reaper")
        st = os.fstat(stream.fileno())
        env = {**os.environ, "JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}

        def join_unit() -> None:
            # Before the command runs, so that its first record counts for the unit.
            if cgroup is not None:
                (cgroup / "cgroup.procs").write_text(str(os.getpid()))

        proc = subprocess.run(
            command,
            stdout=subprocess.PIPE,
            stderr=stream.fileno(),
            env=env,
            timeout=120,
            preexec_fn=join_unit if cgroup is not None else None,
        )
        # The stream's lines are read in order: after this one, the command's lines are in.
        stream.sendall(f"<7>{END_OF_STREAM}\n".encode())
        stream.close()
        records: list[dict[str, str]] = []
        deadline = time.monotonic() + 20
        # journald takes the datagrams in its own time; the summary record comes last, and
        # only a run that got as far as its report sends one.
        summary_due = proc.returncode in (0, 65, 73)
        while time.monotonic() < deadline:
            shown = subprocess.run(
                ["journalctl", "--directory=/run/log/journal", "-o", "json", "--no-pager"],
                capture_output=True,
                text=True,
            )
            records = [json.loads(line) for line in shown.stdout.splitlines() if line.strip()]
            ended = any(r.get("MESSAGE") == END_OF_STREAM for r in records)
            summary = any(r.get("CNI_REAPER_EVENT") == "summary" for r in records)
            if ended and (summary or not summary_due):
                break
            time.sleep(0.2)
        records = [r for r in records if r.get("MESSAGE") != END_OF_STREAM]
        if copy:
            shutil.copytree("/run/log/journal", copy)
        out.write_text(
            json.dumps(
                {
                    "exit": proc.returncode,
                    "stdout": proc.stdout.decode(errors="replace"),
                    "records": [r for r in records if r.get("SYSLOG_IDENTIFIER") == "cni-reaper"],
                    # journald's own ("Suppressed N messages from ..."), for the tests to read
                    "journald": [
                        r["MESSAGE"]
                        for r in records
                        if r.get("_TRANSPORT") == "driver" and isinstance(r.get("MESSAGE"), str)
                    ],
                }
            )
        )
    finally:
        journald.kill()
        journald.wait()
        if cgroup is not None:
            cgroup.rmdir()  # empty: the command has exited


if __name__ == "__main__":
    split = sys.argv.index("--")
    main(Path(sys.argv[1]), sys.argv[split + 1 :])
