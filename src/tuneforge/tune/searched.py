"""A selection that times part of its candidates: a search strategy picks which (select(..., strategy=)).

The candidates with parameters (template configurations) are grouped by what they compile to (a template's
configurations that differ only in runtime parameters share one build), and the builds make the search space:
`Space.from_points` of the parameters each build's configurations share; a build's cost is the best of its
configurations, which are all timed with it (compiling costs 0.5-0.9 s, a timing milliseconds). The other
candidates (library calls) are always timed, in the first batch. Builds holding a suggested choice (a family's
heuristic pick, Choice.suggested) are given to the strategy to start from. The strategy asks for batches of
builds, each built in parallel and timed in one worker job (which keeps its example inputs and reference outputs
for the next batch; near ties are left to the finalists); configurations with a record already cost nothing. The
best configuration so far is re-timed beside each batch's contenders on the CPU, and their figures take its level
(paired.py): batches timed seconds apart are then compared as if side by side.
When the budget (builds) is spent the fastest few configurations (`finalists`) and the fastest library call are
timed again in one job, then side by side (confirm.py: alternating rounds, and the winner's confidence), so that
the pick does not hang on timings taken in different batches or on one noisy timing; every record of the
selection is then put at the level of that last side-by-side timing (`_at_finalists_level`); then the search is
marked done on the winner's record, and a later process with the same candidates, strategy and budget decides
from the records without searching again.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import field
from typing import Any

from tuneforge import config
from tuneforge.dataclass_lite import dataclass
from tuneforge.search import Budget, Space, make, search
from tuneforge.search.driver import Prune
from tuneforge.search.space import aligned, point_of, shared
from tuneforge.store.records import Record
from tuneforge.tune.choices import Choice
from tuneforge.tune.confirm import PAIRED_SCALE
from tuneforge.tune.ranking import SCREENED
from tuneforge.tune.screening import compared
from tuneforge.tune.template_space import TemplateSpace

log = logging.getLogger("tuneforge.tune")

# (choices, role): "batch" (a search's: another follows, near ties are left to the finalists, and each build's fastest
# configuration is timed fully: its cost steers the search), "last" (the batch that spends the budget: only the
# fastest few are timed fully, for the finalists), "finalists" (re-timed side by side) or "whole" (every candidate,
# as a selection without a search times them)
MeasureSome = Callable[[Sequence[Choice], str], None]
SEARCH_INFO = "search"  # the winner's record's info key: the identity of the finished search
SEARCH_LEVEL = "search_level"  # a record's info key: the factor its figures were put at the finalists' level by
Restate = Callable[[Sequence[Record]], None]  # stores records whose figures the search changed (the caller's)


@dataclass(frozen=True)
class SearchPlan:
    """How a selection searches its candidates: the strategy and its options, the budget (default
    DEFAULT_BUDGET; evaluations are builds), an optional prune hook (given the asked builds' shared parameters),
    the batch size (builds compiled and timed together) and how many finalists are re-timed side by side."""

    strategy: str = "default"
    budget: Budget | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    prune: Prune | None = None
    batch: int = 8
    finalists: int = 3

    @classmethod
    def of(cls, strategy: str | SearchPlan, budget: Budget | str | None) -> SearchPlan:
        if isinstance(strategy, SearchPlan):
            return strategy if budget is None else dataclasses.replace(strategy, budget=_budget(budget))
        return cls(strategy, _budget(budget))

    def identity(self, candidates: Sequence[Choice], space: TemplateSpace | None = None) -> str:
        """What a finished search of these candidates (and `space`'s: its identity stands for them) is known by:
        the candidates, strategy, options, budget and seed (the prune hook is code: its name stands for it)."""
        named = sorted(c.hash_key + ("*" if c.suggested else "") for c in candidates if space is None or c.is_extern)
        if space is not None:
            named.append(space.identity)
        text = json.dumps([named, self.strategy, repr(sorted(self.options.items())),
                           self.effective_budget().describe(), config.get_int("autotune.seed"),
                           getattr(self.prune, "__qualname__", None), self.finalists])
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def effective_budget(self) -> Budget:
        return self.budget if self.budget is not None else DEFAULT_BUDGET


# Without a budget: at most a sixth of the space, and no more than 40 evaluations past the last new best.
DEFAULT_BUDGET = Budget(fraction=0.15, patience=40)


def _budget(budget: Budget | str | None) -> Budget | None:
    return Budget.parse(budget) if isinstance(budget, str) else budget


def finished(plan: SearchPlan, candidates: Sequence[Choice], records: Mapping[str, Record],
             space: TemplateSpace | None = None) -> bool:
    """Whether these records hold a finished search of `plan` over `candidates` (and `space`)."""
    identity = plan.identity(candidates, space)
    return any(r.info.get(SEARCH_INFO) == identity for r in records.values())


def search_candidates(plan: SearchPlan, candidates: list[Choice], records: dict[str, Record],
                      measure_some: MeasureSome, statistic: str,
                      template_space: TemplateSpace | None = None, restate: Restate | None = None) -> Record | None:
    """Search `candidates` (or, with a `template_space`, its configurations: each choice made when asked is added
    to `candidates`, beside the library calls there) with `plan`; `measure_some` records what it measures into
    `records`, and `restate` stores those the search put at its finalists' level (also replaced in `records`).
    Returns the winner's record, marked as the end of this search (for the caller to store), or None when none
    ran ok."""
    if template_space is not None:
        return _search_space(plan, template_space, candidates, records, measure_some, statistic, restate)
    configured = [c for c in candidates if not c.is_extern and c.params]
    always = [c for c in candidates if c not in configured]
    units = _builds(configured)
    points = _points(units)
    if len(units) < 2:
        missing = [c for c in candidates if c.hash_key not in records]
        if missing:
            measure_some(missing, "whole")
        return _mark(plan, candidates, records, statistic)
    space = Space.from_points(points)
    by_key = {space.key(p): unit for p, unit in zip(points, units, strict=True)}
    strategy = make(plan.strategy, space, seed=config.get_int("autotune.seed"), **dict(plan.options))
    strategy.suggest([p for p, unit in zip(points, units, strict=True) if any(c.suggested for c in unit)])
    first = [c for c in always if c.hash_key not in records]
    last = _last_batch(plan, len(units))

    def evaluate(asked: list[dict[str, Any]]) -> list[float | None]:
        nonlocal first
        chosen = [by_key[space.key(p)] for p in asked]
        todo, first = first + [c for unit in chosen for c in unit if c.hash_key not in records], []
        if todo:
            measure_some(todo + _incumbent(configured, records, statistic), last(len(asked)))
        costs = [[t for c in unit if (t := _cost(records.get(c.hash_key), statistic)) is not None] for unit in chosen]
        return [min(unit_costs) if unit_costs else None for unit_costs in costs]

    result = search(space, strategy, evaluate, plan.effective_budget(), batch=plan.batch, prune=plan.prune,
                    space_size=len(units))
    log.info("search %s: %d of %d builds timed (%d configurations; %d pruned), stopped by %s", plan.strategy,
             result.evaluations, len(units), len(configured), result.pruned, result.stopped)
    _time_finalists(plan, configured, always, first, records, measure_some, statistic, restate)
    return _mark(plan, candidates, records, statistic)


def _search_space(plan: SearchPlan, space: TemplateSpace, candidates: list[Choice], records: dict[str, Record],
                  measure_some: MeasureSome, statistic: str, restate: Restate | None) -> Record | None:
    """search_candidates over a template space: the strategy walks `space.space` itself (a point is a
    configuration), and a choice exists only for what it asks (and what the records held before)."""
    always = [c for c in candidates if c.is_extern]
    first = [c for c in always if c.hash_key not in records]
    listed = space.space.listed()
    strategy = make(plan.strategy, space.space, seed=config.get_int("autotune.seed"), **dict(plan.options))
    # A share of a space too large to list is a share of its parameters' product (patience ends it sooner).
    size = len(listed) if listed is not None else space.space.size_bound
    last = _last_batch(plan, size)

    def evaluate(asked: list[dict[str, Any]]) -> list[float | None]:
        nonlocal first
        chosen = [space.choice(p) for p in asked]
        present = {c.hash_key for c in candidates}
        candidates.extend(c for c in chosen if c.hash_key not in present)
        todo, first = first + [c for c in chosen if c.hash_key not in records], []
        if todo:
            measure_some(todo + _incumbent([c for c in candidates if not c.is_extern], records, statistic),
                         last(len(asked)))
        return [_cost(records.get(c.hash_key), statistic) for c in chosen]

    result = search(space.space, strategy, evaluate, plan.effective_budget(), batch=plan.batch, prune=plan.prune,
                    space_size=size)
    log.info("search %s of %s: %d configurations timed, stopped by %s", plan.strategy, space, result.evaluations,
             result.stopped)
    _time_finalists(plan, [c for c in candidates if not c.is_extern], always, first, records, measure_some,
                    statistic, restate)
    return _mark(plan, candidates, records, statistic, space)


def _last_batch(plan: SearchPlan, size: int) -> Callable[[int], str]:
    """A batch's role, given how many evaluations it holds: "last" where it spends the budget's evaluations (no
    later batch is steered by its builds' costs: a 512^3 GEMM search's last batch timed 8 builds' fastest
    configurations fully beside the fastest 4 of all), else "batch". Patience or seconds may end a search sooner."""
    limit = plan.effective_budget().limit(size)
    done = 0

    def role(count: int) -> str:
        nonlocal done
        done += count
        return "last" if limit is not None and done >= limit else "batch"

    return role


def _time_finalists(plan: SearchPlan, configured: Sequence[Choice], always: Sequence[Choice], first: Sequence[Choice],
                    records: dict[str, Record], measure_some: MeasureSome, statistic: str,
                    restate: Restate | None) -> None:
    """Time the finalists again together (with the library calls never timed yet, `first`), then side by side
    (confirm.py): the search's batches left their near ties to this job."""
    finalists = _finalists(plan, configured, always, records, statistic)
    if not first and len(finalists) < 2:
        return
    before = {c.hash_key: records.get(c.hash_key) for c in finalists}
    measure_some([*first, *finalists], "finalists")
    anchors = [scale for key, old in before.items() if (new := records.get(key)) is not None and new is not old
               and "+paired" in new.method and isinstance(scale := new.info.get(PAIRED_SCALE), (int, float))
               and scale > 0]
    if anchors:
        restated = _at_finalists_level(records, 1 / anchors[0])
        if restate is not None and restated:
            restate(restated)


def _at_finalists_level(records: dict[str, Record], factor: float) -> list[Record]:
    """Every timed record of the selection times `factor` (replaced in `records`): the finalists' re-timed side by
    side then read what they measured, and the others keep their ratios to them.
    Why: the finalists' figures, like every batch's, were put at the level of the best so far (paired.py), whose
    figure came down the chain of batches, each anchored at the one before; each batch's best is the fastest of
    noisy figures, the likeliest low by noise, and its error passes to every batch after it. 512^3 fp64 searches
    here anchored their finalists at 0.53-0.92 of what they measured, and records claimed up to 157 GFLOP/s of
    cores that peak at 116."""
    if not math.isfinite(factor) or abs(factor - 1) < 1e-6:
        return []
    restated = []
    for key, record in records.items():
        if record.status != "ok" or record.median_ms is None:
            continue
        records[key] = record.scaled(factor, **{SEARCH_LEVEL: round(record.info.get(SEARCH_LEVEL, 1.0) * factor, 4)})
        restated.append(records[key])
    return restated


def _incumbent(configured: Sequence[Choice], records: Mapping[str, Record], statistic: str) -> list[Choice]:
    """The fastest configuration timed fully so far, to be re-timed beside the next batch's contenders so that
    their figures are at the level of the batches before (paired.py): [] before the first batch. Not one timed
    briefly only (screened, not among the contenders): a brief figure sets no level (paired.py), and its batch
    would be timed unanchored."""
    full = [c for c in configured if (r := records.get(c.hash_key)) is not None and SCREENED not in r.method]
    return _fastest(full, records, statistic, 1)


def _builds(configured: Sequence[Choice]) -> list[list[Choice]]:
    """The configurations grouped by what they compile to (a template's configurations that differ only in its
    runtime parameters share one build), in first-seen order."""
    groups: dict[str, list[Choice]] = {}
    for c in configured:
        groups.setdefault(getattr(c, "render_identity", None) or c.hash_key, []).append(c)
    return list(groups.values())


def _points(units: Sequence[Sequence[Choice]]) -> list[dict[str, Any]]:
    """One point of the search space per build: the parameters its configurations share (what was compiled in),
    aligned (search.space.aligned) so that every point has every name and no two look alike."""
    return aligned([shared([point_of(c.params) for c in unit]) for unit in units], "_build")


def _cost(record: Record | None, statistic: str) -> float | None:
    if record is None or record.status != "ok":
        return None
    value = compared(record, statistic)
    return value if value is not None and math.isfinite(value) and value > 0 else None


def _finalists(plan: SearchPlan, configured: Sequence[Choice], always: Sequence[Choice],
               records: Mapping[str, Record], statistic: str) -> list[Choice]:
    """The fastest `plan.finalists` configurations and the fastest library call (when they ran ok)."""
    return _fastest(configured, records, statistic, plan.finalists) + _fastest(always, records, statistic, 1)


def _fastest(choices: Sequence[Choice], records: Mapping[str, Record], statistic: str, count: int) -> list[Choice]:
    """The `count` fastest of `choices` that ran ok, fastest first (ties in their order)."""
    timed = [(t, i, c) for i, c in enumerate(choices) if (t := _cost(records.get(c.hash_key), statistic))]
    return [c for _, _, c in sorted(timed, key=lambda x: (x[0], x[1]))[:count]]


def _mark(plan: SearchPlan, candidates: Sequence[Choice], records: dict[str, Record], statistic: str,
          space: TemplateSpace | None = None) -> Record | None:
    """The fastest ok record, with the search's identity in its info (also replaced in `records`)."""
    ok = [(t, r.choice) for c in candidates if (r := records.get(c.hash_key)) and (t := _cost(r, statistic))]
    if not ok:
        return None
    best = records[min(ok)[1]]
    marked = dataclasses.replace(best, info={**best.info, SEARCH_INFO: plan.identity(candidates, space)})
    records[marked.choice] = marked
    return marked
