"""tuneforge::mm and tuneforge::addmm: tuneforge.gemm as torch operators, with fake kernels and backward formulas.

Registered through torch.library when this module is imported, so ``torch.compile(fullgraph=True)`` traces them
without a graph break and autograd differentiates them (a backward's two matrix products are these ops again, so
they are tuned too, for their own layouts). Layouts tuneforge does not tune (CPU dtypes other than float32/float64,
batched or 1-D operands) run torch's own mm/addmm: the ops take whatever aten's do.
"""

from __future__ import annotations

import sys
from typing import Any

import torch

from tuneforge.kernels.gemm import gemm, gemm_into
from tuneforge.kernels.gemm.op import FRESH_PRODUCTS, fresh_product, product_key

__all__ = ["addmm", "linear", "mm"]

_lib = torch.library.Library("tuneforge", "DEF")
_lib.define("mm(Tensor self, Tensor mat2) -> Tensor")
_lib.define("addmm(Tensor self, Tensor mat1, Tensor mat2, float beta=1.0, float alpha=1.0) -> Tensor")

_CPU_TUNED = (torch.float32, torch.float64)
_CUDA_TUNED = (torch.float16, torch.bfloat16, torch.float32)
_Tensor = torch.Tensor
_fresh_products = FRESH_PRODUCTS


