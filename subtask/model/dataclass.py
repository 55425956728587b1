"""`dataclass`, `field`, `fields`, `replace`, `asdict`: the standard library's data classes, made
without loading the `dataclasses` module and without compiling a method a class never runs.

The standard module costs every command ~7 ms before its first class (it loads `inspect`, and
with it `ast`, `dis`, `tokenize`), then compiles each class's `__init__`, `__repr__`, `__eq__`
(and a frozen class's `__hash__`, `__setattr__`, `__delattr__`) from source, ~0.15 ms each:
140 for the 34 classes a `start` loads, most of which it never makes. Here repr, equality,
hashing and frozenness are shared functions reading the class's fields. A class's first calls
are bound by a shared function (`_bind`: what the compiled `__init__` would do with a call it
accepts); its `__init__` is written and compiled, the same source the standard library would
write, at its `COMPILE_AFTER`th call or at the first call the binder does not take, which the
compiled one then refuses in the standard library's words. Compiling one costs ~0.1 ms: a
`list` calls 7 classes a few times each, a `start` 22.

Invariants:
- Never behave otherwise than the standard decorator on what we use (`frozen=`, `field(default=,
  default_factory=, init=, repr=, hash=, compare=, metadata=)`, `__post_init__`, inheritance,
  `ClassVar` left out): the same `__init__` signature and errors, repr of the fields with
  `repr=True` as `Name(a=1, b='x')` ("..." where a record holds itself), equality of the same
  class's `compare=True` fields (else NotImplemented), unhashable unless frozen, then hashed by
  those fields; a method the class body defines is kept, as the standard decorator keeps it
  (`tests/test_dataclass.py` compares the two on the same classes). Any other option is refused
  with a TypeError, never approximated.
- Never import `dataclasses` (nor `typing`, `inspect`): this module is on every command's path,
  and the reading commands' import budget (tests/test_imports.py) forbids them. Our classes are
  ours to read with the functions here; `dataclasses.fields()` on them is not supported. Type
  checkers are shown the standard library's names.
"""

from __future__ import annotations

import _thread
import sys

TYPE_CHECKING = False  # not `typing`'s: this module is on every command's path
COMPILE_AFTER = 16  # calls of a class's `__init__` bound by `_bind` before it is compiled
if TYPE_CHECKING:
    from dataclasses import MISSING as MISSING
    from dataclasses import Field as Field
    from dataclasses import FrozenInstanceError as FrozenInstanceError
    from dataclasses import asdict as asdict
    from dataclasses import dataclass as dataclass
    from dataclasses import field as field
    from dataclasses import fields as fields
    from dataclasses import replace as replace
    from typing import Any
