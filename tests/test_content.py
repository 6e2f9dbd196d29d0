"""Content verdicts from the bytes of a results file, as a crash leaves them."""

from __future__ import annotations

import base64
import json
import re
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_reaper.content import Content, JsonState, classify, json_state
from tests.nodetree import CONTAINER_IDS, cache_entry_bytes

CID = CONTAINER_IDS[0]
CONF = b'{"cniVersion":"1.0.0","name":"mynet","plugins":[{"type":"bridge"}]}'
VALID = cache_entry_bytes(
    CONF,
    "mynet",
    CID,
    "eth0",
    {
        "cniVersion": "1.0.0",
        "dns": {},
        "ips": [{"address": "10.88.0.5/16", "gateway": "10.88.0.1", "interface": 2}],
    },
)


@pytest.mark.parametrize(
    ("data", "content"),
    [
        (VALID, Content.VALID),
        (b"", Content.EMPTY),
        (b"\0" * 4096, Content.ZEROED),
        (VALID[:100], Content.TRUNCATED),
        (VALID[:100] + b"\0" * 3996, Content.TRUNCATED),
        (VALID + b"\0" * 10, Content.GARBAGE),
        (b"adfads", Content.GARBAGE),
        (b"[1, 2]", Content.GARBAGE),
        (b'{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.1.0.2/24"}]}', Content.LEGACY),
        (b'{"kind":"cniCacheV2","containerId":"x"}', Content.MISMATCHED),
        (
            b'{"kind":"cniCacheV1","config":"%%%","containerId":"a","ifName":"b","networkName":"c"}',
            Content.GARBAGE,
        ),
        (b"{}", Content.GARBAGE),
        (b"[" * 100_000, Content.TRUNCATED),
        (b"[" * 100_000 + b"]" * 100_000, Content.GARBAGE),
    ],
)
def test_verdict(data: bytes, content: Content) -> None:
    assert classify(data).content is content


def test_valid_entry_carries_its_identity() -> None:
    verdict = classify(VALID)
    assert verdict.identity is not None
    assert (verdict.identity.network, verdict.identity.container_id, verdict.identity.ifname) == (
        "mynet",
        CID,
        "eth0",
    )


@given(st.integers(min_value=1, max_value=len(VALID) - 1))
def test_every_cut_of_a_real_entry_is_truncated(cut: int) -> None:
    assert classify(VALID[:cut]).content is Content.TRUNCATED


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(), children, max_size=4)
    ),
    max_leaves=20,
)


@given(json_values, st.data())
def test_json_state_agrees_with_the_json_module(value: object, data: st.DataObject) -> None:
    text = json.dumps(value, indent=data.draw(st.sampled_from([None, 1])))
    assert json_state(text) is JsonState.COMPLETE
    cut = data.draw(st.integers(min_value=0, max_value=len(text) - 1))
    prefix = text[:cut]
    # A cut that happens to end a whole document (a number cut short) is complete, else a prefix.
    try:
        json.loads(prefix)
        complete = bool(prefix.strip())
    except ValueError:
        complete = False
    expected = JsonState.COMPLETE if complete else JsonState.PREFIX
    assert json_state(prefix) is expected


@given(st.text(max_size=200))
def test_json_state_never_calls_invalid_json_complete(text: str) -> None:
    state = json_state(text)
    if state is JsonState.COMPLETE:
        json.loads(text)


@given(st.binary(max_size=2000))
def test_classify_never_raises(data: bytes) -> None:
    assert classify(data).content in set(Content)


@given(st.text(alphabet=st.sampled_from('ab"\\/ufnrt0F\x01\x1f\u00e9'), max_size=12))
def test_json_state_reads_strings_as_the_json_module_does(body: str) -> None:
    """Escapes, control characters and cut-off escapes, each where the input may end."""
    text = '"' + body
    try:
        json.loads(text)
        expected = JsonState.COMPLETE
    except ValueError:
        # Not one whole string: a prefix iff some continuation makes it one.
        expected = JsonState.PREFIX if _completes(text) else JsonState.INVALID
    assert json_state(text) is expected


def _completes(text: str) -> bool:
    for tail in ('"', '0"', '00"', '000"', '0000"', 'n"'):
        try:
            json.loads(text + tail)
        except ValueError:
            continue
        return True
    return False


def _with_config(config: str) -> bytes:
    doc = json.loads(VALID)
    doc["config"] = config
    return json.dumps(doc).encode()


