"""A crashed node whose attachments libcni itself made and tears down: a reusable scenario.

The attachments are made by tests/libcni_client (libcni 1.1.2's AddNetworkList, as containerd
1.6/1.7 makes them) through Debian's real plugins, with libcni's cache in /var/lib/cni. Then the
node crashes as a power cut does: some results files emptied, NUL-filled, cut or deleted, every
netns pin and every link the attachments made gone, the kernel's iptables rules gone. The
runtime's DEL (libcni's DelNetworkList, netns "" as containerd passes it after a reboot) is tried
where it is asked for, cni-reaper runs as the boot-time unit does, and then the runtime's DEL
runs for every attachment the runtime still knows. Every step is observed.

The runtime's records can be given too: a containerd meta.db (a real bbolt file in containerd's
layout, tests/bolt_writer) naming the sandboxes the runtime knows, so that an attachment whose
sandbox it lacks is one the runtime forgot. A network's conflist can be removed after the crash,
and the runtime can set up new pods after the reaper's boot-time run, before a later run.

From a test:

    observed = run_in_namespace(Scenario(networks=..., attachments=...), client, workdir)

runs `unshare --net --mount --propagation private python -m tests.libcni_scenario WORKDIR CLIENT`,
which reads WORKDIR/scenario.json, runs `run_inside` with tmpfs over /var/lib/cni, /run/netns
and any host-local dataDir outside /var/lib/cni (nothing of the machine's is touched), and
writes WORKDIR/observed.json. The caller needs root, unshare, ip, iptables and the plugins in
/usr/lib/cni (`why_not`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, TypedDict, cast, get_args

from cni_reaper.evidence import wtmp
from tests import bolt_writer
from tests.nodetree import PLUGIN_DIR, NodeTree
from tests.private_node import bind, damage, reaper_command, unshare
from tests.real_libcni import ClientRun, LibcniClient

REPO = Path(__file__).resolve().parent.parent
CACHE_DIR = Path("/var/lib/cni")
NETNS_DIR = Path("/run/netns")
DEFAULT_DATA_DIR = "/var/lib/cni/networks"
META_DB = "var/lib/containerd/io.containerd.metadata.v1.bolt/meta.db"  # under the node's root
CRI_NAMESPACE = "k8s.io"
NO_DAD = ("net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0")
# What a crash leaves of a results file ("deleted": gone, as peers that rm -rf it at boot leave).
RESULTS_FILE_FATES = ("valid", "empty", "zeroed", "truncated", "deleted")
DAMAGED = ("empty", "zeroed", "truncated")
# Seconds between the old boot's last write and the new boot's start: file times have a
# granularity, and the reaper's doubt near the boundary means leave.
BOOT_GAP = 3.2


# ---- What the scenario is given ----------------------------------------------------------------


@dataclass(frozen=True)
class Attachment:
    """One attachment libcni makes: network's conflist, container_id, ifname.

    results_file: what the crash leaves of its results file (RESULTS_FILE_FATES).
    id_only_reservation: its host-local reservations rewritten to the container ID alone, as
        host-local before plugins v0.8.0 wrote them.
    del_before: the runtime's DEL tried after the crash, before the repair; None: only where
        the results file is damaged (it fails there without running a plugin; elsewhere it
        would tear the attachment down before the reaper ever saw it).
    runtime_dels: the runtime still knows the sandbox and DELs it after the repair (on the
        networks still in its conf dir, as containerd's go-cni tears down the networks it
        loaded); False: a sandbox nobody will DEL but the reaper (forgotten by the runtime:
        absent from its records, when the scenario writes them). Every attachment of a
        container says the same.
    capability_args: given to libcni on ADD and DEL; None: a port mapping per attachment
        (libcni passes it only to plugins with the portMappings capability).
    """

    network: str
    container_id: str
    ifname: str = "eth0"
    results_file: str = "valid"
    id_only_reservation: bool = False
    del_before: bool | None = None
    runtime_dels: bool = True
    capability_args: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if self.results_file not in RESULTS_FILE_FATES:
            raise ValueError(f"unknown results file fate {self.results_file!r}")

    @property
    def results_name(self) -> str:
        return f"{self.network}-{self.container_id}-{self.ifname}"

    def tries_del_before(self) -> bool:
        return self.results_file in DAMAGED if self.del_before is None else self.del_before


@dataclass(frozen=True)
class Scenario:
    """networks: conflists as written to the conf dir (in this order, as 10-<name>.conflist,
    11-...); attachments: made in this order, several per container share its netns.

    containerd_records: a containerd meta.db in the node's root naming the sandbox of every
        container the runtime knows (runtime_dels), each with its CNI result saved, as
        containerd 1.6/1.7 keeps them; False: no runtime records on the node at all.
    removed_networks: their conflists are removed from the conf dir after the crash (after the
        runtime's failed DELs, before the reaper runs); the runtime no longer DELs on them.
    current_boot: attachments the runtime makes after the reaper's boot-time run (the runtime
        shown as started in /run, their sandboxes not yet in its records); then the reaper
        runs again with second_run_args.
    flush_iptables_at_crash: False keeps the kernel's rules over the crash, which a reboot
        would drop: portmap's DEL removes an attachment's DNAT rules only when it is handed the
        attachment's port mappings, so the rules left show whether they reached it.
    """

    networks: tuple[dict[str, Any], ...]
    attachments: tuple[Attachment, ...]
    reaper_args: tuple[str, ...] = ()
    flush_iptables_at_crash: bool = True
    containerd_records: bool = False
    removed_networks: tuple[str, ...] = ()
    current_boot: tuple[Attachment, ...] = ()
    second_run_args: tuple[str, ...] = ("-v",)

    def __post_init__(self) -> None:
        names = {str(n["name"]) for n in self.networks}
        knows: dict[str, bool] = {}
        for a in (*self.attachments, *self.current_boot):
            if a.network not in names:
                raise ValueError(f"attachment {a.results_name}: no network {a.network!r}")
            if knows.setdefault(a.container_id, a.runtime_dels) != a.runtime_dels:
                raise ValueError(f"container {a.container_id}: runtime_dels differs")
        if unknown := set(self.removed_networks) - names:
            raise ValueError(f"removed_networks names no network: {sorted(unknown)}")
        for a in self.current_boot:
            if a.results_file != "valid" or not a.runtime_dels or a.id_only_reservation:
                raise ValueError(f"{a.results_name}: a current-boot attachment is whole and known")
            if a.network in self.removed_networks:
                raise ValueError(f"{a.results_name}: its network is removed before it is made")
        if {a.container_id for a in self.current_boot} & {a.container_id for a in self.attachments}:
            raise ValueError("a current-boot attachment belongs to a container of the old boot")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Scenario:
        return cls(
            networks=tuple(doc["networks"]),
            attachments=tuple(Attachment(**a) for a in doc["attachments"]),
            reaper_args=tuple(doc["reaper_args"]),
            flush_iptables_at_crash=bool(doc["flush_iptables_at_crash"]),
            containerd_records=bool(doc["containerd_records"]),
            removed_networks=tuple(doc["removed_networks"]),
            current_boot=tuple(Attachment(**a) for a in doc["current_boot"]),
            second_run_args=tuple(doc["second_run_args"]),
        )

    def network(self, name: str) -> dict[str, Any]:
        return next(n for n in self.networks if n["name"] == name)

    def known_sandboxes(self) -> list[str]:
        """The sandboxes the runtime's records name: those of the old boot it still knows."""
        return sorted({a.container_id for a in self.attachments if a.runtime_dels})

    def runtime_dels_after(self, a: Attachment) -> bool:
        """Whether the runtime DELs this attachment after the repair: it knows the sandbox and
        still has the network's config."""
        return a.runtime_dels and a.network not in self.removed_networks


