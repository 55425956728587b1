"""`dataclass`: the standard decorator, with `__repr__`, `__eq__` and a frozen class's `__hash__`
shared by every data class instead of written for each.

The standard library writes each method it generates as source and compiles it (~0.15 ms each):
a `start` compiled 138 for 34 classes, 20 ms of its ~100 ms of imports, and the reading commands
alike. Only `__init__` (and a frozen class's `__setattr__` and `__delattr__`) differs enough from
class to class to need its own; repr, equality and hashing are the same three functions reading
the class's fields, written once here.

Invariants:
- Never behave otherwise than the standard decorator: repr of the fields with `repr=True` as
  `Name(a=1, b='x')` ("..." where a record holds itself), equality of the same class's
  `compare=True` fields (else NotImplemented), unhashable unless frozen, then hashed by those
  fields; a method the class body defines is kept, as the standard decorator keeps it
  (`tests/test_dataclass.py` compares the two on the same classes, and fails on a module of ours
  that uses the standard decorator).
- Standard library only. Type checkers are shown the standard decorator.
"""

from __future__ import annotations

import _thread
import dataclasses

TYPE_CHECKING = False  # not `typing`'s: this module is on every command's path
if TYPE_CHECKING:
    from dataclasses import dataclass as dataclass
    from typing import Any
else:
    def dataclass(cls=None, /, *, frozen=False, **options):
        """`dataclasses.dataclass(cls, frozen=..., ...)`, with the shared methods."""
        if options.get("order") or options.get("unsafe_hash") or options.get("repr") is False \
                or options.get("eq") is False:
            return dataclasses.dataclass(cls, frozen=frozen, **options)  # not ours to share

        def wrap(body):
            own = body.__dict__
            own_hash = own.get("__hash__", dataclasses.MISSING)
            explicit_hash = not (own_hash is dataclasses.MISSING or (own_hash is None and "__eq__" in own))
            made = dataclasses.dataclass(body, frozen=frozen, repr=False, eq=False, **options)
            if "__repr__" not in own:
                made.__repr__ = _repr
            if "__eq__" not in own:
                made.__eq__ = _eq
            if not explicit_hash:
                made.__hash__ = _hash if frozen else None
            return made

        return wrap if cls is None else wrap(cls)


_in_repr: set[tuple[int, int]] = set()


def _repr(self: Any) -> str:
    key = (id(self), _thread.get_ident())
    if key in _in_repr:
        return "..."
    _in_repr.add(key)
    try:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in dataclasses.fields(self) if f.repr)
    finally:
        _in_repr.discard(key)
    return f"{type(self).__qualname__}({shown})"


_compared: dict[type, tuple[str, ...]] = {}  # per class: the fields its equality compares
_hashed: dict[type, tuple[str, ...]] = {}  # per frozen class: the fields its hash reads


def _compared_names(cls: Any) -> tuple[str, ...]:
    names = _compared.get(cls)
    if names is None:
        names = _compared[cls] = tuple(f.name for f in dataclasses.fields(cls) if f.compare)
    return names


def _eq(self: Any, other: object) -> object:
    if other.__class__ is not self.__class__:
        return NotImplemented
    names = _compared_names(type(self))
    return tuple(getattr(self, n) for n in names) == tuple(getattr(other, n) for n in names)


def _hash(self: Any) -> int:
    cls = type(self)
    names = _hashed.get(cls)
    if names is None:
        names = _hashed[cls] = tuple(f.name for f in dataclasses.fields(cls)
                                     if (f.compare if f.hash is None else f.hash))
    return hash(tuple(getattr(self, n) for n in names))
