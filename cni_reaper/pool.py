"""How full each host-local pool is: what an operator alerts on before a pool runs dry.

host-local allocates one address per range set of its `ranges` (a list of range sets, each a
list of ranges; the older top-level `subnet`, `rangeStart`, `rangeEnd` and `gateway` make one
set of one range). As its allocator reads a range (containernetworking/plugins,
plugins/ipam/host-local/backend/allocator/range.go and allocator.go): rangeStart defaults to
the subnet's address + 1, rangeEnd to the subnet's last address (IPv4: the one before the
broadcast), the gateway to the subnet's address + 1, and the gateway is never handed out. A
/31 or /32 (IPv6 /127, /128) is refused. "no IP addresses available in range set" is the error
when every address of one set is reserved.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple, Union

Address = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]


class AddressRange(NamedTuple):
    start: Address
    end: Address
    gateway: Address | None

    def __contains__(self, address: object) -> bool:
        return (
            isinstance(address, (ipaddress.IPv4Address, ipaddress.IPv6Address))
            and address.version == self.start.version
            and int(self.start) <= int(address) <= int(self.end)
        )

    @property
    def capacity(self) -> int:
        size = int(self.end) - int(self.start) + 1
        return size - 1 if self.gateway is not None and self.gateway in self else size

    def describe(self) -> str:
        return f"{self.start}-{self.end}"


class RangeSet(NamedTuple):
    number: int  # as host-local counts them: "range 0" in its errors, last_reserved_ip.0
    ranges: tuple[AddressRange, ...]

    @property
    def capacity(self) -> int:
        return sum(r.capacity for r in self.ranges)

    def holds(self, address: Address) -> bool:
        return any(address in r for r in self.ranges)


# An IPv4 address as Go's net.IP.String() writes it: four numbers 0-255 in plain decimal, no
# sign, space, leading zero or other digits. Exactly the names address_of() reads without
# ipaddress (below).
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_DOTTED_QUAD = re.compile(r"\.".join([_OCTET] * 4))


def is_address(name: str) -> bool:
    """Whether address_of(name) is an address, without making it: a store's every name is
    asked, a few times a run."""
    return _DOTTED_QUAD.fullmatch(name) is not None or address_of(name) is not None


def address_value(name: str) -> tuple[int, int] | None:
    """(version, the address as a number) of address_of(name), or None."""
    if _DOTTED_QUAD.fullmatch(name) is not None:
        return 4, int.from_bytes(socket.inet_aton(name), "big")
    address = address_of(name)
    return None if address is None else (address.version, int(address))


def address_of(name: str) -> Address | None:
    """The address a name spells, as ipaddress.ip_address reads it; None if it spells none.

    An IPv4 address as Go's net.IP.String() writes it, which is how host-local names nearly
    every file of its store, is read without ipaddress's per-octet Python (at 100,000
    reservations that took about a second): four numbers 0-255 that, written back, are the
    name itself (no sign, space, leading zero or other digits). Anything else goes to
    ipaddress, which decides."""
    parts = name.split(".")
    if len(parts) == 4:
        try:
            a, b, c, d = map(int, parts)
        except ValueError:
            pass
        else:
            if min(a, b, c, d) >= 0 and max(a, b, c, d) <= 255 and f"{a}.{b}.{c}.{d}" == name:
                return ipaddress.IPv4Address(a << 24 | b << 16 | c << 8 | d)
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def _address(value: Any) -> Address | None:
    return address_of(value) if isinstance(value, str) else None


def _range(spec: Mapping[str, Any]) -> AddressRange:
    """One range as host-local canonicalizes it. Raises ValueError as host-local refuses it."""
    subnet = ipaddress.ip_network(str(spec.get("subnet", "")), strict=True)
    if subnet.prefixlen > subnet.max_prefixlen - 2:
        raise ValueError(f"network {subnet} too small to allocate from")
    first = subnet.network_address + 1
    last = subnet.broadcast_address - (1 if subnet.version == 4 else 0)
    start = _address(spec.get("rangeStart")) or first
    end = _address(spec.get("rangeEnd")) or last
    gateway = _address(spec.get("gateway")) or first
    for name, address in (("rangeStart", start), ("rangeEnd", end)):
        if address.version != subnet.version or address not in subnet:
            raise ValueError(f"{name} {address} not in network {subnet}")
    return AddressRange(start, end, gateway)


def range_sets(ipam: Mapping[str, Any]) -> tuple[tuple[RangeSet, ...], str | None]:
    """The range sets of a host-local IPAM config, and why some could not be read."""
    ranges = ipam.get("ranges")
    if ranges is None and "subnet" in ipam:
        ranges = [[ipam]]
    if not isinstance(ranges, list):
        return (), "no ranges"
    found: list[RangeSet] = []
    for index, spec_set in enumerate(ranges):
        if not isinstance(spec_set, list) or not all(isinstance(s, dict) for s in spec_set):
            return tuple(found), f"range set {index} is not a list of ranges"
        try:
            found.append(RangeSet(index, tuple(_range(spec) for spec in spec_set)))
        except ValueError as e:
            return tuple(found), f"range set {index}: {e}"
    return tuple(found), None


class PoolHealth(NamedTuple):
    """One range set of one network, before and after the run."""

    network: str
    range_set: RangeSet
    reserved_before: int
    released: int
    left: Mapping[str, int]  # owners' state -> addresses still reserved

    @property
    def capacity(self) -> int:
        return self.range_set.capacity

    @property
    def left_total(self) -> int:
        return sum(self.left.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "network": self.network,
            "range_set": self.range_set.number,
            "ranges": [r.describe() for r in self.range_set.ranges],
            "capacity": self.capacity,
            "reserved_before": self.reserved_before,
            "released": self.released,
            "left": self.left_total,
            "left_by_owner": dict(sorted(self.left.items())),
            "free": max(self.capacity - self.left_total, 0),
        }


def health(
    network: str,
    sets: Iterable[RangeSet],
    before: Iterable[str],
    after: Mapping[str, str],  # address -> its owner's state
) -> list[PoolHealth]:
    """Each range set's counts; addresses in no set are counted under set -1."""
    sets = list(sets)
    before_by_set: dict[int, int] = {}
    after_by_set: dict[int, dict[str, int]] = {}
    released_by_set: dict[int, int] = {}

    # Each set's ranges as numbers: a store's every address is placed, before and after.
    bounds = [
        (s.number, [(r.start.version, int(r.start), int(r.end)) for r in s.ranges]) for s in sets
    ]

    def set_of(name: str) -> int:
        """The first set holding the address name spells (RangeSet.holds), -1 if none."""
        value = address_value(name)
        if value is not None:
            version, number = value
            for index, ranges in bounds:
                for range_version, start, end in ranges:
                    if range_version == version and start <= number <= end:
                        return index
        return -1

    for name in before:
        index = set_of(name)
        before_by_set[index] = before_by_set.get(index, 0) + 1
        if name not in after:
            released_by_set[index] = released_by_set.get(index, 0) + 1
    for name, state in after.items():
        counts = after_by_set.setdefault(set_of(name), {})
        counts[state] = counts.get(state, 0) + 1
    pools = [
        PoolHealth(
            network,
            s,
            before_by_set.get(s.number, 0),
            released_by_set.get(s.number, 0),
            after_by_set.get(s.number, {}),
        )
        for s in sets
    ]
    if -1 in before_by_set or -1 in after_by_set:
        pools.append(
            PoolHealth(
                network,
                RangeSet(-1, ()),
                before_by_set.get(-1, 0),
                released_by_set.get(-1, 0),
                after_by_set.get(-1, {}),
            )
        )
    return pools
