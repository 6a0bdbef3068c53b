"""What tuneforge.gemm adds per call once a layout is tuned, against calling its winner directly.

    python benchmarks/gemm_dispatch.py

For a few small float32 shapes: the time per call of numpy.matmul(a, b, out=c), of the tuned
layout's prepared call (the winner with sizes, strides and blocking bound, as gemm's Python path
keeps it), and of tuneforge.gemm(a, b, c) through the C fast path; the overhead is the last minus
the winner's direct call. Writes benchmarks/results/gemm_dispatch.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import timeit
from typing import Any

from blas_env import child_env
from common import precompile_package, write_results

SHAPES = [(8, 8, 8), (32, 32, 32), (64, 64, 64)]


def per_call_us(fn: Any, number: int = 20000) -> float:
    return min(timeit.repeat(fn, number=number, repeat=7)) / number * 1e6


def child() -> dict[str, Any]:
    from blas_env import blas_report

    rows = [measure(m, n, k) for m, n, k in SHAPES]
    return {"rows": rows, "blas": blas_report()}


def measure(m: int, n: int, k: int) -> dict[str, Any]:
    import numpy as np

    import tuneforge
    from tuneforge.kernels.gemm import dispatch, op

    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    c = np.empty((m, n), dtype=np.float32)
    tuneforge.gemm(a, b, c)  # tunes
    tuneforge.gemm(a, b, c)  # a repeated layout: the fast path is loaded, then the layout registered
    fast = dispatch.wait()
    tuneforge.gemm(a, b, c)
    prepared = next(p for key, p in op._dispatch.items() if key[3] == a.shape and key[4] == b.shape)
    direct = prepared.call
    return {
        "shape": f"{m}x{n}x{k}", "winner": dispatch_kind(prepared.kind),
        "numpy_us": per_call_us(lambda: np.matmul(a, b, out=c)),
        "winner_direct_us": per_call_us(lambda: direct(1.0, 0.0, a, b, c, None)),
        "tuneforge_us": per_call_us(lambda: tuneforge.gemm(a, b, c)),
        "python_path_us": per_call_us(lambda: op._gemm_python(a, b, c, 1.0, 0.0, None, "default")),
        "c_fast_path": fast is not None and op._route is fast.gemm,
    }


def dispatch_kind(kind: int) -> str:
    from tuneforge.kernels.gemm import dispatch

    return {dispatch.KERNEL: "kernel", dispatch.LIBRARY: "numpy", dispatch.CALL: "python call"}[kind]


def main() -> None:
    if "--child" in sys.argv:
        print(json.dumps(child()))
        return
    precompile_package()
    with tempfile.TemporaryDirectory(prefix="tuneforge-dispatch-bench-") as cache:
        # numpy as a user's machine runs it: OpenBLAS's steering variables unset (blas_env)
        env = child_env(threads=1, extra={"TUNEFORGE_CACHE_DIR": cache})
        proc = subprocess.run([sys.executable, __file__, "--child"], env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(proc.stderr)
        answer = json.loads(proc.stdout.strip().splitlines()[-1])
        rows = answer["rows"]
    print(answer["blas"])
    print(f"{'shape':>10} {'winner':>8} {'numpy us':>9} {'winner us':>10} {'gemm us':>8} {'overhead':>9} "
          f"{'python path':>12}")
    for r in rows:
        overhead = r["tuneforge_us"] - r["winner_direct_us"]
        print(f"{r['shape']:>10} {r['winner']:>8} {r['numpy_us']:9.2f} {r['winner_direct_us']:10.2f} "
              f"{r['tuneforge_us']:8.2f} {overhead * 1000:7.0f}ns {r['python_path_us']:10.2f}us"
              + ("" if r["c_fast_path"] else "  (no C fast path)"))
    write_results("gemm_dispatch", rows)


if __name__ == "__main__":
    main()
