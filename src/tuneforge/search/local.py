"""Coordinate descent: from a start, move one parameter at a time to a better neighbour, until none is.

Each step proposes every untried neighbour of the current point at once (one parameter `radius` steps along
its values; a batch that builds and times in parallel), then moves to the best of them when it beats the
current point by more than `threshold` (relative): noise smaller than that must not walk the search about.
At a local optimum it restarts (with `restarts`) from the best untried start it has, else from a fresh
random point, until the space or the budget is spent.

Where it starts: `start` (a heuristic default, as a kernel family knows one) or the best of the configurations
given to `suggest` (a family's heuristic picks, timed first together), else the best of `initial` random
samples (the default strategy takes a few: one start is a gamble on a rugged space). Where it restarts
(`restart_from`): the best start not descended from yet, else a random configuration; or, with "model", the
untimed configuration an additive model of the costs so far predicts fastest (additive.py), which then also
orders each step's neighbours (a budget that ends mid-step has timed the likeliest). With `fill`, a batch that a
step's untried neighbours leave short is filled with the model's likeliest others (a batch builds in parallel).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from tuneforge.search.additive import predicted_best, ranked
from tuneforge.search.space import Config, Space, SpaceError
from tuneforge.search.strategy import FAILED, Strategy

RESTART_FROM = ("random", "model")
MODEL_POOL = 2000  # untimed configurations the model ranks, where the space is too large to list


class CoordinateDescent(Strategy):
    name = "coordinate_descent"

    def __init__(self, space: Space, seed: int = 0, *, start: Mapping[str, Any] | None = None, initial: int = 0,
                 radius: int = 1, threshold: float = 0.01, restarts: bool = True, restart_from: str = "random",
                 fill: bool = False) -> None:
        super().__init__(space, seed)
        if radius < 1 or threshold < 0 or initial < 0:
            raise ValueError("coordinate_descent needs radius >= 1, threshold >= 0 and initial >= 0")
        if restart_from not in RESTART_FROM:
            raise ValueError(f"coordinate_descent: restart_from is one of {', '.join(RESTART_FROM)}, not "
                             f"{restart_from!r}")
        self.restart_from = restart_from
        if start is not None:
            problem = space.problem(start)
            if problem is not None:
                raise SpaceError(f"coordinate_descent: the start {dict(start)} is not in the space: {problem}")
        self.radius, self.threshold, self.restarts, self.fill = radius, threshold, restarts, fill
        self._starts: list[Config] = [dict(start)] if start is not None else []
        self._initial = initial if start is not None else max(1, initial)
        self._queue: list[Config] = []  # decided, not asked yet
        self._center: Config | None = None
        self._step: list[Config] | None = None  # the center's neighbourhood, once proposed
        self.optima: list[Config] = []  # local optima reached, in order

    def suggest(self, configs: Sequence[Mapping[str, Any]]) -> None:
        """Start from these (a family's heuristic picks) instead of random samples: they are timed first, in one
        batch, and the descent begins at the best of them."""
        if self.costs or self.pending:
            raise ValueError("coordinate_descent: suggest() comes before the first ask")
        for config in configs:
            problem = self.space.problem(config)
            if problem is not None:
                raise SpaceError(f"coordinate_descent: the suggested {dict(config)} is not in the space: {problem}")
        unique = list({self.space.key(c): dict(c) for c in configs}.values())
        if unique:
            self._starts.extend(unique)
            self._queue.extend(unique)
            self._initial = 0

    def _propose(self, n: int) -> list[Config]:
        proposed: list[Config] = []
        while len(proposed) < n:
            if self._queue:
                proposed.append(self._queue.pop(0))
            elif self.pending or proposed or not self._decide():
                break  # the next decision needs costs not told yet, or the search is over
        if self.fill and proposed and len(proposed) < n and not self._queue:
            proposed += self._fillers(n - len(proposed), proposed)
        return proposed

    def _fillers(self, count: int, proposed: Sequence[Config]) -> list[Config]:
        """With `fill`: up to `count` untimed configurations the additive model predicts fastest, to fill a batch
        that a step's neighbours leave short. A batch is built and timed at once: 7 neighbours in a batch of 8 left a
        build's slot idle, and the budget's last build went alone in a batch of its own (0.6-1.0 s of a 512^3 GEMM
        search's ~10 on 2 cores, half of it waiting for one compiler)."""
        taken = {self.space.key(c) for c in proposed}
        untimed = [c for c in self._untimed() if self.space.key(c) not in taken]
        return ranked(self.space, self.costs, untimed)[:count]

    def _cost(self, config: Config) -> float:
        return self.costs.get(self.space.key(config), FAILED)

    def _decide(self) -> bool:
        """With every proposal told: queue what comes next; False when nothing does."""
        if self._initial:
            self._queue = self.space.sample(self.rng, self._initial, self.exclude())
            self._starts.extend(self._queue)
            self._initial = 0
            if self._queue:
                return True
        while True:
            if self._center is None:
                self._center = self._next_start()
                if self._center is None:
                    return False
                if not self.seen(self._center):
                    self._queue = [self._center]
                    return True
            if self._step is None:
                self._step = self.space.neighbours(self._center, self.radius)
                self._queue = [c for c in self._step if not self.seen(c)]
                if self.restart_from == "model":  # where a budget ends mid-step, the likeliest were timed
                    self._queue = ranked(self.space, self.costs, self._queue) or self._queue
                if self._queue:
                    return True
            better = min(self._step, key=self._cost, default=None)
            if better is not None and self._cost(better) < self._cost(self._center) * (1 - self.threshold):
                self._center, self._step = better, None
                continue
            self.optima.append(self._center)
            self._center = self._step = None
            if not self.restarts:
                return False

    def _next_start(self) -> Config | None:
        """After the first descent with `restart_from="model"`: the untimed configuration the additive model
        predicts fastest. Else the best start not yet descended from (timed ones first), else a fresh random one."""
        if self.restart_from == "model" and self.optima:
            predicted = predicted_best(self.space, self.costs, self._untimed())
            if predicted is not None:
                return predicted
        done = {self.space.key(c) for c in self.optima}
        self._starts = sorted((c for c in self._starts if self.space.key(c) not in done), key=self._cost)
        if self._starts:
            return self._starts.pop(0)
        fresh = self.space.sample(self.rng, 1, self.exclude())
        return fresh[0] if fresh else None

    def _untimed(self) -> list[Config]:
        exclude = self.exclude()
        untried = self.space.untried(exclude)
        # too many to list: a sample of them
        return untried if untried is not None else self.space.sample(self.rng, MODEL_POOL, exclude)



# The default strategy: coordinate descent from the best of 5 random samples, stepping up to 2 values along a
# parameter, the model's likeliest neighbours first, restarting where the additive model (additive.py) predicts the
# fastest untimed configuration. Replayed on the shipped exhaustive GEMM recordings (benchmarks/search_replay.py, 20
# seeds), it came within 2% of the best in 3.2-13.8% of the configurations (6 of 6 within 15%); with 6 samples and
# random restarts in 4.7-19.6% (5 of 6), radius 1 in 3.5-20.3% with one recording never (a best that radius-1
# steps cannot reach from the basins around it). The sample count was chosen on these recordings and the Kernel
# Tuner peer (4, 5, 6 and 10 tried): 4 and 5 replay alike (6 and 10: 16-18% on the hardest), and 5 fills a
# 27-build search's 15% budget in one batch (one worker job, no re-timing of finalists: 0.2 s of a 1.4 s search).
DEFAULT_INITIAL, DEFAULT_RADIUS, DEFAULT_RESTART_FROM = 5, 2, "model"


def default(space: Space, seed: int = 0, **options: Any) -> CoordinateDescent:
    """The default strategy: coordinate descent from the best of a few random samples; from each local optimum it
    restarts where the additive model predicts the fastest untimed configuration, until the budget is spent. A step
    with fewer neighbours to try than a batch holds is filled with the model's likeliest (`fill`)."""
    options.setdefault("initial", DEFAULT_INITIAL)
    options.setdefault("radius", DEFAULT_RADIUS)
    options.setdefault("restart_from", DEFAULT_RESTART_FROM)
    options.setdefault("fill", True)
    return CoordinateDescent(space, seed, **options)
