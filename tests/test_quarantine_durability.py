"""The order of a real run's quarantine, as strace sees its system calls: every sidecar's bytes
are fsynced before the sidecar takes its name, every sidecar has its name before its file
arrives beside it, and both directories are fsynced after the last file has moved. That order
is what makes a power cut leave each file in exactly one place, never without its sidecar; a
SIGKILL at each step is tests/test_crash_safety.py's. Two batches of files (apply.BATCH_FILES
each), every DEL failing before any plugin runs (an empty plugin dir)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

from cni_reaper.evidence import wtmp
from cni_reaper.repair.apply import BATCH_FILES
from tests.nodetree import NodeTree, cache_entry_bytes
from tests.private_node import cannot_run, unshare

REPO = Path(__file__).resolve().parent.parent
DAMAGED = BATCH_FILES + 6
CONF = (
    b'{"cniVersion":"1.0.0","name":"podnet","plugins":[{"type":"bridge","bridge":"br0",'
    b'"ipam":{"type":"host-local","ranges":[[{"subnet":"10.88.0.0/16"}]]}}]}'
)
# A line of `strace -f -o`: the thread's id, then the call, or the resumption of one that
# another thread's call interrupted in the log.
CALL = re.compile(r"^(\d+) +(\w+)\((.*)\) += (-?\d+)")
UNFINISHED = re.compile(r"^(\d+) +(\w+\(.*) <unfinished \.\.\.>$")
RESUMED = re.compile(r"^(\d+) +<\.\.\. (\w+) resumed>(.*)$")
# A descriptor as `strace -y` shows it: its number, then the path of its file.
FD_PATH = re.compile(r"\d+<(.*)>")


def calls(log: str) -> list[tuple[str, list[str], int]]:
    """Each completed call, in the order it returned: (name, its arguments, its result)."""
    pending: dict[str, str] = {}
    done = []
    for logged in log.splitlines():
        unfinished = UNFINISHED.match(logged)
        if unfinished:
            pending[unfinished.group(1)] = unfinished.group(2)
            continue
        resumed = RESUMED.match(logged)
        whole = logged
        if resumed:
            whole = f"{resumed.group(1)} {pending.pop(resumed.group(1))}{resumed.group(3)}"
        call = CALL.match(whole)
        if call:
            arguments = [a.strip().strip('"') for a in call.group(3).split(", ")]
            done.append((call.group(2), arguments, int(call.group(4))))
    return done


def crashed_node(root: Path) -> NodeTree:
    """DAMAGED empty cache files, written before a boot that began after them."""
    node = NodeTree(root)
    node.write_conf("10-podnet.conflist", CONF)
    node.boot(time.time() - 86400)
    for n in range(DAMAGED):
        cid = f"{n:064x}"
        whole = cache_entry_bytes(CONF, "podnet", cid, "eth0", {"cniVersion": "1.0.0"}, "")
        node.write_result(f"podnet-{cid}-eth0", whole[: len(whole) // 2])
    now = time.time()
    node.records.append(wtmp.boot_record(now + 5))
    node.write_boot_world(btime=now + 4, boot_id=str(uuid.uuid4()))
    return node


def test_sidecars_are_durable_before_their_files_move(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        cannot_run("a real run confines the plugins' view: it needs root")
    if shutil.which("strace") is None:
        cannot_run("strace is not installed")
    node = crashed_node(tmp_path / "node")
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    log = tmp_path / "strace.log"
    trace = ["strace", "-f", "-qq", "-y", "-s", "4096", "-o", str(log)]
    trace += ["-e", "trace=fsync,renameat,renameat2"]
    reaper = [sys.executable, "-m", "tests.clocked_run", str(time.time() + 3600), "--"]
    reaper += ["--root", str(node.root), "--bin-dir", str(empty), "--json"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    run = subprocess.run([*unshare(), *trace, *reaper], env=env, capture_output=True, check=False)
    assert run.returncode == 73, run.stderr.decode()  # every DEL failed, as planned

    synced: set[str] = set()  # names of the temp sidecars whose fsync returned 0
    in_place: set[str] = set()  # sidecars renamed to their names
    moved: list[str] = []  # files renamed into the quarantine, in order
    after_last_move: list[str] = []  # what was fsynced after the last file moved
    for name, arguments, result in calls(log.read_text()):
        if name == "fsync" and result == 0:
            # strace -y names the file of each descriptor as the call saw it: no descriptor
            # is attributed through the openat that made it, which a dup (not traced) or a
            # line the parse lost would leave wrong (seen in CI under load).
            synced_path = FD_PATH.fullmatch(arguments[0])
            assert synced_path, arguments
            synced.add(os.path.basename(synced_path.group(1)))
            after_last_move.append(synced_path.group(1))
        elif name.startswith("renameat") and result == 0:
            source, target = arguments[1], arguments[3]
            if source.endswith(".json.tmp"):
                assert source in synced, f"{target} took its name before its bytes were synced"
                in_place.add(target)
            elif source.startswith("podnet-"):
                assert f"{target}.json" in in_place, f"{source} moved before its sidecar"
                moved.append(target)
                after_last_move = []
    assert len(moved) == DAMAGED
    (boot_dir,) = node.quarantine.iterdir()
    assert {str(node.results), str(boot_dir)} <= set(after_last_move), (
        f"the quarantine and results dirs, after the last move: {after_last_move}"
    )

    # Nothing lost or unaccounted: each file is in the quarantine, once, beside its sidecar,
    # whose digest is the file's.
    files = sorted(p for p in boot_dir.iterdir() if not p.name.endswith(".json"))
    assert [p.name for p in files] == sorted(moved)
    assert not list(node.results.iterdir())
    for path in files:
        sidecar = json.loads(path.with_name(path.name + ".json").read_bytes())
        assert sidecar["sha256"] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert sidecar["outcome"] == "failed"
