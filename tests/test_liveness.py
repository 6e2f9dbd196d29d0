"""What /run and /proc say is alive, read from real files, real processes and the kernel's own
mount table: a runtime's process (in this root or another), its live container state as
containerd 1.6 and containers/storage lay it out, pinned network namespaces."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cni_reaper import runtime
from cni_reaper.runtime import config
from cni_reaper.runtime.liveness import (
    EvidenceUnreadable,
    RootCheck,
    RuntimeProcess,
    answering_socket,
    live_container_ids,
    netns_pins,
    runtime_processes,
    started_this_boot,
)
from tests.private_node import cannot_run, unshare

REPO = Path(__file__).resolve().parent.parent
SLEEP = Path(shutil.which("sleep") or "/bin/sleep")
BUSYBOX = Path("/bin/busybox")  # statically linked (busybox-static): runs in an empty root
ID_A, ID_B, ID_C, ID_D = (f"{n:x}" * 64 for n in (10, 11, 12, 13))


def wait_for_comm(pid: int, comm: str) -> None:
    """Until the child has exec'd: before, /proc shows the parent's name."""
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}/comm").read_text().strip() != comm:
        assert time.monotonic() < deadline, f"pid {pid} never became {comm}"
        time.sleep(0.01)


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes a test starts, killed at its end."""
    processes: list[subprocess.Popen[bytes]] = []
    yield processes
    for process in processes:
        process.kill()
        process.wait()


def start_as(
    started: list[subprocess.Popen[bytes]], binary: Path, argv: list[str]
) -> subprocess.Popen[bytes]:
    process = subprocess.Popen(argv, executable=binary)
    started.append(process)
    wait_for_comm(process.pid, binary.name[:15])
    return process


def pids(found: list[RuntimeProcess]) -> dict[int, RuntimeProcess]:
    return {p.pid: p for p in found}


def test_cli_import_keeps_answering_socket() -> None:
    assert runtime.answering_socket is answering_socket


def test_answering_socket_takes_a_listener_not_a_stale_file(tmp_path: Path) -> None:
    stale, live, regular = tmp_path / "stale.sock", tmp_path / "live.sock", tmp_path / "file"
    with socket.socket(socket.AF_UNIX) as gone:
        gone.bind(str(stale))
    regular.touch()
    assert answering_socket([str(stale), str(regular), str(tmp_path / "none")]) is None
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(live))
        listener.listen()
        assert answering_socket([str(stale), str(live)]) == str(live)


