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

import bisect
import ipaddress

# socket.py turns its constants into enums when imported, some 2 ms of every run's start-up;
# inet_aton is _socket's own.
from _socket import inet_aton
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence

from cni_reaper.netconf import go_field, go_pairs
from cni_reaper.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Union

    Address = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
    Span = tuple[int, int, int]  # (IP version, first, last), as address_value() numbers them


class AddressRange(Record):
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


class RangeSet(Record):
    number: int  # as host-local counts them: "range 0" in its errors, last_reserved_ip.0
    ranges: tuple[AddressRange, ...]

    @property
    def capacity(self) -> int:
        return sum(r.capacity for r in self.ranges)

    def holds(self, address: Address) -> bool:
        return any(address in r for r in self.ranges)


# An IPv4 address as Go's net.IP.String() writes it: four numbers 0-255 in plain decimal, no
# sign, space, leading zero or other digits. Exactly the names address_of() reads without
# ipaddress (below). A set of the 256 spellings, not a regular expression: as fast to match,
# and the expression's compilation was 0.3 ms of every run's start.
_OCTETS = frozenset([str(n) for n in range(256)])


def is_dotted_quad(name: str) -> bool:
    parts = name.split(".", 4)
    return len(parts) == 4 and _OCTETS.issuperset(parts)


def is_address(name: str) -> bool:
    """Whether address_of(name) is an address, without making it: a store's every name is
    asked, a few times a run."""
    return is_dotted_quad(name) or address_of(name) is not None


def address_value(name: str) -> tuple[int, int] | None:
    """(version, the address as a number) of address_of(name), or None."""
    number = dotted_quad_number(name)
    if number is not None:
        return 4, number
    address = address_of(name)
    return None if address is None else (address.version, int(address))


def dotted_quad_number(name: str) -> int | None:
    """The number of a dotted quad (is_dotted_quad), None for any other name."""
    if not is_dotted_quad(name):
        return None
    return int.from_bytes(inet_aton(name), "big")


def listed(
    names: Iterable[str], others: list[str] | None = None
) -> Iterator[tuple[str, int | None]]:
    """Each of names that is_address() takes, with its dotted_quad_number(): a store's listing
    as the pools read it, each name matched once. The rest go to others, when given."""
    for name in names:
        number = dotted_quad_number(name)
        if number is not None or address_of(name) is not None:
            yield name, number
        elif others is not None:
            others.append(name)


class ListedAddresses:
    """The addresses a store held when listed (listed()), as AddressStates keeps them: each
    dotted quad as its number in one array, any other name (IPv6, nearly never) as itself:
    some 800 KB at 100,000 reservations, and no name to match again when the pools count."""

    def __init__(self, names: Iterable[tuple[str, int | None]] = ()) -> None:
        self.numbers = array("Q")
        self.others: list[str] = []
        for name, number in names:
            self.add(name, number)

    def add(self, name: str, number: int | None) -> None:
        """name, as listed() gives it with its number."""
        if number is None:
            self.others.append(name)
        else:
            self.numbers.append(number)

    def items(self) -> Iterator[tuple[str, int | None]]:
        """Each address as listed() gave it, a dotted quad's name left out ("": its number
        stands for it, as in AddressStates)."""
        for number in self.numbers:
            yield "", number
        for name in self.others:
            yield name, None

    def __len__(self) -> int:
        return len(self.numbers) + len(self.others)

    def sorted_numbers(self) -> array[int]:
        """The dotted quads' numbers, sorted (and kept so: the order they were listed in
        means nothing)."""
        self.numbers = array("Q", sorted(self.numbers))
        return self.numbers

    def by_version(self) -> dict[int, Sequence[int]]:
        """The addresses as each IP version's sorted numbers (address_value())."""
        more: dict[int, list[int]] = {}
        for name in self.others:
            value = address_value(name)
            if value is not None:
                more.setdefault(value[0], []).append(value[1])
        quads = self.sorted_numbers()
        values: dict[int, Sequence[int]] = {
            4: sorted([*quads, *more.pop(4)]) if 4 in more else quads
        }
        for version, found in more.items():
            values[version] = sorted(found)
        return values


