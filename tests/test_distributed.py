"""tuneforge.distributed on a real local Ray cluster (``ray start`` head and worker nodes on 127.0.0.1, each with a
tuneforge cache of its own, as separate machines) and a real redis-server as the shared tier.

Drivers run in child processes: Ray's threads must not enter the pytest process, which forks build workers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray", reason="tuneforge.distributed needs Ray (the distributed extra)")

from tuneforge.store.records import RecordDB

from .conftest import run_python
from .ray_cluster import RAY, RAY_TEST_ENV, RayCluster

pytestmark = [pytest.mark.distributed,
              pytest.mark.skipif(RAY is None, reason="the ray command is not installed")]

# One driver: tune_many on the jobs, then what happened as JSON on its last line.
_DRIVER = """
import dataclasses, json, os, sys
from tuneforge.distributed import Phases, ShapeJob, tune_many

phases = Phases()
jobs = [ShapeJob("matmul", 24, 24, k) for k in {ks}]
results = tune_many(jobs, os.environ["RAY_ADDRESS_FOR_TEST"], per="node", phases=phases)
print("RESULT", json.dumps({{"phases": dataclasses.asdict(phases), "results": [
    {{"label": r.job.label, "ok": r.ok, "choice": r.choice, "node": r.node_id, "records": len(r.records),
      "error": r.error, "attempts": r.attempts}} for r in results]}}))
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayCluster]:
    ray_cluster = RayCluster(tmp_path_factory.mktemp("ray-nodes"))
    try:
        ray_cluster.start_head()
        ray_cluster.add_worker("w1")
        yield ray_cluster
    finally:
        ray_cluster.stop()


def driver_env(cluster: RayCluster, cache: Path, redis_url: str | None, bench_s: float = 0.003) -> dict[str, str]:
    env = {"RAY_ADDRESS_FOR_TEST": cluster.address, "TUNEFORGE_CACHE_DIR": str(cache),
           "TUNEFORGE_AUTOTUNE_BENCH_TIME_S": str(bench_s), **RAY_TEST_ENV}
    if redis_url is not None:
        env.update(TUNEFORGE_REMOTE_URL=redis_url, TUNEFORGE_REMOTE_ALLOW_UNSIGNED="1")
    return env


def outcome(stdout: str) -> dict[str, Any]:
    line = next(line for line in stdout.splitlines() if line.startswith("RESULT "))  # Ray may print logs too
    found: dict[str, Any] = json.loads(line.removeprefix("RESULT "))
    return found


def remote_hits(cache: Path) -> int:
    stats = cache / "artifacts" / "remote_stats.json"
    return int(json.loads(stats.read_text()).get("hits", 0)) if stats.exists() else 0


def test_jobs_spread_over_the_nodes_and_their_records_reach_the_shared_tier_and_the_driver(
        cluster: RayCluster, tmp_path: Path, redis_clean: str) -> None:
    import redis

    ks = (8, 16, 24, 32, 40, 48)
    proc = run_python(_DRIVER.format(ks=ks), env=driver_env(cluster, tmp_path / "driver", redis_clean), timeout=600)
    found = outcome(proc.stdout)
    results, phases = found["results"], found["phases"]
    assert [r["label"] for r in results] == [f"matmul 24x24x{k} float32" for k in ks]
    assert all(r["ok"] and r["choice"] and r["records"] > 0 for r in results), results
    assert phases["nodes"] == 2 and phases["groups"] == 1
    assert len(phases["builds_by_node"]) == 2, phases  # the builds ran on both nodes
    assert len({r["node"] for r in results}) == 2, results  # and so did the measurements
    # Every selection's records are in the driver's database and in Redis.
    with RecordDB(tmp_path / "driver" / "records.db") as db:
        assert len(db.keys("matmul")) == len(ks)
    client = redis.Redis.from_url(redis_clean)
    assert len(client.keys("tuneforge:*:rec:*")) == len(ks)
    # What one node built, the other fetched from Redis rather than compiling it again (every selection key was
    # new, so the hits are artifacts), and the nodes' statistics counted it.
    assert client.info("stats")["keyspace_hits"] > 0
    assert sum(remote_hits(cluster.root / name) for name in cluster.nodes) > 0


