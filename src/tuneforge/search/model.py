"""A model-guided search: a cost model fitted on the timings so far picks what to time next.

The model is scikit-learn's ExtraTreesRegressor over the parameters' positions in their value lists, fitted on
log costs. Why that: a kernel's time is a rugged, step-like function of tile sizes and flags (a tile that
stops fitting a cache level, a vector width that stops dividing a size), which trees model where a Gaussian
process's smooth kernel does not; the spread of the trees' predictions is an uncertainty good enough for
expected improvement; fitting a few hundred points takes milliseconds; and scikit-learn is maintained, wheels
everywhere, and already what Kernel Tuner's and AutoTVM's cost models build on. It is an optional dependency
(``pip install 'tuneforge[search]'``); the other strategies need nothing.

After `initial` random configurations, each ask fits the model and proposes the candidates with the highest
expected improvement over the best so far; the candidates are every untried configuration of a listable space,
else a random sample plus the neighbours of the best few. Failed configurations count as twice the slowest
time seen, so the model learns to keep away from them.
"""

from __future__ import annotations

import math
from typing import Any

from tuneforge.search.space import Config, Space
from tuneforge.search.strategy import FAILED, Strategy

_CANDIDATES = 2000  # sampled candidates per ask in a space too large to list
_TREES = 30
_PER_FIT = 4  # proposals per fit, at least: a fit per evaluation made replays of a few hundred seconds


def _sklearn() -> Any:
    try:
        from sklearn.ensemble import ExtraTreesRegressor
    except ImportError:
        raise ImportError("the 'model' search strategy needs scikit-learn: pip install 'tuneforge[search]' "
                          "(or pick another strategy: default, coordinate_descent, genetic, random)") from None
    return ExtraTreesRegressor


class ModelSearch(Strategy):
    name = "model"

    def __init__(self, space: Space, seed: int = 0, *, initial: int | None = None, explore: float = 0.1) -> None:
        super().__init__(space, seed)
        self._regressor = _sklearn()
        self.initial = max(4, 2 * len(space.names)) if initial is None else max(2, initial)
        self.explore = explore
        self._queue: list[Config] = []  # the last fit's next best proposals

    def _propose(self, n: int) -> list[Config]:
        told = [(key, cost) for key, cost in self.costs.items()]
        if len(told) < self.initial or not any(cost < FAILED for _, cost in told):
            return self.space.sample(self.rng, min(n, max(1, self.initial - len(told))), self.exclude())
        self._queue = [c for c in self._queue if not self.seen(c)]
        if len(self._queue) < n:
            self._queue = self._fitted(told, max(n, _PER_FIT))
        proposed, self._queue = self._queue[:n], self._queue[n:]
        return proposed

    def _fitted(self, told: list[tuple[tuple[Any, ...], float]], n: int) -> list[Config]:
        """The `n` untried configurations a model fitted on `told` expects the most improvement from."""
        candidates = self._candidates()
        if not candidates:
            return []
        import numpy as np

        finite = [c for _, c in told if c < FAILED]
        worst = 2 * max(finite)
        x = self.space.positions(key for key, _ in told).astype(float)
        y = np.log([c if c < FAILED else worst for _, c in told])
        model = self._regressor(n_estimators=_TREES, min_samples_leaf=1, random_state=self.rng.randrange(2**31))
        model.fit(x, y)
        grid = self.space.positions(self.space.key(c) for c in candidates).astype(float)
        per_tree = np.stack([tree.predict(grid) for tree in model.estimators_])
        mean, std = per_tree.mean(axis=0), np.maximum(per_tree.std(axis=0), 1e-9)
        best = math.log(min(finite))
        z = (best - mean) / std
        improvement = (best - mean) * _normal_cdf(z) + std * _normal_pdf(z)  # expected improvement (log scale)
        order = list(np.argsort(-improvement))
        chosen = [candidates[i] for i in order[:n]]
        for i in range(len(chosen)):  # now and then a random candidate instead: the model is only a model
            if self.rng.random() < self.explore:
                chosen[i] = candidates[self.rng.randrange(len(candidates))]
        unique = {self.space.key(c): c for c in chosen}
        return list(unique.values())

    def _candidates(self) -> list[Config]:
        exclude = self.exclude()
        untried = self.space.untried(exclude)
        if untried is not None:
            return untried
        found = {self.space.key(c): c for c in self.space.sample(self.rng, _CANDIDATES, exclude)}
        leaders = sorted((cost, key) for key, cost in self.costs.items() if cost < FAILED)[:5]
        for _, key in leaders:
            for c in self.space.neighbours(self.space.config(key), 2):
                k = self.space.key(c)
                if k not in exclude:
                    found[k] = c
        return list(found.values())


def _normal_pdf(z: Any) -> Any:
    import numpy as np

    return np.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)


def _normal_cdf(z: Any) -> Any:
    from scipy.special import ndtr  # scipy comes with scikit-learn

    return ndtr(z)