def tuned(a: Any, b: Any) -> bool:
    """Two matrices of one dtype the gemm family tunes on their device (else aten runs the product)."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0] or a.dtype != b.dtype or a.device != b.device:
        return False
    if a.numel() == 0 or b.numel() == 0:  # an empty product: aten's (the kernels want every size >= 1)
        return False
    return a.dtype in (_CPU_TUNED if a.device.type == "cpu" else _CUDA_TUNED if a.device.type == "cuda" else ())


def _cpu_tuned(a: Any, b: Any) -> bool:
    """_tuned for the CPU, and sizes that multiply (else aten's error), with the fewest attribute reads: the eager
    path's test."""
    if not (a.is_cpu and b.is_cpu and a.dtype is b.dtype and a.dtype in _CPU_TUNED):
        return False
    sa, sb = a.shape, b.shape
    return len(sa) == 2 and len(sb) == 2 and sa[1] == sb[0] and bool(sa[0] and sa[1] and sb[1])  # empty: aten


def mm_out(a: Any, b: Any, *, out: Any) -> None:
    """``out = a @ b`` into a fresh `out`: the kernel compiled graphs call (tuneforge.torch.inductor)."""
    if _cpu_tuned(a, b):
        gemm_into(a, b, out)
    elif tuned(a, b):
        gemm(a, b, out)
    else:
        torch.mm(a, b, out=out)


def addmm_out(bias: Any, a: Any, b: Any, *, beta: float = 1.0, alpha: float = 1.0, out: Any) -> None:
    """``out = beta * bias + alpha * a @ b`` into a fresh `out` (`bias` broadcast to it, as aten's addmm)."""
    cpu = _cpu_tuned(a, b)
    if not (cpu or tuned(a, b)) or bias.dtype is not a.dtype or bias.device != a.device:
        torch.addmm(bias, a, b, beta=beta, alpha=alpha, out=out)
        return
    row = bias.dim() == 1 and bias.shape[0] == out.shape[1] and beta == 1
    if not row:  # the bias becomes C: broadcast into the output, then accumulated onto
        out.copy_(bias.expand(out.shape))
    if cpu:
        gemm_into(a, b, out, alpha, 0.0 if row else beta, bias if row else None)
    else:
        gemm(a, b, out, alpha=alpha, beta=0.0 if row else beta, bias=bias if row else None)


def bias_mm_out(bias: Any, a: Any, b: Any, *, alpha: float = 1.0, out: Any) -> None:
    """``out = alpha * a @ b + bias`` for CPU float32/float64 matrices and a row vector `bias` of their dtype: what
    compiled graphs call for such an addmm (the layout checked when the graph was lowered)."""
    gemm_into(a, b, out, alpha, 0.0, bias)


def _mm_kernel(a: Any, b: Any) -> Any:
    known = _fresh_products.get(product_key(a, b))
    if known is not None:  # a layout checked and tuned before: its call, bound
        return known(a, b)
    if _cpu_tuned(a, b):
        return fresh_product(a, b)
    if not tuned(a, b):
        return torch.mm(a, b)  # aten's checks and errors for everything else
    out = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    gemm(a, b, out)
    return out


def _addmm_kernel(bias: Any, a: Any, b: Any, beta: float = 1.0, alpha: float = 1.0) -> Any:
    if not tuned(a, b):
        return torch.addmm(bias, a, b, beta=beta, alpha=alpha)
    out = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    addmm_out(bias, a, b, beta=beta, alpha=alpha, out=out)
    return out


# The out-variants as Python functions in the operators' namespace, where code Inductor generated finds them.
# Their names are in Inductor's cached code: they keep them and their signatures.
torch.ops.tuneforge.python_mm_out = mm_out
torch.ops.tuneforge.python_addmm_out = addmm_out
torch.ops.tuneforge.python_cpu_mm_out = gemm_into  # (a, b, out=): CPU float32/float64 matrices only
torch.ops.tuneforge.python_cpu_bias_mm_out = bias_mm_out

for _key in ("CPU", "CUDA"):
    _lib.impl("mm", _mm_kernel, _key)
    _lib.impl("addmm", _addmm_kernel, _key)


def _check_product(a: Any, b: Any) -> None:
    torch._check(a.dim() == 2 and b.dim() == 2, lambda: f"tuneforge::mm needs two matrices, got {a.dim()}-D and "
                 f"{b.dim()}-D")
    torch._check(a.shape[1] == b.shape[0], lambda: f"tuneforge::mm: shapes {list(a.shape)} and {list(b.shape)} "
                 "cannot be multiplied")
    torch._check(a.dtype == b.dtype, lambda: f"tuneforge::mm: dtypes differ ({a.dtype} and {b.dtype})")


@torch.library.register_fake("tuneforge::mm")  # type: ignore[untyped-decorator]
def _mm_fake(a: Any, b: Any) -> Any:
    _lower_in_inductor()
    _check_product(a, b)
    return a.new_empty((a.shape[0], b.shape[1]))


@torch.library.register_fake("tuneforge::addmm")  # type: ignore[untyped-decorator]
def _addmm_fake(bias: Any, a: Any, b: Any, beta: float = 1.0, alpha: float = 1.0) -> Any:
    _lower_in_inductor()
    _check_product(a, b)
    return a.new_empty((a.shape[0], b.shape[1]))


def _lower_in_inductor() -> None:
    """While Inductor compiles (its lowering module is loaded: fake kernels run while it traces), teach it to call
    the ops' out-variants straight from the compiled graph. Not imported otherwise: it costs seconds."""
    if "torch._inductor.lowering" in sys.modules:
        from tuneforge.torch.inductor import register_lowerings

        register_lowerings()


def _mm_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    a, b = inputs
    ctx.save_for_backward(a if ctx.needs_input_grad[1] else None, b if ctx.needs_input_grad[0] else None)


def _mm_backward(ctx: Any, grad: Any) -> tuple[Any, Any]:
    a, b = ctx.saved_tensors
    grad_a = mm(grad, b.t()) if ctx.needs_input_grad[0] else None
    grad_b = mm(a.t(), grad) if ctx.needs_input_grad[1] else None
    return grad_a, grad_b


def _addmm_setup(ctx: Any, inputs: tuple[Any, ...], output: Any) -> None:
    bias, a, b, beta, alpha = (*inputs, 1.0, 1.0)[:5]
    ctx.beta, ctx.alpha, ctx.bias_shape = beta, alpha, bias.shape
    ctx.save_for_backward(a if ctx.needs_input_grad[2] else None, b if ctx.needs_input_grad[1] else None)


def _addmm_backward(ctx: Any, grad: Any) -> tuple[Any, ...]:
    a, b = ctx.saved_tensors
    grad_bias = grad_a = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_bias = grad.sum_to_size(ctx.bias_shape)
        grad_bias = grad_bias * ctx.beta if ctx.beta != 1 else grad_bias
    if ctx.needs_input_grad[1]:
        grad_a = mm(grad, b.t())
        grad_a = grad_a * ctx.alpha if ctx.alpha != 1 else grad_a
    if ctx.needs_input_grad[2]:
        grad_b = mm(a.t(), grad)
        grad_b = grad_b * ctx.alpha if ctx.alpha != 1 else grad_b
    return grad_bias, grad_a, grad_b, None, None


torch.library.register_autograd("tuneforge::mm", _mm_backward, setup_context=_mm_setup)
torch.library.register_autograd("tuneforge::addmm", _addmm_backward, setup_context=_addmm_setup)

_mm_op = torch.ops.tuneforge.mm.default
_addmm_op = torch.ops.tuneforge.addmm.default
_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
_dispatch_modes = torch._C._len_torch_dispatch_stack
_function_modes = torch._C._is_torch_function_mode_enabled
_transforms = torch._C._functorch.get_dynamic_layer_stack_depth


def _plain(a: Any, b: Any) -> bool:
    """Plain eager tensors that need no gradient, under no mode or transform: the operator's kernel may be called
    as a function, skipping the dispatcher (4 us here) and torch.library's autograd wrapper (11 us)."""
    return (type(a) is _Tensor and type(b) is _Tensor and not (_grad_enabled() and (a.requires_grad or b.requires_grad))
            and not _dispatch_modes() and not _function_modes() and not _transforms())


def mm(a: Any, b: Any) -> Any:
    """``a @ b`` through tuneforge::mm (its kernel called directly in plain eager code)."""
    if not _is_compiling() and _plain(a, b):
        return _mm_kernel(a, b)
    return _mm_op(a, b)


def addmm(bias: Any, a: Any, b: Any, beta: float = 1.0, alpha: float = 1.0) -> Any:
    """``beta * bias + alpha * a @ b`` through tuneforge::addmm, as torch.addmm (bias broadcast)."""
    if not _is_compiling() and _plain(a, b) and type(bias) is _Tensor and not (_grad_enabled() and bias.requires_grad):
        return _addmm_kernel(bias, a, b, beta, alpha)
    return _addmm_op(bias, a, b, beta, alpha)


def linear(x: Any, weight: Any, bias: Any = None) -> Any:
    """torch.nn.functional.linear through the tuned ops: ``x @ weight.T + bias`` over x's last dimension."""
    rows = x.reshape(-1, x.shape[-1])
    y = mm(rows, weight.t()) if bias is None else addmm(bias, rows, weight.t())
    return y.reshape(*x.shape[:-1], weight.shape[0])
