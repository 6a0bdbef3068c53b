"""tuneforge.gemm on torch tensors in CPU memory: the kernels work on zero-copy numpy views of them (or their data
addresses), and torch.matmul (oneDNN / MKL) is the library candidate in numpy.matmul's place.

torch is never imported here for numpy callers: it is only touched once a torch tensor has come in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["allocator", "array", "fresh_output", "is_torch_cpu", "new_matrix", "numpy_views", "torch_gemm",
           "torch_gemm_tensors"]


def is_torch_cpu(value: Any) -> bool:
    """A torch tensor in CPU memory (without importing torch: a numpy caller never pays for it)."""
    return type(value).__module__.startswith("torch") and getattr(value, "is_cuda", True) is False \
        and getattr(getattr(value, "device", None), "type", None) == "cpu"


def threads() -> int:
    """The threads torch's CPU ops run on (its intra-op pool)."""
    import torch

    return int(torch.get_num_threads())


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


def new_matrix(m: int, n: int, dtype: Any) -> Any:
    """An uninitialised row-major CPU matrix, by the allocator compiled graphs use (1.4 us here; torch.empty with
    a dtype: 4.4)."""
    return (_empty_strided or allocator())((m, n), (n, 1), dtype)


def allocator() -> Callable[[tuple[int, ...], tuple[int, ...], Any], Any]:
    """``empty(size, stride, dtype)``: an uninitialised CPU tensor, by the allocator compiled graphs use."""
    global _empty_strided
    if _empty_strided is None:
        import torch

        fast = getattr(getattr(getattr(torch._C, "_dynamo", None), "guards", None), "_empty_strided_cpu", None)
        _empty_strided = fast or (lambda size, stride, dtype: torch.empty_strided(size, stride, dtype=dtype))
    return _empty_strided


_empty_strided: Callable[[tuple[int, ...], tuple[int, ...], Any], Any] | None = None


def fresh_output(a: Any, b: Any, bias: Any) -> Any:
    """gemm's output for CPU tensors `a` @ `b` (+ `bias`) that gemm_into can take with no further checks (2-D, one
    float dtype, no gradients), else None (the checked path then names what is wrong)."""
    import torch

    if not (isinstance(b, torch.Tensor) and b.device.type == "cpu" and a.dim() == 2 and b.dim() == 2
            and a.dtype is b.dtype and a.dtype in (torch.float32, torch.float64) and a.shape[1] == b.shape[0]
            and not a.requires_grad and not b.requires_grad):
        return None
    if bias is not None and not (isinstance(bias, torch.Tensor) and bias.device.type == "cpu"
                                 and bias.dtype is a.dtype and not bias.requires_grad):
        return None
    return new_matrix(a.shape[0], b.shape[1], a.dtype)


def array(tensor: Any) -> Any:
    """A numpy view of a CPU tensor, which may require grad (an operator's kernel runs below autograd)."""
    return (tensor.detach() if tensor.requires_grad else tensor).numpy()


def torch_gemm(a: Any, b: Any, alpha: float, beta: float, bias: Any, out: Any) -> None:
    """The second library candidate: torch.matmul / torch.addmm on the numpy arrays' memory,
    ``out = alpha * a @ b + beta * out + bias``."""
    import torch

    torch_gemm_tensors(alpha, beta, torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(out),
                       None if bias is None else torch.from_numpy(bias))


def torch_gemm_tensors(alpha: float, beta: float, ta: Any, tb: Any, tout: Any, tbias: Any) -> None:
    """torch_gemm on tensors (in tuneforge.kernels.gemm.op's argument order)."""
    import torch

    if alpha == 1 and beta == 0 and tbias is None:
        torch.matmul(ta, tb, out=tout)
        return
    if beta == 0 and tbias is not None:
        torch.addmm(tbias, ta, tb, alpha=alpha, out=tout)
        return
    tout.addmm_(ta, tb, beta=beta, alpha=alpha)  # beta 0: out's contents ignored, NaN included
    if tbias is not None:
        tout.add_(tbias)
