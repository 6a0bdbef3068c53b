"""Replay: run a strategy against recorded timings instead of hardware, in milliseconds.

A recording is one selection's exhaustive run: every configuration of a template that was timed for one key
(records of a bundle file or of the record database), with its median time, or a failure. Its space is
exactly the recorded configurations (`Space.from_points`), and evaluating a configuration looks its time up.
Replaying a strategy over many seeds gives, for each tolerance x, how many evaluations it took to find a
configuration within x of the recorded best: the curve that says whether a strategy is worth its budget.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tuneforge.dataclass_lite import dataclass
from tuneforge.search.budget import Budget
from tuneforge.search.driver import SearchResult, search
from tuneforge.search.registry import make
from tuneforge.search.space import Config, Space, aligned, point_of, shared
from tuneforge.search.strategy import FAILED
from tuneforge.store.record import Record

TOLERANCES = (0.0, 0.01, 0.02, 0.05, 0.10)
MIN_POINTS = 8  # a selection with fewer template configurations is no search problem


@dataclass
class Recording:
    """One selection's recorded configurations and their costs (ms; FAILED for failures)."""

    key: str
    op: str
    inputs: str
    space: Space
    costs: dict[tuple[Any, ...], float]
    unit: str = "configurations"  # what a point is: "configurations", or "builds" (recordings(by_build=True))

    @property
    def best(self) -> float:
        return min(self.costs.values())

    @property
    def size(self) -> int:
        return len(self.costs)

    def evaluate(self, configs: list[Config]) -> list[float | None]:
        return [self.costs[self.space.key(c)] for c in configs]

    def describe(self) -> str:
        ok = sum(1 for c in self.costs.values() if c < FAILED)
        return (f"{self.op} ({self.inputs or self.key[:16]}): {self.size} {self.unit}, {ok} ok, "
                f"best {self.best:.4g} ms")


def recordings(records: Iterable[Record], *, min_points: int = MIN_POINTS, key: str | None = None,
               by_build: bool = False) -> list[Recording]:
    """The recordings among `records`: per selection key (those starting with `key`, if given), the template
    configurations (choices with parameters that are no library call: cuBLAS's activation setting is no point of
    a template's space), when there are at least `min_points`.
    With `by_build`, a point is a build (the records naming one artifact: the configurations compiled into it,
    with the parameters they share) and its cost the best of theirs, as `select(..., strategy=)` searches."""
    by_key: dict[str, list[Record]] = {}
    for r in records:
        if r.params and not _library_call(r) and (key is None or r.key.startswith(key)):
            by_key.setdefault(r.key, []).append(r)
    found = []
    for k, rows in sorted(by_key.items()):
        units: dict[Any, list[Record]] = {}
        for r in rows:
            build = r.info.get("artifact") if by_build else None
            # a configuration recorded twice (under two choice hashes) is one point: its best time
            same = json.dumps(sorted(r.params.items()), default=str)
            units.setdefault(build if isinstance(build, str) else same, []).append(r)
        points: dict[tuple[Any, ...], tuple[Config, float]] = {}
        configs = aligned([shared([point_of(r.params) for r in unit])
                           for unit in units.values()], "_build" if by_build else "_choice")
        for config, unit in zip(configs, units.values(), strict=True):
            cost = min((r.median_ms for r in unit if r.status == "ok" and r.median_ms and math.isfinite(r.median_ms)),
                       default=FAILED)
            points[tuple(config.values())] = (config, cost)
        if len(points) < min_points or all(c >= FAILED for _, c in points.values()):
            continue
        space = Space.from_points([config for config, _ in points.values()])
        costs = {space.key(config): cost for config, cost in points.values()}
        found.append(Recording(k, rows[0].op, rows[0].inputs, space, costs, "builds" if by_build else "configurations"))
    return found


def _library_call(record: Record) -> bool:
    return str(record.info.get("family", "")).startswith("ExternChoice")


def replay(recording: Recording, strategy: str, *, seeds: int = 20, budget: Budget | None = None, batch: int = 1,
           options: Mapping[str, Any] | None = None, suggested: Sequence[Config] = ()) -> list[SearchResult]:
    """`strategy` run once per seed (0..seeds-1) against the recording (given the `suggested` points, as a
    selection gives it its suggested choices), each run until its `budget` is spent or it has found the recorded
    best: nothing after that changes its curve, and a search driven to the end of a thousand-point space costs
    seconds a seed where finding the best takes milliseconds."""
    results = []
    for seed in range(seeds):
        strat = make(strategy, recording.space, seed=seed, **dict(options or {}))
        strat.suggest(suggested)
        results.append(search(recording.space, strat, recording.evaluate, budget, batch=batch,
                              space_size=recording.size, stop_at=recording.best))
    return results


@dataclass(frozen=True)
class Reached:
    """Over the seeds of a replay: evaluations until a configuration within `tolerance` of the best was found."""

    tolerance: float
    evaluations: tuple[int | None, ...]  # per seed; None: never within the budget

    @property
    def median(self) -> float:
        """The median over seeds (a seed that never got there counts as infinitely many)."""
        return statistics.median(math.inf if e is None else e for e in self.evaluations)

    @property
    def reached(self) -> int:
        return sum(e is not None for e in self.evaluations)


def reached(results: Sequence[SearchResult], best: float, tolerances: Sequence[float] = TOLERANCES) -> list[Reached]:
    curves = []
    for tolerance in tolerances:
        per_seed: list[int | None] = []
        for result in results:
            target = best * (1 + tolerance) * (1 + 1e-12)
            per_seed.append(next((i + 1 for i, b in enumerate(result.best_after()) if b <= target), None))
        curves.append(Reached(tolerance, tuple(per_seed)))
    return curves


def final_gap(results: Sequence[SearchResult], best: float) -> float:
    """The median over seeds of how far the configuration each run ended with is from the best (0.02: 2%)."""
    return statistics.median(r.best_cost / best - 1 if r.best_cost < FAILED else math.inf for r in results)


def report_rows(recording: Recording, strategies: Sequence[str], *, seeds: int, budget: Budget | None,
                batch: int = 1, tolerances: Sequence[float] = TOLERANCES) -> list[list[str]]:
    """One table row per strategy: for each tolerance, the median evaluations (over seeds) to get within it of
    the recorded best, as a count and a share of the space (with how many seeds got there, when not all), then
    the median final gap and the median evaluations spent."""
    rows = []
    for name in strategies:
        results = replay(recording, name, seeds=seeds, budget=budget, batch=batch)
        cells = [name]
        for r in reached(results, recording.best, tolerances):
            median = r.median
            text = "-" if math.isinf(median) else f"{median:g} ({100 * median / recording.size:.1f}%)"
            cells.append(text if r.reached == seeds else f"{text} [{r.reached}/{seeds}]")
        gap = final_gap(results, recording.best)
        cells.append("failed" if math.isinf(gap) else f"{100 * gap:.2f}%")
        cells.append(f"{statistics.median(r.evaluations for r in results):g}")
        rows.append(cells)
    return rows


def report_headers(tolerances: Sequence[float] = TOLERANCES) -> list[str]:
    return ["strategy", *("to best" if t == 0 else f"to {100 * t:g}%" for t in tolerances), "final gap",
            "evaluations"]
