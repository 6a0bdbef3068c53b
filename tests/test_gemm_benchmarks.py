"""The CPU GEMM benchmarks' fair environment (benchmarks/blas_env.py), gemm.py's targets and table, and a
short real run of benchmarks/gemm_mixed.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import blas_env  # noqa: E402
import common  # noqa: E402
import gemm  # noqa: E402
import gemm_mixed  # noqa: E402

STEERED = {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "1048576", "PATH": "/usr/bin", "KEEP": "1"}


# --------------------------------------------------------------------------------------- environment

def test_child_env_drops_openblas_steering_and_leaves_the_base_alone() -> None:
    base = dict(STEERED)
    env = blas_env.child_env(2, base=base, extra={"TUNEFORGE_CACHE_DIR": "/tmp/x"})
    assert "OPENBLAS_CORETYPE" not in env and "OPENBLAS_L2_SIZE" not in env
    assert env["KEEP"] == "1" and env["PATH"] == "/usr/bin" and env["TUNEFORGE_CACHE_DIR"] == "/tmp/x"
    assert env["TUNEFORGE_KERNEL_ISA"] == "auto" and "ONEDNN_MAX_CPU_ISA" not in env
    assert {env[name] for name in blas_env.THREAD_VARIABLES} == {"2"}
    assert base == STEERED


def test_avx2_caps_the_references_at_avx2_only() -> None:
    env = blas_env.child_env(None, "avx2", base={"OPENBLAS_L2_SIZE": "1048576", "OPENBLAS_CORETYPE": "Zen"})
    assert env["OPENBLAS_CORETYPE"] == "Haswell" and "OPENBLAS_L2_SIZE" not in env
    assert env["TUNEFORGE_KERNEL_ISA"] == "avx2" and env["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert not any(name in env for name in blas_env.THREAD_VARIABLES)  # threads not given: not set


def test_child_env_copies_os_environ_without_changing_it() -> None:
    before = dict(os.environ)
    env = blas_env.child_env(1, "avx2")
    assert dict(os.environ) == before
    assert env["OPENBLAS_CORETYPE"] == "Haswell"
    assert {k: v for k, v in env.items() if k not in (*blas_env.AVX2_CAPS, *blas_env.THREAD_VARIABLES,
                                                      "OPENBLAS_L2_SIZE", "TUNEFORGE_KERNEL_ISA")} == \
        {k: v for k, v in before.items() if k not in (*blas_env.AVX2_CAPS, *blas_env.THREAD_VARIABLES,
                                                      "OPENBLAS_L2_SIZE", "TUNEFORGE_KERNEL_ISA")}


def report_in_child(env: dict[str, str]) -> str:
    code = "import sys; sys.path.insert(0, 'benchmarks'); import blas_env; print(blas_env.blas_report())"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60,
                          cwd=BENCHMARKS.parent)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_report_names_the_core_type_openblas_runs() -> None:
    steered = {**os.environ, "OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "1048576"}
    fair = report_in_child(blas_env.child_env(1, base=steered))
    if not fair.startswith("numpy: openblas"):
        pytest.skip(f"numpy's BLAS is not OpenBLAS here: {fair}")
    assert "unset" in fair and ", 1 threads" in fair
    capped = report_in_child(blas_env.child_env(1, "avx2", base=steered))
    assert " Haswell " in capped and "OPENBLAS_CORETYPE=Haswell" in capped


# ------------------------------------------------------------------------------------ gemm.py targets

def test_every_target_shape_has_its_category() -> None:
    assert {gemm.category(s) for s in gemm.SMALL} == {"small"}
    assert {gemm.category(s) for s in gemm.LARGE} == {"large"}
    assert {gemm.category(s) for s in gemm.SKINNY} == {"skinny"}
    assert {gemm.category(s) for s in gemm.ODD} == {"odd"}
    assert {gemm.category(s) for s in gemm.OTHER} == {"other"}
    assert gemm.default_shapes("float64", gemm.SHAPES) == [s for s in gemm.SHAPES if s != (4096, 4096, 4096)]
    assert gemm.default_shapes("float32", gemm.SHAPES) == gemm.SHAPES


def test_verdicts_per_category_and_isa() -> None:
    assert gemm.verdict("1024x1024x1024", 1.05, 2.0, "auto")["ratio_pass"]
    assert not gemm.verdict("1024x1024x1024", 1.04, 2.0, "auto")["ratio_pass"]
    assert gemm.verdict("1024x1024x1024", 1.0, 2.0, "avx2")["ratio_pass"]
    assert not gemm.verdict("17x2048x64", 1.19, 1.0, "auto")["ratio_pass"]
    assert gemm.verdict("17x2048x64", 0.98, 1.0, "avx2")["ratio_pass"]  # AVX2: odd shapes keep the floor
    assert not gemm.verdict("1x4096x4096", 0.97, 1.0, "auto")["ratio_pass"]
    small = gemm.verdict("64x64x64", 1.2, 3.01, "avx2")
    assert small == {"category": "small", "target_ratio": 1.15, "ratio_pass": True, "ratio_verdict": "ok",
                     "cold_pass": False}
    # with its 9 rounds' ratios, a miss is a FAIL where at most one round met the target, else within the noise
    noisy = [0.95, 0.96, 0.97, 0.97, 0.97, 0.99, 0.99, 1.0, 1.01]
    assert gemm.verdict("1x4096x4096", 0.97, 1.0, "auto", noisy)["ratio_verdict"] == "fail?"
    one_met = [*noisy[:5], 0.96, 0.97, 0.96, 0.99]
    assert gemm.verdict("1x4096x4096", 0.97, 1.0, "auto", one_met)["ratio_verdict"] == "FAIL"


def gemm_row(shape: str, torch_gflops: float | None) -> dict[str, Any]:
    row: dict[str, Any] = {
           "dtype": "float32", "shape": shape, "threads": 2, "numpy_gflops": 100.0, "torch_gflops": torch_gflops,
           "tuneforge_gflops": 130.0, "ratio": 1.3, "ratio_torch": None if torch_gflops is None else 1.1,
           "ratio_best_ref": 1.1 if torch_gflops else 1.3, "peak_gflops": 200.0, "attainable_gflops": 200.0,
           "cold_tune_s": 1.0, "winner": "tuneforge_gemm_3", "winner_info": "MR=8", "blas": "numpy: openblas x"}
    return {**row, **gemm.verdict(shape, row["ratio_best_ref"], 1.0, "auto")}


def test_gemm_table_shows_each_ratio_and_the_verdict() -> None:
    lines = gemm.format_table([gemm_row("512x512x512", 118.0), gemm_row("64x64x64", None)], "auto").splitlines()
    assert lines[0] == "2T numpy: openblas x"
    assert "/torch" in lines[1] and "/best" in lines[1] and "target" in lines[1]
    assert "118.0" in lines[2] and "1.10x" in lines[2] and "large>=1.05 ok" in lines[2]
    assert " - " in lines[3] and "small>=1.20 ok" in lines[3]
    assert lines[-1] == "targets met on 2 of 2 rows"


# ------------------------------------------------------------------------------------ gemm_mixed.py

def test_mixed_cases_and_targets() -> None:
    assert gemm_mixed.cases(gemm_mixed.parse_args([])) == gemm_mixed.CASES
    assert gemm_mixed.cases(gemm_mixed.parse_args(["--dtypes", "float64"])) == [
        ("float64", (17, 2048, 64)), ("float64", (1024, 1024, 1024))]
    assert gemm_mixed.cases(gemm_mixed.parse_args(["--shapes", "8x9x10", "--dtypes", "float32", "float64"])) == [
        ("float32", (8, 9, 10)), ("float64", (8, 9, 10))]
    assert gemm_mixed.target(1.2) == 1.1 and gemm_mixed.target(1.19) == 0.98


def test_a_ratio_target_fails_outright_only_where_too_few_rounds_met_it() -> None:
    assert common.round_verdict([0.97, 0.99, 1.02, 0.98, 1.05], 0.98) == "ok"  # the median round meets it
    assert common.round_verdict([0.90, 0.95, 0.96, 0.99, 1.05], 0.98) == "fail?"  # missed, within the rounds' noise
    assert common.round_verdict([0.90, 0.95, 0.96, 0.93, 0.97], 0.98) == "FAIL"  # no round of five met it
    assert common.round_verdict([0.9] * 8 + [1.0], 0.98) == "FAIL"  # one of nine: 10/512
    assert common.round_verdict([0.9] * 7 + [1.0] * 2, 0.98) == "fail?"  # two of nine: 46/512
    assert common.round_verdict([0.9, 0.9], 0.98) == "fail?"  # two rounds can never tell


def test_mixed_benchmark_runs_a_tiny_case(tmp_path: Path) -> None:
    out = tmp_path / "mixed.json"
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "gemm_mixed.py"), "--shapes", "16x24x32", "--threads",
                           "1", "--rounds", "2", "--loop-s", "0.01", "--warm-s", "0.02", "--output", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(out.read_text())
    assert result["threads"] == 1 and result["rounds"] == 2 and result["blas"].startswith("numpy: ")
    assert result["warm_s"] == 0.02 and "warmed 0.02 s first" in proc.stdout
    assert "unset" in result["blas"]  # the child ran without OPENBLAS_CORETYPE / L2_SIZE
    assert [r["kind"] for r in result["rows"]] == ["epilogue", "interleaved", "spaced"]
    spaced = result["rows"][2]
    assert spaced["numpy_loop_us"] < 1000 and spaced["tuneforge_loop_us"] < 1000  # its 2 ms pauses are not timed
    for r in result["rows"]:
        assert r["shape"] == "16x24x32" and r["dtype"] == "float32" and r["iterations"] >= 5
        assert r["mixed_ratio"] > 0 and r["isolated_ratio"] > 0 and r["max_rel_error"] < 1e-5
        assert r["pass"] == (r["mixed_ratio"] >= r["target_ratio"]) == (r["verdict"] == "ok")
        assert len(r["round_ratios"]) == 2 and min(r["round_ratios"]) <= r["mixed_ratio"] <= max(r["round_ratios"])
    table = proc.stdout.splitlines()
    assert table[0].startswith("1T numpy: ") and table[1].startswith("before: load average")
    assert "mixed" in table[2] and "isolated" in table[2] and "load average" in result["load_after"]
    assert len([line for line in table if line.startswith("float32        16x24x32")]) == 3
    assert table[-1] == f"wrote {out}"


def test_harness_times_each_kernel_beside_openblas_in_c(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "gemm_harness.py"), "--shape", "16x24x32", "--threads",
                           "1", "--rounds", "3", "--repeats", "2", "--settle-ms", "0"],
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TUNEFORGE_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("1T numpy: ") and "unset" in lines[0] and lines[0].endswith("3 rounds of 2 calls")
    assert lines[2].startswith("openblas ")
    kernels = lines[3:]
    assert kernels and all(line.startswith("tuneforge_gemm") and " t=1 " in line for line in kernels)
    for line in kernels:  # time, GFLOP/s, ratio to OpenBLAS, rounds won
        *_, micros, gflops, ratio, wins = line.split()
        assert float(micros) > 0 and float(gflops) > 0 and float(ratio.rstrip("x")) > 0
        assert wins.endswith("/3") and 0 <= int(wins.split("/")[0]) <= 3
