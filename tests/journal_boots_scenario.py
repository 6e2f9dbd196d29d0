"""Boots written by a real systemd-journald into a persistent journal directory; run by
tests/test_journal_witness.py.

Usage: unshare --mount --pid --fork --kill-child --mount-proc --propagation private \
           python -m tests.journal_boots_scenario JOURNAL_DIR BOOT_ID:END[:LINES]...

For each boot in turn (END is "clean" or "crash"; LINES more lines from a chatty service): the
kernel's boot id file is overlaid, in this mount namespace only, with BOOT_ID, so that journald
stamps that _BOOT_ID; journald starts with its sockets on a private tmpfs and JOURNAL_DIR bound
on /var/log/journal, is told to flush to /var (as systemd-journal-flush.service does at boot),
takes a few messages, and then either exits as at shutdown (SIGTERM: it writes "Journal
stopped") or dies as in a crash (SIGKILL).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.journald_scenario import JOURNALD, SOCKETS, wait_for
from tests.private_node import bind, private_tmpfs

KERNEL_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def one_boot(work: Path, boot_id: str, end: str, lines: int) -> None:
    id_file = work / f"boot_id.{boot_id}"
    id_file.write_text(boot_id + "\n")
    subprocess.run(["mount", "--bind", str(id_file), str(KERNEL_BOOT_ID)], check=True)
    journald = subprocess.Popen([str(JOURNALD)], stdout=subprocess.DEVNULL)
    try:
        for name in ("socket", "stdout"):
            wait_for(SOCKETS / name)
        subprocess.run(["journalctl", "--flush"], check=True, timeout=30)
        for n in range(3):
            subprocess.run(["logger", "-t", "boot-scenario", f"{boot_id} message {n}"], check=True)
        if lines:  # a big journal: one stream, as a chatty service's stdout
            chatty = f"yes '{boot_id} a chatty line' | head -n {lines} | systemd-cat -t chatty"
            subprocess.run(["sh", "-c", chatty], check=True, timeout=600)
        subprocess.run(["journalctl", "--sync"], check=True, timeout=30)
    finally:
        journald.send_signal(signal.SIGTERM if end == "clean" else signal.SIGKILL)
        journald.wait(timeout=30)
        subprocess.run(["umount", str(KERNEL_BOOT_ID)], check=True)
    time.sleep(1.1)  # each boot's entries a clear second after the last one's


def main(journal_dir: Path, boots: list[str]) -> None:
    for path in (Path("/run/systemd"), Path("/run/log")):
        if path.exists() or path.parent.exists():
            private_tmpfs(path)
    bind(journal_dir, Path("/var/log/journal"))
    work = Path("/run/log")
    for spec in boots:
        boot_id, end, *lines = spec.split(":")
        one_boot(work, boot_id, end, int(lines[0]) if lines else 0)


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
