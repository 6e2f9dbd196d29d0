"""cni_reaper.choice makes what enum makes: each class below is made twice, once on enum.Enum
(or IntEnum) and once on Choice (or IntChoice), from the same body, and every use the package
and its tests make of an enumeration gives the same on both, on this Python."""

from __future__ import annotations

import copy
import enum
import functools
import json
import operator
import pickle
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cni_reaper import choice
from cni_reaper.content import Content
from cni_reaper.errors import ExitCode
from cni_reaper.evidence.fs_crash import _Kind as Step

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable


def _str_body() -> dict[str, Any]:
    def is_first(self: Any) -> bool:
        kind: Any = type(self)
        return self is next(iter(kind))

    return {
        "VALID": "valid",
        "NOT_A_FILE": "not-a-file",
        "EMPTY": "",
        "ALIAS": "valid",  # a second name for VALID
        "_private": "p",  # one leading underscore: a member, in both
        "first": property(is_first),
        "describe": lambda self: f"{self.value}!",
    }


def _int_body() -> dict[str, Any]:
    return {"OK": 0, "USAGE": 2, "DATA": 65, "INTERRUPTED": 130, "SAME": 2}


def _plain_body() -> dict[str, Any]:
    return {"START": "start", "NO_JOURNAL": "no-journal", "TWO": 2}


def _made(base: type, name: str, bases: tuple[type, ...], body: dict[str, Any]) -> type:
    """The class a class statement with this body makes, on enum's or choice's metaclass."""
    meta: Any = type(base)
    ns = _namespace(base, body) if isinstance(base, enum.EnumMeta) else dict(body)
    made: type = meta(name, bases, ns)
    return made


# Each kind: how to make it on enum, on choice, and the values to try lookups with.
KINDS: dict[str, tuple[Callable[[], type], Callable[[], type], list[Any]]] = {
    "str": (
        lambda: _made(enum.Enum, "Kind", (str, enum.Enum), _str_body()),
        lambda: _made(choice.Choice, "Kind", (str, choice.Choice), _str_body()),
        ["valid", "not-a-file", "", "VALID", "nope", 0, None],
    ),
    "int": (
        lambda: _made(enum.IntEnum, "Code", (enum.IntEnum,), _int_body()),
        lambda: _made(choice.IntChoice, "Code", (choice.IntChoice,), _int_body()),
        [0, 2, 65, 130, 2.0, True, "0", 7, -1, None],
    ),
    "plain": (
        lambda: _made(enum.Enum, "Step", (enum.Enum,), _plain_body()),
        lambda: _made(choice.Choice, "Step", (choice.Choice,), _plain_body()),
        ["start", "no-journal", 2, "START", 3, None],
    ),
}


def _namespace(base: type, body: dict[str, Any]) -> Any:
    """enum's metaclass wants its own class dict, filled key by key as a class body fills it."""
    ns = type(base).__prepare__("Kind", (base,))
    for key, value in body.items():
        ns[key] = value
    return ns


def _outcome(do: Callable[[], object]) -> tuple[str, object]:
    """What an operation gives, or which exception it raises."""
    try:
        return "value", do()
    except Exception as e:
        return "raises", type(e).__name__


def _described(value: object) -> object:
    """A result made comparable across the two classes: a member by its class name, name and
    value, a collection element by element."""
    if isinstance(value, (enum.Enum, choice.Choice)):
        return ("member", type(value).__name__, value.name, value.value)
    if isinstance(value, (list, tuple)):
        return [_described(v) for v in value]
    return value


