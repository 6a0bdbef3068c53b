"""Parallel builds and isolated benchmarking, each against its in-process/serial reference in the same run.

    python benchmarks/isolation.py [--choices 16] [--repeats 3]

1. Wall time to build N distinct matmul template choices serially (one worker) vs with the build
   pool (compile_threads workers).
2. Wall time of the trials (verify + benchmark) of the same built choices in the isolated worker vs
   in this process; the worker is warm (started by a previous selection), as in a tuning session.
Prints a table and writes benchmarks/results/isolation.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from common import write_results


def build_wall(n: int, workers: int) -> float:
    from tuneforge import config
    from tuneforge.compile.pool import BuildPool
    from tuneforge.kernels import matmul as family
    from tuneforge.tune.template import TemplateChoice

    with tempfile.TemporaryDirectory(prefix="tuneforge-bench-") as tmp, config.patch(cache_dir=tmp):
        from tuneforge.compile.toolchain import default_toolchain

        default_toolchain()  # the once-per-machine compiler probe is not part of a build
        choices = [c for c in family.choices("float32", "exhaustive") if isinstance(c, TemplateChoice)][:n]
        pool = BuildPool(workers)
        try:
            started = time.perf_counter()
            results = pool.build_all([(c.name, c.cpp_build()) for c in choices], progress=False)
            wall = time.perf_counter() - started
        finally:
            pool.shutdown()
        failed = [label for label, r in results.items() if isinstance(r, BaseException)]
        if failed:
            raise SystemExit(f"builds failed: {failed}")
        return wall


def trial_wall(isolate: bool, shape: int) -> tuple[float, float]:
    """(wall of the trial phase, summed per-choice median ms) for the default matmul space."""
    from tuneforge import config
    from tuneforge.kernels import matmul as family
    from tuneforge.tune.job import TrialJob
    from tuneforge.tune.measure import measure
    from tuneforge.tune.specs import TensorSpec

    spec = TensorSpec.contiguous((shape, shape))
    choices = family.choices("float32")
    job = TrialJob(name="bench", key="bench", outputs=[2], arg_specs=[spec, spec], out_spec=spec)
    with config.patch(autotune_isolate=isolate):
        outcome = measure(job, choices[1:], choices[0])
    medians = sum(r.median_ms or 0.0 for r in outcome.records)
    return outcome.verify_s + outcome.bench_s, medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--choices", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shape", type=int, default=256)
    args = parser.parse_args()
    os.environ.setdefault("TUNEFORGE_CACHE_DIR", tempfile.mkdtemp(prefix="tuneforge-bench-"))
    from tuneforge import config

    workers = int(config.get("compile_threads"))
    serial = [build_wall(args.choices, 1) for _ in range(args.repeats)]
    pooled = [build_wall(args.choices, workers) for _ in range(args.repeats)]
    trial_wall(True, args.shape)  # warms the worker and builds the artifacts
    isolated, in_process, iso_med, local_med = [], [], [], []
    for _ in range(args.repeats):
        wall, med = trial_wall(True, args.shape)
        isolated.append(wall)
        iso_med.append(med)
        wall, med = trial_wall(False, args.shape)
        in_process.append(wall)
        local_med.append(med)
    results = {
        "choices": args.choices, "workers": workers, "repeats": args.repeats, "shape": args.shape,
        "build_serial_s": statistics.median(serial), "build_pool_s": statistics.median(pooled),
        "trials_isolated_s": statistics.median(isolated), "trials_in_process_s": statistics.median(in_process),
        "sum_median_ms_isolated": statistics.median(iso_med), "sum_median_ms_in_process": statistics.median(local_med),
    }
    rows = [
        (f"build {args.choices} choices: pool of {workers} vs serial (s)", results["build_pool_s"],
         results["build_serial_s"], "speed-up"),
        ("trials of 4 matmul choices: isolated vs in-process (s)", results["trials_isolated_s"],
         results["trials_in_process_s"], "<= 1.2x"),
        ("  sum of measured medians: isolated vs in-process (ms)", results["sum_median_ms_isolated"],
         results["sum_median_ms_in_process"], "~1.0x"),
    ]
    print(f"{'figure':58} {'value':>9} {'reference':>10} {'ratio':>7}  target")
    for name, value, ref, target in rows:
        print(f"{name:58} {value:9.3f} {ref:10.3f} {value / ref:6.2f}x  {target}")
    write_results("isolation", results)


if __name__ == "__main__":
    main()
