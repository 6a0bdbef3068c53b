"""tuneforge.gemm(): C = alpha * A @ B + beta * C (+ bias), tuned per shape, dtype and layout.

The first call for a layout selects among numpy.matmul (OpenBLAS, always a candidate, so the result
is never slower than the library) and the compiled configurations of the `default` space; the
decision and the kernels are cached, and later calls dispatch through a dict to a prepared call.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from tuneforge.cpuinfo import blas_threads, cpu_info
from tuneforge.dataclass_lite import dataclass
from tuneforge.kernels.gemm import dispatch, torch_cpu
from tuneforge.kernels.gemm.space import (
    C_TYPES,
    Problem,
    default_space,
    exhaustive_space,
    few_cols_space,
    max_threads,
    small_m_space,
)
from tuneforge.kernels.gemm.template import (
    FEW_COLS,
    TEMPLATE,
    few_rows_template,
    on_host_team,
    runtime_args,
    static_args,
)
from tuneforge.store.default import default_records
from tuneforge.tune.choices import Choice, ExternChoice
from tuneforge.tune.sample import RowSample
from tuneforge.tune.select import select, selection_key
from tuneforge.tune.template import KernelTemplate, TemplateChoice


def numpy_gemm(a: Any, b: Any, alpha: float, beta: float, bias: Any, out: Any) -> None:
    """The library reference: numpy.matmul (OpenBLAS) with the epilogue in numpy."""
    if alpha == 1 and beta == 0 and bias is None:
        np.matmul(a, b, out=out)
        return
    product = np.matmul(a, b)
    if alpha != 1:
        product *= alpha
    if beta != 0:
        product += beta * out
    if bias is not None:
        product += bias
    out[...] = product


def numpy_call(alpha: float, beta: float, a: Any, b: Any, out: Any, bias: Any) -> None:
    """numpy_gemm in a prepared call's argument order; the common case without a layer in between."""
    if alpha == 1 and beta == 0 and bias is None:
        np.matmul(a, b, out=out)
    else:
        numpy_gemm(a, b, alpha, beta, bias, out)


def numpy_bound(args: Sequence[Any]) -> Callable[[], Any]:
    """numpy_gemm's call on a selection's arguments as the dispatcher makes it (numpy.matmul itself for a plain
    product): what timing calls (Choice.bound)."""
    a, b, alpha, beta, bias, out = args
    if alpha == 1 and beta == 0 and bias is None:
        return functools.partial(np.matmul, a, b, out=out)
    return functools.partial(numpy_gemm, a, b, alpha, beta, bias, out)


def op_name(beta: float, bias: Any) -> str:
    """Reading C (beta != 0) and adding a bias change the work, so each variant is tuned on its own."""
    return "gemm" + ("_beta" if beta != 0 else "") + ("_bias" if bias is not None else "")


def choices(problem: Problem, space: str = "default", library: str = "numpy",
            blocked: KernelTemplate = TEMPLATE) -> list[Choice]:
    """The library call (the reference): numpy.matmul, or torch.matmul for torch tensors (`library` "torch"),
    then the kernels: the blocked ones as `blocked` launches them (packed.py's PACKED: B packed ahead) and the
    few-rows one. numpy is no candidate for torch tensors: in a torch program OpenBLAS's threads, spinning
    for a while after each call, took the cores from torch's OpenMP team (an MLP step at batch 512 on 2 cores
    took 70 ms with numpy's picks against 50 with torch's own mm)."""
    if problem.dtype not in C_TYPES:
        raise ValueError(f"gemm supports float32 and float64, not {problem.dtype}")
    if space not in ("default", "exhaustive"):
        raise ValueError(f"space must be 'default' or 'exhaustive', not {space!r}")
    exhaustive = space == "exhaustive"
    configs = list(exhaustive_space(problem)) if exhaustive else default_space(problem)
    few_rows = small_m_space(problem, cpu_info(), max_threads(), exhaustive)
    # The library's threads are in its identity: its record from a process with other threads must not answer
    # (one timed on one thread, 46 ms at 4096x128x4096 fp32, met kernels timed on two, 21 ms, and lost to them).
    reference = (ExternChoice(torch_cpu.torch_gemm, name="torch_matmul", depends={"threads": torch_cpu.threads()})
                 if library == "torch" else
                 ExternChoice(numpy_gemm, name="numpy_matmul", bind=numpy_bound, depends={"threads": blas_threads()}))
    few_cols = few_cols_space(problem, cpu_info(), max_threads(), exhaustive)
    kernels = [*blocked.choices(configs), *few_rows_template(problem.m).choices(few_rows), *FEW_COLS.choices(few_cols)]
    if exhaustive:  # a search of the exhaustive space starts from the default space's picks
        heuristic = {_marker(c) for c in [*default_space(problem), *small_m_space(problem, cpu_info(), max_threads()),
                                          *few_cols_space(problem, cpu_info(), max_threads())]}
        for choice in kernels:
            choice.suggested = _marker(choice.params) in heuristic
    return [reference, *kernels]


