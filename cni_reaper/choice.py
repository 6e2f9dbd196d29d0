"""Choice and IntChoice: the classes enum.Enum and enum.IntEnum make, made for less.

A run creates 17 enumerations before it reads a file, at every boot while the runtime waits.
enum's metaclass builds each member through several layers of Python (its class dict, the
member's descriptors, the maps by name and by value, the checks of every name): with Choice a
run's start-up is 7 M instructions less under 3.11 (5 % of it), and an entry's inventory
6,000 less, as a member's class attribute no longer goes through the metaclass's `__getattr__`.
Here a member is made once, as the data type's own object, its name and value kept on it as
plain attributes (which also spares enum's `value` property, a Python call at every read).

`class X(str, Choice)` makes what `class X(str, Enum)` makes, as far as the package and its
tests use it: members in definition order, each an instance of the class and of its data type
(a str equals its value, an int compares as one), `name`, `value`, `_name_`, `_value_`, the
lookup by value `X(value)` (ValueError for no member), `X[name]`, iteration, `len`,
`__members__`, aliases (a value given twice names the first member), methods and properties of
the body, enum's hash (a str or int member's is its value's, another's its name's), repr, and
str() and format() as enum gives them on each Python (3.11 changed both), `in` as 3.12 has it
(a member or a member's value), copy and pickle to the same member, and no reassigning a
member or its attributes. What it does not imitate it refuses where the class is made: a value
not of the data type, an unhashable one, a body that defines `__str__`, `__format__`,
`__new__`, `__init__`, `__setattr__` or an enum `_sunder_` name, a subclass of a class with
members. mypy, which needs enum's semantics, sees enum.Enum and enum.IntEnum themselves.
tests/test_choice.py holds the two to each other.
"""

from __future__ import annotations

import sys

__all__ = ["Choice", "IntChoice"]

TYPE_CHECKING = False
if TYPE_CHECKING:
    from enum import Enum as Choice
    from enum import IntEnum as IntChoice