# Greater than any item of AddressStates' array (a dotted quad's number, 32 bits, and a code
# byte): the end of a walk through it.
_PAST_EVERY_ITEM = 1 << 64


class AddressStates:
    """Each address of a store -> its owner's state, and whether it is planned away: a few
    bytes an address (at 100,000 reservations a dict keyed by their names took some 10 MB).
    A name address_value() reads as a dotted quad is kept as its number in one sorted array,
    its state's code in the low byte; any other name (IPv6, nearly never) in a dict. A dotted
    quad has one spelling (is_dotted_quad), so its number stands for its name."""

    _AWAY = 0x80
    _STATE = _AWAY - 1  # the bits of a code that name the state

    def __init__(self) -> None:
        self._v4 = array("Q")
        self._sorted = True
        self._others: dict[str, int] = {}
        self._states: list[str] = []
        self._codes: dict[str, int] = {}

    def add(self, name: str, state: str, away: bool = False) -> None:
        """A name not added before, with its owner's state."""
        self.add_listed(name, dotted_quad_number(name), state, away)

    def add_listed(self, name: str, number: int | None, state: str, away: bool) -> None:
        """add(), for a name whose dotted_quad_number() is number (as listed() gives it)."""
        code = self._state_code(state)
        self._put(name, number, code | self._AWAY if away else code)

    def _state_code(self, state: str) -> int:
        code = self._codes.get(state)
        if code is None:
            code = self._codes[state] = len(self._states)
            self._states.append(state)
            if code >= self._AWAY:
                raise ValueError(f"more than {self._AWAY} owner states")
        return code

    def _put(self, name: str, number: int | None, code: int) -> None:
        """name, whose dotted_quad_number() is number, with its code."""
        if number is not None:
            v4 = self._v4
            item = number << 8 | code
            if v4 and item < v4[-1]:
                self._sorted = False
            v4.append(item)
        else:
            self._others[name] = code

    def _code(self, name: str, number: int | None) -> int | None:
        """name's code, given its dotted_quad_number(); None if it was never added."""
        if number is None:
            return self._others.get(name)
        return self._number_code(number)

    def _sorted_v4(self) -> array[int]:
        if not self._sorted:
            self._v4 = array("Q", sorted(self._v4))
            self._sorted = True
        return self._v4

    def _number_code(self, number: int) -> int | None:
        """The code of the dotted quad of this number; None if it was never added."""
        v4 = self._sorted_v4()
        index = bisect.bisect_left(v4, number << 8)
        if index < len(v4) and v4[index] >> 8 == number:
            return int(v4[index] & 0xFF)
        return None

    def find(self, name: str) -> tuple[str, bool] | None:
        """(its owner's state, whether it is planned away), None if it was never added."""
        code = self._code(name, dotted_quad_number(name))
        if code is None:
            return None
        return self._states[code & ~self._AWAY], bool(code & self._AWAY)

    def __contains__(self, name: str) -> bool:
        return self.has(name, dotted_quad_number(name))

    def has(self, name: str, number: int | None) -> bool:
        """Whether name, whose dotted_quad_number() is number, was added."""
        return self._code(name, number) is not None

    def held_now(
        self, names: Iterable[tuple[str, int | None]], away_released: bool
    ) -> AddressStates:
        """The table of a store's names as listed now (listed(): each with its number): each
        with its owner's state here ("unknown" if it was never added), none planned away; one
        planned away is left out if away_released (a dry run counts what it plans as
        released). The same as adding each name found, with each name read once, not three
        times: a store is listed whole."""
        now = AddressStates()
        now._states, now._codes = list(self._states), dict(self._codes)
        unknown = now._state_code("unknown")
        listed_v4 = array("Q")
        for name, number in names:
            if number is not None:
                listed_v4.append(number)
                continue
            code = self._others.get(name)
            if code is None:
                code = unknown
            elif code & self._AWAY:
                if away_released:
                    continue
                code &= self._STATE
            now._others[name] = code
        # Both sides sorted, walked side by side: each listed quad's code found with no table
        # of every number (a dict of 100,000 was the peak of a real run's memory, some 6 MB),
        # and the new table comes out sorted, as the pools' count wants it.
        known, out = iter(self._sorted_v4()), now._v4
        item = next(known, _PAST_EVERY_ITEM)
        for number in sorted(listed_v4):
            least = number << 8
            while item < least:
                item = next(known, _PAST_EVERY_ITEM)
            if item >> 8 == number:
                code = item & 0xFF
                if code & self._AWAY:
                    if away_released:
                        continue
                    code &= self._STATE
            else:
                code = unknown
            out.append(least | code)
        return now

    def __len__(self) -> int:
        return len(self._v4) + len(self._others)

    def numbers_not_in(self, numbers: Sequence[int]) -> array[int]:
        """Those of numbers (sorted) that are no dotted quad added here: both walked side by
        side in order, where a set of every number added cost some 7 MB at 100,000."""
        added = iter(self._sorted_v4())
        missing = array("Q")
        item = next(added, _PAST_EVERY_ITEM)
        for number in numbers:
            least = number << 8
            while item < least:
                item = next(added, _PAST_EVERY_ITEM)
            if item >> 8 != number:
                missing.append(number)
        return missing

    def states_in(self, spans: Iterable[Span]) -> tuple[list[dict[str, int]], dict[str, int]]:
        """How many addresses each owner state holds in each of spans (disjoint), and in none
        of them (a name that spells no address among these): an address's state read from the
        items of a sorted array by slices between bisections, not one address at a time."""
        by_version: dict[int, Sequence[int]] = {4: self._sorted_v4()}
        outside: list[int] = []
        more: dict[int, list[int]] = {}
        for name, code in self._others.items():
            value = address_value(name)
            if value is None:
                outside.append(code)
            else:
                more.setdefault(value[0], []).append(value[1] << 8 | code)
        for version, added in more.items():
            by_version[version] = sorted([*by_version.get(version, ()), *added])
        inside: list[dict[str, int]] = []
        cuts: dict[int, list[tuple[int, int]]] = {version: [] for version in by_version}
        for version, first, last in spans:
            items = by_version.get(version, ())
            lo = bisect.bisect_left(items, first << 8)
            hi = bisect.bisect_left(items, (last + 1) << 8)
            inside.append(self._tally(items[lo:hi]))
            cuts.setdefault(version, []).append((lo, hi))
        for version, items in by_version.items():
            # What lies between the spans' slices: the addresses no span holds.
            start = 0
            for lo, hi in sorted(cuts[version]):
                outside.extend(items[start:lo])
                start = hi
            outside.extend(items[start:])
        return inside, self._tally(outside)

    def _tally(self, items: Iterable[int]) -> dict[str, int]:
        counts = Counter(map(self._STATE.__and__, items))
        return {self._states[code]: n for code, n in counts.items()}

    @classmethod
    def of(cls, states: Mapping[str, str]) -> AddressStates:
        made = cls()
        for name, state in states.items():
            made.add(name, state)
        return made


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