def _marker(params: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(params.items()))


def check_operands(a: Any, b: Any, out: Any, bias: Any) -> None:
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
        raise TypeError("gemm takes numpy arrays")
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"gemm needs A[M,K] and B[K,N], got shapes {a.shape} and {b.shape}")
    if a.dtype != b.dtype or a.dtype.name not in C_TYPES:
        raise ValueError(f"gemm needs A and B of one dtype, float32 or float64; got {a.dtype} and {b.dtype}")
    if out is not None and (out.shape != (a.shape[0], b.shape[1]) or out.dtype != a.dtype):
        raise ValueError(f"out must be {a.dtype}[{a.shape[0]}x{b.shape[1]}], got {out.dtype}{list(out.shape)}")
    if bias is not None and (bias.shape != (b.shape[1],) or bias.dtype != a.dtype):
        raise ValueError(f"bias must be {a.dtype}[{b.shape[1]}], got {bias.dtype}{list(bias.shape)}")


def usable(arr: Any) -> Any:
    """The kernels take any positive element strides; other layouts are copied once."""
    if all(s >= 0 and s % arr.itemsize == 0 for s in arr.strides):
        return arr
    return np.ascontiguousarray(arr)


Call = Callable[[float, float, Any, Any, Any, Any], None]  # (alpha, beta, a, b, out, bias)
_lock = threading.Lock()


@dataclass(frozen=True)
class Prepared:
    """A tuned layout's call, and how the C dispatcher can make it without Python (dispatch.KERNEL etc.)."""
    call: Call
    kind: int
    address: int = 0
    params: tuple[int, ...] = ()
    library_ratio: float = 0.0  # numpy's tuned time over the winner's (0: not known): see dispatch.cpp
    addresses: bool = False  # `call` takes a, b, out and bias as data addresses too (a compiled kernel's binding)
    library: str = ""  # the library call that won ("numpy" or "torch"), if one did


_dispatch: dict[tuple[Any, ...], Prepared] = {}  # the Python path's table, by layout
_registered: set[tuple[Any, ...]] = set()  # layouts the C dispatcher has too


def _prepare(choice: Choice, a: Any, b: Any, out: Any) -> Prepared:
    """A call with everything fixed by the layout already bound (sizes, strides, blocking)."""
    if isinstance(choice, TemplateChoice):
        choice.build().result()
        kernel = choice.kernel()
        # The kernel's own argument order ends with (alpha, beta, a, b, c, bias): bind the rest once.
        bound = functools.partial(kernel, *static_args(a, b, out, choice.config))
        try:
            address = dispatch.kernel_address(kernel)
        except LookupError:
            return Prepared(bound, dispatch.CALL, addresses=True)
        return Prepared(bound, dispatch.KERNEL, address, runtime_args(choice.config), addresses=True)
    if isinstance(choice, ExternChoice) and choice.fn is numpy_gemm:
        return Prepared(numpy_call, dispatch.LIBRARY, library="numpy")
    return Prepared(lambda alpha, beta, a, b, out, bias: choice.run([a, b, alpha, beta, bias, out]), dispatch.CALL,
                    library="torch" if isinstance(choice, ExternChoice) and choice.fn is torch_cpu.torch_gemm else "")


