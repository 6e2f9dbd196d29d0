"""The cached result as a forgotten attachment's DEL hands it on: at the config's cniVersion,
converted as libcni 1.1's result types convert it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_reaper.prev_result import Unconvertible, convert

RESULT_100: dict[str, Any] = {
    "cniVersion": "1.0.0",
    "dns": {},
    "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/x"}],
    "ips": [
        {"address": "10.88.0.5/16", "gateway": "10.88.0.1", "interface": 0},
        {"address": "fd00::5/64", "interface": 0},
    ],
    "routes": [{"dst": "0.0.0.0/0"}],
}


def test_the_same_version_passes_through() -> None:
    assert convert(RESULT_100, "1.0.0") == RESULT_100


def test_down_to_0_4_0_each_address_gets_its_version() -> None:
    converted = convert(RESULT_100, "0.4.0")
    assert converted["cniVersion"] == "0.4.0"
    assert [ip["version"] for ip in converted["ips"]] == ["4", "6"]
    assert converted["interfaces"] == RESULT_100["interfaces"]


def test_up_from_0_3_1_the_versions_go() -> None:
    old = convert(RESULT_100, "0.3.1")
    assert convert(old, "1.0.0") == RESULT_100


def test_a_0_2_0_result_becomes_a_list_of_addresses() -> None:
    old = {"cniVersion": "0.2.0", "ip4": {"ip": "10.1.0.2/24", "gateway": "10.1.0.1"}}
    assert convert(old, "1.0.0") == {
        "cniVersion": "1.0.0",
        "ips": [{"address": "10.1.0.2/24", "gateway": "10.1.0.1"}],
    }
    assert convert(convert(old, "0.4.0"), "0.2.0") == old


@pytest.mark.parametrize("version", ["2.0.0", "x", "0.5.0"])
def test_a_version_no_result_type_has_is_refused(version: str) -> None:
    with pytest.raises(Unconvertible):
        convert(RESULT_100, version)


@given(
    st.dictionaries(
        st.sampled_from(["cniVersion", "ips", "ip4", "interfaces", "dns", "routes"]),
        st.recursive(
            st.none() | st.booleans() | st.text(max_size=8),
            lambda c: st.lists(c) | st.dictionaries(st.text(max_size=5), c),
            max_leaves=8,
        ),
    ),
    st.sampled_from(["", "0.2.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0", "9"]),
)
def test_any_cached_result_converts_or_is_refused_cleanly(
    result: dict[str, Any], version: str
) -> None:
    try:
        converted = convert(result, version)
    except Unconvertible:
        return
    assert converted["cniVersion"] == version
