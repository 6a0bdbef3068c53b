"""tuneforge.gemm on CUDA tensors: ``out = act(alpha * a @ b + beta * out + bias)``, tuned per layout.

The first call for a layout (sizes, strides, dtype, device, epilogue) selects among cuBLAS (torch.mm /
torch.addmm, always a candidate and the reference, so the tuned op never loses to it) and the Triton
GEMM configurations of the device's `default` (or `exhaustive`) space; the decision and the compiled
kernels are cached, and later calls in the process go straight to the winner through a dict.

fp16, bf16 and fp32 inputs. fp32 is multiplied as the setting ``cuda.fp32_precision`` says: ``ieee``,
``tf32`` (tensor cores), ``tf32x3`` (three TF32 products, near-IEEE), or ``torch`` (the default): tf32
where torch allows it (``torch.backends.cuda.matmul.allow_tf32``), else ieee. cuBLAS runs with TF32
allowed exactly when the precision is tf32, and results are verified with tolerances for that precision.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from tuneforge import config
from tuneforge.kernels.gemm_gpu.choice import GemmLayout, GemmTritonChoice, torch_gemm
from tuneforge.kernels.gemm_gpu.render import ACTIVATIONS, DTYPES, Epilogue, index_fits
from tuneforge.kernels.gemm_gpu.space import DeviceLimits, default_space, exhaustive_space
from tuneforge.tune.choices import Choice, ExternChoice

__all__ = ["clear_dispatch", "cublas_choice", "cuda_unavailable", "device_limits", "fp32_precision", "gemm_cuda",
           "gpu_choices", "op_name", "tuning_problem"]

SPACES = ("default", "exhaustive")
Run = Callable[[list[Any]], Any]


TF32_TOLERANCE = (5e-3, 5e-3)  # (rtol, atol): TF32 keeps 10 mantissa bits of each fp32 operand


def fp32_precision() -> str:
    """How float32 products are computed: the setting ``cuda.fp32_precision``, ``torch`` resolved."""
    setting = config.get_str("cuda.fp32_precision")
    if setting != "torch":
        return setting
    import torch

    return "tf32" if torch.backends.cuda.matmul.allow_tf32 else "ieee"


def cublas_choice(activation: str = "none", precision: str = "ieee") -> ExternChoice:
    """The library candidate and reference: torch.mm / torch.addmm (cuBLAS) with the epilogue, TF32 allowed
    exactly when `precision` is tf32 (tf32x3 has no cuBLAS counterpart: IEEE is as close as it gets)."""
    if precision == "tf32":
        return ExternChoice(torch_gemm, name="cublas", activation=activation, tf32=True)
    return ExternChoice(torch_gemm, name="cublas", activation=activation)


def gpu_choices(m: int, n: int, k: int, dtype: str, epilogue: Epilogue, limits: DeviceLimits,
                space: str = "default", layout: GemmLayout | None = None) -> list[Choice]:
    """cuBLAS first, then a `GemmTritonChoice` per configuration of the space that fits `limits`.
    `layout` is what the Triton kernels are built for ahead of the first call (default: row-major)."""
    if dtype not in DTYPES:
        raise ValueError(f"gemm on CUDA supports {', '.join(DTYPES)}, not {dtype}")
    if space not in SPACES:
        raise ValueError(f"space must be 'default' or 'exhaustive', not {space!r}")
    configs = default_space(m, n, k, dtype, limits) if space == "default" else \
        list(exhaustive_space(m, n, k, dtype, limits))
    layout = layout or GemmLayout.contiguous(m, n, k, epilogue.bias)
    precision = epilogue.precision if dtype == "float32" else "ieee"
    return [cublas_choice(epilogue.activation, precision),
            *(GemmTritonChoice(config, dtype, epilogue, layout) for config in configs)]


def op_name(beta: float, bias: Any, activation: str = "none", precision: str = "ieee") -> str:
    """As the CPU op names its variants (reading C and a bias change the work), plus the activation and a
    float32 precision other than IEEE (a decision for TF32 products must not answer for IEEE ones)."""
    return "gemm" + ("_beta" if beta != 0 else "") + ("_bias" if bias is not None else "") + \
        ("" if activation == "none" else f"_{activation}") + ("" if precision == "ieee" else f"_{precision}")


_limits: dict[int, DeviceLimits] = {}


def device_limits(device: Any) -> DeviceLimits:
    """The limits of a CUDA device (asked once per device and process)."""
    import torch

    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    found = _limits.get(index)
    if found is None:
        found = _limits[index] = DeviceLimits.from_torch(index)
    return found


def _check(a: Any, b: Any, out: Any, bias: Any, activation: str) -> None:
    import torch

    tensors = {"a": a, "b": b, "out": out, "bias": bias}
    for what, t in tensors.items():
        if t is not None and not isinstance(t, torch.Tensor):
            raise TypeError(f"gemm on CUDA takes torch tensors; {what} is a {type(t).__name__}")
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"gemm needs A[M,K] and B[K,N], got shapes {list(a.shape)} and {list(b.shape)}")
    dtype = str(a.dtype).removeprefix("torch.")
    if a.dtype != b.dtype or dtype not in DTYPES:
        raise ValueError(f"gemm on CUDA needs A and B of one dtype, {', '.join(DTYPES)}; got {a.dtype} and {b.dtype}")
    if a.device.type != "cuda" or any(t is not None and t.device != a.device for t in tensors.values()):
        devices = ", ".join(f"{w} on {t.device}" for w, t in tensors.items() if t is not None)
        raise ValueError(f"gemm on CUDA needs every tensor on one CUDA device; {devices}")
    m, n = a.shape[0], b.shape[1]
    if out is not None and (tuple(out.shape) != (m, n) or out.dtype != a.dtype):
        raise ValueError(f"out must be {a.dtype}[{m}x{n}], got {out.dtype}{list(out.shape)}")
    if bias is not None and (tuple(bias.shape) != (n,) or bias.dtype != a.dtype):
        raise ValueError(f"bias must be {a.dtype}[{n}], got {bias.dtype}{list(bias.shape)}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {activation!r} (known: {', '.join(ACTIVATIONS)})")
    if not index_fits(a, b, out, bias):
        raise ValueError("gemm on CUDA: a tensor spans 2**31 elements or more (the kernels index in 32 bits)")


_lock = threading.Lock()
# layout -> (the winner's run, the byte extents of a, b and bias, and of out: what the overlap check needs)
_dispatch: dict[tuple[Any, ...], tuple[Run, tuple[int, int, int], int]] = {}


def gemm_cuda(a: Any, b: Any, out: Any = None, *, alpha: float = 1.0, beta: float = 0.0, bias: Any = None,
              activation: str = "none", space: str = "default") -> Any:
    """``out = act(alpha * a @ b + beta * out + bias)`` for 2-D fp16/bf16/fp32 torch tensors on one CUDA device.

    With ``beta == 0`` (the default) `out`'s previous contents are ignored; `bias` is a row vector of
    length N; `activation` is one of "none", "relu", "gelu_tanh", "silu". Returns `out` (allocated
    contiguous when not given). The first call for a layout tunes (or finds the decision in the caches);
    later calls go straight to the winner.
    """
    if out is None:
        if beta != 0:
            raise ValueError("beta != 0 needs an out tensor to accumulate into")
        import torch

        try:
            out = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
        except (AttributeError, TypeError, IndexError):  # not tensors: let the checks name the problem
            _check(a, b, out, bias, activation)
            raise
    try:
        precision = fp32_precision() if a.dtype == _float32() else "ieee"
        key = (a.shape, b.shape, a.stride(), b.stride(), out.stride(), a.dtype, b.dtype, out.dtype, a.device,
               out.device, beta != 0, None if bias is None else (bias.shape, bias.stride(), bias.dtype, bias.device),
               activation, space, precision)
    except (AttributeError, TypeError):  # not tensors: let the checks name the problem
        _check(a, b, out, bias, activation)
        raise
    found = _dispatch.get(key)
    if found is None:
        _check(a, b, out, bias, activation)
        found = _tune(key, a, b, out, beta, bias, activation, space, precision)
    run, extents, out_extent = found
    # An input sharing memory with out (which the kernels write while reading it) is copied first.
    lo = out.data_ptr()
    hi = lo + out_extent
    if (extents[0] and (x := a.data_ptr()) < hi and lo < x + extents[0]):
        a = a.clone()
    if (extents[1] and (x := b.data_ptr()) < hi and lo < x + extents[1]):
        b = b.clone()
    if (extents[2] and (x := bias.data_ptr()) < hi and lo < x + extents[2]):
        bias = bias.clone()
    if a.device.index != _current_device():
        import torch

        with torch.cuda.device(a.device):
            run([a, b, alpha, beta, bias, out])
    else:
        run([a, b, alpha, beta, bias, out])
    return out


def _float32() -> Any:
    import torch

    return torch.float32


def _current_device() -> int:
    import torch

    return int(torch.cuda.current_device())


def _extent(t: Any) -> int:
    """The bytes from `t`'s first element to past its last (0: no tensor, or no elements): what its sizes,
    strides and dtype (a dispatch key's) say, so a call only adds its address."""
    if t is None or t.numel() == 0:
        return 0
    return int(t.element_size() * (1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride(), strict=True))))


