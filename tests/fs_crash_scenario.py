"""Run in a private mount namespace, as root: an ext4 image crashed for real, then mounted so
that the kernel replays its journal, and crash_record() over a results dir on it; then the same
for a cleanly unmounted image. Prints one JSON document."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

from cni_reaper.evidence.fs_crash import crash_record


def run(*argv: str) -> str:
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout


def features(image: Path) -> str:
    for line in run("dumpe2fs", "-h", str(image)).splitlines():
        if line.startswith("Filesystem features:"):
            return line
    return ""


def observe(image: Path, mnt: Path) -> dict[str, object]:
    # -o loop sets autoclear: the loop device goes with the unmount, or with the namespace
    run("mount", "-o", "loop", str(image), str(mnt))
    try:
        source = run("findmnt", "-n", "-o", "SOURCE", str(mnt)).strip()
        start = time.perf_counter()
        record = crash_record(str(mnt / "results"))
        elapsed = time.perf_counter() - start
        entries = sorted(p.name for p in (mnt / "results").iterdir())
    finally:
        run("umount", str(mnt))
    return {
        "record": record.to_json(),
        "seconds": elapsed,
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
    doc["crashed"] = observe(work / "crashed.img", mnt)
    doc["clean"] = observe(work / "clean.img", mnt)
    print(json.dumps(doc))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
