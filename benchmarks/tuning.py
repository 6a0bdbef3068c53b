"""Tuning benchmark: cold tuning of the shipped matmul, warm start of a fresh process, @autotune dispatch.

    python benchmarks/tuning.py [--shape 512x512x512] [--repeats 5]

Prints a table and writes benchmarks/results/tuning.json. References measured in the same run:
the bare interpreter start (for the warm start) and a direct call of the chosen kernel (dispatch).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time

from blas_env import child_env
from common import precompile_package, write_results

WARM_CHILD = """
import time
t0 = time.perf_counter()
import numpy as np
t1 = time.perf_counter()
import tuneforge
from tuneforge.kernels.matmul import matmul
a = np.ones(({m}, {k}), dtype=np.float32); b = np.ones(({k}, {n}), dtype=np.float32)
c = matmul(a, b)
t2 = time.perf_counter()
import json
print(json.dumps({{"numpy_import": t1 - t0, "first_result_after_numpy": t2 - t1}}))
"""

COLD_CHILD = """
import json, time
import numpy as np
from tuneforge import config
from tuneforge.kernels import matmul as family
from tuneforge.tune.select import select_detailed
from tuneforge.tune.specs import TensorSpec
specs = [TensorSpec.contiguous(({m}, {k})), TensorSpec.contiguous(({k}, {n}))]
t = time.perf_counter()
s = select_detailed("matmul", family.choices("float32"), specs, out=TensorSpec.contiguous(({m}, {n})))
wall = time.perf_counter() - t
r = s.report
print(json.dumps({{"wall": wall, "build": r.build_s, "verify": r.verify_s, "bench": r.bench_s,
                  "winner": s.choice.name, "info": s.choice.info}}))
"""


def child(code: str, env: dict[str, str]) -> dict[str, object]:
    # numpy (a candidate) as a user's machine runs it: OpenBLAS's steering variables unset (blas_env)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         env=child_env(extra=env), check=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def dispatch_overhead(calls: int = 200_000) -> tuple[float, float]:
    """ns per call through @autotune's dict dispatch vs calling the chosen function directly."""
    import tuneforge
    from tuneforge import config

    def kernel(x: int, *, scale: int) -> int:
        return x * scale

    tuned = tuneforge.autotune(configs=[{"scale": 1}, {"scale": 2}], key=["x"])(kernel)
    with config.patch(autotune_bench_time_s=0.001, autotune_warmup_s=0.0):
        tuned(3)
    chosen = tuned.cache[(3,)]
    best_direct, best_tuned = float("inf"), float("inf")
    for _ in range(5):
        t = time.perf_counter_ns()
        for _ in range(calls):
            chosen(3)
        best_direct = min(best_direct, (time.perf_counter_ns() - t) / calls)
        t = time.perf_counter_ns()
        for _ in range(calls):
            tuned(3)
        best_tuned = min(best_tuned, (time.perf_counter_ns() - t) / calls)
    return best_tuned, best_direct


def main() -> None:
    precompile_package()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="512x512x512")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    m, n, k = (int(x) for x in args.shape.split("x"))
    cold, warm, bare = [], [], []
    for _ in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="tuneforge-bench-") as tmp:
            env = {"TUNEFORGE_CACHE_DIR": tmp}
            child("from tuneforge.compile.toolchain import default_toolchain; default_toolchain()\n"
                  "import json; print(json.dumps({}))", env)  # the once-per-machine compiler probe
            cold.append(child(COLD_CHILD.format(m=m, n=n, k=k), env))
            started = time.perf_counter()
            warm_result = child(WARM_CHILD.format(m=m, n=n, k=k), env)
            warm_result["process"] = time.perf_counter() - started
            warm.append(warm_result)
        started = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import numpy"], check=True)
        bare.append(time.perf_counter() - started)

    def med(rows: list[dict[str, object]], field: str) -> float:
        return statistics.median(float(str(r[field])) for r in rows) * 1e3

    os.environ["TUNEFORGE_CACHE_DIR"] = tempfile.mkdtemp(prefix="tuneforge-bench-")
    tuned_ns, direct_ns = dispatch_overhead()
    results = {
        "shape": args.shape, "repeats": args.repeats,
        "cold_wall_ms": med(cold, "wall"), "cold_build_ms": med(cold, "build"),
        "cold_verify_ms": med(cold, "verify"), "cold_bench_ms": med(cold, "bench"),
        "winners": sorted({f"{r['winner']} ({r['info']})" for r in cold}),
        "warm_first_result_ms": med(warm, "first_result_after_numpy"),
        "warm_process_ms": med(warm, "process"), "bare_python_numpy_process_ms": statistics.median(bare) * 1e3,
        "dispatch_ns": tuned_ns, "direct_call_ns": direct_ns,
    }
    print(f"matmul {args.shape} float32, median of {args.repeats} fresh processes")
    print(f"{'figure':52} {'value':>10}  {'reference':>10}  target")
    rows = [
        ("cold tuning wall (ms)", results["cold_wall_ms"], None, ""),
        ("  build: compile 4 templates in parallel (ms)", results["cold_build_ms"], None, ""),
        ("  verify against numpy (ms)", results["cold_verify_ms"], None, ""),
        ("  benchmark 5 choices (ms)", results["cold_bench_ms"], None, ""),
        ("warm: import tuneforge -> first result (ms)", results["warm_first_result_ms"], None, "<= 150 ms"),
        ("warm: whole process vs bare python+numpy (ms)", results["warm_process_ms"],
         results["bare_python_numpy_process_ms"], ""),
        ("@autotune dispatch per call (ns)", results["dispatch_ns"], results["direct_call_ns"],
         "<= 2000 ns over direct"),
    ]
    for name, value, ref, target in rows:
        ref_text = f"{ref:10.1f}" if ref is not None else " " * 10
        print(f"{name:52} {value:10.1f}  {ref_text}  {target}")
    print(f"dispatch overhead over a direct call: {results['dispatch_ns'] - results['direct_call_ns']:.0f} ns")
    print("winners: " + "; ".join(results["winners"]))
    write_results("tuning", results)


if __name__ == "__main__":
    main()
