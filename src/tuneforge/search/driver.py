"""The search loop: ask a strategy for a batch, prune it, evaluate it, tell the costs, until a limit is reached.

`evaluate(configs)` returns one cost per configuration (None for a failure) and is where builds and timings
happen: against hardware in a selection, against recorded timings in a replay. `prune(configs)` (Triton's
`prune_configs_by`: a heuristic or performance model) returns the subset worth evaluating; the others are told
as failures without costing an evaluation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import field
from typing import Any

from tuneforge.dataclass_lite import dataclass
from tuneforge.search.budget import Budget
from tuneforge.search.space import Config, Space
from tuneforge.search.strategy import FAILED, Strategy, cost_of

Evaluate = Callable[[list[Config]], Sequence[float | None]]
Prune = Callable[[list[Config]], Sequence[Config]]


@dataclass
class SearchResult:
    best: Config | None
    best_cost: float
    history: list[tuple[Config, float]] = field(default_factory=list)  # every evaluation, in order
    pruned: int = 0
    seconds: float = 0.0
    stopped: str = ""  # why: "space exhausted", "evaluations", "seconds", "patience"

    @property
    def evaluations(self) -> int:
        return len(self.history)

    def best_after(self) -> list[float]:
        """The best cost after each evaluation (FAILED until one succeeds)."""
        out, best = [], FAILED
        for _, cost in self.history:
            best = min(best, cost)
            out.append(best)
        return out


def search(space: Space, strategy: Strategy, evaluate: Evaluate, budget: Budget | None = None, *, batch: int = 1,
           prune: Prune | None = None, space_size: int | None = None, stop_at: float | None = None,
           clock: Callable[[], float] = time.perf_counter) -> SearchResult:
    """Run `strategy` over `space` until it is done, `budget` is spent or (with `stop_at`: a replay that knows the
    best cost) a cost of at most `stop_at` was found. `space_size`: the number of valid configurations, when
    known (a budget given as a share of the space needs it; counted here otherwise)."""
    if batch < 1:
        raise ValueError(f"search: batch must be at least 1, not {batch}")
    budget = budget or Budget()
    if budget.fraction is not None and space_size is None:
        space_size = space.count()
    limit = budget.limit(space_size)
    started = clock()
    result = SearchResult(None, FAILED)
    since_best = 0
    while True:
        if limit is not None and result.evaluations >= limit:
            result.stopped = "evaluations"
            break
        if budget.seconds is not None and clock() - started >= budget.seconds:
            result.stopped = "seconds"
            break
        if budget.patience is not None and since_best >= budget.patience:
            result.stopped = "patience"
            break
        if stop_at is not None and result.best_cost <= stop_at:
            result.stopped = "target"
            break
        asked = strategy.ask(batch if limit is None else min(batch, limit - result.evaluations))
        if not asked:
            result.stopped = "space exhausted"
            break
        kept = _pruned(space, asked, prune)
        for config in asked:
            if space.key(config) not in kept:
                strategy.tell(config, None)
                result.pruned += 1
        chosen = list(kept.values())
        costs = list(evaluate(chosen)) if chosen else []
        if len(costs) != len(chosen):
            raise ValueError(f"search: evaluate returned {len(costs)} costs for {len(chosen)} configurations")
        for config, raw in zip(chosen, costs, strict=True):
            cost = cost_of(raw)
            strategy.tell(config, cost)
            result.history.append((config, cost))
            if cost < result.best_cost:
                result.best, result.best_cost, since_best = config, cost, 0
            else:
                since_best += 1
    result.seconds = clock() - started
    return result


def _pruned(space: Space, asked: list[Config], prune: Prune | None) -> dict[tuple[Any, ...], Config]:
    """The asked configurations `prune` keeps, by key (all of them without it)."""
    given = {space.key(c): c for c in asked}
    if prune is None:
        return given
    kept = {}
    for c in prune(list(asked)):
        key = space.key(c) if all(name in c for name in space.names) else None
        if key not in given:
            raise ValueError(f"search: prune returned {dict(c)}, which was not among the configurations it was given")
        kept[key] = given[key]
    return kept

