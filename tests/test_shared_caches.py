"""Shared caches end to end: the Redis tier between processes with separate cache directories,
tampering, a server dying mid-selection, and shipped bundles (exact and nearest shape)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from .conftest import run_python
from .redis_server import RedisServer

pytestmark = pytest.mark.redis

GEMM = """
    import json, numpy as np
    import tuneforge
    from tuneforge import config
    from tuneforge.store.default import default_records, default_store
    from tuneforge.store.tiers import remote_stats_file
    from tuneforge.tune.select import select_detailed
    from tuneforge.kernels.gemm import Problem, choices
    from tuneforge.tune.specs import TensorSpec
    m, n, k = {shape}
    specs = [TensorSpec.contiguous((m, k)), TensorSpec.contiguous((k, n)), 1.0, 0.0, None]
    candidates = choices(Problem(m, n, k, "float32"))
    library = next(c for c in candidates if c.is_extern)  # the reference either way
    if {kernels_only}:
        candidates = [c for c in candidates if not c.is_extern]
    with config.patch(autotune_bench_time_s=0.003, autotune_warmup_s=0.0, autotune_log={log!r}):
        s = select_detailed("gemm", candidates, specs, out=TensorSpec.contiguous((m, n)), reference=library)
    a = np.ones((m, k), np.float32); b = np.ones((k, n), np.float32); out = np.zeros((m, n), np.float32)
    s.choice(a, b, 1.0, 0.0, None, out)
    from tuneforge.store.remote import flush_all
    flush_all()
    remote_stats = remote_stats_file().flush()
    print(json.dumps({{"winner": s.choice.name, "source": s.source, "benchmarked": s.benchmarked,
                       "value": float(out[0, 0]), "store_puts": default_store().stats().puts,
                       "records": default_records().count(), "remote": remote_stats}}))
"""


def gemm_child(tmp_path: Path, cache: str, *, shape: tuple[int, int, int] = (40, 48, 32),
               env: dict[str, str] | None = None, check: bool = True,
               kernels_only: bool = False) -> tuple[dict[str, object], str]:
    """Run one GEMM selection in a child process; `kernels_only`: numpy.matmul is the reference but not a
    candidate, so the winner is a compiled kernel whatever this machine's timings."""
    log = tmp_path / f"{cache}.jsonl"
    proc = run_python(GEMM.format(shape=shape, log=str(log), kernels_only=kernels_only), check=check,
                      env={"TUNEFORGE_CACHE_DIR": str(tmp_path / cache), **(env or {})})
    return json.loads(proc.stdout.strip().splitlines()[-1]), proc.stderr


def test_second_machine_gets_decision_and_artifact_from_redis(tmp_path: Path, redis_clean: str,
                                                              wrapper_compiler: Path) -> None:
    env = {"TUNEFORGE_REMOTE_URL": redis_clean, "TUNEFORGE_REMOTE_TIMEOUT_S": "10",
           "TUNEFORGE_CPP_CXX": str(wrapper_compiler)}
    first, _ = gemm_child(tmp_path, "machine-a", env=env)
    assert first["source"] == "tuned" and first["value"] == 32.0
    assert first["remote"]["puts"] >= 2  # the records and at least the winner's artifact
    compiles = (wrapper_compiler.parent / "compiler.log").read_text().count("\n")
    second, _ = gemm_child(tmp_path, "machine-b", env={**env, "TUNEFORGE_TEST_FORBID_COMPILE": "1"})
    assert second["source"] == "remote" and second["benchmarked"] == [] and second["winner"] == first["winner"]
    assert second["value"] == 32.0
    assert (wrapper_compiler.parent / "compiler.log").read_text().count("\n") == compiles  # nothing compiled
    assert second["remote"]["hits"] >= 1
    copied = run_python(f"""
        from tuneforge.store.records import RecordDB
        print(RecordDB({str(tmp_path / "machine-b" / "records.db")!r}, readonly=True).count())
    """).stdout
    assert int(copied) == first["records"]  # the remote hit was written into B's local tier (by exit)


