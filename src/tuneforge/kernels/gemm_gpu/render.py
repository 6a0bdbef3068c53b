"""Rendering the Triton GEMM kernels: a configuration, an epilogue, the source and what a builder needs.

Semantics (those of the CPU family): ``out = act(alpha * a @ b + beta * out + bias)`` with ``bias`` a
row vector of N broadcast over the M rows; ``beta`` is a rendered option (off: `out` is only written),
``alpha`` always a run-time scalar. Inputs fp16, bf16 or fp32; accumulation in fp32; `out` has the
inputs' dtype. For fp32, ``Epilogue.precision`` picks tl.dot's input precision (ieee, tf32, tf32x3).

Kinds: ``mm`` (one kernel), and split-K as two kernels, ``splitk`` (fp32 partial tiles per K slice into
a workspace of SPLIT_K x M x N) then ``splitk_reduce`` (adds the slices in order, applies the epilogue).
A second pass rather than atomic adds: the sum is deterministic, the epilogue may be non-linear, and
the workspace is small for the shapes split-K is for (few output tiles, long K).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from typing import Any

from tuneforge.dataclass_lite import dataclass
from tuneforge.errors import TemplateError
from tuneforge.kernels.gemm_gpu import templates
from tuneforge.tune.template import KernelTemplate

# dtype name -> (Triton pointer element, Triton type in the source, bytes)
DTYPES: dict[str, tuple[str, str, int]] = {"float16": ("fp16", "tl.float16", 2),
                                           "bfloat16": ("bf16", "tl.bfloat16", 2),
                                           "float32": ("fp32", "tl.float32", 4)}
ACTIVATIONS = ("none", "relu", "gelu_tanh", "silu")
PRECISIONS = ("ieee", "tf32", "tf32x3")
KINDS = ("mm", "splitk", "splitk_reduce")

_TEMPLATES = {kind: KernelTemplate(f"tuneforge_triton_{kind}", source, signature="{{ name }}", language="python")
              for kind, source in (("mm", templates.MM), ("splitk", templates.SPLITK),
                                   ("splitk_reduce", templates.SPLITK_REDUCE))}


@dataclass(frozen=True)
class Config:
    """One point of the space: tile sizes, grouping, K slices, and the launch options."""

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3

    @property
    def kernels(self) -> tuple[str, ...]:
        """The kinds this configuration launches, in order."""
        return ("mm",) if self.split_k == 1 else ("splitk", "splitk_reduce")

    @property
    def name(self) -> str:
        """Stable, for records and tables: e.g. ``128x128x64_g8_k1_w4_s3``."""
        return (f"{self.block_m}x{self.block_n}x{self.block_k}_g{self.group_m}_k{self.split_k}"
                f"_w{self.num_warps}_s{self.num_stages}")

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class Epilogue:
    bias: bool = False
    beta: bool = False  # read `out` (beta != 0)
    activation: str = "none"
    precision: str = "tf32"  # fp32 inputs only

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise TemplateError(f"unknown activation {self.activation!r} (known: {', '.join(ACTIVATIONS)})")
        if self.precision not in PRECISIONS:
            raise TemplateError(f"unknown input precision {self.precision!r} (known: {', '.join(PRECISIONS)})")

    @property
    def name(self) -> str:
        parts = [p for p, on in (("bias", self.bias), ("beta", self.beta)) if on]
        return "_".join([*parts, *([self.activation] if self.activation != "none" else [])]) or "plain"


@dataclass(frozen=True)
class Rendered:
    """A rendered kernel module: what a builder compiles (ASTSource(fn, signature, constexprs))."""

    kind: str
    dtype: str
    epilogue: Epilogue
    name: str  # the kernel function in `source`
    source: str
    signature: dict[str, str]  # every parameter, in order: "*fp16", "i32", "fp32" or "constexpr"

    @property
    def runtime_params(self) -> tuple[str, ...]:
        return tuple(p for p, t in self.signature.items() if t != "constexpr")

    @property
    def constexpr_params(self) -> tuple[str, ...]:
        return tuple(p for p, t in self.signature.items() if t == "constexpr")


def _signature(kind: str, dtype: str, ep: Epilogue) -> dict[str, str]:
    ptr = "*" + DTYPES[dtype][0]
    sig: dict[str, str] = {}
    if kind == "splitk":
        sig.update(a_ptr=ptr, b_ptr=ptr, ws_ptr="*fp32", M="i32", N="i32", K="i32", stride_am="i32",
                   stride_ak="i32", stride_bk="i32", stride_bn="i32")
        return {**sig, **dict.fromkeys(("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "SPLIT_K", "EVEN_K"),
                                       "constexpr")}
    sig.update({"a_ptr": ptr, "b_ptr": ptr} if kind == "mm" else {"ws_ptr": "*fp32"})
    sig["c_ptr"] = ptr
    if ep.bias:
        sig["bias_ptr"] = ptr
    sig.update(dict.fromkeys(("M", "N", "K") if kind == "mm" else ("M", "N"), "i32"))
    if kind == "mm":
        sig.update(dict.fromkeys(("stride_am", "stride_ak", "stride_bk", "stride_bn"), "i32"))
    sig.update(stride_cm="i32", stride_cn="i32")
    if ep.bias:
        sig["stride_bias"] = "i32"
    sig["alpha"] = "fp32"
    if ep.beta:
        sig["beta"] = "fp32"
    consts = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "EVEN_K") if kind == "mm" else \
        ("BLOCK_M", "BLOCK_N", "SPLIT_K")
    return {**sig, **dict.fromkeys(consts, "constexpr")}


def _normalized(kind: str, dtype: str, ep: Epilogue) -> Epilogue:
    """Options a kind or dtype ignores are dropped, so they never make two sources of one kernel."""
    precision = ep.precision if dtype == "float32" and kind != "splitk_reduce" else "tf32"
    if kind == "splitk":
        return Epilogue(precision=precision)
    return Epilogue(ep.bias, ep.beta, ep.activation, precision)


_PLAIN = Epilogue()  # no bias, no beta, no activation


@functools.lru_cache(maxsize=256)
def render(kind: str, dtype: str, epilogue: Epilogue = _PLAIN) -> Rendered:
    """The module source of one kernel, its name and its Triton signature."""
    if kind not in KINDS:
        raise TemplateError(f"unknown GEMM kernel kind {kind!r} (known: {', '.join(KINDS)})")
    if dtype not in DTYPES:
        raise TemplateError(f"unsupported dtype {dtype!r} (supported: {', '.join(DTYPES)})")
    ep = _normalized(kind, dtype, epilogue)
    short, tl_type, _ = DTYPES[dtype]
    suffix = "" if kind == "splitk" else "_" + ep.name
    precision = f"_{ep.precision}" if dtype == "float32" and kind != "splitk_reduce" else ""
    name = f"tf_{kind}_{short}{precision}{suffix}"
    dot_options = f', input_precision="{ep.precision}"' if precision else ""
    source = _TEMPLATES[kind].render_kept({"name": name, "out_type": tl_type, "dot_options": dot_options,
                                      "has_bias": ep.bias, "has_beta": ep.beta, "activation": ep.activation})
    return Rendered(kind, dtype, ep, name, source, _signature(kind, dtype, ep))


def _cdiv(x: int, y: int) -> int:
    return -(-x // y)


def tiles(config: Config, m: int, n: int) -> int:
    return _cdiv(m, config.block_m) * _cdiv(n, config.block_n)


def mm_grid(config: Config, m: int, n: int, k: int) -> tuple[int, int, int]:
    return (tiles(config, m, n), 1, 1)


def splitk_grid(config: Config, m: int, n: int, k: int) -> tuple[int, int, int]:
    return (tiles(config, m, n), config.split_k, 1)


def reduce_grid(config: Config, m: int, n: int, k: int) -> tuple[int, int, int]:
    return (tiles(config, m, n), 1, 1)


GRIDS = {"mm": mm_grid, "splitk": splitk_grid, "splitk_reduce": reduce_grid}


def constexprs(kind: str, config: Config, m: int, n: int, k: int) -> dict[str, int]:
    """The constexpr values of `kind` for this configuration and problem (EVEN_K: no K masks needed)."""
    if kind == "mm":
        return {"BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "BLOCK_K": config.block_k,
                "GROUP_M": config.group_m, "EVEN_K": int(k % config.block_k == 0)}
    if kind == "splitk":
        return {"BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "BLOCK_K": config.block_k,
                "GROUP_M": config.group_m, "SPLIT_K": config.split_k,
                "EVEN_K": int(k % (config.block_k * config.split_k) == 0)}
    return {"BLOCK_M": config.block_m, "BLOCK_N": config.block_n, "SPLIT_K": config.split_k}


def workspace_shape(config: Config, m: int, n: int) -> tuple[int, int, int]:
    """The contiguous fp32 workspace of a split-K configuration: one M x N partial result per K slice."""
    return (config.split_k, m, n)


def arguments(r: Rendered, a: Any, b: Any, out: Any, *, bias: Any = None, alpha: float = 1.0, beta: float = 0.0,
              workspace: Any = None) -> tuple[Any, ...]:
    """The run-time arguments of `r`'s kernel, in signature order, from torch tensors a (MxK), b (KxN),
    out (MxN), bias (N), and for split-K the workspace."""
    (m, k), n = a.shape, b.shape[1]
    values: dict[str, Any] = {
        "a_ptr": a, "b_ptr": b, "c_ptr": out, "ws_ptr": workspace, "bias_ptr": bias, "M": m, "N": n, "K": k,
        "stride_am": a.stride(0), "stride_ak": a.stride(1), "stride_bk": b.stride(0), "stride_bn": b.stride(1),
        "stride_cm": out.stride(0), "stride_cn": out.stride(1),
        "stride_bias": bias.stride(0) if bias is not None else 0, "alpha": float(alpha), "beta": float(beta)}
    missing = [p for p in r.runtime_params if values[p] is None]
    if missing:
        raise ValueError(f"{r.name} needs {', '.join(missing)}")
    return tuple(values[p] for p in r.runtime_params)


def index_fits(*tensors: Any) -> bool:
    """Whether 32-bit offsets address every element of these tensors (the kernels' i32 indexing)."""
    def span(t: Any) -> int:
        return 1 + sum(int(size - 1) * abs(int(stride)) for size, stride in zip(t.shape, t.stride(), strict=True))
    return all(t is None or span(t) < 2**31 for t in tensors)


SHAPE_PARAMS = ("M", "N", "K")


def specialization(r: Rendered, args: Sequence[Any]) -> tuple[dict[str, str], dict[str, int], dict[tuple[int], Any]]:
    """What to specialize for these run-time arguments, for an ahead-of-time build: sizes and strides become
    constexprs (left out of the launch arguments), as Inductor bakes a static shape into its kernels, and
    16-aligned pointers get ``tt.divisibility`` (without it no async-copy pipeline).

    Why the sizes too: Triton knows an i32 argument's divisibility by 16 or not at all, so N = 1000 (a B row
    of 1000 fp16) left the wrapped column index ``offs_cn % N`` with a contiguity of 1, and every B load
    was a scalar one: 3000x1000x700 fp16 ran at 0.084 ms against 0.022 for the same tiles with the shape
    known (H200). With N = 1000 a constant, the analysis proves runs of gcd(BLOCK_N, 1000) = 8 contiguous,
    aligned elements: 16-byte loads, and none of them crosses the wrap (no hint that could read past the end).
    Returns (signature, constexprs, attrs) for ``ASTSource(fn, signature, {**constexprs, **config's}, attrs)``;
    the artifact's key must include all three."""
    signature = dict(r.signature)
    fixed: dict[str, int] = {}
    attrs: dict[tuple[int], Any] = {}
    index = {param: i for i, param in enumerate(r.signature)}
    for param, value in zip(r.runtime_params, args, strict=True):
        kind = signature[param]
        if kind == "i32" and (param in SHAPE_PARAMS or param.startswith("stride_")):
            signature[param] = "constexpr"
            fixed[param] = int(value)
        elif kind.startswith("*") and value.data_ptr() % 16 == 0:
            attrs[(index[param],)] = [["tt.divisibility", 16]]
    return signature, fixed, attrs


def launch(kernels: Mapping[str, Any], config: Config, dtype: str, epilogue: Epilogue, a: Any, b: Any, out: Any, *,
           bias: Any = None, alpha: float = 1.0, beta: float = 0.0) -> None:
    """Run a configuration through Triton's launch syntax (``fn[grid](...)``): `kernels` maps each kind of
    ``config.kernels`` to a jit (or interpreted) function of ``render(kind, dtype, epilogue)``."""
    (m, k), n = a.shape, b.shape[1]
    workspace = None
    if config.split_k > 1:
        import torch

        workspace = torch.empty(workspace_shape(config, m, n), dtype=torch.float32, device=a.device)
    for kind in config.kernels:
        r = render(kind, dtype, epilogue)
        args = arguments(r, a, b, out, bias=bias, alpha=alpha, beta=beta, workspace=workspace)
        kernels[kind][GRIDS[kind](config, m, n, k)](*args, **constexprs(kind, config, m, n, k),
                                                    num_warps=config.num_warps, num_stages=config.num_stages)
