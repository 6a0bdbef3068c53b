from __future__ import annotations

import ctypes
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

import tuneforge
from tuneforge import config
from tuneforge.compile.cpp import CppBuild, build
from tuneforge.store.default import default_store

from .conftest import run_python

SAXPY = """
#include <stdint.h>
extern "C" void saxpy(float* y, const float* x, float a, int64_t n) {
    for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}
extern "C" double dot(const double* x, const double* y, int64_t n) {
    double s = 0; for (int64_t i = 0; i < n; ++i) s += x[i] * y[i]; return s;
}
"""


def test_ctypes_call_on_numpy_arrays(cache_dir: Path) -> None:
    lib = tuneforge.cpp.load(SAXPY)
    lib.saxpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float, ctypes.c_int64]
    x = np.arange(10, dtype=np.float32)
    y = np.ones(10, dtype=np.float32)
    lib.saxpy(y.ctypes.data, x.ctypes.data, 2.0, x.size)
    np.testing.assert_allclose(y, 1 + 2 * np.arange(10))
    assert tuneforge.cpp.load(SAXPY) is lib  # memoised in-process
    assert default_store().get(lib.tuneforge_key) is not None


def test_generated_extension_module(cache_dir: Path) -> None:
    module = tuneforge.cpp.load_module(SAXPY, functions=[
        "void saxpy(float* y, const float* x, float a, int64_t n)",
        "double dot(const double* x, const double* y, int64_t n)"])
    x = np.arange(6, dtype=np.float32)
    y = np.zeros(6, dtype=np.float32)
    assert module.saxpy(y, x, 0.5, 6) is None
    np.testing.assert_allclose(y, 0.5 * x)
    a = np.arange(4, dtype=np.float64)
    assert module.dot(a, a, 4) == pytest.approx(14.0)
    strided = np.arange(12, dtype=np.float64)[::3]  # non-contiguous: the pointer is its first element
    assert module.dot(strided, np.ones(4), 1) == 0.0
    with pytest.raises(TypeError, match="takes 3 arguments"):
        module.dot(a, a)
    readonly = np.zeros(6, dtype=np.float32)
    readonly.flags.writeable = False
    with pytest.raises((BufferError, ValueError, TypeError)):
        module.saxpy(readonly, x, 1.0, 6)


def test_handwritten_extension_module(cache_dir: Path) -> None:
    source = """
    #define PY_SSIZE_T_CLEAN
    #include <Python.h>
    static PyObject* twice(PyObject*, PyObject* arg) { return PyLong_FromLong(2 * PyLong_AsLong(arg)); }
    static PyMethodDef methods[] = {{"twice", twice, METH_O, "double an int"}, {NULL, NULL, 0, NULL}};
    static struct PyModuleDef def = {PyModuleDef_HEAD_INIT, "handmade", NULL, -1, methods};
    PyMODINIT_FUNC PyInit_handmade(void) { return PyModule_Create(&def); }
    """
    assert tuneforge.cpp.load_module(source).twice(21) == 42
    with pytest.raises(tuneforge.CompileError, match="PyInit_"):
        tuneforge.cpp.load_module("int x;")


def test_openmp_build(cache_dir: Path) -> None:
    lib = tuneforge.cpp.load('#include <omp.h>\nextern "C" int threads() { int n = 0;\n'
                             '#pragma omp parallel\n{\n#pragma omp single\nn = omp_get_num_threads();\n}\n'
                             'return n; }', openmp=True)
    assert lib.threads() >= 1


