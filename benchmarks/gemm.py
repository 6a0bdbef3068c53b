"""GEMM benchmark: tuned tuneforge.gemm vs numpy (OpenBLAS) and torch.matmul, measured in the same run.

    python benchmarks/gemm.py [--quick | --shapes 1x4096x4096 ...] [--threads 1 2] [--dtypes float32 float64]
                              [--isa avx2] [--no-torch]

For each dtype, thread count and shape: GFLOP/s of numpy.matmul, of torch.matmul (when torch imports) and
of the tuned tuneforge kernel (first call tunes the `default` space cold; the figure is the steady state
after it), tuneforge's ratio to each and to the better of the two ("best ref"; each the median of the
ratios of 9 interleaved rounds), the share of the machine's peak (measured here with an FMA-throughput
microbenchmark) and of the roofline (the peak, or reading the operands once at the read bandwidth measured
here for their size, whichever is lower: GEMV is bound by memory), the cold tuning time, the winning
configuration and the verdict of the target that applies to the shape (issue 13: large, small, skinny,
odd; every shape >= 0.98x; cold tuning <= 3 s).
Each thread count runs in its own process with OPENBLAS_NUM_THREADS / TUNEFORGE_KERNEL_THREADS /
torch's threads set, so every library uses the same cores, and without OPENBLAS_CORETYPE/L2_SIZE
(blas_env.py): OpenBLAS runs the kernels it picks on a user's machine; the table's header says which.
Prints a table and writes benchmarks/results/gemm.json; with --isa avx2, kernels are capped at AVX2 (a CPU
without AVX-512), and so are the references (OpenBLAS forced to Haswell, oneDNN/MKL to AVX2), and
results go to gemm-avx2.json; a run of other shapes (--quick, --shapes) writes gemm[-avx2]-subset.json.
float64 skips 4096^3 unless --shapes names it (minutes per thread count on 2 cores).
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

from blas_env import blas_report, child_env, load_note
from cli_args import three_sizes
from common import round_verdict, write_results
from roofline import attainable_gflops, measure_peak, measure_read_bandwidth, operand_bytes

Shape = tuple[int, int, int]
SMALL: list[Shape] = [(64, 64, 64), (128, 128, 128)]
LARGE: list[Shape] = [(512, 512, 512), (1024, 1024, 1024), (2048, 2048, 2048), (4096, 4096, 4096)]
SKINNY: list[Shape] = [(32, 4096, 4096), (4096, 32, 4096), (4096, 4096, 32)]
ODD: list[Shape] = [(96, 1000, 300), (513, 257, 129), (17, 2048, 64), (3000, 5, 700)]
OTHER: list[Shape] = [(256, 256, 256), (1, 4096, 4096)]  # no target of their own: the 0.98x floor only
SHAPES = SMALL + LARGE + SKINNY + ODD + OTHER
QUICK: list[Shape] = [(64, 64, 64), (512, 512, 512), (32, 4096, 4096), (513, 257, 129), (1, 4096, 4096)]
FLOAT64_MAX_WORK = 2048**3  # m*n*k above which float64 is left out of a default run

FLOOR = 0.98  # never slower than this against the best reference, on any shape
# Least ratio to the best reference per shape category, with the kernels at their widest ISA and capped at AVX2.
TARGETS = {"auto": {"large": 1.05, "small": 1.2, "skinny": 1.2, "odd": 1.2, "other": FLOOR},
           "avx2": {"large": 1.0, "small": 1.15, "skinny": 1.15, "odd": FLOOR, "other": FLOOR}}
COLD_TUNE_S = 3.0
ROUNDS, ROUND_S = 9, 0.15  # interleaved rounds of each side's steady timing, and each one's length


def category(shape: Shape) -> str:
    """Which of issue 13's targets a shape falls under."""
    if max(shape) <= 128:
        return "small"
    if shape[0] == shape[1] == shape[2] and 512 <= shape[0] <= 4096:
        return "large"
    return "skinny" if shape in SKINNY else "odd" if shape in ODD else "other"


