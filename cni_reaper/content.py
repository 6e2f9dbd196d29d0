"""What is in a results cache file: the content verdict, decided from the bytes alone.

The format and how libcni reads it: shared/reference/libcni-cache.md sections 2 and 3.
"""

from __future__ import annotations

import _thread
import json
import re

from cni_reaper.choice import Choice
from cni_reaper.record import Record

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, TypeVar

    T = TypeVar("T")
    R = TypeVar("R")

CACHE_KIND = "cniCacheV1"
_IDENTITY_KEYS = ("networkName", "containerId", "ifName")  # in the order of Identity's fields
# What Go's encoding/json takes for a []byte: standard base64, padded to a multiple of 4, once
# the CRs and LFs are out (Go's decoder skips them wherever they are, padding or not).
_BASE64 = re.compile("[A-Za-z0-9+/]*={0,2}")
_NO_NEWLINES = {ord("\r"): None, ord("\n"): None}
# The last config found valid base64. A network's entries cache the same conflist and sit
# together in name order, so nearly every entry's config equals the one before, which a
# comparison tells at memcmp speed; the match costs ~25 instructions a character, the most
# of any one step of a whole entry's inventory. One slot: nothing grows with the input.
_last_valid_config = [""]
MAX_ENTRY_BYTES = 1 << 20
# Keys a bare (pre-v0.8) Result has; one of them marks a legacy entry.
LEGACY_RESULT_KEYS = frozenset({"ips", "interfaces", "ip4", "ip6", "dns", "routes"})


class Content(str, Choice):
    VALID = "valid"
    LEGACY = "legacy"
    EMPTY = "empty"
    ZEROED = "zeroed"
    TRUNCATED = "truncated"
    GARBAGE = "garbage"
    MISMATCHED = "mismatched"
    UNREADABLE = "unreadable"
    OVERSIZED = "oversized"
    NOT_A_FILE = "not-a-file"

    @property
    def is_corrupt(self) -> bool:
        """Damage a crash leaves, on which libcni up to v1.1.2 aborts the DEL."""
        return self in CORRUPT


CORRUPT = frozenset({Content.EMPTY, Content.ZEROED, Content.TRUNCATED, Content.GARBAGE})


class Identity(Record):
    """What names an attachment. A cache file names it twice: in its file name,
    '<network>-<containerID>-<ifname>', and in a cniCacheV1 entry's own fields."""

    network: str
    container_id: str
    ifname: str

    @property
    def file_name(self) -> str:
        return f"{self.network}-{self.container_id}-{self.ifname}"


class ContentVerdict(Record):
    content: Content
    detail: str
    identity: Identity | None = None


class JsonState(str, Choice):
    COMPLETE = "complete"
    PREFIX = "prefix"  # valid so far, input ended inside the document
    INVALID = "invalid"


_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_NUMBER_PREFIX = re.compile(r"-?(?:0|[1-9][0-9]*)?(?:\.[0-9]*)?(?:[eE][+-]?[0-9]*)?")
_NUMBER_CHARS = frozenset("0123456789+-.eE")
# A string's content: plain characters and whole escapes, up to its closing quote.
_STRING_BODY = re.compile(r'(?:[^"\\\x00-\x1f]+|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*')
_ESCAPE_START = re.compile(r"(?:u[0-9a-fA-F]{0,3})?")  # what a cut-off escape may hold
_WS = " \t\r\n"

# Parser states.
_VALUE, _FIRST_VALUE, _KEY, _FIRST_KEY, _COLON, _OBJ_NEXT, _ARR_NEXT, _DONE = range(8)


def _scan_string(text: str, i: int) -> tuple[int, JsonState]:
    """i is just past the opening quote; returns the index past the closing one."""
    # Everything up to the first character that is not plain or a whole escape, in one match:
    # a cut-off entry is mostly its base64 config, and this runs at the regex engine's speed.
    body = _STRING_BODY.match(text, i)
    end = body.end() if body else i  # it always matches, if only the empty string
    if end == len(text):
        return end, JsonState.PREFIX
    stop = text[end]
    if stop == '"':
        return end + 1, JsonState.COMPLETE
    if stop == "\\":
        escape = text[end + 1 : end + 6]
        # An escape the input ends inside of: "\" or "\u" with fewer than 4 hex digits.
        if end + 1 + len(escape) == len(text) and _ESCAPE_START.fullmatch(escape):
            return len(text), JsonState.PREFIX
    return end, JsonState.INVALID  # a control character or a bad escape


