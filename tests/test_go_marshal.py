"""A plugin's stdin as libcni 1.1.2 writes it (tests/libcni_client, Debian's
golang-github-appc-cni-dev): every JSON number the grammar allows, in a conflist, reaches the
plugin as the same bytes from the reaper's go_marshal as from libcni's json.Marshal of the
float64 it decoded; and the encoder's own shape (order, nesting, what Go cannot write)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cni_reaper import go_marshal
from cni_reaper.netconf import ConfigError, parse_conf_bytes
from tests.real_libcni import LibcniClient
from tests.test_go_fields_attacks import stdin_pair

# JSON's number grammar (RFC 8259 §6), exponents kept within a float64's reach either way.
NUMBER_TEXT = st.from_regex(
    r"-?(0|[1-9][0-9]{0,24})(\.[0-9]{1,24})?([eE][+-]?[0-9]{1,3})?", fullmatch=True
)
FLOAT_REPR = st.floats(allow_nan=False, allow_infinity=False).map(repr)
EDGES = [
    "1500.0", "1E-7", "12345678901234567890", "0.00001", "-0", "-0.0", "0.000001",
    "0.0000009999999999999999", "1e21", "999999999999999999999", "1e20", "5e-324", "1e-400",
    "1.7976931348623157e308", "9007199254740993", "0.1", "100", "1e+2", "-1.5E-07", "4.35",
]  # fmt: skip


def finite(text: str) -> bool:
    return math.isfinite(float(text))


def plugin_of(numbers: list[str]) -> str:
    return '{"type":"rec","n":[' + ",".join(numbers) + "]}"


def test_the_edges_of_go_s_notations_reach_the_plugin_as_libcni_writes_them(
    libcni_client: LibcniClient, tmp_path: Path
) -> None:
    theirs, mine = stdin_pair(libcni_client, tmp_path, plugin_of(EDGES), {})

    assert mine == theirs
    assert b'"n":[1500,1e-7,12345678901234567000,0.00001,-0,-0,0.000001,' in mine


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.one_of(NUMBER_TEXT.filter(finite), FLOAT_REPR), min_size=1, max_size=300))
def test_every_number_reaches_the_plugin_as_libcni_writes_it(
    libcni_client: LibcniClient, tmp_path: Path, numbers: list[str]
) -> None:
    theirs, mine = stdin_pair(libcni_client, tmp_path, plugin_of(numbers), {})

    assert mine == theirs


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e400", "-1e999"])
def test_a_number_go_cannot_decode_refuses_the_config(number: str) -> None:
    doc = '{"cniVersion":"0.4.0","name":"n","plugins":[{"type":"x","m":' + number + "}]}"

    with pytest.raises(ConfigError):
        parse_conf_bytes(doc.encode(), "f", single_plugin=False)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, 10**400])
def test_what_no_float64_holds_cannot_be_written(value: Any) -> None:
    with pytest.raises(ValueError, match="Go writes no JSON number"):
        go_marshal.marshal({"m": [value]})


@settings(max_examples=300)
@given(
    st.recursive(
        st.none() | st.booleans() | st.text() | st.integers(-(2**53), 2**53),
        lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    )
)
def test_any_document_reads_back_as_it_was_with_its_keys_sorted(document: Any) -> None:
    written = go_marshal.marshal(document)

    assert json.loads(written) == document
    assert written == json.dumps(document, sort_keys=True, separators=(",", ":"))


# Strings that hold what a number looks like after a colon, a comma or a bracket.
NUMBER_LIKE_TEXT = st.sampled_from([":1.5,", ",1e5]", "[12345678901234567", ":-0.0}", '\\":2.5'])
ANY_NUMBER = st.integers() | st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=500)
@given(
    st.recursive(
        st.none() | st.booleans() | st.text() | NUMBER_LIKE_TEXT | ANY_NUMBER,
        lambda inner: st.lists(inner) | st.dictionaries(st.text() | NUMBER_LIKE_TEXT, inner),
    )
)
def test_the_c_encoders_text_mended_is_the_walked_text(document: Any) -> None:
    """marshal writes through Python's C encoder and writes again the numbers it writes
    otherwise than Go; walked writes every value itself (a document too deep for the C
    encoder): the same text, or the same refusal (an integer past float64's range)."""
    try:
        reference = go_marshal.walked(document)
    except ValueError:
        with pytest.raises(ValueError, match="Go writes no JSON number"):
            go_marshal.marshal(document)
        return

    assert go_marshal.marshal(document) == reference


def test_a_document_nested_past_any_recursion_limit_is_written() -> None:
    depth = 200_000
    nested: Any = 1
    for _ in range(depth):
        nested = {"a": [nested]}

    written = go_marshal.marshal(nested)

    assert written == '{"a":[' * depth + "1" + "]}" * depth
