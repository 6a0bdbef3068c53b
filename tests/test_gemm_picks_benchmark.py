"""A short real run of benchmarks/gemm_picks.py (pick quality: cold picks re-timed in steady state) on one tiny
shape, and its verdict logic on made-up figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import gemm_picks  # noqa: E402


def candidate(name: str, quiet: float, op: float, *, library: bool = False, mixed: float = 99.0) -> dict[str, Any]:
    return {"hash": f"h-{name}", "name": name, "info": "", "params": {"n": name}, "library": library, "ok": True,
            "quiet_us": quiet, "op_us": op, "mixed_us": mixed, "prog_us": op}


def cold(name: str) -> dict[str, Any]:
    return {"hash": f"h-{name}", "name": name, "params": {"n": name}, "cold_s": 1.0, "tuned_ms": {}}


def steady(*candidates: dict[str, Any]) -> dict[str, Any]:
    return {"candidates": list(candidates), "base_loop_us": 50.0, "blas": "b", "load": "l"}


def test_a_pick_holds_within_the_tolerance_in_both_judged_conditions_only() -> None:
    # k2 is far slower as a bare kernel in the mixed loop: shown, not judged (the op hands such calls to numpy)
    timed = steady(candidate("numpy", 10.0, 10.0, library=True, mixed=10.0), candidate("k1", 10.2, 12.0),
                   candidate("k2", 10.25, 10.1, mixed=30.0), candidate("k3", 10.5, 10.0))
    row = gemm_picks.judge("float32", (8, 8, 8), [cold("k1"), cold("k2"), cold("numpy"), cold("k3")], timed)
    assert [p["holds"] for p in row["picks"]] == [False, True, True, False]  # k1: 20% slower through the op
    assert not row["holds"] and not row["agree"]  # k3: 5% slower quiet
    assert row["best"]["quiet"]["name"] == "numpy" and abs(row["picks"][0]["op_rel"] - 0.2) < 1e-9
    assert abs(row["picks"][1]["mixed_rel"] - 2.0) < 1e-9


def test_different_picks_agree_when_within_the_tolerance_of_each_other() -> None:
    timed = steady(candidate("numpy", 10.0, 10.0, library=True), candidate("k2", 10.1, 10.2))
    row = gemm_picks.judge("float32", (8, 8, 8), [cold("numpy"), cold("k2")], timed)
    assert row["holds"] and row["agree"]


def test_a_pick_the_re_timing_does_not_know_fails() -> None:
    row = gemm_picks.judge("float32", (8, 8, 8), [cold("gone")], steady(candidate("numpy", 1.0, 1.0, library=True)))
    assert row["picks"][0]["found"] is False and not row["holds"]


def test_a_real_run_on_a_tiny_shape(tmp_path: Path) -> None:
    out = tmp_path / "picks.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "gemm_picks.py"), "--shapes", "16x24x32", "--dtypes",
                           "float64", "--cold-runs", "2", "--rounds", "2", "--burst-s", "0.0005", "--output",
                           str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "load average" in proc.stdout and "[OPENBLAS_CORETYPE/L2_SIZE unset]" in proc.stdout
    result = json.loads(out.read_text())
    assert result["cold_runs"] == 2 and result["rounds"] == 2
    row, = result["rows"]
    assert (row["dtype"], row["shape"]) == ("float64", "16x24x32")
    names = {c["name"] for c in row["candidates"]}
    assert "numpy_matmul" in names and len(names) > 1
    timed = [c for c in row["candidates"] if c["ok"]]
    assert len(timed) == len(row["candidates"])  # every candidate of a tiny shape builds and is right
    assert all(c["quiet_us"] > 0 and c["op_us"] > 0 and c["mixed_us"] > 0 and c["burst"] >= 2 for c in timed)
    assert len(row["picks"]) == 2 and all(p["found"] for p in row["picks"])
    assert all(p["quiet_rel"] >= 0 and p["op_rel"] >= 0 and p["mixed_rel"] >= 0 and p["cold_s"] > 0
               for p in row["picks"])
    assert isinstance(row["holds"], bool) and isinstance(row["agree"], bool)
    assert row["numpy"]["quiet_us"] > 0
