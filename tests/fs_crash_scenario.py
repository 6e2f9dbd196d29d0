"""Run in a private mount namespace, as root: an ext4 image crashed for real, then mounted so
that the kernel replays its journal, and crash_record() over a results dir on it; then the same
for a cleanly unmounted image. Each is judged twice: from /dev/kmsg, and as under the unit,
where /dev/kmsg cannot be read, from this boot's kernel messages in a journal (the kernel's own
lines of that mount, stored by systemd-journal-remote as journald stores them, beside another
boot's). Prints one JSON document."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from cni_reaper.boot import read_boot_id
from cni_reaper.evidence.fs_crash import crash_record, read_kmsg
from tests.journal_files import write_journal

BOOT_ID = read_boot_id("/proc/sys/kernel/random/boot_id")


def run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def features(image: Path) -> str:
    for line in run("dumpe2fs", "-h", str(image)).splitlines():
        if line.startswith("Filesystem features:"):
            return line
    return ""


def kernel_journal(directory: Path, device: str) -> None:
    """The kernel's lines of this boot that name device, in a journal as journald keeps them;
    before them, another boot's clean mount of a device of the same name."""
    other = uuid.uuid4().hex
    entries = [
        {
            "__REALTIME_TIMESTAMP": "1700000000000000",
            "__MONOTONIC_TIMESTAMP": "1000000",
            "_BOOT_ID": other,
            "_TRANSPORT": "kernel",
            "MESSAGE": f"EXT4-fs ({device}): mounted filesystem 0-0 r/w with ordered data mode.",
        }
    ]
    now = int(time.time() * 1e6)
    for n, line in enumerate(line for line in read_kmsg() if f"({device})" in line):
        entries.append(
            {
                "__REALTIME_TIMESTAMP": str(now + n),
                "__MONOTONIC_TIMESTAMP": str(time.monotonic_ns() // 1000 + n),
                "_BOOT_ID": BOOT_ID.replace("-", ""),
                "_TRANSPORT": "kernel",
                "MESSAGE": line,
            }
        )
    write_journal(directory, entries)


def observe(image: Path, mnt: Path, journal: Path) -> dict[str, object]:
    # -o loop sets autoclear: the loop device goes with the unmount, or with the namespace
    run("mount", "-o", "loop", str(image), str(mnt))
    try:
        source = run("findmnt", "-n", "-o", "SOURCE", str(mnt)).strip()
        start = time.perf_counter()
        record = crash_record(str(mnt / "results"))
        elapsed = time.perf_counter() - start
        kernel_journal(journal, Path(source).name)
        start = time.perf_counter()
        from_journal = crash_record(
            str(mnt / "results"),
            boot_id=BOOT_ID,
            kmsg=str(mnt / "no-kmsg"),
            journal_dir=str(journal),
        )
        journal_seconds = time.perf_counter() - start
        entries = sorted(p.name for p in (mnt / "results").iterdir())
    finally:
        run("umount", str(mnt))
    return {
        "record": record.to_json(),
        "seconds": elapsed,
        "from_journal": from_journal.to_json(),
        "journal_seconds": journal_seconds,
        "source": source,
        "entries": entries,
    }


def main(work: Path) -> None:
    image, mnt = work / "node.img", work / "mnt"
    mnt.mkdir()
    run("truncate", "-s", "64M", str(image))
    run("mkfs.ext4", "-q", "-F", str(image))
    run("mount", "-o", "loop", str(image), str(mnt))
    try:
        results = mnt / "results"
        results.mkdir()
        for i in range(20):
            (results / f"cni-bridge-{i}-eth0").write_text("{}")
        # Commit the journal (syncfs) without checkpointing it into place, then take the
        # disk as a crash would leave it: the superblock says needs_recovery and the new
        # files exist only in the journal.
        run("sync", "-f", str(results))
        shutil.copyfile(image, work / "crashed.img")
    finally:
        run("umount", str(mnt))
    shutil.copyfile(image, work / "clean.img")
    doc: dict[str, object] = {
        "crashed_features": features(work / "crashed.img"),
        "clean_features": features(work / "clean.img"),
        "crashed_fsck": subprocess.run(
            ["e2fsck", "-n", str(work / "crashed.img")], capture_output=True, text=True
        ).stdout,
    }
    doc["crashed"] = observe(work / "crashed.img", mnt, work / "journal-crashed")
    doc["clean"] = observe(work / "clean.img", mnt, work / "journal-clean")
    print(json.dumps(doc))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
