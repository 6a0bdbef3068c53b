"""Strategies by name: what `make("coordinate_descent", space)`, `select(..., strategy=)` and the command line's
--strategy mean."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tuneforge.search.genetic import Genetic
from tuneforge.search.local import CoordinateDescent, default
from tuneforge.search.model import ModelSearch
from tuneforge.search.space import Space
from tuneforge.search.strategy import Exhaustive, RandomSearch, Strategy

Factory = Callable[..., Strategy]
STRATEGIES: dict[str, Factory] = {
    "default": default, "exhaustive": Exhaustive, "random": RandomSearch, "coordinate_descent": CoordinateDescent,
    "genetic": Genetic, "model": ModelSearch,
}


def register(name: str, factory: Factory) -> None:
    """Make `factory(space, seed=..., **options)` available as strategy `name`."""
    STRATEGIES[name] = factory


def names() -> list[str]:
    """Every strategy's name."""
    return sorted(STRATEGIES)


def make(name: str, space: Space, seed: int = 0, **options: Any) -> Strategy:
    """The strategy called `name` over `space` (`options` are the strategy's own keyword arguments)."""
    factory = STRATEGIES.get(name)
    if factory is None:
        raise ValueError(f"unknown search strategy {name!r}: choose one of {', '.join(names())}")
    try:
        return factory(space, seed=seed, **options)
    except TypeError as exc:
        raise ValueError(f"strategy {name!r}: {exc}") from None