def gemm(a: Any, b: Any, out: Any = None, *, alpha: float = 1.0, beta: float = 0.0, bias: Any = None,
         space: str = "default") -> Any:
    """``out = alpha * a @ b + beta * out + bias`` for 2-D float32/float64 arrays of any strides, or for
    fp16/bf16/fp32 torch tensors on one CUDA device (`tuneforge.kernels.gemm_gpu.gemm_cuda`).

    With ``beta == 0`` (the default) `out`'s previous contents are ignored; `bias` is a row vector
    of length N. Returns `out` (allocated C-contiguous when not given). The first call for a layout
    tunes (or finds the decision in the caches); later calls go straight to the winner.
    """
    return _route(a, b, out, alpha, beta, bias, space)


def _gemm_python(a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any, space: str,
                 library: str = "numpy") -> Any:
    """gemm's Python path: the first call of each layout, calls the C path does not take, and every call
    where the C path could not be built. `library`: the library candidates' family ("torch" adds
    torch.matmul, for torch tensors; such layouts stay off the C path, which keys numpy arrays)."""
    if not isinstance(a, np.ndarray) and _on_cuda(a):  # straight to the GPU op: no numpy attempt, no exception
        return _gemm_cuda(a, b, out, alpha, beta, bias, space)
    if not isinstance(b, np.ndarray) and hasattr(b, "_tuneforge_gemm_"):  # B packed ahead (packed.py)
        return b._tuneforge_gemm_(a, out, alpha, beta, bias, space)
    if not isinstance(a, np.ndarray) and torch_cpu.is_torch_cpu(a):
        fresh = None if out is not None or beta != 0 else torch_cpu.fresh_output(a, b, bias)
        if fresh is not None:  # nothing can overlap a new output: the per-layout call on the tensors
            gemm_into(a, b, fresh, alpha, 0.0, bias, space)
            return fresh
        a, b, out_view, bias, out_tensor = torch_cpu.numpy_views(a, b, out, bias, beta)
        _gemm_python(a, b, out_view, alpha, beta, bias, space, "torch")
        return out_tensor
    if out is None:
        if beta != 0:
            raise ValueError("beta != 0 needs an out array to accumulate into")
        try:
            out = np.empty((a.shape[0], b.shape[1]) if a.ndim == 2 and b.ndim == 2 else (0, 0), dtype=a.dtype)
        except TypeError:  # a dtype numpy does not know: a CUDA tensor's goes to the GPU op
            if _on_cuda(a):
                return _gemm_cuda(a, b, None, alpha, beta, bias, space)
            raise
    try:
        key = _layout_key(a, b, out, beta, bias, space, library)
    except AttributeError:  # not arrays: CUDA tensors go to the GPU op; for others the checks name the problem
        if _on_cuda(a):
            return _gemm_cuda(a, b, out, alpha, beta, bias, space)
        check_operands(a, b, out, bias)
        raise
    prepared = _dispatch.get(key)
    if prepared is None:
        check_operands(a, b, out, bias)
        prepared = _tune(key, a, b, out, beta, bias, space, library)
    elif key not in _registered and library == "numpy":  # a layout called again: worth the C path
        if dispatch.loaded() is not None:
            _register(key, prepared, a, b, out, beta, bias, space)
        else:  # not before: finding it costs a compiler probe at least, which a one-call process never needs
            dispatch.load_in_background(_gemm_python)
    if not out.flags.writeable:
        raise ValueError("gemm: out is read-only")
    if overlaps(out, a) or overlaps(out, b) or (bias is not None and overlaps(out, bias)):
        return _gemm_separated(prepared, a, b, out, alpha, beta, bias, space)
    prepared.call(alpha, beta, a, b, out, bias)
    return out


def _layout_key(a: Any, b: Any, out: Any, beta: float, bias: Any, space: str, library: str) -> tuple[Any, ...]:
    bias_layout = None if bias is None else (type(bias), bias.shape, bias.strides, bias.dtype)
    return (type(a), type(b), type(out), a.shape, b.shape, a.strides, b.strides, out.strides, a.dtype, b.dtype,
            out.dtype, beta != 0, bias_layout, space, library)


TensorCall = Callable[[float, float, Any, Any, Any, Any], None]  # (alpha, beta, a, b, out, bias): CPU tensors
_tensor_calls: dict[tuple[Any, ...], TensorCall] = {}  # gemm_into's table, by layout


