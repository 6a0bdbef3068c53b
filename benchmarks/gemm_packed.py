"""A constant B packed once (tuneforge.pack_b) against the same product packed on every call, numpy and torch.

    python benchmarks/gemm_packed.py [--threads 2] [--shapes 32x1024x1024 ...] [--dtypes float32 float64]

For each shape and each B layout -- "rows" (B row-major) and "weight" (B = W.T for a row-major W[N,K], the layout
of torch.nn.Linear's weight) -- steady GFLOP/s of numpy.matmul, torch.matmul (when torch imports), tuneforge.gemm
(B as it is) and tuneforge.gemm with B packed once, in 5 interleaved rounds (each ratio is the median of the
per-round ratios); the packed selection's cold tuning time and winner. Runs in a child process without
OPENBLAS_CORETYPE/L2_SIZE (blas_env.py), every library on the same thread count; writes
benchmarks/results/gemm_packed.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from blas_env import blas_report, child_env
from common import write_results
from gemm import Shape, parse_shape, ratio, steady_gflops, torch_matmul

SHAPES: list[Shape] = [(1, 4096, 4096), (8, 1024, 1024), (32, 1024, 1024), (32, 4096, 4096), (64, 4096, 1024),
                       (128, 1024, 1024), (512, 1024, 1024)]
LAYOUTS = ("rows", "weight")
ROUNDS = 5


def measure(m: int, n: int, k: int, dtype: str, layout: str, with_torch: bool) -> dict[str, Any]:
    import numpy as np

    import tuneforge
    from tuneforge.store.default import default_records
    from tuneforge.tune.select import selection_key

    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype) if layout == "rows" else \
        rng.standard_normal((n, k)).astype(dtype).T
    out = np.empty((m, n), dtype=dtype)
    tuneforge.gemm(a, b, out)  # B as it is: tuned first, so the packed selection's cold time has no builds
    started = time.perf_counter()
    packed = tuneforge.pack_b(b)
    tuneforge.gemm(a, packed, out)
    cold = time.perf_counter() - started
    error = float(np.abs(out - a @ b).max() / max(1.0, float(np.abs(a @ b).max())))
    flops = 2 * m * n * k
    calls = {"numpy": lambda: np.matmul(a, b, out=out), "tuneforge": lambda: tuneforge.gemm(a, b, out),
             "packed": lambda: tuneforge.gemm(a, packed, out)}
    torch_call = torch_matmul(a, b) if with_torch else None
    if torch_call is not None:
        calls["torch"] = torch_call
    rates: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(ROUNDS):
        for name, call in calls.items():
            rates[name].append(steady_gflops(call, flops, 0.25))
    refs = [max(pair) for pair in zip(rates["numpy"], rates.get("torch", rates["numpy"]), strict=True)]
    key = selection_key("gemm_packed", [a, packed.matrix, 1.0, 0.0, None, out])
    best = default_records().best(key)
    return {"shape": f"{m}x{n}x{k}", "dtype": dtype, "layout": layout,
            **{f"{name}_gflops": statistics.median(values) for name, values in rates.items()},
            "packed_over_unpacked": ratio(rates["packed"], rates["tuneforge"]),
            "packed_over_best_ref": ratio(rates["packed"], refs),
            "unpacked_over_best_ref": ratio(rates["tuneforge"], refs),
            "cold_s": cold, "max_rel_error": error, "winner": best.choice_name if best else "?",
            "winner_info": ", ".join(f"{k}={v}" for k, v in (best.params if best else {}).items()
                                     if k not in ("T", "NAME")), "packed_mb": packed.packed_bytes() / 2**20}


def child(threads: int, dtypes: list[str], shapes: list[Shape]) -> list[dict[str, Any]]:
    try:
        import torch

        torch.set_num_threads(threads)
        with_torch = True
    except ImportError:
        with_torch = False
    print(blas_report(with_torch=with_torch), file=sys.stderr, flush=True)
    rows = []
    for dtype in dtypes:
        for m, n, k in shapes:
            for layout in LAYOUTS:
                rows.append(measure(m, n, k, dtype, layout, with_torch))
                print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtypes", nargs="+", default=["float32"], choices=["float32", "float64"])
    parser.add_argument("--shapes", nargs="+", type=parse_shape, default=SHAPES)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.threads, args.dtypes, args.shapes)))
        return
    with tempfile.TemporaryDirectory(prefix="tuneforge-packed-bench-") as cache:
        proc = subprocess.run([sys.executable, __file__, "--child", "--threads", str(args.threads), "--dtypes",
                               *args.dtypes, "--shapes", *("x".join(map(str, s)) for s in args.shapes)],
                              env=child_env(args.threads, "auto", {"TUNEFORGE_CACHE_DIR": cache}),
                              capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"the benchmark child failed:\n{proc.stderr[-3000:]}")
    rows = json.loads(proc.stdout.strip().splitlines()[-1])
    print(proc.stderr.splitlines()[0])
    print(f"{'dtype':8} {'shape':>14} {'B':6} {'numpy':>7} {'torch':>7} {'tunefrg':>7} {'packed':>7} "
          f"{'/unpkd':>6} {'/best':>6} {'cold s':>6}  winner (packed)")
    for r in rows:
        torch_rate = f"{r['torch_gflops']:7.1f}" if "torch_gflops" in r else f"{'-':>7}"
        print(f"{r['dtype']:8} {r['shape']:>14} {r['layout']:6} {r['numpy_gflops']:7.1f} {torch_rate} "
              f"{r['tuneforge_gflops']:7.1f} {r['packed_gflops']:7.1f} {r['packed_over_unpacked']:5.2f}x "
              f"{r['packed_over_best_ref']:5.2f}x {r['cold_s']:6.2f}  {r['winner']} {r['winner_info']}")
    print("GFLOP/s, steady state; /unpkd: packed over tuneforge.gemm with B as it is; /best: packed over the "
          "better of numpy and torch (medians of per-round ratios); cold: pack_b plus the packed selection's tuning")
    write_results("gemm_packed", rows)


if __name__ == "__main__":
    main()
