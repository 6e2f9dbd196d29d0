"""A pod sandbox ("pause") image built locally, since the test machines reach no registry.

The image is an OCI image layout in a tar, as `ctr images import` takes it: one uncompressed layer
holding Debian's statically linked busybox, and an entrypoint that sleeps. containerd's CRI plugin
stops a sandbox with SIGKILL, so the sleeper needs no signal handling of its own.
"""

from __future__ import annotations

import hashlib
import io
import json
import platform
import tarfile
from pathlib import Path
from typing import Any

BUSYBOX = Path("/bin/busybox")
IMAGE_NAME = "localhost/cni-reaper/pause:test"
# The sandbox's process, as /proc/<pid>/cmdline shows it once runc has exec'd it.
ENTRYPOINT = ("/bin/busybox", "sleep", "2147483647")

_ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64", "ppc64le": "ppc64le", "s390x": "s390x"}


def _blob(layout: tarfile.TarFile, data: bytes, media_type: str) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    _add(layout, "blobs/sha256/" + digest.split(":", 1)[1], data)
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def _add(archive: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    archive.addfile(info, io.BytesIO(data))


def _rootfs_layer(busybox: bytes) -> bytes:
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        directory = tarfile.TarInfo("bin")
        directory.type = tarfile.DIRTYPE
        directory.mode = 0o755
        archive.addfile(directory)
        _add(archive, "bin/busybox", busybox, mode=0o755)
    return layer.getvalue()


def _dumps(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def build(out: Path, busybox: Path = BUSYBOX) -> str:
    """Write the image to out as an OCI layout tar; return the name it imports as."""
    layer = _rootfs_layer(busybox.read_bytes())
    architecture = _ARCHITECTURES.get(platform.machine(), platform.machine())
    with tarfile.open(out, mode="w", format=tarfile.PAX_FORMAT) as layout:
        _add(layout, "oci-layout", _dumps({"imageLayoutVersion": "1.0.0"}))
        layer_desc = _blob(layout, layer, "application/vnd.oci.image.layer.v1.tar")
        config = {
            "architecture": architecture,
            "os": "linux",
            "config": {"Entrypoint": list(ENTRYPOINT)},
            "rootfs": {"type": "layers", "diff_ids": [layer_desc["digest"]]},
        }
        config_desc = _blob(layout, _dumps(config), "application/vnd.oci.image.config.v1+json")
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config_desc,
            "layers": [layer_desc],
        }
        manifest_desc = _blob(
            layout, _dumps(manifest), "application/vnd.oci.image.manifest.v1+json"
        )
        manifest_desc["platform"] = {"architecture": architecture, "os": "linux"}
        manifest_desc["annotations"] = {
            "io.containerd.image.name": IMAGE_NAME,
            "org.opencontainers.image.ref.name": IMAGE_NAME.rsplit(":", 1)[1],
        }
        index = {"schemaVersion": 2, "manifests": [manifest_desc]}
        _add(layout, "index.json", _dumps(index))
    return IMAGE_NAME
