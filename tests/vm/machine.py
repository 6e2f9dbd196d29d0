"""Booting the node image under qemu (TCG: KVM on these machines cannot run stock kernels) and
reading what the guest said and what it left on its disk."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Seconds per boot; a hung guest fails the test instead of CI. The longest boot (Debian 13's
# clean setup, powering off) takes some 185 s on an idle machine, over 240 s on a busy one.
BOOT_TIMEOUT = 480


@dataclass(frozen=True)
class Image:
    dir: Path

    @property
    def disk(self) -> Path:
        return self.dir / "disk.img"


@dataclass
class Boot:
    serial: str
    seconds: float
    said: list[dict[str, Any]] = field(default_factory=list)
    killed: bool = False

    def one(self, kind: str) -> dict[str, Any]:
        found = [s for s in self.said if s["kind"] == kind]
        assert len(found) == 1, f"guest said {kind!r} {len(found)} times:\n{self.serial[-4000:]}"
        return found[0]


class Node:
    """One scenario's machine: the image under a stack of copy-on-write layers, one per boot, so
    that a boot can be run again from the disk exactly as the boot before left it."""

    def __init__(self, image: Image, work: Path) -> None:
        self.image = image
        self.work = work
        self.boots = 0
        self.overlay = image.disk
        self.retried: list[str] = []

    def branch(self, work: Path) -> Node:
        """Another node whose next boot starts from this node's disk as its last boot left it,
        its layers in work: several branches of one disk state (a crash's) boot each on its
        own, none writing to the layers below (qemu opens backing files read-only). This node
        must boot no more while a branch lives, since its layers are the branch's."""
        work.mkdir(parents=True, exist_ok=True)
        child = Node(self.image, work)
        child.overlay = self.overlay
        child.boots = self.boots
        return child

    def _layer(self, name: str) -> Path:
        layer = self.work / f"{name}.qcow2"
        layer.unlink(missing_ok=True)
        subprocess.run(
            [
                "qemu-img",
                "create",
                "-q",
                "-f",
                "qcow2",
                "-F",
                "raw" if self.overlay == self.image.disk else "qcow2",
                "-b",
                str(self.overlay),
                str(layer),
            ],
            check=True,
        )
        return layer

    def boot(self, mode: str, cmdline: str = "") -> Boot:
        self.boots += 1
        name = f"boot-{self.boots}-{mode}"
        below = self.overlay
        for attempt in (1, 2):
            self.overlay = below
            self.overlay = self._layer(name)
            log = self.work / f"{name}-{attempt}.log"
            booted = self._run(log, mode, cmdline)
            stall = emulated_stall(booted)
            if stall is not None and attempt == 1:
                # The layer is made again from the disk below, so the next attempt starts
                # from exactly the disk this one was given.
                print(f"vm: {name}: {stall}; boot again")
                self.retried.append(f"{name}: {stall}")
                continue
            # Killed, the guest leaves the disk of a power cut, which the scenario did not ask
            # for: every witness of the next boot would read it so (as one did, rightly).
            assert not booted.killed, (
                f"{name}: the guest had not powered off after {BOOT_TIMEOUT} s and was killed; "
                f"its disk is not the scenario's (serial log: {log})"
            )
            failure = emulated_kernel_failure(booted.serial)
            if failure is None:
                return booted
            # A guest kernel that died on its own (not the scenario's sysrq crash) says nothing
            # about the node under test; under TCG it has been seen once in sk_filter_trim_cap,
            # code the kernel patches at run time. Run that boot once more from the same disk.
            print(f"vm: {name}: the guest kernel failed on its own ({failure}); boot again")
            self.retried.append(f"{name}: {failure}")
        return booted

    def _run(self, serial: Path, mode: str, cmdline: str) -> Boot:
        append = (
            # The default target, as a node boots: Debian 13's wtmpdb-update-boot is
            # WantedBy=default.target, not multi-user.target.
            f"root=/dev/vda rw console=ttyS0 panic=-1 vmtest.mode={mode} {cmdline}"
        )
        start = time.monotonic()
        ran = subprocess.run(
            [
                "timeout",
                str(BOOT_TIMEOUT),
                "qemu-system-x86_64",
                "-accel",
                "tcg",
                "-cpu",
                "max",
                "-smp",
                "2",
                "-m",
                "2048",
                "-kernel",
                str(self.image.dir / "vmlinuz"),
                "-initrd",
                str(self.image.dir / "initrd.img"),
                "-append",
                append,
                "-drive",
                f"file={self.overlay},format=qcow2,if=virtio,cache=writeback",
                "-nodefaults",
                "-nic",
                "none",
                "-display",
                "none",
                "-monitor",
                "none",
                "-serial",
                f"file:{serial}",
                "-no-reboot",
            ],
            check=False,
        )
        text = serial.read_text(errors="replace")
        # timeout(1) exits 124 when it had to kill qemu.
        return Boot(text, time.monotonic() - start, _said(text), ran.returncode == 124)

    def read_disk(self, *commands: str) -> str:
        """debugfs on a copy of the disk as it is now, its journal replayed first."""
        flat = self.work / "inspect.img"
        subprocess.run(
            ["qemu-img", "convert", "-O", "raw", str(self.overlay), str(flat)], check=True
        )
        subprocess.run(["e2fsck", "-fy", str(flat)], capture_output=True, check=False)
        shown = subprocess.run(
            ["debugfs", "-R", " ; ".join(commands), str(flat)]
            if len(commands) == 1
            else ["debugfs", "-f", "-", str(flat)],
            input="\n".join(commands),
            capture_output=True,
            text=True,
            check=True,
        )
        flat.unlink()
        return shown.stdout


def emulated_kernel_failure(serial: str) -> str | None:
    """The panic line of a guest kernel that died by itself; None when it did not, or when it
    died as the scenario made it (sysrq c)."""
    for line in serial.splitlines():
        if "Kernel panic - not syncing" in line and "sysrq" not in line.lower():
            return line.split("]", 1)[-1].strip()
    return None


def emulated_stall(booted: Boot) -> str | None:
    """Why a killed guest says nothing about the node: its kernel never handed over to the
    initramfs, so no code of the image ran (under TCG one stopped at 0.985 s of its own start-up
    and sat there until killed). None for a guest that was not killed, or was killed after its
    user space began, which may be the node under test hanging and must fail."""
    if not booted.killed or "Run /init as init process" in booted.serial:
        return None
    last = booted.serial.rstrip().rsplit("\n", 1)[-1].strip()
    return f"the guest kernel stalled before user space and was killed (last said: {last!r})"


def _said(serial: str) -> list[dict[str, Any]]:
    """The driver's reports; a line that kernel output cut or interleaved is skipped (tests
    then miss what they need from it, and say so)."""
    decoder = json.JSONDecoder()
    said = []
    for line in serial.splitlines():
        if "VMTEST-JSON " in line:
            try:
                doc, _ = decoder.raw_decode(line.split("VMTEST-JSON ", 1)[1])
            except ValueError:
                continue
            if isinstance(doc, dict):
                said.append(doc)
    return said


def have_tools() -> str | None:
    for tool in ("qemu-system-x86_64", "qemu-img", "debootstrap", "debugfs", "e2fsck"):
        if shutil.which(tool) is None:
            return f"needs {tool} (Debian packages qemu-system-x86, qemu-utils, debootstrap)"
    return None
