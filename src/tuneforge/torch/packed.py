"""Inference with torch.nn.Linear weights packed once: ``tuneforge.torch.pack_linears(model)``.

Every call of a Linear layer multiplies by the same weight, and every GEMM call packs that weight anew (for the
weight's layout, W.T, a strided read of all of it): at batch 32 and 1024 features a large part of the call.
`pack_linears` swaps each CPU float32/float64 nn.Linear of a model for a `PackedLinear`, whose weight is copied
and packed once (tuneforge.pack_b) and whose products go through the operator ``tuneforge::packed_linear``, so
torch.compile traces them without a graph break. The packed weights are a snapshot, as with Inductor's freezing:
after training or loading new weights, call pack_linears on the original layers again. Inference only: an input
that needs a gradient is refused (the layer has no backward).
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

import torch

from tuneforge.kernels.gemm.packed import PackedB, gemm_packed
from tuneforge.kernels.gemm.torch_cpu import array

__all__ = ["PackedLinear", "pack_linears"]

_lib = torch.library.Library("tuneforge", "FRAGMENT")
_lib.define("packed_linear(Tensor x, int weight, int out_features, Tensor? bias) -> Tensor")

# Handles of the live packed weights (an operator's arguments are tensors and numbers), with their torch dtype: the
# module owns its weight.
_weights: dict[int, tuple[weakref.ReferenceType[PackedB], Any]] = {}
_handles = itertools.count(1)
_DTYPES = (torch.float32, torch.float64)


def _register(packed: PackedB, dtype: Any) -> int:
    handle = next(_handles)
    _weights[handle] = (weakref.ref(packed), dtype)
    weakref.finalize(packed, _weights.pop, handle, None)
    return handle


def _packed_linear(x: Any, weight: int, out_features: int, bias: Any) -> Any:
    ref, dtype = _weights.get(weight, (None, None))
    packed = ref() if ref is not None else None
    if packed is None:
        raise RuntimeError(f"tuneforge::packed_linear: no packed weight {weight} (its PackedLinear was freed)")
    if x.dtype is not dtype or not x.is_cpu:
        raise ValueError(f"tuneforge::packed_linear: the weight is {dtype} on the CPU; the input is {x.dtype} on "
                         f"{x.device}")
    rows = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    out = torch.empty((rows.shape[0], out_features), dtype=dtype)
    gemm_packed(array(rows), packed, out.numpy(), 1.0, 0.0, None if bias is None else array(bias), "default",
                "torch")
    return out if x.dim() == 2 else out.reshape(*x.shape[:-1], out_features)


_lib.impl("packed_linear", _packed_linear, "CPU")


@torch.library.register_fake("tuneforge::packed_linear")  # type: ignore[untyped-decorator]
def _packed_linear_fake(x: Any, weight: int, out_features: int, bias: Any) -> Any:
    return x.new_empty((*x.shape[:-1], out_features))


_op = torch.ops.tuneforge.packed_linear.default
_is_compiling = torch.compiler.is_compiling


class PackedLinear(torch.nn.Module):  # type: ignore[misc]
    """An nn.Linear for inference whose weight was copied and packed once (see the module's docstring). It keeps
    the original `weight` and `bias` parameters (so state_dict is unchanged); its products read the packed copy."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        weight = linear.weight
        if weight.device.type != "cpu" or weight.dtype not in _DTYPES or weight.dim() != 2:
            raise ValueError(f"PackedLinear: a CPU float32/float64 nn.Linear is needed, got a {weight.dtype} weight "
                             f"on {weight.device}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = weight
        self.bias = linear.bias
        self.packed = PackedB(weight.detach().numpy().T)
        self.handle = _register(self.packed, weight.dtype)

    def forward(self, x: Any) -> Any:
        if torch.is_grad_enabled() and x.requires_grad:
            raise RuntimeError("PackedLinear is for inference: its input requires grad (run under torch.no_grad() "
                               "or torch.inference_mode(), or keep the nn.Linear for training)")
        bias = None if self.bias is None else self.bias.detach()
        if _is_compiling():
            return _op(x, self.handle, self.out_features, bias)
        return _packed_linear(x, self.handle, self.out_features, bias)  # eager: no dispatcher in between

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


def pack_linears(model: torch.nn.Module) -> int:
    """Replace, in place, every CPU float32/float64 torch.nn.Linear inside `model` (not `model` itself) by a
    PackedLinear holding a packed copy of its weight; returns how many were replaced."""
    replaced = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear and child.weight.device.type == "cpu" and child.weight.dtype in _DTYPES:
                setattr(parent, name, PackedLinear(child))
                replaced += 1
    return replaced