else:
    class _Missing:
        """No default (the standard library's `MISSING`)."""

        __slots__ = ()

        def __repr__(self):
            return "MISSING"

    MISSING = _Missing()
    _HAS_FACTORY = _Missing()  # an `__init__` parameter's default where a factory makes the value
    _MappingProxy = type(type.__dict__)  # types.MappingProxyType, without `types`
    _EMPTY = _MappingProxy({})

    class FrozenInstanceError(AttributeError):
        """An assignment to a field of a frozen data class."""

    class Field:
        """One field of a data class: what `field()` was given, and its name and annotation."""

        __slots__ = ("name", "type", "default", "default_factory", "init", "repr", "hash", "compare",
                     "metadata", "kw_only")

        def __init__(self, default, default_factory, init, repr, hash, compare, metadata):
            self.name = self.type = None
            self.default, self.default_factory, self.init = default, default_factory, init
            self.repr, self.hash, self.compare, self.kw_only = repr, hash, compare, False
            self.metadata = _EMPTY if not metadata else _MappingProxy(metadata)

        def __repr__(self):
            return (f"Field(name={self.name!r},type={self.type!r},default={self.default!r},"
                    f"default_factory={self.default_factory!r},init={self.init!r},repr={self.repr!r},"
                    f"hash={self.hash!r},compare={self.compare!r},metadata={self.metadata!r})")

    def field(*, default=MISSING, default_factory=MISSING, init=True, repr=True, hash=None, compare=True,
              metadata=None):
        """A field with a default, a factory, or out of `__init__`, the repr or the comparison."""
        if default is not MISSING and default_factory is not MISSING:
            raise ValueError("cannot specify both default and default_factory")
        return Field(default, default_factory, init, repr, hash, compare, metadata)

    def fields(class_or_instance):
        try:
            found = class_or_instance.__dataclass_fields__
        except AttributeError:
            raise TypeError("must be called with a dataclass type or instance") from None
        return tuple(found.values())

    def replace(obj, /, **changes):
        if not hasattr(type(obj), "__dataclass_fields__"):
            raise TypeError("replace() should be called on dataclass instances")
        for f in fields(obj):
            if not f.init:
                if f.name in changes:
                    raise ValueError(f"field {f.name} is declared with init=False, it cannot be specified with "
                                     "replace()")
            elif f.name not in changes:
                changes[f.name] = getattr(obj, f.name)
        return obj.__class__(**changes)

    def asdict(obj, *, dict_factory=dict):
        if not hasattr(type(obj), "__dataclass_fields__"):
            raise TypeError("asdict() should be called on dataclass instances")
        return _asdict(obj, dict_factory)

    def _asdict(obj, dict_factory):
        if hasattr(type(obj), "__dataclass_fields__"):
            return dict_factory([(f.name, _asdict(getattr(obj, f.name), dict_factory)) for f in fields(obj)])
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):  # a named tuple
            return type(obj)(*[_asdict(v, dict_factory) for v in obj])
        if isinstance(obj, (list, tuple)):
            return type(obj)(_asdict(v, dict_factory) for v in obj)
        if isinstance(obj, dict):
            return type(obj)((_asdict(k, dict_factory), _asdict(v, dict_factory)) for k, v in obj.items())
        import copy  # only `asdict` needs it, as the standard library does for every other value
        return copy.deepcopy(obj)

    class _Params:
        """What the class was made with (the standard library's `__dataclass_params__`)."""

        __slots__ = ("frozen",)

        def __init__(self, frozen):
            self.frozen = frozen

    def dataclass(cls=None, /, *, frozen=False, **options):
        """`dataclasses.dataclass(cls)` or `(frozen=True)`; any other option is refused."""
        if options:
            raise TypeError(f"subtask.model.dataclass takes frozen= only, not {', '.join(sorted(options))}")

        def wrap(body):
            return _make(body, frozen)

        return wrap if cls is None else wrap(cls)

    def _make(cls, frozen):
        own = cls.__dict__
        found = {}
        for base in cls.__mro__[-1:0:-1]:
            base_fields = getattr(base, "__dataclass_fields__", None)
            if base_fields is not None:
                if base.__dataclass_params__.frozen != frozen:
                    raise TypeError("cannot inherit frozen dataclass from a non-frozen one" if frozen
                                    else "cannot inherit non-frozen dataclass from a frozen one")
                found.update(base_fields)
        annotations = own.get("__annotations__", {})
        for name, value in own.items():
            if isinstance(value, Field) and name not in annotations:
                raise TypeError(f"{name!r} is a field but has no type annotation")
        for name, annotation in annotations.items():
            if _is_classvar(annotation):
                continue
            made = _own_field(cls, name, annotation)
            found[name] = made
            if isinstance(own.get(name), Field):
                if made.default is MISSING:
                    delattr(cls, name)
                else:
                    setattr(cls, name, made.default)
        cls.__dataclass_fields__ = found
        cls.__dataclass_params__ = _Params(frozen)
        _check_order(found.values())
        if "__init__" not in own:
            cls.__init__ = _init_on_first_call(cls, frozen)
        if "__repr__" not in own:
            cls.__repr__ = _repr
        own_hash = own.get("__hash__", MISSING)
        explicit_hash = not (own_hash is MISSING or (own_hash is None and "__eq__" in own))
        if "__eq__" not in own:
            cls.__eq__ = _eq
        if not explicit_hash:
            cls.__hash__ = _hash if frozen else None
        if frozen:
            for name in ("__setattr__", "__delattr__"):
                if name in own:
                    raise TypeError(f"Cannot overwrite attribute {name} in class {cls.__name__}")
            cls.__setattr__, cls.__delattr__ = _frozen_methods(cls, frozenset(found))
        if "__match_args__" not in own:
            cls.__match_args__ = tuple(f.name for f in found.values() if f.init)
        return cls

    def _is_classvar(annotation):
        if isinstance(annotation, str):
            head = annotation.split("[", 1)[0].strip()
            last = head.rpartition(".")[2]
            if last in ("InitVar", "KW_ONLY"):
                raise TypeError(f"subtask.model.dataclass does not take {last} fields")
            return last == "ClassVar"
        typing = sys.modules.get("typing")
        return typing is not None and (annotation is typing.ClassVar
                                       or getattr(annotation, "__origin__", None) is typing.ClassVar)

    def _own_field(cls, name, annotation):
        default = cls.__dict__.get(name, MISSING)
        if isinstance(default, Field):
            made = default
        elif type(default).__module__ == "dataclasses":
            raise TypeError(f"field {name}: the standard library's field() in our data class: use "
                            "subtask.model.dataclass.field")
        else:
            if type(default).__name__ == "member_descriptor":  # a __slots__ entry, not a default
                default = MISSING
            made = field(default=default)
        made.name, made.type = name, annotation
        if made.default is not MISSING and made.default.__class__.__hash__ is None:
            raise ValueError(f"mutable default {type(made.default)} for field {name} is not allowed: use "
                             "default_factory")
        return made

    def _check_order(all_fields):
        seen_default = False
        for f in all_fields:
            if not f.init:
                continue
            if f.default is not MISSING or f.default_factory is not MISSING:
                seen_default = True
            elif seen_default:
                raise TypeError(f"non-default argument {f.name!r} follows default argument")

    def _init_on_first_call(cls, frozen):
        calls = 0

        def __init__(__dataclass_self__, *args, **kwargs):
            nonlocal calls
            calls += 1
            if calls < COMPILE_AFTER and _bind(cls, frozen, __dataclass_self__, args, kwargs):
                return
            made = _compile_init(cls, frozen)
            if cls.__dict__.get("__init__") is __init__:
                type.__setattr__(cls, "__init__", made)
            made(__dataclass_self__, *args, **kwargs)

        __init__.__qualname__ = f"{cls.__qualname__}.__init__"
        return __init__

    def _bind(cls, frozen, self, args, kwargs):
        """What the compiled `__init__` does with a call it accepts, without compiling it: False,
        having set nothing, for a call it would refuse (the compiled one then says why, in the
        standard library's words)."""
        all_fields = cls.__dataclass_fields__.values()
        params = [f for f in all_fields if f.init]
        if len(args) > len(params):
            return False
        given = {f.name: value for f, value in zip(params, args, strict=False)}  # args may be fewer
        names = {f.name for f in params}
        for name, value in kwargs.items():
            if name not in names or name in given:
                return False
            given[name] = value
        if any(f.name not in given and f.default is MISSING and f.default_factory is MISSING for f in params):
            return False
        put = object.__setattr__ if frozen else setattr
        for f in all_fields:
            if f.init and f.name in given:
                put(self, f.name, given[f.name])
            elif f.default_factory is not MISSING:
                put(self, f.name, f.default_factory())
            elif f.init:
                put(self, f.name, f.default)
        if hasattr(cls, "__post_init__"):
            self.__post_init__()
        return True

    def _compile_init(cls, frozen):
        """The `__init__` the standard library writes for `cls`, compiled now."""
        all_fields = tuple(cls.__dataclass_fields__.values())
        self_name = "__dataclass_self__" if "self" in cls.__dataclass_fields__ else "self"
        namespace = {"__dataclass_HAS_FACTORY__": _HAS_FACTORY, "__dataclass_object_setattr__": object.__setattr__}
        params, body = [self_name], []
        for f in all_fields:
            default_name = f"__dataclass_dflt_{f.name}__"
            if f.default_factory is not MISSING:
                namespace[default_name] = f.default_factory
                param = f"{f.name}=__dataclass_HAS_FACTORY__"
                value = f"{default_name}() if {f.name} is __dataclass_HAS_FACTORY__ else {f.name}"
                if not f.init:
                    value = f"{default_name}()"
            elif not f.init:
                continue  # the class attribute is its default (or it has none)
            elif f.default is not MISSING:
                namespace[default_name] = f.default
                param, value = f"{f.name}={default_name}", f.name
            else:
                param, value = f.name, f.name
            if f.init:
                params.append(param)
            body.append(f"__dataclass_object_setattr__({self_name}, {f.name!r}, {value})" if frozen
                        else f"{self_name}.{f.name} = {value}")
        if hasattr(cls, "__post_init__"):
            body.append(f"{self_name}.__post_init__()")
        source = f"def __init__({', '.join(params)}):\n" + "".join(f"    {line}\n" for line in body or ["pass"])
        exec(source, namespace)  # noqa: S102 - our own source, made of field names (identifiers)
        made = namespace["__init__"]
        made.__qualname__ = f"{cls.__qualname__}.__init__"
        made.__module__ = cls.__module__
        return made

    def _frozen_methods(cls, names):
        def __setattr__(self, name, value):
            if type(self) is cls or name in names:
                raise FrozenInstanceError(f"cannot assign to field {name!r}")
            super(cls, self).__setattr__(name, value)

        def __delattr__(self, name):
            if type(self) is cls or name in names:
                raise FrozenInstanceError(f"cannot delete field {name!r}")
            super(cls, self).__delattr__(name)

        __setattr__.__qualname__ = f"{cls.__qualname__}.__setattr__"
        __delattr__.__qualname__ = f"{cls.__qualname__}.__delattr__"
        return __setattr__, __delattr__


_in_repr: set[tuple[int, int]] = set()


def _repr(self: Any) -> str:
    key = (id(self), _thread.get_ident())
    if key in _in_repr:
        return "..."
    _in_repr.add(key)
    try:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr)
    finally:
        _in_repr.discard(key)
    return f"{type(self).__qualname__}({shown})"


_compared: dict[type, tuple[str, ...]] = {}  # per class: the fields its equality compares
_hashed: dict[type, tuple[str, ...]] = {}  # per frozen class: the fields its hash reads


def _compared_names(cls: Any) -> tuple[str, ...]:
    names = _compared.get(cls)
    if names is None:
        names = _compared[cls] = tuple(f.name for f in fields(cls) if f.compare)
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
        names = _hashed[cls] = tuple(f.name for f in fields(cls) if (f.compare if f.hash is None else f.hash))
    return hash(tuple(getattr(self, n) for n in names))