def _range(spec: Mapping[str, Any] | tuple[tuple[str, Any], ...]) -> AddressRange:
    """One range as host-local canonicalizes it. Raises ValueError as host-local refuses it."""
    subnet = ipaddress.ip_network(str(go_field(spec, "subnet") or ""), strict=True)
    if subnet.prefixlen > subnet.max_prefixlen - 2:
        raise ValueError(f"network {subnet} too small to allocate from")
    first = subnet.network_address + 1
    last = subnet.broadcast_address - (1 if subnet.version == 4 else 0)
    start = _address(go_field(spec, "rangeStart")) or first
    end = _address(go_field(spec, "rangeEnd")) or last
    gateway = _address(go_field(spec, "gateway")) or first
    for name, address in (("rangeStart", start), ("rangeEnd", end)):
        if address.version != subnet.version or address not in subnet:
            raise ValueError(f"{name} {address} not in network {subnet}")
    return AddressRange(start, end, gateway)


def range_sets(
    ipam: Mapping[str, Any] | tuple[tuple[str, Any], ...],
) -> tuple[tuple[RangeSet, ...], str | None]:
    """The range sets of a host-local IPAM config (an object, or its members as go_object
    merges them), and why some could not be read: its `ranges`, after the range its own
    `subnet` makes, as host-local's LoadIPAMConfig puts it first."""
    given = go_field(ipam, "ranges", null_resets=True)  # a slice: a null empties it
    if given is not None and not isinstance(given, list):
        return (), "its ranges are not a list"
    specs: list[Any] = [[go_pairs(ipam)]] if go_field(ipam, "subnet") is not None else []
    specs += given or ()
    if not specs:
        return (), "no ranges"
    found: list[RangeSet] = []
    for index, spec_set in enumerate(specs):
        if not isinstance(spec_set, list) or not all(
            isinstance(s, (dict, tuple)) for s in spec_set
        ):
            return tuple(found), f"range set {index} is not a list of ranges"
        try:
            found.append(RangeSet(index, tuple(_range(spec) for spec in spec_set)))
        except ValueError as e:
            return tuple(found), f"range set {index}: {e}"
    return tuple(found), None


