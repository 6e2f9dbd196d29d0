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

import decimal
import json
import math

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class Written(str):
    """Text already written as JSON, which marshal puts in as it is: its own punctuation, or a
    value written before (a cached result, written once for each plugin of a DEL)."""


_OPEN_OBJECT, _CLOSE_OBJECT = Written("{"), Written("}")
_OPEN_ARRAY, _CLOSE_ARRAY = Written("["), Written("]")
_COMMA, _COLON = Written(","), Written(":")
_LITERALS = {True: "true", False: "false"}


def marshal(value: Any) -> str:
    """value, as json.loads made it, as Go writes it. Walked without recursion: a cached result
    nests as deep as the decoder allowed. ValueError for what Go cannot write (NaN, inf)."""
    out: list[str] = []
    pending: list[Any] = [value]
    while pending:
        item = pending.pop()
        if type(item) is Written:
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
                members += [item[key], _COLON, Written(json.dumps(key))]
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


_EXACT = decimal.Context(prec=32, traps=[])  # wider than the 17 digits a float64 needs


def float64_text(number: int | float) -> str:
    """The text Go's encoding/json writes for the float64 a JSON number decodes into: the
    shortest digits that read back as that float64 (Python's repr and Go's strconv agree on
    them), in plain notation unless the magnitude is below 1e-6 or from 1e21 up, then as
    d.ddde-7 or d.ddde+21 (a negative exponent with no leading zero)."""
    try:
        value = float(number)
    except OverflowError:
        value = math.inf
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"Go writes no JSON number for {value}")
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    # Normalized in a context of its own: the thread's may round or trap.
    shortest = decimal.Decimal(repr(value)).normalize(_EXACT)
    if 1e-6 <= abs(value) < 1e21:
        return format(shortest, "f")
    sign, digits, exponent = shortest.as_tuple()
    assert isinstance(exponent, int)  # a finite number's
    text = "".join(map(str, digits))
    mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
    return f"{'-' if sign else ''}{mantissa}e{exponent + len(digits) - 1:+d}"
