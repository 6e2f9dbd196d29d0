"""Pool health: each host-local range set's size as its allocator counts it, and what a run
leaves reserved in it."""

from __future__ import annotations

import ipaddress
from collections import Counter
from collections.abc import Mapping
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cni_reaper.pool import (
    AddressRange,
    AddressStates,
    ListedAddresses,
    RangeSet,
    address_of,
    dotted_quad_number,
    health,
    is_address,
    is_dotted_quad,
    listed,
    range_sets,
)


def capacities(ipam: Mapping[str, Any]) -> list[int]:
    sets, problem = range_sets(ipam)
    assert problem is None
    return [s.capacity for s in sets]


def test_a_default_ipv4_range_leaves_out_network_gateway_and_broadcast() -> None:
    assert capacities({"ranges": [[{"subnet": "10.22.0.0/24"}]]}) == [253]


def test_the_older_top_level_subnet_is_one_range_set() -> None:
    assert capacities({"subnet": "10.22.0.0/24", "gateway": "10.22.0.254"}) == [253]


def test_start_end_and_a_gateway_outside_them() -> None:
    ipam = {
        "ranges": [[{"subnet": "10.0.0.0/16", "rangeStart": "10.0.1.0", "rangeEnd": "10.0.1.9"}]]
    }
    assert capacities(ipam) == [10]


def test_several_ranges_in_a_set_add_up_and_ipv6_keeps_its_last_address() -> None:
    ipam = {
        "ranges": [
            [{"subnet": "10.1.0.0/30"}, {"subnet": "10.2.0.0/29"}],
            [{"subnet": "fd00::/120"}],
        ]
    }
    assert capacities(ipam) == [1 + 5, 254]


@pytest.mark.parametrize(
    "spec",
    [
        {"subnet": "10.0.0.0/31"},
        {"subnet": "10.0.0.1/24"},
        {"subnet": "10.0.0.0/24", "rangeStart": "10.0.1.1"},
        {"subnet": "nonsense"},
    ],
)
def test_a_range_host_local_refuses_is_a_problem_not_a_crash(spec: dict[str, str]) -> None:
    sets, problem = range_sets({"ranges": [[spec]]})
    assert sets == () and problem is not None


def test_health_counts_before_released_and_left_by_owner() -> None:
    sets, _ = range_sets({"ranges": [[{"subnet": "10.0.0.0/24"}]]})
    before = ["10.0.0.2", "10.0.0.3", "10.0.0.4", "192.168.9.9", "fd00::9", "lock"]
    after = {"10.0.0.4": "runtime", "192.168.9.9": "current-boot"}
    inside, outside = health("net", sets, ListedAddresses(listed(before)), after)
    assert inside.to_json() == {
        "network": "net",
        "range_set": 0,
        "ranges": ["10.0.0.1-10.0.0.254"],
        "capacity": 253,
        "reserved_before": 3,
        "released": 2,
        "left": 1,
        "left_by_owner": {"runtime": 1},
        "free": 252,
    }
    assert (
        outside.range_set.number,
        outside.reserved_before,
        outside.released,
        outside.left,
    ) == (-1, 2, 1, {"current-boot": 1})


@given(st.lists(st.one_of(st.text(max_size=16), st.sampled_from(["10.1.2.3", "fd00::1"]))))
def test_a_listing_is_each_address_name_with_its_number(names: list[str]) -> None:
    """What the pools read of a store's listing: each name is_address() takes, in order, with
    its dotted_quad_number(); lock, last_reserved_ip.N and any other name left out."""
    assert list(listed(names)) == [(n, dotted_quad_number(n)) for n in names if is_address(n)]


