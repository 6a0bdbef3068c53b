"""`dataclass`: the standard decorator's classes, made at a tenth of its cost.

Python's `dataclasses.dataclass` writes the source of each method it adds (``__init__``, ``__repr__``,
``__eq__``, ``__hash__``, and a frozen class's ``__setattr__`` and ``__delattr__``) and compiles it with
`exec`: 1.25 ms for a frozen class of four fields on the 2-core CI machine. A warm start of the GPU GEMM
(a fresh process that finds its decision in the caches) loads 29 of them, 42 of its 75 ms of imports. Here
the standard decorator still collects the fields (so `dataclasses.fields`, `replace`, `asdict` and
`is_dataclass` work as ever, and a mutable default is refused as ever), but compiles nothing: the methods
are closures over each class's field list: 0.1 ms a class. Making an instance costs about 1 us more.

What a class gets, as from the standard decorator with the same arguments (``order``, ``unsafe_hash``,
``slots``, ``kw_only`` and `dataclasses.InitVar` are not offered; use `dataclasses.dataclass` for those):

- ``__init__`` over the fields with ``init=True`` in order, positional or by name, with their defaults and
  default factories; fields with ``init=False`` and a default get it; then ``__post_init__()`` if defined;
- ``eq`` (default): ``__eq__`` compares the fields with ``compare=True`` as a tuple, for instances of the
  very same class (else NotImplemented); ``__hash__`` hashes them when ``frozen``, and is None otherwise;
- ``repr`` (default): ``Name(field=value, ...)`` over the fields with ``repr=True``;
- ``frozen``: assigning or deleting an attribute raises `dataclasses.FrozenInstanceError` (``__init__`` and a
  ``__post_init__`` set attributes with ``object.__setattr__``, as the standard ones do).

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
    """`dataclasses.dataclass(cls, frozen=..., eq=..., repr=...)`, with its methods made without compiling
    anything (see the module)."""

    def wrap(klass: T) -> T:
        return _process(klass, frozen=frozen, eq=eq, repr=repr)

    return wrap if cls is None else wrap(cls)


def _process(cls: T, *, frozen: bool, eq: bool, repr: bool) -> T:
    own = dict(cls.__dict__)  # before the decorator adds anything: what the class body defined
    if frozen and ("__setattr__" in own or "__delattr__" in own):
        raise TypeError(f"cannot overwrite attribute __setattr__ or __delattr__ in frozen class {cls.__name__}")
    body_hash = own.get("__hash__", dataclasses.MISSING)
    explicit_hash = not (body_hash is dataclasses.MISSING or (body_hash is None and "__eq__" in own))
    doc = own.get("__doc__")
    cls.__doc__ = doc or cls.__name__  # else the standard decorator asks inspect for a signature (0.1 ms)
    dataclasses.dataclass(cls, init=False, repr=False, eq=False)  # fields, __match_args__
    fields = dataclasses.fields(cls)
    if not doc:
        cls.__doc__ = f"{cls.__name__}({', '.join(f.name for f in fields if f.init)})"
    if "__init__" not in own:
        cls.__init__ = _init_of(cls, fields, frozen)  # type: ignore[misc]
        cls.__signature__ = _SIGNATURE  # type: ignore[attr-defined]
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


_UNSET = object()


class _Factory:
    def __repr__(self) -> str:
        return "<factory>"


class _Signature:
    """``inspect.signature(cls)`` (help(), IDEs): the init fields, as the standard decorator's ``__init__`` shows
    them; made when asked, since making it for every class would cost what the decorator saves."""

    def __get__(self, instance: Any, owner: type) -> Any:
        import inspect

        kind, factory = inspect.Parameter.POSITIONAL_OR_KEYWORD, _Factory()

        def shown(default: tuple[bool, Any] | None) -> Any:
            return inspect.Parameter.empty if default is None else factory if default[0] else default[1]

        return inspect.Signature([inspect.Parameter(f.name, kind, annotation=f.type, default=shown(_default_of(f)))
                                  for f in dataclasses.fields(owner) if f.init], return_annotation=None)


_SIGNATURE = _Signature()


def _default_of(f: dataclasses.Field[Any]) -> tuple[bool, Any] | None:
    """None (no default), (False, value) or (True, factory)."""
    if f.default is not dataclasses.MISSING:
        return False, f.default
    if f.default_factory is not dataclasses.MISSING:
        return True, f.default_factory
    return None


def _init_of(cls: type, fields: tuple[dataclasses.Field[Any], ...], frozen: bool) -> Callable[..., None]:
    init_fields = [f for f in fields if f.init]
    names = tuple(f.name for f in init_fields)
    count, index = len(names), {name: i for i, name in enumerate(names)}
    defaults = [_default_of(f) for f in init_fields]  # None: a required argument
    # fields with init=False get their default; without one they stay unset
    rest = [(f.name, default) for f in fields if not f.init and (default := _default_of(f)) is not None]
    post_init = hasattr(cls, "__post_init__")
    put = object.__setattr__ if frozen else setattr  # a mutable class's own __setattr__ sees its fields set
    where = f"{cls.__qualname__}.__init__()"

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        given = len(args)
        if given == count and not kwargs:
            for name, value in zip(names, args, strict=True):
                put(self, name, value)
        else:
            if given > count:
                raise TypeError(f"{where} takes {count + 1} positional arguments but {given + 1} were given")
            values = [*args, *([_UNSET] * (count - given))]
            for key, value in kwargs.items():
                i = index.get(key)
                if i is None:
                    raise TypeError(f"{where} got an unexpected keyword argument {key!r}")
                if values[i] is not _UNSET:
                    raise TypeError(f"{where} got multiple values for argument {key!r}")
                values[i] = value
            for name, value, default in zip(names, values, defaults, strict=True):
                if value is _UNSET:
                    if default is None:
                        raise TypeError(f"{where} missing required argument: {name!r}")
                    value = default[1]() if default[0] else default[1]
                put(self, name, value)
        for name, (call, value) in rest:
            put(self, name, value() if call else value)
        if post_init:
            self.__post_init__()

    return __init__


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
    raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")


def _frozen_delattr(self: Any, name: str) -> None:
    raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
