"""containerd 1.6 run as k3s runs it, crashed with pods up and one pod inside its CNI ADD, then
repaired by cni-reaper, which finds k3s's containerd, dirs and records without a flag; run by
tests/test_runtime.py.

Usage: unshare --net --mount --pid --fork --mount-proc --propagation private \
           python -m tests.k3s_scenario WORKDIR [DATA_DIR config.yaml|unit]

DATA_DIR, below /var/lib, is k3s's data dir, set as an operator who moves k3s to a volume of
its own sets it: in the node's /etc/rancher/k3s/config.yaml, or on the command line of its
k3s.service as k3s's installer writes it; everything below (config, CNI dirs, containerd's
root) lies there instead.

PID 1 of a private PID namespace, as tests/runtime_scenario.py is. The node's /var/lib and /run
are the scenario's own: one tmpfs each, mounted over the machine's in this mount namespace only,
where the runtime uses them at their real paths, and at the same time under the node root that
cni-reaper is given with --root (shared mounts: what the runtime mounts below them shows at both
places). So containerd and the reaper see one node, at k3s's paths:

- containerd's config where k3s generates it, /var/lib/rancher/k3s/agent/etc/containerd/
  config.toml, with the cni table k3s writes when it runs its own flannel: conf_dir
  /var/lib/rancher/k3s/agent/etc/cni/net.d, bin_dir /var/lib/rancher/k3s/data/<hash>/bin
  (data/current links to it, as k3s's does);
- containerd started as k3s starts it: `-a /run/k3s/containerd/containerd.sock --state
  /run/k3s/containerd --root /var/lib/rancher/k3s/agent/containerd`.

Real k3s ships one multi-call `cni` binary in its bin dir, every plugin a symlink to it; here the
plugins are copies of Debian's /usr/lib/cni binaries (bridge, host-local, portmap, loopback),
each its own program. The network is bridge + host-local, then `hold` (below), then portmap:
k3s's flannel delegates to the same bridge and host-local, but no flannel daemon runs here.

`hold` is a chained plugin, a shell script: it passes its prevResult on, except for the pod
named "held", whose ADD it holds: it writes the sandbox ID where the scenario waits for it and
sleeps. host-local (inside bridge) has reserved the pod's address by then, and libcni has not
written its results file (it does after the whole chain). The crash then SIGKILLs containerd,
the shims, the sandboxes and the held plugin.

Boot 1: pods come up: two keep their results files ("kept"), two lose both of theirs outright
("deleted": what the rm -rf peers, EKS's AMI and Bottlerocket, do at boot to every file of the
dir; here only these go, so that whole entries are shown kept in the same run), one gets its pod
network's file emptied by the power cut ("damaged"), and "held" never finishes its ADD.
Boot 2: cni-reaper runs before containerd with --root and no other flag, containerd starts, the
reaper run again refuses, and every sandbox is stopped and removed through CRI. What was seen
goes to WORKDIR/result.json.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, NamedTuple

from google.protobuf import any_pb2

from cni_reaper.evidence import wtmp
from cni_reaper.runtime import config, inventory
from cni_reaper.runtime.bbolt import Bucket, Database
from tests import pause_image
from tests.cri import CriError, RuntimeClient
from tests.libcni import reserved_ips
from tests.nodetree import PLUGIN_DIR, NodeTree, bridge_conflist
from tests.private_node import reaper_command, tree_digest
from tests.runtime_scenario import (
    Containerd,
    import_image,
    kill_all,
    lose_links_and_rules,
    other_pids,
    process_names,
    remove_cgroups,
    wait_for_pause_processes,
)

DEFAULT_DATA_DIR = "/var/lib/rancher/k3s"
# k3s names its data dir after a hash of what it unpacked there.
DATA_HASH = "b2e6d8bc1a9f0e5d4c3b2a19f8e7d6c5b4a39281706f5e4d3c2b1a0998877665"
CRI_SANDBOXES = "io.containerd.grpc.v1.cri/sandboxes"
STATE = "/run/k3s/containerd"
SOCKET = f"{STATE}/containerd.sock"


class Layout(NamedTuple):
    """Where k3s keeps what it keeps in its data dir, and what moved it there: "config.yaml"
    (`data-dir` in /etc/rancher/k3s/config.yaml) or "unit" (`--data-dir` on the command line
    of k3s.service, as the installer writes INSTALL_K3S_EXEC)."""

    data_dir: str
    moved_by: str = ""

    @property
    def config(self) -> str:
        return f"{self.data_dir}/agent/etc/containerd/config.toml"

    @property
    def conf_dir(self) -> str:
        return f"{self.data_dir}/agent/etc/cni/net.d"

    @property
    def bin_dir(self) -> str:
        return f"{self.data_dir}/data/{DATA_HASH}/bin"

    @property
    def containerd_root(self) -> str:
        return f"{self.data_dir}/agent/containerd"

    @property
    def flags(self) -> tuple[str, ...]:
        return ("-a", SOCKET, "--state", STATE, "--root", self.containerd_root)


CACHE_DIR = "/var/lib/cni"
NETWORK = "cbr0"
SUBNET = "10.42.0.0/24"
PLUGINS = ("bridge", "host-local", "portmap", "loopback")
HELD = "held"
# name -> what the crash does to its results files
PODS = {
    "kept-0": "kept",
    "kept-1": "kept",
    "deleted-0": "deleted",
    "deleted-1": "deleted",
    "damaged-0": "damaged",
}


def generated_config(layout: Layout) -> str:
    """containerd's config with the keys k3s's template writes for containerd 1.6 with its own
    flannel (k3s pkg/agent/templates), no root, state or socket (k3s passes those as flags);
    the pause image and oom_score_adj are the test's."""
    cri = '[plugins."io.containerd.grpc.v1.cri"'
    return f"""# File generated by k3s. DO NOT EDIT. Use config.toml.tmpl instead.
version = 2

[plugins."io.containerd.internal.v1.opt"]
  path = "{layout.containerd_root}"
{cri}]
  stream_server_address = "127.0.0.1"
  stream_server_port = "10010"
  enable_selinux = false
  enable_unprivileged_ports = true
  enable_unprivileged_icmp = true
  sandbox_image = "{pause_image.IMAGE_NAME}"
  # The test sandbox may not lower its own oom_score_adj; containerd must not try.
  restrict_oom_score_adj = true

{cri}.containerd]
  snapshotter = "overlayfs"
  disable_snapshot_annotations = true

{cri}.cni]
  bin_dir = "{layout.bin_dir}"
  conf_dir = "{layout.conf_dir}"

{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
"""


