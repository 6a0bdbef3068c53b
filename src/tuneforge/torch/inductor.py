"""Inductor lowerings of tuneforge::mm and tuneforge::addmm: a compiled graph calls their out-variants as extern
kernels, into the buffers Inductor allocates, with no trip through the dispatcher (a Python call, as Inductor's own
``extern_kernels.mm``). Without them Inductor falls back to the operators: correct, 15 us a call slower here (the
dispatcher and torch.library's autograd wrapper).

The generated code names them ``torch.ops.tuneforge.python_mm_out`` (set when tuneforge.torch.matmul is imported),
not ``extern_kernels.<name>``: a graph Inductor loads from its cache runs before any lowering is registered here.

Inductor's lowering API is internal; when it has changed, the fallback stays and one warning says so.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import torch

log = logging.getLogger("tuneforge.torch")
_lock = threading.Lock()
_registered = False


def register_lowerings() -> bool:
    """Register the two lowerings once per process; False when this Inductor does not take them."""
    global _registered
    with _lock:
        if _registered:
            return True
        try:
            _register()
        except Exception as exc:  # an Inductor whose internals moved: its fallback kernels still run the ops
            log.warning("tuneforge: Inductor will call tuneforge::mm/addmm through the dispatcher (its lowering "
                        "API differs: %s: %s)", type(exc).__name__, exc)
            return False
        _registered = True
        return True


def _register() -> None:
    from torch._inductor.kernel.mm_common import mm_args
    from torch._inductor.lowering import register_lowering
    from torch._inductor.select_algorithm import ExternKernelChoice, realize_inputs

    class OutVariant(ExternKernelChoice):  # type: ignore[misc]
        def __init__(self, name: str) -> None:
            super().__init__(getattr(torch.ops.tuneforge, name), name=f"tuneforge_{name}")
            self.qualified = f"torch.ops.tuneforge.{name}"

        def call_name(self) -> str:
            return self.qualified

    kernels = {name: ExternKernelChoice.lookup(f"tuneforge_{name}") or OutVariant(name)
               for name in ("python_mm_out", "python_addmm_out", "python_cpu_mm_out", "python_cpu_bias_mm_out")}

    def cpu_tuned(*nodes: Any) -> bool:
        device, dtype = nodes[0].get_device(), nodes[0].get_dtype()
        return device is not None and device.type == "cpu" and dtype in (torch.float32, torch.float64) and \
            all(n.get_dtype() == dtype and n.get_device() == device for n in nodes)

    @register_lowering(torch.ops.tuneforge.mm.default)  # type: ignore[untyped-decorator]
    def lower_mm(a: Any, b: Any) -> Any:
        _, _, _, layout, a, b = mm_args(a, b)
        # Where the layout is known to be tuned CPU matrices, the call goes straight to gemm_into.
        kernel = kernels["python_cpu_mm_out" if cpu_tuned(a, b) else "python_mm_out"]
        return kernel.bind((a, b), layout).output_node()

    @register_lowering(torch.ops.tuneforge.addmm.default)  # type: ignore[untyped-decorator]
    def lower_addmm(bias: Any, a: Any, b: Any, beta: float = 1.0, alpha: float = 1.0) -> Any:
        _, n, _, layout, a, b = mm_args(a, b)
        # The bias as it is (a row vector stays one: the kernels add it in their epilogue), not expanded to C.
        bias = realize_inputs(bias)
        sizes = bias.get_size()
        if beta == 1 and len(sizes) == 1 and sizes[0] == n and cpu_tuned(a, b, bias):
            return kernels["python_cpu_bias_mm_out"].bind((bias, a, b), layout, alpha=alpha).output_node()
        return kernels["python_addmm_out"].bind((bias, a, b), layout, beta=beta, alpha=alpha).output_node()