# ---- Conflists ---------------------------------------------------------------------------------


def host_local(
    ranges: Sequence[Sequence[str | Mapping[str, str]]], data_dir: str | None
) -> dict[str, Any]:
    """host-local's ipam: ranges is a list of range sets, each a list of subnets or range dicts
    (subnet, rangeStart, rangeEnd, gateway)."""
    ipam: dict[str, Any] = {
        "type": "host-local",
        "ranges": [
            [{"subnet": r} if isinstance(r, str) else dict(r) for r in range_set]
            for range_set in ranges
        ],
    }
    if data_dir is not None:
        ipam["dataDir"] = data_dir
    return ipam


def bridge_network(
    name: str,
    ranges: Sequence[Sequence[str | Mapping[str, str]]],
    *,
    bridge: str = "cni0",
    data_dir: str | None = None,
    cni_version: str = "1.0.0",
) -> dict[str, Any]:
    """bridge with host-local, then portmap: the chain most node images ship."""
    return {
        "cniVersion": cni_version,
        "name": name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": True,
                "ipMasq": True,
                "ipam": host_local(ranges, data_dir),
            },
            {"type": "portmap", "capabilities": {"portMappings": True}, "snat": True},
        ],
    }


def ptp_network(
    name: str,
    ranges: Sequence[Sequence[str | Mapping[str, str]]],
    *,
    data_dir: str | None = None,
    cni_version: str = "0.4.0",
) -> dict[str, Any]:
    """ptp with host-local: a veth pair per pod, no bridge."""
    return {
        "cniVersion": cni_version,
        "name": name,
        "plugins": [{"type": "ptp", "ipMasq": True, "ipam": host_local(ranges, data_dir)}],
    }


