"""Record makes the class typing.NamedTuple makes: the same fields, defaults, methods and
errors, for any fields and defaults (the package's classes are all made by it, at every boot)."""

from __future__ import annotations

import keyword
import pickle
import re
from pathlib import Path
from typing import Any, NamedTuple

from hypothesis import given
from hypothesis import strategies as st

from cni_reaper.record import Record

PACKAGE = Path(__file__).resolve().parent.parent / "cni_reaper"

names = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True).filter(
    lambda s: not keyword.iskeyword(s) and s not in ("doubled", "first")
)
values = st.one_of(st.none(), st.integers(), st.text(max_size=5), st.tuples(st.integers()))


def made(base: str, fields: list[str], defaults: dict[str, object], doc: str | None) -> Any:
    """class Made(<base>) as a module of the package writes one, its annotations strings."""
    lines = ["from __future__ import annotations", f"class Made({base}):"]
    if doc is not None:
        lines.append(f"    {doc!r}")
    for name in fields:
        lines.append(f"    {name}: int | None" + (f" = D_{name}" if name in defaults else ""))
    lines += [
        "    def doubled(self) -> tuple[object, ...]:",
        "        return tuple(self) * 2",
        "    @property",
        "    def first(self) -> object:",
        "        return self[0] if self else None",
    ]
    scope: dict[str, Any] = {"NamedTuple": NamedTuple, "Record": Record, "__name__": "m"}
    scope.update({f"D_{k}": v for k, v in defaults.items()})
    try:
        exec(compile("\n".join(lines), "m", "exec"), scope)  # noqa: S102 (our own source)
    except (TypeError, AttributeError, ValueError) as e:
        return (type(e), str(e))
    return scope["Made"]


def outcome(call: Any) -> Any:
    try:
        return call()
    except TypeError as e:
        # The message names the function namedtuple made; the same on both sides.
        return (TypeError, re.sub(r"0x[0-9a-f]+", "", str(e)))


@given(
    st.lists(names, unique=True, max_size=6),
    st.lists(st.booleans(), max_size=6),
    st.lists(values, min_size=6, max_size=6),
    st.one_of(st.none(), st.text(max_size=10)),
    st.lists(values, max_size=7),
)
def test_a_record_is_the_namedtuple_typing_makes(
    fields: list[str],
    has_default: list[bool],
    default_values: list[object],
    doc: str | None,
    args: list[object],
) -> None:
    # Any pattern of defaults, a non-default after a default included: both refuse it alike.
    defaults = {f: v for f, d, v in zip(fields, has_default, default_values) if d}
    ours, theirs = made("Record", fields, defaults, doc), made("NamedTuple", fields, defaults, doc)
    if isinstance(theirs, tuple):
        assert ours == theirs
        return
    assert not isinstance(ours, tuple)
    for attr in ("_fields", "_field_defaults", "__doc__", "__name__", "__qualname__", "__module__"):
        assert getattr(ours, attr) == getattr(theirs, attr), attr
    assert list(ours.__annotations__) == list(theirs.__annotations__) == fields
    assert ours.__mro__[1:] == theirs.__mro__[1:] == (tuple, object)
    mine, typed = outcome(lambda: ours(*args)), outcome(lambda: theirs(*args))
    assert (type(mine) is ours) == (type(typed) is theirs)
    if type(typed) is not theirs:
        assert mine == typed  # the same error
        return
    assert tuple(mine) == tuple(typed)
    assert repr(mine) == repr(typed)
    assert mine._asdict() == typed._asdict()
    assert mine.doubled() == typed.doubled() and mine.first == typed.first
    if fields:
        assert mine._replace(**{fields[0]: 7}) == typed._replace(**{fields[0]: 7})
    assert ours._make(tuple(typed)) == mine


def test_a_body_may_not_redefine_what_namedtuple_defines() -> None:
    for name in ("_replace", "_asdict", "_fields", "__new__", "__init__", "__slots__"):
        body = f"class Made({{}}):\n    a: int\n    {name} = None\n"
        errors = []
        for base in ("Record", "NamedTuple"):
            try:
                exec(body.format(base), {"Record": Record, "NamedTuple": NamedTuple})  # noqa: S102
            except AttributeError as e:
                errors.append(str(e))
        assert len(errors) == 2 and errors[0] == errors[1], name


class Pair(Record):
    left: int
    right: str = "r"


def test_a_record_pickles_and_compares_as_a_tuple() -> None:
    pair = Pair(1)
    assert pickle.loads(pickle.dumps(pair)) == pair == (1, "r")  # noqa: S301 (our own bytes)
    assert hash(pair) == hash((1, "r"))
    assert Pair.__annotations__ == {"left": "int", "right": "str"}


def test_every_record_of_the_package_is_made_by_record() -> None:
    """typing.NamedTuple would compile each field's annotation at every boot's import."""
    makers = [
        f"{path.relative_to(PACKAGE)}: {line.strip()}"
        for path in sorted(PACKAGE.rglob("*.py"))
        for line in path.read_text().splitlines()
        if re.match(r"\s*class \w+\((typing\.)?NamedTuple\b", line)
    ]
    assert makers == []
