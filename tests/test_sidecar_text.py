"""A sidecar written from the report entry's own text holds exactly what the record, decoded
and written out again, holds: the same bytes, whatever the entry's strings and numbers."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from cni_reaper.repair.quarantine import sidecar, sidecar_text

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
# Report entries never carry the sidecar's own keys.
ENTRY_KEYS = st.text().filter(
    lambda key: key not in ("schema", "reaper_version", "quarantined_at", "sha256")
)


@given(
    st.dictionaries(ENTRY_KEYS, VALUES, max_size=8),
    st.text(alphabet="0123456789abcdef", min_size=64, max_size=64) | st.just(""),
    st.floats(min_value=0, max_value=4e9),
)
def test_sidecar_text_is_the_record_written_out(
    entry: dict[str, Any], sha256: str, now: float
) -> None:
    entry_text = json.dumps(entry, separators=(",", ":"))  # ASCII, as json_text() writes it
    expected = json.dumps(sidecar(json.loads(entry_text), sha256, now), separators=(",", ":"))
    assert sidecar_text(entry_text, sha256, now) == expected