def _uses(cls: type, values: list[Any]) -> dict[str, object]:
    kind: Any = cls
    members = list(kind)
    first = members[0]
    uses: dict[str, Callable[[], object]] = {
        "members": lambda: members,
        "names": lambda: [m.name for m in members],
        "values": lambda: [(m.value, m._value_, m._name_) for m in members],
        "len": lambda: len(kind),
        "__members__": lambda: [(k, v) for k, v in kind.__members__.items()],
        "alias": lambda: [getattr(kind, k) for k in kind.__members__],
        "by name": lambda: [kind[m.name] for m in members],
        "by name, missing": lambda: kind["nope"],
        "repr": lambda: [repr(m) for m in members],
        "str": lambda: [str(m) for m in members],
        "%s": lambda: ["%s" % m for m in members],  # noqa: UP031
        "format": lambda: [f"{m}|{m:>12}" for m in members],
        "hash": lambda: [hash(m) for m in members],
        "eq value": lambda: [m == m.value for m in members],
        "sorted": lambda: sorted(members),
        "json": lambda: json.dumps(members),
        "copy": lambda: [copy.copy(m) is m and copy.deepcopy(m) is m for m in members],
        "isinstance": lambda: [
            (isinstance(m, kind), isinstance(m, str), isinstance(m, int)) for m in members
        ],
        "bool": lambda: [bool(m) for m in members],
        "reversed": lambda: list(reversed(kind)),
        "reassign": lambda: setattr(kind, first.name, 1),
        "delete": lambda: delattr(kind, first.name),
        "in, members": lambda: [m in kind for m in members],
        "dict key": lambda: {m: i for i, m in enumerate(members)}[first],
        "class repr": lambda: repr(kind),
        "methods": lambda: [m.describe() for m in members] if hasattr(first, "describe") else (),
        "properties": lambda: [m.first for m in members] if hasattr(first, "describe") else (),
        "int": lambda: [int(m) for m in members] if isinstance(first, int) else (),
        "arithmetic": lambda: [m + 1 for m in members] if isinstance(first, int) else (),
    }
    for value in values:
        uses[f"lookup {value!r}"] = functools.partial(kind, value)
    if sys.version_info >= (3, 12):  # before, `in` with a non-member raised or warned
        for value in values:
            uses[f"in {value!r}"] = functools.partial(operator.contains, kind, value)
    return {name: _described(_outcome(do)) for name, do in uses.items()}


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_choice_is_used_as_an_enum_is(kind: str) -> None:
    make_enum, make_choice, values = KINDS[kind]
    assert _uses(make_choice(), values) == _uses(make_enum(), values)


@given(
    st.lists(
        st.tuples(
            st.from_regex(r"[A-Z][A-Z_]{0,6}", fullmatch=True),
            st.sampled_from(["a", "b", "c", "a-b", ""]),
        ),
        min_size=1,
        max_size=6,
        unique_by=lambda kv: kv[0],
    )
)
def test_any_str_choice_has_the_members_and_aliases_enum_makes(
    pairs: list[tuple[str, str]],
) -> None:
    body = dict(pairs)
    mine: Any = _made(choice.Choice, "Made", (str, choice.Choice), body)
    theirs: Any = _made(enum.Enum, "Made", (str, enum.Enum), body)
    assert [(m.name, m.value) for m in mine] == [(m.name, m.value) for m in theirs]
    assert {k: v.name for k, v in mine.__members__.items()} == {
        k: v.name for k, v in theirs.__members__.items()
    }


@pytest.mark.parametrize(
    ("bases", "body"),
    [
        ((str,), {"A": "a", "B": 1}),  # enum would make "1" of it, an alias of another "1"
        ((str,), {"A": ("a",)}),  # enum would call str("a",): "a"
        ((), {"A": [1]}),  # unhashable: enum would search its members one by one
        ((str,), {"A": "a", "__str__": lambda self: "custom"}),
        ((str,), {"A": "a", "__format__": lambda self, spec: "custom"}),
        ((str,), {"A": "a", "_missing_": classmethod(lambda cls, value: None)}),
        ((str,), {"A": "a", "_order_": "A"}),
        ((str,), {"A": "a", "_ignore_": []}),
    ],
)
def test_what_choice_does_not_imitate_is_refused_where_the_class_is_made(
    bases: tuple[type, ...], body: dict[str, Any]
) -> None:
    with pytest.raises(TypeError):
        _made(choice.Choice, "Odd", (*bases, choice.Choice), body)


def test_a_member_and_a_class_with_members_stay_as_made() -> None:
    with pytest.raises(AttributeError):
        Content.VALID.value = "whole"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        del Content.VALID.name
    with pytest.raises(TypeError):
        _made(choice.Choice, "More", (Content,), {"NEW": "new"})
    assert Content.VALID.value == "valid" and Content("valid") is Content.VALID


def test_a_member_pickles_to_itself() -> None:
    # A class made in a test cannot be pickled by name: the package's own are.
    for member in [*Content, *ExitCode, *Step]:
        assert pickle.loads(pickle.dumps(member)) is member  # noqa: S301 (our own bytes)


def test_the_package_enumerations_are_choices() -> None:
    # What mypy sees as enum.Enum is at run time a Choice: the package made none on enum.
    assert isinstance(Content.VALID, choice.Choice) and not isinstance(Content.VALID, enum.Enum)
    assert isinstance(ExitCode.DATA, choice.IntChoice) and int(ExitCode.DATA) == 65
    assert Content("garbage") is Content.GARBAGE and Content.GARBAGE.is_corrupt
