"""containerd 1.6 stuck on the seed bug after a crash, then healed by cni-reaper; run by
tests/test_runtime.py.

Usage: unshare --net --mount --pid --fork --mount-proc --propagation private \
           python -m tests.runtime_scenario WORKDIR [--dry-run-first]

This process is PID 1 of a private PID namespace: every process the scenario starts (containerd,
its shims, the sandboxes) lives in it, is killed by PID when the scenario ends, and is killed by
the kernel should the scenario itself die. Mounts and links are private to the namespace.

Boot 1 runs pod sandboxes through the CRI API with Debian's containerd, runc and CNI plugins.
The crash kills every process with SIGKILL, loses the netns and the kernel's network state as a
reboot does, and damages some cache files as a power cut does. Boot 2 shows the runtime stuck,
then runs the installed cni-reaper with the runtime stopped, starts the runtime again and tears
every sandbox down. What was seen goes to WORKDIR/result.json for the test to judge.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from cni_reaper.evidence import wtmp
from cni_reaper.runtime import config, inventory
from cni_reaper.runtime.config import LocatedPath, PathKind, Runtime
from tests import pause_image
from tests.cri import CriError, RuntimeClient
from tests.libcni import reserved_ips
from tests.nodetree import PLUGIN_DIR, NodeTree, bridge_conflist
from tests.private_node import bind, damage, private_tmpfs, reaper_command, tree_digest

CACHE_DIR = Path("/var/lib/cni")
NETNS_DIR = Path("/run/netns")
# containerd 1.6 puts shim sockets under this fixed path whatever its config says.
SHIM_SOCKET_DIR = Path("/run/containerd")
NETWORK = "podnet"
CONFLIST = bridge_conflist(NETWORK, "10.88.0.0/24")
# What the crash does to each pod's two cache files: (podnet-<id>-eth0, cni-loopback-<id>-lo).
DAMAGE = [
    ("empty", "valid"),
    ("zeroed", "valid"),
    ("truncated", "valid"),
    ("valid", "valid"),
    ("valid", "empty"),
    ("valid", "valid"),
]
STUCK = "decoding version from network config"


def scenario_config(state: Path, node_root: Path) -> str:
    """containerd's config for this scenario: its socket in the node's /run, its root, state
    and opt dirs the scenario's own, the node's conf dir and Debian's plugins."""
    return f"""version = 2
root = "{state / "containerd/root"}"
state = "{state / "containerd/state"}"
[grpc]
  address = "{node_root / "run/containerd/containerd.sock"}"
[ttrpc]
  address = "{node_root / "run/containerd/containerd.sock.ttrpc"}"
[plugins."io.containerd.internal.v1.opt"]
  # Where containerd would otherwise make /opt/containerd on the machine.
  path = "{state / "containerd/opt"}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image.IMAGE_NAME}"
  # The test sandbox may not lower its own oom_score_adj; containerd must not try.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{PLUGIN_DIR}"
    conf_dir = "{node_root / "etc/cni/net.d"}"
"""


class Containerd:
    """One containerd daemon, started with config and flags; it answers on socket."""

    def __init__(
        self, config: Path, socket: Path, log: IO[bytes], flags: Sequence[str] = ()
    ) -> None:
        self.socket = socket
        self.argv = ["containerd", "--config", str(config), *flags]
        self._log = log
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, label: str) -> RuntimeClient:
        self._log.write(f"\n===== containerd start: {label}\n".encode())
        self._log.flush()
        self.process = subprocess.Popen(self.argv, stdout=self._log, stderr=self._log)
        client = RuntimeClient(str(self.socket), timeout=60)
        deadline = time.monotonic() + 60
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"containerd exited with {self.process.returncode}")
            try:
                if self.socket.exists():
                    client.version()
                    return client
            except CriError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("containerd did not answer CRI Version within 60 s")
            time.sleep(0.1)

    def stop(self) -> int:
        """A clean stop, as systemd does it: SIGTERM, then SIGKILL after a grace period."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def other_pids() -> list[int]:
    """Every live process of this PID namespace but this one."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue
        if state != "Z":
            pids.append(int(entry))
    return sorted(pids)


