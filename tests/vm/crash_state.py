"""A crashed disk's node state, kept as a small tarball: what a breach's test replays.

A campaign crash (tests/vm/campaign.py) leaves its disk as the kernel died; a seed replays the
plan, not the instant (two workers interleave differently under emulation). The state itself
does: the CNI configs and state, containerd's config and metadata database, the boot records
(wtmp, wtmpdb) and cni-reaper's own state, read off the crashed disk with debugfs after the
journal replay a mount would make (e2fsck -E journal_only), with their modes and times.
tests/crash_states/ keeps those of the crashes that broke an invariant;
tests/test_crash_states.py runs the reaper over each.

usage: python3 -m tests.vm.crash_state CRASH_DIR OUT.tar.xz
       (CRASH_DIR: a campaign's crash-SEED dir; its churn boot's layer is the crashed disk)
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

# What the reaper and the runtime read of a node, and nothing of the journal (megabytes).
NODE_STATE = (
    "/etc/cni/net.d",
    "/etc/containerd",
    "/var/lib/cni",
    "/var/lib/cni-reaper",
    "/var/lib/containerd/io.containerd.metadata.v1.bolt",
    "/var/lib/wtmpdb",
    "/var/log/wtmp",
    "/var/log/wtmp.db",
)


def crashed_layer(crash_dir: Path) -> Path:
    """The churn boot's top layer: the disk as the crash left it."""
    layers = sorted((crash_dir / "churn").glob("boot-*-churn.qcow2"))
    if not layers:
        raise FileNotFoundError(f"no churn layer in {crash_dir / 'churn'}")
    return layers[-1]


# Without these the state replays nothing: a crash always leaves the results dir (the churn
# boot made it) and containerd's records.
NEEDED = (
    "var/lib/cni/results/",
    "var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db",
)


def keep(layer: Path, out: Path, scratch: Path | None = None) -> list[str]:
    """The node state of the disk under layer, as out (a .tar.xz); the files it holds. The
    disk is copied whole (sparse) into a temporary dir under scratch (by default the system's)."""
    with tempfile.TemporaryDirectory(dir=scratch) as work:
        flat = Path(work) / "disk.img"
        subprocess.run(["qemu-img", "convert", "-O", "raw", str(layer), str(flat)], check=True)
        # Only the journal replayed, as the next boot's mount replays it: no repair beyond.
        subprocess.run(
            ["e2fsck", "-E", "journal_only", "-y", str(flat)], capture_output=True, check=False
        )
        tree = Path(work) / "tree"
        for path in NODE_STATE:
            parent = tree / path.lstrip("/")
            parent.parent.mkdir(parents=True, exist_ok=True)
            # rdump keeps modes, owners and times; a path the disk lacks is skipped.
            subprocess.run(
                ["debugfs", "-R", f"rdump {path} {parent.parent}", str(flat)],
                capture_output=True,
                check=False,
            )
        kept = sorted(str(p.relative_to(tree)) for p in tree.rglob("*") if not p.is_dir())
        with tarfile.open(out, "w:xz") as archive:
            for name in sorted(p.name for p in tree.iterdir()):
                archive.add(tree / name, arcname=name)
    return kept


def missing(kept: list[str]) -> list[str]:
    """What a kept state lacks of what a replay needs."""
    return [need for need in NEEDED if not any(name.startswith(need) for name in kept)]


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    kept = keep(crashed_layer(Path(argv[0])), Path(argv[1]))
    print("\n".join(kept))
    lacking = missing(kept)
    if lacking:
        print(f"the kept state lacks {', '.join(lacking)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