def _scan_scalar(text: str, i: int) -> tuple[int, JsonState]:
    """A number or a literal starting at i."""
    n = len(text)
    for literal in ("true", "false", "null"):
        if text.startswith(literal, i):
            return i + len(literal), JsonState.COMPLETE
        # Only a rest shorter than the literal may be its start: text[i:] is never copied
        # whole, which made a cut-off file of many scalars quadratic.
        if n - i < len(literal) and literal.startswith(text[i:]):
            return n, JsonState.PREFIX
    j = i
    while j < n and text[j] in _NUMBER_CHARS:
        j += 1
    token = text[i:j]
    if not token:
        return i, JsonState.INVALID
    if _NUMBER.fullmatch(token):
        return j, JsonState.COMPLETE
    if j == n and _NUMBER_PREFIX.fullmatch(token):
        return n, JsonState.PREFIX
    return i, JsonState.INVALID


def json_state(text: str) -> JsonState:
    """Whether text is one JSON document, a cut-off start of one, or neither.

    Iterative, so arbitrarily deep nesting costs memory for the stack, never recursion.
    """
    stack: list[str] = []
    state = _VALUE
    i, n = 0, len(text)
    while True:
        while i < n and text[i] in _WS:
            i += 1
        if i >= n:
            return JsonState.COMPLETE if state == _DONE else JsonState.PREFIX
        c = text[i]
        if state == _DONE:
            return JsonState.INVALID
        if state in (_VALUE, _FIRST_VALUE):
            if c == "]" and state == _FIRST_VALUE:
                stack.pop()
                i += 1
            elif c == "{":
                stack.append("}")
                state, i = _FIRST_KEY, i + 1
                continue
            elif c == "[":
                stack.append("]")
                state, i = _FIRST_VALUE, i + 1
                continue
            else:
                if c == '"':
                    i, scanned = _scan_string(text, i + 1)
                else:
                    i, scanned = _scan_scalar(text, i)
                if scanned is not JsonState.COMPLETE:
                    return scanned
        elif state in (_KEY, _FIRST_KEY):
            if c == "}" and state == _FIRST_KEY:
                stack.pop()
                i += 1
            elif c == '"':
                i, scanned = _scan_string(text, i + 1)
                if scanned is not JsonState.COMPLETE:
                    return scanned
                state = _COLON
                continue
            else:
                return JsonState.INVALID
        elif state == _COLON:
            if c != ":":
                return JsonState.INVALID
            state, i = _VALUE, i + 1
            continue
        else:  # _OBJ_NEXT or _ARR_NEXT
            closer = "}" if state == _OBJ_NEXT else "]"
            if c == ",":
                state, i = (_KEY if state == _OBJ_NEXT else _VALUE), i + 1
                continue
            if c != closer:
                return JsonState.INVALID
            stack.pop()
            i += 1
        # A value just ended: what may follow depends on what encloses it.
        state = _DONE if not stack else _OBJ_NEXT if stack[-1] == "}" else _ARR_NEXT


_UNDECODED = object()

# The C decoder's errors where the input ran out, everything before that point read as valid
# JSON: at the very end of the text, or inside a string that runs to the end (raised only
# there: a bad escape or a control character has an error of its own). Any other error, or
# one elsewhere, is left to the grammar (json_state).
_RAN_OUT = frozenset(
    {
        "Expecting value",
        "Expecting property name enclosed in double quotes",
        "Expecting ':' delimiter",
        "Expecting ',' delimiter",
    }
)
_UNTERMINATED = "Unterminated string starting at"


def _cut_off(error: json.JSONDecodeError) -> bool:
    """Whether the decoder's error shows its text to be a cut-off start of a document."""
    return error.msg == _UNTERMINATED or (error.pos == len(error.doc) and error.msg in _RAN_OUT)


def no_constants(name: str) -> Any:
    """json's parse_constant: Go's decoder, and so libcni, rejects NaN and Infinity; Python's
    would take them."""
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=no_constants)


class _TooDeep(ValueError):
    pass


GO_MAX_DEPTH = 10_000  # encoding/json's maxNestingDepth (scanner.go)


def _depth(text: str) -> int:
    """How deep a whole JSON text nests its arrays and objects (rarely asked: the patterns
    are compiled, by re's cache, only then)."""
    depth = deepest = 0
    for bracket in re.finditer(r"[\[\]{}]", re.sub(r'"(?:[^"\\]|\\.)*"', "", text)):
        if bracket.group() in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


# CPython 3.12 on decodes about 10,000 levels, with some 200 bytes of C stack each; a thread's
# default stack can be as small as the platform's (a 512 KiB one overflows at 5,000 levels).
_FRESH_STACK_BYTES = 16 << 20
_STACK_SIZE_SET = _thread.allocate_lock()