def verdict(shape: str, ratio_best_ref: float, cold_tune_s: float, isa: str,
            round_ratios: list[float] | None = None) -> dict[str, Any]:
    """The target a row falls under and whether it meets it: its ratio to the better reference, and the
    cold tuning time; with the rounds' ratios, whether a miss is beyond the rounds' noise (common.round_verdict)."""
    kind = category(parse_shape(shape))
    need = max(FLOOR, TARGETS.get(isa, TARGETS["auto"])[kind])
    ratio_verdict = round_verdict(round_ratios, need) if round_ratios else "ok" if ratio_best_ref >= need else "FAIL"
    return {"category": kind, "target_ratio": need, "ratio_pass": ratio_best_ref >= need,
            "ratio_verdict": ratio_verdict, "cold_pass": cold_tune_s <= COLD_TUNE_S}


def default_shapes(dtype: str, shapes: list[Shape]) -> list[Shape]:
    return [s for s in shapes if dtype != "float64" or s[0] * s[1] * s[2] <= FLOAT64_MAX_WORK]


def parse_shape(text: str) -> tuple[int, int, int]:
    return three_sizes(text, "x", "M, N and K", "512x512x512")


def add_case_arguments(parser: argparse.ArgumentParser) -> None:
    """--shapes and --dtypes as the GEMM benchmarks that run named cases take them."""
    parser.add_argument("--shapes", nargs="+", type=parse_shape, help="MxNxK shapes (with --dtypes, float32 "
                        "by default) instead of the default cases")
    parser.add_argument("--dtypes", nargs="+", choices=["float32", "float64"],
                        help="with --shapes: their dtypes; without: the default cases of these dtypes")


def steady_gflops(fn: Any, flops: int, budget_s: float = 1.0) -> float:
    from tuneforge.tune.quiet import settle

    settle(0.2)  # the other side's idle threads stop spinning (OpenBLAS's for 0.1-0.15 s after a call)
    fn()
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < 5 or (time.perf_counter() < deadline and len(times) < 2000):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return flops / statistics.median(times) / 1e9


def torch_matmul(a: Any, b: Any) -> Any:
    """torch.matmul on the same arrays into a tensor of its own, or None when torch does not import."""
    try:
        import torch
    except ImportError:
        return None
    ta, tb, tout = torch.from_numpy(a), torch.from_numpy(b), torch.from_numpy(a @ b)

    def call() -> None:
        torch.matmul(ta, tb, out=tout)
    return call


