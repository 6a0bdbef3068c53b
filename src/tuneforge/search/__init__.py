"""Search spaces and strategies: tune large spaces in a fraction of the evaluations.

`Space` holds named parameters and restrictions; a strategy (`make(name, space)`) proposes configurations
through ask / tell; `search` drives one against an evaluation function under a `Budget`; `replay` runs
strategies against recorded timings. Nothing here builds or times anything: tune/ does, through `search`.
"""

from tuneforge.search.budget import Budget
from tuneforge.search.driver import SearchResult, search
from tuneforge.search.registry import STRATEGIES, make, names
from tuneforge.search.space import Config, Space, SpaceError, pow2, span
from tuneforge.search.strategy import Strategy

__all__ = ["STRATEGIES", "Budget", "Config", "SearchResult", "Space", "SpaceError", "Strategy", "make", "names", "pow2",
           "search", "span"]
