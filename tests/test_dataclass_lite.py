"""tuneforge.dataclass_lite.dataclass behaves as dataclasses.dataclass with the same arguments, and compiles
no method but __init__ per class."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from dataclasses import field
from typing import Any

import pytest

from tuneforge.dataclass_lite import dataclass


@dataclass(frozen=True)
class Point:
    x: int
    y: int = 0
    tags: tuple[str, ...] = ()
    note: str = field(default="", compare=False, repr=False)


@dataclasses.dataclass(frozen=True)
class StdPoint:
    x: int
    y: int = 0
    tags: tuple[str, ...] = ()
    note: str = field(default="", compare=False, repr=False)


@dataclass
class Bag:
    name: str
    items: list[int] = field(default_factory=list)
    size: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        self.size = len(self.items)


@dataclass(frozen=True)
class Derived(Point):
    z: int = 0
    total: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "total", self.x + self.y + self.z)


@dataclass(frozen=True)
class OwnMethods:
    key: str
    payload: Any = None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OwnMethods) and other.key == self.key

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"<{self.key}>"


@dataclass(eq=False)
class Identity:
    value: int


def test_equality_hash_and_repr_match_the_standard_decorator() -> None:
    ours, theirs = Point(1, 2, ("a",), note="n"), StdPoint(1, 2, ("a",), note="n")
    assert repr(ours) == repr(theirs).replace("StdPoint", "Point") == "Point(x=1, y=2, tags=('a',))"
    assert ours == Point(1, 2, ("a",), note="other")  # note: compare=False
    assert hash(ours) == hash(Point(1, 2, ("a",))) == hash(theirs)
    assert ours != Point(1, 3, ("a",)) and ours != (1, 2, ("a",)) and ours != theirs
    assert dataclasses.is_dataclass(ours) and [f.name for f in dataclasses.fields(ours)] == ["x", "y", "tags", "note"]
    assert dataclasses.asdict(ours) == dataclasses.asdict(theirs)
    assert dataclasses.replace(ours, y=5) == Point(1, 5, ("a",)) and Point.__match_args__ == StdPoint.__match_args__


def test_frozen_instances_refuse_assignment_and_deletion() -> None:
    point = Point(1)
    with pytest.raises(dataclasses.FrozenInstanceError, match="'x'"):
        point.x = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.extra = 1  # type: ignore[attr-defined]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del point.y  # type: ignore[misc]
    assert point.x == 1 and not hasattr(point, "extra")


def test_init_defaults_factories_post_init_and_inheritance() -> None:
    first, second = Bag("a"), Bag("b", [1, 2])
    first.items.append(3)
    assert second.size == 2 and Bag("c").items == [] and first.items is not Bag("d").items
    with pytest.raises(TypeError):
        Bag()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        Bag("a", [], size=1)  # type: ignore[call-arg]
    derived = Derived(1, 2, z=3)
    assert derived.total == 6 and repr(derived) == "Derived(x=1, y=2, tags=(), z=3, total=6)"
    assert derived != Point(1, 2) and hash(derived) == hash(Derived(1, 2, z=3))
    with pytest.raises(dataclasses.FrozenInstanceError):
        derived.z = 4  # type: ignore[misc]


def test_mutable_classes_are_unhashable_and_eq_false_keeps_identity() -> None:
    bag = Bag("a")
    bag.name = "b"
    assert bag == Bag("b") and Bag.__hash__ is None
    with pytest.raises(TypeError):
        hash(bag)
    assert Identity(1) != Identity(1) and hash(Identity(1)) != 0 and repr(Identity(1)) == "Identity(value=1)"


def test_methods_of_the_class_body_are_kept() -> None:
    assert OwnMethods("k", 1) == OwnMethods("k", 2) and hash(OwnMethods("k")) == hash("k")
    assert repr(OwnMethods("k")) == "<k>"
    with pytest.raises(TypeError, match="__setattr__"):
        @dataclass(frozen=True)
        class Guarded:
            value: int

            def __setattr__(self, name: str, value: Any) -> None:
                object.__setattr__(self, name, value)


def test_pickle_and_copy_round_trip() -> None:
    for obj in (Point(1, 2, ("t",)), Derived(1, z=2), Bag("x", [1])):
        assert pickle.loads(pickle.dumps(obj)) == obj and copy.copy(obj) == obj and copy.deepcopy(obj) == obj


def test_no_method_is_compiled_per_class() -> None:
    """What makes the decorator cheap: the methods are closures over shared code, and frozen classes share one
    __setattr__; the standard decorator would compile each from source it writes per class."""
    assert Point.__init__.__code__ is Derived.__init__.__code__ is Bag.__init__.__code__
    assert Point.__eq__.__code__ is Derived.__eq__.__code__ is Bag.__eq__.__code__
    assert Point.__hash__.__code__ is Derived.__hash__.__code__  # type: ignore[union-attr]
    assert Point.__setattr__ is Derived.__setattr__ and Point.__delattr__ is Derived.__delattr__
    assert StdPoint.__init__.__code__ is not Point.__init__.__code__


def test_init_argument_errors_name_the_argument() -> None:
    with pytest.raises(TypeError, match="missing required argument: 'x'"):
        Point()  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="unexpected keyword argument 'w'"):
        Point(1, w=2)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="multiple values for argument 'x'"):
        Point(1, x=2)  # type: ignore[misc]
    with pytest.raises(TypeError, match="takes 5 positional arguments but 6 were given"):
        Point(1, 2, (), "n", "extra")  # type: ignore[call-arg]
    assert Point(y=2, x=1) == Point(1, 2) and Point.__doc__ == "Point(x, y, tags, note)"


def test_the_class_signature_lists_the_init_fields_as_the_standard_one_does() -> None:
    import inspect

    assert str(inspect.signature(Point)) == str(inspect.signature(StdPoint))
    assert str(inspect.signature(Bag)) == "(name: 'str', items: 'list[int]' = <factory>) -> None"


def test_a_mutable_class_sets_its_fields_through_its_own_setattr() -> None:
    seen: list[str] = []

    @dataclass
    class Watched:
        a: int
        b: int = 2

        def __setattr__(self, name: str, value: Any) -> None:
            seen.append(name)
            object.__setattr__(self, name, value)

    assert Watched(1).b == 2 and seen == ["a", "b"]
