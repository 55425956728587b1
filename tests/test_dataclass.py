"""Our `dataclass` (subtask/model/dataclass.py) against the standard library's.

The standard module costs ~7 ms to import (it loads `inspect`) and compiles `__init__`,
`__repr__`, `__eq__` (and a frozen class's `__hash__`) from source for every class: ~0.15 ms each,
20 ms of a `start`'s ~100 ms of imports. Ours loads none of it, shares repr, equality and hashing,
and compiles an `__init__` when its class is first called. What a caller sees must not change: the
same construction, errors, repr, equality, hashing, frozenness, `fields`, `asdict` and `replace` on
the same classes; and every data class of ours uses it (a module importing the standard library's
data classes again fails here)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from subtask.model import dataclass as ours

SUBTASK = Path(__file__).resolve().parent.parent / "subtask"


def kinds(decorate, field=dataclasses.field):
    """The same class bodies, made by `decorate` and `field` (the standard library's or ours)."""

    @decorate
    class Plain:
        """Defaults, a factory, a field out of the repr and one out of the comparison."""

        name: str
        n: int = 0
        tags: list = field(default_factory=list)
        secret: str = field(default="x", repr=False)
        seen: float = field(default=0.0, compare=False)

    @decorate(frozen=True)
    class Frozen:
        """Frozen: hashed by its compared fields."""

        a: int
        b: tuple = ()
        note: str = field(default="", compare=False)

    @decorate
    class OwnMethods:
        """Its own repr and equality are kept."""

        v: int

        def __repr__(self) -> str:
            return f"<{self.v}>"

        def __eq__(self, other: object) -> bool:
            return isinstance(other, OwnMethods) and str(other.v)[-1:] == str(self.v)[-1:]

        def __hash__(self) -> int:
            return hash(str(self.v)[-1:])

    return Plain, Frozen, OwnMethods


def seen(value: object, call) -> object:
    try:
        return ("value", call(value))
    except Exception as exc:
        return ("raises", type(exc).__name__)


def field_row(f, missing) -> tuple:
    """A field's description, its "no default" spelled the same for both."""
    def spelled(value: object) -> object:
        return "MISSING" if value is missing else value

    return (f.name, f.type, spelled(f.default), spelled(f.default_factory), f.init, f.repr, f.hash, f.compare,
            dict(f.metadata))


def test_ours_behaves_as_the_standard_decorator():
    standard, mine = kinds(dataclasses.dataclass), kinds(ours.dataclass, ours.field)
    for std_cls, our_cls in zip(standard, mine, strict=True):
        for args in ([], [1], ["a"], ["a", 2, [1]], ["a", 2, [1], "s", 1.5], [(1,)], [1, (2,), "n"]):
            try:
                made = (std_cls(*args), std_cls(*args), our_cls(*args), our_cls(*args))
            except TypeError as refused:
                with pytest.raises(TypeError) as ours_refused:
                    our_cls(*args)
                assert str(ours_refused.value) == str(refused)
                continue
            std_a, std_b, our_a, our_b = made
            assert repr(our_a).replace("kinds.<locals>.", "") == repr(std_a).replace("kinds.<locals>.", "")
            assert (our_a == our_b) == (std_a == std_b)
            assert (our_a == object()) == (std_a == object())
            assert (our_a != our_b) == (std_a != std_b)
            std_sub, our_sub = type("Sub", (std_cls,), {}), type("Sub", (our_cls,), {})  # not data classes
            assert (our_a == our_sub(*args)) == (std_a == std_sub(*args))
            assert seen(our_a, hash)[0] == seen(std_a, hash)[0]
            if seen(std_a, hash)[0] == "value":
                assert (hash(our_a) == hash(our_b)) == (hash(std_a) == hash(std_b))
            for change in (lambda v: setattr(v, "a", 9), lambda v: delattr(v, "a"), lambda v: setattr(v, "z", 1)):
                assert seen(our_a, change)[0] == seen(std_a, change)[0]
                assert isinstance(our_a, std_cls) is False
            assert ours.asdict(our_a) == dataclasses.asdict(std_a)
            assert [(f.name, f.type, f.default, f.default_factory, f.init, f.repr, f.hash, f.compare, dict(f.metadata))
                    for f in ours.fields(our_a)] == \
                [(f.name, f.type, f.default if f.default is not dataclasses.MISSING else ours.MISSING,
                  f.default_factory if f.default_factory is not dataclasses.MISSING else ours.MISSING,
                  f.init, f.repr, f.hash, f.compare, dict(f.metadata)) for f in dataclasses.fields(std_a)]
            assert repr(ours.replace(our_a)) == repr(our_a)


CALLS = [((), {}), ((), {"name": "a"}), (("a",), {"n": 2}), (("a",), {"name": "b"}), ((), {"zzz": 1}),
         (("a",), {"tags": [1], "seen": 2.5}), ((), {"a": 1, "b": (2,)}), ((1,), {"b": (2,), "note": "x"}),
         ((1,), {"a": 2}), ((), {"v": 3}), ((3,), {"v": 3}), ((), {"self": 1}), (("a", 2, [1], "s", 1.5, 9), {})]


@pytest.mark.parametrize("made_before", [0, 40])
def test_every_call_builds_or_refuses_as_the_standard_init_does(made_before):
    """Positional and keyword arguments, missing, unknown and repeated ones, before the class's
    `__init__` is compiled (its first call, on classes made anew) and after (`made_before` calls
    first)."""
    for args, kwargs in CALLS:
        standard, mine = kinds(dataclasses.dataclass), kinds(ours.dataclass, ours.field)
        for std_cls, our_cls in zip(standard, mine, strict=True):
            for _ in range(made_before):
                our_cls(*([(1,)] if std_cls.__name__ == "Frozen" else [1]))
            try:
                expected = repr(std_cls(*args, **kwargs)).replace("kinds.<locals>.", "")
            except TypeError as refused:
                with pytest.raises(TypeError) as ours_refused:
                    our_cls(*args, **kwargs)
                assert str(ours_refused.value) == str(refused), (std_cls.__name__, args, kwargs)
                continue
            assert repr(our_cls(*args, **kwargs)).replace("kinds.<locals>.", "") == expected


def test_a_class_called_a_few_times_compiles_no_init(monkeypatch):
    """Compiling a class's `__init__` costs ~0.1 ms (7 classes in `list`, 22 in `start`): its first
    calls are bound by a shared function, and it is compiled only once called often."""
    compiled = []
    real = ours._compile_init
    monkeypatch.setattr(ours, "_compile_init", lambda cls, frozen: compiled.append(cls) or real(cls, frozen))
    _, Frozen, _ = kinds(ours.dataclass, ours.field)
    made = [Frozen(n, b=(n,)) for n in range(ours.COMPILE_AFTER - 1)]
    assert compiled == [] and [(m.a, m.b) for m in made[:2]] == [(0, (0,)), (1, (1,))]
    made += [Frozen(n) for n in range(3)]
    assert compiled == [Frozen] and made[-1] == Frozen(2, (), "other") and hash(made[-1]) == hash(Frozen(2))


def test_fields_out_of_the_comparison_do_not_count_and_other_classes_are_not_equal():
    plain, frozen, _ = kinds(ours.dataclass, ours.field)
    assert plain("a", seen=1.0) == plain("a", seen=2.0)
    assert plain("a", n=1) != plain("a", n=2)
    assert frozen(1, note="x") == frozen(1, note="y") and hash(frozen(1, note="x")) == hash(frozen(1, note="y"))
    assert len({frozen(1), frozen(1), frozen(2)}) == 2
    other_plain, _, _ = kinds(ours.dataclass, ours.field)
    assert plain("a") != other_plain("a")  # another class with the same fields


def test_a_recursive_record_repr_ends():
    plain, _, _ = kinds(ours.dataclass, ours.field)
    loop = plain("a")
    loop.tags.append(loop)
    assert "tags=[...]" in repr(loop)


def _imports_the_standard_library_data_classes(path: Path) -> bool:
    """Does the module load `dataclasses` when it runs (an import outside `if TYPE_CHECKING:`)?"""
    def loads(node: ast.AST) -> bool:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            return any(loads(n) for n in node.orelse)
        if isinstance(node, ast.ImportFrom) and node.module == "dataclasses":
            return True
        if isinstance(node, ast.Import) and any(alias.name == "dataclasses" for alias in node.names):
            return True
        return any(loads(n) for n in ast.iter_child_nodes(node))

    return loads(ast.parse(path.read_text()))


def test_every_data_class_of_ours_shares_its_methods():
    """A module that imports the standard library's data classes loads `dataclasses` (~7 ms)
    again, and its decorator compiles three methods a class."""
    ours_path = SUBTASK / "model" / "dataclass.py"
    found = sorted(str(p.relative_to(SUBTASK)) for p in SUBTASK.rglob("*.py")
                   if p != ours_path and _imports_the_standard_library_data_classes(p))
    assert found == [], "use subtask.model.dataclass"


def made(body: str, decorate, field, frozen: bool) -> object:
    """What defining `body` as a data class and calling it with no arguments gives: the
    instance's vars and repr, the class's match args and attributes; or the error (at the
    class's definition or its call)."""
    namespace = {"field": field}
    try:
        exec(f"class K:\n    'k'\n    {body}\n", namespace)
        cls = decorate(frozen=frozen)(namespace["K"])
        obj = cls()
        return vars(obj), repr(obj), cls.__match_args__, sorted(k for k in vars(cls) if not k.startswith("__"))
    except (TypeError, ValueError) as exc:
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("body", [
    "x: list = []",  # a mutable default
    "x: int = 0\n    y: int",  # a field without a default after one with
    "x = field(default=1)",  # a field without an annotation
    "x: int = field(default=1, default_factory=int)",
    "x: int = 1\n    y: 'ClassVar[int]' = 2\n    z: str = field(default='z', init=False)",
    "x: int = 1\n    y: list = field(default_factory=list, init=False)",
    "x: int = 3\n    def __post_init__(self):\n        object.__setattr__(self, 'seen', self.x * 2)",
    "x: int = 4\n    def __setattr__(self, name, value):\n        pass",  # frozen: refused
    "self: int = 5",  # a field named as the instance is, in __init__
])
@pytest.mark.parametrize("frozen", [False, True])
def test_a_class_is_made_and_refused_as_the_standard_decorator_makes_and_refuses_it(body, frozen):
    std = made(body, dataclasses.dataclass, dataclasses.field, frozen)
    mine = made(body, ours.dataclass, ours.field, frozen)
    assert mine == std


def test_inheritance_keeps_the_base_fields_order_and_a_subclass_calls_the_base_init():
    for decorate, field, fields in ((dataclasses.dataclass, dataclasses.field, dataclasses.fields),
                                    (ours.dataclass, ours.field, ours.fields)):
        @decorate
        class Base:
            """A base."""

            a: int
            b: str = "b"

        @decorate
        class Child(Base):
            """Overrides b's default, adds c."""

            b: str = "child"
            c: list = field(default_factory=list)

        class Plain(Child):
            """Not a data class: its own __init__ calls the data class's."""

            def __init__(self) -> None:
                super().__init__(1, c=[2])

        assert repr(Child(1)).endswith("Child(a=1, b='child', c=[])")
        assert repr(Plain()).endswith("Plain(a=1, b='child', c=[2])")
        assert [f.name for f in fields(Child)] == ["a", "b", "c"]
        with pytest.raises(TypeError, match="frozen"):
            decorate(frozen=True)(type("Frozen", (Base,), {"__doc__": "frozen on a non-frozen base"}))


@ours.dataclass(frozen=True)
class Pinned:
    """A module-level frozen record, pickled by reference as our records are (Ray sends them)."""

    a: int
    b: tuple = ()
    seen: list = ours.field(default_factory=list, compare=False)


def test_a_frozen_record_survives_pickling_and_replace_and_fields_check_their_arguments():
    import pickle

    record = Pinned(1, (2,), [3])
    assert pickle.loads(pickle.dumps(record)) == record
    assert pickle.loads(pickle.dumps(record)).seen == [3]
    assert ours.replace(record, a=5) == Pinned(5, (2,))
    assert ours.asdict(record) == {"a": 1, "b": (2,), "seen": [3]} and ours.asdict(record)["seen"] is not record.seen
    for bad in (lambda: ours.replace(record, nope=1), lambda: ours.replace(object()),
                lambda: ours.fields(object()), lambda: ours.asdict(Pinned), lambda: ours.dataclass(order=True)):
        with pytest.raises(TypeError):
            bad()


def test_ours_loads_neither_dataclasses_nor_inspect():
    """The ~7 ms it saves every command: making, calling and reading a record loads neither."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from subtask.model.dataclass import asdict, dataclass, field, fields, replace\n"
            "@dataclass(frozen=True)\n"
            "class A:\n"
            "    'a'\n"
            "    x: int\n"
            "    y: tuple = field(default_factory=tuple)\n"
            "a = replace(A(1), x=2)\n"
            "print(repr(a), hash(A(1)) == hash(A(1)), [f.name for f in fields(a)], asdict(a),"
            " sorted(m for m in ('dataclasses', 'inspect', 'typing') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "A(x=2, y=()) True ['x', 'y'] {'x': 2, 'y': ()} []"