def reap() -> None:
    """As PID 1 of the namespace this process inherits every orphan, dead ones included."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def kill_all(deadline_s: float = 30) -> list[int]:
    """SIGKILL every other process of the namespace at once, as a power cut does; wait for them."""
    killed = other_pids()
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + deadline_s
    while other_pids() and time.monotonic() < deadline:
        reap()
        time.sleep(0.05)
    reap()
    return killed


def wait_for_pause_processes(count: int, deadline_s: float = 30) -> list[str]:
    """Wait until count processes of the namespace run the pause command; return the command
    lines of every other process of the namespace then (or at the deadline).

    RunPodSandbox can return while the sandbox's process is still runc's (`runc init`, comm
    `runc:[2:INIT]`, running) on its way to exec the pause command: the shim has had its
    `runc start` return, and containerd its Start. A crash in that moment kills a `runc`; the
    crash here comes once every sandbox runs its pause command."""
    deadline = time.monotonic() + deadline_s
    while True:
        lines = {pid: cmdline(pid) for pid in other_pids()}
        pauses = [pid for pid, line in lines.items() if line == list(pause_image.ENTRYPOINT)]
        if len(pauses) >= count or time.monotonic() > deadline:
            return sorted(" ".join(line) for pid, line in lines.items() if pid not in pauses)
        time.sleep(0.02)


def cmdline(pid: int) -> list[str]:
    try:
        data = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return []
    return [arg.decode(errors="replace") for arg in data.split(b"\0")[:-1]]


def process_names(pids: list[int]) -> dict[int, str]:
    names = {}
    for pid in pids:
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            names[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    return names


def lose_kernel_state() -> None:
    """What the reboot takes with the old kernel: netns pins, links, iptables rules."""
    for pin in sorted(NETNS_DIR.iterdir()):
        subprocess.run(["umount", str(pin)], check=True)
        pin.unlink()
    lose_links_and_rules()


def lose_links_and_rules() -> None:
    """The links and iptables rules of the namespace, gone with the old kernel."""
    links = json.loads(subprocess.run(["ip", "-j", "link", "show"], capture_output=True).stdout)
    for link in links:
        if link["ifname"] != "lo":
            # A veth may vanish on its own while its peer's netns is torn down.
            subprocess.run(["ip", "link", "delete", link["ifname"]], capture_output=True)
    for table in ("filter", "nat"):
        subprocess.run(["iptables", "-t", table, "-F"], check=True)
        subprocess.run(["iptables", "-t", table, "-X"], check=True)


def remove_cgroups(parent: str) -> list[str]:
    """rmdir the sandboxes' cgroups below parent in every hierarchy; return any left behind."""
    left = []
    for hierarchy in Path("/sys/fs/cgroup").iterdir():
        top = hierarchy / parent.strip("/")
        if not top.is_dir():
            continue
        for dirpath, _, _ in sorted(os.walk(top), key=lambda d: -d[0].count("/")):
            for _ in range(50):
                try:
                    os.rmdir(dirpath)
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
            else:
                left.append(dirpath)
    return left


