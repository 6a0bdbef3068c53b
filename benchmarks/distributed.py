"""tuneforge.distributed on a local Ray cluster against the local build pool, and what it would do on more nodes.

1. Compile throughput: the same distinct C++ builds (fresh caches) in the local build pool (one worker per core)
   and as Ray tasks on a 2-node cluster (one CPU each) on the same machine; builds per second per core.
2. Scheduling overhead: per job, the driver's time for a job answered from records (the actor's selection time
   taken out), and per no-op Ray task, the driver's time to submit and collect it.
3. Extrapolation to 8 and 64 nodes from those overheads: the build phase's efficiency with the driver's serial
   per-task cost, for a large tuning (the same per-build compile time, builds spread evenly).

    python benchmarks/distributed.py [--builds 16] [--jobs 40]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.ray_cluster: the same cluster as the tests

from tests.ray_cluster import RAY_TEST_ENV, RayCluster

from common import write_results

SOURCE = """
#include <cmath>
extern "C" double kernel_{i}(const double* x, long n) {{
    double s = {i}.0;
    for (long j = 0; j < n; ++j) s += std::sqrt(x[j] * {i}.5 + 1.0) * std::sin(x[j]);
    return s;
}}
"""


def builds(count: int, salt: str) -> list[Any]:
    from tuneforge.compile.cpp import CppBuild

    return [CppBuild(SOURCE.format(i=i) + f"// {salt}\n") for i in range(count)]


def local_pool(count: int, cores: int) -> float:
    from tuneforge.compile.pool import BuildPool

    with BuildPool(cores) as pool:
        started = time.perf_counter()
        results = pool.build_all([(f"b{i}", b) for i, b in enumerate(builds(count, "local"))], progress=False)
        elapsed = time.perf_counter() - started
    assert all(not isinstance(r, BaseException) for r in results.values()), results
    return elapsed


def on_ray(cluster: RayCluster, count: int) -> tuple[float, dict[str, int]]:
    from tuneforge.distributed.builds import RayBuilds
    from tuneforge.distributed.cluster import connect, survey
    from tuneforge.distributed.driver import shipped_settings

    connect(cluster.address)
    settings = shipped_settings()
    nodes = survey(settings)
    ray_builds = RayBuilds(nodes, settings)
    started = time.perf_counter()
    futures = [ray_builds.submit(b, label=f"b{i}") for i, b in enumerate(builds(count, "ray"))]
    ray_builds.wait()
    elapsed = time.perf_counter() - started
    assert all(f.exception() is None for f in futures), [f.exception() for f in futures]
    return elapsed, ray_builds.where


def task_overhead(count: int) -> float:
    """Seconds of the driver per no-op Ray task (submitted in a batch, then collected)."""
    import ray

    @ray.remote(num_cpus=0)
    def nothing() -> None:
        return None

    ray.get([nothing.remote() for _ in range(20)])  # workers started
    started = time.perf_counter()
    ray.get([nothing.remote() for _ in range(count)])
    return (time.perf_counter() - started) / count


def job_overhead(cluster: RayCluster, jobs: int) -> dict[str, float]:
    """Per job answered from records: the driver's marginal wall time per job (a run of 2N jobs against one of N:
    the fixed costs, the survey and the actors' start, cancel out) and the actor's selection time."""
    from tuneforge.distributed import Phases, ShapeJob, tune_many

    shapes = [ShapeJob("matmul", 16, 16, 8 + k) for k in range(2 * jobs)]
    tune_many(shapes, cluster.address)  # measured once: the records
    phases: dict[int, Phases] = {}
    selection = []
    for count in (jobs, 2 * jobs):
        phases[count] = Phases()
        results = tune_many(shapes[:count], cluster.address, phases=phases[count])
        selection += [r.seconds for r in results]
    per_job = (phases[2 * jobs].measure_s - phases[jobs].measure_s) / jobs
    selection_s = sum(selection) / len(selection)
    return {"per_job_ms": per_job * 1e3, "selection_ms": selection_s * 1e3,
            "overhead_ms": (per_job - selection_s) * 1e3, "fixed_s": phases[jobs].measure_s - jobs * per_job}


def extrapolate(compile_s: float, task_s: float, nodes: int, cores: int, total_builds: int = 10_000) -> float:
    """Build-phase efficiency on `nodes` nodes of `cores` cores: ideal time over ideal + the driver's serial
    per-task time (its only part that does not shrink with more nodes), with RayBuilds' batches."""
    from tuneforge.distributed.builds import MAX_BATCH, TASKS_PER_CPU

    batch = max(1, min(MAX_BATCH, int(total_builds / (TASKS_PER_CPU * nodes * cores))))
    ideal = total_builds * compile_s / (nodes * cores)
    return ideal / max(ideal, total_builds / batch * task_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--builds", type=int, default=16)
    parser.add_argument("--jobs", type=int, default=40)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    root = Path(tempfile.mkdtemp(prefix="tuneforge-bench-ray-"))
    os.environ["TUNEFORGE_CACHE_DIR"] = str(root / "driver")
    os.environ["TUNEFORGE_AUTOTUNE_BENCH_TIME_S"] = "0.003"
    os.environ.update(RAY_TEST_ENV)  # this process is the cluster's driver
    cluster = RayCluster(root / "nodes")
    try:
        local_s = local_pool(args.builds, cores)
        cluster.start_head(cpus=max(1, cores // 2))
        cluster.add_worker("w1", cpus=max(1, cores - cores // 2))
        ray_s, where = on_ray(cluster, args.builds)
        task_s = task_overhead(500)
        jobs = job_overhead(cluster, args.jobs)
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    per_core_local = args.builds / local_s / cores
    per_core_ray = args.builds / ray_s / cores
    compile_s = local_s * cores / args.builds
    print(f"{args.builds} distinct C++ builds on {cores} cores (fresh caches):")
    print(f"  local build pool ({cores} workers)        {local_s:7.2f} s  {per_core_local:6.3f} builds/s/core")
    print(f"  Ray, 2 nodes on this machine           {ray_s:7.2f} s  {per_core_ray:6.3f} builds/s/core  "
          f"(per node: {sorted(where.values())})")
    print(f"  ratio per core: {per_core_ray / per_core_local:.2f} (target >= 0.8)")
    print(f"scheduling: {task_s * 1e3:.2f} ms of the driver per Ray task; per job answered from records "
          f"{jobs['per_job_ms']:.1f} ms, of which the selection {jobs['selection_ms']:.1f} ms: overhead "
          f"{jobs['overhead_ms']:.1f} ms (target <= 20); fixed per tune_many (survey, actors) {jobs['fixed_s']:.2f} s")
    rows = []
    for nodes, node_cores in ((8, 16), (64, 16)):
        efficiency = extrapolate(compile_s, task_s, nodes, node_cores)
        rows.append({"nodes": nodes, "cores_per_node": node_cores, "build_efficiency": efficiency})
        print(f"  extrapolated: {nodes} nodes x {node_cores} cores, 10,000 builds of {compile_s:.2f} s: build "
              f"phase efficiency {efficiency:.2f}")
    write_results("distributed", {"builds": args.builds, "cores": cores, "local_s": local_s, "ray_s": ray_s,
                                  "ratio_per_core": per_core_ray / per_core_local, "task_overhead_ms": task_s * 1e3,
                                  "jobs": jobs, "extrapolated": rows})


if __name__ == "__main__":
    main()