def hold_plugin(signal_file: Path) -> str:
    """A chained plugin that passes its prevResult on, and holds the ADD of the pod named
    "held": it writes the sandbox ID to signal_file and sleeps until the crash kills it.

    libcni hands a plugin its config as Go's encoding/json writes a map, keys sorted: for this
    plugin, whose config is its type alone, cniVersion, name, prevResult, type. The prevResult
    object is what lies between "prevResult": and the closing ,"type":"hold"}."""
    return f"""#!/bin/sh
case "$CNI_COMMAND" in
ADD)
    config=$(cat)
    case ";$CNI_ARGS;" in
    *";K8S_POD_NAME={HELD};"*)
        echo "$CNI_CONTAINERID" > {signal_file}.new && mv {signal_file}.new {signal_file}
        exec sleep 600
        ;;
    esac
    printf '%s' "$config" | sed -e 's/^.*"prevResult"://' -e 's/,"type":"hold"}}$//'
    ;;
VERSION)
    echo '{{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}}'
    ;;
esac
"""


def conflist() -> dict[str, Any]:
    doc = bridge_conflist(NETWORK, SUBNET)
    bridge, portmap = doc["plugins"]
    doc["plugins"] = [bridge, {"type": "hold"}, portmap]
    return doc


def node_path(node: NodeTree, path: str) -> Path:
    return node.root / path.lstrip("/")


def share_top_dir(node: NodeTree, top: str) -> None:
    """A fresh tmpfs for the node's top, at node_root/top (what cni-reaper reads under --root)
    and over top itself (where the runtime and its plugins use it), as peers: a mount made
    below one place (a netns pin, a sandbox's rootfs or shm) shows at the other too."""
    inside = node_path(node, top)
    inside.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(inside)], check=True)
    subprocess.run(["mount", "--make-shared", str(inside)], check=True)
    subprocess.run(["mount", "--bind", str(inside), top], check=True)


