"""A light torch.compile backend: AOT autograd's aten graphs (forward and backward) with their matrix products
routed to tuneforge's tuned operators, run as they are, with no code generation.

``torch.compile(model, backend=tuneforge.torch.backend())``: for models whose time is in their GEMMs, the first
compiled step costs the trace and the tuning only (Inductor's C++ code generation and compile take seconds even
when its caches are warm); the element-wise operations between the products run as aten's kernels, unfused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch

from tuneforge.torch.routing import MatmulRouter

__all__ = ["backend"]


def backend(shapes: Iterable[tuple[int, int, int]] | None = None) -> Callable[..., Any]:
    """A torch.compile backend routing the (M, K, N) products in `shapes` (None: all that tuneforge tunes)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._functorch.aot_autograd import make_boxed_func

    router = MatmulRouter(shapes)

    def route(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        router(gm.graph)
        gm.recompile()
        return make_boxed_func(gm.forward)  # type: ignore[no-any-return]

    compiler = aot_autograd(fw_compiler=route, bw_compiler=route)
    compiler.router = router  # how many products it routed, for a test or a user who wonders
    return compiler  # type: ignore[no-any-return]
