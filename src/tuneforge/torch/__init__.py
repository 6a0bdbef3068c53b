"""tuneforge in PyTorch: tuned operators that torch.compile traces without a graph break.

- ``tuneforge.torch.mm(a, b)``, ``addmm(bias, a, b, beta, alpha)`` and ``linear(x, weight, bias)``: the
  ``tuneforge::mm`` / ``tuneforge::addmm`` operators (tuneforge.gemm on CPU float32/float64 and CUDA
  float16/bfloat16/float32 tensors, aten's kernels for anything else), with fake kernels and backward formulas.
- ``@tuneforge.torch.op("ns::name", choices)``: your own tuned operator from select() choices.
- ``pack_linears(model)``: for inference, each CPU nn.Linear's weight copied and packed once (tuneforge.pack_b).
- ``MatmulRouter(shapes)``: a graph pass that sends aten.mm/addmm of chosen shapes to the tuned operators, for
  Inductor (``torch._inductor.config.post_grad_custom_pre_pass``) or for ``backend()``, a light torch.compile
  backend without code generation.

Importing this module imports torch and registers the operators; ``import tuneforge`` alone never does.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from tuneforge.torch.matmul import addmm, linear, mm

if TYPE_CHECKING:
    from tuneforge.torch.backend import backend
    from tuneforge.torch.custom import TunedOp, op
    from tuneforge.torch.packed import PackedLinear, pack_linears
    from tuneforge.torch.routing import MatmulRouter

__all__ = ["MatmulRouter", "PackedLinear", "TunedOp", "addmm", "backend", "linear", "mm", "op", "pack_linears"]

_LAZY = {"backend": "tuneforge.torch.backend", "op": "tuneforge.torch.custom", "TunedOp": "tuneforge.torch.custom",
         "MatmulRouter": "tuneforge.torch.routing", "PackedLinear": "tuneforge.torch.packed",
         "pack_linears": "tuneforge.torch.packed"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'tuneforge.torch' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value
