"""Our `dataclass` (subtask/model/dataclass.py) against the standard library's.

The standard decorator compiles `__repr__`, `__eq__` (and a frozen class's `__hash__`) from source
for every class: ~0.15 ms each, 20 ms of a `start`'s ~100 ms of imports. Ours shares one of each.
What a caller sees must not change: the same repr, equality, hashing and frozenness on the same
classes; and every data class of ours uses it (a module importing the standard decorator again
fails here)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from subtask.model import dataclass as ours

SUBTASK = Path(__file__).resolve().parent.parent / "subtask"


def kinds(decorate):
    """The same class bodies, made by `decorate` (the standard decorator or ours)."""

    @decorate
    class Plain:
        """Defaults, a factory, a field out of the repr and one out of the comparison."""

        name: str
        n: int = 0
        tags: list = dataclasses.field(default_factory=list)
        secret: str = dataclasses.field(default="x", repr=False)
        seen: float = dataclasses.field(default=0.0, compare=False)

    @decorate(frozen=True)
    class Frozen:
        """Frozen: hashed by its compared fields."""

        a: int
        b: tuple = ()
        note: str = dataclasses.field(default="", compare=False)

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


def test_ours_behaves_as_the_standard_decorator():
    standard, mine = kinds(dataclasses.dataclass), kinds(ours.dataclass)
    for std_cls, our_cls in zip(standard, mine, strict=True):
        for args in ([], [1], ["a"], ["a", 2, [1]], ["a", 2, [1], "s", 1.5], [(1,)], [1, (2,), "n"]):
            try:
                made = (std_cls(*args), std_cls(*args), our_cls(*args), our_cls(*args))
            except TypeError:
                with pytest.raises(TypeError):
                    our_cls(*args)
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
            assert seen(our_a, lambda v: setattr(v, "a", 9)) == seen(std_a, lambda v: setattr(v, "a", 9))
            assert dataclasses.asdict(our_a) == dataclasses.asdict(std_a)
            assert [f.name for f in dataclasses.fields(our_a)] == [f.name for f in dataclasses.fields(std_a)]


def test_fields_out_of_the_comparison_do_not_count_and_other_classes_are_not_equal():
    plain, frozen, _ = kinds(ours.dataclass)
    assert plain("a", seen=1.0) == plain("a", seen=2.0)
    assert plain("a", n=1) != plain("a", n=2)
    assert frozen(1, note="x") == frozen(1, note="y") and hash(frozen(1, note="x")) == hash(frozen(1, note="y"))
    assert len({frozen(1), frozen(1), frozen(2)}) == 2
    other_plain, _, _ = kinds(ours.dataclass)
    assert plain("a") != other_plain("a")  # another class with the same fields


def test_a_recursive_record_repr_ends():
    plain, _, _ = kinds(ours.dataclass)
    loop = plain("a")
    loop.tags.append(loop)
    assert "tags=[...]" in repr(loop)


def _imports_the_standard_decorator(path: Path) -> bool:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "dataclasses" \
                and any(alias.name == "dataclass" for alias in node.names):
            return True
        if isinstance(node, ast.Attribute) and node.attr == "dataclass" \
                and isinstance(node.value, ast.Name) and node.value.id == "dataclasses":
            return True
    return False


def test_every_data_class_of_ours_shares_its_methods():
    """A module that decorates with the standard `dataclass` compiles three methods a class again."""
    ours_path = SUBTASK / "model" / "dataclass.py"
    found = sorted(str(p.relative_to(SUBTASK)) for p in SUBTASK.rglob("*.py")
                   if p != ours_path and _imports_the_standard_decorator(p))
    assert found == [], "use subtask.model.dataclass.dataclass"
