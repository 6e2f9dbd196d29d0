"""What libcni's AddNetworkList does, for setting up real attachments in tests.

Plugins in order, each given the previous result, then the final result cached in the
results dir in the cniCacheV1 format (shared/reference/libcni-cache.md sections 2 to 4).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from cni_reaper import confine
from cni_reaper.plugin import ProcessRunner, error_from_run, find_plugin
from tests.nodetree import PLUGIN_DIR, cache_entry_bytes


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
) -> dict[str, Any]:
    """ADD on the node whose root is root: with a root other than /, the plugins run in a mount
    namespace where they see its CNI state, as the reaper's DELs do (cni_reaper/confine.py)."""
    (root / "var/lib/cni").mkdir(parents=True, exist_ok=True)
    if not confine.needs_confinement(str(root)):
        return _add(conflist, container_id, ifname, netns, root, bin_dirs, capability_args)
    return confine.run_confined(
        str(root),
        confine.standard_binds(str(root)),
        lambda: _add(conflist, container_id, ifname, netns, root, bin_dirs, capability_args),
    )


def _add(
    conflist: bytes,
    container_id: str,
    ifname: str,
    netns: str,
    root: Path,
    bin_dirs: tuple[str, ...],
    capability_args: dict[str, Any] | None,
) -> dict[str, Any]:
    cache_dir = root / "var/lib/cni"
    doc = json.loads(conflist)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CNI_")}
    env.update(
        CNI_COMMAND="ADD",
        CNI_CONTAINERID=container_id,
        CNI_NETNS=netns,
        CNI_IFNAME=ifname,
        CNI_ARGS=f"IgnoreUnknown=1;K8S_POD_INFRA_CONTAINER_ID={container_id}",
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
    path.write_bytes(cache_entry_bytes(conflist, doc["name"], container_id, ifname, result, netns))
    path.chmod(0o600)
    return result


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