def lay_out_k3s(node: NodeTree, signal_file: Path, layout: Layout) -> None:
    """What k3s leaves on a node before its containerd first starts; and the operator's
    config.yaml that moves its data dir, if it is moved."""
    if layout.moved_by == "config.yaml":
        config_yaml = node_path(node, "/etc/rancher/k3s/config.yaml")
        config_yaml.parent.mkdir(parents=True)
        config_yaml.write_text(
            f"# k3s, moved to its own volume\nwrite-kubeconfig-mode: '0644'\n"
            f"tls-san:\n- k3s.example\ndata-dir: {layout.data_dir}\n"
        )
    elif layout.moved_by == "unit":
        unit = node_path(node, "/etc/systemd/system/k3s.service")
        unit.parent.mkdir(parents=True)
        unit.write_text(
            "[Service]\nType=notify\nEnvironmentFile=-/etc/default/%N\n"
            "EnvironmentFile=-/etc/systemd/system/k3s.service.env\n"
            "ExecStart=/usr/local/bin/k3s \\\n    server \\\n"
            f"\t'--data-dir' \\\n\t'{layout.data_dir}' \\\n\n"
        )
    config_file = node_path(node, layout.config)
    config_file.parent.mkdir(parents=True)
    config_file.write_text(generated_config(layout))
    conf_dir = node_path(node, layout.conf_dir)
    conf_dir.mkdir(parents=True)
    (conf_dir / "10-cbr0.conflist").write_text(json.dumps(conflist(), indent=2))
    bin_dir = node_path(node, layout.bin_dir)
    bin_dir.mkdir(parents=True)
    for plugin in PLUGINS:
        shutil.copy2(Path(PLUGIN_DIR) / plugin, bin_dir / plugin)
    hold = bin_dir / "hold"
    hold.write_text(hold_plugin(signal_file))
    hold.chmod(0o755)
    (bin_dir.parent.parent / "current").symlink_to(DATA_HASH)


def unmount_below(*tops: str) -> list[str]:
    """Unmount every mount below the ones now at tops, the latest first, as a reboot loses
    them; return the mount points of any still there. (Mounts the machine had below those
    paths are hidden, not below: they are left alone.)"""

    def below() -> list[tuple[int, str]]:
        rows = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            fields = line.split()
            point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[4])
            rows.append((int(fields[0]), int(fields[1]), point))
        tops_now = {point: mount_id for mount_id, _, point in rows if point in tops}
        inside = set(tops_now.values())
        found: list[tuple[int, str]] = []
        grew = True
        while grew:
            grew = False
            for mount_id, parent, point in rows:
                if parent in inside and mount_id not in inside:
                    inside.add(mount_id)
                    found.append((mount_id, point))
                    grew = True
        return sorted(found)  # mount IDs grow as mounts are made

    for _, point in reversed(below()):
        # Unmounting one of two peers takes the other with it: that one is then not mounted.
        subprocess.run(["umount", point], capture_output=True)
    return [point for _, point in below()]


def cni_state(node: NodeTree) -> dict[str, Any]:
    results = Path(CACHE_DIR) / "results"
    return {
        "results": sorted(p.name for p in results.iterdir()) if results.is_dir() else [],
        "ips": reserved_ips(Path(CACHE_DIR) / "networks", NETWORK),
    }


def file_identity(path: Path) -> dict[str, Any] | None:
    """What the reaper must leave exactly as it was: bytes, inode, size, mtime and ctime."""
    try:
        st = os.lstat(path)
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return {
        "sha256": hashlib.sha256(data).hexdigest(),
        "ino": st.st_ino,
        "size": st.st_size,
        "mtime_ns": st.st_mtime_ns,
        "ctime_ns": st.st_ctime_ns,
    }


def kept_files(pods: list[dict[str, Any]]) -> dict[str, Any]:
    """The results entries and reservations of the kept pods, each file's identity."""
    found: dict[str, Any] = {}
    for pod in pods:
        if pod["fate"] != "kept":
            continue
        for name in (f"{NETWORK}-{pod['id']}-eth0", f"cni-loopback-{pod['id']}-lo"):
            found[f"results/{name}"] = file_identity(Path(CACHE_DIR) / "results" / name)
        reserved = Path(CACHE_DIR) / "networks" / NETWORK / pod["ip"]
        found[f"networks/{NETWORK}/{pod['ip']}"] = file_identity(reserved)
    return found


