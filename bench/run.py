"""Boot-time budget: cni-reaper against the physical floor, side by side, in one run.

    python bench/run.py                  # scan: 1,000 / 10,000 / 100,000 entries
    python bench/run.py --del            # DEL replay with the real plugins (root; namespaces)

Scan: node trees of libcni-format cache files (all valid; 10 % damaged), the whole cni-reaper
process (`--dry-run --json` to /dev/null) against the floor program, a minimal loop that stats,
reads and JSON-decodes every file of the results dir and nothing else. Both run with this
interpreter, by its path, after a warm-up; medians of --runs runs (5).

DEL: 200 damaged attachments over 4 networks (bridge + host-local, ptp + host-local) in a
private net and mount namespace, on a journalled ext4 mounted there; the reaper (for real)
against a serial shell loop that runs the same plugin DELs directly with the same environment
and stdin, and, for reference, one such loop per network all at once. The state is built anew
before every run of any of them; medians of --runs runs (9).

The package is byte-compiled first, as the Debian and RPM packages do at install: with
PYTHONDONTWRITEBYTECODE set, every run would otherwise compile it from source.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import functools
import itertools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cni_reaper.cli import DEFAULT_PARALLEL  # noqa: E402
from cni_reaper.evidence import wtmp  # noqa: E402
from cni_reaper.netconf import parse_conf_bytes  # noqa: E402
from cni_reaper.replay import Attachment, plugin_env, plugin_stdin  # noqa: E402
from tests.nodetree import NodeTree, cache_entry_bytes  # noqa: E402

FLOOR = """
import json, os, sys
d = sys.argv[1]
for name in os.listdir(d):
    path = os.path.join(d, name)
    os.stat(path)
    with open(path, "rb") as f:
        data = f.read()
    try:
        json.loads(data)
    except ValueError:
        pass
"""
PLUGIN_DIR = "/usr/lib/cni"


def container_id(n: int) -> str:
    return f"{n:064x}"


def conflist(name: str, kind: str, subnet: str, data_dir: str | None = None) -> bytes:
    """A network as a node has it; data_dir names host-local's store where it is not the
    node's default /var/lib/cni/networks."""
    main: dict[str, object] = {"type": kind, "ipMasq": True}
    if kind == "bridge":
        main.update(bridge=f"br-{name}", isGateway=True)
    ipam: dict[str, object] = {"type": "host-local", "ranges": [[{"subnet": subnet}]]}
    if data_dir is not None:
        ipam["dataDir"] = data_dir
    main["ipam"] = ipam
    doc = {"cniVersion": "1.0.0", "name": name, "plugins": [main]}
    return json.dumps(doc, indent=2).encode()