def test_fresh_process_loads_from_store_without_compiler(cache_dir: Path, wrapper_compiler: Path) -> None:
    log = wrapper_compiler.parent / "compiler.log"
    child = f"""
        import ctypes, json
        import tuneforge
        from tuneforge.store.default import default_store
        lib = tuneforge.cpp.load({SAXPY!r})
        lib.dot.restype = ctypes.c_double
        lib.dot.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
        a = (ctypes.c_double * 3)(1, 2, 3)
        s = default_store().stats()
        print(json.dumps([lib.dot(a, a, 3), s.hits, s.puts]))
    """
    env = {"TUNEFORGE_CPP_CXX": str(wrapper_compiler)}
    first = run_python(child, env=env).stdout
    assert len(log.read_text().splitlines()) == 1
    assert first.strip() == "[14.0, 0, 1]"
    # The compiler now refuses to compile: the second process must not need it.
    second = run_python(child, env={**env, "TUNEFORGE_TEST_FORBID_COMPILE": "1"}).stdout
    assert second.strip() == "[14.0, 1, 1]"
    assert len(log.read_text().splitlines()) == 1


def test_compile_error_carries_stderr_command_and_source(cache_dir: Path) -> None:
    source = 'extern "C" int broken() { return undefined_name; }\n'
    with pytest.raises(tuneforge.CompileError) as info:
        tuneforge.cpp.load(source, flags=["-DMARKER=1"])
    err = info.value
    assert "undefined_name" in err.stderr and "error" in err.stderr
    assert "-DMARKER=1" in err.command and "-shared" in err.command
    assert err.source_path is not None and err.source_path.read_text() == source
    message = str(err)
    assert "undefined_name" in message and str(err.source_path) in message and "-DMARKER=1" in message
    assert default_store().keys() == []  # nothing half-written
    with pytest.raises(tuneforge.CompileError):  # not cached as a success, nor as a sticky failure
        tuneforge.cpp.load(source, flags=["-DMARKER=1"])


def test_compile_timeout_kills_the_compiler(cache_dir: Path, wrapper_compiler: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # The compile would sleep 93.1 s (a number no other test uses, so pgrep sees only this one).
    monkeypatch.setenv("TUNEFORGE_TEST_SLOW_COMPILE", "93.1")
    started = time.monotonic()
    with config.patch(cpp_cxx=str(wrapper_compiler), compile_timeout_s=1.0), \
            pytest.raises(tuneforge.CompileError, match="timed out"):
        tuneforge.cpp.load('extern "C" int slow() { return 1; }')
    assert time.monotonic() - started < 60  # stopped at its 1 s limit, long before the 93 s compile ends

    def leftover() -> list[int]:
        found = subprocess.run(["pgrep", "-f", r"sleep 93\.1"], capture_output=True, text=True).stdout.split()
        return [int(pid) for pid in found if int(pid) != os.getpid()]

    # Killed, not left to finish: gone within 20 s (the process group is killed; reaping may lag).
    deadline = time.monotonic() + 20
    while leftover() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert leftover() == []
    assert default_store().keys() == []


def test_build_reports_whether_it_compiled(cache_dir: Path) -> None:
    request = CppBuild('extern "C" int one() { return 1; }')
    first = build(request)
    second = build(request)
    assert first.compiled and not second.compiled
    assert first.key == second.key and first.library_path == second.library_path
    assert first.entry.meta["compile_seconds"] > 0
    assert (first.entry.path / "source.cpp").read_text() == request.source


def test_a_compiler_behind_a_symlink_is_run_by_the_name_it_was_given(cache_dir: Path, tmp_path: Path) -> None:
    """A driver reads its mode from its name (clang++ -> clang links no C++ runtime; ccache's g++ link is how
    ccache knows what to run): the symlink is run, not its target, and a C++ module built through it loads."""
    real = tmp_path / "real-compiler"
    real.write_text('#!/bin/sh\necho "$(basename "$0")" >> "$(dirname "$0")/names.log"\nexec g++ "$@"\n')
    real.chmod(0o755)
    link = tmp_path / "linked-g++"
    link.symlink_to(real)
    with config.patch(cpp_cxx=str(link)):
        module = tuneforge.cpp.load_module("int twice(int x) { return 2 * x; }",
                                           functions=["int twice(int x)"])
    assert module.twice(21) == 42
    names = set((tmp_path / "names.log").read_text().split())
    assert names == {"linked-g++"}, names
