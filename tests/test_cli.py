from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import tuneforge
from tuneforge import config
from tuneforge.cli import main
from tuneforge.store.default import default_store


def invoke(*args: str, env: dict[str, str] | None = None, code: int = 0) -> str:
    result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
    assert result.exit_code == code, result.output
    return result.output


def test_cache_stats_counts_entries_hits_and_misses(cache_dir: Path) -> None:
    tuneforge.cpp.load('extern "C" int cli_a() { return 1; }')
    default_store().get(default_store().keys()[0])
    text = invoke("cache", "stats")
    assert str(cache_dir) in text
    lines = dict(line.split(None, 1) if " " in line else (line, "") for line in text.splitlines()[1:])
    assert lines["entries"].strip() == "1" and lines["misses"].strip() == "1" and lines["hits"].strip() == "1"
    assert "hit rate" in text and "evictions" in text and "corrupt entries" in text
    assert "\x1b[" not in text and "│" not in text  # plain when piped
    stats = json.loads(invoke("cache", "stats", "--json"))
    assert stats["entries"] == 1 and stats["hits"] == 1 and stats["bytes"] > 0 and stats["hit_rate"] == 0.5


def test_cache_clear_and_prune(cache_dir: Path) -> None:
    for i in range(3):
        tuneforge.cpp.load(f'extern "C" int cli_p{i}() {{ return {i}; }}')
    assert "evicted 0 entries" in invoke("cache", "prune")
    out = invoke("cache", "prune", "--max-size", "20K")
    assert out.startswith("evicted 2 entries")
    assert len(default_store().keys()) == 1
    assert "Invalid value" in invoke("cache", "prune", "--max-size", "huge", code=2)
    assert invoke("cache", "clear").strip() == "removed 1 entries"
    assert default_store().keys() == []


def test_cache_explain_names_differing_inputs(cache_dir: Path) -> None:
    source = 'extern "C" int cli_e() { return 1; }'
    key1 = tuneforge.cpp.load(source).tuneforge_key
    with config.patch(cpp_opt_level="1"):
        key2 = tuneforge.cpp.load(source, flags=["-DEXTRA"]).tuneforge_key
    out = invoke("cache", "explain", key1, key2)
    assert "command" in out and "-O3" in out and "-O1" in out and "-DEXTRA" in out
    assert "source_sha256" not in out  # same source: not listed
    assert "identical" in invoke("cache", "explain", key1, key1)
    assert "no artifact with key" in invoke("cache", "explain", key1, "nosuchkey0000000", code=1)
    assert "cpp-shared" in invoke("cache", "list")


def test_config_show_lists_values_and_sources(cache_dir: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "tuneforge", "config", "show"], capture_output=True, text=True,
                          env={**__import__("os").environ, "TUNEFORGE_CPP_FLAGS": "-DFROM_ENV"}, check=True)
    rows = {line.split()[0]: line.split() for line in proc.stdout.splitlines()[2:]}
    assert rows["cpp.flags"][1:] == ["-DFROM_ENV", "env", "TUNEFORGE_CPP_FLAGS"]
    assert rows["compile_threads"][2] == "default"
    data = json.loads(invoke("config", "show", "--json"))
    assert {d["name"] for d in data} >= {"cache_dir", "cpp.march", "cpp.openmp"}
    assert next(d for d in data if d["name"] == "cache_dir")["source"] == "patch"


def test_doctor_reports_compiler_and_cache_dir(cache_dir: Path) -> None:
    out = invoke("doctor")
    for check in ("C++ compiler", "target CPU", "cache dir writable", "compile and load", "optional: redis",
                  "memory available"):
        assert check in out
    assert "FAIL" not in out