def gemm_into(a: Any, b: Any, out: Any, alpha: float = 1.0, beta: float = 0.0, bias: Any = None,
              space: str = "default") -> None:
    """``out = alpha * a @ b + beta * out + bias`` for CPU torch tensors where `out` shares no memory with the
    inputs (a fresh output: the custom ops' and compiled graphs' path, tuneforge.torch). A tuned layout's call
    passes the tensors' data addresses straight to the compiled kernel: no numpy views, no overlap checks.
    Inputs may require grad (an autograd kernel calls below it); nothing here records gradients."""
    key = (a.shape, a.stride(), b.shape, b.stride(), out.shape, out.stride(), a.dtype, b.dtype, out.dtype, beta != 0,
           None if bias is None else (bias.shape, bias.stride(), bias.dtype), space)
    call = _tensor_calls.get(key)
    if call is None:
        _tensor_calls[key] = _first_tensor_call(a, b, out, alpha, beta, bias, space)
        return
    call(alpha, beta, a, b, out, bias)


# The eager products' table (tuneforge.torch.mm's kernel looks in it first): ``a @ b`` into a new matrix, by
# `product_key`. Known layouts skip every check and gemm_into's longer key: the checks were made on the first call.
FRESH_PRODUCTS: dict[tuple[Any, ...], Callable[[Any, Any], Any]] = {}


def product_key(a: Any, b: Any) -> tuple[Any, ...]:
    """FRESH_PRODUCTS's key of two tensors: their layouts, dtypes and whether each is on the CPU."""
    return a.shape, a.stride(), b.shape, b.stride(), a.dtype, b.dtype, a.is_cpu, b.is_cpu


def fresh_product(a: Any, b: Any) -> Any:
    """``a @ b`` into a new row-major matrix for two CPU float32/float64 matrices that multiply (checked by the
    caller), and the layout's entry in FRESH_PRODUCTS for the next ones."""
    m, n, dtype = a.shape[0], b.shape[1], a.dtype
    out = torch_cpu.new_matrix(m, n, dtype)
    gemm_into(a, b, out)
    call = _tensor_calls[(a.shape, a.stride(), b.shape, b.stride(), out.shape, out.stride(), dtype, dtype, dtype,
                          False, None, "default")]
    empty, size, stride = torch_cpu.allocator(), (m, n), (n, 1)

    def product(a: Any, b: Any) -> Any:
        out = empty(size, stride, dtype)
        call(1.0, 0.0, a, b, out, None)
        return out

    FRESH_PRODUCTS[product_key(a, b)] = product
    return out


def _first_tensor_call(a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any, space: str) -> TensorCall:
    """Make the call (tuning the layout, or finding its decision), and return how later calls of the layout go."""
    a, b, out = a.detach(), b.detach(), out.detach()
    bias = None if bias is None else bias.detach()
    views = torch_cpu.numpy_views(a, b, out, bias, beta)
    _gemm_python(views[0], views[1], views[2], alpha, beta, views[3], space, "torch")
    prepared = _dispatch.get(_layout_key(views[0], views[1], views[2], beta, views[3], space, "torch"))
    if prepared is None:  # not kept for reuse (an unusual layout): every call takes the Python path
        return _through_python(space)
    call = prepared.call
    if prepared.addresses:
        if isinstance(call, functools.partial):  # torch's element-wise ops run on its OpenMP team: so does this
            call = on_host_team(call)

        def addresses(alpha: float, beta: float, a: Any, b: Any, out: Any, bias: Any) -> None:
            call(float(alpha), float(beta), a.data_ptr(), b.data_ptr(), out.data_ptr(),
                 None if bias is None else bias.data_ptr())

        return addresses
    if prepared.library == "torch":
        return torch_cpu.torch_gemm_tensors
    array = torch_cpu.array

    def through_views(alpha: float, beta: float, a: Any, b: Any, out: Any, bias: Any) -> None:
        call(alpha, beta, array(a), array(b), array(out), None if bias is None else array(bias))

    return through_views