def read_inventory(node: NodeTree) -> dict[str, Any]:
    """What cni-reaper's runtime inventory reads of the node, found as the reaper finds it."""
    root = str(node.root)
    found = inventory.load(root, config.load(root))
    return {
        "known": sorted(found.known),
        "undecided": sorted(found.undecided),
        "unsaved": sorted(found.unsaved),
        "unreadable": list(found.unreadable),
        "sources": list(found.sources),
        "notes": dict(found.notes),
    }


def held_record(node: NodeTree, sandbox_id: str, layout: Layout) -> dict[str, Any] | None:
    """The held sandbox's container record in containerd's meta.db (bbolt, read with
    cni-reaper's reader; the extension, a protobuf Any, with protobuf's own): its labels and
    what its CRI sandbox metadata says of the netns and the CNI result."""
    meta_db = node_path(node, layout.containerd_root) / inventory.META_DB
    fd = os.open(meta_db, os.O_RDONLY | os.O_CLOEXEC)
    try:
        record = Database(fd, str(meta_db)).bucket(
            b"v1", b"k8s.io", b"containers", sandbox_id.encode()
        )
        if record is None:
            return None
        labels = record.get(b"labels")
        extensions = record.get(b"extensions")
        extension = None
        if isinstance(extensions, Bucket):
            extension = extensions.get(inventory.CONTAINER_METADATA_EXTENSION)
        metadata = None
        if isinstance(extension, bytes):
            wrapped = any_pb2.Any()
            wrapped.ParseFromString(extension)
            metadata = json.loads(wrapped.value)["Metadata"]
        return {
            "labels": {
                key.decode(): value.decode()
                for key, value in (labels.items() if isinstance(labels, Bucket) else ())
                if isinstance(value, bytes)
            },
            "has_metadata": metadata is not None,
            "net_ns_path": None if metadata is None else metadata.get("NetNSPath"),
            "cni_result": None if metadata is None else metadata.get("CNIResult"),
        }
    finally:
        os.close(fd)