def test_available_memory_is_what_the_system_reports() -> None:
    from tuneforge.doctor import available_memory

    available = available_memory()
    if not Path("/proc/meminfo").exists():
        pytest.skip("no /proc/meminfo to compare with")
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    reported = int(meminfo["MemAvailable"].split()[0]) * 1024
    # Never more than the host has available (a cgroup limit may make it less); allocations in between
    # move the figure a little.
    assert available is not None and 0 < available <= reported * 1.25


def test_doctor_fails_without_compiler(cache_dir: Path) -> None:
    with config.patch(cpp_cxx="/nonexistent/c++"):
        result = CliRunner().invoke(main, ["doctor"])
    assert result.exit_code == 1
    assert "FAIL" in result.output and "TUNEFORGE_CPP_CXX" in result.output


@pytest.mark.parametrize("args", [["--version"], ["--help"], ["cache", "--help"]])
def test_console_script_runs(args: list[str]) -> None:
    proc = subprocess.run([sys.executable, "-m", "tuneforge", *args], capture_output=True, text=True, check=True)
    assert "tuneforge" in proc.stdout.lower()


def test_tune_prints_table_and_second_run_uses_records(cache_dir: Path) -> None:
    from tuneforge.tune.select import clear_memo

    clear_memo()
    env = {"TUNEFORGE_AUTOTUNE_BENCH_TIME_S": "0.005"}
    proc = subprocess.run([sys.executable, "-m", "tuneforge", "tune", "matmul", "--shape", "48x40x32"],
                          capture_output=True, text=True, check=True, env={**__import__("os").environ, **env})
    lines = proc.stderr.splitlines()
    assert lines[0] == "AUTOTUNE matmul(48x32, 32x40)"
    assert any(line.startswith("  numpy_matmul ") for line in lines)
    assert sum(line.startswith("  tiled_matmul_") for line in lines) == 4
    assert lines[-1].startswith("SubProcess AUTOTUNE benchmarking takes")  # compiled choices are isolated
    assert "decided from tuned" in proc.stdout
    again = subprocess.run([sys.executable, "-m", "tuneforge", "tune", "matmul", "--shape", "48x40x32"],
                           capture_output=True, text=True, check=True)
    assert "decided from records" in again.stdout and "nothing benchmarked" in again.stderr
    # a fresh process with every choice built already: nothing hides the worker's start, and the table says
    # how long the trials waited for it
    forced = subprocess.run([sys.executable, "-m", "tuneforge", "tune", "matmul", "--shape", "48x40x32", "--force"],
                            capture_output=True, text=True, check=True)
    waited = re.search(r"after ([0-9.]+) seconds waiting for the benchmark worker to start$",
                       forced.stderr.splitlines()[-1])
    assert waited is not None and 0.005 < float(waited.group(1)) < 60, forced.stderr
    assert "Invalid value" in invoke("tune", "matmul", "--shape", "48x40", code=2)


def test_records_list_show_export_import_clear(cache_dir: Path, tmp_path: Path) -> None:
    from tuneforge.tune.select import clear_memo

    clear_memo()
    with config.patch(autotune_bench_time_s=0.005):
        invoke("tune", "matmul", "--shape", "16x16x16")
    listing = invoke("records", "list")
    assert "matmul" in listing and "float32[16x16]" in listing
    key = next(line.split()[0] for line in listing.splitlines()[1:])
    shown = invoke("records", "show", key)
    assert "numpy_matmul" in shown and "tiled_matmul_0" in shown and "BM=32" in shown
    bundle = json.loads(invoke("records", "export", "--op", "matmul"))
    assert bundle["format"] == "tuneforge-records" and len(bundle["records"]) == 5
    path = tmp_path / "tuned.json"
    invoke("records", "export", "-o", str(path))
    assert invoke("records", "clear").strip() == "deleted 5 records"
    assert invoke("records", "import", str(path)).startswith("imported 5 records")
    assert "deleted 5 records" in invoke("records", "clear", "--op", "matmul")
    assert "selection keys start with" in invoke("records", "show", "nope", code=1)
