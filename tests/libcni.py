"""What libcni's AddNetworkList does, for setting up real attachments in tests.

Plugins in order, each given the previous result, then the final result cached in the
results dir in the cniCacheV1 format (shared/reference/libcni-cache.md sections 2 to 4), byte
for byte as libcni 1.1.2 writes it (tests/test_libcni_imitation.py holds it to the real one).
"""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cni_reaper.plugin import ProcessRunner, error_from_run, find_plugin
from cni_reaper.repair import confine
from tests.nodetree import PLUGIN_DIR


class AddFailed(RuntimeError):
    pass


def add_network_list(
    conflist: bytes,
    container_id: str,
    ifname: str,
    netns: str,
    root: Path,
    bin_dirs: tuple[str, ...] = (PLUGIN_DIR,),
    capability_args: dict[str, Any] | None = None,
    *,
    cache_netns: bool = False,
) -> dict[str, Any]:
    """ADD on the node whose root is root: with a root other than /, the plugins run in a mount
    namespace where they see its CNI state, as the reaper's DELs do (cni_reaper/repair/confine.py).
    cache_netns: cache the netns too, as libcni 1.2 and later do."""
    cache_dir = root / "var/lib/cni"
    cache_dir.mkdir(parents=True, exist_ok=True)
    cni_args = (("IgnoreUnknown", "1"), ("K8S_POD_INFRA_CONTAINER_ID", container_id))

    def add() -> dict[str, Any]:
        return add_to_cache(
            conflist,
            container_id,
            ifname,
            netns,
            cache_dir,
            bin_dirs,
            cni_args,
            capability_args,
            cache_netns=cache_netns,
        )

    if not confine.needs_confinement(str(root)):
        return add()
    return confine.run_confined(str(root), confine.standard_binds(str(root)), add)


def add_to_cache(
    conflist: bytes,
    container_id: str,
    ifname: str,
    netns: str,
    cache_dir: Path,
    bin_dirs: Sequence[str],
    cni_args: Sequence[tuple[str, str]],
    capability_args: dict[str, Any] | None,
    *,
    cache_netns: bool = False,
) -> dict[str, Any]:
    """The plugins' ADD as this process sees the machine, the result cached under cache_dir."""
    doc = json.loads(conflist)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
    env.update(
        CNI_COMMAND="ADD",
        CNI_CONTAINERID=container_id,
        CNI_NETNS=netns,
        CNI_IFNAME=ifname,
        CNI_ARGS=";".join(f"{k}={v}" for k, v in cni_args),
        CNI_PATH=":".join(bin_dirs),
    )
    result: dict[str, Any] | None = None
    for plugin in doc["plugins"]:
        conf = dict(plugin, name=doc["name"], cniVersion=doc["cniVersion"])
        if result is not None:
            conf["prevResult"] = result
        caps = plugin.get("capabilities") or {}
        runtime = {c: v for c, v in (capability_args or {}).items() if caps.get(c)}
        if runtime:
            conf["runtimeConfig"] = runtime
        stdin = json.dumps(conf, sort_keys=True, separators=(",", ":")).encode()
        run = ProcessRunner().run(find_plugin(plugin["type"], bin_dirs), env, stdin, 30.0)
        error = error_from_run(plugin["type"], run, 30.0)
        if error is not None:
            raise AddFailed(str(error))
        result = json.loads(run.stdout)
    assert result is not None
    results = cache_dir / "results"
    results.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = results / f"{doc['name']}-{container_id}-{ifname}"
    path.write_bytes(
        cached_bytes(
            conflist,
            doc["name"],
            container_id,
            ifname,
            result,
            cni_args,
            capability_args,
            netns if cache_netns else None,
        )
    )
    path.chmod(0o600)
    return result


def cached_bytes(
    conflist: bytes,
    network: str,
    container_id: str,
    ifname: str,
    result: dict[str, Any] | None,
    cni_args: Sequence[tuple[str, str]] = (),
    capability_args: dict[str, Any] | None = None,
    netns: str | None = None,
) -> bytes:
    """A results file as libcni 1.1.2's cacheAdd writes it: encoding/json of its cachedInfo,
    fields in struct order, empty ones omitted; the config as std base64; the result and the
    capability args went through a map, so their keys are sorted at every level. netns: as
    libcni 1.2 on caches it, after networkName."""
    doc: dict[str, Any] = {
        "kind": "cniCacheV1",
        "containerId": container_id,
        "config": base64.b64encode(conflist).decode(),
        "ifName": ifname,
        "networkName": network,
    }
    if netns:
        doc["netns"] = netns
    if cni_args:
        doc["cniArgs"] = [[k, v] for k, v in cni_args]
    if capability_args:
        doc["capabilityArgs"] = _sorted_keys(capability_args)
    if result:
        doc["result"] = _sorted_keys(result)
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False)
    for char, escaped in _GO_ESCAPES:  # encoding/json's HTML-safe escapes, in strings only
        text = text.replace(char, escaped)
    return text.encode()


_GO_ESCAPES = (
    ("<", "\\u003c"),
    (">", "\\u003e"),
    ("&", "\\u0026"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)


def _sorted_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted_keys(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted_keys(v) for v in value]
    return value


def reserved_ips(data_dir: Path, network: str) -> dict[str, str]:
    """host-local's store: IP -> '<container id>\\r\\n<ifname>'."""
    store = data_dir / network
    if not store.is_dir():
        return {}
    return {
        p.name: p.read_bytes().decode()
        for p in store.iterdir()
        if p.name != "lock" and not p.name.startswith("last_reserved_ip")
    }
