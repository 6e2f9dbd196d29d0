"""Nothing alive is torn down: an attachment a runtime keeps live state for, or whose network
namespace is still mounted, is left alone and reported, even with --force."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cni_reaper import cli
from cni_reaper.errors import ExitCode
from tests.alive_scenario import DEAD, LIVE, PIN, PINNED
from tests.crashed import Crashed
from tests.nodetree import CONTAINER_IDS, have_plugins
from tests.pause_image import BUSYBOX
from tests.private_node import cannot_run, unshare

REPO = Path(__file__).resolve().parent.parent


def test_live_attachments_are_left_and_only_the_dead_one_is_repaired(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        cannot_run("needs root to mount a network namespace pin in a private mount namespace")
    if not have_plugins():
        cannot_run("needs Debian's containernetworking-plugins in /usr/lib/cni")
    proc = subprocess.run(
        [*unshare(), sys.executable, "-m", "tests.alive_scenario", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    seen: dict[str, Any] = json.loads(proc.stdout)
    entries = {e["container_id"]: e for e in seen["report"]["entries"] if e["ifname"] == "eth0"}

    live, pinned, dead = entries[LIVE], entries[PINNED], entries[DEAD]
    assert (live["action"], live["outcome"]) == ("leave", "skipped")
    assert live["reason"] == (
        "may be alive: a runtime keeps live state for this container under /run"
    )
    assert (pinned["action"], pinned["outcome"]) == ("leave", "skipped")
    assert pinned["reason"] == (
        f"may be alive: its network namespace /var/run/netns/{PIN} is still mounted"
    )
    assert (dead["action"], dead["outcome"]) == ("del-and-quarantine", "done")
    # Only the dead attachment's address was released, only its file moved.
    assert seen["reserved"] == sorted([f"{LIVE}\r\neth0", f"{PINNED}\r\neth0", f"{PINNED}\r\neth1"])
    assert f"hl-{DEAD}-eth0" not in seen["results"]
    assert {f"hl-{LIVE}-eth0", f"hl-{PINNED}-eth0"} <= set(seen["results"])
    assert seen["exit"] == ExitCode.DATA  # left alone: reported, not an error


def test_a_runtime_process_on_the_root_refuses_the_run(
    crashed: Crashed, capsys: pytest.CaptureFixture[str]
) -> None:
    """A runtime runs on this root though its socket does not answer yet (it is starting):
    the run is refused and changes nothing; a process on another root does not count."""
    if not BUSYBOX.is_file():
        cannot_run(f"needs {BUSYBOX} (Debian package busybox-static)")
    damaged = crashed.add(CONTAINER_IDS[0])
    damaged.write_bytes(b"")
    crashed.reboot()
    for where in ("bin/busybox", "usr/bin/containerd"):
        (crashed.node.root / where).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(BUSYBOX, crashed.node.root / where)
    # A program whose executable is named containerd (busybox runs its sleep, by argv[0]).
    script = "exec -a sleep /usr/bin/containerd 60"
    chrooted = subprocess.Popen(
        ["chroot", str(crashed.node.root), "/bin/busybox", "sh", "-c", script]
    )
    shutil.copy("/bin/sleep", crashed.node.root.parent / "containerd")
    elsewhere = subprocess.Popen([str(crashed.node.root.parent / "containerd"), "60"])
    try:
        deadline = time.monotonic() + 10
        while Path(f"/proc/{chrooted.pid}/comm").read_text().strip() != "containerd":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert cli.main(crashed.argv()) == ExitCode.REFUSED
        err = capsys.readouterr().err
        assert f"a container runtime is running (containerd is running (pid {chrooted.pid}" in err
        assert f"pid {elsewhere.pid}" not in err
        assert damaged.exists() and len(crashed.ips()) == 1
    finally:
        for process in (chrooted, elsewhere):
            process.kill()
            process.wait()
