"""Checking a choice's output against the reference, and guarding inputs against in-place writes."""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import numpy as np

from tuneforge.tune import bulk

# (rtol, atol) by dtype; atol is scaled by the largest reference magnitude, because reductions
# (a GEMM's K-sum) accumulate rounding error in proportion to the values' scale.
_TOLERANCES = {
    "float16": (1e-2, 1e-2), "bfloat16": (2e-2, 2e-2), "float32": (1e-4, 1e-5), "float64": (1e-9, 1e-12),
    "complex64": (1e-4, 1e-5), "complex128": (1e-9, 1e-12),
}


def _as_numpy(value: Any) -> np.ndarray[Any, Any]:
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "detach"):  # torch tensor: compare on the host in float64
        return np.asarray(value.detach().cpu().double().numpy() if value.is_floating_point() else value.cpu())
    return np.asarray(value)


def tolerances(dtype: Any) -> tuple[float, float]:
    """(rtol, atol) of a numpy or torch dtype, a dtype name, or a scalar type such as np.float32."""
    name = str(dtype).removeprefix("torch.")
    if name not in _TOLERANCES:
        with contextlib.suppress(TypeError):
            name = np.dtype(dtype).name
    return _TOLERANCES.get(name, (0.0, 0.0))  # integers and bools must match exactly


def _on_gpu(*values: Any) -> bool:
    """Whether every value is a torch tensor off the host (compared where it lives: copying a 4096^2 output
    to the host and widening it to float64 took ~0.3 s a choice on an H200's host, most of a cold tuning)."""
    return all(hasattr(v, "detach") and getattr(getattr(v, "device", None), "type", "cpu") != "cpu" for v in values)


def compare(actual: Any, expected: Any, *, rtol: float | None = None, atol: float | None = None) -> str | None:
    """None when `actual` matches `expected` within the dtype's tolerance; otherwise the reason."""
    if _on_gpu(actual, expected):
        default_rtol, default_atol = tolerances(expected.dtype)
        return _compare_on_device(actual, expected, default_rtol if rtol is None else rtol,
                                  default_atol if atol is None else atol)
    got, want = _as_numpy(actual), _as_numpy(expected)
    if got.shape != want.shape:
        return f"output shape {got.shape} differs from the reference's {want.shape}"
    default_rtol, default_atol = tolerances(getattr(expected, "dtype", want.dtype))
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    if got.size == 0:
        return None
    if np.issubdtype(want.dtype, np.inexact):
        return _compare_inexact(got, want, rtol, atol)
    if np.array_equal(got, want):
        return None
    first = tuple(int(i) for i in np.argwhere(got != want)[0])
    return f"wrong result at index {first}: got {got[first]}, expected {want[first]} (exact match required)"


# Outputs are compared in blocks of leading-axis slices of about this many elements, through two scratch buffers
# kept per thread: whole-array float64 temporaries of a 4096^2 output cost ~0.25 s a comparison (most of it page
# faults), and a 512^2 float64 output's two fresh 2 MiB temporaries per block 8.2 ms (0.49 for float32). Two
# buffers made once per comparison still cost 1.8 ms of page faults for float64 (1 MiB each: glibc maps and unmaps
# them every time), about half a 512^3 float64 GEMM's check; kept, the comparison takes 0.7 ms. Smaller blocks cost
# more in numpy's per-call overhead than they save (2^15 elements: 4096^2 float32 47 ms against 36-39).
_BLOCK_ELEMENTS = 1 << 17
_scratch = threading.local()  # .buffers: {dtype: (magnitude, error)}, each of at least the block's size


def _scratch_buffers(size: int, dtype: Any) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """Two scratch arrays of `dtype` with at least `size` elements, this thread's own (made on first use). A block
    of one very long row is larger than _BLOCK_ELEMENTS: its buffers are made for this comparison only, not kept."""
    if size > _BLOCK_ELEMENTS:
        return np.empty(size, dtype), np.empty(size, dtype)
    kept: dict[Any, tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]] = _scratch.__dict__.setdefault("buffers", {})
    pair = kept.get(dtype)
    if pair is None or pair[0].size < size:
        pair = kept[dtype] = (np.empty(size, dtype), np.empty(size, dtype))
    return pair


