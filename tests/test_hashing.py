from __future__ import annotations

import dataclasses
import enum
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tuneforge import config
from tuneforge.compile.cpp import CppBuild, artifact_key
from tuneforge.hashing import KeyMaterialError, code_hash, key_hash, stable_dumps
from tuneforge.tune.fingerprint import system_fingerprint

from .conftest import run_python


class Color(enum.Enum):
    RED = 1


@dataclasses.dataclass(frozen=True)
class Params:
    block: int
    name: str


MATERIAL = {"b": [1, 2.5, "x"], "a": (Color.RED, Params(4, "p")), "c": {3, 1, 2}, "d": np.dtype("float32"),
            "e": b"\x00\xff", "f": None, "g": -0.0, "h": Path("rel/x.h")}


def test_same_key_in_a_separate_process() -> None:
    expected = key_hash(MATERIAL), code_hash("int f();", extra={"flags": ["-O3"]})
    out = run_python("""
from tests.test_hashing import MATERIAL
from tuneforge.hashing import code_hash, key_hash
print(key_hash(MATERIAL), code_hash("int f();", extra={"flags": ["-O3"]}))
""", env={"PYTHONHASHSEED": "12345"}).stdout.split()
    assert tuple(out) == expected


def test_key_format() -> None:
    key = key_hash({"x": 1})
    assert len(key) == 52 and key.isalnum() and key == key.lower()


def test_distinctions_that_matter() -> None:
    assert key_hash(1) != key_hash(1.0) != key_hash("1") != key_hash(True)
    assert key_hash((1, 2)) != key_hash([1, 2])
    assert key_hash(0.1) != key_hash(0.1 + 1e-17 * 8)
    assert key_hash(np.dtype("float32")) != key_hash(np.dtype("float64"))
    assert code_hash("x") != code_hash(" x ")  # nothing is stripped: whitespace is content
    assert code_hash("x") != code_hash("x", extra="")
    assert key_hash(np.float32) == key_hash(np.dtype("float32"))


def test_maps_and_sets_are_order_independent() -> None:
    assert key_hash({"a": 1, "b": 2}) == key_hash({"b": 2, "a": 1})
    assert key_hash({3, 1, 2}) == key_hash({2, 3, 1})


def test_refuses_what_cannot_be_keyed() -> None:
    with pytest.raises(KeyMaterialError, match="absolute path"):
        key_hash({"include": Path("/usr/include")})
    with pytest.raises(KeyMaterialError, match="object"):
        key_hash(object())


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=60, deadline=None)
@given(json_values)
def test_key_is_a_function_of_value_not_of_insertion_order(value: object) -> None:
    def reverse(v: object) -> object:
        if isinstance(v, dict):
            return {k: reverse(v[k]) for k in reversed(list(v))}
        if isinstance(v, list):
            return [reverse(x) for x in v]
        return v

    assert stable_dumps(value) == stable_dumps(reverse(value))


def test_system_fingerprint_is_complete_and_computed_once() -> None:
    fp = system_fingerprint()
    assert fp is system_fingerprint()
    for field in ("os", "cpu_model", "cpu_id", "isa", "cores", "compiler", "python", "tuneforge", "hash"):
        assert field in fp
    assert fp["compiler"]["sha256"] and fp["cores"] == os.cpu_count()


SOURCE = 'extern "C" int f(int x) { return x; }'


def test_artifact_key_changes_with_source_flags_compiler_and_isa(cache_dir: Path, wrapper_compiler: Path) -> None:
    base, _ = artifact_key(CppBuild(SOURCE))
    assert artifact_key(CppBuild(SOURCE))[0] == base
    assert artifact_key(CppBuild(SOURCE + " "))[0] != base
    assert artifact_key(CppBuild(SOURCE, flags=("-DX",)))[0] != base
    assert artifact_key(CppBuild(SOURCE, openmp=True))[0] != base
    with config.patch(cpp_flags=["-ffast-math"]):
        assert artifact_key(CppBuild(SOURCE))[0] != base
    with config.patch(cpp_march="x86-64-v2"):
        other_isa, material = artifact_key(CppBuild(SOURCE))
        assert other_isa != base and material["march"] == "x86-64-v2"
    with config.patch(cpp_cxx=str(wrapper_compiler)):
        other_compiler, material = artifact_key(CppBuild(SOURCE))
        assert other_compiler != base and material["compiler"]["name"] == "logging-g++"


def test_key_has_no_absolute_paths_and_names_real_cpu(cache_dir: Path, tmp_path: Path) -> None:
    include = tmp_path / "inc"
    include.mkdir()
    (include / "k.h").write_text("#define K 1\n")
    key, material = artifact_key(CppBuild(SOURCE, include_dirs=(str(include),)))
    text = stable_dumps(material).decode()
    assert str(tmp_path) not in text and "native" not in text
    (include / "k.h").write_text("#define K 2\n")
    assert artifact_key(CppBuild(SOURCE, include_dirs=(str(include),)))[0] != key
