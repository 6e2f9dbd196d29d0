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

BOOT_TIMEOUT = 240  # seconds per boot; a hung guest fails the test instead of CI


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

    def one(self, kind: str) -> dict[str, Any]:
        found = [s for s in self.said if s["kind"] == kind]
        assert len(found) == 1, f"guest said {kind!r} {len(found)} times:\n{self.serial[-4000:]}"
        return found[0]


class Node:
    """One scenario's machine: a copy-on-write layer over the image, booted again and again."""

    def __init__(self, image: Image, work: Path) -> None:
        self.image = image
        self.work = work
        self.overlay = work / "node.qcow2"
        subprocess.run(
            [
                "qemu-img",
                "create",
                "-q",
                "-f",
                "qcow2",
                "-F",
                "raw",
                "-b",
                str(image.disk),
                str(self.overlay),
            ],
            check=True,
        )
        self.boots = 0

    def boot(self, mode: str, cmdline: str = "") -> Boot:
        self.boots += 1
        serial = self.work / f"boot-{self.boots}-{mode}.log"
        append = (
            # The default target, as a node boots: Debian 13's wtmpdb-update-boot is
            # WantedBy=default.target, not multi-user.target.
            f"root=/dev/vda rw console=ttyS0 panic=-1 vmtest.mode={mode} {cmdline}"
        )
        start = time.monotonic()
        subprocess.run(
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
        return Boot(text, time.monotonic() - start, _said(text))

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
