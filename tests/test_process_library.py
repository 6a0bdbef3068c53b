"""A template's process library (KernelTemplate(process_library=), tune/process_library.py): built once, loaded once
per process with its symbols global before the template's first module, so that every module finds the same code by
name; built ahead in the build pool; modules still run where it does not build."""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from pathlib import Path

import pytest

from tuneforge.compile.pool import BuildPool
from tuneforge.errors import TemplateError
from tuneforge.tune import process_library
from tuneforge.tune.template import KernelTemplate

pytestmark = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("clang++") is None,
                                reason="needs a C++ compiler")

# A counter that every module of the template shares (each module's own static would count alone).
COUNTER = '#include <stdint.h>\nstatic int64_t count = 0;\nextern "C" int64_t {name}() {{ return ++count; }}\n'
MODULE = """#include <dlfcn.h>
#include <stdint.h>
extern "C" int64_t next_value(int64_t offset) {
    typedef int64_t (*Next)();
    static Next next = (Next)dlsym(RTLD_DEFAULT, "SYMBOL");
    return next ? next() + offset * {{ SCALE }} : -1;
}
"""


def template(name: str, library: str, symbol: str) -> KernelTemplate:
    return KernelTemplate(name, MODULE.replace("SYMBOL", symbol), signature="int64_t next_value(int64_t offset)",
                          process_library=library)


def stored_libraries(cache_dir: Path, source: str) -> int:
    digest = hashlib.sha256(source.encode()).hexdigest()
    manifests = [json.loads(p.read_text()) for p in (cache_dir / "artifacts").rglob("manifest.json")]
    return sum(1 for m in manifests if m["key_inputs"]["artifact"] == "cpp-shared"
               and m["key_inputs"]["source_sha256"] == digest)


def test_every_module_of_the_template_finds_the_one_library(cache_dir: Path) -> None:
    library = COUNTER.format(name="tf_test_shared_next")
    first, second = template("tf_process_lib_counter", library, "tf_test_shared_next").choices(
        [{"SCALE": 1}, {"SCALE": 100}])
    assert first.kernel()(0) == 1
    assert second.kernel()(1) == 2 + 100  # the same counter: one library, loaded once
    assert first.kernel()(0) == 3
    assert stored_libraries(cache_dir, library) == 1


def test_built_ahead_in_the_build_pool(cache_dir: Path) -> None:
    """A selection's build of the first module also gives the pool the library's build: stored before anything
    loads a module, so a benchmark worker never compiles it."""
    library = COUNTER.format(name="tf_test_ahead_next")
    choice = template("tf_process_lib_ahead", library, "tf_test_ahead_next").choices([{"SCALE": 1}])[0]
    with BuildPool(2) as pool:
        choice.build(pool).result(timeout=120)
    assert stored_libraries(cache_dir, library) == 1  # leaving the block waited for the pool's other build
    assert process_library.build_ahead(choice.template, pool) is None  # given once
    assert choice.kernel()(0) == 1


def test_modules_run_without_a_library_that_does_not_build(cache_dir: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    broken = "this is not C++ (tf_process_lib_broken)\n"
    choice = template("tf_process_lib_broken", broken, "tf_test_missing_next").choices([{"SCALE": 1}])[0]
    with caplog.at_level(logging.WARNING, logger="tuneforge.tune"):
        assert choice.kernel()(5) == -1  # its module ran, without the library
    assert any("tf_process_lib_broken" in r.getMessage() and "did not build" in r.getMessage()
               for r in caplog.records)
    assert process_library.load_process_library(choice.template) is False  # not tried again


def test_a_python_template_has_none() -> None:
    with pytest.raises(TemplateError, match="process_library"):
        KernelTemplate("tf_process_lib_python", "def f(x): return x", signature="f", language="python",
                       process_library="int x;")
