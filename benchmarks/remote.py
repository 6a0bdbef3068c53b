"""Remote-tier benchmark (needs redis-server on PATH): warm Redis serving a fresh machine, and the
remote tier's cost on a local hit.

    python benchmarks/remote.py [--repeats 5] [--shape 256x256x256]

1. A process tunes one GEMM shape with the remote configured. Then fresh processes, each with an
   empty local cache directory, ask for the same shape: time from after ``import tuneforge`` to the
   first result (decision from Redis, winning artifact fetched, verified and published locally).
2. Fresh processes with a warm local cache, with and without remote.url set: time of the first
   ``gemm`` call (a local hit never asks Redis, so the two should be equal).
Prints a table and writes benchmarks/results/remote.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.redis_server import RedisServer

from benchmarks.common import precompile_package, write_results

CHILD = """
import json, time
import numpy as np
t0 = time.perf_counter()
import tuneforge
t1 = time.perf_counter()
a = np.ones(({m}, {k}), np.float32); b = np.ones(({k}, {n}), np.float32)
out = tuneforge.gemm(a, b)
t2 = time.perf_counter()
from tuneforge.store.remote import flush_all
flush_all()
print(json.dumps({{"import_ms": (t1 - t0) * 1e3, "first_result_ms": (t2 - t1) * 1e3, "ok": float(out[0, 0])}}))
"""


def child(code: str, env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, check=True,
                         env={**os.environ, **env}).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    precompile_package()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--shape", default="256x256x256")
    args = parser.parse_args()
    m, n, k = (int(x) for x in args.shape.split("x"))
    code = CHILD.format(m=m, n=n, k=k)
    with tempfile.TemporaryDirectory(prefix="tuneforge-remote-bench-") as tmp:
        server = RedisServer(Path(tmp) / "redis")
        server.start()
        try:
            remote = {"TUNEFORGE_REMOTE_URL": server.url}
            started = time.perf_counter()
            child(code, {**remote, "TUNEFORGE_CACHE_DIR": f"{tmp}/tuner"})
            tune_s = time.perf_counter() - started
            fresh = []
            for i in range(args.repeats):
                fresh.append(child(code, {**remote, "TUNEFORGE_CACHE_DIR": f"{tmp}/fresh{i}"}))
            warm_with, warm_without = [], []
            for _ in range(args.repeats):  # interleaved; the tuner's cache is warm
                warm_with.append(child(code, {**remote, "TUNEFORGE_CACHE_DIR": f"{tmp}/tuner"}))
                warm_without.append(child(code, {"TUNEFORGE_CACHE_DIR": f"{tmp}/tuner"}))
        finally:
            server.stop()
            shutil.rmtree(f"{tmp}/redis", ignore_errors=True)

    def med(rows: list[dict[str, float]], field: str) -> float:
        return statistics.median(r[field] for r in rows)

    results = {
        "shape": args.shape, "repeats": args.repeats, "cold_tune_with_remote_s": tune_s,
        "fresh_machine_first_result_ms": med(fresh, "first_result_ms"),
        "fresh_machine_import_ms": med(fresh, "import_ms"),
        "local_hit_first_result_with_remote_ms": med(warm_with, "first_result_ms"),
        "local_hit_first_result_without_remote_ms": med(warm_without, "first_result_ms"),
    }
    print(f"gemm {args.shape} float32, medians of {args.repeats} fresh processes")
    print(f"{'figure':62} {'ms':>8}  target")
    print(f"{'fresh machine, warm Redis: import tuneforge -> first result':62} "
          f"{results['fresh_machine_first_result_ms']:8.1f}  <= 50 ms (import itself: "
          f"{results['fresh_machine_import_ms']:.1f} ms)")
    print(f"{'warm local cache, remote configured: first result':62} "
          f"{results['local_hit_first_result_with_remote_ms']:8.1f}")
    ratio = results["local_hit_first_result_with_remote_ms"] / results["local_hit_first_result_without_remote_ms"]
    print(f"{'warm local cache, no remote: first result':62} "
          f"{results['local_hit_first_result_without_remote_ms']:8.1f}  ratio {ratio:.2f}x (target ~1.0x)")
    write_results("remote", results)


if __name__ == "__main__":
    main()
