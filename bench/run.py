"""Boot-time budget: cni-reaper against the physical floor, side by side, in one run.

    python bench/run.py                  # scan: every path, 1,000 / 10,000 / 100,000 entries
    python bench/run.py --python /usr/bin/python3 --python ~/.pyenv/versions/3.9.18/bin/python3
    python bench/run.py --del            # DEL replay with the real plugins (root; namespaces)

Scan: node trees of libcni-format cache files and the whole cni-reaper process against the
floor program, a minimal loop that stats, reads and JSON-decodes every file of the dirs the path
must read (the results dir; and host-local's store where there is one) and nothing else. The
reaper runs twice over: as the unit and an operator run it, its report as text (stdout to
/dev/null, stderr to a file), and with `--json`, the report of every entry on stdout. All three
run with this interpreter, by its path, after a warm-up; medians of --runs runs (5), alternating.
The paths, each at every size:
- all valid, a dry run;
- 10 % damaged (empty, NUL-filled, cut), left by an earlier boot that crashed: a dry run, and,
  as root, a real run with an empty plugin dir (every DEL found unable to run before any process
  starts, every damaged file quarantined with its sidecar: all of a real run but the plugins),
  its trees on a journalled ext4 mounted in a private mount namespace, as the DEL replay's,
  their /run a tmpfs, as a node's (the pre-runtime record is kept there);
  also printed: its time up to the DELs (the wall time less what its metrics file says it ran
  after its whole plan was made), the part of a real run that precedes any plugin;
- 10 % damaged with no boot evidence (no wtmp, a runtime already started): all left, and logged;
- host-local's store with one reservation per entry, 10 % of them orphans (no results entry),
  a dry run, and, as root, a real run with an empty plugin dir (no DEL can run, so every orphan
  goes to the quarantine under host-local's lock; the pre-runtime record kept in memory), on
  the journalled ext4 as the other real run.
--python runs the whole benchmark again under each interpreter given, one table each.

DEL: 200 damaged attachments over 4 networks (bridge + host-local, ptp + host-local) in a
private net and mount namespace, on a journalled ext4 mounted there (the reaper's /run a
tmpfs, as a node's); the reaper (for real) against a serial shell loop that runs the same
plugin DELs directly with the same environment and stdin, and, for reference, one such loop
per network all at once, and the Python floor: one Python process that runs the same calls from
a thread per network by posix_spawn. The state is built anew before every run of any of them;
medians of --runs runs (9). Also printed: the reaper's own CPU (not its plugins') by stage
(bench/own_cpu.py), and the Python floor's.

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
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cni_reaper.evidence import wtmp  # noqa: E402
from cni_reaper.netconf import parse_conf_bytes  # noqa: E402
from cni_reaper.options import DEFAULT_PARALLEL  # noqa: E402
from cni_reaper.repair.replay import Attachment, plugin_env, plugin_stdin  # noqa: E402
from tests.nodetree import NodeTree, cache_entry_bytes  # noqa: E402

FLOOR = """
import json, os, sys
for d in sys.argv[1:]:
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


def result_doc(n: int, prefix: str = "10.88") -> dict[str, object]:
    return {
        "cniVersion": "1.0.0",
        "interfaces": [{"name": "eth0", "sandbox": f"/var/run/netns/cni-{n}"}],
        "ips": [{"address": f"{prefix}.{n // 250 % 250}.{n % 250 + 2}/16", "interface": 0}],
        "dns": {},
    }