def import_image(socket: Path, tar: Path) -> None:
    ctr = ["ctr", "--address", str(socket), "--namespace", "k8s.io", "images", "import"]
    proc = subprocess.run([*ctr, str(tar)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"ctr images import: exit {proc.returncode}: {proc.stderr[-2000:]}")


def snapshot_cni() -> dict[str, Any]:
    results = CACHE_DIR / "results"
    return {
        "results": sorted(p.name for p in results.iterdir()) if results.is_dir() else [],
        "ips": reserved_ips(CACHE_DIR / "networks", NETWORK),
    }


def run_reaper(node_root: Path, *extra: str) -> dict[str, Any]:
    proc = subprocess.run(
        [*reaper_command(), "--root", str(node_root), "--json", *extra],
        capture_output=True,
        text=True,
        timeout=120,
    )
    report = json.loads(proc.stdout) if proc.stdout.strip() else None
    return {"exit": proc.returncode, "stderr": proc.stderr, "report": report}


def read_inventory(state: Path) -> dict[str, Any]:
    """What cni-reaper's runtime inventory reads from this containerd's root (its meta.db as
    containerd left it), taken as the node's root for the default containerd."""
    containerd_root = LocatedPath(
        Runtime.CONTAINERD,
        PathKind.PERSISTENT_ROOT,
        "/containerd/root",
        str(state / "containerd/root"),
        "the scenario's containerd.toml",
    )
    configs = config.load(str(state))._replace(persistent_roots=(containerd_root,))
    found = inventory.load(str(state), configs)
    return {
        "known": sorted(found.known),
        "undecided": sorted(found.undecided),
        "unsaved": sorted(found.unsaved),
        "unreadable": list(found.unreadable),
        "sources": list(found.sources),
    }


def teardown(client: RuntimeClient, sandbox_id: str) -> dict[str, str | None]:
    outcome: dict[str, str | None] = {"stop": None, "remove": None}
    for step, call in (("stop", client.stop_pod_sandbox), ("remove", client.remove_pod_sandbox)):
        try:
            call(sandbox_id)
        except CriError as error:
            outcome[step] = error.details
            break
    return outcome


def scenario(work: Path, dry_run_first: bool, result: dict[str, Any]) -> None:
    state = work / "node"
    state.mkdir()
    private_tmpfs(state)
    for path in (CACHE_DIR, NETNS_DIR, SHIM_SOCKET_DIR):
        private_tmpfs(path)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)

    # The node as cni-reaper sees it with --root: the real CNI dirs bound in, boot world its own.
    node = NodeTree(state / "root")
    bind(CACHE_DIR, node.root / "var/lib/cni")
    bind(Path(PLUGIN_DIR), node.root / PLUGIN_DIR.lstrip("/"))
    node.write_conf(f"10-{NETWORK}.conflist", json.dumps(CONFLIST, indent=2).encode())
    (node.root / "run/containerd").mkdir(parents=True)
    node.boot(time.time() - 60)
    cgroup_parent = f"/cni-reaper-proof-{uuid.uuid4().hex[:12]}"
    result["cgroup_parent"] = cgroup_parent

    log = (work / "containerd.log").open("ab")
    config_file = state / "containerd.toml"
    config_file.write_text(scenario_config(state, node.root))
    containerd = Containerd(config_file, node.root / "run/containerd/containerd.sock", log)
    tar = state / "pause.tar"
    pause_image.build(tar)
    try:
        # Boot 1: pods come up.
        client = containerd.start("boot 1")
        result["runtime"] = client.version()
        import_image(containerd.socket, tar)
        pods: list[dict[str, Any]] = []
        for index, (net_damage, lo_damage) in enumerate(DAMAGE):
            name = f"pod-{index}"
            sandbox_id = client.run_pod_sandbox(
                name, str(uuid.uuid4()), cgroup_parent, 30080 + index
            )
            status = client.pod_sandbox_status(sandbox_id)
            pods.append(
                {
                    "name": name,
                    "id": sandbox_id,
                    "ip": status.ip,
                    "ready": status.ready,
                    "files": {
                        f"{NETWORK}-{sandbox_id}-eth0": net_damage,
                        f"cni-loopback-{sandbox_id}-lo": lo_damage,
                    },
                }
            )
        client.close()
        result["pods"] = pods
        result["boot1"] = snapshot_cni()

        # The crash, once every sandbox runs its pause command.
        result["others_before_crash"] = wait_for_pause_processes(len(pods))
        killed = process_names(other_pids())
        kill_all()
        result["killed"] = sorted(set(killed.values()))
        result["left_after_kill"] = process_names(other_pids())
        lose_kernel_state()
        for pod in pods:
            for file_name, how in pod["files"].items():
                damage(CACHE_DIR / "results" / file_name, how)
        result["after_crash"] = snapshot_cni()

        # Boot 2 begins clearly after the old boot's last write.
        time.sleep(3.2)
        now = time.time()
        node.records.append(wtmp.boot_record(now))
        node.write_boot_world(btime=int(now) - 1, boot_id=str(uuid.uuid4()))

        client = containerd.start("boot 2, no cni-reaper")
        result["listed_after_reboot"] = sorted(client.list_pod_sandbox())
        stuck: dict[str, str | None] = {}
        for pod in pods:
            if pod["files"][f"{NETWORK}-{pod['id']}-eth0"] != "valid":
                stuck[pod["id"]] = teardown(client, pod["id"])["stop"]
        result["stuck"] = stuck
        result["still_reserved"] = snapshot_cni()
        watched = (CACHE_DIR, node.root)
        before = tree_digest(*watched)
        result["reaper_while_runtime_up"] = run_reaper(node.root)
        result["reaper_while_runtime_up"]["tree_unchanged"] = tree_digest(*watched) == before
        client.close()
        result["containerd_stop_exit"] = containerd.stop()
        result["inventory_stopped"] = read_inventory(state)
        # By hand, the runtime stopped, in the boot it started in before the reaper: nothing
        # proves which files an earlier boot wrote, so nothing is touched.
        before = tree_digest(CACHE_DIR)  # the CNI state; the run keeps notes of its own
        result["reaper_same_boot"] = run_reaper(node.root)
        result["reaper_same_boot"]["tree_unchanged"] = tree_digest(CACHE_DIR) == before
        result["reaper_same_boot"]["quarantined"] = node.quarantine.exists()

        # Boot 3, with cni-reaper in its place: it runs before the runtime starts (/run is new).
        kill_all()
        time.sleep(1.1)
        now = time.time()
        node.records.append(wtmp.boot_record(now))
        node.write_boot_world(btime=int(now) - 1, boot_id=str(uuid.uuid4()))
        if dry_run_first:
            before = tree_digest(*watched)
            result["dry_run"] = run_reaper(node.root, "--dry-run")
            result["dry_run"]["tree_unchanged"] = tree_digest(*watched) == before
        result["reaper"] = run_reaper(node.root)
        quarantine = node.quarantine
        result["quarantine"] = sorted(
            str(p.relative_to(quarantine)) for p in quarantine.rglob("*") if p.is_file()
        )

        # The runtime starts on a consistent cache and tears every sandbox down.
        client = containerd.start("boot 3, after cni-reaper")
        result["teardown"] = {pod["id"]: teardown(client, pod["id"]) for pod in pods}
        result["listed_after_teardown"] = client.list_pod_sandbox()
        client.close()
        result["final"] = snapshot_cni()
        result["containerd_final_stop_exit"] = containerd.stop()
        result["inventory_final"] = read_inventory(state)
    finally:
        kill_all()
        result["cgroups_left"] = remove_cgroups(cgroup_parent)
        log.close()


def main(argv: list[str]) -> int:
    work = Path(argv[0])
    result: dict[str, Any] = {"dry_run_first": "--dry-run-first" in argv[1:]}
    try:
        scenario(work, result["dry_run_first"], result)
    finally:
        (work / "result.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
