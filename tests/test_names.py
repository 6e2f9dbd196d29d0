"""Splitting '<network>-<containerID>-<ifname>' when all three may contain '-'."""

from __future__ import annotations

from hypothesis import given
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