def damaged_bytes(n: int, every: int, data: bytes) -> bytes:
    """Empty, NUL-filled or cut in half, in turn: what a crash leaves of an unsynced write."""
    return (b"", b"\0" * len(data), data[: len(data) // 2])[n // every % 3]


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
        data = cache_entry_bytes(
            conf, "podnet", cid, "eth0", result_doc(n), f"/var/run/netns/cni-{n}"
        )
        if every and n % every == 0:
            data = damaged_bytes(n, every, data)
        (results / f"podnet-{cid}-eth0").write_bytes(data)
    return node


STORE = "var/lib/cni/networks/podnet"


def store_address(n: int) -> str:
    return f"10.{64 + n // 62500}.{n // 250 % 250}.{n % 250 + 2}"


def store_tree(root: Path, reservations: int, orphaned_share: float) -> NodeTree:
    """host-local's store with one reservation per attachment, `<ip>` holding
    `<containerID>\\r\\n<ifname>`; the results dir holds an entry for all but every tenth: those
    reservations are orphans (reservations.py), which a crash between host-local's write and
    libcni's cache write leaves. A /10 holds them all."""
    node = NodeTree(root)
    conf = conflist("podnet", "bridge", "10.64.0.0/10")
    node.write_conf("10-podnet.conflist", conf)
    node.boot(time.time() - 86400)
    results = node.results
    results.mkdir(parents=True, mode=0o700)
    store = root / STORE
    store.mkdir(parents=True)
    every = round(1 / orphaned_share)
    for n in range(reservations):
        cid = container_id(n)
        ip = store_address(n)
        (store / ip).write_bytes(f"{cid}\r\neth0".encode())
        if n % every == 0:
            continue  # an orphan: no results entry names it
        result = result_doc(n)
        result["ips"] = [{"address": f"{ip}/10", "interface": 0}]
        data = cache_entry_bytes(conf, "podnet", cid, "eth0", result, f"/var/run/netns/cni-{n}")
        (results / f"podnet-{cid}-eth0").write_bytes(data)
    return node


def reboot(node: NodeTree) -> None:
    """The files above belong to a boot that crashed; this one began just now."""
    time.sleep(2.5)
    now = time.time()
    node.records.append(wtmp.boot_record(now - 0.5))
    node.write_boot_world(btime=now - 1)


def boot_without_evidence(node: NodeTree) -> None:
    """Nothing proves the files come from an earlier boot: /proc/stat says this boot began a
    day ago, so they were written in it by their clocks; no wtmp (nor wtmpdb, a shutdown
    marker or a journal, which the trees never have) names an earlier boot; and a runtime has
    started (containerd's /run dir), so no record of the results dir from before it started
    can be taken. Every damaged file is left alone, and logged."""
    node.write_boot_world(btime=time.time() - 86400)
    (node.root / "var/log/wtmp").unlink()
    node.runtime_starts()


def crashed_before_a_new_boot(node: NodeTree) -> None:
    """What the tree holds was left by a boot that crashed: a new boot, with an ID of its own,
    begins a few seconds from now (the real runs run on a clock past it), and all of it is on
    disk before the run starts, as a crashed boot's files are: else the journal's commit and
    the writeback of what was just written fall inside the timed run."""
    now = time.time()
    node.records.append(wtmp.boot_record(now + 5))
    node.write_boot_world(btime=now + 4, boot_id=str(uuid.uuid4()))
    os.sync()


# Starts the measured process and waits for it. A child's peak RSS counts the memory of the
# process it was started from (the kernel keeps the old address space's high-water mark across
# exec, and a vfork-like spawn shares this process's): started from the benchmark, with its
# trees' names and the package imported, every run showed the benchmark's size. This launcher,
# a bare interpreter, is smaller than anything it measures; the wall time is taken inside it.
LAUNCHER = """
import os, sys, time
null = os.open(os.devnull, os.O_WRONLY)
start = time.perf_counter()
to_null = [(os.POSIX_SPAWN_DUP2, null, 1)]
pid = os.posix_spawn(sys.argv[1], sys.argv[1:], os.environ, file_actions=to_null)
_, status, usage = os.wait4(pid, 0)
print(time.perf_counter() - start, usage.ru_maxrss, os.waitstatus_to_exitcode(status))
"""


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, int]:
    """Wall seconds and peak RSS (KiB) of one process, run to completion. Its output goes to
    /dev/null and a file, not to a terminal whose speed would be measured with it."""
    # posix_spawn does not search PATH: the DEL benchmark's shell loops are started as "sh".
    program = argv[0] if os.sep in argv[0] else shutil.which(argv[0]) or argv[0]
    with tempfile.TemporaryFile() as errors:
        launch = [sys.executable, "-I", "-S", "-c", LAUNCHER, program, *argv[1:]]
        measured = subprocess.run(
            launch, stdout=subprocess.PIPE, stderr=errors, env=env, check=True
        )
        wall, rss, code = measured.stdout.split()
        if int(code) not in (0, 65, 73):
            errors.seek(0)
            tail = errors.read()[-2000:].decode(errors="replace")
            raise RuntimeError(f"{argv[:4]} exited {code.decode()}:\n{tail}")
    return float(wall), int(rss)


def medians(runs: int, *commands: Callable[[], tuple[float, int]]) -> list[tuple[float, int]]:
    """Each command once to warm up, then runs rounds, alternating; medians of wall, max RSS."""
    for command in commands:
        command()
    samples: list[list[tuple[float, int]]] = [[] for _ in commands]
    for _ in range(runs):
        for index, command in enumerate(commands):
            samples[index].append(command())
    return [(statistics.median(w for w, _ in s), max(rss for _, rss in s)) for s in samples]


class ScanPath(NamedTuple):
    name: str  # as the table shows it
    argv: Callable[[NodeTree], list[str]]  # the reaper's, after the interpreter
    before_each: Callable[[NodeTree], None] | None = None  # state a run changes, made anew
    # The dirs whose every file the reaper must read, which the floor reads: the results dir,
    # and where there is one, host-local's store.
    read: Callable[[NodeTree], list[Path]] = lambda node: [node.results]


def dry_run(node: NodeTree) -> list[str]:
    return ["-m", "cni_reaper", "--root", str(node.root), "--bin-dir", PLUGIN_DIR, "--dry-run"]


def real_run_without_plugins(node: NodeTree) -> list[str]:
    """A real run, on a clock past this boot's start, whose plugin dir is empty: every DEL
    is planned, found unable to run (no plugin) before any process starts, and fails; each
    damaged file then goes to the quarantine with its sidecar, as after any failed DEL. So it
    measures all a real run does but the plugins: the lock, the confinement (a mount
    namespace), the scan and the plan, the pre-runtime record kept, the quarantine moves."""
    empty = node.root / "empty-bin"
    empty.mkdir(mode=0o755, exist_ok=True)
    argv = ["-m", "tests.clocked_run", str(time.time() + 3600), "--"]
    return [*argv, "--root", str(node.root), "--bin-dir", str(empty)]


def rebooted_and_damaged_again(entries: int, share: float) -> Callable[[NodeTree], None]:
    """Before each real run: the damaged files back in the results dir (the last run moved
    them), a new boot begun after they were written (/run, a tmpfs, empty again), no
    quarantine or state of an earlier run."""
    every = round(1 / share)

    def reset(node: NodeTree) -> None:
        conf = (node.conf_dir / "10-podnet.conflist").read_bytes()
        shutil.rmtree(node.root / "var/lib/cni-reaper", ignore_errors=True)
        for n in range(0, entries, every):
            name = f"podnet-{container_id(n)}-eth0"
            whole = cache_entry_bytes(
                conf, "podnet", container_id(n), "eth0", result_doc(n), f"/var/run/netns/cni-{n}"
            )
            (node.results / name).write_bytes(damaged_bytes(n, every, whole))
        crashed_before_a_new_boot(node)

    return reset


def orphans_back(reservations: int, share: float) -> Callable[[NodeTree], None]:
    """Before each real run of the store path: the orphans' reservations back in the store
    (the last run moved them to the quarantine), a new boot begun after they were written,
    no quarantine or state of an earlier run."""
    every = round(1 / share)

    def reset(node: NodeTree) -> None:
        shutil.rmtree(node.root / "var/lib/cni-reaper", ignore_errors=True)
        store = node.root / STORE
        for n in range(0, reservations, every):
            (store / store_address(n)).write_bytes(f"{container_id(n)}\r\neth0".encode())
        crashed_before_a_new_boot(node)

    return reset


def with_store(node: NodeTree) -> list[Path]:
    return [node.results, node.root / STORE]


REAL_RUN = "10 % damaged, earlier boot, real run, no plugins"
STORE_REAL_RUN = "host-local store, 10 % orphaned, real run, no plugins"


def scan_paths(entries: int, real_runs: bool) -> list[tuple[ScanPath, Callable[[Path], NodeTree]]]:
    share = 0.1

    def tree(
        make: Callable[[Path, int, float], NodeTree],
        damaged: float,
        begin: Callable[[NodeTree], None],
    ) -> Callable[[Path], NodeTree]:
        def build(root: Path) -> NodeTree:
            node = make(root, entries, damaged)
            begin(node)
            return node

        return build

    valid = tree(scan_tree, 0.0, reboot)
    damaged = tree(scan_tree, share, reboot)
    damaged_no_evidence = tree(scan_tree, share, boot_without_evidence)
    store = tree(store_tree, share, reboot)

    paths: list[tuple[ScanPath, Callable[[Path], NodeTree]]] = [
        (ScanPath("all valid", dry_run), valid),
        (ScanPath("10 % damaged, earlier boot, dry run", dry_run), damaged),
        (ScanPath("10 % damaged, no boot evidence (left)", dry_run), damaged_no_evidence),
        (ScanPath("host-local store, 10 % orphaned, dry run", dry_run, read=with_store), store),
    ]
    if real_runs:
        reset = rebooted_and_damaged_again(entries, share)
        real = ScanPath(REAL_RUN, real_run_without_plugins, reset)
        paths.insert(2, (real, damaged))
        store_real = ScanPath(
            STORE_REAL_RUN, real_run_without_plugins, orphans_back(entries, share), with_store
        )
        paths.append((store_real, store))
    return paths


def bench_scan(sizes: list[int], runs: int, work: Path, only: str | None) -> list[dict[str, Any]]:
    real_runs = os.geteuid() == 0
    if not real_runs:
        print("not root: the real run's path is left out (it confines the plugins' view)")
    if not real_runs or (only and only not in REAL_RUN and only not in STORE_REAL_RUN):
        return scan_rows(sizes, runs, work, only, None)
    # The real run creates a file and its sidecar for each one it moves, and its trees are
    # deleted and made again between runs: it runs on a journalled ext4, as a node's /var is
    # (see journalled_fs), room for the largest tree, its quarantine and their inodes.
    largest = max(sizes)
    (work / "journalled").mkdir()
    with journalled_fs(work / "journalled", 256 + largest * 10 // 1024, largest * 3) as fs:
        return scan_rows(sizes, runs, work, only, fs)


def scan_rows(
    sizes: list[int], runs: int, work: Path, only: str | None, journalled: Path | None
) -> list[dict[str, Any]]:
    """Every path at every size; the real run's trees on journalled, the others on work."""
    rows: list[dict[str, Any]] = []
    print(SCAN_HEADER, flush=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for entries in sizes:
        for index, (path, build) in enumerate(scan_paths(entries, journalled is not None)):
            if only and only not in path.name:
                continue
            real = path.before_each is not None
            root = (journalled if real and journalled else work) / f"scan-{entries}-{index}"
            node = build(root)
            volatile = real and journalled is not None
            if volatile:
                # A node's /run is a tmpfs: the pre-runtime record a real run keeps there costs
                # no journal commit, as it would on the journalled ext4 the tree lies on.
                (node.root / "run").mkdir(exist_ok=True)
                subprocess.run(
                    ["mount", "-t", "tmpfs", "tmpfs", str(node.root / "run")], check=True
                )

            up_to_dels: list[float] = []

            def reaper(
                report: list[str],
                path: ScanPath = path,
                node: NodeTree = node,
                up_to_dels: list[float] = up_to_dels,
            ) -> tuple[float, int]:
                if path.before_each is None:
                    return timed([sys.executable, *path.argv(node), *report], env)
                path.before_each(node)
                prom = node.root / "cni-reaper.prom"
                argv = [sys.executable, *path.argv(node), *report, "--metrics-file", str(prom)]
                wall, rss = timed(argv, env)
                if not report:
                    up_to_dels.append(wall - after_the_plan(prom))
                return wall, rss

            floor_argv = [sys.executable, "-c", FLOOR, *map(str, path.read(node))]

            def floor(
                path: ScanPath = path, node: NodeTree = node, argv: list[str] = floor_argv
            ) -> tuple[float, int]:
                # A real run moved the damaged files away: the floor reads them back in place,
                # every file the reaper's run read.
                if path.before_each is not None:
                    path.before_each(node)
                return timed(argv, env)

            (r_wall, r_rss), (j_wall, j_rss), (f_wall, _) = medians(
                runs, functools.partial(reaper, []), functools.partial(reaper, ["--json"]), floor
            )
            row = {
                "path": path.name,
                "entries": entries,
                "reaper": r_wall,
                "floor": f_wall,
                "ratio": r_wall / f_wall,
                "rss_mib": r_rss / 1024,
                "json": j_wall,
                "json_ratio": j_wall / f_wall,
                "json_rss_mib": j_rss / 1024,
            }
            if up_to_dels:
                # The warm-up's is left out, as medians() leaves its wall time out.
                row["up_to_dels"] = statistics.median(up_to_dels[1:])
            rows.append(row)
            print_scan_row(row)
            if volatile:
                subprocess.run(["umount", str(node.root / "run")], check=True)
            shutil.rmtree(root)
    return rows


def after_the_plan(prom: Path) -> float:
    """Seconds the run went on after its whole plan was made (the DELs, the quarantine, the
    report's end), from the metrics file it wrote: its run less its time until the plan."""
    found = {}
    for line in prom.read_text().splitlines():
        name, _, value = line.partition(" ")
        found[name] = value
    if "cni_reaper_plan_duration_seconds" not in found:
        code = found.get("cni_reaper_exit_code")
        raise RuntimeError(f"{prom}: the run never made its whole plan (exit {code})")
    run = float(found["cni_reaper_run_duration_seconds"])
    return run - float(found["cni_reaper_plan_duration_seconds"])


SCAN_HEADER = (
    "| path | entries | reaper (s) | floor (s) | ratio | reaper peak RSS "
    "| with --json (s) | ratio | peak RSS |\n"
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
)


def print_scan_row(row: dict[str, Any]) -> None:
    """One row of the Markdown table the README keeps, as soon as it is measured: a run at
    100,000 entries takes minutes."""
    print(
        f"| {row['path']} | {row['entries']:,} | {row['reaper']:.3f} | {row['floor']:.3f} "
        f"| {row['ratio']:.2f} | {row['rss_mib']:.1f} MiB | {row['json']:.3f} "
        f"| {row['json_ratio']:.2f} | {row['json_rss_mib']:.1f} MiB |",
        flush=True,
    )


def print_scan(rows: list[dict[str, Any]]) -> None:
    """What the rows say together: each real run's time up to the DELs, each path's growth."""
    for row in rows:
        if "up_to_dels" in row:
            print(
                f"{row['path']}, {row['entries']:,}: up to the DELs (the whole plan made, "
                f"nothing changed yet) {row['up_to_dels']:.3f} s, "
                f"{row['up_to_dels'] / row['floor']:.2f}x the floor"
            )
    by_path: dict[str, dict[int, tuple[float, float]]] = {}
    for row in rows:
        by_path.setdefault(row["path"], {})[row["entries"]] = (row["reaper"], row["json"])
    for name, walls in by_path.items():
        if 10_000 in walls and 100_000 in walls:
            (text_10k, json_10k), (text_100k, json_100k) = walls[10_000], walls[100_000]
            print(
                f"growth 10,000 -> 100,000 entries, {name}: {text_100k / text_10k:.1f}x "
                f"(with --json {json_100k / json_10k:.1f}x)"
            )


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


# The least a Python program does to run the DELs the loops at once run: one thread per
# network, each starting its plugins one after another by posix_spawn, with the same stdin and
# environment, and waiting for each; then its own CPU seconds, written to the file named first.
PYTHON_DEL_FLOOR = """
import os, sys, threading, time
null = os.open(os.devnull, os.O_WRONLY)
failed = []
def loop(calls):
    with open(calls) as f:
        lines = f.read().splitlines()
    for line in lines:
        plugin, stdin, *assigns = line.split("\\t")
        env = dict(assign.split("=", 1) for assign in assigns)
        fd = os.open(stdin, os.O_RDONLY)
        actions = [(os.POSIX_SPAWN_DUP2, fd, 0), (os.POSIX_SPAWN_DUP2, null, 1)]
        pid = os.posix_spawn(plugin, [plugin], env, file_actions=actions)
        os.close(fd)
        if os.waitpid(pid, 0)[1]:
            failed.append(plugin)
            return
threads = [threading.Thread(target=loop, args=(calls,)) for calls in sys.argv[2:]]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
with open(sys.argv[1], "w") as f:
    f.write(f"{time.process_time()} total\\n")
sys.exit(1 if failed else 0)
"""


def by_network(calls: list[Call]) -> list[tuple[str, list[Call]]]:
    """The calls of each network, in order, as one loop of its own runs them."""
    return [
        (name, [c for c in calls if json.loads(c[1])["name"] == name]) for name, _, _ in NETWORKS
    ]


def staged(calls: list[Call], work: Path) -> Iterator[tuple[str, Path, dict[str, str]]]:
    """Each call's plugin, its stdin written to a file in work, and its CNI_ variables: what
    the shell loop and the Python floor give each plugin."""
    work.mkdir(exist_ok=True)
    for number, (plugin, stdin, env) in enumerate(calls):
        stdin_file = work / f"stdin-{number}"
        stdin_file.write_bytes(stdin)
        yield plugin, stdin_file, {k: v for k, v in env.items() if k.startswith("CNI_")}


def python_calls(calls: list[Call], work: Path) -> Path:
    """The calls as PYTHON_DEL_FLOOR reads them: a line each, the plugin, its stdin file and
    its CNI_ variables, separated by tabs."""
    lines = [
        "\t".join([plugin, str(stdin_file), *(f"{k}={v}" for k, v in cni_env.items())])
        for plugin, stdin_file, cni_env in staged(calls, work)
    ]
    listed = work / "calls"
    listed.write_text("\n".join(lines) + "\n")
    return listed


def shell_loop(calls: list[Call], work: Path) -> Path:
    """One line per plugin call, run in order by one shell."""
    lines = ["#!/bin/sh", "set -e"]
    for plugin, stdin_file, cni_env in staged(calls, work):
        assigns = " ".join(f"{key}='{value}'" for key, value in cni_env.items())
        lines.append(f"{assigns} {plugin} < {stdin_file} > /dev/null")
    script = work / "serial-del.sh"
    script.write_text("\n".join(lines) + "\n")
    return script


@contextlib.contextmanager
def journalled_fs(work: Path, mib: int = 512, inodes: int | None = None) -> Iterator[Path]:
    """An ext4 file system with its journal, mounted (in this private mount namespace) where
    the trees go: a node's /var is journalled. This machine's root file system is ext4
    without a journal, whose inode allocator then searches recently freed inodes for every
    file created; with trees made and deleted run after run, each sidecar the reaper wrote
    took a millisecond to create, a cost of the benchmark, not of a node. Its inode tables
    are written at once, not by the kernel's lazy-init thread in the measured runs."""
    image = work / "ext4.img"
    with open(image, "wb") as f:
        f.truncate(mib << 20)
    mkfs = ["mkfs.ext4", "-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"]
    if inodes is not None:
        mkfs += ["-N", str(inodes)]
    subprocess.run([*mkfs, str(image)], check=True)
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
        crashed_before_a_new_boot(node)
        return node, calls

    # Each process's own CPU seconds (not its plugins'), every run's, as it wrote them: its
    # total, and the reaper's by stage (bench/own_cpu.py).
    cpu_file = work / "own-cpu"
    own_cpu: dict[str, list[dict[str, float]]] = {"reaper": [], "python floor": []}

    def own(name: str, measured: tuple[float, int]) -> tuple[float, int]:
        parts = (line.partition(" ") for line in cpu_file.read_text().splitlines())
        own_cpu[name].append({part: float(seconds) for seconds, _, part in parts})
        cpu_file.unlink()
        return measured

    def reaper() -> tuple[float, int]:
        node, _ = fresh()
        # A node's /run is a tmpfs, empty at boot: the pre-runtime record and the shutdown
        # evidence a real run keeps there cost no journal commit, as they would on the ext4.
        run = node.root / "run"
        run.mkdir(exist_ok=True)
        if any(run.iterdir()):
            raise RuntimeError(f"{run} is not empty: a new boot's /run is")
        subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(run)], check=True)
        try:
            # The boot began after the crash: run the reaper on a clock past it.
            # tests.clocked_run's run, that writes its own CPU seconds as it leaves.
            argv = [sys.executable, "-m", "bench.own_cpu", str(cpu_file), str(time.time() + 60)]
            argv += ["--", "--root", str(node.root), "--bin-dir", PLUGIN_DIR, "--json"]
            argv += ["--parallel", str(parallel)]
            return own("reaper", timed(argv, {**os.environ, "PYTHONPATH": str(REPO)}))
        finally:
            subprocess.run(["umount", str(run)], check=True)

    def serial() -> tuple[float, int]:
        _, calls = fresh()
        return timed(["sh", str(shell_loop(calls, scripts))])

    def loops_at_once() -> tuple[float, int]:
        """For reference, not the target: one shell loop per network, all at once, the most
        running the plugins in parallel can give on this machine."""
        _, calls = fresh()
        loops = []
        for name, mine in by_network(calls):
            loops.append(f"sh {shell_loop(mine, scripts / name)} &")
        return timed(["sh", "-c", " ".join(loops) + " wait"])

    def python_floor() -> tuple[float, int]:
        """The same, from one Python process (PYTHON_DEL_FLOOR): what is left of the
        reaper's time beyond it is the reaper's own work, not its interpreter's."""
        _, calls = fresh()
        listed = [
            str(python_calls(mine, scripts / f"py-{name}")) for name, mine in by_network(calls)
        ]
        return own(
            "python floor", timed([sys.executable, "-c", PYTHON_DEL_FLOOR, str(cpu_file), *listed])
        )

    (r_wall, r_rss), (s_wall, _), (p_wall, _), (f_wall, _) = medians(
        runs, reaper, serial, loops_at_once, python_floor
    )
    # The warm-up's figures are left out, as medians() leaves out its wall time.
    cpu = {
        name: {part: statistics.median(run[part] for run in samples[1:]) for part in samples[0]}
        for name, samples in own_cpu.items()
    }
    print(
        f"DEL replay, 200 damaged attachments over {len(NETWORKS)} networks, --parallel {parallel}"
    )
    print(f"{'reaper s':>9} {'serial loop s':>14} {'ratio':>6} {'RSS MiB':>8}   loops at once")
    print(
        f"{r_wall:>9.3f} {s_wall:>14.3f} {r_wall / s_wall:>6.2f} {r_rss / 1024:>8.1f}   "
        f"{p_wall:.3f} s, {p_wall / s_wall:.2f}"
    )
    print(
        f"the reaper against the loops at once: {r_wall / p_wall:.2f}x; the Python floor "
        f"(one thread per network, posix_spawn) {f_wall:.3f} s, {f_wall / p_wall:.2f}x of them, "
        f"the reaper {r_wall / f_wall:.2f}x of it"
    )
    reaper_cpu = cpu["reaper"]
    print(
        f"own CPU, not the plugins': the reaper {reaper_cpu.pop('total'):.3f} s, "
        f"the Python floor {cpu['python floor']['total']:.3f} s; the reaper's by stage:"
    )
    for stage, seconds in reaper_cpu.items():
        print(f"  {seconds:.3f} s  {stage}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument(
        "--runs", type=int, help="timed runs of each command (default: 5 for the scan, 9 for DEL)"
    )
    parser.add_argument("--only", help="only the scan paths whose name contains this")
    parser.add_argument("--del", dest="del_replay", action="store_true")
    parser.add_argument("--parallel", type=int, default=DEFAULT_PARALLEL)
    parser.add_argument("--work", help="where to build the trees (default: a temp dir)")
    parser.add_argument(
        "--python",
        action="append",
        metavar="INTERPRETER",
        help="run the whole benchmark with this interpreter, the reaper and the floor with it "
        "too; repeat for several, one table each (default: the one running this)",
    )
    args = parser.parse_args()
    if args.python:
        again = [a for a in sys.argv[1:] if a not in args.python and a != "--python"]
        failed = 0
        for interpreter in args.python:
            sys.stdout.flush()
            failed |= subprocess.run([interpreter, __file__, *again], check=False).returncode
            print()
        sys.exit(1 if failed else 0)
    if args.del_replay and os.geteuid() != 0:
        sys.exit("--del needs root: it runs the plugins in a private network namespace")
    if os.geteuid() == 0 and os.environ.get("CNI_REAPER_BENCH_INSIDE") != "1":
        # A private mount namespace for the journalled file system (both benchmarks mount
        # one); the DEL replay's plugins get a network namespace of their own as well.
        inside = ["env", "CNI_REAPER_BENCH_INSIDE=1", sys.executable, *sys.argv]
        unshare = ["unshare", *(["--net"] if args.del_replay else []), "--mount"]
        unshare += ["--propagation", "private"]
        os.execvp("unshare", [*unshare, *inside])  # noqa: S606 (no shell wanted)
    for package in ("cni_reaper", "tests"):
        compileall.compile_dir(REPO / package, quiet=1)
    print(
        f"{time.strftime('%Y-%m-%d')}, Python {platform.python_version()} ({sys.executable}), "
        f"{os.cpu_count()} cores",
        flush=True,
    )
    with tempfile.TemporaryDirectory(dir=args.work) as work:
        if args.del_replay:
            # A DEL run is short and shares two cores with 200 plugin processes: more runs.
            bench_del(args.runs or 9, Path(work), args.parallel)
        else:
            sizes = [int(s) for s in args.sizes.split(",")]
            print_scan(bench_scan(sizes, args.runs or 5, Path(work), args.only))


if __name__ == "__main__":
    main()