def scan_tree(root: Path, entries: int, damaged_share: float) -> NodeTree:
    node = NodeTree(root)
    conf = conflist("podnet", "bridge", "10.88.0.0/16")
    node.write_conf("10-podnet.conflist", conf)
    node.boot(time.time() - 86400)
    results = node.results
    results.mkdir(parents=True, mode=0o700)
    every = round(1 / damaged_share) if damaged_share else 0
    for n in range(entries):
        cid = container_id(n)
        result = {
            "cniVersion": "1.0.0",
            "interfaces": [{"name": "eth0", "sandbox": f"/var/run/netns/cni-{n}"}],
            "ips": [{"address": f"10.88.{n // 250 % 250}.{n % 250 + 2}/16", "interface": 0}],
            "dns": {},
        }
        data = cache_entry_bytes(conf, "podnet", cid, "eth0", result, f"/var/run/netns/cni-{n}")
        if every and n % every == 0:
            data = (b"", b"\0" * len(data), data[: len(data) // 2])[n // every % 3]
        (results / f"podnet-{cid}-eth0").write_bytes(data)
    return node


def reboot(node: NodeTree) -> None:
    """The files above belong to a boot that crashed; this one began just now."""
    time.sleep(2.5)
    now = time.time()
    node.records.append(wtmp.boot_record(now - 0.5))
    node.write_boot_world(btime=now - 1)


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, int]:
    """Wall seconds and peak RSS (KiB) of one process, run to completion. Its output goes to
    /dev/null and a file, not to a terminal whose speed would be measured with it."""
    with open(os.devnull, "wb") as null, tempfile.TemporaryFile() as errors:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=null, stderr=errors, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        code = os.waitstatus_to_exitcode(status)
        if code not in (0, 65, 73):
            errors.seek(0)
            tail = errors.read()[-2000:].decode(errors="replace")
            raise RuntimeError(f"{argv[:4]} exited {code}:\n{tail}")
    return wall, usage.ru_maxrss


def medians(runs: int, *commands: Callable[[], tuple[float, int]]) -> list[tuple[float, int]]:
    """Each command once to warm up, then runs rounds, alternating; medians of wall, max RSS."""
    for command in commands:
        command()
    samples: list[list[tuple[float, int]]] = [[] for _ in commands]
    for _ in range(runs):
        for index, command in enumerate(commands):
            samples[index].append(command())
    return [(statistics.median(w for w, _ in s), max(rss for _, rss in s)) for s in samples]


def bench_scan(sizes: list[int], runs: int, work: Path) -> list[dict[str, float]]:
    rows = []
    for entries in sizes:
        for share in (0.0, 0.1):
            root = work / f"scan-{entries}-{share}"
            node = scan_tree(root, entries, share)
            reboot(node)
            reaper = [sys.executable, "-m", "cni_reaper", "--root", str(node.root)]
            reaper += ["--bin-dir", PLUGIN_DIR, "--dry-run", "--json"]
            floor = [sys.executable, "-c", FLOOR, str(node.results)]
            env = {**os.environ, "PYTHONPATH": str(REPO)}
            (r_wall, r_rss), (f_wall, _) = medians(
                runs, functools.partial(timed, reaper, env), functools.partial(timed, floor, env)
            )
            rows.append(
                {
                    "entries": entries,
                    "damaged": share,
                    "reaper": r_wall,
                    "floor": f_wall,
                    "ratio": r_wall / f_wall,
                    "rss_mib": r_rss / 1024,
                }
            )
            shutil.rmtree(root)
    return rows


def print_scan(rows: list[dict[str, float]]) -> None:
    print(
        f"{'entries':>8} {'damaged':>8} {'reaper s':>9} {'floor s':>8} {'ratio':>6} {'RSS MiB':>8}"
    )
    for row in rows:
        print(
            f"{row['entries']:>8,.0f} {row['damaged']:>7.0%} {row['reaper']:>9.3f} "
            f"{row['floor']:>8.3f} {row['ratio']:>6.2f} {row['rss_mib']:>8.1f}"
        )
    damaged = {int(r["entries"]): r["reaper"] for r in rows if r["damaged"]}
    if 10_000 in damaged and 100_000 in damaged:
        growth = damaged[100_000] / damaged[10_000]
        print(f"growth 10,000 -> 100,000 entries (10 % damaged): {growth:.1f}x")


# --- DEL replay -------------------------------------------------------------------------------

NETWORKS = [
    ("br-a", "bridge", "10.90.0.0/16"),
    ("br-b", "bridge", "10.91.0.0/16"),
    ("ptp-a", "ptp", "10.92.0.0/16"),
    ("ptp-b", "ptp", "10.93.0.0/16"),
]


Call = tuple[str, bytes, dict[str, str]]  # plugin path, stdin, environment


def del_state(root: Path, attachments: int) -> tuple[NodeTree, list[Call]]:
    """Damaged cache files and host-local reservations as a crash leaves them; the plugin
    calls a DEL of each makes, in order, with their exact environment and stdin."""
    if root.exists():
        shutil.rmtree(root)
    node = NodeTree(root)
    # The node's default store: the reaper's plugins, confined to the root, see it at
    # /var/lib/cni/networks; the shell loop's are told where it is.
    ipam = root / "var/lib/cni/networks"
    calls = []
    for index, (name, kind, subnet) in enumerate(NETWORKS):
        node.write_conf(f"{10 + index}-{name}.conflist", conflist(name, kind, subnet))
        netlist = parse_conf_bytes(conflist(name, kind, subnet, str(ipam)), name, False)
        store = ipam / name
        store.mkdir(parents=True)
        prefix = subnet.rsplit(".", 2)[0]
        for n in range(index, attachments, len(NETWORKS)):
            cid = container_id(n)
            node.write_result(f"{name}-{cid}-eth0", b"")
            (store / f"{prefix}.{n // 250}.{n % 250 + 2}").write_bytes(f"{cid}\r\neth0".encode())
            attachment = Attachment(cid, "eth0")
            env = plugin_env(attachment, [PLUGIN_DIR])
            for plugin in reversed(netlist.plugins):
                calls.append(
                    (f"{PLUGIN_DIR}/{plugin['type']}", plugin_stdin(netlist, plugin, None), env)
                )
    node.boot(time.time() - 86400)
    return node, calls


def shell_loop(calls: list[Call], work: Path) -> Path:
    """One line per plugin call, run in order by one shell."""
    lines = ["#!/bin/sh", "set -e"]
    for number, (plugin, stdin, env) in enumerate(calls):
        stdin_file = work / f"stdin-{number}"
        stdin_file.write_bytes(stdin)
        assigns = " ".join(
            f"{key}='{value}'" for key, value in env.items() if key.startswith("CNI_")
        )
        lines.append(f"{assigns} {plugin} < {stdin_file} > /dev/null")
    script = work / "serial-del.sh"
    script.write_text("\n".join(lines) + "\n")
    return script


@contextlib.contextmanager
def journalled_fs(work: Path) -> Iterator[Path]:
    """An ext4 file system with its journal, mounted (in this private mount namespace) where
    the trees go: a node's /var is journalled. This machine's root file system is ext4
    without a journal, whose inode allocator then searches recently freed inodes for every
    file created; with trees made and deleted run after run, each sidecar the reaper wrote
    took a millisecond to create, a cost of the benchmark, not of a node."""
    image = work / "ext4.img"
    with open(image, "wb") as f:
        f.truncate(512 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], check=True)
    mount_point = work / "fs"
    mount_point.mkdir()
    subprocess.run(["mount", "-o", "loop", str(image), str(mount_point)], check=True)
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=True)


