"""A constant right operand, packed once: ``w = tuneforge.pack_b(b)``, then ``tuneforge.gemm(a, w)`` many times.

Every GEMM call packs B into the register tile's column slivers (or reads it strided, unpacked): one pass over all
of B per call. Where A has few rows that pass is a large part of the call (32x1024x1024 fp32 on 2 cores: a
product of ~0.9 ms at peak, and 0.4-0.5 ms of packing a 4 MB B), and a weight matrix multiplied by batch after
batch is packed again every time. `PackedB` keeps a private, read-only copy of B (a snapshot: writing into the array
it was made from later changes nothing), and B packed whole the way the winning kernel reads it (template.py's
pack_whole), made on the first call of each kernel layout. The selection for such calls is its own (op
``gemm_packed``, with the kernels timed on B packed ahead, outside the timed runs) against numpy.matmul on the copy.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from tuneforge.kernels.gemm import torch_cpu
from tuneforge.kernels.gemm.op import (
    check_operands,
    numpy_call,
    op_name,
    overlaps,
    sample_for,
    usable,
    with_copies,
)
from tuneforge.kernels.gemm.op import choices as op_choices
from tuneforge.kernels.gemm.space import C_TYPES, Problem
from tuneforge.kernels.gemm.template import (
    FEW_COLS,
    GEMV,
    HOST_TEAM,
    PACKED,
    PREPACKED,
    SMALL_M,
    pack_layout,
    pack_whole,
    runtime_args,
    static_args,
)
from tuneforge.tune.choices import Choice, ExternChoice
from tuneforge.tune.select import select
from tuneforge.tune.template import TemplateChoice

__all__ = ["PackedB", "pack_b"]


class PackedB:
    """B (K x N, float32 or float64) for many products ``a @ B``: a read-only copy, and B packed per kernel
    layout on first use. Pass it as gemm's second operand."""

    __slots__ = ("__weakref__", "_lock", "_packs", "matrix")

    def __init__(self, b: Any) -> None:
        if not isinstance(b, np.ndarray) or b.ndim != 2:
            raise TypeError(f"pack_b takes a 2-D numpy array, got {type(b).__name__}"
                            + (f" of {b.ndim} dimensions" if isinstance(b, np.ndarray) else ""))
        if b.dtype.name not in C_TYPES:
            raise ValueError(f"pack_b supports float32 and float64, not {b.dtype}")
        if 0 in b.shape:
            raise ValueError(f"pack_b needs a non-empty matrix, got shape {b.shape}")
        self.matrix = np.array(b, order="C")  # the snapshot every call reads (numpy's, or packed)
        self.matrix.flags.writeable = False
        self._packs: dict[tuple[int, int], Any] = {}
        self._lock = threading.Lock()

    @property
    def shape(self) -> tuple[int, int]:
        return self.matrix.shape

    @property
    def dtype(self) -> np.dtype[Any]:
        return self.matrix.dtype

    def packed(self, kernel: Any, config: dict[str, Any]) -> Any:
        """B packed whole for `config`'s layout (made by `kernel` on first use)."""
        layout = pack_layout(config, self.matrix.itemsize)
        found = self._packs.get(layout)
        if found is None:
            with self._lock:
                found = self._packs.get(layout)
                if found is None:
                    found = self._packs[layout] = pack_whole(kernel, self.matrix, config)
        return found

    def packed_bytes(self) -> int:
        """Memory held by the packs made so far (the copy of B not counted)."""
        return sum(p.nbytes for p in self._packs.values())

    def __repr__(self) -> str:
        k, n = self.shape
        return f"<PackedB {self.dtype}[{k}x{n}], {len(self._packs)} pack(s)>"

    # gemm(a, packed) reaches this through op._gemm_python, which does not import this module
    def _tuneforge_gemm_(self, a: Any, out: Any, alpha: float, beta: float, bias: Any, space: str) -> Any:
        return gemm_packed(a, self, out, alpha, beta, bias, space)


def pack_b(b: Any) -> PackedB:
    """A constant right operand for ``tuneforge.gemm(a, packed, ...)``: a private copy of `b`, packed once per
    kernel layout instead of on every call. Later writes into `b` are not seen: pack it again."""
    return PackedB(b)


PackedCall = Callable[[float, float, Any, PackedB, Any, Any], None]  # (alpha, beta, a, packed, out, bias)
_calls: dict[tuple[Any, ...], PackedCall] = {}
_lock = threading.Lock()