def _through_python(space: str) -> TensorCall:
    def call(alpha: float, beta: float, a: Any, b: Any, out: Any, bias: Any) -> None:
        a, b, out, bias, _ = torch_cpu.numpy_views(a.detach(), b.detach(), out.detach(),
                                                   None if bias is None else bias.detach(), beta)
        _gemm_python(a, b, out, alpha, beta, bias, space, "torch")

    return call


def _on_cuda(a: Any) -> bool:
    return getattr(a, "is_cuda", False) is True  # a torch tensor on a CUDA device


def _gemm_cuda(a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any, space: str) -> Any:
    """Torch tensors on a CUDA device: the GPU family's op (reached off the numpy path, which cannot key them)."""
    global _cuda_op
    if _cuda_op is None:  # imported on the first CUDA call: a numpy caller never loads the GPU family
        from tuneforge.kernels.gemm_gpu.op import gemm_cuda

        _cuda_op = gemm_cuda
    return _cuda_op(a, b, out, alpha=alpha, beta=beta, bias=bias, space=space)


_cuda_op: Callable[..., Any] | None = None


def _gemm_separated(prepared: Prepared, a: Any, b: Any, out: Any, alpha: float, beta: float, bias: Any,
                    space: str) -> Any:
    """A call where an input shares memory with `out` (which the kernel would overwrite while reading
    the input): the inputs that do are copied first, keeping their strides, which `prepared` has bound."""
    a2, b2, bias2 = (x if x is None or not overlaps(out, x) else _copy_with_strides(x) for x in (a, b, bias))
    if a2 is not None and b2 is not None and (bias is None or bias2 is not None):
        prepared.call(alpha, beta, a2, b2, out, bias2)
        return out
    # Some input is a few elements spread over a vast buffer: a compact copy is a layout of its own,
    # prepared (tuned once) like any other.
    a2, b2, bias2 = (np.array(x) if c is None and x is not None else c for x, c in ((a, a2), (b, b2), (bias, bias2)))
    return _gemm_python(a2, b2, out, alpha, beta, bias2, space)


def overlaps(out: Any, x: Any) -> bool:
    if x is out:
        return True
    if x.base is None and out.base is None:  # two arrays that own their memory: distinct allocations
        return False
    return bool(np.may_share_memory(out, x))


# A copy that keeps the strides spans what the original spans: beyond this size, and this many times the
# bytes of the elements themselves, it is not made (strict overcommit would count all of it).
_SPARSE_BYTES = 16 * 2**20
_SPARSE_RATIO = 8


def _copy_with_strides(x: Any) -> Any:
    """A copy of `x` with exactly x's strides, in a buffer of its own; None when that buffer would be
    mostly gaps and large (x cut from a vast buffer).

    A prepared call has the element strides of its layout bound in (and the C dispatcher's key is
    those strides), so a copy with any other layout, e.g. a contiguous one, would be read with the
    original strides: wrong values, and reads far past the copy's end when x is a slice of a wide
    buffer. The new buffer spans x's extent; only x's own elements are written, so the pages
    between them (the columns of the wide buffer x was cut from) are never touched.
    """
    if x.size == 0:  # nothing of it is read
        return x
    low = sum((n - 1) * s for n, s in zip(x.shape, x.strides, strict=True) if s < 0)
    high = sum((n - 1) * s for n, s in zip(x.shape, x.strides, strict=True) if s > 0) + x.itemsize
    if high - low > max(_SPARSE_BYTES, _SPARSE_RATIO * x.nbytes):
        return None
    buffer = np.empty(high - low, dtype=np.uint8)  # numpy's allocations are aligned for any float
    copy: Any = np.ndarray(x.shape, dtype=x.dtype, buffer=buffer, offset=-low, strides=x.strides)
    copy[...] = x
    return copy


_route: Callable[..., Any] = _gemm_python  # the C dispatcher once it is loaded


