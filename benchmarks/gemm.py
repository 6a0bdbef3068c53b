"""GEMM benchmark: tuned tuneforge.gemm vs numpy (OpenBLAS), measured in the same run, 1 and 2 threads.

    python benchmarks/gemm.py [--quick] [--threads 1 2] [--dtypes float32 float64]

For each dtype, thread count and shape: GFLOP/s of numpy.matmul and of the tuned tuneforge kernel
(first call tunes the `default` space cold; the figure is the steady state after it), their ratio,
the share of the machine's peak (measured here with an FMA-throughput microbenchmark), the cold
tuning time and the winning configuration. Each thread count runs in its own process with
OPENBLAS_NUM_THREADS / TUNEFORGE_KERNEL_THREADS set, so numpy and tuneforge use the same cores.
Prints a table and writes benchmarks/results/gemm.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from common import write_results

SHAPES = [(64, 64, 64), (128, 128, 128), (256, 256, 256), (512, 512, 512), (1024, 1024, 1024),
          (2048, 2048, 2048), (32, 4096, 4096), (4096, 32, 4096), (4096, 4096, 32), (1, 4096, 4096)]
QUICK = [(64, 64, 64), (512, 512, 512), (32, 4096, 4096), (1, 4096, 4096)]

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


def measure_peak(dtype: str, threads: int) -> float:
    """FMA throughput in GFLOP/s for the widest vectors this CPU runs."""
    import tuneforge
    from tuneforge.cpuinfo import cpu_info
    from tuneforge.kernels.gemm.space import vector_widths

    vec = vector_widths(cpu_info())[0]  # the widest the kernels may use (kernel_isa setting)
    ctype = "float" if dtype == "float32" else "double"
    lib = tuneforge.cpp.load(PEAK_SOURCE.format(T=ctype, V=vec), openmp=True, flags=["-ffp-contract=fast"])
    import ctypes

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


def steady_gflops(fn: Any, flops: int, budget_s: float = 1.0) -> float:
    fn()
    times = []
    deadline = time.perf_counter() + budget_s
    while len(times) < 5 or (time.perf_counter() < deadline and len(times) < 2000):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return flops / statistics.median(times) / 1e9


def child(threads: int, dtypes: list[str], shapes: list[tuple[int, int, int]]) -> list[dict[str, Any]]:
    import numpy as np

    import tuneforge
    from tuneforge.kernels.gemm import dispatch
    from tuneforge.kernels.gemm.op import op_name
    from tuneforge.store.default import default_records
    from tuneforge.tune.select import selection_key
    from tuneforge.tune.specs import TensorSpec

    rows = []
    for dtype in dtypes:
        peak = measure_peak(dtype, threads)
        for m, n, k in shapes:
            rng = np.random.default_rng(0)
            a = rng.standard_normal((m, k)).astype(dtype)
            b = rng.standard_normal((k, n)).astype(dtype)
            out = np.empty((m, n), dtype=dtype)
            started = time.perf_counter()
            tuneforge.gemm(a, b, out)
            cold = time.perf_counter() - started
            tuneforge.gemm(a, b, out)  # a repeated layout: the C fast path is loaded (once) and takes it
            dispatch.wait()
            error = float(np.abs(out - a @ b).max() / max(1.0, float(np.abs(a @ b).max())))
            flops = 2 * m * n * k
            ours, theirs = [], []
            def library(a: Any = a, b: Any = b, out: Any = out) -> None:
                np.matmul(a, b, out=out)

            def tuned(a: Any = a, b: Any = b, out: Any = out) -> None:
                tuneforge.gemm(a, b, out)

            for _ in range(3):  # interleaved rounds: drift hits both alike
                theirs.append(steady_gflops(library, flops, 0.4))
                ours.append(steady_gflops(tuned, flops, 0.4))
            key = selection_key(op_name(0.0, None), [TensorSpec.of(a), TensorSpec.of(b), 1.0, 0.0, None,
                                                     TensorSpec.of(out)])
            best = default_records().best(key)
            rows.append({"dtype": dtype, "shape": f"{m}x{n}x{k}", "threads": threads,
                         "numpy_gflops": statistics.median(theirs), "tuneforge_gflops": statistics.median(ours),
                         "peak_gflops": peak, "cold_tune_s": cold, "max_rel_error": error,
                         "winner": best.choice_name if best else "?",
                         "winner_info": ", ".join(f"{k}={v}" for k, v in (best.params if best else {}).items()
                                                  if k in ("VEC_BYTES", "MR", "NV", "PACK_A", "PACK_B", "MC", "KC",
                                                           "NC", "threads", "par"))})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    parser.add_argument("--quick", action="store_true", help="4 shapes instead of 10")
    parser.add_argument("--isa", default="auto", help="cap the kernels' vector ISA (e.g. avx2), as on a CPU "
                        "without AVX-512")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    shapes = QUICK if args.quick else SHAPES
    if args.child is not None:
        print(json.dumps(child(args.child, args.dtypes, shapes)))
        return
    rows: list[dict[str, Any]] = []
    for threads in args.threads:
        with tempfile.TemporaryDirectory(prefix="tuneforge-gemm-bench-") as cache:
            env = {**os.environ, "TUNEFORGE_CACHE_DIR": cache, "OPENBLAS_NUM_THREADS": str(threads),
                   "TUNEFORGE_KERNEL_THREADS": str(threads), "OMP_NUM_THREADS": str(threads),
                   "TUNEFORGE_KERNEL_ISA": args.isa}
            command = [sys.executable, __file__, "--child", str(threads), "--dtypes", *args.dtypes]
            if args.quick:
                command.append("--quick")
            proc = subprocess.run(command, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(proc.stderr)
            rows += json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{'dtype':8} {'shape':>16} {'thr':>3} {'numpy':>8} {'tuneforge':>9} {'ratio':>6} {'%peak':>6} "
          f"{'cold s':>6}  winner")
    for r in rows:
        ratio = r["tuneforge_gflops"] / r["numpy_gflops"]
        print(f"{r['dtype']:8} {r['shape']:>16} {r['threads']:>3} {r['numpy_gflops']:8.1f} "
              f"{r['tuneforge_gflops']:9.1f} {ratio:5.2f}x {100 * r['tuneforge_gflops'] / r['peak_gflops']:5.0f}% "
              f"{r['cold_tune_s']:6.2f}  {r['winner']} {r['winner_info']}")
    peaks = sorted({(r["dtype"], r["threads"], round(r["peak_gflops"], 1)) for r in rows})
    print("measured FMA peak (GFLOP/s): " + ", ".join(f"{d} {t}T {p}" for d, t, p in peaks))
    write_results(("gemm" if args.isa == "auto" else f"gemm-{args.isa}"), rows)


if __name__ == "__main__":
    main()
