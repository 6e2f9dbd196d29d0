"""The pre-runtime record's table of file identities (pre_runtime.FileIdentities) against a
plain dict, over any sequence of names set and looked up: what proves a file predates this boot
must be exactly what the record said of that name, last word winning, whatever the names (IPv4
dotted quads are packed, others are not) and however large the numbers."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cni_reaper.pre_runtime import FileIdentities

# Few addresses, so that names repeat; and names that look like addresses but are not host-local's
# one spelling of one (leading zeros, out of range), which must not share a packed slot.
quads = st.builds(
    "{}.{}.{}.{}".format,
    st.sampled_from([0, 10, 255]),
    st.sampled_from([0, 88]),
    st.integers(0, 2),
    st.integers(0, 3),
)
near_quads = st.sampled_from(["10.88.0.01", "10.88.0.256", "010.88.0.1", "10.88.0", "lock"])
names = st.one_of(quads, near_quads, st.text(min_size=1, max_size=8))
# ns times before 1970 and past 2262 and inodes past 64 bits do not pack: kept as they are.
numbers = st.tuples(
    st.one_of(st.integers(0, 2**64 - 1), st.integers(2**64, 2**70)),
    st.integers(0, 2**64 - 1),
    st.integers(-(2**63), 2**63 - 1) | st.integers(2**63, 2**66),
    st.integers(-(2**63), 2**63 - 1),
)


@settings(max_examples=400)
@given(st.lists(st.tuples(st.booleans(), names, numbers), max_size=40), st.lists(names))
def test_every_name_reads_back_what_was_set_last(
    steps: list[tuple[bool, str, tuple[int, int, int, int]]], probes: list[str]
) -> None:
    table = FileIdentities()
    model: dict[str, tuple[int, int, int, int]] = {}
    for look_first, name, value in steps:
        if look_first:  # lookups between sets: the table sorts itself on the way
            assert table.get(name) == model.get(name)
        table.set(name, value)
        model[name] = value
    assert len(table) == len(model)
    for name in [*model, *probes]:
        assert table.get(name) == model.get(name), name
