"""The cached ADD result as libcni hands it to every plugin of a DEL: as prevResult, converted
to the network config's cniVersion (libcni's getCachedResult then GetAsVersion, v1.1.2).

The result types libcni 1.1.2 converts between (pkg/types/020, 040, 100):
- 0.1.0 and 0.2.0 (and ""): `ip4` and `ip6` objects, each with `ip`, `gateway`, `routes`;
- 0.3.0, 0.3.1 and 0.4.0: `interfaces`, `ips` (each with a `version` of "4" or "6"),
  `routes`, `dns`;
- 1.0.0 (1.1.0 from libcni 1.2 on): as 0.4.0, without `version` in `ips`.
"""

from __future__ import annotations

import ipaddress

from cni_reaper.content import json_kind
from cni_reaper.netconf import parse_version

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_OLD = ((0, 1, 0), (0, 2, 0))  # 020's versions; "" parses as 0.1.0
_CURRENT = ((0, 3, 0), (0, 3, 1), (0, 4, 0))  # 040's
_NEW = ((1, 0, 0), (1, 1, 0))  # 100's


class Unconvertible(ValueError):
    """A result libcni could not hand on at the config's version."""


def _family(version: str) -> str:
    try:
        parsed = parse_version(version)
    except ValueError as e:
        raise Unconvertible(f"cniVersion {version!r}: {e}") from None
    if parsed in _OLD:
        return "020"
    if parsed in _CURRENT:
        return "040"
    if parsed in _NEW:
        return "100"
    raise Unconvertible(f"no result type for cniVersion {version!r}")


def _ip_version(address: Any) -> str:
    if not isinstance(address, str):
        raise Unconvertible(f"ips: an address that is {json_kind(address)}")
    try:
        return str(ipaddress.ip_interface(address).version)
    except ValueError:
        raise Unconvertible(f"ips: {address!r} is not an address with a prefix") from None


def _from_020(result: dict[str, Any]) -> dict[str, Any]:
    """020 to 040's shape: each of ip4 and ip6 becomes an entry of ips, their routes one list."""
    ips: list[dict[str, Any]] = []
    routes: list[Any] = []
    for key, version in (("ip4", "4"), ("ip6", "6")):
        config = result.get(key)
        if not isinstance(config, dict):
            continue
        ip = {"version": version, "address": config.get("ip")}
        if config.get("gateway"):
            ip["gateway"] = config["gateway"]
        ips.append(ip)
        if isinstance(config.get("routes"), list):
            routes.extend(config["routes"])
    converted: dict[str, Any] = {"ips": ips}
    if routes:
        converted["routes"] = routes
    if "dns" in result:
        converted["dns"] = result["dns"]
    return converted


def _to_020(result: dict[str, Any]) -> dict[str, Any]:
    """040's shape to 020: the first address of each family; interfaces are lost, as in Go."""
    converted: dict[str, Any] = {}
    for ip in result.get("ips") or ():
        if not isinstance(ip, dict):
            raise Unconvertible("ips: an entry is not an object")
        key = "ip4" if _ip_version(ip.get("address")) == "4" else "ip6"
        if key not in converted:
            config = {"ip": ip.get("address")}
            if ip.get("gateway"):
                config["gateway"] = ip["gateway"]
            converted[key] = config
    if result.get("routes") and "ip4" in converted:
        converted["ip4"]["routes"] = result["routes"]
    if "dns" in result:
        converted["dns"] = result["dns"]
    return converted


def convert(result: dict[str, Any], to_version: str) -> dict[str, Any]:
    """The result as it reads at to_version. Raises Unconvertible."""
    from_version = result.get("cniVersion", "")
    if not isinstance(from_version, str):
        raise Unconvertible("the result's cniVersion is not a string")
    source, target = _family(from_version), _family(to_version)
    body = {k: v for k, v in result.items() if k != "cniVersion"}
    if source == "020" and target != "020":
        body, source = _from_020(body), "040"
    if source != target:
        if target == "020":
            body = _to_020(body)
        else:
            ips = body.get("ips") or []
            if not isinstance(ips, list) or not all(isinstance(ip, dict) for ip in ips):
                raise Unconvertible("ips is not a list of objects")
            if target == "100":
                body["ips"] = [{k: v for k, v in ip.items() if k != "version"} for ip in ips]
            else:
                body["ips"] = [
                    {**ip, "version": _ip_version(ip.get("address"))} if "address" in ip else ip
                    for ip in ips
                ]
    body["cniVersion"] = to_version
    return body
