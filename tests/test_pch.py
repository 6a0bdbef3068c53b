"""The precompiled CPython header of extension-module builds (compile/pch.py): used by g++, the same artifact key
with or without it, and never the cause of a failed build."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tuneforge import config
from tuneforge.compile import pch
from tuneforge.compile.cpp import artifact_key, load_module_keyed, module_request
from tuneforge.compile.toolchain import default_toolchain
from tuneforge.errors import CompileError

pytestmark = pytest.mark.skipif(shutil.which("g++") is None or default_toolchain().kind != "gcc",
                                reason="precompiled headers are used with g++ only")


@pytest.fixture(autouse=True)
def whole_modules() -> Iterator[None]:
    with config.patch(cpp_split_bindings=False):  # modules compiled as one unit, as the header is for
        yield


def module(body: str, name: str) -> tuple[object, str]:
    return load_module_keyed(f'extern "C" double {name}(double x) {{ {body} }}', functions=[f"double {name}(double x)"])


def meta(cache_dir: Path, key: str) -> dict[str, object]:
    manifest, = (cache_dir / "artifacts").rglob(f"{key}/manifest.json")
    found: dict[str, object] = json.loads(manifest.read_text())["meta"]
    return found


def test_modules_are_compiled_with_the_precompiled_prologue(cache_dir: Path) -> None:
    with config.patch(cpp_flags=("-H",)):  # g++ lists the headers it reads; "!" marks a precompiled one used
        first, _ = module("return 2 * x;", "twice")
        second, second_key = module("return 3 * x;", "thrice")
    assert first.twice(2.0) == 4.0 and second.thrice(2.0) == 6.0  # type: ignore[attr-defined]
    headers = sorted(pch.directory().glob(f"*/{pch.HEADER}.gch"))
    assert len(headers) == 1 and headers[0].stat().st_size > 1_000_000
    assert f"! {headers[0]}" in str(meta(cache_dir, second_key)["compiler_warnings"])  # loaded, not read


def test_the_artifact_key_does_not_depend_on_it(cache_dir: Path) -> None:
    request = module_request('extern "C" int one() { return 1; }', functions=["int one()"])
    with config.patch(cpp_precompiled_header=False):
        off = artifact_key(request)[0]
    assert artifact_key(request)[0] == off
    with config.patch(cpp_precompiled_header=False):
        module("return x;", "same")
    assert not pch.directory().exists()  # off: never built


def test_a_damaged_header_costs_nothing_but_itself(cache_dir: Path) -> None:
    module("return x + 1;", "plus_one")
    compiled, = pch.directory().glob(f"*/{pch.HEADER}.gch")
    compiled.write_bytes(b"not a precompiled header" * 1000)
    built, _ = module("return x + 2;", "plus_two")
    assert built.plus_two(1.0) == 3.0  # type: ignore[attr-defined]
    assert not compiled.is_file()  # g++ ignored it (read Python.h as text): discarded
    module("return x + 3;", "plus_three")
    assert compiled.is_file() and compiled.read_bytes()[:3] != b"not"  # and made again


def test_a_bad_source_still_fails_with_the_compiler_s_message_and_keeps_the_header(cache_dir: Path) -> None:
    module("return x;", "fine")
    compiled, = pch.directory().glob(f"*/{pch.HEADER}.gch")
    with pytest.raises(CompileError) as failed:
        module("return x +;", "broken")
    assert "expected primary-expression" in str(failed.value.stderr)
    assert compiled.is_file()