def _blocks(got: np.ndarray, want: np.ndarray) -> Iterator[tuple[tuple[slice, ...], np.ndarray, np.ndarray]]:
    """(index of the block, got's block, want's block) over the leading axis."""
    rows = max(1, _BLOCK_ELEMENTS // max(1, got.size // max(1, got.shape[0]))) if got.ndim else 1
    if got.ndim == 0 or rows >= got.shape[0]:
        yield (), got, want
        return
    for start in range(0, got.shape[0], rows):
        index = (slice(start, start + rows),)
        yield index, got[index], want[index]


def _compare_inexact(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> str | None:
    # One pass over the blocks: |got - want| <= atol * scale + rtol * |want| holds everywhere exactly when the
    # largest excess |got - want| - rtol * |want| is at most atol * scale, and scale (the largest finite |want|)
    # is only known at the end. float32 and float64 are compared in their own type (a difference of two close
    # values is exact in it); others in float64 or complex128. A 4096^2 fp32 check took 0.11 s in float64.
    wide: type = np.complex128 if np.iscomplexobj(want) or np.iscomplexobj(got) else np.float64
    if got.dtype == want.dtype and got.dtype in (np.float32, np.float64):
        wide = got.dtype.type
    real = np.float64 if wide is np.complex128 else wide  # |complex| is real
    largest_block = next(_blocks(got, want))[1].size  # the first: only the last one is shorter
    magnitude_buffer, error_buffer = _scratch_buffers(largest_block, real)
    scale = largest = 0.0
    worst: tuple[float, tuple[int, ...]] | None = None  # (largest excess, where)
    for index, g, w in _blocks(got, want):
        if not g.size:
            continue
        magnitude = magnitude_buffer[:g.size].reshape(g.shape)
        error = error_buffer[:g.size].reshape(g.shape)
        wide_w: np.ndarray[Any, Any] = w.astype(wide, copy=False)
        np.abs(wide_w, out=magnitude)
        with np.errstate(invalid="ignore", over="ignore"):  # inf - inf where both are inf: masked out below
            if wide is np.complex128:  # the difference is complex: no real buffer holds it
                np.abs(g.astype(wide, copy=False) - wide_w, out=error)
            else:
                np.abs(np.subtract(g.astype(wide, copy=False), wide_w, out=error), out=error)
        block_scale, block_largest = float(magnitude.max()), float(error.max())  # NaN and inf come through max
        if not (np.isfinite(block_scale) and np.isfinite(block_largest)):  # a non-finite value somewhere
            finite_want = np.isfinite(w)
            if not np.array_equal(np.isfinite(g), finite_want):
                bad = np.argwhere(np.isfinite(g) != finite_want)[0]
                at = _at(index, bad)
                return (f"non-finite value mismatch at index {at}: got {got[at]}, expected {want[at]} (was every "
                        "element of the output written?)")
            error[~finite_want] = 0.0
            magnitude[~finite_want] = 0.0
            block_scale, block_largest = float(magnitude.max()), float(error.max())
        scale, largest = max(scale, block_scale), max(largest, block_largest)
        magnitude *= rtol
        excess = np.subtract(error, magnitude, out=error)
        local = np.unravel_index(int(np.argmax(excess)), excess.shape)
        if worst is None or float(excess[local]) > worst[0]:
            worst = (float(excess[local]), _at(index, local))
    if worst is None or worst[0] <= atol * max(scale, 1.0):
        return None
    at = worst[1]
    return (f"wrong result: max abs error {largest:.3g}; at index {at} got {got[at]}, expected {want[at]} "
            f"(rtol={rtol:g}, atol={atol:g}×{max(scale, 1.0):.3g})")


def _compare_on_device(got: Any, want: Any, rtol: float, atol: float) -> str | None:
    """`compare` for torch tensors on a GPU, computed there: the same test as `_compare_inexact` (in float32,
    float64 for float64 and complex128 for complex tensors, in which the difference of two close values of
    the tensors' own type is exact); one number comes back to the host unless the check fails."""
    import torch

    if tuple(got.shape) != tuple(want.shape):
        return f"output shape {tuple(got.shape)} differs from the reference's {tuple(want.shape)}"
    if got.numel() == 0:
        return None
    if not (want.is_floating_point() or want.is_complex()):
        if torch.equal(got, want):
            return None
        first = tuple(int(i) for i in torch.nonzero(got != want)[0])
        return f"wrong result at index {first}: got {got[first].item()}, expected {want[first].item()} " \
            "(exact match required)"
    wide = torch.float64 if want.dtype == torch.float64 else torch.complex128 if want.is_complex() else torch.float32
    g, w = got.to(wide), want.to(wide)
    finite = torch.isfinite(w)
    if not torch.equal(torch.isfinite(g), finite):
        at = tuple(int(i) for i in torch.nonzero(torch.isfinite(g) != finite)[0])
        return (f"non-finite value mismatch at index {at}: got {got[at].item()}, expected {want[at].item()} "
                "(was every element of the output written?)")
    magnitude = torch.where(finite, w.abs(), 0.0)
    error = torch.where(finite, (g - w).abs(), 0.0)
    scale = max(float(magnitude.max()), 1.0)
    excess = error - rtol * magnitude
    worst = int(torch.argmax(excess))
    if float(excess.reshape(-1)[worst]) <= atol * scale:
        return None
    at = tuple(int(i) for i in np.unravel_index(worst, tuple(got.shape)))
    return (f"wrong result: max abs error {float(error.max()):.3g}; at index {at} got {got[at].item()}, expected "
            f"{want[at].item()} (rtol={rtol:g}, atol={atol:g}×{scale:.3g})")


def _at(block: tuple[slice, ...], local: Any) -> tuple[int, ...]:
    """An index within a block as an index into the whole array."""
    position = [int(i) for i in local]
    if block:
        position[0] += block[0].start
    return tuple(position)


def is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray) or (hasattr(value, "copy_") and hasattr(value, "clone"))


def snapshot(args: Sequence[Any], only: Sequence[int] | None = None) -> list[Any]:
    """Copies of every array argument (or of those at positions `only`; None for the rest)."""
    return [(a.clone() if hasattr(a, "clone") else bulk.copy(a)) if is_array(a) and (only is None or i in only)
            else None for i, a in enumerate(args)]


def restore(args: Sequence[Any], saved: Sequence[Any], indices: Sequence[int] | None = None) -> None:
    for i in range(len(args)) if indices is None else indices:
        if saved[i] is not None:
            if isinstance(args[i], np.ndarray):
                bulk.copy_into(args[i], saved[i])
            else:
                args[i].copy_(saved[i])


def changed(args: Sequence[Any], saved: Sequence[Any], indices: Sequence[int]) -> list[int]:
    """The indices among `indices` whose array contents differ from the snapshot (NaN equals NaN)."""
    out = []
    for i in indices:
        if saved[i] is None:
            continue
        if isinstance(args[i], np.ndarray) and _same_bytes(args[i], saved[i]):
            continue
        if _on_gpu(args[i], saved[i]):
            if not _same_on_device(args[i], saved[i]):
                out.append(i)
            continue
        now, before = _as_numpy(args[i]), _as_numpy(saved[i])
        equal_nan = bool(np.issubdtype(now.dtype, np.inexact))
        if not np.array_equal(now, before, equal_nan=equal_nan):
            out.append(i)
    return out


def _same_on_device(now: Any, before: Any) -> bool:
    """Whether two tensors on a GPU hold the same values (NaN equal to NaN), compared there."""
    import torch

    if now.dtype != before.dtype or tuple(now.shape) != tuple(before.shape):
        return False
    if torch.equal(now, before):
        return True
    if not (now.is_floating_point() or now.is_complex()):
        return False
    return bool(((now == before) | (torch.isnan(now) & torch.isnan(before))).all())


def _libc_memcmp() -> Callable[[int, int, int], int] | None:
    try:
        memcmp = ctypes.CDLL(None).memcmp
    except (OSError, AttributeError, TypeError):  # no C library to ask (e.g. Windows): numpy compares
        return None
    memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
    memcmp.restype = ctypes.c_int
    return cast("Callable[[int, int, int], int]", memcmp)


memcmp = _libc_memcmp()  # None where there is no C library to ask


def _same_bytes(now: np.ndarray[Any, Any], before: Any) -> bool:
    """Whether two contiguous arrays hold the same bytes (False also when it cannot tell: compare the values).

    Every choice's checked run compares each input with its snapshot, and a GEMM's B can be 64 MB:
    np.array_equal takes ~40 ms there (a full boolean temporary), memcmp ~5 ms.
    """
    if (memcmp is None or not isinstance(before, np.ndarray) or now.dtype != before.dtype
            or now.shape != before.shape or not (now.flags.c_contiguous and before.flags.c_contiguous)):
        return False
    return now.nbytes == 0 or memcmp(now.ctypes.data, before.ctypes.data, now.nbytes) == 0


def poison(value: Any) -> None:
    """Fill an output buffer with values no correct kernel leaves behind (NaN for floats)."""
    if isinstance(value, np.ndarray):
        if np.issubdtype(value.dtype, np.inexact):
            bulk.fill(value, np.nan)
        elif np.issubdtype(value.dtype, np.integer):
            value.fill(np.iinfo(value.dtype).min)
    elif hasattr(value, "fill_"):
        value.fill_(float("nan") if value.is_floating_point() else -(2**31) + 1)


def poison_left(value: Any) -> bool:
    """Whether an output poisoned before a run may still hold some of the poison: for floats, whether any element
    is not finite (one sum, through which NaN and inf come; an overflowing sum errs on the safe side); True for
    other types, where it cannot be told so cheaply."""
    if isinstance(value, np.ndarray):
        if not np.issubdtype(value.dtype, np.inexact):
            return True
        with np.errstate(all="ignore"):
            return not bool(np.isfinite(np.add.reduce(value, axis=None)))
    if hasattr(value, "is_floating_point") and (value.is_floating_point() or value.is_complex()):
        import torch

        return not bool(torch.isfinite(value.sum()).all())
    return True


def reset(value: Any) -> None:
    """Zero an output buffer before a timed run."""
    if isinstance(value, np.ndarray):
        value.fill(0)
    elif hasattr(value, "zero_"):
        value.zero_()