def test_tampered_artifact_is_rejected_and_counted(tmp_path: Path, redis_clean: str) -> None:
    import redis as redis_client

    env = {"TUNEFORGE_REMOTE_URL": redis_clean, "TUNEFORGE_REMOTE_TIMEOUT_S": "10", "TUNEFORGE_REMOTE_SECRET": "s3cret",
           "TUNEFORGE_AUTOTUNE_ISOLATE": "0"}
    first, _ = gemm_child(tmp_path, "a", env=env, kernels_only=True)
    assert first["winner"] != "numpy_matmul"  # a compiled artifact to tamper with
    raw = redis_client.Redis.from_url(redis_clean)
    for key in raw.keys("tuneforge:v1:art:*"):
        value = bytearray(raw.get(key))
        value[-3] ^= 0x55
        raw.set(key, bytes(value))
    second, _ = gemm_child(tmp_path, "b", env=env, kernels_only=True)
    assert second["source"] == "remote" and second["value"] == 32.0  # records fine, artifact rebuilt locally
    assert second["remote"]["rejected"] >= 1
    stats = subprocess.run([sys.executable, "-m", "tuneforge", "cache", "stats", "--json"], capture_output=True,
                           text=True, check=True, env={**os.environ, **env, "TUNEFORGE_CACHE_DIR": str(tmp_path / "b")})
    assert json.loads(stats.stdout)["remote"]["rejected"] >= 1


def test_redis_killed_mid_selection_completes_locally(tmp_path: Path, redis_private: RedisServer) -> None:
    import redis as redis_client

    env = {**os.environ, "TUNEFORGE_REMOTE_URL": redis_private.url, "TUNEFORGE_CACHE_DIR": str(tmp_path / "c"),
           "TUNEFORGE_AUTOTUNE_BENCH_TIME_S": "0.05", "TUNEFORGE_REMOTE_ALLOW_UNSIGNED": "1"}
    code = textwrap.dedent(GEMM.format(shape=(64, 64, 64), log=str(tmp_path / "c.jsonl"), kernels_only=False))
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    # The selection's first remote lookup (a miss) comes before its builds and measurements: kill the server
    # once it has been seen, rather than after a fixed sleep that a loaded machine may outlast or undercut.
    watcher = redis_client.Redis.from_url(redis_private.url)
    deadline = time.monotonic() + 60
    while watcher.info("stats")["keyspace_misses"] < 1:
        assert proc.poll() is None and time.monotonic() < deadline, "the selection never asked the remote"
        time.sleep(0.02)
    watcher.close()
    redis_private.kill()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["value"] == 64.0 and result["source"] == "tuned"
    warnings = [line for line in err.splitlines() if "remote cache" in line.lower()]
    workers = int(os.environ.get("TUNEFORGE_COMPILE_THREADS", len(os.sched_getaffinity(0))))
    assert len(warnings) <= 1 + workers  # one per process (this one and its build workers), not per call
    assert result["remote"]["errors"] + result["remote"]["dropped"] + result["remote"]["skipped"] >= 1
    assert "Traceback" not in err


def export_bundle(tmp_path: Path, cache: str) -> Path:
    path = tmp_path / "tuned.json"
    subprocess.run([sys.executable, "-m", "tuneforge", "records", "export", "--op", "gemm", "-o", str(path)],
                   check=True, capture_output=True, env={**os.environ, "TUNEFORGE_CACHE_DIR": str(tmp_path / cache)})
    return path


@pytest.mark.parametrize("shape,source", [((40, 48, 32), "bundle"), ((44, 56, 30), "bundle-nearest")])
def test_bundle_answers_a_fresh_machine_without_redis(tmp_path: Path, shape: tuple[int, int, int],
                                                      source: str) -> None:
    gemm_child(tmp_path, "package-build")
    bundle = export_bundle(tmp_path, "package-build")
    result, _ = gemm_child(tmp_path, "user", shape=shape, env={"TUNEFORGE_BUNDLES": str(bundle)})
    assert result["source"] == source and result["benchmarked"] == [] and result["records"] == 0
    assert result["value"] == float(shape[2])
    entry = json.loads((tmp_path / "user.jsonl").read_text().splitlines()[-1])
    assert entry["source"] == source
    if source == "bundle-nearest":
        assert entry["nearest"]["inputs"].startswith("float32[40x32]") and entry["nearest"]["distance"] > 0


def test_nearest_shape_can_be_switched_off(tmp_path: Path) -> None:
    gemm_child(tmp_path, "package-build")
    bundle = export_bundle(tmp_path, "package-build")
    result, _ = gemm_child(tmp_path, "user", shape=(44, 56, 30),
                           env={"TUNEFORGE_BUNDLES": str(bundle), "TUNEFORGE_BUNDLES_NEAREST": "0"})
    assert result["source"] == "tuned"


def test_load_bundle_api(tmp_path: Path) -> None:
    gemm_child(tmp_path, "package-build")
    bundle = export_bundle(tmp_path, "package-build")
    code = f"""
        import json, tuneforge
        print(tuneforge.load_bundle({str(bundle)!r}), tuneforge.load_bundle({str(bundle)!r}))
    """
    counts = run_python(code, env={"TUNEFORGE_CACHE_DIR": str(tmp_path / "x")}).stdout.split()
    assert int(counts[0]) > 1 and counts[1] == "0"  # loaded once
