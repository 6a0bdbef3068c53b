"""Code-cache benchmark: cached load vs cold compile, miss overhead over the bare compiler, import time.

Every figure is a median over fresh processes or repeated runs, measured against its reference in
the same run. Prints a table and writes benchmarks/results/codecache.json.

    python benchmarks/codecache.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from common import precompile_package, write_results

KERNEL = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>
// variant VARIANT
extern "C" void gemm(const float* a, const float* b, float* c, int64_t n) {
    memset(c, 0, sizeof(float) * n * n);
    for (int64_t ii = 0; ii < n; ii += 32)
        for (int64_t kk = 0; kk < n; kk += 32)
            for (int64_t i = ii; i < ii + 32 && i < n; ++i)
                for (int64_t k = kk; k < kk + 32 && k < n; ++k) {
                    const float av = a[i * n + k];
                    for (int64_t j = 0; j < n; ++j) c[i * n + j] += av * b[k * n + j];
                }
}
extern "C" void softmax(float* x, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r) {
        float* row = x + r * cols; float m = row[0], s = 0;
        for (int64_t j = 1; j < cols; ++j) m = row[j] > m ? row[j] : m;
        for (int64_t j = 0; j < cols; ++j) { row[j] = expf(row[j] - m); s += row[j]; }
        for (int64_t j = 0; j < cols; ++j) row[j] /= s;
    }
}
extern "C" void bias_relu(float* x, const float* bias, int64_t rows, int64_t cols) {
    for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < cols; ++j) { float v = x[r * cols + j] + bias[j]; x[r * cols + j] = v > 0 ? v : 0; }
}
extern "C" int version() { return VARIANT; }
"""


def kernel(variant: int) -> str:
    return KERNEL.replace("VARIANT", str(variant))


def child(code: str, env: dict[str, str]) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         env={**os.environ, **env}, check=True).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


LOAD_CHILD = """
import json, time
t0 = time.perf_counter()
import tuneforge
t1 = time.perf_counter()
import tuneforge.cpp
t2 = time.perf_counter()
lib = tuneforge.cpp.load({source!r})
t3 = time.perf_counter()
assert lib.version() == {variant}
print(json.dumps({{"import": t1 - t0, "import_cpp": t2 - t1, "load": t3 - t2}}))
"""

MODULE_CHILD = """
import json, time
import tuneforge, tuneforge.cpp
t1 = time.perf_counter()
mod = tuneforge.cpp.load_module({source!r}, functions=["int version()"])
t2 = time.perf_counter()
assert mod.version() == {variant}
print(json.dumps({{"load": t2 - t1}}))
"""

PYTHON_CHILD = """
import json, time
import tuneforge, tuneforge.python
t1 = time.perf_counter()
mod = tuneforge.python.load({source!r})
t2 = time.perf_counter()
print(json.dumps({{"load": t2 - t1}}))
"""


def bare_compile(command: list[str], source: str, workdir: Path) -> float:
    src = workdir / "k.cpp"
    src.write_text(source)
    started = time.perf_counter()
    subprocess.run([*command[:-3], "-o", str(workdir / "k.so"), str(src)], check=True, capture_output=True)
    return time.perf_counter() - started


def median_ms(values: list[float]) -> float:
    return statistics.median(values) * 1e3


def main() -> None:
    precompile_package()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    results: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="tuneforge-bench-") as tmp:
        env = {"TUNEFORGE_CACHE_DIR": str(Path(tmp) / "cache")}
        os.environ.update(env)
        import tuneforge
        from tuneforge.compile.cpp import CppBuild, compile_command
        from tuneforge.compile.toolchain import default_toolchain

        tuneforge.cpp.load(kernel(-1))  # probe the compiler once; not part of any figure
        command = compile_command(CppBuild(kernel(0)), default_toolchain(), "k.cpp", "k.so")
        bare, miss, hit, imports, cpp_imports = [], [], [], [], []
        for i in range(args.repeats):
            bare.append(bare_compile(command, kernel(1000 + i), Path(tmp)))
            cold = child(LOAD_CHILD.format(source=kernel(i), variant=i), env)
            miss.append(cold["load"])
            warm = child(LOAD_CHILD.format(source=kernel(i), variant=i), env)
            hit.append(warm["load"])
            imports.append(warm["import"])
            cpp_imports.append(warm["import_cpp"])
        module_hit, python_hit = [], []
        child(MODULE_CHILD.format(source=kernel(77), variant=77), env)
        child(PYTHON_CHILD.format(source="def f(x):\n    return x\n" * 5), env)
        for _ in range(args.repeats):
            module_hit.append(child(MODULE_CHILD.format(source=kernel(77), variant=77), env)["load"])
            python_hit.append(child(PYTHON_CHILD.format(source="def f(x):\n    return x\n" * 5), env)["load"])

    results = {
        "bare_compile_ms": median_ms(bare), "miss_ms": median_ms(miss), "hit_ms": median_ms(hit),
        "module_hit_ms": median_ms(module_hit), "python_hit_ms": median_ms(python_hit),
        "import_tuneforge_ms": median_ms(imports), "import_compile_layer_ms": median_ms(cpp_imports),
    }
    rows = [
        ("cached C++ load, fresh process (ctypes)", results["hit_ms"], results["bare_compile_ms"],
         "cold g++", "<= 2 ms"),
        ("cached extension-module load, fresh process", results["module_hit_ms"], results["bare_compile_ms"],
         "cold g++", "<= 2 ms"),
        ("cached Python module load, fresh process", results["python_hit_ms"], None, "", ""),
        ("miss: compile + store + load", results["miss_ms"], results["bare_compile_ms"], "bare g++",
         "<= 1.05x"),
        ("import tuneforge", results["import_tuneforge_ms"], None, "", "<= 100 ms"),
        ("import tuneforge.cpp (compile layer, lazy)", results["import_compile_layer_ms"], None, "", ""),
    ]
    print(f"{'figure':46} {'ms':>9} {'ratio':>8}  {'vs':10} target")
    for name, value, ref, ref_name, target in rows:
        ratio = f"{value / ref:.3f}x" if ref else ""
        print(f"{name:46} {value:9.2f} {ratio:>8}  {ref_name:10} {target}")
    print(f"(reference: bare g++ compile {results['bare_compile_ms']:.1f} ms, median of {args.repeats})")
    write_results("codecache", {"repeats": args.repeats, **results})


if __name__ == "__main__":
    main()