@pytest.mark.parametrize(
    "name",
    [
        "10.22.0.7",
        "0.0.0.0",  # noqa: S104 (a name, never bound)
        "255.255.255.255",
        "256.1.1.1",
        "010.22.0.7",
        "10.22.0",
        "10.22.0.7.1",
        "10.22.0.7\n",
        " 10.22.0.7",
        "10.22.0.\u0664",
        "10.22.0.+7",
        "10.22.0.-0",
        "10.22.0.0_7",
        "10.22.0.7 ",
        "fd00::7",
        "::ffff:10.22.0.7",
        "lock",
        "last_reserved_ip.0",
        "",
    ],
)
def test_a_store_file_name_is_an_address_exactly_when_ipaddress_says_so(name: str) -> None:
    """The names host-local writes are read without ipaddress's parser; every other name
    still goes through it, and the verdicts agree."""
    try:
        expected: object = ipaddress.ip_address(name)
    except ValueError:
        expected = None
    assert address_of(name) == expected


# Spellings of a number at and beside the edges of an octet's.
OCTET_EDGES = [
    "0",
    "00",
    "01",
    "09",
    "010",
    "9",
    "10",
    "99",
    "100",
    "199",
    "249",
    "250",
    "255",
    "256",
    "260",
]


@given(
    st.one_of(
        st.text(alphabet="0123456789.\n \u0664", max_size=18),
        st.tuples(*[st.integers(-5, 300)] * 4).map(lambda t: ".".join(map(str, t))),
        st.tuples(*[st.text(alphabet="0123456789", min_size=1, max_size=4)] * 4).map(".".join),
        st.lists(st.sampled_from(OCTET_EDGES), min_size=3, max_size=5).map(".".join),
        st.ip_addresses(v=4).map(str),
        st.text(max_size=18),
    )
)
@settings(max_examples=1000)
@example("256.1.1.1")
@example("1.2.3.4.5")
@example("00.1.2.3")
@example("255.255.255.255")
def test_a_dotted_quad_is_an_ipv4_address_as_ipaddress_writes_it(name: str) -> None:
    """is_dotted_quad reads no regular expression: it takes a name exactly when ipaddress
    reads it as an IPv4 address and writes it back the same, and its number is that
    address's."""
    try:
        address = ipaddress.IPv4Address(name)
    except ValueError:
        expected = None
    else:
        expected = int(address) if str(address) == name else None
    assert is_dotted_quad(name) is (expected is not None)
    assert dotted_quad_number(name) == expected


@given(
    st.one_of(
        st.text(alphabet="0123456789.:_+- \n\u0664abcdef", max_size=18),
        st.tuples(*[st.integers(-5, 300)] * 4).map(lambda t: ".".join(map(str, t))),
        st.ip_addresses().map(str),
    )
)
def test_address_of_agrees_with_ipaddress_on_every_name(name: str) -> None:
    """Over names near and far from a dotted quad: the fast path never says more or less
    than ipaddress does, so no file is taken for a reservation that host-local would not
    have written, and none is missed."""
    try:
        expected: object = ipaddress.ip_address(name)
    except ValueError:
        expected = None
    assert address_of(name) == expected


@given(
    st.dictionaries(
        st.one_of(
            st.builds("10.88.{}.{}".format, st.integers(0, 3), st.integers(0, 255)),
            st.sampled_from(["10.88.0.01", "fd00::5", "lock", "last_reserved_ip.0"]),
        ),
        st.tuples(st.sampled_from(["runtime", "left", "alive", "unknown"]), st.booleans()),
    ),
    st.lists(st.builds("10.88.{}.{}".format, st.integers(0, 3), st.integers(0, 255))),
)
def test_address_states_answer_as_a_dict_of_names_would(
    states: dict[str, tuple[str, bool]], probes: list[str]
) -> None:
    """The pools' compact table of each address's owner state (numbers for dotted quads, a dict
    for the rest) against the dict it stands for, added in any order."""
    table = AddressStates()
    for name, (state, away) in states.items():
        table.add(name, state, away)
    assert len(table) == len(states)
    for name in [*states, *probes]:
        assert table.find(name) == states.get(name), name
        assert (name in table) == (name in states)
    assert table.states_in(()) == ([], dict(Counter(s for s, _ in states.values())))


