"""Tags for temp and hidden names (nonce.py): never the same twice, with or without the
kernel's entropy pool, and never waiting on it."""

from __future__ import annotations

import re

from cni_reaper import nonce

HEX = re.compile(r"[0-9a-f]+")


def test_a_tag_is_hex_of_the_length_asked_and_never_repeats() -> None:
    tags = [nonce.tag(4) for _ in range(2000)]
    assert all(len(t) == 8 and HEX.fullmatch(t) for t in tags)
    assert len(set(tags)) == len(tags)
    assert len(nonce.tag(8)) == 16


def test_the_tag_made_where_the_pool_is_not_ready_never_repeats_in_a_process() -> None:
    """What a run early in a boot names its files by: the clock, the process and a count."""
    tags = [nonce.fallback(4) for _ in range(10_000)]
    assert all(len(t) == 8 and HEX.fullmatch(t) for t in tags)
    assert len(set(tags)) == len(tags)
