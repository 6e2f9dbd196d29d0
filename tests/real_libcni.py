"""The real libcni for the tests: tests/libcni_client, a runtime-like CLI over libcni's CNIConfig,
built offline against the libcni source a distribution ships, and run from Python.

Debian's golang-github-appc-cni-dev is libcni 1.1.2, the version with the seed bug (DEL aborts on
an unreadable cache file), installed as source under /usr/share/gocode; Debian's golang-go builds
the client on it in GOPATH mode: no module, no proxy, no download. Built once per source, Go and
libcni version, and kept under .test-cache/ (tests/conftest.py, fixture `libcni_client`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
CLIENT_SOURCE = Path(__file__).resolve().parent / "libcni_client" / "main.go"
SYSTEM_GOPATH = Path("/usr/share/gocode")
LIBCNI_SOURCE = SYSTEM_GOPATH / "src/github.com/containernetworking/cni"
BUILD_CACHE = REPO / ".test-cache" / "libcni-client"
BINARY_NAME = "libcni_client"

# libcni 1.1.2's DelNetworkList on a results file that does not decode (libcni/api.go
# DelNetworkList, pkg/types/create/create.go DecodeVersion), as containerd passes it on.
SEED_ERROR_PREFIX = 'failed to get network "{network}" cached result: '
SEED_ERROR_DECODING = "decoding version from network config: "
SEED_ERROR = SEED_ERROR_PREFIX + SEED_ERROR_DECODING + "unexpected end of JSON input"


def seed_error(network: str, damage: str) -> str:
    """The exact error libcni 1.1.2's DEL returns for a results file damaged this way: what
    encoding/json says of an empty or cut document, and of one that starts with a NUL byte."""
    if damage in ("empty", "truncated"):
        tail = "unexpected end of JSON input"
    elif damage == "zeroed":
        tail = "invalid character '\\x00' looking for beginning of value"
    else:
        raise ValueError(f"no seed error for damage {damage!r}")
    return SEED_ERROR_PREFIX.format(network=network) + SEED_ERROR_DECODING + tail


def why_not_buildable() -> str | None:
    """Why the client cannot be built here, or None."""
    if shutil.which("go") is None:
        return "needs Debian's golang-go (the go command) to build tests/libcni_client"
    if not (LIBCNI_SOURCE / "libcni" / "api.go").is_file():
        return f"needs Debian's golang-github-appc-cni-dev (libcni's source in {LIBCNI_SOURCE})"
    return None


def _go_version(go: str) -> str:
    proc = subprocess.run([go, "version"], capture_output=True, text=True, check=True)
    return proc.stdout.strip()


def build_key(go_version: str) -> str:
    """What the binary is made of: the client's source, the Go toolchain, libcni's source."""
    digest = hashlib.sha256()
    digest.update(CLIENT_SOURCE.read_bytes())
    digest.update(b"\0" + go_version.encode() + b"\0")
    for path in sorted(LIBCNI_SOURCE.rglob("*.go")):
        if not path.name.endswith("_test.go"):
            digest.update(str(path.relative_to(LIBCNI_SOURCE)).encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()[:24]


def offline_build_env(gopath: Path, gocache: Path) -> dict[str, str]:
    """The environment of an offline GOPATH-mode build: nothing of the caller's Go settings."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("GO") and k not in ("CGO_ENABLED", "GOFLAGS")
    }
    env.update(
        GO111MODULE="off",
        GOPATH=f"{gopath}{os.pathsep}{SYSTEM_GOPATH}",
        GOCACHE=str(gocache),
        GOPROXY="off",
        GOTOOLCHAIN="local",
        CGO_ENABLED="0",
    )
    return env


def _can_unshare_net() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode == 0


@dataclass(frozen=True)
class Built:
    path: Path
    seconds: float  # the build's wall time, from the run that built it
    go_version: str
    offline: str  # how the build was kept from the network


class BuildFailed(RuntimeError):
    pass