def test_a_runtime_process_counts_for_its_own_root_only(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    binary = tmp_path / "containerd"
    shutil.copy(SLEEP, binary)
    process = start_as(started, binary, [str(binary), "60"])
    mine = pids(runtime_processes("/"))[process.pid]
    assert mine == RuntimeProcess(process.pid, "containerd", str(binary), RootCheck.SAME)
    assert process.pid not in pids(runtime_processes(str(tmp_path)))


def test_shims_zombies_and_other_processes_are_no_runtime(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    shim = tmp_path / "containerd-shim-runc-v2"  # comm: "containerd-shim"
    shutil.copy(SLEEP, shim)
    shim_process = start_as(started, shim, [str(shim), "60"])
    kubelet = tmp_path / "kubelet"
    shutil.copy(SLEEP, kubelet)
    zombie = start_as(started, kubelet, [str(kubelet), "0.2"])
    deadline = time.monotonic() + 10
    while Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    found = pids(runtime_processes("/"))
    assert shim_process.pid not in found
    assert zombie.pid not in found
    assert os.getpid() not in found


def test_argv0_and_a_deleted_executable_still_name_a_runtime(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    by_argv0 = start_as(started, SLEEP, ["dockerd", "60"])
    binary = tmp_path / "crio"
    shutil.copy(SLEEP, binary)
    upgraded = start_as(started, binary, [str(binary), "60"])
    binary.unlink()  # a package upgrade replaced it under the running process
    found = pids(runtime_processes("/"))
    assert found[by_argv0.pid].name == "dockerd"
    assert found[upgraded.pid] == RuntimeProcess(upgraded.pid, "crio", str(binary), RootCheck.SAME)


def test_a_proc_that_lists_nothing_is_no_answer(tmp_path: Path) -> None:
    with pytest.raises(EvidenceUnreadable, match="lists no process"):
        runtime_processes("/", proc=str(tmp_path))
    with pytest.raises(EvidenceUnreadable):
        runtime_processes("/", proc=str(tmp_path / "missing"))


def chrooted(started: list[subprocess.Popen[bytes]], new_root: Path) -> subprocess.Popen[bytes]:
    """busybox copied in as /containerd, run in a real chroot as its sleep applet."""
    new_root.mkdir()
    shutil.copy(BUSYBOX, new_root / "containerd")
    enter = "import os, sys; os.chroot(sys.argv[1]); os.chdir('/'); "
    enter += "os.execv('/containerd', ['sleep', '60'])"
    process = subprocess.Popen([sys.executable, "-c", enter, str(new_root)])
    started.append(process)
    wait_for_comm(process.pid, "containerd")
    return process


def test_a_chrooted_runtime_counts_for_its_root_not_for_the_host(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    if os.geteuid() != 0:
        cannot_run("needs root to chroot")
    if not BUSYBOX.is_file():
        cannot_run(f"needs {BUSYBOX} (Debian package busybox-static)")
    node = tmp_path / "node"
    process = chrooted(started, node)
    assert pids(runtime_processes(str(node)))[process.pid].root == RootCheck.SAME
    assert process.pid not in pids(runtime_processes("/"))
    evidence = started_this_boot(str(node), config.load(str(node)))
    # /proc/PID/exe reads as the reader sees the file: from this root, not the chroot's.
    exe = node / "containerd"
    assert evidence == [f"containerd is running (pid {process.pid}, {exe}, same-root)"]


def test_under_the_units_capabilities_an_unreadable_root_counts_as_alive(
    tmp_path: Path, started: list[subprocess.Popen[bytes]]
) -> None:
    """cni-reaper.service keeps only CAP_NET_ADMIN and CAP_NET_RAW: without CAP_SYS_PTRACE the
    runtime's /proc/PID/root and exe cannot be read, and the process must still count."""
    if os.geteuid() != 0:
        cannot_run("needs root to start a runtime the scanner cannot inspect")
    if shutil.which("setpriv") is None:
        cannot_run("needs util-linux setpriv")
    binary = tmp_path / "containerd"
    shutil.copy(SLEEP, binary)
    process = start_as(started, binary, [str(binary), "60"])
    scan = (
        "import json, sys; from cni_reaper.runtime.liveness import runtime_processes; "
        "print(json.dumps([p._asdict() for p in runtime_processes(sys.argv[1])]))"
    )
    bounded = ["setpriv", "--bounding-set", "-all,+net_admin,+net_raw", "--inh-caps", "-all"]
    for root in ("/", str(tmp_path)):
        proc = subprocess.run(
            [*bounded, sys.executable, "-c", scan, root], capture_output=True, text=True, cwd=REPO
        )
        assert proc.returncode == 0, proc.stderr
        found = {p["pid"]: p for p in json.loads(proc.stdout)}
        assert found[process.pid] == {
            "pid": process.pid,
            "name": "containerd",
            "exe": "",
            "root": "root-unreadable",
        }


def containerd_1_6_state(state: Path) -> None:
    """What Debian's containerd 1.6.20 left in its state dir (observed in a private namespace)
    with one task running in namespace k8s.io."""
    task = state / "io.containerd.runtime.v2.task/k8s.io" / ID_A
    (task / "rootfs/proc").mkdir(parents=True)
    for name in ("init.pid", "log.json", "runtime", "options.json", "address", "config.json"):
        (task / name).write_text("")
    os.mkfifo(task / "log")
    (task / "work").symlink_to(f"/var/lib/containerd/io.containerd.runtime.v2.task/k8s.io/{ID_A}")
    (state / "io.containerd.runtime.v1.linux").mkdir()
    (state / "io.containerd.grpc.v1.cri").mkdir()
    (state / "runc/k8s.io" / ID_A).mkdir(parents=True)
    (state / "runc/k8s.io" / ID_A / "state.json").write_text("{}")
    (state / "s").mkdir()
    (state / "s/b259e06518a758007cbc6c24e0453df944539c16fc68d4e4677401789084a8d5").touch()
    (state / "fifo/2158073357").mkdir(parents=True)
    (state / "containerd.sock").touch()


def test_live_ids_from_containerd_crio_and_docker_layouts(tmp_path: Path) -> None:
    containerd_1_6_state(tmp_path / "run/containerd")
    # Docker's own containerd, namespace moby; a task whose ID is a symlink counts, unfollowed.
    moby = tmp_path / "run/docker/containerd/daemon/io.containerd.runtime.v2.task/moby"
    moby.mkdir(parents=True)
    (moby / ID_B).symlink_to("/nowhere")
    # containers/storage's run root, as CRI-O and podman leave it.
    runroot = tmp_path / "run/containers/storage"
    (runroot / "overlay-containers" / ID_C / "userdata").mkdir(parents=True)
    (runroot / "overlay-containers/containers.lock").touch()
    (runroot / "overlay-layers" / "not-a-container").mkdir(parents=True)
    (tmp_path / "run/crun" / ID_D).mkdir(parents=True)
    ids = live_container_ids(str(tmp_path), config.load(str(tmp_path)))
    assert ids == {ID_A, ID_B, ID_C, ID_D}


def test_live_ids_follow_the_configured_state_dir_inside_the_root(tmp_path: Path) -> None:
    (tmp_path / "etc/containerd").mkdir(parents=True)
    (tmp_path / "etc/containerd/config.toml").write_text('state = "/var/run/ctd"\n')
    containerd_1_6_state(tmp_path / "srv/ctd")
    # The node's /run/ctd is a symlink to its /srv/ctd: resolved inside the root.
    (tmp_path / "run").mkdir()
    (tmp_path / "run/ctd").symlink_to("/srv/ctd")
    assert live_container_ids(str(tmp_path), config.load(str(tmp_path))) == {ID_A}


def test_a_state_dir_that_cannot_be_read_is_no_answer(tmp_path: Path) -> None:
    tasks = tmp_path / "run/containerd/io.containerd.runtime.v2.task"
    tasks.mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (tasks / "k8s.io").symlink_to(tmp_path / "elsewhere")
    configs = config.load(str(tmp_path))
    with pytest.raises(EvidenceUnreadable, match="a symlink where a directory belongs"):
        live_container_ids(str(tmp_path), configs)
    (tasks / "k8s.io").unlink()
    (tmp_path / "run/crun").symlink_to("../../../../../../../../..")
    with pytest.raises(EvidenceUnreadable, match="leads out of"):
        live_container_ids(str(tmp_path), configs)


def escaped(path: bytes) -> bytes:
    """A path as the kernel writes it in mountinfo (fs/proc_namespace.c, seq_path)."""
    return b"".join(b"\\%03o" % c if c in b" \t\n\\" else bytes([c]) for c in path)


def mount_line(number: int, mount_point: bytes, fstype: bytes = b"nsfs") -> bytes:
    source = b"nsfs" if fstype == b"nsfs" else b"none"
    fields = [b"%d" % number, b"25", b"0:4", b"net:[4026532]", escaped(mount_point)]
    fields += [b"rw", b"shared:5", b"master:1", b"-", fstype, source, b"rw"]
    return b" ".join(fields) + b"\n"


def test_netns_pins_come_from_the_mount_table(tmp_path: Path) -> None:
    node = tmp_path / "node"
    (node / "run/netns").mkdir(parents=True)
    (node / "var/run/netns").mkdir(parents=True)  # a tree whose /var/run is no symlink
    base = os.path.realpath(node).encode()
    lines = [
        mount_line(1, base + b"/run/netns/cni-1"),
        mount_line(2, base + b"/run/netns/with space\tand\\back"),
        mount_line(3, base + b"/var/run/netns/cni-var"),
        mount_line(4, base + b"/run/netns/cni-proc", fstype=b"proc"),
        mount_line(5, base + b"/run/other/cni-elsewhere"),
        mount_line(6, base + b"/run/netns/deeper/cni-x"),
        mount_line(7, b"/run/netns/cni-host"),
        b"a line that is not mountinfo\n",
    ]
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_bytes(b"".join(lines))
    assert netns_pins(str(node), str(mountinfo)) == {
        "/run/netns/cni-1",
        "/run/netns/with space\tand\\back",
        "/run/netns/cni-var",
    }
    # Another root sees none of them; a root with no netns dir has none.
    assert netns_pins(str(tmp_path), str(mountinfo)) == frozenset()
    with pytest.raises(EvidenceUnreadable):
        netns_pins(str(node), str(tmp_path / "missing"))


@settings(max_examples=80, deadline=None)
@given(
    st.binary(min_size=1, max_size=40)
    .map(lambda name: name.replace(b"/", b"_").replace(b"\0", b"_"))
    .filter(lambda name: name not in (b".", b".."))
)
def test_mountinfo_escaping_round_trips(name: bytes) -> None:
    with tempfile.TemporaryDirectory() as root:
        (Path(root) / "run/netns").mkdir(parents=True)
        mountinfo = Path(root) / "mountinfo"
        pin = os.path.realpath(root).encode() + b"/run/netns/" + name
        mountinfo.write_bytes(mount_line(1, pin))
        assert netns_pins(root, str(mountinfo)) == {"/run/netns/" + os.fsdecode(name)}


def test_started_this_boot_on_a_fresh_root_and_what_counts(tmp_path: Path) -> None:
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text("")
    node = tmp_path / "node"
    node.mkdir()

    def evidence() -> list[str]:
        return started_this_boot(str(node), config.load(str(node)), mountinfo=str(mountinfo))

    assert evidence() == []
    # systemd's socket units make these early in boot, before any runtime: not evidence.
    (node / "run").mkdir()
    (node / "run/docker.sock").touch()
    (node / "run/cri-dockerd.sock").touch()
    # A state dir outside /run says nothing about this boot.
    (node / "etc/containerd").mkdir(parents=True)
    (node / "etc/containerd/config.toml").write_text('state = "/var/lib/ctd-state"\n')
    (node / "var/lib/ctd-state").mkdir(parents=True)
    assert evidence() == []
    (node / "run/containerd").mkdir()
    (node / "run/crio").mkdir()
    (node / "run/crio/version").write_text("1.30.0")
    assert evidence() == [
        f"containerd task-state-dir {node}/run/containerd (default, not in effect) exists",
        f"cri-o runtime-dir {node}/run/crio (default) exists",
        f"cri-o start-marker {node}/run/crio/version (default) exists",
    ]


def test_started_this_boot_counts_what_it_cannot_read(tmp_path: Path) -> None:
    node = tmp_path / "node"
    node.mkdir()
    evidence = started_this_boot(
        str(node),
        config.load(str(node)),
        proc=str(tmp_path / "no-proc"),
        mountinfo=str(tmp_path / "no-mountinfo"),
    )
    assert len(evidence) == 2
    assert evidence[0].startswith("cannot tell which network namespaces are pinned: ")
    assert evidence[1].startswith("cannot tell which runtimes are running: ")


def test_real_netns_pins_in_a_private_namespace(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        cannot_run("needs root for unshare --net --mount and ip netns add")
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        cannot_run("needs util-linux unshare and iproute2 ip")
    proc = subprocess.run(
        [*unshare(net=True), sys.executable, "-m", "tests.liveness_scenario", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert "/run/netns/pinned\\040with\\040space " in result["mountinfo"]
    assert result["host_pins"] == ["/run/netns/cni-1234", "/run/netns/pinned with space"]
    assert result["node_pins"] == ["/run/netns/cni-node"]
    node = tmp_path / "node"
    assert result["node_evidence"] == [f"network namespace {node}/run/netns/cni-node is pinned"]


def test_the_scan_of_proc_is_fast(started: list[subprocess.Popen[bytes]]) -> None:
    """A node has hundreds of processes; the scan reads three small files for each."""
    for _ in range(300):
        started.append(subprocess.Popen([str(SLEEP), "60"]))
    start = time.perf_counter()
    runtime_processes("/")
    elapsed = time.perf_counter() - start
    assert elapsed < 1.0, f"{elapsed:.3f} s for {len(os.listdir('/proc'))} /proc entries"
