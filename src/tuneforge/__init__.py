"""tuneforge: compile kernels, cache every artifact by content, autotune, and remember the results.

Importing tuneforge is cheap: the compile layer, numpy and rich load on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tuneforge import config
from tuneforge._version import __version__
from tuneforge.errors import CompileError, ConfigError, NoValidChoicesError, TemplateError, TuneforgeError

if TYPE_CHECKING:
    from tuneforge import cpp, cuda, python
    from tuneforge.kernels.gemm import gemm
    from tuneforge.kernels.gemm.packed import PackedB, pack_b
    from tuneforge.search import Budget, Space
    from tuneforge.store.shipped import load_bundle
    from tuneforge.tune.autotune import autotune
    from tuneforge.tune.choices import CallableChoice, Choice, ExternChoice
    from tuneforge.tune.runner import prepare
    from tuneforge.tune.searched import SearchPlan
    from tuneforge.tune.select import Selection, select, select_detailed
    from tuneforge.tune.specs import TensorSpec
    from tuneforge.tune.template import KernelTemplate
    from tuneforge.tune.triton_template import TritonConfig, TritonTemplate

__all__ = [
    "Budget",
    "CallableChoice",
    "Choice",
    "CompileError",
    "ConfigError",
    "ExternChoice",
    "KernelTemplate",
    "NoValidChoicesError",
    "PackedB",
    "SearchPlan",
    "Selection",
    "Space",
    "TemplateError",
    "TensorSpec",
    "TritonConfig",
    "TritonTemplate",
    "TuneforgeError",
    "__version__",
    "autotune",
    "config",
    "cpp",
    "cuda",
    "gemm",
    "load_bundle",
    "pack_b",
    "prepare",
    "python",
    "select",
    "select_detailed",
]

_LAZY_MODULES = {"cpp", "cuda", "python", "hashing"}
# Public names and the module that defines them, imported on first use so `import tuneforge` stays light.
_LAZY_NAMES = {
    "autotune": "tuneforge.tune.autotune", "CallableChoice": "tuneforge.tune.choices",
    "Choice": "tuneforge.tune.choices", "ExternChoice": "tuneforge.tune.choices",
    "Selection": "tuneforge.tune.select", "select": "tuneforge.tune.select",
    "select_detailed": "tuneforge.tune.select", "TensorSpec": "tuneforge.tune.specs",
    "KernelTemplate": "tuneforge.tune.template", "gemm": "tuneforge.kernels.gemm",
    "load_bundle": "tuneforge.store.shipped", "TritonTemplate": "tuneforge.tune.triton_template",
    "TritonConfig": "tuneforge.tune.triton_template", "Budget": "tuneforge.search", "Space": "tuneforge.search",
    "SearchPlan": "tuneforge.tune.searched", "prepare": "tuneforge.tune.runner",
    "pack_b": "tuneforge.kernels.gemm.packed", "PackedB": "tuneforge.kernels.gemm.packed",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY_MODULES:
        value = importlib.import_module(f"tuneforge.{name}")
    elif name in _LAZY_NAMES:
        value = getattr(importlib.import_module(_LAZY_NAMES[name]), name)
    else:
        raise AttributeError(f"module 'tuneforge' has no attribute {name!r}")
    globals()[name] = value  # later lookups are plain attribute reads (tuneforge.gemm is on hot paths)
    return value
