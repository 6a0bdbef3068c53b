"""The interface every search strategy has, ask / tell, and the two that need no model of the space.

``ask(n)`` proposes up to n configurations not proposed before (fewer when that is all it has now; none when
it is done); ``tell(config, cost)`` reports one's cost (lower is better; None, a NaN or an infinity: it failed).
A strategy never proposes a configuration twice, so a batch of asks can be built and timed in parallel. What
the strategy does with the costs is its own: the driver (`search.driver`) owns budgets, pruning and timing.
Strategies are made by name in `search.registry`.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

from tuneforge.search.space import Config, Space

FAILED = math.inf  # the cost a failed configuration is told as


def cost_of(value: float | None) -> float:
    """A told cost as the strategies compare it: failures and non-positive or non-finite costs are FAILED."""
    if value is None or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return FAILED
    return float(value)


class Strategy:
    """Base class: bookkeeping of what was proposed and told, and the best so far. Subclasses implement
    `_propose(n)` (fresh configurations only) and may react in `_told`."""

    name: ClassVar[str] = ""

    def __init__(self, space: Space, seed: int = 0) -> None:
        self.space = space
        self.rng = random.Random(seed)
        self.costs: dict[tuple[Any, ...], float] = {}  # told
        self.pending: dict[tuple[Any, ...], Config] = {}  # asked, not told yet
        self.best: Config | None = None
        self.best_cost = FAILED

    def ask(self, n: int = 1) -> list[Config]:
        if n < 1:
            raise ValueError(f"ask({n}): ask for at least one configuration")
        proposed = []
        for config in self._propose(n):
            key = self.space.key(config)
            if key not in self.costs and key not in self.pending:  # a subclass's slip must not re-time anything
                self.pending[key] = config
                proposed.append(config)
        return proposed

    def tell(self, config: Mapping[str, Any], cost: float | None) -> None:
        key = self.space.key(config)
        if key not in self.pending:
            raise ValueError(f"tell({dict(config)}): this configuration was not asked for (or was told already)")
        del self.pending[key]
        value = cost_of(cost)
        self.costs[key] = value
        if value < self.best_cost:
            self.best, self.best_cost = dict(config), value
        self._told(dict(config), value)

    def suggest(self, configs: Sequence[Mapping[str, Any]]) -> None:
        """Configurations a kernel family's heuristics would pick (its default space), given before the first
        ask: strategies that start somewhere (coordinate descent, the default) start from them; the others
        ignore them."""

    def seen(self, config: Mapping[str, Any]) -> bool:
        key = self.space.key(config)
        return key in self.costs or key in self.pending

    def exclude(self) -> set[tuple[Any, ...]]:
        """Keys of every configuration proposed so far (for sampling fresh ones)."""
        return set(self.costs) | set(self.pending)

    def _propose(self, n: int) -> list[Config]:
        raise NotImplementedError

    def _told(self, config: Config, cost: float) -> None:
        """Called after each tell (the base class has recorded it)."""


class Exhaustive(Strategy):
    """Every configuration, in the space's order."""

    name = "exhaustive"

    def __init__(self, space: Space, seed: int = 0) -> None:
        super().__init__(space, seed)
        self._walk: Iterator[Config] = iter(space)

    def _propose(self, n: int) -> list[Config]:
        return list(itertools.islice(self._walk, n))


class RandomSearch(Strategy):
    """Configurations drawn uniformly, without repeats."""

    name = "random"

    def _propose(self, n: int) -> list[Config]:
        return self.space.sample(self.rng, n, self.exclude())
