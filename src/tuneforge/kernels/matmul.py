"""A small shipped op: C = A @ B by a cache-blocked C++ template against numpy.matmul.

It exists to exercise the whole tuning flow on a real compiled kernel; the tuned GEMM family that
competes with OpenBLAS is a separate, larger kernel family.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tuneforge.cpuinfo import blas_threads
from tuneforge.tune.choices import Choice, ExternChoice
from tuneforge.tune.select import select
from tuneforge.tune.template import KernelTemplate

SOURCE = r"""
#include <stdint.h>
// C[M,N] = A[M,K] @ B[K,N] with any element strides; blocks {{ BM }}x{{ BN }}x{{ BK }}.
extern "C" void tiled_matmul_{{ T }}(const {{ T }}* __restrict a, const {{ T }}* __restrict b,
                                     {{ T }}* __restrict c, int64_t M, int64_t N, int64_t K,
                                     int64_t sam, int64_t sak, int64_t sbk, int64_t sbn, int64_t scm, int64_t scn) {
    for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) c[i * scm + j * scn] = 0;
    for (int64_t i0 = 0; i0 < M; i0 += {{ BM }}) {
        const int64_t i1 = i0 + {{ BM }} < M ? i0 + {{ BM }} : M;
        for (int64_t k0 = 0; k0 < K; k0 += {{ BK }}) {
            const int64_t k1 = k0 + {{ BK }} < K ? k0 + {{ BK }} : K;
            for (int64_t j0 = 0; j0 < N; j0 += {{ BN }}) {
                const int64_t j1 = j0 + {{ BN }} < N ? j0 + {{ BN }} : N;
                for (int64_t i = i0; i < i1; ++i) {
                    {{ T }}* __restrict crow = c + i * scm;
                    for (int64_t k = k0; k < k1; ++k) {
                        const {{ T }} av = a[i * sam + k * sak];
                        const {{ T }}* __restrict brow = b + k * sbk;
                        if (sbn == 1 && scn == 1) {
#pragma GCC ivdep
                            for (int64_t j = j0; j < j1; ++j) crow[j] += av * brow[j];
                        } else {
                            for (int64_t j = j0; j < j1; ++j) crow[j * scn] += av * brow[j * sbn];
                        }
                    }
                }
            }
        }
    }
}
"""

SIGNATURE = ("void tiled_matmul_{{ T }}(const {{ T }}* a, const {{ T }}* b, {{ T }}* c, int64_t M, int64_t N, "
             "int64_t K, int64_t sam, int64_t sak, int64_t sbk, int64_t sbn, int64_t scm, int64_t scn)")

_C_TYPES = {"float32": "float", "float64": "double"}


def _elements(arr: np.ndarray[Any, Any]) -> tuple[int, ...]:
    return tuple(s // arr.itemsize for s in arr.strides)


def _launch(kernel: Any, args: Sequence[Any], config: Mapping[str, Any]) -> None:
    a, b, c = args
    (m, k), n = a.shape, b.shape[1]
    kernel(a, b, c, m, n, k, *_elements(a), *_elements(b), *_elements(c))


TEMPLATE = KernelTemplate("tiled_matmul", SOURCE, signature=SIGNATURE, launcher=_launch)

DEFAULT_BLOCKS = ((32, 256, 64), (64, 256, 32), (16, 512, 128), (64, 128, 128))
EXHAUSTIVE_BLOCKS = tuple(itertools.product((16, 32, 64), (64, 128, 256, 512), (32, 64, 128)))


def choices(dtype: Any, space: str = "default") -> list[Choice]:
    """numpy.matmul plus the tiled template over the chosen block sizes, for float32 or float64."""
    name = np.dtype(dtype).name
    if name not in _C_TYPES:
        raise ValueError(f"matmul supports float32 and float64, not {name}")
    if space not in ("default", "exhaustive"):
        raise ValueError(f"space must be 'default' or 'exhaustive', not {space!r}")
    blocks = DEFAULT_BLOCKS if space == "default" else EXHAUSTIVE_BLOCKS
    configs = [{"T": _C_TYPES[name], "BM": bm, "BN": bn, "BK": bk} for bm, bn, bk in blocks]
    # OpenBLAS's threads are in numpy's identity: its record from a process with another thread count must not answer
    return [ExternChoice(np.matmul, name="numpy_matmul", depends={"threads": blas_threads()}),
            *TEMPLATE.choices(configs)]


_dispatch: dict[tuple[Any, ...], Choice] = {}


def matmul(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any], out: np.ndarray[Any, Any] | None = None, *,
           space: str = "default") -> np.ndarray[Any, Any]:
    """A @ B with the implementation tuned for these shapes, dtypes and strides."""
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"matmul needs A[M,K] and B[K,N], got {a.shape} and {b.shape}")
    if out is None:
        out = np.empty((a.shape[0], b.shape[1]), dtype=np.result_type(a, b))
    key = (a.shape, a.strides, a.dtype, b.shape, b.strides, b.dtype, out.strides, space)
    choice = _dispatch.get(key)
    if choice is None:
        choice = _dispatch[key] = select("matmul", choices(a.dtype, space), [a, b], out=out)
    choice(a, b, out)
    return out
