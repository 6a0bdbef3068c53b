"""Modules with generated bindings built as two units (compile/split_module.py): the kernel without Python.h, the
bindings compiled once per prototypes and linked in; whatever built before still builds, the same way or whole."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from tuneforge import config
from tuneforge.compile.cpp import artifact_key, load_module_keyed, module_request
from tuneforge.compile.toolchain import default_toolchain
from tuneforge.errors import CompileError

pytestmark = pytest.mark.skipif(shutil.which("g++") is None or not sys.platform.startswith("linux")
                                or default_toolchain().kind not in ("gcc", "clang"),
                                reason="modules are built in two units on Linux with g++ or clang++")

SCALE = "void scale(float* x, int n, float f)"


def scale_source(factor_expr: str) -> str:
    return f'extern "C" void scale(float* x, int n, float f) {{ for (int i = 0; i < n; ++i) x[i] *= {factor_expr}; }}'


def manifests(cache_dir: Path) -> dict[str, dict[str, object]]:
    found = {}
    for path in (cache_dir / "artifacts").rglob("manifest.json"):
        found[path.parent.name] = json.loads(path.read_text())
    return found


def objects(cache_dir: Path) -> list[str]:
    return [key for key, manifest in manifests(cache_dir).items() if "bindings.o" in manifest["files"]]


def test_modules_of_one_prototype_share_one_bindings_object(cache_dir: Path) -> None:
    with config.patch(cpp_flags=("-H",)):  # g++ and clang++ list the headers they read
        first, first_key = load_module_keyed(scale_source("f"), functions=[SCALE])
        second, second_key = load_module_keyed(scale_source("f * 2"), functions=[SCALE])
    x = np.ones(4, np.float32)
    first.scale(x, 4, 3.0)  # type: ignore[attr-defined]
    second.scale(x, 4, 0.5)  # type: ignore[attr-defined]
    assert x.tolist() == [3.0] * 4
    assert set(first.tuneforge_addresses) == {"scale"}  # type: ignore[attr-defined]
    assert len(objects(cache_dir)) == 1  # compiled once, linked into both
    for key in (first_key, second_key):
        warnings = str(manifests(cache_dir)[key]["meta"]["compiler_warnings"])  # type: ignore[index]
        assert "stdint.h" in warnings and "Python.h" not in warnings  # the kernel never read Python.h


def test_a_pointer_to_the_sources_own_type_is_passed_through(cache_dir: Path) -> None:
    source = 'typedef double real;\nextern "C" real total(const real* x, long n) { real s = 0; ' \
             'for (long i = 0; i < n; ++i) s += x[i]; return s; }'
    module, _ = load_module_keyed(source, functions=["double total(const real* x, long n)"])
    assert module.total(np.arange(5.0), 5) == 10.0  # type: ignore[attr-defined]
    assert len(objects(cache_dir)) == 1


@pytest.mark.parametrize("source", [
    # the CPython API (Python.h is in the one-unit module)
    'extern "C" long twice(long x) { PyObject* v = PyLong_FromLong(2 * x); long r = PyLong_AsLong(v); '
    'Py_DECREF(v); return r; }',
    # C++ linkage: the one-unit wrapper calls it directly
    'long twice(long x) { return 2 * x; }',
], ids=["python-api", "cxx-linkage"])
def test_what_only_builds_whole_still_builds(cache_dir: Path, source: str) -> None:
    module, key = load_module_keyed(source, functions=["long twice(long x)"])
    assert module.twice(21) == 42  # type: ignore[attr-defined]
    assert "unit.cpp" not in manifests(cache_dir)[key]["files"]  # type: ignore[operator]


def test_a_missing_function_fails_as_a_whole_module_does(cache_dir: Path) -> None:
    with pytest.raises(CompileError) as split:
        load_module_keyed('extern "C" int other() { return 1; }', functions=["int missing(int x)"])
    with config.patch(cpp_split_bindings=False), pytest.raises(CompileError) as whole:
        load_module_keyed('extern "C" int other() { return 2; }', functions=["int missing(int x)"])
    assert "missing" in split.value.stderr
    assert split.value.stderr.replace("return 1", "return 2") == whole.value.stderr.replace("return 1", "return 2")


def test_the_key_and_the_module_do_not_depend_on_it(cache_dir: Path) -> None:
    request = module_request(scale_source("f"), functions=[SCALE])
    with config.patch(cpp_split_bindings=False):
        whole_key = artifact_key(request)[0]
        module, key = load_module_keyed(scale_source("f"), functions=[SCALE])
    assert key == whole_key == artifact_key(request)[0]
    assert objects(cache_dir) == []  # off: no bindings object
    x = np.ones(2, np.float32)
    module.scale(x, 2, 4.0)  # type: ignore[attr-defined]
    assert x.tolist() == [4.0, 4.0]


def test_a_damaged_bindings_object_is_not_linked(cache_dir: Path) -> None:
    load_module_keyed(scale_source("f"), functions=[SCALE])
    key, = objects(cache_dir)
    stored, = (cache_dir / "artifacts").rglob(f"{key}/bindings.o")
    stored.chmod(0o644)
    stored.write_bytes(b"\x7fELF garbage")
    module, _ = load_module_keyed(scale_source("f + 1"), functions=[SCALE])  # the store drops it, or the link fails
    x = np.ones(2, np.float32)
    module.scale(x, 2, 1.0)  # type: ignore[attr-defined]
    assert x.tolist() == [2.0, 2.0]
