"""Record exhaustive GEMM tuning runs as replay data for the search strategies (tuneforge replay).

    python benchmarks/record_spaces.py [--isa avx512 avx2] [--shapes 128x128x128 ...] [--dtype float32]
                                       [--output tests/data/spaces]

Each (ISA, shape) is tuned over the `exhaustive` space in a fresh cache directory by a child process (the
kernels' ISA capped with TUNEFORGE_KERNEL_ISA, OpenBLAS's steering variables unset; every configuration timed
for 50 ms, none screened or re-timed: a best timed another way than the rest was a lone outlier), then the selection's
records are written as a gzip-compressed bundle, trimmed to what a replay reads (parameters, status, times,
method, the build's artifact): gemm-<isa>-<dtype>-<M>x<N>x<K>.json.gz.
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from blas_env import child_env

ROOT = Path(__file__).resolve().parent.parent
SHAPES = ["128x128x128", "512x512x512", "96x1000x300"]
KEPT = ("key", "choice", "op", "choice_name", "status", "median_ms", "min_ms", "mean_ms", "p20_ms", "p80_ms", "count",
        "method", "params", "inputs", "system")


def trimmed(record: dict[str, Any]) -> dict[str, Any]:
    out = {name: record[name] for name in KEPT if name in record}
    out["info"] = {k: v for k, v in record.get("info", {}).items() if k in ("artifact", "family")}
    out["error"] = (record.get("error") or "").splitlines()[0][:200] if record.get("error") else ""
    return out


def record(isa: str, shape: str, dtype: str, output: Path) -> Path:
    cache = tempfile.mkdtemp(prefix="tuneforge-record-spaces-")
    try:
        # every configuration timed alike: no brief screening timings beside full ones, no side-by-side re-timing
        # of the fastest few (a recording's best must not owe its place to being timed another way)
        env = child_env(None, isa, {"TUNEFORGE_CACHE_DIR": cache, "TUNEFORGE_AUTOTUNE_SCREEN_RATIO": "0",
                                    "TUNEFORGE_AUTOTUNE_CONFIRM_MARGIN": "0",
                                    "TUNEFORGE_AUTOTUNE_CONFIRM_REFERENCE_RATIO": "0",
                                    "TUNEFORGE_AUTOTUNE_BENCH_TIME_S": "0.05"})
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "tuneforge", "tune", "gemm", "--shape", shape, "--dtype", dtype,
                        "--space", "exhaustive"], env=env, check=True, capture_output=True, text=True)
        elapsed = time.perf_counter() - started
        exported = subprocess.run([sys.executable, "-m", "tuneforge", "records", "export", "--op", "gemm"], env=env,
                                  check=True, capture_output=True, text=True)
        bundle = json.loads(exported.stdout)
        bundle["records"] = [trimmed(r) for r in bundle["records"]]
        bundle["note"] = f"exhaustive gemm {shape} {dtype}, kernels capped at {isa}, tuned in {elapsed:.0f} s"
        path = output / f"gemm-{isa}-{dtype}-{shape}.json.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(gzip.compress(json.dumps(bundle, sort_keys=True, separators=(",", ":")).encode(), 9,
                                       mtime=0))
        ok = sum(r["status"] == "ok" for r in bundle["records"])
        print(f"{isa} {shape} {dtype}: {len(bundle['records'])} records ({ok} ok) in {elapsed:.0f} s -> {path} "
              f"({path.stat().st_size // 1024} KiB)", flush=True)
        return path
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--isa", nargs="+", default=["avx512", "avx2"])
    parser.add_argument("--shapes", nargs="+", default=SHAPES)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--output", type=Path, default=ROOT / "tests" / "data" / "spaces")
    args = parser.parse_args()
    for isa in args.isa:
        for shape in args.shapes:
            record(isa, shape, args.dtype, args.output)


if __name__ == "__main__":
    main()