def data_dir_of(conflist: Mapping[str, Any]) -> str | None:
    """host-local's dataDir for this network, as its plugin sees it; None: no host-local."""
    for plugin in conflist["plugins"]:
        ipam = plugin.get("ipam")
        if isinstance(ipam, dict) and ipam.get("type") == "host-local":
            return str(ipam.get("dataDir") or DEFAULT_DATA_DIR)
    return None


# ---- What the scenario sees ---------------------------------------------------------------------


class StoreState(TypedDict):
    reservations: dict[str, str]  # IP -> content (\r\n kept)
    last_reserved_ip: dict[str, str]  # last_reserved_ip.<range set index> -> IP


# When the stores are looked at: after the ADDs; after the crash and the DELs tried before the
# repair; after the reaper's boot-time run; after the current-boot ADDs, then after the reaper's
# second run (both the same as after_repair without current-boot attachments); after the
# runtime's DELs.
Stage = Literal[
    "before_crash",
    "at_repair",
    "after_repair",
    "before_second_run",
    "after_second_run",
    "after_runtime_del",
]
STAGES: tuple[Stage, ...] = get_args(Stage)


class StoreSeen(TypedDict):
    network: str
    data_dir: str
    path: str
    before_crash: StoreState
    at_repair: StoreState
    after_repair: StoreState
    before_second_run: StoreState
    after_second_run: StoreState
    after_runtime_del: StoreState


class AttachmentSeen(TypedDict):
    attachment: dict[str, Any]  # the Attachment as given
    results_name: str
    netns: str
    ips: list[str]  # addresses ADD returned, without prefix length
    add: dict[str, Any]  # ClientRun.to_json()
    del_before: dict[str, Any] | None  # None: not tried
    del_after: dict[str, Any] | None  # None: the runtime does not DEL it
    results_after_repair: str | None  # the file's fate: None gone, else its bytes in hex


class ReaperSeen(TypedDict):
    argv: list[str]
    exit: int
    report: dict[str, Any] | None
    stderr: str
    seconds: float


class Observed(TypedDict):
    attachments: list[AttachmentSeen]
    current_boot: list[AttachmentSeen]  # made after the reaper's boot-time run
    stores: list[StoreSeen]
    reaper: ReaperSeen
    reaper_again: ReaperSeen | None  # the run after the current-boot ADDs
    known_sandboxes: list[str] | None  # what the meta.db names; None: no runtime records
    removed_conflists: list[str]  # conf files removed after the crash
    results_after_repair: list[str]
    # every results file's bytes (hex) right before and right after the reaper's second run
    results_before_second_run: dict[str, str]
    results_after_second_run: dict[str, str]
    results_after_runtime_del: list[str]
    quarantine: list[str]  # paths under the quarantine dir
    links_left_by_crash: list[str]  # links the attachments made that the crash left (none)
    dnat_rules_of: dict[str, list[str]]  # stage -> containers portmap has DNAT rules for
    # setup, crash, del_before, reaper, second_run (with the current-boot ADDs), runtime_del, total
    seconds: dict[str, float]