def at_fixed_depth(code: Callable[[T], R], data: T) -> R:
    """code(data), a JSON decoding or encoding, taking the same nesting wherever it is called.

    CPython's C codec counts each level of nesting against the recursion limit, after the
    frames its caller already stands on (3.9 to 3.11), so a deep file could decode in the
    inventory and fail in the check before its move, or in the confined thread. What fails
    here with RecursionError is done again in a thread of its own, the shallowest place there
    is: whether data decodes is what that thread says. RecursionError if it does not.
    """
    try:
        return code(data)
    except RecursionError:
        pass
    import threading  # noqa: PLC0415 (only deeply nested JSON comes here)

    done: list[R] = []
    raised: list[BaseException] = []

    def fresh() -> None:
        try:
            done.append(code(data))
        except BaseException as e:  # handed to the caller, who raises it again
            raised.append(e)

    # A daemon: it touches nothing outside, and an interrupted join must not keep the run
    # alive. The stack size is the process's, for every thread started while it is set: the
    # DEL workers may come here at once.
    thread = threading.Thread(target=fresh, name="cni-reaper-json", daemon=True)
    with _STACK_SIZE_SET:
        previous = threading.stack_size(_FRESH_STACK_BYTES)
        try:
            thread.start()
        except RuntimeError:  # no thread to be had (TasksMax, a pids cgroup): not decoded here
            raise RecursionError("nested too deeply, and no thread to decode it in") from None
        finally:
            threading.stack_size(previous)
    thread.join()
    if raised:
        raise raised[0]
    return done[0]


def decode(text: str) -> Any:
    """The JSON document text holds, as every reading of a cache file decodes it: at a fixed
    depth, and without Python's NaN and Infinity. ValueError if it is not JSON, RecursionError
    if it nests too deeply. One function for every reading of the same file, since even one
    frame more in the decoding function moves the depth at which a fresh thread gives up."""
    return at_fixed_depth(_DECODER.decode, text)


def _decode_json(text: str) -> Any:
    try:
        return decode(text)
    except RecursionError:
        raise _TooDeep("nested too deeply") from None


_JSON_KINDS = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}


def json_kind(value: object) -> str:
    """What a decoded JSON value is, in JSON's words, for a message that must not hold its
    repr: a list's or an object's nests as deep as the decoder allowed, and the repr of one
    that deep raises RecursionError where the decoding did not."""
    if value is None:
        return "null"
    return _JSON_KINDS.get(type(value), "a number")


def _is_pair_list(value: Any) -> bool:
    # Exact types: the value comes from the JSON decoder, which makes no subclasses.
    if type(value) is not list:
        return False
    for pair in value:
        if type(pair) is not list or len(pair) != 2:
            return False
        key, val = pair
        if type(key) is not str or type(val) is not str:
            return False
    return True


def without_newlines(config: str) -> str:
    """A cached config as Go's base64 decoder reads it: its CRs and LFs skipped."""
    return config.translate(_NO_NEWLINES) if "\n" in config or "\r" in config else config


def _check_cache_fields(doc: dict[str, Any]) -> str | None:
    """Why libcni could not unmarshal this cniCacheV1 object, besides its names, or None."""
    config = doc.get("config")
    if config is not None:
        if not isinstance(config, str):
            return "'config' is not a base64 string"
        if config != _last_valid_config[0]:
            bare = without_newlines(config)
            if len(bare) % 4 or not _BASE64.fullmatch(bare):
                return "'config' is not valid base64"
            _last_valid_config[0] = config
    args = doc.get("cniArgs")
    if args is not None and not _is_pair_list(args):
        return "'cniArgs' is not a list of [key, value] pairs"
    capability_args, result = doc.get("capabilityArgs"), doc.get("result")
    if capability_args is not None and type(capability_args) is not dict:
        return "'capabilityArgs' is not an object"
    if result is not None and type(result) is not dict:
        return "'result' is not an object"
    return None


def same_damage(
    judged: Content, verdict: Callable[[bytes], ContentVerdict] | None = None
) -> Callable[[bytes], str | None]:
    """For a file about to be moved: why its bytes are no longer the damage the plan judged
    (by verdict, a results entry's judge() unless said), or None when they still are."""

    def vet(data: bytes) -> str | None:
        now = (verdict or classify)(data).content
        return None if now is judged else f"now {now.value}, was {judged.value}"

    return vet


def classify(data: bytes) -> ContentVerdict:
    """The content verdict of a regular file's bytes (at most MAX_ENTRY_BYTES of them)."""
    found = judge(data)
    if isinstance(found, Identity):
        return ContentVerdict(Content.VALID, CACHE_KIND, found)
    return found


