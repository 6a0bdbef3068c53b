"""Route aten.mm and aten.addmm of chosen shapes to tuneforge's tuned operators, in an aten-level FX graph.

A pass over the graphs torch.compile makes after autograd (forward and backward alike), for Inductor's
``post_grad_custom_pre_pass`` (Inductor then fuses the rest and calls the tuned GEMMs as extern kernels) or for
tuneforge's own light backend (tuneforge.torch.backend). Only products tuneforge tunes are routed: two matrices of
one dtype, float32/float64 on the CPU, float16/bfloat16/float32 on CUDA.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

from tuneforge.torch.matmul import tuned

__all__ = ["MatmulRouter"]

_HERE = Path(__file__).parent


class MatmulRouter(CustomGraphPass):  # type: ignore[misc]
    """Rewrite ``aten.mm(a, b)`` and ``aten.addmm(bias, a, b)`` into tuneforge::mm / tuneforge::addmm.

    `shapes`: the (M, K, N) products to route (the others stay with aten and Inductor); None routes every product
    tuneforge tunes. A product whose sizes are symbolic (dynamic shapes) is routed only when `shapes` is None.
    """

    def __init__(self, shapes: Iterable[tuple[int, int, int]] | None = None) -> None:
        self.shapes = None if shapes is None else frozenset(_shape(s) for s in shapes)
        self.routed = 0  # products rewritten so far (by every graph this pass has seen)

    def __call__(self, graph: torch.fx.Graph) -> None:
        aten, ours = torch.ops.aten, torch.ops.tuneforge
        for node in graph.nodes:
            if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
                continue
            is_mm = node.target is aten.mm.default
            a, b = node.args[0:2] if is_mm else node.args[1:3]
            if not self._wanted(getattr(a, "meta", {}).get("val"), getattr(b, "meta", {}).get("val")):
                continue
            if is_mm:
                node.target = ours.mm.default
            else:
                beta, alpha = node.kwargs.get("beta", 1), node.kwargs.get("alpha", 1)
                if not (isinstance(beta, (int, float)) and isinstance(alpha, (int, float))):
                    continue  # a symbolic scalar: the schema takes plain floats
                node.target = ours.addmm.default
                node.args, node.kwargs = (*node.args[:3], float(beta), float(alpha)), {}
            self.routed += 1

    def _wanted(self, a: Any, b: Any) -> bool:
        if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor) or not tuned(a, b):
            return False
        if self.shapes is None:
            return True
        sizes = (a.shape[0], a.shape[1], b.shape[1])
        return all(isinstance(s, int) for s in sizes) and sizes in self.shapes

    def uuid(self) -> str:
        """Inductor's FX-graph cache key: this pass's code (and the ops') and the shapes it routes."""
        digest = hashlib.sha256()
        for name in ("routing.py", "matmul.py", "inductor.py"):
            digest.update((_HERE / name).read_bytes())
        digest.update(repr(None if self.shapes is None else sorted(self.shapes)).encode())
        return digest.hexdigest()


def _shape(s: Iterable[int]) -> tuple[int, int, int]:
    sizes = [int(x) for x in s]
    if len(sizes) != 3 or min(sizes) < 0:
        raise ValueError(f"MatmulRouter: a shape is (M, K, N) of non-negative sizes, got {tuple(sizes)!r}")
    return sizes[0], sizes[1], sizes[2]