@given(
    st.dictionaries(
        st.one_of(
            st.builds("10.88.{}.{}".format, st.integers(0, 3), st.integers(0, 255)),
            st.sampled_from(["10.88.0.01", "fd00::5", "fd00::6"]),
        ),
        st.tuples(st.sampled_from(["runtime", "left", "alive"]), st.booleans()),
    ),
    st.lists(
        st.one_of(
            st.builds("10.88.{}.{}".format, st.integers(0, 3), st.integers(0, 255)),
            st.sampled_from(["10.88.0.01", "fd00::5", "fd00::7"]),
        ),
        unique=True,
    ),
    st.booleans(),
)
def test_the_table_of_a_store_listed_now_is_each_name_added_as_found(
    states: dict[str, tuple[str, bool]], listed: list[str], away_released: bool
) -> None:
    """What the store holds after the run (pool health's 'left'), made from the inventory's
    table in one pass, against adding each listed name with its state as the dict has it:
    "unknown" if the inventory never saw it, left out if planned away and counted released."""
    table = AddressStates()
    for name, (state, away) in states.items():
        table.add(name, state, away)
    expected: dict[str, tuple[str, bool]] = {}
    for name in listed:
        if name not in states:
            expected[name] = ("unknown", False)
        elif not (away_released and states[name][1]):
            expected[name] = (states[name][0], False)
    now = table.held_now(((n, dotted_quad_number(n)) for n in listed), away_released)
    assert len(now) == len(expected)
    for name in [*states, *listed]:
        assert now.find(name) == expected.get(name), name
    assert now.states_in(()) == ([], dict(Counter(s for s, _ in expected.values())))


UNIVERSE = [
    *(f"10.0.0.{n}" for n in range(12)),
    *(f"fd00::{n:x}" for n in range(12)),
    "10.0.0.01",  # no address: host-local never writes it
    "lock",
]


def _range(version: int, first: int, last: int) -> AddressRange:
    base = ipaddress.ip_address("10.0.0.0" if version == 4 else "fd00::")
    return AddressRange(base + first, base + last, None)


@given(
    st.lists(
        st.lists(
            st.tuples(st.sampled_from([4, 6]), st.integers(0, 11), st.integers(0, 11)),
            min_size=1,
            max_size=3,
        ),
        max_size=3,
    ),
    st.lists(st.sampled_from(UNIVERSE), unique=True),
    st.dictionaries(
        st.sampled_from(UNIVERSE),
        st.tuples(st.sampled_from(["runtime", "alive", "unknown"]), st.booleans()),
    ),
)
@settings(max_examples=500)
def test_health_counts_as_placing_each_address_in_the_first_set_that_holds_it(
    drawn: list[list[tuple[int, int, int]]],
    before: list[str],
    after: dict[str, tuple[str, bool]],
) -> None:
    """Over range sets that overlap (within a set and across sets, IPv4 and IPv6), ranges that
    hold nothing (start after end), and names that spell no address: the counts by span and
    bisection are those of placing each address, one at a time, in the first set holding it
    (RangeSet.holds), released when the store no longer holds its name."""
    sets = [RangeSet(i, tuple(_range(*r) for r in ranges)) for i, ranges in enumerate(drawn)]
    table = AddressStates()
    for name, (state, away) in after.items():
        table.add(name, state, away)

    def set_of(name: str) -> int:
        address = address_of(name)
        holding = [s.number for s in sets if address is not None and s.holds(address)]
        return holding[0] if holding else -1

    expected: dict[int, tuple[int, int, dict[str, int]]] = {s.number: (0, 0, {}) for s in sets}
    for name in (n for n in before if is_address(n)):
        reserved, released, left = expected.get(set_of(name), (0, 0, {}))
        expected[set_of(name)] = (reserved + 1, released + (name not in after), left)
    for name, (state, _) in after.items():
        reserved, released, left = expected.get(set_of(name), (0, 0, {}))
        expected[set_of(name)] = (reserved, released, {**left, state: left.get(state, 0) + 1})

    counted = health("net", sets, ListedAddresses(listed(before)), table)

    assert {p.range_set.number: (p.reserved_before, p.released, p.left) for p in counted} == (
        expected
    )