def measure(m: int, n: int, k: int, dtype: str, threads: int, peak: float, with_torch: bool) -> dict[str, Any]:
    import numpy as np

    import tuneforge
    from tuneforge.kernels.gemm import dispatch
    from tuneforge.kernels.gemm.op import op_name
    from tuneforge.store.default import default_records
    from tuneforge.tune.select import selection_key
    from tuneforge.tune.specs import TensorSpec

    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    out = np.empty((m, n), dtype=dtype)
    started = time.perf_counter()
    tuneforge.gemm(a, b, out)
    cold = time.perf_counter() - started
    tuneforge.gemm(a, b, out)  # a repeated layout: the C fast path is loaded (once) and takes it
    dispatch.wait()
    expected = a @ b
    error = float(np.abs(out - expected).max() / max(1.0, float(np.abs(expected).max())))
    flops = 2 * m * n * k
    traffic = operand_bytes(m, n, k, a.itemsize)
    torch_call = torch_matmul(a, b) if with_torch else None
    ours: list[float] = []
    theirs: list[float] = []
    torchs: list[float] = []
    bandwidths: list[float] = []

    def library() -> None:
        np.matmul(a, b, out=out)

    def tuned() -> None:
        tuneforge.gemm(a, b, out)

    # Interleaved short rounds, compared pairwise: the host's memory bandwidth shifts by up to 1.5x
    # for seconds at a time, and a ratio of medians taken in different phases can say 0.8x or 1.5x.
    # The read bandwidth is measured in every round too, so that the roofline sees the same phases.
    # Nine rounds of 0.15 s rather than five of 0.25: on a host whose FMA throughput itself moved 150-180
    # GFLOP/s from one second to the next, a numpy pick (the same call on both sides) read 0.77x in five.
    # The sides take turns going first, so that neither always runs right after the other (numpy always went
    # first). A numpy pick, the same call on both sides, still reads 0.95-1.08x against itself on odd shapes here:
    # what the host's noise leaves of a 9-round ratio.
    sides: list[tuple[list[float], Any]] = [(theirs, library), (ours, tuned)]
    if torch_call is not None:
        sides.insert(1, (torchs, torch_call))
    for number in range(ROUNDS):
        bandwidths.append(measure_read_bandwidth(traffic, threads, budget_s=0.1))
        for figures, call in sides if number % 2 == 0 else reversed(sides):
            figures.append(steady_gflops(call, flops, ROUND_S))
    best_refs = [max(pair) for pair in zip(theirs, torchs, strict=True)] if torchs else theirs
    bandwidth = statistics.median(bandwidths)
    round_ratios = [x / y for x, y in zip(ours, best_refs, strict=True)]  # tuneforge over the better reference
    key = selection_key(op_name(0.0, None), [TensorSpec.of(a), TensorSpec.of(b), 1.0, 0.0, None,
                                             TensorSpec.of(out)])
    best = default_records().best(key)
    return {"dtype": dtype, "shape": f"{m}x{n}x{k}", "threads": threads,
            "numpy_gflops": statistics.median(theirs), "tuneforge_gflops": statistics.median(ours),
            "torch_gflops": statistics.median(torchs) if torchs else None,
            "ratio": ratio(ours, theirs), "ratio_torch": ratio(ours, torchs) if torchs else None,
            "ratio_best_ref": statistics.median(round_ratios), "round_ratios": round_ratios,
            "best_ref": "numpy" if not torchs or statistics.median(theirs) >= statistics.median(torchs)
            else "torch",
            "peak_gflops": peak, "read_gbs": bandwidth,
            "attainable_gflops": attainable_gflops(flops, traffic, peak, bandwidth),
            "cold_tune_s": cold, "max_rel_error": error,
            "winner": best.choice_name if best else "?",
            "winner_info": ", ".join(f"{k}={v}" for k, v in (best.params if best else {}).items()
                                     if k not in ("T", "NAME"))}


def ratio(ours: list[float], theirs: list[float]) -> float:
    """The median of the per-round ratios."""
    return statistics.median(x / y for x, y in zip(ours, theirs, strict=True))


