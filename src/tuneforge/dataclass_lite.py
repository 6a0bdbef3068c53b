"""`dataclass`: the standard decorator's classes, made at a quarter of its cost.

Python's `dataclasses.dataclass` writes the source of each method it adds (``__init__``, ``__repr__``,
``__eq__``, ``__hash__``, and a frozen class's ``__setattr__`` and ``__delattr__``) and compiles it with
`exec`: 1.25 ms for a frozen class of four fields on the 2-core CI machine. A warm start of the GPU GEMM
(a fresh process that finds its decision in the caches) loads 29 of them, 42 of its 75 ms of imports. Here
the standard decorator still does everything but compiling those methods except ``__init__`` (so fields,
defaults, factories, ``__post_init__``, `dataclasses.fields`, `replace` and `asdict` are its own); the
others are shared functions that read the class's fields: 0.3 ms a class.

What a class gets, as from the standard decorator with the same arguments (``order``, ``unsafe_hash``,
``slots`` and ``kw_only`` are not offered; use `dataclasses.dataclass` for those):

- ``eq`` (default): ``__eq__`` compares the fields with ``compare=True`` as a tuple, for instances of the
  very same class (else NotImplemented); ``__hash__`` hashes them when ``frozen``, and is None otherwise;
- ``repr`` (default): ``Name(field=value, ...)`` over the fields with ``repr=True``;
- ``frozen``: assigning or deleting an attribute raises `dataclasses.FrozenInstanceError`; ``__init__``
  sets each field once (``object.__setattr__``, as in a ``__post_init__``, still sets anything).

A method the class body defines itself is kept, as the standard decorator does.
"""

from __future__ import annotations

import dataclasses
import operator
import reprlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, overload

if TYPE_CHECKING:  # type checkers treat the classes as dataclasses (PEP 681)
    from typing_extensions import dataclass_transform
else:
    def dataclass_transform(**_: Any) -> Callable[[Any], Any]:
        return lambda decorator: decorator

__all__ = ["dataclass"]

T = TypeVar("T", bound=type)


@overload
def dataclass(cls: T, /) -> T: ...


@overload
def dataclass(*, frozen: bool = False, eq: bool = True, repr: bool = True) -> Callable[[T], T]: ...


@dataclass_transform(field_specifiers=(dataclasses.field, dataclasses.Field))
def dataclass(cls: T | None = None, /, *, frozen: bool = False, eq: bool = True,
              repr: bool = True) -> T | Callable[[T], T]:
    """`dataclasses.dataclass(cls, frozen=..., eq=..., repr=...)`, with the methods other than ``__init__`` shared
    rather than compiled per class (see the module)."""

    def wrap(klass: T) -> T:
        return _process(klass, frozen=frozen, eq=eq, repr=repr)

    return wrap if cls is None else wrap(cls)


def _process(cls: T, *, frozen: bool, eq: bool, repr: bool) -> T:
    own = dict(cls.__dict__)  # before the decorator adds anything: what the class body defined
    if frozen and ("__setattr__" in own or "__delattr__" in own):
        raise TypeError(f"cannot overwrite attribute __setattr__ or __delattr__ in frozen class {cls.__name__}")
    body_hash = own.get("__hash__", dataclasses.MISSING)
    explicit_hash = not (body_hash is dataclasses.MISSING or (body_hash is None and "__eq__" in own))
    dataclasses.dataclass(cls, init=True, repr=False, eq=False)  # fields, __init__, __match_args__, __doc__
    fields = dataclasses.fields(cls)
    if repr and "__repr__" not in own:
        cls.__repr__ = _repr_of([f.name for f in fields if f.repr])  # type: ignore[assignment]
    if eq:
        key = _getter([f.name for f in fields if f.compare])
        if "__eq__" not in own:
            cls.__eq__ = _eq_of(key)  # type: ignore[assignment]
        if not explicit_hash:
            hashed = _getter([f.name for f in fields if (f.compare if f.hash is None else f.hash)])
            cls.__hash__ = _hash_of(hashed) if frozen else None  # type: ignore[assignment]
    if frozen:
        cls.__setattr__ = _frozen_setattr  # type: ignore[assignment]
        cls.__delattr__ = _frozen_delattr  # type: ignore[assignment]
    return cls


def _getter(names: list[str]) -> Callable[[Any], tuple[Any, ...]]:
    """The tuple of these attributes of an object (attrgetter returns a bare value for one name)."""
    if not names:
        return lambda obj: ()
    if len(names) == 1:
        name = names[0]
        return lambda obj: (getattr(obj, name),)
    return operator.attrgetter(*names)


def _repr_of(names: list[str]) -> Callable[[Any], str]:
    @reprlib.recursive_repr()
    def __repr__(self: Any) -> str:
        return f"{type(self).__qualname__}(" + ", ".join(f"{name}={getattr(self, name)!r}" for name in names) + ")"

    return __repr__


def _eq_of(key: Callable[[Any], tuple[Any, ...]]) -> Callable[[Any, Any], Any]:
    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return key(self) == key(other)
        return NotImplemented

    return __eq__


def _hash_of(key: Callable[[Any], tuple[Any, ...]]) -> Callable[[Any], int]:
    def __hash__(self: Any) -> int:
        return hash(key(self))

    return __hash__


def _frozen_setattr(self: Any, name: str, value: Any) -> None:
    # __init__ sets each field once; anything else is an assignment to a frozen instance
    if name in type(self).__dataclass_fields__ and name not in self.__dict__:
        object.__setattr__(self, name, value)
        return
    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: Any, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