def store_state(store: Path) -> StoreState:
    state = StoreState(reservations={}, last_reserved_ip={})
    if not store.is_dir():
        return state
    for path in sorted(store.iterdir()):
        text = path.read_bytes().decode("utf-8", "backslashreplace")
        if path.name.startswith("last_reserved_ip"):
            state["last_reserved_ip"][path.name] = text
        elif path.name != "lock":
            state["reservations"][path.name] = text
    return state


# ---- The machine side ---------------------------------------------------------------------------


def why_not() -> str | None:
    """Why this machine cannot run the scenario, or None."""
    if os.geteuid() != 0:
        return "needs root for unshare --net --mount"
    for tool, package in (("unshare", "util-linux"), ("ip", "iproute2"), ("iptables", "iptables")):
        if shutil.which(tool) is None:
            return f"needs {package}'s {tool}"
    if not Path(PLUGIN_DIR, "bridge").is_file():
        return f"needs Debian's containernetworking-plugins in {PLUGIN_DIR}"
    return None


class Playing:
    """A scenario being played in its namespace (start_in_namespace); wait() for what it saw."""

    def __init__(self, proc: subprocess.Popen[str], workdir: Path, timeout: float) -> None:
        self._proc = proc
        self._workdir = workdir
        self._deadline = time.monotonic() + timeout

    def wait(self) -> Observed:
        """What the scenario saw. One that could not be played (an ADD that failed, a tool
        missing) raises with its output."""
        try:
            _, stderr = self._proc.communicate(timeout=max(0.0, self._deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self._proc.kill()
            _, stderr = self._proc.communicate()
            raise RuntimeError(f"the scenario timed out:\n{stderr}") from None
        if self._proc.returncode != 0:
            raise RuntimeError(f"the scenario failed (exit {self._proc.returncode}):\n{stderr}")
        return cast(Observed, json.loads((self._workdir / "observed.json").read_text()))


def start_in_namespace(
    scenario: Scenario, client: LibcniClient, workdir: Path, timeout: float = 600
) -> Playing:
    """The scenario started in a private network and mount namespace of its own: several can
    be played at once, each sees nothing of the others."""
    if scenario.containerd_records:
        bolt_writer.writer()  # built here, where a missing toolchain skips (or fails in CI)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "scenario.json").write_text(json.dumps(scenario.to_json(), indent=2))
    proc = subprocess.Popen(
        [
            *unshare(net=True),
            sys.executable,
            "-m",
            "tests.libcni_scenario",
            str(workdir),
            str(client.path),
        ],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    return Playing(proc, workdir, timeout)


def run_in_namespace(
    scenario: Scenario, client: LibcniClient, workdir: Path, timeout: float = 600
) -> Observed:
    """The scenario in a private network and mount namespace; what it saw."""
    return start_in_namespace(scenario, client, workdir, timeout).wait()


# ---- Inside the namespace ----------------------------------------------------------------------


def private_dirs(paths: Iterable[Path], keep_visible: Iterable[Path]) -> None:
    """Empty dirs at paths, private to this mount namespace, nothing made on the machine: a
    tmpfs over each path's nearest existing dir, the outermost first, the rest made in it.
    A tmpfs that would hide one of keep_visible (plugins, the work dir) is refused."""

    def nearest_dir(path: Path) -> Path:
        while not path.is_dir():
            path = path.parent
        return path

    wanted = [Path(p) for p in paths]
    mounted: list[Path] = []
    for top in sorted({nearest_dir(p) for p in wanted}, key=lambda p: len(p.parts)):
        if any(top == m or m in top.parents for m in mounted):
            continue
        for kept in keep_visible:
            if top == kept or top in kept.parents:
                raise ValueError(f"a tmpfs over {top} would hide {kept}")
        subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0755", "tmpfs", str(top)], check=True)
        mounted.append(top)
    for path in wanted:
        path.mkdir(parents=True, exist_ok=True)


def host_links() -> set[str]:
    out = subprocess.run(["ip", "-j", "link", "show"], capture_output=True, check=True).stdout
    return {str(link["ifname"]) for link in json.loads(out)}


def _remove_links(keep: set[str], patience: float = 5.0) -> list[str]:
    """Every link but keep deleted, as the reboot loses them (a veth whose peer went with its
    netns may still be on its way out); the links that would not go."""
    deadline = time.monotonic() + patience
    while True:
        left = sorted(host_links() - keep)
        if not left or time.monotonic() > deadline:
            return left
        for link in left:
            subprocess.run(["ip", "link", "delete", link], capture_output=True)


def _listing(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


def _contents(directory: Path) -> dict[str, str]:
    return {p.name: p.read_bytes().hex() for p in sorted(directory.iterdir()) if p.is_file()}


def _flush_iptables() -> None:
    """The kernel's packet filter starts empty at boot."""
    for command in ("iptables", "ip6tables"):
        for table in ("filter", "nat", "mangle"):
            subprocess.run([command, "-w", "-t", table, "-F"], check=True)
            subprocess.run([command, "-w", "-t", table, "-X"], check=True)


def _cni_args(attachment: Attachment, index: int) -> list[tuple[str, str]]:
    """CNI_ARGS as containerd's CRI plugin gives them for a pod sandbox."""
    return [
        ("IgnoreUnknown", "1"),
        ("K8S_POD_NAMESPACE", "default"),
        ("K8S_POD_NAME", f"pod-{index}"),
        ("K8S_POD_INFRA_CONTAINER_ID", attachment.container_id),
        ("K8S_POD_UID", f"00000000-0000-4000-8000-{index:012d}"),
    ]


def _capability_args(attachment: Attachment, index: int) -> dict[str, Any]:
    if attachment.capability_args is not None:
        return attachment.capability_args
    return {"portMappings": [{"hostPort": 8000 + index, "containerPort": 80, "protocol": "tcp"}]}


_DNAT_OWNER = re.compile(r'dnat name: \\"[^"\\]*\\" id: \\"([^"\\]+)\\"')


def dnat_rules_of() -> list[str]:
    """The containers portmap keeps DNAT rules for (IPv4 and IPv6), by the comment it puts on
    each rule of a container's chain."""
    owners: set[str] = set()
    for command in ("iptables", "ip6tables"):
        listing = subprocess.run(
            [command, "-w", "-t", "nat", "-S"], capture_output=True, text=True, check=True
        ).stdout
        owners.update(m.group(1) for m in _DNAT_OWNER.finditer(listing))
    return sorted(owners)


def write_containerd_records(node: NodeTree, netns_of: Mapping[str, str]) -> Path:
    """containerd's meta.db in the node's root: one CRI sandbox record per container (its
    netns and its saved CNI result), as containerd 1.6/1.7 keeps a sandbox it set up."""
    path = node.root / META_DB
    path.parent.mkdir(parents=True, exist_ok=True)
    records = [
        op
        for cid, netns in sorted(netns_of.items())
        for op in bolt_writer.containerd_sandbox(
            CRI_NAMESPACE, cid, metadata=bolt_writer.sandbox_metadata(cid, netns=netns)
        )
    ]
    return bolt_writer.write_db(path, [records], no_freelist_sync=True)


def run_inside(scenario: Scenario, client: LibcniClient, workdir: Path) -> Observed:
    """The scenario, in a namespace of its own (run_in_namespace starts it there)."""
    started = time.monotonic()
    seconds: dict[str, float] = {}
    nets = {str(n["name"]): n for n in scenario.networks}
    stores = sorted(
        {(name, d) for name, n in nets.items() if (d := data_dir_of(n)) is not None},
    )
    outside = sorted({Path(d) for _, d in stores if not Path(d).is_relative_to(CACHE_DIR)})
    private_dirs(
        [CACHE_DIR, NETNS_DIR, *outside],
        keep_visible=[Path(PLUGIN_DIR), workdir, REPO, client.path, Path(sys.executable)],
    )
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    # The node as cni-reaper sees it with --root: this namespace's CNI state bound in, the boot
    # world its own. Its plugins run confined to that root and so see the same state.
    node = NodeTree(workdir / "root")
    bind(CACHE_DIR, node.root / "var/lib/cni")
    for data_dir in outside:
        bind(data_dir, node.root / data_dir.relative_to("/"))
    node.boot(time.time() - 600)  # the boot that is about to crash
    conf_files: dict[str, str] = {}
    for number, net in enumerate(scenario.networks):
        conf_files[str(net["name"])] = name = f"{10 + number}-{net['name']}.conflist"
        node.write_conf(name, json.dumps(net, indent=2).encode())
    links_before = host_links()
    dnat: dict[str, list[str]] = {}

    def libcni(command: str, a: Attachment, index: int, netns: str) -> ClientRun:
        return client.run(
            command,
            a.container_id,
            a.ifname,
            conf_dir=node.conf_dir,
            network=a.network,
            bin_dirs=(PLUGIN_DIR,),
            cache_dir=CACHE_DIR,
            netns=netns,
            cni_args=_cni_args(a, index),
            capability_args=_capability_args(a, index),
        )

    def store_of(network: str) -> Path | None:
        data_dir = data_dir_of(nets[network])
        return None if data_dir is None else Path(data_dir) / network

    def snapshot() -> dict[str, StoreState]:
        return {name: store_state(Path(d) / name) for name, d in stores}

    pins: dict[str, str] = {}

    def add(a: Attachment, index: int) -> AttachmentSeen:
        netns = pins.get(a.container_id)
        if netns is None:
            name = f"pod-{a.container_id[:12]}"
            subprocess.run(["ip", "netns", "add", name], check=True)
            # No duplicate address detection in the pod: ptp waits for its IPv6 address to
            # settle, 1.5 to 2 s a pod, and nothing here is about DAD.
            subprocess.run(["ip", "netns", "exec", name, "sysctl", "-qw", *NO_DAD], check=True)
            netns = pins[a.container_id] = str(NETNS_DIR / name)
        made = libcni("add", a, index, netns)
        if not made.ok or made.result is None:
            raise RuntimeError(f"ADD of {a.results_name} failed: {made.error}\n{made.stderr}")
        ips = [str(ip["address"]).split("/")[0] for ip in made.result.get("ips", [])]
        store = store_of(a.network)
        if a.id_only_reservation and store is not None:
            for ip in ips:
                (store / ip).write_text(a.container_id)
        return AttachmentSeen(
            attachment=asdict(a),
            results_name=a.results_name,
            netns=netns,
            ips=ips,
            add=made.to_json(),
            del_before=None,
            del_after=None,
            results_after_repair=None,
        )

    # Boot 1: the runtime sets pods up, and keeps its records of them.
    seen = [add(a, index) for index, a in enumerate(scenario.attachments)]
    known = scenario.known_sandboxes() if scenario.containerd_records else None
    if known is not None:
        write_containerd_records(node, {cid: pins[cid] for cid in known})
    before_crash = snapshot()
    dnat["before_crash"] = dnat_rules_of()
    seconds["setup"] = time.monotonic() - started

    # The crash: unsynced cache writes lost, every netns and link gone with the kernel, and its
    # rules unless the scenario keeps them.
    mark = time.monotonic()
    results = CACHE_DIR / "results"
    for a in scenario.attachments:
        if a.results_file == "deleted":
            (results / a.results_name).unlink()
        else:
            damage(results / a.results_name, a.results_file)
    last_write = time.time()
    for netns in pins.values():
        subprocess.run(["ip", "netns", "delete", Path(netns).name], check=True)
    pins.clear()
    left_by_crash = _remove_links(links_before)
    if scenario.flush_iptables_at_crash:
        _flush_iptables()
    seconds["crash"] = time.monotonic() - mark

    # Boot 2, before the repair: the runtime's DEL, netns "" as containerd passes it.
    mark = time.monotonic()
    for index, (a, s) in enumerate(zip(scenario.attachments, seen)):
        if a.tries_del_before():
            s["del_before"] = libcni("del", a, index, "").to_json()
    at_repair = snapshot()
    dnat["at_repair"] = dnat_rules_of()
    seconds["del_before"] = time.monotonic() - mark
    # Networks the node no longer has: their conflists are gone before the reaper runs.
    removed = [conf_files[name] for name in scenario.removed_networks]
    for name in removed:
        (node.conf_dir / name).unlink()

    # The reboot: a new boot begins clearly after the last write of the old one.
    time.sleep(max(0.0, last_write + BOOT_GAP - time.time()))
    now = time.time()
    node.records.append(wtmp.boot_record(now))
    node.write_boot_world(btime=int(now) - 1)

    def reaper(*extra: str) -> ReaperSeen:
        argv = [
            *reaper_command(),
            "--json",
            "--root",
            str(node.root),
            "--bin-dir",
            PLUGIN_DIR,
            *extra,
        ]
        mark = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True)
        return ReaperSeen(
            argv=argv,
            exit=proc.returncode,
            report=json.loads(proc.stdout) if proc.stdout else None,
            stderr=proc.stderr,
            seconds=time.monotonic() - mark,
        )

    first = reaper(*scenario.reaper_args)
    seconds["reaper"] = first["seconds"]
    after_repair = snapshot()
    dnat["after_repair"] = dnat_rules_of()
    results_after_repair = _listing(results)
    for s in seen:
        path = results / s["results_name"]
        s["results_after_repair"] = path.read_bytes().hex() if path.is_file() else None
    quarantine = node.quarantine
    quarantined = sorted(
        str(p.relative_to(quarantine)) for p in quarantine.rglob("*") if p.is_file()
    )

    # The runtime starts and sets up new pods; the reaper runs again while they live.
    mark = time.monotonic()
    again: ReaperSeen | None = None
    first_new = len(scenario.attachments)
    new = []
    if scenario.current_boot:
        node.runtime_starts()
        new = [add(a, first_new + i) for i, a in enumerate(scenario.current_boot)]
    before_second_run = snapshot()
    results_before_second_run = _contents(results)
    if scenario.current_boot:
        again = reaper(*scenario.second_run_args)
    after_second_run = snapshot()
    results_after_second_run = _contents(results)
    dnat["after_second_run"] = dnat_rules_of()
    seconds["second_run"] = time.monotonic() - mark

    # The runtime tears down every sandbox it knows, on the networks it has a config for.
    mark = time.monotonic()
    for index, (a, s) in enumerate(zip(scenario.attachments, seen)):
        if scenario.runtime_dels_after(a):
            s["del_after"] = libcni("del", a, index, "").to_json()
    for i, (a, s) in enumerate(zip(scenario.current_boot, new)):
        s["del_after"] = libcni("del", a, first_new + i, s["netns"]).to_json()
    for netns in pins.values():
        subprocess.run(["ip", "netns", "delete", Path(netns).name], check=True)
    after_del = snapshot()
    dnat["after_runtime_del"] = dnat_rules_of()
    seconds["runtime_del"] = time.monotonic() - mark
    seconds["total"] = time.monotonic() - started

    by_stage = {
        "before_crash": before_crash,
        "at_repair": at_repair,
        "after_repair": after_repair,
        "before_second_run": before_second_run,
        "after_second_run": after_second_run,
        "after_runtime_del": after_del,
    }
    return Observed(
        attachments=seen,
        current_boot=new,
        stores=[
            cast(
                StoreSeen,
                {
                    "network": name,
                    "data_dir": d,
                    "path": str(Path(d) / name),
                    **{stage: by_stage[stage][name] for stage in STAGES},
                },
            )
            for name, d in stores
        ],
        reaper=first,
        reaper_again=again,
        known_sandboxes=known,
        removed_conflists=removed,
        results_after_repair=results_after_repair,
        results_before_second_run=results_before_second_run,
        results_after_second_run=results_after_second_run,
        results_after_runtime_del=_listing(results),
        quarantine=quarantined,
        links_left_by_crash=left_by_crash,
        dnat_rules_of=dnat,
        seconds=seconds,
    )


if __name__ == "__main__":
    work = Path(sys.argv[1])
    played = Scenario.from_json(json.loads((work / "scenario.json").read_text()))
    observed = run_inside(played, LibcniClient(Path(sys.argv[2])), work)
    (work / "observed.json").write_text(json.dumps(observed, indent=2))
