"""A node whose previous boot crashed after the test's files were written, with host-local as the
only plugin of its network: a real plugin whose DEL touches nothing but its own store. It runs
on the node's root as the reaper runs it there, in a private mount namespace: tests that use it
need root."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from cni_reaper import cli
from cni_reaper.journal import EventLog
from cni_reaper.runtime import liveness
from tests.libcni import add_network_list, reserved_ips
from tests.nodetree import PLUGIN_DIR, NodeTree, host_local_conflist


class Crashed:
    """A node whose previous boot crashed after the test's files were written."""

    def __init__(self, node: NodeTree, t0: float) -> None:
        self.node = node
        self.t0 = t0
        self.ipam = node.root / "var/lib/cni/networks"
        node.write_conf("10-hl.conflist", host_local_conflist("hl", "10.22.0.0/24"))
        node.boot(t0 - 3600)
        node.login(t0 - 3500)

    def add(self, container_id: str, ifname: str = "eth0") -> Path:
        conflist = (self.node.conf_dir / "10-hl.conflist").read_bytes()
        # host-local needs CNI_NETNS to be set on ADD, never looks at it.
        netns = f"/run/netns/cni-{container_id[:8]}"
        add_network_list(conflist, container_id, ifname, netns, self.node.root)
        return self.node.results / f"hl-{container_id}-{ifname}"

    def reboot(self) -> None:
        self.node.boot(self.t0 + 10)
        self.node.write_boot_world(btime=self.t0 + 5)

    def reboot_now(self) -> None:
        """For a reaper that runs on the real clock: the new boot began a moment ago."""
        now = time.time()
        self.node.boot(now - 0.5)
        self.node.write_boot_world(btime=now - 1)

    def run(
        self,
        capsys: pytest.CaptureFixture[str],
        *extra: str,
        events: EventLog | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> tuple[int, dict[str, Any]]:
        """One run in process; the test's own journal and notify socket are never used."""
        code = cli.run(
            self.argv("--json", *extra),
            clock=lambda: self.t0 + 60,
            events=events,
            environ=environ if environ is not None else {},
        )
        return int(code), json.loads(capsys.readouterr().out)

    def run_main(self, *extra: str) -> int:
        """Through main, as the console script runs: errors become exit codes and messages."""
        return cli.main(self.argv("--json", *extra), clock=lambda: self.t0 + 60, environ={})

    def argv(self, *extra: str) -> list[str]:
        return ["--root", str(self.node.root), "--bin-dir", PLUGIN_DIR, *extra]

    def ips(self) -> dict[str, str]:
        return reserved_ips(self.ipam, "hl")

    def results_dir_links_to(self, elsewhere: Path) -> None:
        """The results dir replaced by a symlink to a directory elsewhere, then a reboot."""
        elsewhere.mkdir(exist_ok=True)
        (self.node.root / "var/lib/cni").mkdir(parents=True, exist_ok=True)
        os.symlink(elsewhere, self.node.results)
        self.reboot()

    @contextlib.contextmanager
    def containerd_answering(self) -> Iterator[None]:
        """Something listens on containerd's default socket in the root, as a runtime does."""
        sock_dir = self.node.root / "run/containerd"
        sock_dir.mkdir(parents=True, exist_ok=True)
        with socket.socket(socket.AF_UNIX) as server:
            server.bind(str(sock_dir / "containerd.sock"))
            server.listen(1)
            yield


def by_path(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["path"]: e for e in report["entries"]}


def pin_netns(crashed: Crashed, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, pin: str) -> None:
    """A netns mounted now at ROOT/run/netns/<pin>. No failpoint reaches the kernel's mount
    table: liveness.netns_pins is monkeypatched to read a mountinfo the test writes, with the
    pin there as nsfs, and is otherwise the real one."""
    netns_dir = crashed.node.root / "run/netns"
    netns_dir.mkdir(parents=True, exist_ok=True)
    (netns_dir / pin).touch()
    real = os.path.realpath(crashed.node.root)
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(f"4242 1 0:4 net:[4026532000] {real}/run/netns/{pin} rw - nsfs nsfs rw\n")
    real_pins = liveness.netns_pins

    def pins(
        root: str, _mountinfo: str = "", netns_dirs: Any = liveness.DEFAULT_NETNS_DIRS
    ) -> frozenset[str]:
        return real_pins(root, str(mountinfo), netns_dirs)

    monkeypatch.setattr(liveness, "netns_pins", pins)