def _tune(key: tuple[Any, ...], a: Any, b: Any, out: Any, beta: float, bias: Any, space: str,
          library: str = "numpy") -> Prepared:
    with _lock:
        prepared = _dispatch.get(key)
        if prepared is not None:
            return prepared
        a_t, b_t = usable(a), usable(b)
        out_t = out if usable(out) is out else np.empty(out.shape, out.dtype)
        bias_t = None if bias is None else np.ascontiguousarray(bias)
        problem = Problem(a.shape[0], b.shape[1], a.shape[1], a.dtype.name)
        candidates = choices(problem, space, library)
        inputs = [a_t, b_t, 1.0, beta, bias_t]
        # torch's candidate makes another selection: a decision without it must not answer for it
        name = op_name(beta, bias) + ("_torch" if library == "torch" else "")
        winner = select(name, candidates, inputs, out=out_t, accumulate=beta != 0, sample=sample_for(problem))
        prepared = _prepare(winner, a_t, b_t, out_t)
        if prepared.kind == dispatch.KERNEL:
            ratio = _library_ratio(name, [*inputs, out_t], candidates, winner)
            prepared = dataclasses.replace(prepared, library_ratio=ratio)
        if a_t is not a or b_t is not b or out_t is not out or bias_t is not bias:
            # layouts the kernels cannot take: copy per call
            prepared = Prepared(with_copies(prepared.call), dispatch.CALL)
        _dispatch[key] = prepared
        if dispatch.loaded() is not None and library == "numpy":
            _register(key, prepared, a, b, out, beta, bias, space)
        return prepared


# From about 2 x 1536^3 flops (a run of 30 ms or more on 2 cores) the configurations are ranked on the first rows
# of A and C (tune/sample.py; each configuration rounds them to whole M blocks, template.sample_rows), an eighth
# of M or SAMPLE_ROWS if more, and only the fastest runs on the whole problem: cold tuning of 2048^3-4096^3 took
# 5-22 s timing every configuration on the whole of it.
SAMPLE_FLOPS = 2 * 1536**3
SAMPLE_ROWS = 256


def sample_for(problem: Problem) -> RowSample | None:
    """How a selection for `problem` samples it: the rows of A (argument 0) and of the output (5), or None."""
    if problem.flops < SAMPLE_FLOPS or problem.m < 2 * SAMPLE_ROWS:
        return None
    return RowSample(args=(0, 5), rows=max(SAMPLE_ROWS, problem.m // 8), independent_rows=True)


def _library_ratio(name: str, args: list[Any], candidates: list[Choice], winner: Choice) -> float:
    """numpy.matmul's tuned median over the winner's, from the selection's records (0.0: not known)."""
    library = next((c for c in candidates if isinstance(c, ExternChoice) and c.fn is numpy_gemm), None)
    if library is None:
        return 0.0
    try:
        found = {r.choice: r.median_ms for r in default_records().get(selection_key(name, args))}
    except Exception:  # records unreadable: the dispatcher's own threshold
        return 0.0
    theirs, ours = found.get(library.hash_key), found.get(winner.hash_key)
    return float(theirs / ours) if theirs and ours else 0.0


def _register(key: tuple[Any, ...], prepared: Prepared, a: Any, b: Any, out: Any, beta: float, bias: Any,
              space: str) -> None:
    """Hand a tuned layout to the C dispatcher (it reads the layout from these arrays) and route calls there."""
    global _route
    fast = dispatch.loaded()
    if fast is None or not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)):
        return
    fast.register(a, b, out, float(beta), bias, space, prepared.kind, prepared.call, prepared.address,
                  prepared.params, prepared.library_ratio)
    _registered.add(key)
    _route = fast.gemm


def with_copies(inner: Call) -> Call:
    """`inner` called on copies of the operands the kernels cannot take (B packed ahead, packed.py, is passed on)."""
    def call(alpha: float, beta: float, a: Any, b: Any, out: Any, bias: Any) -> None:
        target = out if usable(out) is out else np.array(out, order="C")
        inner(alpha, beta, usable(a), usable(b) if isinstance(b, np.ndarray) else b, target,
              None if bias is None else np.ascontiguousarray(bias))
        if target is not out:
            out[...] = target

    return call


def clear_dispatch() -> None:
    """Forget the prepared calls (decisions stay in the record database)."""
    packed = sys.modules.get("tuneforge.kernels.gemm.packed")  # loaded only by a program that packed a B
    if packed is not None:
        packed.clear()
    with _lock:
        _dispatch.clear()
        _registered.clear()
        _tensor_calls.clear()
        FRESH_PRODUCTS.clear()
        fast = dispatch.loaded()
        if fast is not None:
            fast.clear()