def gemm_packed(a: Any, packed: PackedB, out: Any, alpha: float, beta: float, bias: Any, space: str,
                library: str = "numpy") -> Any:
    """``out = alpha * a @ B + beta * out + bias`` with B packed ahead (see the module's docstring). `library`
    "torch": the arrays are views of CPU torch tensors (tuneforge.torch): torch.matmul is the library candidate
    and the kernels run on torch's OpenMP team, as op.gemm_into's calls do."""
    if out is None:
        if beta != 0:
            raise ValueError("beta != 0 needs an out array to accumulate into")
        if not isinstance(a, np.ndarray) or a.ndim != 2:
            check_operands(a, packed.matrix, None, bias)  # names what is wrong with a
        out = np.empty((a.shape[0], packed.matrix.shape[1]), dtype=a.dtype)
    try:  # everything the checks looked at: a layout seen before was checked then
        layout = (type(a), a.shape, a.strides, a.dtype, packed.matrix.shape, packed.matrix.dtype, type(out),
                  out.shape, out.strides, out.dtype, beta != 0,
                  None if bias is None else (type(bias), bias.shape, bias.strides, bias.dtype), space, library)
    except AttributeError:  # not arrays: the checks name the problem
        check_operands(a, packed.matrix, out, bias)
        raise
    call = _calls.get(layout)
    if call is None:
        check_operands(a, packed.matrix, out, bias)
        call = _tune(layout, a, packed, out, beta, bias, space, library)
    if not out.flags.writeable:
        raise ValueError("gemm: out is read-only")
    # the packed B is private: only A and the bias can share the output's memory
    if overlaps(out, a):
        a = a.copy()
    if bias is not None and overlaps(out, bias):
        bias = bias.copy()
    call(alpha, beta, a, packed, out, bias)
    return out


def choices(problem: Problem, space: str, library: str = "numpy") -> list[Choice]:
    """numpy.matmul (torch.matmul with `library` "torch") on the copy of B (the reference), then the blocked kernels
    called with B packed ahead. The few-rows kernel streams B row by row and packs nothing: it reads the row-major
    copy as it is (without it a packed 1x4096x4096 or 4x1024x1024 B ran at 0.94-0.95x the unpacked product, which
    it wins)."""
    return op_choices(problem, space, library, blocked=PACKED)


def _tune(layout: tuple[Any, ...], a: Any, packed: PackedB, out: Any, beta: float, bias: Any, space: str,
          library: str) -> PackedCall:
    with _lock:
        known = _calls.get(layout)
        if known is not None:
            return known
        a_t = usable(a)
        out_t = out if usable(out) is out else np.empty(out.shape, out.dtype)
        bias_t = None if bias is None else np.ascontiguousarray(bias)
        problem = Problem(a.shape[0], packed.shape[1], a.shape[1], a.dtype.name)
        # torch's candidate makes another selection: a decision without it must not answer for it
        name = op_name(beta, bias) + "_packed" + ("_torch" if library == "torch" else "")
        winner = select(name, choices(problem, space, library), [a_t, packed.matrix, 1.0, beta, bias_t], out=out_t,
                        accumulate=beta != 0, sample=sample_for(problem))
        call = _prepare(winner, a_t, packed, out_t, library == "torch")
        if a_t is not a or out_t is not out or bias_t is not bias:
            call = with_copies(call)
        _calls[layout] = call
        return call


def _prepare(winner: Choice, a: Any, packed: PackedB, out: Any, host_team: bool) -> PackedCall:
    """The layout's call with everything the layout fixes bound (`host_team`: the kernels on torch's threads)."""
    if isinstance(winner, ExternChoice) and winner.fn is torch_cpu.torch_gemm:
        torch_gemm = torch_cpu.torch_gemm

        def torch_library(alpha: float, beta: float, a: Any, packed: PackedB, out: Any, bias: Any) -> None:
            torch_gemm(a, packed.matrix, alpha, beta, bias, out)

        return torch_library
    if not isinstance(winner, TemplateChoice):
        def library(alpha: float, beta: float, a: Any, packed: PackedB, out: Any, bias: Any) -> None:
            numpy_call(alpha, beta, a, packed.matrix, out, bias)

        return library
    winner.build().result()
    kernel, config = winner.kernel(), winner.config
    head = static_args(a, packed.matrix, out, config)[:-1]
    team = HOST_TEAM if host_team else 0
    if winner.template in (SMALL_M, GEMV, FEW_COLS):  # reads the copy itself
        streaming = runtime_args(config)[-1] | team

        def rows_call(alpha: float, beta: float, a: Any, packed: PackedB, out: Any, bias: Any) -> None:
            kernel(*head, streaming, float(alpha), float(beta), a, packed.matrix, out, bias)

        return rows_call
    mode = runtime_args(config)[-1] | PREPACKED | team

    def kernel_call(alpha: float, beta: float, a: Any, packed: PackedB, out: Any, bias: Any) -> None:
        kernel(*head, mode, float(alpha), float(beta), a, packed.packed(kernel, config), out, bias)

    return kernel_call


def clear() -> None:
    """Forget the prepared calls (decisions stay in the record database)."""
    with _lock:
        _calls.clear()