def document(data: bytes) -> Any:
    """The JSON document a file's bytes hold, decoded as Go's encoding/json reads it, or the
    verdict why there is none: the damage a crash leaves (empty, zeroed, truncated, garbage),
    or whole JSON nested too deeply to decode here (unreadable). A decoded document is never
    a ContentVerdict."""
    if not data:
        return ContentVerdict(Content.EMPTY, "0 bytes")
    body = data.rstrip(b"\0")
    if not body:
        return ContentVerdict(Content.ZEROED, f"{len(data)} NUL bytes")
    nul_tail = len(data) - len(body)
    if b"\0" in body:
        return ContentVerdict(Content.GARBAGE, "NUL bytes inside the data")
    text = body.decode("utf-8", "replace")
    # The common case, a whole document, decodes at C speed, and so does the common damage,
    # a document cut off: the decoder's error says so (_cut_off). Only what is left is scanned
    # by the (pure Python) grammar to tell a cut-off document from garbage.
    state: JsonState | None = None  # what the decoder's error already says of the text
    try:
        # raw_decode: what decode() does less its whitespace regexes. A document that starts
        # with whitespace fails here and is decoded below.
        doc, end = _DECODER.raw_decode(text)
        if nul_tail or (end != len(text) and text[end:].strip(_WS)):
            doc = _UNDECODED
    except json.JSONDecodeError as e:
        doc = _UNDECODED
        if _cut_off(e):
            state = JsonState.PREFIX
    except (ValueError, RecursionError):
        doc = _UNDECODED
    if doc is _UNDECODED:
        state = state or json_state(text)
        if state is JsonState.PREFIX:
            tail = f", then {nul_tail} NUL bytes" if nul_tail else ""
            return ContentVerdict(Content.TRUNCATED, f"JSON cut off after {len(body)} bytes{tail}")
        if state is JsonState.INVALID:
            return ContentVerdict(Content.GARBAGE, "not JSON")
        if nul_tail:
            return ContentVerdict(Content.GARBAGE, f"{nul_tail} NUL bytes after the JSON")
        try:
            doc = _decode_json(text)
        except _TooDeep:
            # Whole JSON (the grammar said so) nested deeper than Python decodes. Go's decoder,
            # libcni's and Multus's, takes up to 10,000 levels: within them it is no damage
            # (no crash makes such a file), only what this reaper cannot read.
            if _depth(text) > GO_MAX_DEPTH:
                return ContentVerdict(
                    Content.GARBAGE, f"nested deeper than Go's decoder reads ({GO_MAX_DEPTH})"
                )
            return ContentVerdict(
                Content.UNREADABLE, "whole JSON, nested too deeply to be decoded here"
            )
        except ValueError as e:
            # The grammar said whole JSON: what Python refuses is a limit of its own (an
            # integer of more than 4,300 digits), which Go's decoder may not have. Inside an
            # object or a list no crash writes that: never acted on. A bare number is no
            # document any reader of these files takes, Go's included.
            if text.lstrip(_WS)[:1] in ("{", "["):
                return ContentVerdict(Content.UNREADABLE, f"whole JSON, not decoded here: {e}")
            return ContentVerdict(Content.GARBAGE, f"not a JSON object or list: {e}")
    return doc


def judge(data: bytes) -> ContentVerdict | Identity:
    """As classify(), but a whole cniCacheV1 entry, the common case, comes back as just the
    names it carries: the inventory of a large cache makes no verdict object for it."""
    doc = document(data)
    if type(doc) is ContentVerdict:
        return doc
    if not isinstance(doc, dict):
        return ContentVerdict(Content.GARBAGE, f"JSON {type(doc).__name__}, not an object")
    kind = doc.get("kind")
    if kind == CACHE_KIND:
        identity = Identity(
            doc.get("networkName", ""), doc.get("containerId", ""), doc.get("ifName", "")
        )
        if not (
            type(identity.network) is str
            and type(identity.container_id) is str
            and type(identity.ifname) is str
        ):
            key = _IDENTITY_KEYS[[type(v) is str for v in identity].index(False)]
            return ContentVerdict(Content.GARBAGE, f"'{key}' is not a string")
        problem = _check_cache_fields(doc)
        if problem:
            return ContentVerdict(Content.GARBAGE, problem)
        return identity
    if kind is not None:
        # A format newer than this reaper knows is not damage: never act on it.
        shown = repr(kind[:64]) if isinstance(kind, str) else json_kind(kind)
        return ContentVerdict(Content.MISMATCHED, f"unknown kind {shown}")
    version = doc.get("cniVersion", "")
    if isinstance(version, str) and LEGACY_RESULT_KEYS & doc.keys():
        return ContentVerdict(Content.LEGACY, f"bare result, cniVersion {version!r}")
    return ContentVerdict(
        Content.GARBAGE, "a JSON object that is neither a cache entry nor a result"
    )
