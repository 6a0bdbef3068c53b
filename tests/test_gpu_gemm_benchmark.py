"""benchmarks/gpu_gemm.py without a GPU: its pure parts (shapes, arithmetic, table, targets), its launcher's
failure reports, and its exit status 2 with a message on a machine without CUDA."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
SCRIPT = BENCHMARKS / "gpu_gemm.py"
sys.path.insert(0, str(BENCHMARKS))

import gpu_common as gc  # noqa: E402
import gpu_gemm  # noqa: E402


def run_python(code: str, tmp_path: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OUT": str(tmp_path)}  # the children's log goes there, not into benchmarks/results
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=BENCHMARKS.parent)


# ------------------------------------------------------------------------------------------ arguments

def test_shapes_parse_as_m_n_k() -> None:
    assert gc.parse_shape("4096x14336x4096") == (4096, 14336, 4096)
    assert gc.parse_shape("1X8192x8192") == (1, 8192, 8192)
    for bad in ("12x3", "axbxc", "1x2x3x4", "0x8x8", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            gc.parse_shape(bad)
    assert gc.shape_text((3000, 1000, 700)) == "3000x1000x700"


def test_cases_default_quick_and_explicit() -> None:
    default = gpu_gemm.cases(gpu_gemm.parse_args([]))
    assert len(default) == 16 and default[0] == ((4096, 4096, 4096), "bfloat16")
    assert {shape for shape, _ in default} == set(gc.SHAPES) and {d for _, d in default} == {"bfloat16", "float16"}
    assert gpu_gemm.cases(gpu_gemm.parse_args(["--quick"])) == [((4096, 4096, 4096), "bfloat16"),
                                                                ((3000, 1000, 700), "bfloat16")]
    quick16 = gpu_gemm.cases(gpu_gemm.parse_args(["--quick", "--dtypes", "float16", "bfloat16"]))
    assert [d for _, d in quick16] == ["float16", "float16"]
    explicit = gpu_gemm.cases(gpu_gemm.parse_args(["--shapes", "1x8192x8192", "--dtypes", "float16"]))
    assert explicit == [((1, 8192, 8192), "float16")]
    with pytest.raises(SystemExit):
        gpu_gemm.parse_args(["--dtypes", "int8"])
    assert gpu_gemm.parse_args([]).pool_start_method is None  # tuneforge's own default
    assert gpu_gemm.parse_args(["--pool-start-method", "forkserver"]).pool_start_method == "forkserver"
    with pytest.raises(SystemExit):
        gpu_gemm.parse_args(["--pool-start-method", "vfork"])


# ---------------------------------------------------------------------------------------- arithmetic

def test_tflops_counts_two_flops_per_multiply_add() -> None:
    assert gc.tflops((4096, 4096, 4096), 1.0) == pytest.approx(2 * 4096**3 / 1e9)
    assert gc.tflops((3000, 1000, 700), 0.5) == pytest.approx(8.4)


def test_geomean() -> None:
    assert gc.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert gc.geomean([None, 3.0, None]) == pytest.approx(3.0)
    assert gc.geomean([]) is None and gc.geomean([None]) is None
    with pytest.raises(ValueError):
        gc.geomean([1.0, 0.0])


def test_accuracy_thresholds_per_dtype() -> None:
    assert gc.accurate(5e-3, "bfloat16") and not gc.accurate(5e-3, "float16")
    assert not gc.accurate(float("nan"), "bfloat16") and not gc.accurate(None, "float16")


def test_each_timing_round_starts_with_the_next_system() -> None:
    orders = [gc.round_order(["cublas", "inductor", "tuneforge"], r) for r in range(4)]
    assert [o[0] for o in orders] == ["cublas", "inductor", "tuneforge", "cublas"]
    assert all(sorted(o) == ["cublas", "inductor", "tuneforge"] for o in orders)
    assert gc.round_order([], 2) == []


def test_interleaved_rounds_give_each_system_its_time_within_bounds() -> None:
    assert gc.interleaved_rounds(200.0, 2.0) == 100
    assert gc.interleaved_rounds(200.0, 0.02) == gc.MAX_ROUNDS  # microsecond kernels: capped
    assert gc.interleaved_rounds(200.0, 50.0) == gc.MIN_ROUNDS  # a slow system: still enough rounds for a median


def test_interleaved_timing_flushes_before_each_run_and_rotates_the_order() -> None:
    log: list[str] = []
    clock = [0.0]

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            self.at = 0.0

        def record(self) -> None:
            self.at = clock[0]

        def elapsed_time(self, end: Event) -> float:
            return end.at - self.at

    class Flush:
        def zero_(self) -> None:
            log.append("flush")

    fake = type("torch", (), {"int8": "int8", "empty": staticmethod(lambda *a, **k: Flush()),
                              "cuda": type("cuda", (), {"Event": Event, "synchronize": staticmethod(lambda: None)})})

    def system(name: str, ms: float) -> object:
        def run() -> None:
            log.append(name)
            clock[0] += ms
        return run

    rounds = gc.time_interleaved(fake, {"cublas": system("cublas", 1.0), "tuneforge": system("tuneforge", 0.5)}, 3)
    assert rounds == {"cublas": [1.0, 1.0, 1.0], "tuneforge": [0.5, 0.5, 0.5]}
    assert log == ["flush", "cublas", "flush", "tuneforge", "flush", "tuneforge", "flush", "cublas",
                   "flush", "cublas", "flush", "tuneforge"]


def test_steady_summary_ratios_are_medians_of_per_round_ratios() -> None:
    rounds = {"cublas": [1.0, 2.0, 1.0], "inductor": [1.0, 1.0, 2.0], "tuneforge": [0.5, 1.0, 1.0]}
    out = gc.summarize_steady(rounds, (1024, 1024, 1024))
    assert out["cublas_ms"] == 1.0 and out["tuneforge_ms"] == 1.0
    assert out["cublas_tflops"] == pytest.approx(gc.tflops((1024, 1024, 1024), 1.0))
    assert out["tuneforge_vs_cublas"] == pytest.approx(2.0)  # per round 2, 2, 1
    assert out["inductor_vs_cublas"] == pytest.approx(1.0)  # per round 1, 2, 0.5
    assert out["tuneforge_vs_inductor"] == pytest.approx(2.0)  # per round 2, 1, 2
    only_cublas = gc.summarize_steady({"cublas": [1.0]}, (8, 8, 8))
    assert only_cublas["tuneforge_ms"] is None and only_cublas["tuneforge_vs_cublas"] is None


# ------------------------------------------------------------------------------------------- targets

def row(shape: str = "4096x4096x4096", **fields: float | None) -> gc.Row:
    base: gc.Row = {"shape": shape, "dtype": "bfloat16", "notes": [], "tuneforge_vs_cublas": 1.0,
                    "tuneforge_vs_inductor": 1.0, "tuneforge_cold_s": 1.0, "tuneforge_warm_ms": 10.0,
                    "redis_warm_ms": None}
    return {**base, **fields}


def statuses(rows: list[gc.Row]) -> dict[str, str]:
    return {r["name"]: r["status"] for r in gc.evaluate_targets(rows)}


def test_targets_pass_fail_and_not_applicable() -> None:
    names = [t.name for t in gc.TARGETS]
    good = [row(), row("3000x1000x700", tuneforge_vs_cublas=1.4, tuneforge_vs_inductor=1.1)]
    assert list(statuses(good).values()) == ["PASS", "PASS", "PASS", "PASS", "PASS", "n/a", "n/a"]
    assert statuses([row()])[names[2]] == "n/a"  # 3000x1000x700 not in the run
    assert statuses([row(tuneforge_vs_cublas=0.98)])[names[0]] == "FAIL"
    assert statuses([row(tuneforge_vs_inductor=0.5), row(tuneforge_vs_inductor=1.9)])[names[1]] == "FAIL"
    assert statuses([row("3000x1000x700", tuneforge_vs_cublas=1.29)])[names[2]] == "FAIL"
    assert statuses([row(tuneforge_cold_s=2.01)])[names[3]] == "FAIL"
    assert statuses([row(tuneforge_warm_ms=50.0)])[names[4]] == "PASS"
    assert statuses([row(tuneforge_warm_ms=50.1)])[names[4]] == "FAIL"
    assert statuses([row(redis_warm_ms=99.0)])[names[5]] == "PASS"
    assert statuses([row(isolation_timing_ratio=1.12)])[names[6]] == "FAIL"
    assert statuses([row(isolation_timing_ratio=1.01, isolation_trials_ratio=3.0)])[names[6]] == "PASS"


def test_a_case_without_the_figure_fails_the_target() -> None:
    result = gc.evaluate(gc.TARGETS[0], [row(), row(tuneforge_vs_cublas=None)])
    assert result["status"] == "FAIL" and result["value"] == 1.0 and "1 of 2" in result["detail"]
    nothing = gc.evaluate(gc.TARGETS[3], [row(tuneforge_cold_s=None)])
    assert nothing["status"] == "FAIL" and nothing["detail"] == "not measured"


# -------------------------------------------------------------------------------------------- output

def test_table_has_a_line_per_case_and_dashes_for_missing_figures() -> None:
    rows = [row(cublas_tflops=612.34, inductor_vs_cublas=1.02, winner=None),
            {**row("1x8192x8192"), "winner": "mm_splitk (BLOCK_M=16)", "tuneforge_vs_cublas": None}]
    lines = gc.format_table(rows).splitlines()
    assert len(lines) == 3
    assert lines[0].startswith("shape") and "cuBLAS TF/s" in lines[0] and lines[0].endswith("winner")
    assert "612.3" in lines[1] and "1.020" in lines[1] and lines[1].endswith("  -")
    assert lines[2].startswith("1x8192x8192") and lines[2].endswith("mm_splitk (BLOCK_M=16)")
    assert " - " in lines[2]
    assert len({len(line) - len(line.split("  ")[-1]) for line in lines[1:]}) == 1  # columns line up
    targets = gc.format_targets(gc.evaluate_targets([row(tuneforge_cold_s=3.0)]))
    assert "[FAIL] cold tuning" in targets and "[PASS] warm first call" in targets
    assert "tuneforge/Inductor 1.000x" in gc.format_geomeans(gc.geomeans([row()]))


def test_choice_times_come_from_the_last_gemm_selection(tmp_path: Path) -> None:
    log_path = tmp_path / "autotune.jsonl"
    line = {"op": "gemm_cuda", "choices": [{"name": "cublas", "time_ms": 0.5}, {"name": "t1", "time_ms": None},
                                           {"name": "t2", "time_ms": 0.25}]}
    log_path.write_text(json.dumps(line) + "\n")
    assert gc.choice_times(gc.last_selection(log_path)) == {"cublas": 0.5, "t2": 0.25}  # a failed choice has no time
    assert gc.choice_times(gc.last_selection(tmp_path / "missing.jsonl")) is None


def test_cold_phases_come_from_the_last_gemm_line_of_the_autotune_log(tmp_path: Path) -> None:
    log_path = tmp_path / "autotune.jsonl"
    assert gc.cold_phases(gc.last_selection(log_path)) is None
    lines = [{"op": "gemm_cuda", "build_s": 9.0, "startup_s": 9.0, "setup_s": 9.0, "verify_s": 9.0, "bench_s": 9.0},
             {"op": "gemm_cuda", "build_s": 1.25, "startup_s": 0.5, "verify_s": 0.125, "bench_s": 0.75},
             {"op": "softmax", "build_s": 7.0, "verify_s": 7.0, "bench_s": 7.0}]
    log_path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    phases = gc.cold_phases(gc.last_selection(log_path))
    # a log line without a phase (setup_s: from an older tuneforge) shows it as 0
    assert phases == {"build_s": 1.25, "startup_s": 0.5, "setup_s": 0.0, "verify_s": 0.125, "bench_s": 0.75}
    log_path.write_text(json.dumps(lines[2]) + "\n")
    assert gc.cold_phases(gc.last_selection(log_path)) is None  # no GEMM selection: nothing to show


def test_the_pick_is_the_logged_winner_with_the_library_margin_named(tmp_path: Path) -> None:
    log_path = tmp_path / "autotune.jsonl"
    line = {"op": "gemm_cuda", "winner": "cublas", "library_margin": {"kept": "cublas", "over": "triton_mm_a",
                                                                     "margin": 0.02}}
    log_path.write_text(json.dumps({"op": "gemm_cuda", "winner": "triton_mm_b"}) + "\n" + json.dumps(line) + "\n")
    assert gc.logged_pick(gc.last_selection(log_path)) == "cublas (kept ahead of triton_mm_a: library margin)"
    log_path.write_text(json.dumps({"op": "gemm_cuda", "winner": "triton_mm_b"}) + "\n")
    assert gc.logged_pick(gc.last_selection(log_path)) == "triton_mm_b"
    assert gc.logged_pick(gc.last_selection(tmp_path / "missing.jsonl")) is None


def test_isolation_ratios_and_the_phases_table() -> None:
    case = row(tuneforge_cold_s=4.0, inprocess_cold_s=2.5,
               cold_phases={"build_s": 1.0, "startup_s": 1.5, "setup_s": 0.25, "verify_s": 0.25, "bench_s": 0.5},
               inprocess_phases={"build_s": 1.0, "startup_s": 0.0, "setup_s": 0.2, "verify_s": 0.2, "bench_s": 0.6})
    ratios = gc.isolation_ratios(case)
    assert ratios["isolation_cold_ratio"] == pytest.approx(1.6)
    assert ratios["isolation_trials_ratio"] == pytest.approx(2.5 / 1.0)  # waiting for the worker counts
    timed = gc.isolation_ratios(row(cold_times={"cublas": 1.1, "t1": 2.0, "t2": 3.0, "only_here": 1.0},
                                    inprocess_times={"cublas": 1.0, "t1": 2.0, "t2": 2.0}))
    assert timed["isolation_timing_ratio"] == pytest.approx(1.1)  # the median of 1.1, 1.0 and 1.5
    assert gc.isolation_ratios(row()) == {}  # not measured: no ratio
    lines = gc.format_phases([{**case, **ratios}, row()]).splitlines()
    assert len(lines) == 2  # a case without phases has no line
    cells = lines[1].replace("|", " ").split()
    assert cells[:12] == ["4096x4096x4096", "bfloat16", "cold", "4.00", "1.00", "1.50", "0.25", "0.25", "0.50",
                          "0.50", "-", "2.50"]  # streamed: not said
    assert cells[12:] == ["1.00", "1.60", "2.50"]
    prepared_phases = {"build_s": 1.25, "startup_s": 0.0, "setup_s": 0.0, "verify_s": 0.125, "bench_s": 0.25}
    runs = gc.format_phases([{**case, **ratios, "cold_streamed": 0, "prepared_cold_s": 2.0,
                              "prepared_phases": prepared_phases, "prepared_streamed": 9,
                              "unstreamed_cold_s": 2.5, "unstreamed_phases": prepared_phases,
                              "unstreamed_streamed": 0}]).splitlines()
    assert [line.split()[2] for line in runs[1:]] == ["cold", "prepared", "unstreamed"]
    assert runs[1].replace("|", " ").split()[10] == "0"
    assert runs[2].split()[3:] == ["2.00", "1.25", "0.00", "0.00", "0.12", "0.25", "0.38", "9"]
    assert runs[3].split()[3] == "2.50" and runs[3].split()[-1] == "0"


def test_results_go_to_the_folder_and_to_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OUT", str(tmp_path / "out"))
    written = gc.write_results({"cases": [row()]}, "gpu_gemm-test", tmp_path / "results")
    assert written == [tmp_path / "results" / "gpu_gemm-test.json", tmp_path / "out" / "gpu_gemm-test.json"]
    assert json.loads(written[1].read_text())["cases"][0]["shape"] == "4096x4096x4096"


def broken_measurement() -> gc.Row:
    raise KeyError("missing")


def test_a_child_that_fails_reports_its_traceback(tmp_path: Path) -> None:
    results = []
    for status in (0, 1):
        task = {"result": str(tmp_path / f"r{status}.json")}
        code = gc.finish_child(task, (lambda: {"ok": 1}) if status == 0 else broken_measurement)
        results.append((code, json.loads(Path(task["result"]).read_text())))
    assert results[0] == (0, {"ok": 1})
    assert results[1][0] == 1 and "KeyError: 'missing'" in results[1][1]["failed"]


# -------------------------------------------------------------------------------------- without a GPU

def test_import_needs_neither_torch_nor_tuneforge(tmp_path: Path) -> None:
    proc = run_python("import sys; sys.path.insert(0, 'benchmarks'); import gpu_gemm; "
                      "print(sorted(m for m in ('torch', 'triton', 'tuneforge') if m in sys.modules))", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_forked_measurement_without_cuda_reports_a_failure(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    code = ("import sys, json, pathlib; sys.path.insert(0, 'benchmarks'); import gpu_gemm; "
            f"print(json.dumps(gpu_gemm.run_task({{'kind': 'probe', 'env': {{}}}}, 'fork', "
            f"pathlib.Path({str(tmp_path)!r}), 60)))")
    proc = run_python(code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "Traceback" in result["failed"]


def test_no_gpu_exits_2_with_a_message(tmp_path: Path) -> None:
    # no GPU visible, on any machine: the benchmark must say so rather than run
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OUT": str(tmp_path), "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "no CUDA GPU" in proc.stderr or "torch is not installed" in proc.stderr
    assert not list(tmp_path.iterdir())  # nothing measured, nothing written


def test_without_torch_exits_2_with_a_message(tmp_path: Path) -> None:
    code = ("import sys, runpy; sys.modules['torch'] = None; sys.argv = ['gpu_gemm.py', '--quick']; "
            "runpy.run_path('benchmarks/gpu_gemm.py', run_name='__main__')")
    proc = run_python(code, tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "torch is not installed" in proc.stderr and "Traceback" not in proc.stderr


def test_the_workers_profiles_are_merged_into_the_childrens_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                ) -> None:
    import cProfile

    monkeypatch.setenv("OUT", str(tmp_path))
    folder = tmp_path / "worker-profiles"
    gpu_gemm.log_worker_profiles(folder, "4096x4096x4096 float16 cold")
    folder.mkdir()
    for i in range(2):
        profile = cProfile.Profile()
        profile.runcall(sorted, range(1000))
        profile.dump_stats(folder / f"worker-1-{i + 1}.prof")
    gpu_gemm.log_worker_profiles(folder, "4096x4096x4096 float16 cold")
    text = (tmp_path / "gpu_gemm-children.log").read_text()
    assert "=== no worker profile for 4096x4096x4096 float16 cold" in text
    assert "=== profile of the benchmark worker's 2 job(s), 4096x4096x4096 float16 cold" in text
    assert "{built-in method builtins.sorted}" in text and " 4 function calls " in text  # both, merged
