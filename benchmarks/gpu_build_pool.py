"""The GPU GEMM's Triton builds in a cold build pool, by start method, against the same pool warmed first.

    python benchmarks/gpu_build_pool.py [--shape 4096x4096x4096] [--start-methods fork forkserver spawn]
                                        [--cuda] [--workers N] [--repeats 2]

A cold GPU selection on an H100 host (GPU_RESULTS.md, run 10) spent 3.8-5.1 s in its build phase, against
0.65-1.5 s once `tuneforge.prepare("cuda")` had warmed the pool: ~3 s that a worker's first Triton compile
(0.6-0.7 s more than its next ones on the 2-core CI-like VM) does not explain. This measures, for each start
method, in a fresh process per figure (torch imported first, as in a program; `--cuda`: a CUDA context and a
tensor on the GPU too, as a cold selection's caller has, which a forked worker then inherits):

- cold: the default space's builds for sm_90 (`GpuTarget`, no GPU needed) submitted to a new pool;
- warmed: the same in another new pool whose workers each made their first Triton compile first (untimed);

and prints the wall times, their ratio, and the builds' own seconds in the workers (the longest and the median):
a cold wall far above the warmed one with the same in-worker seconds is time spent starting workers.
Empty caches every time (TUNEFORGE_CACHE_DIR, TRITON_CACHE_DIR). Writes benchmarks/results/gpu_build_pool.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import write_results
from gpu_common import parse_shape

CHILD = r"""
import json, os, sys, time
from concurrent.futures import wait
task = json.loads(sys.argv[1])
import torch
if task["cuda"]:
    torch.ones(8, device="cuda").sum().item()  # a context, as the caller of a cold GPU selection has
from tuneforge.compile.pool import BuildPool
from tuneforge.compile.triton_env import GpuTarget
from tuneforge.compile.triton_warmup import warm_build_pool
from tuneforge.kernels.gemm_gpu.op import gpu_choices
from tuneforge.kernels.gemm_gpu.render import Epilogue
from tuneforge.kernels.gemm_gpu.space import H100_SXM

m, n, k = task["shape"]
target = GpuTarget("cuda", 90, 32)
requests = [b for c in gpu_choices(m, n, k, "float16", Epilogue(), H100_SXM)[1:]
            for b in c.triton_builds(target=target).values()]
with BuildPool(task["workers"], start_method=task["start_method"]) as pool:
    if task["warmed"]:
        wait(warm_build_pool(target, pool))
    started = time.perf_counter()
    results = [f.result() for f in [pool.submit(r, label=str(i)) for i, r in enumerate(requests)]]
    wall = time.perf_counter() - started
print(json.dumps({"wall_s": wall, "builds": len(requests), "in_worker_s": [r.seconds for r in results]}))
"""


def measure(shape: tuple[int, int, int], start_method: str, warmed: bool, cuda: bool, workers: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tuneforge-pool-bench-") as tmp:
        env = {**os.environ, "TUNEFORGE_CACHE_DIR": f"{tmp}/tuneforge", "TRITON_CACHE_DIR": f"{tmp}/triton"}
        task = {"shape": shape, "start_method": start_method, "warmed": warmed, "cuda": cuda, "workers": workers}
        done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(task)], env=env, capture_output=True,
                              text=True, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"the {start_method} {'warmed' if warmed else 'cold'} run failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--shape", type=parse_shape, default=(4096, 4096, 4096))
    parser.add_argument("--start-methods", nargs="+", choices=["fork", "forkserver", "spawn"], default=["fork"])
    parser.add_argument("--cuda", action="store_true", help="make a CUDA context before the builds (needs a GPU)")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=2, help="processes per figure (the median is shown)")
    args = parser.parse_args()
    try:
        import triton  # noqa: F401
    except ImportError:
        raise SystemExit("gpu_build_pool.py needs triton (pip install triton)") from None

    rows = []
    for method in args.start_methods:
        runs = {warmed: [measure(args.shape, method, warmed, args.cuda, args.workers) for _ in range(args.repeats)]
                for warmed in (False, True)}
        cold, warm = (statistics.median(r["wall_s"] for r in runs[w]) for w in (False, True))
        seconds = {w: [s for r in runs[w] for s in r["in_worker_s"]] for w in (False, True)}
        rows.append({"start_method": method, "builds": runs[False][0]["builds"], "cold_s": cold, "warmed_s": warm,
                     "cold_over_warmed": cold / warm,
                     "cold_build_max_s": max(seconds[False]), "cold_build_median_s": statistics.median(seconds[False]),
                     "warmed_build_max_s": max(seconds[True]),
                     "warmed_build_median_s": statistics.median(seconds[True]),
                     "cold_walls": [r["wall_s"] for r in runs[False]],
                     "warmed_walls": [r["wall_s"] for r in runs[True]]})
    shape = "x".join(map(str, args.shape))
    print(f"GPU GEMM {shape} float16, sm_90 builds on {args.workers} workers, CUDA context in the caller: {args.cuda}; "
          f"median of {args.repeats} processes")
    print(f"{'start method':<12} {'builds':>6} {'cold s':>7} {'warmed s':>8} {'cold/warmed':>11} "
          f"{'cold build max/med s':>20} {'warmed build max/med s':>22}")
    for r in rows:
        print(f"{r['start_method']:<12} {r['builds']:>6} {r['cold_s']:>7.2f} {r['warmed_s']:>8.2f} "
              f"{r['cold_over_warmed']:>11.2f} {r['cold_build_max_s']:>11.2f} / {r['cold_build_median_s']:<6.2f} "
              f"{r['warmed_build_max_s']:>13.2f} / {r['warmed_build_median_s']:<6.2f}")
    payload = {"shape": args.shape, "cuda": args.cuda, "workers": args.workers, "rows": rows}
    write_results("gpu_build_pool", payload)
    if os.environ.get("OUT"):  # the device tool brings $OUT back
        write_results("gpu_build_pool", payload, Path(os.environ["OUT"], "gpu_build_pool.json"))


if __name__ == "__main__":
    main()
