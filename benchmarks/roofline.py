"""What this machine can do at best, measured in the same run as the figures it bounds.

- `measure_peak`: FMA throughput with the widest vectors the kernels may use (kernel_isa setting).
- `measure_read_bandwidth`: GB/s of reading a buffer of a given size over and over, as a kernel that
  streams its operands does (so whatever part of it the caches keep between calls counts too); the best
  of a few access patterns.
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
typedef float vec __attribute__((vector_size({V}), aligned(4)));
enum {{ LANES = sizeof(vec) / sizeof(float) }};

// Each thread sums its contiguous part of the buffer as S streams read side by side (S sub-parts),
// two vectors per stream per step: which pattern a core's prefetchers serve best differs by CPU.
template <int S>
static float read_part(const float* data, int64_t n) {{
    const int64_t sub = n / S / (2 * LANES) * (2 * LANES);
    vec sums[S] = {{}};
    for (int64_t i = 0; i < sub; i += 2 * LANES)
#pragma GCC unroll 8
        for (int s = 0; s < S; ++s) {{
            const float* at = data + s * sub + i;
            sums[s] += *(const vec*)at + *(const vec*)(at + LANES);
        }}
    vec total = {{}};
    for (int s = 0; s < S; ++s) total += sums[s];
    float part = 0;
    for (int j = 0; j < LANES; ++j) part += total[j];
    for (int64_t i = S * sub; i < n; ++i) part += data[i];
    return part;
}}

extern "C" float read_all(const float* data, int64_t n, int threads, int streams) {{
    float total = 0;
#pragma omp parallel num_threads(threads) reduction(+ : total)
    {{
        const int64_t t = omp_get_thread_num(), team = omp_get_num_threads();
        const int64_t begin = n * t / team, count = n * (t + 1) / team - begin;
        total += streams == 1 ? read_part<1>(data + begin, count)
               : streams == 2 ? read_part<2>(data + begin, count)
               : streams == 4 ? read_part<4>(data + begin, count) : read_part<8>(data + begin, count);
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
# Streams each thread reads side by side: on a Zen 5, 4 far-apart streams read up to 15% faster than 1.
READ_STREAMS = (1, 4, 8)


def measure_read_bandwidth(nbytes: int, threads: int, budget_s: float = 0.5) -> float:
    """GB/s of reading an `nbytes` buffer (allocated by numpy, as the operands are) again and again:
    the median of the best of READ_STREAMS access patterns."""
    global _read_lib
    import tuneforge

    if _read_lib is None:
        _read_lib = tuneforge.cpp.load(READ_SOURCE.format(V=_vector_bytes()), openmp=True)
        _read_lib.read_all.restype = ctypes.c_float
        _read_lib.read_all.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int]
    count = max(1024, nbytes // 4)
    data = np.ones(count, dtype=np.float32)
    address = data.ctypes.data
    times: dict[int, list[float]] = {streams: [] for streams in READ_STREAMS}
    for streams in READ_STREAMS:
        _read_lib.read_all(address, count, threads, streams)
    deadline = time.perf_counter() + budget_s
    while len(times[1]) < 5 or time.perf_counter() < deadline:  # patterns interleaved: drift hits all alike
        for streams, samples in times.items():
            started = time.perf_counter()
            _read_lib.read_all(address, count, threads, streams)
            samples.append(time.perf_counter() - started)
    return count * 4 / min(statistics.median(samples) for samples in times.values()) / 1e9


def operand_bytes(m: int, n: int, k: int, itemsize: int) -> int:
    """The least a GEMM must move: A and B read once, C written once."""
    return (m * k + k * n + m * n) * itemsize


def attainable_gflops(flops: int, nbytes: int, peak_gflops: float, bandwidth_gbs: float) -> float:
    """The roofline: compute-bound at the peak, or bound by reading the operands once at `bandwidth_gbs`."""
    return min(peak_gflops, flops / (nbytes / bandwidth_gbs))
