"""Search strategies (ask / tell), budgets, pruning and the search loop, on a synthetic space with a known
optimum (search_fixtures.py) and on small spaces they must exhaust."""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Sequence

import pytest

from tuneforge.search import Budget, Config, Space, make, search, span
from tuneforge.search.local import CoordinateDescent
from tuneforge.search.strategy import FAILED

from .search_fixtures import OPTIMUM, tiled_cost, tiled_space

HAVE_SKLEARN = importlib.util.find_spec("sklearn") is not None
ALL = ["exhaustive", "random", "coordinate_descent", "default", "genetic",
       pytest.param("model", marks=pytest.mark.skipif(not HAVE_SKLEARN, reason="needs scikit-learn"))]


def evaluate(configs: list[Config]) -> list[float | None]:
    return [tiled_cost(c) for c in configs]


@pytest.mark.parametrize("name", ALL)
def test_every_strategy_exhausts_a_small_space_once_each(name: str) -> None:
    space = Space({"A": span(0, 5), "B": ["x", "y", "z"], "C": [1, 2]}, ["A + C != 3"])
    strategy = make(name, space, seed=1)
    seen: list[tuple[object, ...]] = []
    while batch := strategy.ask(4):
        assert all(c in space for c in batch)
        seen.extend(space.key(c) for c in batch)
        for c in batch:
            strategy.tell(c, 1.0 + c["A"] + {"x": 0, "y": 1, "z": 0.5}[c["B"]] + 0.1 * c["C"])
    assert sorted(seen) == sorted(space.key(c) for c in space)  # every configuration, none twice
    assert strategy.best == {"A": 0, "B": "x", "C": 1} and strategy.best_cost == pytest.approx(1.1)


# evaluations allowed on the 1320-point tiled space, and how many of 10 seeds must find its optimum
FINDS = {"coordinate_descent": (200, 10), "default": (200, 10), "genetic": (400, 8), "model": (200, 8),
         "random": (660, 3)}


@pytest.mark.parametrize("name", [n if n != "model" else ALL[-1] for n in FINDS])
def test_strategies_find_the_known_optimum_within_a_budget(name: str) -> None:
    space = tiled_space()
    limit, needed = FINDS[name]
    found = 0
    for seed in range(10):
        result = search(space, make(name, space, seed=seed), evaluate, Budget(evaluations=limit), batch=4,
                        stop_at=tiled_cost(OPTIMUM))  # found: the rest of the budget would tell nothing
        assert result.evaluations <= limit and len({space.key(c) for c, _ in result.history}) == result.evaluations
        found += result.best == OPTIMUM
    assert found >= needed, f"{name}: found the optimum with {found} of 10 seeds in {limit} evaluations"


def test_coordinate_descent_walks_from_its_start_one_parameter_at_a_time() -> None:
    space = tiled_space()
    start = {"BM": 8, "BN": 256, "BK": 128, "UNROLL": 1, "ORDER": "ji"}
    strategy = CoordinateDescent(space, start=start, restarts=False)
    result = search(space, strategy, evaluate)
    assert result.history[0][0] == start  # the start is timed first, then its neighbours
    assert result.best == OPTIMUM and result.stopped == "space exhausted"  # no restarts: done at the optimum
    assert strategy.optima == [OPTIMUM]
    assert result.evaluations < 80  # a bowl: a few steps of at most 10 neighbours, not the 1320 points
    # every timed configuration after the start is a neighbour of an earlier one
    timed = [space.key(c) for c, _ in result.history]
    for i, (config, _) in enumerate(result.history[1:], 1):
        assert any(space.key(n) in timed[:i] for n in space.neighbours(config))