def _tune(key: tuple[Any, ...], a: Any, b: Any, out: Any, beta: float, bias: Any, activation: str,
          space: str, precision: str) -> tuple[Run, tuple[int, int, int], int]:
    from tuneforge.tune.select import select

    with _lock:
        found = _dispatch.get(key)
        if found is not None:
            return found
        dtype = str(a.dtype).removeprefix("torch.")
        epilogue = Epilogue(bias=bias is not None, beta=beta != 0, activation=activation, precision=precision)
        layout = GemmLayout.of(a, b, out, bias)
        candidates = gpu_choices(layout.m, layout.n, layout.k, dtype, epilogue, device_limits(a.device), space,
                                 layout)
        rtol, atol = TF32_TOLERANCE if precision == "tf32" else (None, None)
        winner = select(op_name(beta, bias, activation, precision), candidates, [a, b, 1.0, beta, bias], out=out,
                        reference=candidates[0], accumulate=beta != 0, rtol=rtol, atol=atol)
        entry = _dispatch[key] = (winner.run, (_extent(a), _extent(b), _extent(bias)), _extent(out))
        return entry


def clear_dispatch() -> None:
    """Forget the winners of this process's layouts (decisions stay in the record database)."""
    with _lock:
        _dispatch.clear()


def cuda_unavailable() -> str | None:
    """Why this process cannot run CUDA kernels (None: it can)."""
    try:
        import torch
    except ImportError:
        return "torch is not installed (the GPU GEMM takes torch tensors)"
    if not torch.cuda.is_available():
        return "no CUDA GPU here (torch.cuda.is_available() is False)"
    return None


def tuning_problem(m: int, n: int, k: int, dtype: str, space: str = "default",
                   device: int = 0) -> tuple[list[Choice], list[Any], Any, Choice]:
    """What `tuneforge tune gemm --device cuda` selects among for ``C = A @ B`` with row-major operands:
    (choices, input specs (a, b, alpha, beta, bias), out spec, reference)."""
    from tuneforge.tune.specs import TensorSpec

    def spec(rows: int, cols: int) -> TensorSpec:
        return TensorSpec.contiguous((rows, cols), dtype, device="cuda", device_index=device, framework="torch")

    precision = fp32_precision() if dtype == "float32" else "ieee"
    candidates = gpu_choices(m, n, k, dtype, Epilogue(precision=precision), device_limits(device), space)
    return candidates, [spec(m, k), spec(k, n), 1.0, 0.0, None], spec(m, n), candidates[0]
