"""The clean-shutdown marker: boot evidence the reaper keeps for itself, beside wtmp.

The unit's ExecStop writes `clean-shutdown` (after a sync, fsync of file and dir) once the runtime
has stopped. The first real run of the next boot reads it, then consumes it. CRI-O does the
same with `clean.shutdown` and a `.supported` file; here both files name their boot, so an
absent marker accuses one known boot and a marker left over from an older boot accuses none:

- `clean-shutdown`: {"boot_id", "time"} of the boot that shut down cleanly;
- `last-run`: {"boot_id", "time"} of the boot in which the reaper last ran for real. If that
  boot is not this one and wrote no marker, it did not shut down cleanly;
- `<run>/cni-reaper/shutdown-evidence.json`: this boot's reading, on tmpfs, so that later runs
  in the same boot (by hand, after a crash of the reaper) see what the first run saw.

Distributions without wtmp (Debian 13) have only this evidence.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

from cni_reaper import failpoint, new_file
from cni_reaper.choice import Choice
from cni_reaper.evidence import time_read
from cni_reaper.paths import NodePaths
from cni_reaper.record import Record
from cni_reaper.unopened import open_regular

MARKER = "clean-shutdown"
LAST_RUN = "last-run"
EVIDENCE = "cni-reaper/shutdown-evidence.json"
_MAX_BYTES = 4096
AS_FIRST_READ = "; as this boot's first real run read the markers"

EVIDENCE_KEPT = failpoint.declare("marker.evidence-kept")
LAST_RUN_WRITTEN = failpoint.declare("marker.last-run-written")


class ShutdownState(str, Choice):
    CLEAN = "clean"
    UNCLEAN = "unclean"
    UNKNOWN = "unknown"


class ShutdownEvidence(Record):
    state: ShutdownState
    boot_id: str | None  # the boot it speaks about
    time: float | None  # clean: when that boot wrote the marker; unclean: when the reaper ran in it
    detail: str

    def to_json(self) -> dict[str, object]:
        return {
            "state": self.state.value,
            "boot_id": self.boot_id,
            "time": self.time,
            "detail": self.detail,
        }

    @classmethod
    def from_json(cls, doc: object) -> ShutdownEvidence | None:
        if not isinstance(doc, dict):
            return None
        try:
            state = ShutdownState(doc["state"])
        except (KeyError, ValueError):
            return None
        boot_id, when, detail = doc.get("boot_id"), doc.get("time"), doc.get("detail")
        return cls(
            state,
            boot_id if isinstance(boot_id, str) else None,
            time_read(when),
            detail if isinstance(detail, str) else "",
        )


def _read_json(path: str) -> object:
    """A small JSON file, never through a symlink; None when absent or unreadable."""
    try:
        fd = open_regular(path)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read(_MAX_BYTES + 1)
    if len(data) > _MAX_BYTES:
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


def _stamp(doc: object) -> tuple[str, float] | None:
    if isinstance(doc, dict):
        boot_id, when = doc.get("boot_id"), time_read(doc.get("time"))
        if isinstance(boot_id, str) and boot_id and when is not None:
            return boot_id, when
    return None


def _write_durably(directory: str, name: str, doc: object) -> None:
    """Write to a temp file, fsync it, rename it over name, fsync the directory."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    tmp = os.path.join(directory, f".{name}.tmp")
    fd = new_file.create(tmp)
    with os.fdopen(fd, "w") as f:
        json.dump(doc, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, os.path.join(directory, name))
    _fsync_dir(directory)


def _fsync_dir(directory: str) -> None:
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


SYSTEMCTL = ("/usr/bin/systemctl", "/bin/systemctl")


def system_state() -> str:
    """What systemd says of the system: "stopping" once a shutdown is under way (its shutdown
    target queued), "running", "degraded", "starting" otherwise; "unknown (why)" without it."""
    import subprocess  # noqa: PLC0415 (only the unit's ExecStop asks)

    # By its own path, never one from PATH: this runs as root.
    systemctl = next((p for p in SYSTEMCTL if os.path.isfile(p)), None)
    if systemctl is None:
        return "unknown (no systemctl)"
    try:
        asked = subprocess.run(
            [systemctl, "is-system-running"],
            check=False,  # it exits non-zero for every state but "running"
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"unknown ({e})"
    return asked.stdout.strip() or f"unknown (systemctl exited {asked.returncode})"


def mark_clean_shutdown(
    paths: NodePaths, boot_id: str, now: float, state: Callable[[], str] = system_state
) -> str | None:
    """ExecStop, while the system shuts down: everything written before is on disk first, then
    the marker is. Why no marker was written, if none was: ExecStop also runs when the unit is
    restarted or stopped in the middle of a boot, which says nothing about how the boot ends."""
    shown = state()
    if shown != "stopping":
        return f"the system is not shutting down (systemctl is-system-running: {shown})"
    os.sync()
    _write_durably(paths.state_dir, MARKER, {"boot_id": boot_id, "time": now})
    return None


def read(paths: NodePaths, boot_id: str) -> ShutdownEvidence:
    """What the markers say about the boot before this one; changes nothing."""
    kept = _read_json(os.path.join(paths.run_dir, EVIDENCE))
    if isinstance(kept, dict) and kept.get("read_in") == boot_id:
        evidence = ShutdownEvidence.from_json(kept)
        if evidence is not None:
            # That run consumed them: an operator who looks now finds none to match this.
            if not evidence.detail.endswith(AS_FIRST_READ):
                evidence = evidence._replace(detail=evidence.detail + AS_FIRST_READ)
            return evidence
    marker = _stamp(_read_json(os.path.join(paths.state_dir, MARKER)))
    last_run = _stamp(_read_json(os.path.join(paths.state_dir, LAST_RUN)))
    if marker is not None and marker[0] == boot_id:
        marker = None  # written by this boot's own ExecStop: says nothing about an earlier one
    if last_run is None or last_run[0] == boot_id:
        if marker is None:
            return ShutdownEvidence(
                ShutdownState.UNKNOWN, None, None, "no clean-shutdown marker and no earlier run"
            )
        return ShutdownEvidence(
            ShutdownState.CLEAN, marker[0], marker[1], "clean-shutdown marker written at stop"
        )
    if marker is not None and marker[0] == last_run[0]:
        return ShutdownEvidence(
            ShutdownState.CLEAN, marker[0], marker[1], "clean-shutdown marker written at stop"
        )
    return ShutdownEvidence(
        ShutdownState.UNCLEAN,
        last_run[0],
        last_run[1],
        "cni-reaper ran in that boot, but its stop never wrote the clean-shutdown marker",
    )


def consume(paths: NodePaths, boot_id: str, evidence: ShutdownEvidence, now: float) -> None:
    """A real run records this boot's reading, then takes the marker of an earlier boot away."""
    run_dir = os.path.join(paths.run_dir, os.path.dirname(EVIDENCE))
    _write_durably(run_dir, os.path.basename(EVIDENCE), {**evidence.to_json(), "read_in": boot_id})
    failpoint.hit(EVIDENCE_KEPT)
    _write_durably(paths.state_dir, LAST_RUN, {"boot_id": boot_id, "time": now})
    failpoint.hit(LAST_RUN_WRITTEN)
    marker = _stamp(_read_json(os.path.join(paths.state_dir, MARKER)))
    if marker is not None and marker[0] != boot_id:
        os.unlink(os.path.join(paths.state_dir, MARKER))
        _fsync_dir(paths.state_dir)