def build_client(cache: Path = BUILD_CACHE) -> Built:
    """The client binary, built unless this source, Go and libcni were built before into cache.

    As root, the build runs in a network namespace of its own, with no interface but lo: it
    cannot download anything even if it tried. Otherwise GOPROXY=off and GOPATH mode keep it off
    the network. BuildFailed with go's output if it does not build.
    """
    go = shutil.which("go")
    if go is None:
        raise BuildFailed("no go command")
    go_version = _go_version(go)
    target = cache / build_key(go_version)
    binary = target / BINARY_NAME
    record = target / "build.json"
    if binary.is_file() and record.is_file():
        known = json.loads(record.read_text())
        return Built(binary, float(known["seconds"]), go_version, str(known["offline"]))
    offline = "unshare --net" if _can_unshare_net() else "GOPROXY=off"
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="libcni-client-build-") as tmp:
        work = Path(tmp)
        out = work / BINARY_NAME
        argv = [
            go,
            "build",
            "-trimpath",
            "-buildvcs=false",
            "-o",
            str(out),
            str(CLIENT_SOURCE),
        ]
        if offline == "unshare --net":
            argv = ["unshare", "--net", *argv]
        started = time.monotonic()
        proc = subprocess.run(
            argv,
            cwd=CLIENT_SOURCE.parent,
            env=offline_build_env(work / "gopath", work / "gocache"),
            capture_output=True,
            text=True,
        )
        seconds = time.monotonic() - started
        if proc.returncode != 0:
            raise BuildFailed(f"{' '.join(argv)} failed:\n{proc.stdout}{proc.stderr}")
        # The temp dir may be on another file system: copied next to the binary, then renamed.
        partial = target / f".{BINARY_NAME}.partial"
        shutil.copy2(out, partial)
        os.replace(partial, binary)
    record.write_text(
        json.dumps({"seconds": seconds, "go": go_version, "offline": offline}, indent=2) + "\n"
    )
    return Built(binary, seconds, go_version, offline)


@dataclass(frozen=True)
class ClientRun:
    """One run of the client: libcni's verdict and what it printed."""

    command: str
    exit: int
    ok: bool
    error: str | None  # libcni's error string, as a runtime would log it
    result: dict[str, Any] | None  # the result of an add, or what `cached` read back
    output: dict[str, Any]  # the whole JSON line
    stderr: str
    seconds: float

    def to_json(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "exit": self.exit,
            "ok": self.ok,
            "error": self.error,
            "result": self.result,
            "output": self.output,
            "stderr": self.stderr,
            "seconds": self.seconds,
        }


@dataclass(frozen=True)
class LibcniClient:
    """tests/libcni_client at path, run as a runtime runs libcni: one call per operation."""

    path: Path

    def run(
        self,
        command: str,
        container_id: str,
        ifname: str,
        *,
        conf_dir: Path | None = None,
        network: str | None = None,
        conflist: Path | None = None,
        bin_dirs: Sequence[str] = ("/usr/lib/cni",),
        cache_dir: Path | None = None,
        netns: str = "",
        cni_args: Sequence[tuple[str, str]] = (),
        capability_args: Mapping[str, Any] | None = None,
        timeout: float = 60.0,
    ) -> ClientRun:
        """command is add, check, del, cached or parse. The conflist is loaded from conf_dir by
        network name (libcni.LoadConfList), or read from the file conflist."""
        argv = [str(self.path)]
        if conflist is not None:
            argv += ["--conflist", str(conflist)]
        if conf_dir is not None:
            argv += ["--conf-dir", str(conf_dir)]
        if network is not None:
            argv += ["--network", network]
        for directory in bin_dirs:
            argv += ["--bin-dir", directory]
        if cache_dir is not None:
            argv += ["--cache-dir", str(cache_dir)]
        argv += ["--netns", netns, "--timeout", f"{timeout}s"]
        if cni_args:
            argv += ["--args", ";".join(f"{k}={v}" for k, v in cni_args)]
        if capability_args is not None:
            argv += ["--capability-args", json.dumps(dict(capability_args))]
        argv += [command, container_id, ifname]
        started = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout + 30)
        seconds = time.monotonic() - started
        lines = proc.stdout.splitlines()
        if proc.returncode not in (0, 1) or len(lines) != 1:
            raise RuntimeError(
                f"libcni_client {command} exited {proc.returncode} printing {proc.stdout!r}; "
                f"stderr: {proc.stderr}"
            )
        output: dict[str, Any] = json.loads(lines[0])
        result = output.get("result")
        return ClientRun(
            command=command,
            exit=proc.returncode,
            ok=bool(output["ok"]),
            error=output.get("error"),
            result=result if isinstance(result, dict) else None,
            output=output,
            stderr=proc.stderr,
            seconds=seconds,
        )