def test_the_nodes_records_answer_a_second_run_without_measuring(cluster: RayCluster, tmp_path: Path,
                                                                  redis_clean: str) -> None:
    env = driver_env(cluster, tmp_path / "driver", redis_clean)
    run_python(_DRIVER.format(ks=(8, 16)), env=env, timeout=600)
    again = outcome(run_python(_DRIVER.format(ks=(8, 16)), env=env, timeout=600).stdout)
    assert all(r["ok"] for r in again["results"])
    assert again["phases"]["builds"] > 0  # planned and found in the nodes' stores: nothing compiled
    choices = {r["label"]: r["choice"] for r in again["results"]}
    assert len(choices) == 2


def test_unknown_fingerprints_and_unreachable_clusters_are_named(cluster: RayCluster, tmp_path: Path) -> None:
    code = textwrap.dedent("""
        import os
        from tuneforge.distributed import ShapeJob, tune_many
        try:
            tune_many([ShapeJob("matmul", 8, 8, 8)], os.environ["RAY_ADDRESS_FOR_TEST"], fingerprints=["nope"])
        except ValueError as exc:
            print("refused:", exc)
    """)
    proc = run_python(code, env=driver_env(cluster, tmp_path / "driver", None), timeout=300)
    assert "refused: no live node has fingerprint nope; the cluster's:" in proc.stdout
    started = time.monotonic()
    cli = subprocess.run([sys.executable, "-m", "tuneforge", "tune", "matmul", "--shape", "8x8x8", "--ray",
                          "127.0.0.1:1"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TUNEFORGE_CACHE_DIR": str(tmp_path / "cli")})
    assert cli.returncode == 1 and "no Ray cluster answers at 127.0.0.1:1" in cli.stderr, cli.stderr
    assert "Traceback" not in cli.stderr and time.monotonic() - started < 60


def test_the_actors_measure_with_the_drivers_thread_counts_not_rays(cluster: RayCluster, tmp_path: Path) -> None:
    # Ray sets OMP_NUM_THREADS=1 in an actor that reserves no CPU: numpy's OpenBLAS would run one thread there, and
    # its record, keyed by its thread count, would never answer a process of the driver's on that machine.
    code = textwrap.dedent("""
        import os
        os.environ.pop("OMP_NUM_THREADS", None)
        os.environ.pop("GOTO_NUM_THREADS", None)
        os.environ["OPENBLAS_NUM_THREADS"] = "2"
        from tuneforge.distributed import ShapeJob, tune_many
        from tuneforge.kernels.gemm import Problem, choices

        [result] = tune_many([ShapeJob("gemm", 16, 16, 16, "float32")], os.environ["RAY_ADDRESS_FOR_TEST"])
        assert result.ok, result.error
        numpy_record = next(r for r in result.records if r.choice_name == "numpy_matmul")
        print("same numpy choice:", numpy_record.choice == choices(Problem(16, 16, 16, "float32"))[0].hash_key)
    """)
    proc = run_python(code, env=driver_env(cluster, tmp_path / "driver", None), timeout=600)
    assert "same numpy choice: True" in proc.stdout, proc.stdout + proc.stderr


def test_thread_variables_are_set_and_removed_as_the_driver_has_them(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuneforge.distributed.bench import apply_thread_environment, thread_environment

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MKL_NUM_THREADS", "3")
    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    apply_thread_environment({"OMP_NUM_THREADS": None, "OPENBLAS_NUM_THREADS": "4"})
    assert thread_environment() == {"OMP_NUM_THREADS": None, "OPENBLAS_NUM_THREADS": "4",
                                    "GOTO_NUM_THREADS": os.environ.get("GOTO_NUM_THREADS"), "MKL_NUM_THREADS": "3"}
    with pytest.raises(ValueError, match="PATH is not a thread-count variable"):
        apply_thread_environment({"PATH": None})
    assert "PATH" in os.environ


def test_the_cli_tunes_several_shapes_on_the_cluster(cluster: RayCluster, tmp_path: Path) -> None:
    env = {**os.environ, **driver_env(cluster, tmp_path / "cli", None)}
    proc = subprocess.run([sys.executable, "-m", "tuneforge", "tune", "matmul", "--shape", "16x16x16", "--shape",
                           "20x20x20", "--ray", cluster.address], capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "matmul 16x16x16 float32" in proc.stdout and "matmul 20x20x20 float32" in proc.stdout
    assert "2 job(s) on 2 node(s) in 1 fingerprint group(s)" in proc.stdout


def test_a_batch_of_builds_keeps_each_builds_own_outcome(cluster: RayCluster, tmp_path: Path) -> None:
    code = textwrap.dedent("""
        import os
        from tuneforge.compile.cpp import CppBuild
        from tuneforge.distributed.builds import RayBuilds
        from tuneforge.distributed.cluster import connect, survey
        from tuneforge.distributed.driver import shipped_settings

        connect(os.environ["RAY_ADDRESS_FOR_TEST"])
        settings = shipped_settings()
        builds = RayBuilds(survey(settings), settings, max_batch=3)
        good = [CppBuild(f'extern "C" int f{i}() {{ return {i}; }}') for i in range(17)]
        futures = [builds.submit(b) for b in good[:2]]
        futures.append(builds.submit(CppBuild("this is not C++")))
        futures += [builds.submit(b) for b in good[2:]]
        again = builds.submit(good[0])
        builds.wait()
        print("same future:", again is futures[0], "submitted:", builds.submitted, "tasks:", builds.tasks)
        for f in futures:
            print(type(f.exception()).__name__ if f.exception() else "built")
    """)
    proc = run_python(code, env=driver_env(cluster, tmp_path / "driver", None), timeout=300)
    lines = proc.stdout.splitlines()
    # 18 builds on 2 CPUs: 3 tasks per CPU, so batches of 3
    assert lines[0] == "same future: True submitted: 18 tasks: 6", proc.stdout
    assert lines[1:] == ["built", "built", "CompileError", *["built"] * 15], proc.stdout


def test_a_gpu_job_on_a_cluster_without_gpus_fails_alone_with_the_reason(cluster: RayCluster, tmp_path: Path) -> None:
    code = textwrap.dedent("""
        import os
        from tuneforge.distributed import ShapeJob, tune_many

        jobs = [ShapeJob("gemm", 64, 64, 64, "float16", "cuda"), ShapeJob("matmul", 8, 8, 8)]
        for r in tune_many(jobs, os.environ["RAY_ADDRESS_FOR_TEST"]):
            print("RESULT", r.job.label, r.ok, r.error)
    """)
    proc = run_python(code, env=driver_env(cluster, tmp_path / "driver", None), timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == 2, proc.stdout
    assert lines[0].startswith("RESULT gemm 64x64x64 float16 cuda False no GPU of fingerprint "), lines
    assert lines[1] == "RESULT matmul 8x8x8 float32 True None", lines


def cluster_processes(cluster: RayCluster, marker: str, node: str | None = None) -> list[str]:
    """Command lines of the live processes the cluster's nodes started (their environment names a node's cache;
    with `node`, that node's) that mention `marker`."""
    return list(_cluster_pids(cluster, marker, node).values())


def cpu_ticks(pid: str) -> int:
    """The CPU time a process has used, in clock ticks (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0
    return int(fields[11]) + int(fields[12])  # utime, stime


def measuring(cluster: RayCluster, node: str) -> bool:
    """Whether a benchmark worker of `node` is running a job now: it used CPU time over 0.2 s (an idle worker, kept
    for the next job, waits on its pipe)."""
    pids = list(_cluster_pids(cluster, "tuneforge.tune.worker", node))
    before = [cpu_ticks(pid) for pid in pids]
    time.sleep(0.2)
    return any(cpu_ticks(pid) > ticks for pid, ticks in zip(pids, before, strict=True))


def _cluster_pids(cluster: RayCluster, marker: str, node: str | None) -> dict[str, str]:
    needle = str(cluster.root).encode() if node is None else f"TUNEFORGE_CACHE_DIR={cluster.root / node}\0".encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            state = Path(f"/proc/{entry}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if marker in cmdline and needle in environ and state not in ("Z", "X"):
            found[entry] = cmdline
    return found


def test_ctrl_c_on_the_driver_stops_the_builds_and_the_measurements(cluster: RayCluster, tmp_path: Path) -> None:
    env = {**os.environ, **driver_env(cluster, tmp_path / "cli", None, bench_s=0.5)}
    shapes = [arg for k in range(8, 40, 4) for arg in ("--shape", f"24x24x{k}")]
    driver = subprocess.Popen([sys.executable, "-m", "tuneforge", "tune", "matmul", *shapes, "--ray", cluster.address],
                              env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while not cluster_processes(cluster, "tuneforge.tune.worker") and time.monotonic() < deadline:
            time.sleep(0.1)  # an actor is measuring: its benchmark worker runs
        assert cluster_processes(cluster, "tuneforge.tune.worker"), driver.communicate()
        os.killpg(driver.pid, signal.SIGINT)  # Ctrl-C in the driver's terminal
        _, stderr = driver.communicate(timeout=120)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 130 and stderr.strip().splitlines()[-1] == "interrupted", stderr
    deadline = time.monotonic() + 60
    while (left := cluster_processes(cluster, "tuneforge.tune.worker") + cluster_processes(cluster, "BenchActor")) \
            and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], left  # no measurement goes on without its driver


def test_a_node_killed_mid_run_costs_only_its_job_which_is_measured_elsewhere(cluster: RayCluster,
                                                                            tmp_path: Path) -> None:
    """Last in this module: the dead node stays in Ray's view for a while."""
    cluster.add_worker("doomed")
    # Shapes no earlier test of the module tuned: with their records on the nodes a job can be a hit, measured
    # nowhere (waiting for the doomed node to measure, the test then failed in every run of the module, never alone).
    # Many more jobs than nodes could take at once: killed as its job ended with none left to take, the node lost
    # nothing (CI runs on a loaded host with 8 jobs, and on a faster one with 16: the doomed node, the last to start
    # its actor, measured its first job when the others had taken the rest).
    ks = tuple(range(10, 10 + 4 * 32, 4))
    # Long enough selections that the doomed node is in the middle of one when it is killed.
    env = {**os.environ, **driver_env(cluster, tmp_path / "driver", None, bench_s=0.3)}
    driver = subprocess.Popen([sys.executable, "-c", _DRIVER.format(ks=ks)], env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        doomed_db = cluster.root / "doomed" / "records.db"
        deadline = time.monotonic() + 300
        # Its benchmark worker is busy: it is measuring a job. On its database alone, and then on its worker's being
        # there (the worker stays between jobs), CI runs killed the node when it held no job (jobs_retried 0).
        while not (doomed_db.exists() and measuring(cluster, "doomed")) \
                and driver.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert doomed_db.exists(), driver.communicate()
        cluster.kill_node("doomed")
        stdout, stderr = driver.communicate(timeout=600)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 0, stderr
    found = outcome(stdout)
    results = found["results"]
    assert len(results) == len(ks) and all(r["ok"] for r in results), results
    assert found["phases"]["jobs_retried"] >= 1 and max(r["attempts"] for r in results) >= 2, found
