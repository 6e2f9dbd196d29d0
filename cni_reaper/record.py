"""Record: the classes typing.NamedTuple makes, made for less.

A run imports some 60 NamedTuple classes before it reads a file, at every boot, while the
runtime waits. typing.NamedTuple checks each field's annotation as a type; under `from
__future__ import annotations` every annotation is a string, which it compiles into a
ForwardRef, field by field. That was a fifth to a third of the package's import time (warm,
3.11 about 5 ms of 19, 3.13 about 8 of 26) and nothing reads those annotations at run time.

`class X(Record)` makes what `class X(NamedTuple)` makes (collections.namedtuple's class:
the fields in annotation order, their defaults, the body's methods, properties and docstring,
the same errors for a field without a default after one with, or for a body that redefines a
namedtuple attribute), but keeps the annotations as the strings they are. mypy, which reads
them, sees typing.NamedTuple itself. Only plain records: no Generic, no other base.
"""

from __future__ import annotations

import collections

__all__ = ["Record"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any
    from typing import NamedTuple as Record
else:
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
            made = collections.namedtuple(
                typename,
                list(fields),
                defaults=[ns[name] for name in with_default],
                module=ns["__module__"],
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
