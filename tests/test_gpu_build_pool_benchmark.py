"""benchmarks/gpu_build_pool.py runs its cold and warmed pools without a GPU (Triton compiles for sm_90)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the benchmark compiles with Triton")

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "gpu_build_pool.py"


def test_a_small_shape_in_a_cold_and_a_warmed_pool(tmp_path: Path) -> None:
    env = {**os.environ, "OUT": str(tmp_path)}
    done = subprocess.run([sys.executable, str(SCRIPT), "--shape", "16x64x64", "--workers", "2", "--repeats", "1"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    (row,) = json.loads((tmp_path / "gpu_build_pool.json").read_text())["rows"]
    assert row["start_method"] == "fork" and row["builds"] >= 2
    assert row["cold_s"] > 0 and row["warmed_s"] > 0 and row["cold_over_warmed"] == row["cold_s"] / row["warmed_s"]
    # every build compiled in a worker, in both pools (empty caches each time)
    assert row["cold_build_max_s"] >= row["cold_build_median_s"] > 0 and row["warmed_build_median_s"] > 0
    assert "fork " in done.stdout and "cold/warmed" in done.stdout


def test_a_bad_shape_is_named() -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--shape", "64x64"], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2 and "64x64" in done.stderr