def test_the_default_strategy_starts_from_suggestions() -> None:
    space = tiled_space()
    near = {"BM": 32, "BN": 64, "BK": 32, "UNROLL": 4, "ORDER": "ji"}  # a family's heuristic pick, near the optimum
    far = {"BM": 8, "BN": 256, "BK": 128, "UNROLL": 1, "ORDER": "ji"}
    strategy = make("default", space, seed=3)
    strategy.suggest([far, near])
    first = strategy.ask(8)
    assert first == [far, near]  # the suggestions alone, in one batch: no random samples beside them
    for c in first:
        strategy.tell(c, tiled_cost(c))
    neighbours = {space.key(n) for n in space.neighbours(near, 2)}
    step = strategy.ask(len(neighbours))
    assert step and all(space.key(c) in neighbours for c in step)
    with pytest.raises(ValueError, match="before the first ask"):
        strategy.suggest([near])
    outside = dict(near, BM=3)
    with pytest.raises(Exception, match="suggested .* is not in the space"):
        make("default", space).suggest([outside])
    random = make("random", space, seed=3)
    random.suggest([near])  # strategies that do not start anywhere ignore suggestions
    assert len(random.ask(4)) == 4


def test_the_default_strategy_fills_a_batch_its_step_leaves_short() -> None:
    space = tiled_space()
    near = {"BM": 32, "BN": 64, "BK": 32, "UNROLL": 4, "ORDER": "ji"}
    strategy = make("default", space, seed=3)
    strategy.suggest([near, {"BM": 8, "BN": 256, "BK": 128, "UNROLL": 1, "ORDER": "ji"}])
    for c in strategy.ask(8):
        strategy.tell(c, tiled_cost(c))
    neighbours = {space.key(n) for n in space.neighbours(near, 2)}
    batch = strategy.ask(len(neighbours) + 5)
    keys = [space.key(c) for c in batch]
    assert len(batch) == len(neighbours) + 5 and len(set(keys)) == len(keys)
    assert set(keys[:len(neighbours)]) == neighbours  # the step first, then the model's likeliest others
    assert not set(keys[len(neighbours):]) & neighbours
    plain = CoordinateDescent(space, seed=3, radius=2, restart_from="model")  # without fill: the step alone
    plain.suggest([near])
    for c in plain.ask(8):
        plain.tell(c, tiled_cost(c))
    assert len(plain.ask(len(neighbours) + 5)) == len(neighbours)


def test_coordinate_descent_stops_on_noise_below_its_threshold() -> None:
    space = Space({"A": span(0, 9)})
    strategy = CoordinateDescent(space, start={"A": 5}, restarts=False, threshold=0.05)
    result = search(space, strategy, lambda cs: [1.0 - 0.01 * c["A"] for c in cs])  # 1% steps: noise here
    assert result.best == {"A": 6} and result.evaluations == 3 and strategy.optima == [{"A": 5}]
    with pytest.raises(Exception, match="not in the space"):
        CoordinateDescent(space, start={"A": 10})


def test_failures_are_avoided_not_fatal() -> None:
    space = tiled_space()

    def flaky(configs: list[Config]) -> list[float | None]:  # every ORDER=ji configuration fails to build
        return [None if c["ORDER"] == "ji" else tiled_cost(c) for c in configs]

    result = search(space, make("default", space, seed=0), flaky, Budget(evaluations=150))
    assert result.best == OPTIMUM and any(cost == FAILED for _, cost in result.history)


def test_tell_refuses_what_was_not_asked() -> None:
    space = tiled_space()
    strategy = make("random", space)
    asked = strategy.ask(2)
    strategy.tell(asked[0], 1.0)
    with pytest.raises(ValueError, match="not asked"):
        strategy.tell(asked[0], 1.0)
    with pytest.raises(ValueError, match="not asked"):
        strategy.tell(OPTIMUM if OPTIMUM not in asked else asked[1] | {"BK": 8}, 2.0)
    with pytest.raises(ValueError, match="unknown search strategy 'annealing'"):
        make("annealing", space)
    with pytest.raises(ValueError, match="strategy 'genetic'"):
        make("genetic", space, temperature=3)