def bench_del(runs: int, work: Path, parallel: int) -> None:
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    with journalled_fs(work) as fs:
        replay_del(runs, fs, parallel)


def replay_del(runs: int, work: Path, parallel: int) -> None:
    scripts = work / "scripts"
    scripts.mkdir(exist_ok=True)
    trees = itertools.count()

    def fresh() -> tuple[NodeTree, list[Call]]:
        # A new tree each time; the old ones stay until the end. Deleting hundreds of files
        # just before each run made ext4 search its recently freed inodes for every sidecar
        # the reaper then created, a cost no node pays at boot.
        node, calls = del_state(work / f"del-{next(trees)}", 200)
        node.records.append(wtmp.boot_record(time.time() + 5))
        node.write_boot_world(btime=time.time() + 4)
        return node, calls

    def reaper() -> tuple[float, int]:
        node, _ = fresh()
        # The boot began after the crash: run the reaper on a clock past it.
        argv = [sys.executable, "-m", "tests.clocked_run", str(time.time() + 60), "--"]
        argv += ["--root", str(node.root), "--bin-dir", PLUGIN_DIR, "--json"]
        argv += ["--parallel", str(parallel)]
        return timed(argv, {**os.environ, "PYTHONPATH": str(REPO)})

    def serial() -> tuple[float, int]:
        _, calls = fresh()
        return timed(["sh", str(shell_loop(calls, scripts))])

    def loops_at_once() -> tuple[float, int]:
        """For reference, not the target: one shell loop per network, all at once, the most
        running the plugins in parallel can give on this machine."""
        _, calls = fresh()
        loops = []
        for name, _, _ in NETWORKS:
            mine = [c for c in calls if json.loads(c[1])["name"] == name]
            loop_dir = scripts / name
            loop_dir.mkdir(exist_ok=True)
            loops.append(f"sh {shell_loop(mine, loop_dir)} &")
        return timed(["sh", "-c", " ".join(loops) + " wait"])

    (r_wall, r_rss), (s_wall, _), (p_wall, _) = medians(runs, reaper, serial, loops_at_once)
    print(
        f"DEL replay, 200 damaged attachments over {len(NETWORKS)} networks, --parallel {parallel}"
    )
    print(f"{'reaper s':>9} {'serial loop s':>14} {'ratio':>6} {'RSS MiB':>8}   loops at once")
    print(
        f"{r_wall:>9.3f} {s_wall:>14.3f} {r_wall / s_wall:>6.2f} {r_rss / 1024:>8.1f}   "
        f"{p_wall:.3f} s, {p_wall / s_wall:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument(
        "--runs", type=int, help="timed runs of each command (default: 5 for the scan, 9 for DEL)"
    )
    parser.add_argument("--del", dest="del_replay", action="store_true")
    parser.add_argument("--parallel", type=int, default=DEFAULT_PARALLEL)
    parser.add_argument("--work", help="where to build the trees (default: a temp dir)")
    args = parser.parse_args()
    if args.del_replay and os.environ.get("CNI_REAPER_BENCH_INSIDE") != "1":
        if os.geteuid() != 0:
            sys.exit("--del needs root: it runs the plugins in a private network namespace")
        inside = ["env", "CNI_REAPER_BENCH_INSIDE=1", sys.executable, *sys.argv]
        unshare = ["unshare", "--net", "--mount", "--propagation", "private"]
        os.execvp("unshare", [*unshare, *inside])  # noqa: S606 (no shell wanted)
    for package in ("cni_reaper", "tests"):
        compileall.compile_dir(REPO / package, quiet=1)
    print(
        f"{time.strftime('%Y-%m-%d')}, Python {platform.python_version()} ({sys.executable}), "
        f"{os.cpu_count()} cores"
    )
    with tempfile.TemporaryDirectory(dir=args.work) as work:
        if args.del_replay:
            # A DEL run is short and shares two cores with 200 plugin processes: more runs.
            bench_del(args.runs or 9, Path(work), args.parallel)
        else:
            sizes = [int(s) for s in args.sizes.split(",")]
            print_scan(bench_scan(sizes, args.runs or 5, Path(work)))


if __name__ == "__main__":
    main()
