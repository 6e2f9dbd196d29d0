"""CNI network configuration: the conf dirs as libcni and go-cni load them.

A `.conflist` is a list as written; a `.conf` or `.json` single plugin becomes a one-plugin list
carrying its name and cniVersion, as libcni's ConfListFromConf does.
"""

from __future__ import annotations

import functools
import json
import os
import stat
from collections.abc import Iterable
from typing import Any, NamedTuple

CONF_EXTENSIONS = (".conflist", ".conf", ".json")
MAX_CONF_BYTES = 1 << 20
MAX_PLUGINS = 64

# containerd's go-cni adds this network itself; it is in no conf dir.
BUILTIN_LOOPBACK = "cni-loopback"
BUILTIN_LOOPBACK_VERSION = "0.3.1"


class ConfigError(ValueError):
    """A config that libcni would refuse."""


class NetworkList(NamedTuple):
    name: str
    cni_version: str
    plugins: tuple[dict[str, Any], ...]
    source: str  # the file it came from

    @property
    def plugin_types(self) -> tuple[str, ...]:
        return tuple(str(p.get("type", "")) for p in self.plugins)

    @property
    def reads_cached_result(self) -> bool:
        """libcni reads the results cache on DEL only from cniVersion 0.4.0 on."""
        return version_at_least(self.cni_version, (0, 4, 0))


class NetworkConfigs(NamedTuple):
    networks: dict[str, NetworkList]  # by name; the first file in load order wins
    problems: tuple[str, ...]  # files that were skipped, and why

    def get(self, name: str) -> NetworkList | None:
        return self.networks.get(name)


@functools.lru_cache(maxsize=64)  # asked per damaged file, of the few versions there are
def version_at_least(version: str, floor: tuple[int, int, int]) -> bool:
    if not version:
        return False  # libcni reads "" as 0.1.0
    try:
        parts = tuple(int(p) for p in version.split("."))
    except ValueError:
        return False
    return parts >= floor


def parse_conf_bytes(data: bytes, source: str, single_plugin: bool) -> NetworkList:
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise ConfigError(f"not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise ConfigError("not a JSON object")
    name = doc.get("name")
    if not isinstance(name, str) or not name:
        raise ConfigError("no network 'name'")
    version = doc.get("cniVersion", "")
    if not isinstance(version, str):
        raise ConfigError("'cniVersion' is not a string")
    if single_plugin:
        plugins: Any = [doc]
    else:
        plugins = doc.get("plugins")
        if not isinstance(plugins, list) or not plugins:
            raise ConfigError("no 'plugins' list")
        if len(plugins) > MAX_PLUGINS:
            # Real chains have a handful; a DEL through thousands, each with its own timeout,
            # would hold the runtime back for hours.
            raise ConfigError(f"{len(plugins)} plugins, more than {MAX_PLUGINS}")
    for plugin in plugins:
        if not isinstance(plugin, dict):
            raise ConfigError("a plugin entry is not an object")
        kind = plugin.get("type")
        if not isinstance(kind, str) or not kind:
            raise ConfigError("a plugin has no 'type'")
    return NetworkList(name=name, cni_version=version, plugins=tuple(plugins), source=source)


def _read_regular(path: str) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError("not a regular file")
        if st.st_size > MAX_CONF_BYTES:
            raise ConfigError(f"larger than {MAX_CONF_BYTES} bytes")
        return f.read(MAX_CONF_BYTES + 1)


def load_conf_dirs(conf_dirs: Iterable[str]) -> NetworkConfigs:
    """Every network in the conf dirs, files in name order per dir, dirs in the order given."""
    networks: dict[str, NetworkList] = {}
    problems: list[str] = []
    for conf_dir in conf_dirs:
        try:
            names = sorted(os.listdir(conf_dir))
        except FileNotFoundError:
            continue
        except OSError as e:
            problems.append(f"{conf_dir}: {e.strerror}")
            continue
        for file_name in names:
            if not file_name.endswith(CONF_EXTENSIONS):
                continue
            path = os.path.join(conf_dir, file_name)
            try:
                if stat.S_ISLNK(os.lstat(path).st_mode):
                    raise ConfigError("a symlink; not followed")
                data = _read_regular(path)
                netlist = parse_conf_bytes(
                    data, path, single_plugin=not file_name.endswith(".conflist")
                )
            except (ConfigError, OSError) as e:
                reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
                problems.append(f"{path}: {reason}")
                continue
            networks.setdefault(netlist.name, netlist)
    return NetworkConfigs(networks=networks, problems=tuple(problems))


def builtin_loopback() -> NetworkList:
    return NetworkList(
        name=BUILTIN_LOOPBACK,
        cni_version=BUILTIN_LOOPBACK_VERSION,
        plugins=({"type": "loopback"},),
        source="containerd built-in",
    )
