"""An additive model of a space's costs: where a local search restarts, and which neighbours it tries first.

The log of a configuration's cost is modelled as a sum of one effect per parameter value (a kernel's tile size,
its loop order and its packing each make it a certain factor slower or faster), fitted by ridge least squares on
the configurations timed so far; the untimed configuration it predicts fastest is where a descent stuck in a
local optimum starts again, and a step's neighbours are tried in the order it predicts. On the recorded GEMM
spaces the best configuration is often alone (the next within 5% of it is none of its neighbours): a random
restart lands near it by luck, the model from what it learnt of each parameter."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from tuneforge.search.space import Config, Space

RIDGE = 1.0  # pulls the effects of values seen once or twice towards none


def predicted_best(space: Space, costs: Mapping[tuple[Any, ...], float], candidates: Sequence[Config]) -> Config | None:
    """The candidate the model fitted to `costs` (keyed by `space.key`; failures infinite) predicts fastest; None
    without candidates or finite costs to fit."""
    ordered = ranked(space, costs, candidates)
    return ordered[0] if ordered else None


def ranked(space: Space, costs: Mapping[tuple[Any, ...], float], candidates: Sequence[Config]) -> list[Config]:
    """`candidates`, the fastest the model predicts first (ties in their order); empty without finite costs."""
    import numpy as np

    told = [(key, cost) for key, cost in costs.items() if math.isfinite(cost) and cost > 0]
    if not candidates or not told:
        return []
    # a parameter's values are consecutive one-hot columns: position + the parameter's first column
    sizes = [len(space.values[name]) for name in space.names]
    first, width = np.cumsum([0, *sizes[:-1]]), sum(sizes)
    told_columns = space.positions(key for key, _ in told) + first
    x = np.zeros((len(told), width))
    x[np.arange(len(told))[:, None], told_columns] = 1.0
    y = np.log([cost for _, cost in told])
    effects = np.linalg.solve(x.T @ x + RIDGE * np.eye(width), x.T @ (y - y.mean()))
    predicted = effects[space.positions(space.key(c) for c in candidates) + first].sum(axis=1)
    return [candidates[i] for i in np.argsort(predicted, kind="stable")]
