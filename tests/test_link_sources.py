"""Link sources (CppBuild.link_sources, KernelTemplate(link_sources=)): code many modules share, compiled once into a
stored object and linked into each module, on every build path; part of the module's key, and named when it fails."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from tuneforge import config
from tuneforge.compile.cpp import artifact_key, load_module_keyed, module_request
from tuneforge.errors import CompileError, TemplateError
from tuneforge.tune.template import KernelTemplate

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("clang++") is None,
                                reason="needs a C++ compiler")

HELPER = 'extern "C" float tf_test_offset(float x) { return x + OFFSET; }'
DECLARED = 'extern "C" float tf_test_offset(float x);\n'
ADD = "void add_offset(float* x, int n)"


def helper(offset: float) -> str:
    return f"#define OFFSET {offset}f\n{HELPER}\n"


def kernel(factor: int) -> str:
    return DECLARED + ('extern "C" void add_offset(float* x, int n) '
                       f'{{ for (int i = 0; i < n; ++i) x[i] = tf_test_offset(x[i]) * {factor}; }}')


def stored(cache_dir: Path) -> list[dict[str, object]]:
    return [json.loads(p.read_text()) for p in (cache_dir / "artifacts").rglob("manifest.json")]


def linked_objects(cache_dir: Path, source: str) -> int:
    """How many stored objects hold `source`."""
    digest = hashlib.sha256(source.encode()).hexdigest()
    return sum(1 for m in stored(cache_dir) if m["key_inputs"]["artifact"] == "cpp-object"  # type: ignore[index]
               and m["key_inputs"]["source_sha256"] == digest)  # type: ignore[index]


@pytest.mark.parametrize("split", [True, False])
def test_a_link_source_is_compiled_once_and_linked_into_each_module(cache_dir: Path, split: bool) -> None:
    with config.patch(cpp_split_bindings=split):
        once, _ = load_module_keyed(kernel(2), functions=[ADD], link_sources=[helper(1.0)])
        twice, _ = load_module_keyed(kernel(3), functions=[ADD], link_sources=[helper(1.0)])
    x = np.ones(4, np.float32)
    once.add_offset(x, 4)  # type: ignore[attr-defined]
    assert x.tolist() == [4.0] * 4  # (1 + 1) * 2
    twice.add_offset(x, 4)  # type: ignore[attr-defined]
    assert x.tolist() == [15.0] * 4  # (4 + 1) * 3
    assert linked_objects(cache_dir, helper(1.0)) == 1


def test_a_whole_module_source_links_them_too(cache_dir: Path) -> None:
    """A complete extension module (its own PyInit: compiled with the precompiled Python.h where g++ is the
    compiler) links its link sources as well."""
    source = (DECLARED + "#define PY_SSIZE_T_CLEAN\n#include <Python.h>\n"
              "static PyObject* off(PyObject*, PyObject* arg) { return PyFloat_FromDouble("
              "tf_test_offset((float)PyFloat_AsDouble(arg))); }\n"
              'static PyMethodDef methods[] = {{"off", off, METH_O, nullptr}, {nullptr, nullptr, 0, nullptr}};\n'
              'static PyModuleDef def = {PyModuleDef_HEAD_INIT, "tf_link_whole", nullptr, -1, methods};\n'
              "PyMODINIT_FUNC PyInit_tf_link_whole(void) { return PyModule_Create(&def); }\n")
    module, _ = load_module_keyed(source, link_sources=[helper(0.5)])
    assert module.off(2.0) == 2.5  # type: ignore[attr-defined]


def test_the_link_sources_are_part_of_the_modules_key(cache_dir: Path) -> None:
    plain = artifact_key(module_request(kernel(2), functions=[ADD]))
    one = artifact_key(module_request(kernel(2), functions=[ADD], link_sources=[helper(1.0)]))
    other = artifact_key(module_request(kernel(2), functions=[ADD], link_sources=[helper(2.0)]))
    assert len({plain[0], one[0], other[0]}) == 3
    assert "link_sources_sha256" not in plain[1]  # a module without them keeps the key it had
    assert len(one[1]["link_sources_sha256"]) == 1


def test_a_link_source_that_does_not_compile_is_named(cache_dir: Path) -> None:
    with pytest.raises(CompileError, match="link source 2 of 2 of the module did not compile") as caught:
        load_module_keyed(kernel(2), functions=[ADD], link_sources=[helper(1.0), "int broken( {"])
    assert "broken" in caught.value.stderr  # the compiler's own words come along


def test_a_template_links_its_link_sources_into_every_configuration(cache_dir: Path) -> None:
    source = DECLARED + ('extern "C" void add_offset(float* x, int n) '
                         "{ for (int i = 0; i < n; ++i) x[i] = tf_test_offset(x[i]) * {{ F }}; }")
    template = KernelTemplate("linked_offset", source, signature=ADD, link_sources=[helper(1.0)])
    # the same name and source: only the link sources tell the identities (the choices' keys) apart
    unlinked = KernelTemplate("linked_offset", source, signature=ADD)
    other = KernelTemplate("linked_offset", source, signature=ADD, link_sources=[helper(2.0)])
    assert len({template.identity, unlinked.identity, other.identity}) == 3
    for choice, factor in zip(template.choices([{"F": 2}, {"F": 5}]), (2, 5), strict=True):
        x = np.ones(3, np.float32)
        choice.run([x, 3])
        assert x.tolist() == [2.0 * factor] * 3
    assert linked_objects(cache_dir, helper(1.0)) == 1
    with pytest.raises(TemplateError, match="link_sources are C\\+\\+ sources"):
        KernelTemplate("linked_python", "def f(x): pass", signature="f", language="python",
                       link_sources=[helper(1.0)])


def test_the_gemm_kernels_link_one_compiled_pool(cache_dir: Path) -> None:
    """Every GEMM kernel module links the thread pool compiled once (kernels/gemm/pool.cpp), not a copy of its own:
    pasted into each kernel it was a third of every build."""
    from tuneforge.kernels.gemm import Problem, choices
    from tuneforge.kernels.gemm.template import POOL

    kernels = [c for c in choices(Problem(64, 64, 64, "float32"), "default") if not c.is_extern]
    builds = {c.render_identity: c for c in kernels}
    assert len(builds) >= 2
    a, b = np.ones((64, 64), np.float32), np.ones((64, 64), np.float32)
    for choice in builds.values():
        out = np.empty((64, 64), np.float32)
        choice.run([a, b, 1.0, 0.0, None, out])
        assert np.all(out == 64.0)
        assert "pthread_create" not in choice.source  # the pool's declarations only, not its code
    assert linked_objects(cache_dir, POOL[0]) == 1
    modules = [m for m in stored(cache_dir) if m["key_inputs"]["artifact"] == "cpp-module"]  # type: ignore[index]
    assert len(modules) == len(builds)
    assert all(m["key_inputs"]["link_sources_sha256"] for m in modules)  # type: ignore[index]
