"""GEMM benchmark: tuned tuneforge.gemm vs numpy (OpenBLAS), measured in the same run, 1 and 2 threads.

    python benchmarks/gemm.py [--quick | --shapes 1x4096x4096 ...] [--threads 1 2] [--dtypes float32 float64]
                              [--isa avx2]

For each dtype, thread count and shape: GFLOP/s of numpy.matmul and of the tuned tuneforge kernel
(first call tunes the `default` space cold; the figure is the steady state after it), their ratio
(the median of the ratios of 5 interleaved rounds),
the share of the machine's peak (measured here with an FMA-throughput microbenchmark) and of the
roofline (the peak, or reading the operands once at the read bandwidth measured here for their size,
whichever is lower: GEMV is bound by memory), the cold tuning time and the winning configuration.
Each thread count runs in its own process with OPENBLAS_NUM_THREADS / TUNEFORGE_KERNEL_THREADS set,
so numpy and tuneforge use the same cores. Prints a table and writes benchmarks/results/gemm.json;
with --isa avx2, kernels are capped at AVX2 (a CPU without AVX-512) and results go to gemm-avx2.json;
a run of fewer shapes (--quick, --shapes) writes gemm[-avx2]-subset.json.
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
from roofline import attainable_gflops, measure_peak, measure_read_bandwidth, operand_bytes

SHAPES = [(64, 64, 64), (128, 128, 128), (256, 256, 256), (512, 512, 512), (1024, 1024, 1024),
          (2048, 2048, 2048), (32, 4096, 4096), (4096, 32, 4096), (4096, 4096, 32), (1, 4096, 4096)]
QUICK = [(64, 64, 64), (512, 512, 512), (32, 4096, 4096), (1, 4096, 4096)]

def parse_shape(text: str) -> tuple[int, int, int]:
    try:
        m, n, k = (int(size) for size in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"shape {text!r} is not MxNxK (three integers, as in 512x512x512)") from None
    return m, n, k


def steady_gflops(fn: Any, flops: int, budget_s: float = 1.0) -> float:
    time.sleep(0.2)  # the other side's idle threads stop spinning (OpenBLAS's for 0.1-0.15 s after a call)
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
            traffic = operand_bytes(m, n, k, a.itemsize)
            ours, theirs, bandwidths = [], [], []
            def library(a: Any = a, b: Any = b, out: Any = out) -> None:
                np.matmul(a, b, out=out)

            def tuned(a: Any = a, b: Any = b, out: Any = out) -> None:
                tuneforge.gemm(a, b, out)

            # Interleaved short rounds, compared pairwise: the host's memory bandwidth shifts by up to 1.5x
            # for seconds at a time, and a ratio of medians taken in different phases can say 0.8x or 1.5x.
            # The read bandwidth is measured in every round too, so that the roofline sees the same phases.
            for _ in range(5):
                bandwidths.append(measure_read_bandwidth(traffic, threads, budget_s=0.1))
                theirs.append(steady_gflops(library, flops, 0.25))
                ours.append(steady_gflops(tuned, flops, 0.25))
            bandwidth = statistics.median(bandwidths)
            key = selection_key(op_name(0.0, None), [TensorSpec.of(a), TensorSpec.of(b), 1.0, 0.0, None,
                                                     TensorSpec.of(out)])
            best = default_records().best(key)
            rows.append({"dtype": dtype, "shape": f"{m}x{n}x{k}", "threads": threads,
                         "numpy_gflops": statistics.median(theirs), "tuneforge_gflops": statistics.median(ours),
                         "ratio": statistics.median(x / y for x, y in zip(ours, theirs, strict=True)),
                         "peak_gflops": peak, "read_gbs": bandwidth,
                         "attainable_gflops": attainable_gflops(flops, traffic, peak, bandwidth),
                         "cold_tune_s": cold, "max_rel_error": error,
                         "winner": best.choice_name if best else "?",
                         "winner_info": ", ".join(f"{k}={v}" for k, v in (best.params if best else {}).items()
                                                  if k not in ("T", "NAME"))})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    parser.add_argument("--quick", action="store_true", help="4 shapes instead of 10")
    parser.add_argument("--shapes", nargs="+", type=parse_shape, help="MxNxK shapes instead of the 10")
    parser.add_argument("--isa", default="auto", help="cap the kernels' vector ISA (e.g. avx2), as on a CPU "
                        "without AVX-512")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    shapes = args.shapes or (QUICK if args.quick else SHAPES)
    if args.child is not None:
        print(json.dumps(child(args.child, args.dtypes, shapes)))
        return
    rows: list[dict[str, Any]] = []
    for threads in args.threads:
        with tempfile.TemporaryDirectory(prefix="tuneforge-gemm-bench-") as cache:
            env = {**os.environ, "TUNEFORGE_CACHE_DIR": cache, "OPENBLAS_NUM_THREADS": str(threads),
                   "TUNEFORGE_KERNEL_THREADS": str(threads), "OMP_NUM_THREADS": str(threads),
                   "TUNEFORGE_KERNEL_ISA": args.isa}
            command = [sys.executable, __file__, "--child", str(threads), "--dtypes", *args.dtypes,
                       "--shapes", *("x".join(map(str, shape)) for shape in shapes)]
            proc = subprocess.run(command, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(proc.stderr)
            rows += json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"{'dtype':8} {'shape':>16} {'thr':>3} {'numpy':>8} {'tuneforge':>9} {'ratio':>6} {'%peak':>6} "
          f"{'%roof':>6} {'ceiling':>7} {'cold s':>6}  winner")
    for r in rows:
        ratio = r["ratio"]
        roof = r["attainable_gflops"]
        print(f"{r['dtype']:8} {r['shape']:>16} {r['threads']:>3} {r['numpy_gflops']:8.1f} "
              f"{r['tuneforge_gflops']:9.1f} {ratio:5.2f}x {100 * r['tuneforge_gflops'] / r['peak_gflops']:5.0f}% "
              f"{100 * r['tuneforge_gflops'] / roof:5.0f}% {roof / r['numpy_gflops']:6.2f}x "
              f"{r['cold_tune_s']:6.2f}  {r['winner']} {r['winner_info']}")
    print("%roof: share of the roofline (the lower of the FMA peak and reading A, B and C once at the read "
          "bandwidth measured for their size); ceiling: the roofline over numpy, the most any kernel could gain")
    peaks = sorted({(r["dtype"], r["threads"], round(r["peak_gflops"], 1)) for r in rows})
    print("measured FMA peak (GFLOP/s): " + ", ".join(f"{d} {t}T {p}" for d, t, p in peaks))
    name = "gemm" if args.isa == "auto" else f"gemm-{args.isa}"
    write_results(name if shapes == SHAPES else f"{name}-subset", rows)


if __name__ == "__main__":
    main()