def _go_reads_as_base64(config: str) -> bool:
    """What Go's encoding/json takes for a []byte (tests/test_libcni_client.py holds it to
    libcni): std base64, padded to a multiple of 4, its CRs and LFs skipped."""
    bare = config.replace("\r", "").replace("\n", "")
    return len(bare) % 4 == 0 and re.fullmatch("[A-Za-z0-9+/]*={0,2}", bare) is not None


_NEAR_BASE64 = st.text(
    alphabet=st.sampled_from("QUFBQkJ+/=-_ \n\r\t\\é\0"), max_size=12
) | st.sampled_from([base64.b64encode(CONF).decode(), "QQ==", "QUE=", "QUFB", ""])


@given(st.lists(_NEAR_BASE64, max_size=8))
def test_a_config_is_judged_the_same_whatever_was_judged_before(configs: list[str]) -> None:
    # judge() remembers the last config it found valid: any sequence of entries, a config
    # repeated or one valid config after another, is judged as the definition judges each.
    for config in configs:
        verdict = classify(_with_config(config))
        assert (verdict.content is Content.VALID) is _go_reads_as_base64(config), config
        if verdict.content is not Content.VALID:
            assert verdict.detail == "'config' is not valid base64"


def _nested_entry(depth: int) -> bytes:
    return (
        json.dumps(
            {"kind": "cniCacheV1", "networkName": "n", "containerId": "c", "ifName": "eth0"}
        ).encode()[:-1]
        + b', "result": {"x": '
        + b"[" * depth
        + b"]" * depth
        + b"}}"
    )


@pytest.mark.parametrize("depth", [3_000, 9_990])
def test_whole_json_within_gos_nesting_limit_is_never_damage(depth: int) -> None:
    """Go's encoding/json (libcni's, Multus's) reads 10,000 levels. CPython 3.9 to 3.11
    decode fewer (the entry is then unreadable here), 3.12 on may decode it (valid): either
    way it is no crash's damage, never acted on."""
    doc = _nested_entry(depth)
    assert classify(doc).content in (Content.UNREADABLE, Content.VALID)
    assert classify(doc[:-1]).content is Content.TRUNCATED


def _judged_under(frames: int, data: bytes) -> Content:
    """classify(data), called with `frames` more Python frames on the stack."""
    return classify(data).content if frames == 0 else _judged_under(frames - 1, data)


def _judged_in_a_thread(data: bytes) -> Content:
    judged: list[Content] = []
    thread = threading.Thread(target=lambda: judged.append(classify(data).content))
    thread.start()
    thread.join()
    return judged[0]


@pytest.mark.parametrize("depth", [700, 900, 960, 980, 990, 2_000, 9_990])
def test_whether_deep_json_decodes_does_not_depend_on_where_it_is_judged(depth: int) -> None:
    """The C decoder counts nesting against the recursion limit after its caller's frames
    (3.9 to 3.11): an entry the inventory found whole was unreadable to the check before a
    move, run deeper, or in the confined thread. One file, one verdict, wherever it is judged."""
    doc = _nested_entry(depth)
    here = classify(doc).content
    assert _judged_under(300, doc) is here
    assert _judged_in_a_thread(doc) is here
    assert here in (Content.VALID, Content.UNREADABLE)


def test_whole_json_with_an_integer_past_pythons_digit_limit_is_never_damage() -> None:
    """CPython refuses to decode an integer of more than 4,300 digits (since 3.9.14); Go
    skips one in a field it does not keep. Whole JSON it is, no crash's damage: it was garbage,
    and a results entry of it was DEL'd and moved."""
    doc = _nested_entry(0)[:-2] + b"9" * 5_000 + b"}}"
    assert json_state(doc.decode()) is JsonState.COMPLETE
    assert classify(doc).content is Content.UNREADABLE
    assert classify(b" " + doc).content is Content.UNREADABLE
    assert classify(doc[:-1]).content is Content.TRUNCATED


def test_whole_json_past_gos_nesting_limit_is_garbage() -> None:
    """Nested deeper than Go's decoder reads, and than any CPython decodes: libcni cannot
    read it either."""
    depth = 100_000
    doc = b'{"kind": "cniCacheV1", "result": {"x": ' + b"[" * depth + b"]" * depth + b"}}"
    assert classify(doc).content is Content.GARBAGE