def spans(sets: Iterable[RangeSet]) -> list[tuple[int, int, int, int]]:
    """(set number, IP version, first, last) of each set's ranges, less every range before
    them, of that set or an earlier one: disjoint, and an address is in the span of the first
    set that holds it."""
    found: list[tuple[int, int, int, int]] = []
    taken: list[tuple[int, int, int]] = []
    for s in sets:
        for r in s.ranges:
            version, first, last = r.start.version, int(r.start), int(r.end)
            if first > last:
                continue  # holds no address
            pieces = [(first, last)]
            for v, lo, hi in taken:
                if v == version:
                    pieces = [
                        piece
                        for a, b in pieces
                        for piece in ((a, min(b, lo - 1)), (max(a, hi + 1), b))
                        if piece[0] <= piece[1]
                    ]
            found.extend((s.number, version, a, b) for a, b in pieces)
            taken.append((version, first, last))
    return found


class PoolHealth(Record):
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
    before: ListedAddresses,
    after: Mapping[str, str] | AddressStates,  # address -> its owner's state
) -> list[PoolHealth]:
    """Each range set's counts; addresses in no set are counted under set -1. An address
    counts for the first set that holds it (RangeSet.holds), so each set's ranges are taken
    less those before them (spans()), and each span's addresses counted by bisection."""
    sets = list(sets)
    if not isinstance(after, AddressStates):
        after = AddressStates.of(after)
    before_values = before.by_version()  # its dotted quads sorted, too
    released = ListedAddresses()
    released.numbers = after.numbers_not_in(before.numbers)
    released.others.extend(n for n in before.others if not after.has(n, None))
    released_values = released.by_version()
    placed = spans(sets)
    before_by_set: dict[int, int] = {}
    released_by_set: dict[int, int] = {}
    after_by_set: dict[int, dict[str, int]] = {}
    for counts, addresses, values in (
        (before_by_set, before, before_values),
        (released_by_set, released, released_values),
    ):
        outside = len(addresses)
        for number, version, first, last in placed:
            found = values.get(version, ())
            n = bisect.bisect_right(found, last) - bisect.bisect_left(found, first)
            counts[number] = counts.get(number, 0) + n
            outside -= n
        counts[-1] = outside
    inside, after_outside = after.states_in((v, first, last) for _, v, first, last in placed)
    for (number, *_), states in zip(placed, inside):
        into = after_by_set.setdefault(number, {})
        for state, n in states.items():
            into[state] = into.get(state, 0) + n
    after_by_set[-1] = after_outside
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
    if before_by_set[-1] or after_by_set[-1]:
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
