"""cniVersion read as libcni v1.1.x reads it (pkg/version ParseVersion, strconv.Atoi): what it
accepts, what it rejects and with which message, and whether a DEL reads the cached result."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Union

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from cni_reaper.netconf import ConfigError, NetworkList, go_quote, parse_version
from cni_reaper.plugin import PluginDirs, ProcessRunner
from cni_reaper.repair.replay import Attachment, delete


def netlist(version: str, plugins: tuple[dict[str, object], ...] = ()) -> NetworkList:
    return NetworkList("net", version, plugins or ({"type": "bridge"},), "test")


@pytest.mark.parametrize(
    ("version", "parsed", "reads_cache"),
    [
        ("", (0, 1, 0), False),  # no cniVersion: libcni reads 0.1.0
        ("0.3.1", (0, 3, 1), False),
        ("0.4", (0, 4, 0), True),  # missing parts are 0
        ("0.4.0", (0, 4, 0), True),
        ("1", (1, 0, 0), True),
        ("1.0.0", (1, 0, 0), True),
        ("01.02.03", (1, 2, 3), True),
        ("+0.+4.-0", (0, 4, 0), True),  # Atoi takes a sign
        ("-1.9.9", (-1, 9, 9), False),
        ("0.9223372036854775807", (0, (1 << 63) - 1, 0), True),
    ],
)
def test_versions_libcni_reads(
    version: str, parsed: tuple[int, int, int], reads_cache: bool
) -> None:
    assert parse_version(version) == parsed
    assert netlist(version).reads_cached_result is reads_cache
    assert netlist(version).version_problem is None


@pytest.mark.parametrize(
    ("version", "message"),
    [
        ("1.2.3.4", 'invalid version "1.2.3.4": too many parts'),
        ("...", 'invalid version "...": too many parts'),
        (
            "x",
            'failed to convert major version part "x": strconv.Atoi: parsing "x": invalid syntax',
        ),
        (".4", 'failed to convert major version part "": strconv.Atoi: parsing "": invalid syntax'),
        (
            "0.4.",
            'failed to convert micro version part "": strconv.Atoi: parsing "": invalid syntax',
        ),
        (
            "1.0.0-rc1",
            'failed to convert micro version part "0-rc1": strconv.Atoi: parsing "0-rc1": '
            "invalid syntax",
        ),
        (
            "0.1_0",
            'failed to convert minor version part "1_0": strconv.Atoi: parsing "1_0": '
            "invalid syntax",
        ),
        (
            " 1.0",
            'failed to convert major version part " 1": strconv.Atoi: parsing " 1": invalid syntax',
        ),
        (
            "1.\u0664",  # ARABIC-INDIC DIGIT FOUR
            'failed to convert minor version part "\u0664": strconv.Atoi: parsing "\u0664": '
            "invalid syntax",
        ),
        (
            "0.9223372036854775808",
            'failed to convert minor version part "9223372036854775808": strconv.Atoi: parsing '
            '"9223372036854775808": value out of range',
        ),
        (
            "1\n",
            'failed to convert major version part "1\\n": strconv.Atoi: parsing "1\\n": '
            "invalid syntax",
        ),
        (
            '"\\\x7f\u00a0',
            'failed to convert major version part "\\"\\\\\\x7f\\u00a0": strconv.Atoi: parsing '
            '"\\"\\\\\\x7f\\u00a0": invalid syntax',
        ),
    ],
)
def test_versions_libcni_rejects_with_its_message(version: str, message: str) -> None:
    with pytest.raises(ConfigError) as raised:
        parse_version(version)
    assert str(raised.value) == message
    assert netlist(version).version_problem == message
    assert netlist(version).reads_cached_result is False


@pytest.mark.parametrize("part", ["1_0", " 1", "1 ", "\t1\n", "\u0661", "\uff11", "+1_0"])
def test_what_python_int_takes_and_go_does_not(part: str) -> None:
    int(part)  # Python takes it
    with pytest.raises(ConfigError, match="invalid syntax"):
        parse_version(part)


# An independent model of Go's rules, by pattern over the bytes rather than digit by digit.
GoParse = Union[tuple[int, int, int], str]  # the version, or "<part> <why>"
UINT64_MAX = (1 << 64) - 1
ATOI_SHAPE = re.compile(rb"([+-]?)([0-9]*)(.*)", re.DOTALL)


def model_atoi(part: str) -> int | str:
    sign, digits, rest = ATOI_SHAPE.fullmatch(part.encode("utf-8", "surrogatepass")).groups()  # type: ignore[union-attr]
    if rest or not digits:
        # Go's ParseUint returns at the digit that overflows uint64, before it sees the rest.
        return "value out of range" if digits and int(digits) > UINT64_MAX else "invalid syntax"
    value = -int(digits) if sign == b"-" else int(digits)
    return value if -(1 << 63) <= value < (1 << 63) else "value out of range"


def model_parse_version(text: str) -> GoParse:
    if not text:
        return (0, 1, 0)
    parts = text.split(".")
    if len(parts) > 3:
        return "version too many parts"
    values = [0, 0, 0]
    for i, part in enumerate(parts):
        value = model_atoi(part)
        if isinstance(value, str):
            return f"{('major', 'minor', 'micro')[i]} {value}"
        values[i] = value
    return (values[0], values[1], values[2])


def ours(text: str) -> GoParse:
    try:
        return parse_version(text)
    except ConfigError as e:
        message = str(e)
    if message.endswith(": too many parts"):
        return "version too many parts"
    which = re.match(r"failed to convert (major|minor|micro) version part ", message)
    assert which is not None, message
    return f"{which.group(1)} {message.rsplit(': ', 1)[1]}"


number = st.one_of(
    st.integers(min_value=0, max_value=20).map(str),
    st.integers(min_value=-(1 << 70), max_value=1 << 70).map(str),
    st.integers(min_value=0, max_value=1 << 70).map(lambda n: f"+{n}"),
    # Around Go's bounds: int64 for the value, uint64 for where a syntax error is seen.
    st.sampled_from([63, 64]).flatmap(
        lambda bits: st.integers(-3, 3).map(lambda d: str((1 << bits) + d))
    ),
)
tricky_part = st.one_of(
    number,
    number,
    number.map(lambda n: n + "x"),
    st.text(alphabet="0123456789+-_ \t\n\u0660\u0664\u06f4\u0967\uff11\u00b2\u2074x", max_size=24),
    st.sampled_from(["", "00", "-0", "+", "-", "9223372036854775807", "9223372036854775808"]),
    st.text(max_size=6),
)


@settings(max_examples=1000)
@given(st.lists(tricky_part, min_size=1, max_size=4).map(".".join) | st.text())
@example("")
@example("99999999999999999999x")
@example("18446744073709551615x")
@example("-9223372036854775808.0.0")
@example("-9223372036854775809")
@example("\ud800")
def test_parse_version_is_gos_over_any_string(text: str) -> None:
    assert ours(text) == model_parse_version(text)


@given(
    st.text(alphabet=st.characters(), max_size=12)
    | st.text(alphabet='\ud800\udbff\udc00\udfffa"\n\x7f', max_size=8)
)
@example("\ud83d\ude00")  # a pair as Python keeps it from a JSON escape: two lone halves to Go
def test_a_lone_surrogate_is_quoted_as_the_replacement_character(text: str) -> None:
    """Go's JSON decoder reads a lone surrogate escape as U+FFFD, so its %q never shows one:
    quoted, any surrogate is U+FFFD, and the rest as if there were none."""
    replaced = re.sub("[\ud800-\udfff]", "\ufffd", text)
    quoted = go_quote(text)
    assert quoted == go_quote(replaced)
    assert not re.search("[\ud800-\udfff]", quoted)
    assert quoted.count("\ufffd") == replaced.count("\ufffd")


def test_a_version_libcni_cannot_parse_fails_the_del_before_any_plugin(tmp_path: Path) -> None:
    """DelNetworkList returns the parse error before it looks up or runs a plugin."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    ran = tmp_path / "ran"
    canary = bin_dir / "bridge"
    canary.write_text(f"#!/bin/sh\ntouch {ran}\n")
    canary.chmod(0o755)

    outcome = delete(
        netlist("1.0.x"),
        Attachment("c" * 64, "eth0"),
        ProcessRunner(),
        PluginDirs((str(bin_dir),)),
        timeout=5,
    )

    assert outcome.plugins_run == ()
    assert [e.msg for e in outcome.errors] == [
        'failed to convert micro version part "x": strconv.Atoi: parsing "x": invalid syntax'
    ]
    assert not ran.exists()
