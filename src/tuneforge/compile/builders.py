"""The kinds of build the build pool runs: each builder registers its build type here.

A build is plain data (a frozen dataclass such as `CppBuild`) that can be sent to a worker process;
its builder says how to name it (the artifact key, computed in the submitting process so that the
pool can de-duplicate) and how to build it (in the worker).  The C++ builder registers itself when
`tuneforge.compile.cpp` is imported, the GPU builders when theirs are: unpickling a build in a worker
imports its module, so a worker always knows every kind it is sent.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tuneforge.dataclass_lite import dataclass

__all__ = ["Builder", "builder_for", "kinds", "register"]


@dataclass(frozen=True)
class Builder:
    """How to key and build one kind of build."""

    key: Callable[[Any], str]  # the artifact key under the current settings
    build: Callable[[Any], tuple[str, Path, bool]]  # -> (key, path of the artifact's main file, compiled)


_builders: dict[type, Builder] = {}


def register(kind: type, key: Callable[[Any], str], build: Callable[[Any], tuple[str, Path, bool]]) -> None:
    """Make builds of type `kind` buildable by the pool (idempotent: a module imported twice re-registers)."""
    _builders[kind] = Builder(key, build)


def builder_for(build: object) -> Builder:
    """The builder of `build`'s type (or of its nearest registered base class); a TypeError naming the
    kinds there are for anything else."""
    builder = next((_builders[kind] for kind in type(build).__mro__ if kind in _builders), None)
    if builder is None:
        known = ", ".join(sorted(kind.__name__ for kind in _builders)) or "none registered"
        raise TypeError(f"the build pool builds {known}, not {type(build).__name__}")
    return builder


def kinds() -> tuple[type, ...]:
    return tuple(_builders)
