"""Copies and fills of large arrays, in parts on several threads (numpy releases the GIL while it copies or fills).

Why: before its first choice runs, a trial job draws its inputs, snapshots every argument and poisons the outputs.
For a 4096^3 float32 GEMM that is five 64 MB arrays written, 0.9-1.2 s on one core of this 2-core VM (mostly the
first touch of fresh pages), which is on the critical path of a cold tuning whose kernels were built before (a
later shape of the same program). On two threads a 64 MB copy took 0.10-0.12 s instead of 0.16-0.21, a fill
0.10-0.11 instead of 0.17-0.21. Smaller arrays, other layouts and torch tensors go as before.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from tuneforge.cpuinfo import usable_cores

PARALLEL_BYTES = 16 << 20  # from this size (a 64 MB copy was 0.1-0.2 s here; 16 MB, 3-5x less than a thread pool)
MAX_PARTS = 4  # memory-bound: more threads than this only contend for the same bandwidth


def parts_for(*arrays: Any) -> int:
    """How many parts a copy between (or a fill of) `arrays` is split into: 1 unless they are all C-contiguous numpy
    arrays of the same size and layout, of PARALLEL_BYTES or more, and the process may use several cores."""
    first = arrays[0]
    if not all(isinstance(a, np.ndarray) and a.flags.c_contiguous and a.nbytes == first.nbytes
               and a.dtype == first.dtype for a in arrays) or first.nbytes < PARALLEL_BYTES:
        return 1
    return max(1, min(MAX_PARTS, usable_cores()))


def in_parts(work: Callable[[int, slice], object], count: int, parts: int, workers: int | None = None) -> None:
    """`work(index, part)` for `parts` consecutive slices of range(count), on `workers` threads (default: one a
    part; inline for one)."""
    bounds = [count * i // parts for i in range(parts + 1)]
    workers = parts if workers is None else workers
    if parts <= 1 or workers <= 1:
        for i in range(parts):
            work(i, slice(bounds[i], bounds[i + 1]))
        return
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tuneforge-bulk") as pool:
        list(pool.map(lambda i: work(i, slice(bounds[i], bounds[i + 1])), range(parts)))


def copy(value: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """`value.copy()`."""
    parts = parts_for(value)
    out: np.ndarray[Any, Any]
    if parts == 1:
        out = value.copy()
        return out
    out = np.empty_like(value)
    source, target = value.reshape(-1), out.reshape(-1)
    in_parts(lambda _, part: np.copyto(target[part], source[part]), source.size, parts)
    return out


def copy_into(target: np.ndarray[Any, Any], source: Any) -> None:
    """`np.copyto(target, source)`."""
    parts = parts_for(target, source) if isinstance(source, np.ndarray) and source.shape == target.shape else 1
    if parts == 1:
        np.copyto(target, source)
        return
    flat_target, flat_source = target.reshape(-1), source.reshape(-1)
    in_parts(lambda _, part: np.copyto(flat_target[part], flat_source[part]), flat_target.size, parts)


def fill(value: np.ndarray[Any, Any], scalar: Any) -> None:
    """`value.fill(scalar)`."""
    parts = parts_for(value)
    if parts == 1:
        value.fill(scalar)
        return
    flat = value.reshape(-1)
    in_parts(lambda _, part: flat[part].fill(scalar), flat.size, parts)
