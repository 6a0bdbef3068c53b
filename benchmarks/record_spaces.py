"""Record exhaustive GEMM tuning runs as replay data for the search strategies (tuneforge replay).

    python benchmarks/record_spaces.py [--isa avx512 avx2] [--shapes 128x128x128 ...] [--dtype float32]
                                       [--output tests/data/spaces]
    python benchmarks/record_spaces.py --device cuda [--shapes 1024x1024x1024] [--dtype float16]

With ``--device cuda`` (a GPU machine) the Triton GEMM configurations of the `exhaustive` space with
split_k 1 and group_m 8 (about a thousand: the whole space's 9,000 would take the better part of an
hour to compile) are timed against cuBLAS: gemm-cuda-sm<XY>-<dtype>-<M>x<N>x<K>.json.gz.

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
        return _write_bundle(env, output / f"gemm-{isa}-{dtype}-{shape}.json.gz",
                             f"exhaustive gemm {shape} {dtype}, kernels capped at {isa}, tuned in {elapsed:.0f} s",
                             elapsed)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def _write_bundle(env: dict[str, str], path: Path, note: str, elapsed: float) -> Path:
    """The gemm records of the cache `env` names, trimmed, as a gzip-compressed bundle at `path`."""
    exported = subprocess.run([sys.executable, "-m", "tuneforge", "records", "export", "--op", "gemm"], env=env,
                              check=True, capture_output=True, text=True)
    bundle = json.loads(exported.stdout)
    bundle["records"] = [trimmed(r) for r in bundle["records"]]
    bundle["note"] = note
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(json.dumps(bundle, sort_keys=True, separators=(",", ":")).encode(), 9, mtime=0))
    ok = sum(r["status"] == "ok" for r in bundle["records"])
    print(f"{path.name}: {len(bundle['records'])} records ({ok} ok) in {elapsed:.0f} s ({path.stat().st_size // 1024} "
          "KiB)", flush=True)
    return path


_GPU_CHILD = """
import sys, torch
from tuneforge.kernels.gemm_gpu.op import device_limits, gpu_choices
from tuneforge.kernels.gemm_gpu.render import Epilogue
from tuneforge.tune.select import select

m, n, k = (int(x) for x in sys.argv[1].split("x"))
dtype = sys.argv[2]
cublas, *configs = gpu_choices(m, n, k, dtype, Epilogue(), device_limits(0), "exhaustive")
configs = [c for c in configs if c.gemm_config.split_k == 1 and c.gemm_config.group_m == 8]
a = torch.randn(m, k, device="cuda", dtype=getattr(torch, dtype))
b = torch.randn(k, n, device="cuda", dtype=getattr(torch, dtype))
out = torch.empty(m, n, device="cuda", dtype=getattr(torch, dtype))
select("gemm", [cublas, *configs], [a, b, 1.0, 0.0, None], out=out, reference=cublas)
print(len(configs), torch.cuda.get_device_capability(0))
"""


def record_gpu(shape: str, dtype: str, output: Path) -> Path:
    """`record`'s counterpart on a CUDA GPU (see the module)."""
    cache = tempfile.mkdtemp(prefix="tuneforge-record-spaces-")
    try:
        env = child_env(None, "auto", {"TUNEFORGE_CACHE_DIR": cache, "TUNEFORGE_AUTOTUNE_CONFIRM_MARGIN": "0",
                                       "TUNEFORGE_AUTOTUNE_CONFIRM_REFERENCE_RATIO": "0"})
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", _GPU_CHILD, shape, dtype], env=env, check=True,
                              capture_output=True, text=True)
        elapsed = time.perf_counter() - started
        count, capability = done.stdout.split(maxsplit=1)
        major, minor = (int(x) for x in capability.strip("() \n").split(","))
        return _write_bundle(env, output / f"gemm-cuda-sm{major}{minor}-{dtype}-{shape}.json.gz",
                             f"exhaustive gemm {shape} {dtype} on sm_{major}{minor} ({count} Triton configurations "
                             f"with split_k 1 and group_m 8, and cuBLAS), tuned in {elapsed:.0f} s", elapsed)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--isa", nargs="+", default=["avx512", "avx2"])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--shapes", nargs="+", help=f"default: {' '.join(SHAPES)}; with --device cuda 1024x1024x1024")
    parser.add_argument("--dtype", help="default: float32; with --device cuda float16")
    parser.add_argument("--output", type=Path, default=ROOT / "tests" / "data" / "spaces")
    args = parser.parse_args()
    if args.device == "cuda":
        for shape in args.shapes or ["1024x1024x1024"]:
            record_gpu(shape, args.dtype or "float16", args.output)
        return
    args.shapes, args.dtype = args.shapes or SHAPES, args.dtype or "float32"
    for isa in args.isa:
        for shape in args.shapes:
            record(isa, shape, args.dtype, args.output)


if __name__ == "__main__":
    main()
