"""tuneforge.gemm on torch tensors in CPU memory: the kernels work on zero-copy numpy views of them, and
torch.matmul (oneDNN / MKL) is one more library candidate beside numpy.matmul.

torch is never imported here for numpy callers: it is only touched once a torch tensor has come in.
"""

from __future__ import annotations

from typing import Any

__all__ = ["is_torch_cpu", "numpy_views", "torch_gemm"]


def is_torch_cpu(value: Any) -> bool:
    """A torch tensor in CPU memory (without importing torch: a numpy caller never pays for it)."""
    return type(value).__module__.startswith("torch") and getattr(value, "is_cuda", True) is False \
        and getattr(getattr(value, "device", None), "type", None) == "cpu"


def numpy_views(a: Any, b: Any, out: Any, bias: Any, beta: float) -> tuple[Any, Any, Any, Any, Any]:
    """(a, b, out, bias) as numpy arrays sharing the tensors' memory, and the out tensor (allocated when
    None); a ValueError or TypeError naming the argument for what the kernels cannot take."""
    import torch

    given = {"a": a, "b": b, "out": out, "bias": bias}
    for name, value in given.items():
        if value is None:
            continue
        if not isinstance(value, torch.Tensor) or value.device.type != "cpu":
            kind = type(value).__name__ if not isinstance(value, torch.Tensor) else f"tensor on {value.device}"
            raise TypeError(f"gemm: a is a CPU torch tensor, so {name} must be one too (got a {kind})")
        if value.requires_grad:
            raise ValueError(f"gemm does not record gradients: {name} requires grad; pass {name}.detach()")
        if value.dtype not in (torch.float32, torch.float64):
            raise ValueError(f"gemm on CPU tensors supports float32 and float64; {name} is {value.dtype}")
    if out is None:
        if beta != 0:
            raise ValueError("beta != 0 needs an out tensor to accumulate into")
        if a.dim() != 2 or b.dim() != 2:
            raise ValueError(f"gemm needs A[M,K] and B[K,N], got shapes {list(a.shape)} and {list(b.shape)}")
        out = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
    views = [None if t is None else t.numpy() for t in (a, b, out, bias)]
    return views[0], views[1], views[2], views[3], out


def torch_gemm(a: Any, b: Any, alpha: float, beta: float, bias: Any, out: Any) -> None:
    """The second library candidate: torch.matmul / torch.addmm on the numpy arrays' memory,
    ``out = alpha * a @ b + beta * out + bias``."""
    import torch

    ta, tb, tout = torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(out)
    if alpha == 1 and beta == 0 and bias is None:
        torch.matmul(ta, tb, out=tout)
        return
    if beta == 0 and bias is not None:
        torch.addmm(torch.from_numpy(bias), ta, tb, alpha=alpha, out=tout)
        return
    tout.addmm_(ta, tb, beta=beta, alpha=alpha)  # beta 0: out's contents ignored, NaN included
    if bias is not None:
        tout.add_(torch.from_numpy(bias))