else:
    # As enum's _is_dunder, _is_sunder and _is_private: such names are never members.
    def _is_sunder(key):
        return len(key) > 2 and key[0] == key[-1] == "_" and key[1] != "_" and key[-2] != "_"

    def _is_special(cls_name, key):
        if _is_sunder(key):
            return True
        if len(key) > 4 and key[:2] == key[-2:] == "__" and key[2] != "_" and key[-3] != "_":
            return True  # __dunder__
        return key.startswith(f"_{cls_name.lstrip('_')}__")  # private, name-mangled

    def _is_member(cls_name, key, value):
        # Functions, properties, classmethods are descriptors: enum's, too, never members.
        kind = type(value)
        return not (
            _is_special(cls_name, key)
            or hasattr(kind, "__get__")
            or hasattr(kind, "__set__")
            or hasattr(kind, "__delete__")
        )

    # enum puts its own in the class, over the data type's: a str member shows as `X.NAME`.
    _ENUM_METHODS = ("__repr__", "__str__", "__format__", "__reduce_ex__")
    # What enum does with these in a body, Choice does not: a class that needs them is refused,
    # so that it fails where it is made, never quietly behaves otherwise.
    _NOT_IMITATED = frozenset({"__str__", "__format__", "__new__", "__init__", "__setattr__"})

    def _refuse(cls_name, bases, ns, keys, data_type):
        if any(getattr(base, "_members_", ()) for base in bases):
            raise TypeError(f"{cls_name}: a Choice with members cannot be subclassed")
        if not keys:
            return  # IntChoice, a base without members
        sunder = [key for key in ns if _is_sunder(key)]
        imitated = sorted(_NOT_IMITATED.intersection(ns))
        if sunder or imitated:
            raise TypeError(f"{cls_name}: Choice does not imitate {', '.join(sunder + imitated)}")
        for key in keys:
            value = ns[key]
            if data_type is not None and type(value) is not data_type:
                raise TypeError(f"{cls_name}.{key}: not a {data_type.__name__} but {value!r}")
            try:
                hash(value)
            except TypeError:
                raise TypeError(f"{cls_name}.{key}: an unhashable value {value!r}") from None

    class _ChoiceType(type):
        def __new__(metacls, cls_name, bases, ns):
            choices = [base for base in bases if isinstance(base, _ChoiceType)]
            if not choices:
                return super().__new__(metacls, cls_name, bases, ns)  # Choice itself
            keys = [key for key, value in ns.items() if _is_member(cls_name, key, value)]
            body = {key: value for key, value in ns.items() if key not in keys}
            for name in _ENUM_METHODS:
                body.setdefault(name, getattr(choices[0], name))
            cls = super().__new__(metacls, cls_name, bases, body)
            data_type = next((b for b in cls.__mro__[1:] if b in (str, int)), None)
            _refuse(cls_name, bases, ns, keys, data_type)
            by_name = {}
            by_value = {}
            for key in keys:
                value = ns[key]
                member = by_value.get(value)
                if member is None:  # else an alias of the member that has this value
                    if data_type is None:
                        member = object.__new__(cls)
                    else:
                        member = data_type.__new__(cls, value)
                        value = data_type(value)
                    vars(member).update(_name_=key, _value_=value, name=key, value=value)
                    by_value[value] = member
                by_name[key] = member
                type.__setattr__(cls, key, member)
            type.__setattr__(cls, "_member_map_", by_name)
            type.__setattr__(cls, "_value2member_map_", by_value)
            type.__setattr__(cls, "_members_", tuple(by_value.values()))
            type.__setattr__(cls, "_member_names_", [m.name for m in cls._members_])
            return cls

        def __call__(cls, value):
            try:
                return cls._value2member_map_[value]
            except (KeyError, TypeError):  # TypeError: unhashable
                raise ValueError(f"{value!r} is not a valid {cls.__qualname__}") from None

        def __getitem__(cls, name):
            return cls._member_map_[name]

        def __iter__(cls):
            return iter(cls._members_)

        def __reversed__(cls):
            return reversed(cls._members_)

        def __len__(cls):
            return len(cls._members_)

        def __contains__(cls, value):
            # As 3.12 has it: a member, or a member's value.
            if isinstance(value, cls):
                return True
            try:
                return value in cls._value2member_map_
            except TypeError:
                return False

        @property
        def __members__(cls):
            from types import MappingProxyType  # noqa: PLC0415 (tests and introspection)

            return MappingProxyType(cls._member_map_)

        def __setattr__(cls, name, value):
            if name in cls.__dict__.get("_member_map_", ()):
                raise AttributeError(f"cannot reassign member {name!r}")
            super().__setattr__(name, value)

        def __delattr__(cls, name):
            if name in cls.__dict__.get("_member_map_", ()):
                raise AttributeError(f"cannot delete member {name!r}")
            super().__delattr__(name)

        def __repr__(cls):
            return f"<enum {cls.__name__!r}>"

    # 3.11 made format() of a member its str(), but for IntEnum's, and an IntEnum's str() its
    # number's.
    _STR_FORMAT = sys.version_info >= (3, 11)

    class Choice(metaclass=_ChoiceType):
        __slots__ = ()

        def __repr__(self):
            value = int.__repr__(self) if isinstance(self, int) else repr(self._value_)
            return f"<{type(self).__name__}.{self._name_}: {value}>"

        def __str__(self):
            return f"{type(self).__name__}.{self._name_}"

        def __format__(self, spec):
            if _STR_FORMAT or not isinstance(self, str):
                return format(str(self), spec)
            return format(self._value_, spec)

        def __hash__(self):  # a str or int member hashes as its value, by the MRO
            return hash(self._name_)

        def __reduce_ex__(self, protocol):
            return type(self), (self._value_,)

        def __setattr__(self, name, value):
            raise AttributeError(f"cannot set {name!r} of {self!r}: a member is constant")

        def __delattr__(self, name):
            raise AttributeError(f"cannot delete {name!r} of {self!r}: a member is constant")

        def __copy__(self):
            return self

        def __deepcopy__(self, memo):
            return self

    class IntChoice(int, Choice):
        __slots__ = ()

        def __str__(self):
            return int.__repr__(self) if _STR_FORMAT else Choice.__str__(self)

        def __format__(self, spec):
            return format(self._value_, spec)