def run_reaper(node: NodeTree) -> dict[str, Any]:
    """The installed cni-reaper with --root and no other flag."""
    argv = [*reaper_command(), "--root", str(node.root), "--json"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    report = json.loads(proc.stdout) if proc.stdout.strip() else None
    return {"argv": argv, "exit": proc.returncode, "stderr": proc.stderr, "report": report}


def reboot(node: NodeTree) -> None:
    """A new boot record, boot id and btime; /run starts empty."""
    now = time.time()
    node.records.append(wtmp.boot_record(now))
    node.write_boot_world(btime=int(now) - 1, boot_id=str(uuid.uuid4()))


def start_held_pod(
    client: RuntimeClient, cgroup_parent: str, outcome: dict[str, str]
) -> threading.Thread:
    def attempt() -> None:
        try:
            outcome["id"] = client.run_pod_sandbox(HELD, str(uuid.uuid4()), cgroup_parent, 30099)
        except CriError as error:
            outcome["error"] = f"{error.code}: {error.details}"

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    return thread


def wait_for_file(path: Path, thread: threading.Thread, deadline_s: float = 60) -> str:
    deadline = time.monotonic() + deadline_s
    while not path.exists():
        if not thread.is_alive():
            raise RuntimeError("RunPodSandbox of the held pod returned before its ADD was held")
        if time.monotonic() > deadline:
            raise RuntimeError(f"the hold plugin did not write {path} within {deadline_s} s")
        time.sleep(0.05)
    return path.read_text().strip()


def scenario(work: Path, result: dict[str, Any], layout: Layout) -> None:
    node = NodeTree(work / "node")
    node.root.mkdir(parents=True)
    for top in ("/var/lib", "/run"):
        share_top_dir(node, top)
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    signal_file = work / "held-sandbox"
    lay_out_k3s(node, signal_file, layout)
    result["data_dir"] = layout.data_dir
    boot_1 = time.time() - 60
    node.boot(boot_1)
    node.write_boot_world(btime=boot_1, boot_id=str(uuid.uuid4()))
    cgroup_parent = f"/cni-reaper-k3s-{uuid.uuid4().hex[:12]}"
    result["cgroup_parent"] = cgroup_parent

    log = (work / "containerd.log").open("ab")
    containerd = Containerd(Path(layout.config), Path(SOCKET), log, layout.flags)
    tar = work / "pause.tar"
    pause_image.build(tar)
    try:
        # Boot 1: pods come up, then one is held inside its CNI ADD.
        client = containerd.start("boot 1")
        result["runtime"] = client.version()
        import_image(Path(SOCKET), tar)
        pods: list[dict[str, Any]] = []
        for index, (name, fate) in enumerate(PODS.items()):
            sandbox_id = client.run_pod_sandbox(
                name, str(uuid.uuid4()), cgroup_parent, 30080 + index
            )
            status = client.pod_sandbox_status(sandbox_id)
            pods.append({"name": name, "fate": fate, "id": sandbox_id, "ip": status.ip})
        held: dict[str, str] = {}
        thread = start_held_pod(client, cgroup_parent, held)
        held_id = wait_for_file(signal_file, thread)
        held_ip = [ip for ip, owner in cni_state(node)["ips"].items() if owner.startswith(held_id)]
        pods.append({"name": HELD, "fate": "held", "id": held_id, "ip": held_ip[0]})
        result["pods"] = pods
        result["while_held"] = cni_state(node)

        # The crash, while the held ADD sleeps and every other sandbox runs its pause command.
        result["others_before_crash"] = wait_for_pause_processes(len(PODS))
        killed = process_names(other_pids())
        kill_all()
        thread.join(timeout=30)
        client.close()
        result["held_run_pod_sandbox"] = held
        result["killed"] = sorted(set(killed.values()))
        result["left_after_kill"] = process_names(other_pids())
        result["mounts_left"] = unmount_below(
            "/run", "/var/lib", str(node_path(node, "/run")), str(node_path(node, "/var/lib"))
        )
        lose_links_and_rules()
        results = Path(CACHE_DIR) / "results"
        for pod in pods:
            files = [f"{NETWORK}-{pod['id']}-eth0", f"cni-loopback-{pod['id']}-lo"]
            if pod["fate"] == "deleted":
                for name in files:
                    (results / name).unlink()
            elif pod["fate"] == "damaged":
                (results / files[0]).write_bytes(b"")
        result["after_crash"] = cni_state(node)
        result["kept_after_crash"] = kept_files(pods)
        result["held_record"] = held_record(node, held_id, layout)
        sandbox_dir = node_path(node, layout.containerd_root) / CRI_SANDBOXES / held_id
        result["held_sandbox_dir"] = (
            sorted(p.name for p in sandbox_dir.iterdir()) if sandbox_dir.is_dir() else None
        )
        result["inventory_after_crash"] = read_inventory(node)

        # Boot 2 begins clearly after the old boot's last write; cni-reaper runs first.
        time.sleep(3.2)
        reboot(node)
        result["reaper"] = run_reaper(node)
        result["after_reaper"] = cni_state(node)
        result["kept_after_reaper"] = kept_files(pods)
        quarantine = node.quarantine
        result["quarantine"] = sorted(
            str(p.relative_to(quarantine)) for p in quarantine.rglob("*") if p.is_file()
        )

        client = containerd.start("boot 2, after cni-reaper")
        result["listed_after_reboot"] = sorted(client.list_pod_sandbox())
        watched = (Path(CACHE_DIR), node_path(node, "/var/lib/cni-reaper"))
        before = tree_digest(*watched)
        result["reaper_while_runtime_up"] = run_reaper(node)
        result["reaper_while_runtime_up"]["tree_unchanged"] = tree_digest(*watched) == before

        # kubelet stops and removes every sandbox; the store is read after each stop.
        teardown: dict[str, dict[str, Any]] = {}
        for pod in pods:
            outcome: dict[str, Any] = {"stop": None, "remove": None}
            try:
                client.stop_pod_sandbox(pod["id"])
                outcome["after_stop"] = cni_state(node)
                client.remove_pod_sandbox(pod["id"])
            except CriError as error:
                outcome["stop" if "after_stop" not in outcome else "remove"] = error.details
            teardown[pod["id"]] = outcome
        result["teardown"] = teardown
        result["listed_after_teardown"] = client.list_pod_sandbox()
        client.close()
        result["final"] = cni_state(node)
        result["containerd_stop_exit"] = containerd.stop()
        result["inventory_final"] = read_inventory(node)
    finally:
        kill_all()
        result["cgroups_left"] = remove_cgroups(cgroup_parent)
        log.close()


def main(argv: list[str]) -> int:
    work = Path(argv[0])
    layout = Layout(*argv[1:3]) if len(argv) > 1 else Layout(DEFAULT_DATA_DIR)
    result: dict[str, Any] = {}
    try:
        scenario(work, result, layout)
    finally:
        (work / "result.json").write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
