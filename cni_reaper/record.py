"""Record: the classes typing.NamedTuple makes, made for less.

A run imports some 60 NamedTuple classes before it reads a file, at every boot, while the
runtime waits. typing.NamedTuple checks each field's annotation as a type; under `from
__future__ import annotations` every annotation is a string, which it compiles into a
ForwardRef, field by field. That was a fifth to a third of the package's import time (warm,
3.11 about 5 ms of 19, 3.13 about 8 of 26) and nothing reads those annotations at run time.
collections.namedtuple, which typing calls, then compiles each class's `__new__` from source
text: most of what was left (about 45 of 55 us a class under 3.11). The code of a `__new__`
depends only on how many fields it takes, so it is compiled once for each count and given each
class's field names (`CodeType.replace`), which name its arguments.

`class X(Record)` makes what `class X(NamedTuple)` makes (collections.namedtuple's class:
the fields in annotation order, their defaults, `_make`, `_replace`, `_asdict`, `__repr__`,
pickling, the body's methods, properties and docstring, the same errors for a field without a
default after one with, for a field named with an underscore, or for a body that redefines a
namedtuple attribute), but keeps the annotations as the strings they are. mypy, which reads
them, sees typing.NamedTuple itself. Only plain records: no Generic, no other base.
"""

from __future__ import annotations

import sys

__all__ = ["Record"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any
    from typing import NamedTuple as Record
else:
    from collections import _tuplegetter  # namedtuple's own field descriptor
    from types import FunctionType

    # As typing has them: a body may not define these, and these it does not copy.
    _PROHIBITED = frozenset(
        {
            "__new__",
            "__init__",
            "__slots__",
            "__getnewargs__",
            "_fields",
            "_field_defaults",
            "_make",
            "_replace",
            "_asdict",
            "_source",
        }
    )
    _SPECIAL = frozenset({"__module__", "__name__", "__annotations__"})
    # 3.13 made an unknown field given to _replace a TypeError, as any unknown keyword is.
    _REPLACE_ERROR = TypeError if sys.version_info >= (3, 13) else ValueError

    _NEW_CODES: dict[int, Any] = {}  # the code of a __new__ of so many fields, made once

    def _new_code(count: int) -> Any:
        code = _NEW_CODES.get(count)
        if code is None:
            args = "".join(f"f{i}, " for i in range(count))
            source = f"lambda _cls, {args}: _tuple_new(_cls, ({args}))"
            code = _NEW_CODES[count] = eval(source, {}).__code__  # noqa: S307 (our own source)
        return code

    def _tuple_class(
        typename: str, fields: tuple[str, ...], defaults: tuple[Any, ...], module: str
    ) -> type:
        """The class collections.namedtuple(typename, fields, defaults=defaults, module=module)
        makes: the same attributes and methods, their names, docs and errors."""
        for name in fields:
            if name.startswith("_"):
                raise ValueError(f"Field names cannot start with an underscore: {name!r}")
        fields = tuple(map(sys.intern, fields))
        count = len(fields)
        arg_list = ", ".join(fields) + ("," if count == 1 else "")
        repr_format = "(" + ", ".join(f"{name}=%r" for name in fields) + ")"
        scope = {
            "_tuple_new": tuple.__new__,
            "__builtins__": {},
            "__name__": f"namedtuple_{typename}",
        }
        new = FunctionType(_new_code(count).replace(co_varnames=("_cls", *fields)), scope)
        new.__name__ = "__new__"
        new.__doc__ = f"Create new instance of {typename}({arg_list})"
        new.__defaults__ = defaults

        def _make(cls: type, iterable: Any) -> Any:
            made = tuple.__new__(cls, iterable)
            if len(made) != count:
                raise TypeError(f"Expected {count} arguments, got {len(made)}")
            return made

        _make.__doc__ = f"Make a new {typename} object from a sequence or iterable"

        def _replace(self: Any, /, **changes: Any) -> Any:
            made = self._make(map(changes.pop, fields, self))
            if changes:
                raise _REPLACE_ERROR(f"Got unexpected field names: {list(changes)!r}")
            return made

        _replace.__doc__ = (
            f"Return a new {typename} object replacing specified fields with new values"
        )

        def __repr__(self: Any) -> str:
            "Return a nicely formatted representation string"
            return self.__class__.__name__ + repr_format % self

        def _asdict(self: Any) -> dict[str, Any]:
            "Return a new dict which maps field names to their values."
            return dict(zip(self._fields, self))

        def __getnewargs__(self: Any) -> tuple[Any, ...]:
            "Return self as a plain tuple.  Used by copy and pickle."
            return tuple(self)

        methods = (new, _make, _replace, __repr__, _asdict, __getnewargs__)
        for method in methods:
            method.__qualname__ = f"{typename}.{method.__name__}"
        body: dict[str, Any] = {
            "__doc__": f"{typename}({arg_list})",
            "__slots__": (),
            "_fields": fields,
            "_field_defaults": dict(zip(fields[count - len(defaults) :], defaults)),
            "__new__": new,
            "_make": classmethod(_make),
            "_replace": _replace,
            "__repr__": __repr__,
            "_asdict": _asdict,
            "__getnewargs__": __getnewargs__,
        }
        if sys.version_info >= (3, 10):
            body["__match_args__"] = fields
        if sys.version_info >= (3, 13):
            body["__replace__"] = _replace
        for index, name in enumerate(fields):
            body[name] = _tuplegetter(index, sys.intern(f"Alias for field number {index}"))
        made = type(typename, (tuple,), body)
        made.__module__ = module
        return made

    class _RecordMeta(type):
        def __new__(cls, typename: str, bases: tuple[type, ...], ns: dict[str, Any]) -> type:
            if not bases:  # Record itself
                return super().__new__(cls, typename, bases, ns)
            if bases != (Record,):
                raise TypeError("a Record inherits from Record alone")
            fields = ns.get("__annotations__", {})
            with_default: list[str] = []
            for name in fields:
                if name in ns:
                    with_default.append(name)
                elif with_default:
                    s = "s" if len(with_default) > 1 else ""
                    raise TypeError(
                        f"Non-default namedtuple field {name} cannot follow default "
                        f"field{s} {', '.join(with_default)}"
                    )
            made = _tuple_class(
                typename, tuple(fields), tuple(ns[name] for name in with_default), ns["__module__"]
            )
            made.__annotations__ = made.__new__.__annotations__ = dict(fields)
            for key, value in ns.items():
                if key in _PROHIBITED:
                    raise AttributeError("Cannot overwrite NamedTuple attribute " + key)
                if key not in _SPECIAL and key not in made._fields:
                    setattr(made, key, value)
            return made

    class Record(metaclass=_RecordMeta):
        pass
