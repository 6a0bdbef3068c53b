"""tuneforge: compile kernels, cache every artifact by content, autotune, and remember the results.

Importing tuneforge is cheap: the compile layer, numpy and rich load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tuneforge import config
from tuneforge._version import __version__
from tuneforge.errors import CompileError, ConfigError, TuneforgeError

if TYPE_CHECKING:
    from tuneforge import cpp, python

__all__ = ["CompileError", "ConfigError", "TuneforgeError", "__version__", "config", "cpp", "python"]

_LAZY_MODULES = {"cpp", "python", "hashing"}


def __getattr__(name: str) -> Any:
    if name in _LAZY_MODULES:
        return importlib.import_module(f"tuneforge.{name}")
    raise AttributeError(f"module 'tuneforge' has no attribute {name!r}")
