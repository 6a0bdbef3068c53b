"""What this machine can do at best, measured in the same run as the figures it bounds.

- `measure_peak`: FMA throughput with the widest vectors the kernels may use (kernel_isa setting).
- `measure_read_bandwidth`: GB/s of reading a buffer of a given size over and over, as a kernel
  that streams its operands does (so whatever part of it the caches keep between calls counts too).
- `attainable_gflops`: the roofline: the lower of the peak and the rate at which the operands can be
  read once per call.
"""

from __future__ import annotations

import ctypes
import statistics
import time
from typing import Any

import numpy as np

PEAK_SOURCE = r"""
#include <stdint.h>
#include <omp.h>
typedef {T} vec __attribute__((vector_size({V})));
// 12 independent FMA chains per thread: enough to fill two FMA pipes of latency 4-5.
extern "C" double peak(int64_t iters, int threads) {{
    double total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {{
        vec acc[12], m = (vec){{}} + ({T})0.9999, a = (vec){{}} + ({T})1e-6;
        for (int i = 0; i < 12; ++i) acc[i] = (vec){{}} + ({T})i;
        for (int64_t it = 0; it < iters; ++it) {{
#pragma GCC unroll 12
            for (int i = 0; i < 12; ++i) acc[i] = acc[i] * m + a;
        }}
        {T} s = 0;
        for (int i = 0; i < 12; ++i)
            for (int j = 0; j < (int)(sizeof(vec) / sizeof({T})); ++j) s += acc[i][j];
        total += s;
    }}
    return total;
}}
"""

READ_SOURCE = r"""
#include <stdint.h>
#include <omp.h>
typedef float vec __attribute__((vector_size({V})));
// Sum a buffer with 4 independent vector accumulators per thread; each thread reads one contiguous part.
extern "C" float read_all(const float* data, int64_t n, int threads) {{
    const int64_t lanes = sizeof(vec) / sizeof(float), step = 4 * lanes;
    float total = 0;
#pragma omp parallel for num_threads(threads) reduction(+ : total) schedule(static)
    for (int64_t start = 0; start < n; start += 1 << 16) {{
        const int64_t end = start + (1 << 16) < n ? start + (1 << 16) : n;
        vec s0 = {{}}, s1 = {{}}, s2 = {{}}, s3 = {{}};
        int64_t i = start;
        for (; i + step <= end; i += step) {{
            s0 += *(const vec*)(data + i);
            s1 += *(const vec*)(data + i + lanes);
            s2 += *(const vec*)(data + i + 2 * lanes);
            s3 += *(const vec*)(data + i + 3 * lanes);
        }}
        vec s = s0 + s1 + s2 + s3;
        float part = 0;
        for (int64_t j = 0; j < lanes; ++j) part += s[j];
        for (; i < end; ++i) part += data[i];
        total += part;
    }}
    return total;
}}
"""


def _vector_bytes() -> int:
    from tuneforge.cpuinfo import cpu_info
    from tuneforge.kernels.gemm.space import vector_widths

    return vector_widths(cpu_info())[0]


def measure_peak(dtype: str, threads: int) -> float:
    """FMA throughput in GFLOP/s for the widest vectors the kernels may use."""
    import tuneforge

    vec = _vector_bytes()
    ctype = "float" if dtype == "float32" else "double"
    lib = tuneforge.cpp.load(PEAK_SOURCE.format(T=ctype, V=vec), openmp=True, flags=["-ffp-contract=fast"])
    lib.peak.restype = ctypes.c_double
    lib.peak.argtypes = [ctypes.c_int64, ctypes.c_int]
    lanes = vec // (4 if dtype == "float32" else 8)
    iters = 20_000_000
    best = 0.0
    for _ in range(5):
        started = time.perf_counter()
        lib.peak(iters, threads)
        elapsed = time.perf_counter() - started
        best = max(best, 2 * 12 * lanes * iters * threads / elapsed / 1e9)
    return best


_read_lib: Any = None


def measure_read_bandwidth(nbytes: int, threads: int, budget_s: float = 0.5) -> float:
    """Median GB/s of reading an `nbytes` buffer again and again (64-byte aligned, as numpy allocates)."""
    global _read_lib
    import tuneforge

    if _read_lib is None:
        _read_lib = tuneforge.cpp.load(READ_SOURCE.format(V=_vector_bytes()), openmp=True)
        _read_lib.read_all.restype = ctypes.c_float
        _read_lib.read_all.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int]
    count = max(1024, nbytes // 4)
    raw = np.ones(count + 16, dtype=np.float32)
    offset = (-raw.ctypes.data % 64) // 4
    data = raw[offset:offset + count]
    address = data.ctypes.data
    _read_lib.read_all(address, count, threads)
    times = []
    deadline = time.perf_counter() + budget_s
    while len(times) < 5 or time.perf_counter() < deadline:
        started = time.perf_counter()
        _read_lib.read_all(address, count, threads)
        times.append(time.perf_counter() - started)
    return count * 4 / statistics.median(times) / 1e9


def operand_bytes(m: int, n: int, k: int, itemsize: int) -> int:
    """The least a GEMM must move: A and B read once, C written once."""
    return (m * k + k * n + m * n) * itemsize


def attainable_gflops(flops: int, nbytes: int, peak_gflops: float, bandwidth_gbs: float) -> float:
    """The roofline: compute-bound at the peak, or bound by reading the operands once at `bandwidth_gbs`."""
    return min(peak_gflops, flops / (nbytes / bandwidth_gbs))