def _judged_by_the_grammar(data: bytes) -> tuple[Content, str] | None:
    """What the content verdict of data is when only json_state tells a cut-off document from
    garbage (the judge before the decoder's errors were read, 2026-12-06); None for whole
    JSON, which is judged on what it holds."""
    if not data:
        return Content.EMPTY, "0 bytes"
    body = data.rstrip(b"\0")
    if not body:
        return Content.ZEROED, f"{len(data)} NUL bytes"
    if b"\0" in body:
        return Content.GARBAGE, "NUL bytes inside the data"
    nul_tail = len(data) - len(body)
    state = json_state(body.decode("utf-8", "replace"))
    if state is JsonState.PREFIX:
        tail = f", then {nul_tail} NUL bytes" if nul_tail else ""
        return Content.TRUNCATED, f"JSON cut off after {len(body)} bytes{tail}"
    if state is JsonState.INVALID:
        return Content.GARBAGE, "not JSON"
    if nul_tail:
        return Content.GARBAGE, f"{nul_tail} NUL bytes after the JSON"
    return None


def _same_as_the_grammar(data: bytes) -> None:
    verdict = classify(data)
    expected = _judged_by_the_grammar(data)
    if expected is None:
        assert verdict.content is not Content.TRUNCATED, data
        assert verdict.detail != "not JSON", data
    else:
        assert (verdict.content, verdict.detail) == expected, data


# What JSON is made of, and what breaks it where a cut may fall: literals and constants Go
# refuses, bad escapes, control characters, a replacement character from bytes not UTF-8.
_JSONISH = st.text(
    alphabet=st.sampled_from(list('{}[]":,0123456789-+.eE \n\t\\ufnrtalsNIy\x01\u00e9\ufffd')),
    max_size=40,
)


@given(json_values, st.data())
def test_a_cut_or_broken_document_is_judged_as_the_grammar_judges_it(
    value: object, data: st.DataObject
) -> None:
    """The decoder's error decides a cut-off document only where the grammar would say so:
    every cut of a document written compactly, indented or ASCII-only, some then broken by a
    character put in or changed, some followed by NUL bytes (a file extended and never
    written)."""
    text = json.dumps(
        value,
        indent=data.draw(st.sampled_from([None, 1])),
        ensure_ascii=data.draw(st.booleans()),
    )
    cut = data.draw(st.integers(min_value=0, max_value=len(text)))
    text = text[:cut]
    if text and data.draw(st.booleans()):
        at = data.draw(st.integers(min_value=0, max_value=len(text) - 1))
        put = data.draw(st.sampled_from(list('"\\,:]}{[ 0-eNu\x01x')))
        text = text[:at] + put + text[at + data.draw(st.integers(0, 1)) :]
    nuls = data.draw(st.sampled_from([0, 0, 3]))
    _same_as_the_grammar(text.encode("utf-8", "surrogatepass") + b"\0" * nuls)


@given(_JSONISH, st.sampled_from([0, 0, 2]))
def test_json_made_of_its_own_characters_is_judged_as_the_grammar_judges_it(
    text: str, nuls: int
) -> None:
    _same_as_the_grammar(text.encode() + b"\0" * nuls)


@pytest.mark.parametrize(
    "text",
    [
        '{"a": "b\\',  # the input ends just after a backslash
        '{"a": "\\u12',  # inside a \u escape
        '{"a": "\\u1234',  # just after one, the string still open
        '{"a": "\\x',  # a bad escape, then the end
        '{"a": "b\x01',  # a control character in a string
        '{"a": tr',  # inside a literal
        '{"a": Na',  # inside a constant Go refuses
        '{"a": NaN',  # after one
        '{"a": -',  # a number's sign
        '{"a": 1.',  # a number's point
        '{"a": 1e',  # a number's exponent
        '{"a": 1e+',
        '{"a": 0',  # a number the input may go on
        '{"a": 01',  # a leading zero
        '{"a" ',
        '{"a":1,',
        '{"a":1,}',  # a trailing comma, then the end
        "[",
        "[1,",
        "[1,]",
        ' {"a": 1',  # whitespace first: raw_decode refuses, the grammar reads it
        "\ufffd",
    ],
)
def test_the_edges_of_a_cut_are_judged_as_the_grammar_judges_them(text: str) -> None:
    _same_as_the_grammar(text.encode())
    _same_as_the_grammar(text.encode() + b"\0\0")
