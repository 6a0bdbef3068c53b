"""A synthetic search space with a known optimum, shared by the search tests: a tiled kernel's parameters and
a cost that is a bowl in the tile sizes' logs with a few step-like penalties (as real kernels have), plus a
small deterministic ripple, so that no two configurations tie."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any

from tuneforge.search import Space, pow2

OPTIMUM = {"BM": 64, "BN": 32, "BK": 16, "UNROLL": 4, "ORDER": "ij"}


def tiled_space() -> Space:
    """6 x 6 x 5 x 4 x 2 = 1440 points, 1320 of them within the restriction."""
    return Space({"BM": pow2(8, 256), "BN": pow2(8, 256), "BK": pow2(8, 128), "UNROLL": [1, 2, 4, 8],
                  "ORDER": ["ij", "ji"]}, ["BM * BN <= limit"], constants={"limit": 16384})


def ripple(config: Mapping[str, Any]) -> float:
    digest = hashlib.sha256(repr(sorted(config.items())).encode()).digest()
    return int.from_bytes(digest[:4], "little") / 2**32  # in [0, 1), fixed per configuration


def tiled_cost(config: Mapping[str, Any]) -> float:
    """The best is OPTIMUM, at exactly 1.0 (its ripple is cancelled); every other is more than 0.5% slower."""
    cost = 1.0 + 0.1 * (math.log2(config["BM"]) - 6) ** 2 + 0.1 * (math.log2(config["BN"]) - 5) ** 2
    cost += 0.05 * (math.log2(config["BK"]) - 4) ** 2
    cost += {1: 0.09, 2: 0.06, 4: 0.0, 8: 0.03}[config["UNROLL"]]
    cost += 0.0 if config["ORDER"] == "ij" else 0.2
    return 1.0 if dict(config) == OPTIMUM else cost + 0.005 + 0.01 * ripple(config)
