"""The checks behind the typed setting accessors of `tuneforge.config` (``get_float``, ``get_path``, ...).

A setting's kind is the return type that its coerce function declares (settings_schema.py, parsing.py), so
a new setting needs no second declaration here: its coerce function already says what its values are.
Reading a setting with the accessor of another kind is a programming error. It raises TypeError naming
the accessor to use, whatever the current value: an empty tuple or None would otherwise pass for several
kinds, and the mistake would surface only once someone sets the setting.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import TypeVar

from tuneforge.settings_schema import SETTINGS

T = TypeVar("T")

# Declared return type of a coerce function -> the accessor in tuneforge.config that reads such a setting.
ACCESSORS: dict[object, str] = {
    bool: "get_bool",
    int: "get_int",
    float: "get_float",
    str: "get_str",
    str | None: "get_optional_str",
    Path: "get_path",
    Path | None: "get_optional_path",
    tuple[str, ...]: "get_strs",
    tuple[int, ...]: "get_ints",
    tuple[Path, ...]: "get_paths",
}

_COERCERS = {s.name: s.coerce for s in SETTINGS}
_accessor_of: dict[str, str] = {}  # filled on first use


def _as_text(kind: object) -> str:
    """A type as a postponed annotation spells it: 'float', 'str | None', 'tuple[Path, ...]'."""
    return kind.__name__ if isinstance(kind, type) else str(kind).replace("pathlib.", "")


# The same table by annotation text: settings_schema and parsing postpone their annotations, and
# reading the text costs nothing, where resolving it (typing.get_type_hints) costs ~15 us a setting,
# which a warm start that reads a dozen settings would notice.
_BY_TEXT = {_as_text(kind): accessor for kind, accessor in ACCESSORS.items()}


def accessor_for(name: str) -> str:
    """The name of the `tuneforge.config` function that reads setting `name` (a declared setting)."""
    accessor = _accessor_of.get(name)
    if accessor is None:
        coerce = _COERCERS[name]
        declared: object = getattr(coerce, "__annotations__", {}).get("return")
        found = _BY_TEXT.get(declared) if isinstance(declared, str) else None
        if found is None:  # not postponed, or spelled another way: resolve it
            declared = typing.get_type_hints(coerce).get("return")
            found = ACCESSORS.get(declared)
        if found is None:
            raise TypeError(f"setting {name!r} holds values of type {declared!r}, which no typed accessor "
                            "reads: add one to tuneforge.config_values, or read it with config.get()")
        accessor = _accessor_of[name] = found
    return accessor


def _check_kind(name: str, accessor: str) -> None:
    expected = accessor_for(name)
    if expected != accessor:
        raise TypeError(f"setting {name!r} is read with config.{expected}(), not config.{accessor}()")


def _bad_value(name: str, accessor: str, value: object) -> TypeError:
    # Only the value's type is named: the value may be a secret (remote.secret).
    return TypeError(f"setting {name!r} holds a {type(value).__name__}, which config.{accessor}() cannot "
                     "return: its coerce function returns another type than it declares")


def _items(value: object, item_type: type[T]) -> tuple[T, ...] | None:
    """`value` as a tuple when it is a list or tuple of `item_type` (bools never count as ints), else None."""
    if isinstance(value, (list, tuple)) and all(isinstance(v, item_type) and not isinstance(v, bool) for v in value):
        return tuple(value)  # a tuple comes back as itself
    return None


def _one(name: str, accessor: str, value: object, kind: type[T]) -> T:
    """`value` when it is a `kind` (a bool is no int), after checking that `accessor` reads `name`."""
    _check_kind(name, accessor)
    if isinstance(value, kind) and (kind is bool or not isinstance(value, bool)):
        return value
    raise _bad_value(name, accessor, value)


def _optional(name: str, accessor: str, value: object, kind: type[T]) -> T | None:
    _check_kind(name, accessor)
    return None if value is None else _one(name, accessor, value, kind)


def _many(name: str, accessor: str, value: object, kind: type[T]) -> tuple[T, ...]:
    _check_kind(name, accessor)
    items = _items(value, kind)
    if items is None:
        raise _bad_value(name, accessor, value)
    return items


def as_bool(name: str, value: object) -> bool:
    return _one(name, "get_bool", value, bool)


def as_int(name: str, value: object) -> int:
    return _one(name, "get_int", value, int)


def as_float(name: str, value: object) -> float:
    _check_kind(name, "get_float")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise _bad_value(name, "get_float", value)


def as_str(name: str, value: object) -> str:
    return _one(name, "get_str", value, str)


def as_optional_str(name: str, value: object) -> str | None:
    return _optional(name, "get_optional_str", value, str)


def as_path(name: str, value: object) -> Path:
    return _one(name, "get_path", value, Path)


def as_optional_path(name: str, value: object) -> Path | None:
    return _optional(name, "get_optional_path", value, Path)


def as_strs(name: str, value: object) -> tuple[str, ...]:
    return _many(name, "get_strs", value, str)


def as_ints(name: str, value: object) -> tuple[int, ...]:
    return _many(name, "get_ints", value, int)


def as_paths(name: str, value: object) -> tuple[Path, ...]:
    return _many(name, "get_paths", value, Path)
