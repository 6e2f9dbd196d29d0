"""Splitting '<network>-<containerID>-<ifname>' when all three may contain '-'."""

from __future__ import annotations

import re

from hypothesis import example, given
from hypothesis import strategies as st

from cni_reaper.cache import split_name
from cni_reaper.content import Identity
from tests.nodetree import CONTAINER_IDS

CID = CONTAINER_IDS[0]


def test_known_network_with_dashes() -> None:
    split, problem = split_name(f"generic-veth-{CID}-eth1", {"generic-veth", "istio-cni"})
    assert problem is None
    assert split == Identity("generic-veth", CID, "eth1")


def test_ifname_with_dash() -> None:
    split, _ = split_name(f"mynet-{CID}-net-1", {"mynet"})
    assert split == Identity("mynet", CID, "net-1")


def test_unknown_network_split_around_a_container_id() -> None:
    split, _ = split_name(f"cni-loopback-{CID}-lo", set())
    assert split == Identity("cni-loopback", CID, "lo")


def test_short_ids_split_when_only_one_dash_remains() -> None:
    split, _ = split_name("my-net-abc-eth0", {"my-net"})
    assert split == Identity("my-net", "abc", "eth0")


def test_ambiguous_name_is_not_split() -> None:
    split, problem = split_name("net-a-b-c", {"net"})
    assert split is None
    assert problem is not None
    assert "ambiguous" in problem


def test_overlapping_network_names_are_ambiguous_only_when_both_fit() -> None:
    split, _ = split_name(f"a-b-{CID}-eth0", {"a", "a-b"})
    assert split == Identity("a-b", CID, "eth0")


def test_unsplittable_name() -> None:
    split, problem = split_name("garbage", {"mynet"})
    assert split is None
    assert problem


name_part = st.from_regex(r"[a-zA-Z0-9][a-zA-Z0-9_.\-]{0,20}", fullmatch=True)


@given(name_part, st.sampled_from(CONTAINER_IDS), name_part)
def test_libcni_names_with_real_container_ids_split_back(
    network: str, cid: str, ifname: str
) -> None:
    split, problem = split_name(f"{network}-{cid}-{ifname}", {network})
    assert problem is None
    assert split == Identity(network, cid, ifname)


@given(st.text(max_size=300), st.sets(st.text(max_size=20), max_size=4))
def test_split_never_raises_and_round_trips(name: str, networks: set[str]) -> None:
    split, problem = split_name(name, networks)
    assert (split is None) != (problem is None)
    if split is not None:
        assert f"{split.network}-{split.container_id}-{split.ifname}" == name


def _split_one_reading_at_a_time(
    name: str, networks: set[str]
) -> tuple[Identity | None, str | None]:
    """split_name as it was before the common case was read at once (2026-12-06): every
    reading of every network the name starts with, then the 64-hex ones preferred."""
    readings: set[tuple[str, str, str]] = set()
    for network in networks:
        if network and name.startswith(network + "-"):
            rest = name[len(network) + 1 :]
            match = re.match(r"([0-9a-f]{64})-(.+)\Z", rest)
            if match:
                readings.add((network, match.group(1), match.group(2)))
            else:
                parts = rest.split("-")
                for i in range(1, len(parts)):
                    readings.add((network, "-".join(parts[:i]), "-".join(parts[i:])))
    if not readings:
        for match in re.finditer(r"[0-9a-f]{64}", name):
            start, end = match.span()
            dashed = start > 1 and name[start - 1] == "-" and name[end : end + 1] == "-"
            if dashed and end + 1 < len(name):
                readings.add((name[: start - 1], match.group(), name[end + 1 :]))
    hex_readings = {r for r in readings if re.fullmatch(r"[0-9a-f]{64}", r[1])}
    if hex_readings:
        readings = hex_readings
    if len(readings) == 1:
        return Identity(*readings.pop()), None
    if not readings:
        return None, "no known network name and no 64-hex container ID in the name"
    choices = "; ".join(
        f"network {n!r} container {c!r} ifname {i!r}" for n, c, i in sorted(readings)
    )
    return None, f"ambiguous name: {choices}"


_PIECE = st.text(alphabet=st.sampled_from(list("ab-0f\n")), max_size=6)
# Few pieces, so that names and networks often share them: networks that are prefixes of each
# other or run into an ID, IDs a digit short or long or upper case.
_COMMON = st.sampled_from(
    ["a", "b", "a-b", "eth0", "", *CONTAINER_IDS[:2], "a" * 63, "a" * 65, "A" * 64]
)
_NETWORK = st.sampled_from(["a", "a-b", "", f"a-{CONTAINER_IDS[0]}", f"b-{CONTAINER_IDS[1]}"])


@given(
    st.builds(
        lambda first, rest: "-".join([first, *rest]),
        _NETWORK | _COMMON | _PIECE,
        st.lists(_COMMON | _PIECE, max_size=5),
    ),
    st.sets(_NETWORK | _PIECE, max_size=4),
)
@example(f"a-{CONTAINER_IDS[0]}-{CONTAINER_IDS[1]}-eth0", {"a", f"a-{CONTAINER_IDS[0]}"})
def test_a_name_splits_as_every_reading_of_it_says(name: str, networks: set[str]) -> None:
    """The common case read at once gives what all readings of the name give: names of
    dashes, 64-hex IDs, IDs a digit short or long or upper case, newlines, networks that are
    prefixes of each other or run into an ID, an empty network."""
    assert split_name(name, networks) == _split_one_reading_at_a_time(name, networks)
