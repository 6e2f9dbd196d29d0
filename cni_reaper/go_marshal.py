"""JSON as libcni hands it to a plugin: Go's json.Marshal of the map[string]any it decoded.

Go decodes every JSON number into that map as a float64 and writes it back as the float64's
shortest decimal text, so a plugin never sees the number as the file spelled it: 1500.0 reaches
it as 1500 (which a Go plugin decodes into an int field, and 1500.0 it does not), 1E-7 as 1e-7,
0.00001 as 0.00001, and 12345678901234567890 as 12345678901234567000. Keys are sorted, at every
level. Strings are escaped as json.dumps escapes them, which a plugin decodes to the same text
as Go's own escaping (which differs between Go releases); only the numbers change what a plugin
reads.
"""

from __future__ import annotations

import json
import math
import re

from cni_reaper.content import at_fixed_depth
from cni_reaper.netconf import float64_of

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"), allow_nan=False)
_STRING = r'"[^"\\]*(?:\\.[^"\\]*)*"'
# Where Python may write a number otherwise than Go: a float's text (1500.0, 1e-07), or an
# integer of 16 digits or more (past 2**53 a float64 holds it rounded). A number follows a
# colon, a comma or a bracket, or is the whole text; a string that holds such a sequence only
# costs the slow way.
_MAY_DIFFER = re.compile(r"(?:^|[:,\[])-?(?:\d+[.eE]|\d{16})")
_STRING_OR_NUMBER = re.compile(_STRING + r"|(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")


def marshal(value: Any) -> str:
    """value, as json.loads made it, as Go writes it. ValueError for what Go cannot write
    (NaN, inf, an integer past float64's range).

    Python's C encoder writes it, at the depth a document decodes at (content.at_fixed_depth),
    and the numbers it writes otherwise than Go are written again; a document nested deeper
    than that (a config around a cached result adds two levels) is walked without recursion."""
    try:
        text: str = at_fixed_depth(_ENCODER.encode, value)
    except (RecursionError, ValueError):  # too deep for it; NaN or inf, refused as Go does
        return walked(value)
    if _MAY_DIFFER.search(text) is None:
        return text
    return _STRING_OR_NUMBER.sub(_as_go_writes, text)


def _as_go_writes(token: re.Match[str]) -> str:
    number = token.group(1)
    if number is None:  # a string
        return token.group()
    exact = number.lstrip("-").isdigit()
    return float64_text(int(number) if exact else float(number))


class _Written(str):
    """Text already written as JSON: punctuation, between the values still to be written."""


_OPEN_OBJECT, _CLOSE_OBJECT = _Written("{"), _Written("}")
_OPEN_ARRAY, _CLOSE_ARRAY = _Written("["), _Written("]")
_COMMA, _COLON = _Written(","), _Written(":")
_LITERALS = {True: "true", False: "false"}


def walked(value: Any) -> str:
    """marshal's text, walked without recursion: for a document nested deeper than the C
    encoder goes, and the reference marshal is held to (tests/test_go_marshal.py)."""
    out: list[str] = []
    pending: list[Any] = [value]
    while pending:
        item = pending.pop()
        if type(item) is _Written:
            out.append(item)
        elif isinstance(item, str):
            out.append(json.dumps(item))
        elif item is None:
            out.append("null")
        elif isinstance(item, bool):
            out.append(_LITERALS[item])
        elif isinstance(item, (int, float)):
            out.append(float64_text(item))
        elif isinstance(item, dict):
            members: list[Any] = [_CLOSE_OBJECT]
            for index, key in enumerate(sorted(item, reverse=True)):
                members += [item[key], _COLON, _Written(json.dumps(key))]
                members.append(_COMMA if index < len(item) - 1 else _OPEN_OBJECT)
            pending += members if item else [_CLOSE_OBJECT, _OPEN_OBJECT]
        elif isinstance(item, (list, tuple)):
            elements: list[Any] = [_CLOSE_ARRAY]
            for index in range(len(item) - 1, -1, -1):
                elements += [item[index], _COMMA if index else _OPEN_ARRAY]
            pending += elements if item else [_CLOSE_ARRAY, _OPEN_ARRAY]
        else:
            raise TypeError(f"no JSON value: {type(item).__name__}")
    return "".join(out)


def float64_text(number: int | float) -> str:
    """The text Go's encoding/json writes for the float64 a JSON number decodes into: the
    shortest digits that read back as that float64 (Python's repr and Go's strconv agree on
    them), in plain notation unless the magnitude is below 1e-6 or from 1e21 up, then as
    d.ddde-7 or d.ddde+21 (a negative exponent with no leading zero)."""
    value = float64_of(number)
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"Go writes no JSON number for {value}")
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    sign = "-" if value < 0 else ""
    # repr's shortest digits, as an integer and a power of ten: 1.5e-07 is 15 and -8.
    mantissa, _, exponent = repr(abs(value)).partition("e")
    whole, _, fraction = mantissa.partition(".")
    digits = (whole + fraction).lstrip("0")
    power = int(exponent or 0) - len(fraction) + len(digits) - len(digits.rstrip("0"))
    digits = digits.rstrip("0")
    if 1e-6 <= abs(value) < 1e21:
        point = len(digits) + power  # where the decimal point falls among the digits
        if power >= 0:
            return sign + digits + "0" * power
        if point > 0:
            return f"{sign}{digits[:point]}.{digits[point:]}"
        return f"{sign}0.{'0' * -point}{digits}"
    rest = "." + digits[1:] if len(digits) > 1 else ""
    return f"{sign}{digits[0]}{rest}e{power + len(digits) - 1:+d}"
