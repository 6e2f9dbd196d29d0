"""How long the journal witnesses take on a large persistent journal: the boot list
(evidence/journal.py) and this boot's kernel messages (evidence/fs_crash.py), which must not
hold the boot back. Prints figures; asserts nothing.

usage: python -m bench.journal [GIB] [BOOTS]   (as root or not; needs systemd-journal-remote)

The journal is written by systemd-journal-remote from export format: BOOTS boots of equal
size, about GIB GiB of entries in all, each with kernel messages among its service messages;
the last boot is "this" one, its file system's replay message near its start."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from cni_reaper.evidence import fs_crash
from cni_reaper.evidence import journal as journal_witness
from tests.journal_files import JOURNAL_REMOTE

PAYLOAD = "x" * 300  # a service's message of usual length


def write(directory: Path, gib: float, boots: int) -> tuple[list[str], int]:
    assert JOURNAL_REMOTE is not None, "needs systemd-journal-remote"
    directory.mkdir(parents=True)
    per_boot = int(gib * (1 << 30) / 600 / boots)  # ~600 bytes per entry on disk
    ids = [uuid.uuid4().hex for _ in range(boots)]
    proc = subprocess.Popen(
        [JOURNAL_REMOTE, "-o", str(directory / "remote.journal"), "-"],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    assert proc.stdin is not None
    t = 1_700_000_000_000_000
    written = 0
    for b, boot in enumerate(ids):
        chunk = []
        for n in range(per_boot):
            t += 1000
            kernel = n % 50 == 0
            if b == boots - 1 and n == 10:
                message = "EXT4-fs (vda): recovery complete"
            elif kernel:
                message = f"cni0: port {n % 250}(veth{n:08x}) entered forwarding state"
            else:
                message = f"containerd[{n % 9000}]: level=info seq={t:x} msg={PAYLOAD}"
            chunk.append(
                f"__REALTIME_TIMESTAMP={t}\n__MONOTONIC_TIMESTAMP={n + 1}\n_BOOT_ID={boot}\n"
                f"_TRANSPORT={'kernel' if kernel or n == 10 else 'stdout'}\n"
                f"SYSLOG_IDENTIFIER={'kernel' if kernel else 'containerd'}\nMESSAGE={message}\n\n"
            )
            if len(chunk) == 10_000:
                proc.stdin.write("".join(chunk).encode())
                written += len(chunk)
                chunk = []
        proc.stdin.write("".join(chunk).encode())
        written += len(chunk)
    proc.stdin.close()
    proc.wait()
    return ids, written


def drop_caches() -> str:
    """A cold read, as at boot, where this machine lets us."""
    subprocess.run(["sync"], check=False)
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError as e:
        return f"not dropped ({e.strerror}): the first read is warm"
    return "dropped: the first read is cold"


def main() -> None:
    gib = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    boots = int(sys.argv[2]) if len(sys.argv) > 2 else 8
    work = Path(tempfile.mkdtemp(prefix="cni-reaper-bench-journal-"))
    try:
        root = work / "root"
        directory = root / "var/log/journal"
        start = time.perf_counter()
        ids, entries = write(directory, gib, boots)
        size = sum(p.stat().st_size for p in directory.iterdir())
        print(
            f"journal: {entries:,} entries, {boots} boots, {size / (1 << 30):.2f} GiB on disk, "
            f"written in {time.perf_counter() - start:.0f} s"
        )
        this = ids[-1]
        for attempt in ("first", "second"):
            if attempt == "first":
                print(f"page cache: {drop_caches()}")
            start = time.perf_counter()
            witness = journal_witness.read(str(root), this)
            listed = time.perf_counter() - start
            start = time.perf_counter()
            try:
                lines = fs_crash.journal_kernel_log(this, directory=str(directory))
                kernel = f"{len(lines)} lines naming a mount"
            except fs_crash.KernelLogUnreadable as e:
                kernel = str(e)
            kernel_s = time.perf_counter() - start
            print(
                f"{attempt} read: boot list {listed:.3f} s ({witness.says}); "
                f"this boot's kernel messages {kernel_s:.3f} s ({kernel})"
            )
    finally:
        shutil.rmtree(work)


if __name__ == "__main__":
    main()
