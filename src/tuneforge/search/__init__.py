"""Search spaces and strategies: tune large spaces in a fraction of the evaluations.

`Space` holds named parameters and restrictions; a strategy (`make(name, space)`) proposes configurations
through ask / tell; `search` drives one against an evaluation function under a `Budget`; `replay` runs
strategies against recorded timings. Nothing here builds or times anything: tune/ does, through `search`.

The names are loaded on first use (PEP 562): select() imports `search.space` for every selection, and a
warm start, which searches nothing, should not load every strategy (7 ms of a 50 ms budget).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuneforge.search.budget import Budget
    from tuneforge.search.driver import SearchResult, search
    from tuneforge.search.registry import STRATEGIES, make, names
    from tuneforge.search.space import Config, Space, SpaceError, pow2, span
    from tuneforge.search.strategy import Strategy

_WHERE = {"Budget": "budget", "SearchResult": "driver", "search": "driver", "STRATEGIES": "registry",
          "make": "registry", "names": "registry", "Config": "space", "Space": "space", "SpaceError": "space",
          "pow2": "space", "span": "space", "Strategy": "strategy"}

__all__ = ["STRATEGIES", "Budget", "Config", "SearchResult", "Space", "SpaceError", "Strategy", "make", "names", "pow2",
           "search", "span"]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'tuneforge.search' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"tuneforge.search.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