def test_budgets() -> None:
    assert Budget.parse("100") == Budget(evaluations=100)
    assert Budget.parse("15%, 30s,patience=20") == Budget(fraction=0.15, seconds=30.0, patience=20)
    assert Budget.parse("15%").limit(1320) == 198 and Budget(evaluations=50, fraction=0.5).limit(1320) == 50
    for bad, why in (("ten", "cannot read 'ten'"), ("5,6", "evaluations twice"), ("0", "at least 1"),
                     ("150%", r"fraction must be in \(0, 1\]")):
        with pytest.raises(ValueError, match=why):
            Budget.parse(bad)
    space = tiled_space()
    result = search(space, make("random", space), evaluate, Budget.parse("10%"), batch=7)
    assert result.evaluations == 132 and result.stopped == "evaluations"
    ticks = itertools.count()
    result = search(space, make("random", space), evaluate, Budget(seconds=5), clock=lambda: float(next(ticks)))
    assert result.stopped == "seconds" and result.evaluations == 4  # one tick per loop, after the first
    result = search(space, make("exhaustive", space), lambda cs: [1.0 for _ in cs], Budget(patience=25))
    assert result.stopped == "patience" and result.evaluations == 26  # the first is a new best, 25 are not
    result = search(space, make("exhaustive", space), evaluate, stop_at=1.0)  # a replay knows the best cost
    assert result.stopped == "target" and result.best == OPTIMUM and result.history[-1] == (OPTIMUM, 1.0)


def test_prune_drops_configurations_without_spending_evaluations() -> None:
    space = tiled_space()
    given: list[int] = []

    def prune(configs: Sequence[Config]) -> list[Config]:  # a performance model's verdict: BK 128 never pays
        given.append(len(configs))
        return [c for c in configs if c["BK"] != 128]

    result = search(space, make("exhaustive", space), evaluate, prune=prune, batch=8)
    assert result.evaluations + result.pruned == 1320 and result.pruned == 264
    assert all(c["BK"] != 128 for c, _ in result.history) and result.best == OPTIMUM
    assert max(given) == 8
    with pytest.raises(ValueError, match="was not among"):
        search(space, make("exhaustive", space), evaluate, prune=lambda cs: [OPTIMUM | {"BK": 9}])


def test_the_additive_model_predicts_the_optimum_from_a_sample() -> None:
    import random

    from tuneforge.search.additive import predicted_best

    space = tiled_space()
    listed = space.listed()
    assert listed is not None
    timed = random.Random(3).sample([c for c in listed if c != OPTIMUM], 60)  # 4.5% of the space, not the best
    costs = {space.key(c): tiled_cost(c) for c in timed}
    untimed = [c for c in listed if space.key(c) not in costs]
    assert predicted_best(space, costs, untimed) == OPTIMUM  # costs near additive in the parameters' values
    assert predicted_best(space, {}, untimed) is None and predicted_best(space, costs, []) is None
    assert predicted_best(space, {k: FAILED for k in costs}, untimed) is None  # failures teach it nothing


def test_model_restarts_after_the_first_descent() -> None:
    from tuneforge.search.additive import predicted_best

    space = tiled_space()
    strategy = CoordinateDescent(space, seed=0, start={"BM": 8, "BN": 8, "BK": 8, "UNROLL": 1, "ORDER": "ji"},
                                 restart_from="model")
    while not strategy.optima:  # the first descent, to its local optimum
        for config in strategy.ask(4):
            strategy.tell(config, tiled_cost(config))
    untimed = [c for c in space.listed() or [] if not strategy.seen(c)]
    assert strategy._next_start() == predicted_best(space, strategy.costs, untimed)
    with pytest.raises(ValueError, match="restart_from is one of random, model"):
        CoordinateDescent(space, restart_from="somewhere")
    assert make("default", space).restart_from == "model"  # type: ignore[attr-defined]