def child(threads: int, dtypes: list[str], shapes: list[Shape], with_torch: bool,
          cut_float64: bool) -> list[dict[str, Any]]:
    if with_torch:
        try:
            import torch
            torch.set_num_threads(threads)
        except ImportError:
            with_torch = False
    report = blas_report(with_torch=with_torch)
    print(report, file=sys.stderr, flush=True)
    rows = []
    for dtype in dtypes:
        peak = measure_peak(dtype, threads)
        for m, n, k in default_shapes(dtype, shapes) if cut_float64 else shapes:
            rows.append({**measure(m, n, k, dtype, threads, peak, with_torch), "blas": report})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"])
    parser.add_argument("--quick", action="store_true", help=f"{len(QUICK)} shapes instead of {len(SHAPES)}")
    parser.add_argument("--shapes", nargs="+", type=parse_shape, help=f"MxNxK shapes instead of the {len(SHAPES)}")
    parser.add_argument("--isa", default="auto", help="cap the kernels' vector ISA (e.g. avx2), as on a CPU "
                        "without AVX-512; with avx2 the references are capped at AVX2 too")
    parser.add_argument("--no-torch", action="store_true", help="leave torch.matmul out")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    shapes = args.shapes or (QUICK if args.quick else SHAPES)
    if args.child is not None:
        # float64's cut applies to the default sets only: a shape named in --shapes is measured
        print(json.dumps(child(args.child, args.dtypes, shapes, not args.no_torch, args.shapes is None)))
        return
    rows: list[dict[str, Any]] = []
    load_before = load_note()
    for threads in args.threads:
        with tempfile.TemporaryDirectory(prefix="tuneforge-gemm-bench-") as cache:
            env = child_env(threads, args.isa, {"TUNEFORGE_CACHE_DIR": cache})
            command = [sys.executable, __file__, "--child", str(threads), "--dtypes", *args.dtypes,
                       "--isa", args.isa, *(["--no-torch"] if args.no_torch else []),
                       *([] if args.shapes else ["--quick"] if args.quick else []),
                       *(["--shapes", *(shape_text(s) for s in args.shapes)] if args.shapes else [])]
            proc = subprocess.run(command, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(proc.stderr)
            rows += json.loads(proc.stdout.strip().splitlines()[-1])
    for r in rows:
        r.update(verdict(r["shape"], r["ratio_best_ref"], r["cold_tune_s"], args.isa, r.get("round_ratios")))
    print(format_table(rows, args.isa))
    print(f"before: {load_before}; after: {load_note()}")
    name = "gemm" if args.isa == "auto" else f"gemm-{args.isa}"
    write_results(name if shapes == SHAPES else f"{name}-subset", rows)


def shape_text(shape: Shape) -> str:
    return "x".join(map(str, shape))


def format_table(rows: list[dict[str, Any]], isa: str) -> str:
    lines = []
    for report in dict.fromkeys(r["blas"] for r in rows):
        threads = sorted({r["threads"] for r in rows if r["blas"] == report})
        lines.append(f"{'/'.join(map(str, threads))}T {report}")
    lines.append(f"{'dtype':8} {'shape':>14} {'thr':>3} {'numpy':>7} {'torch':>7} {'tunefrg':>7} {'/numpy':>6} "
                 f"{'/torch':>6} {'/best':>6} {'%peak':>5} {'%roof':>5} {'cold s':>6}  {'target':15}  winner")
    for r in rows:
        torch_gflops = "-" if r["torch_gflops"] is None else f"{r['torch_gflops']:.1f}"
        vs_torch = "-" if r["ratio_torch"] is None else f"{r['ratio_torch']:.2f}x"
        target = (f"{r['category']}>={r['target_ratio']:.2f} {r['ratio_verdict']}"
                  f"{'' if r['cold_pass'] else ' COLD'}")
        lines.append(
            f"{r['dtype']:8} {r['shape']:>14} {r['threads']:>3} {r['numpy_gflops']:7.1f} {torch_gflops:>7} "
            f"{r['tuneforge_gflops']:7.1f} {r['ratio']:5.2f}x {vs_torch:>6} {r['ratio_best_ref']:5.2f}x "
            f"{100 * r['tuneforge_gflops'] / r['peak_gflops']:4.0f}% "
            f"{100 * r['tuneforge_gflops'] / r['attainable_gflops']:4.0f}% {r['cold_tune_s']:6.2f}  {target:15}  "
            f"{r['winner']} {r['winner_info']}")
    lines.append("/best: tuneforge over the better of numpy and torch (per round); target: the shape's category "
                 f"and the least /best it allows ({'AVX2 cap' if isa == 'avx2' else 'issue 13'}), FAIL below it "
                 "(fail?: the median round missed it, within the rounds' noise: a 1-in-32 chance or more), "
                 f"COLD where cold tuning took over {COLD_TUNE_S:.0f} s; %roof: share of the roofline (the lower "
                 "of the FMA peak and reading A, B and C once at the read bandwidth measured for their size)")
    peaks = sorted({(r["dtype"], r["threads"], round(r["peak_gflops"], 1)) for r in rows})
    lines.append("measured FMA peak (GFLOP/s): " + ", ".join(f"{d} {t}T {p}" for d, t, p in peaks))
    passed = sum(r["ratio_pass"] and r["cold_pass"] for r in rows)
    lines.append(f"targets met on {passed} of {len(rows)} rows")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
