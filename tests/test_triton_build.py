"""The Triton builder: compiled kernels (cubin, PTX, metadata) as store artifacts, keyed by content.

Compiles for an explicit target (sm_90), which needs no GPU; loading and launching is the one gpu test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("triton", reason="the Triton builder needs the triton package")

from tuneforge import config
from tuneforge.compile import triton as tb
from tuneforge.compile.triton import GpuTarget, TritonBuild, TritonBuildError
from tuneforge.errors import CompileError
from tuneforge.store.default import default_store

from .conftest import run_python

SOURCE = textwrap.dedent("""\
    import triton
    import triton.language as tl


    @triton.jit
    def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask)
        y = tl.load(y_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, x + y, mask=mask)
    """)
SIGNATURE = {"x_ptr": "*fp32", "y_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
BUILD = TritonBuild(SOURCE, "add_kernel", SIGNATURE, {"BLOCK": 1024}, num_warps=4, num_stages=3,
                    target=GpuTarget("cuda", 90, 32))

# A child process: the build described by its arguments, with triton.compile replaced by one that records
# each call (to a marker file) and then either refuses or compiles after a pause.
CHILD = """
import json, sys, time
import triton
import triton.compiler
import triton.compiler.compiler
from tuneforge.compile import triton as tb
from tuneforge.compile.triton import GpuTarget, TritonBuild

source, marker, mode, go = sys.argv[1:5]
real = triton.compile

def watched(*args, **kwargs):
    with open(marker, "a") as f:
        f.write("compile\\n")
    if mode == "forbid":
        raise RuntimeError("compile forbidden in this process")
    time.sleep(float(mode))
    return real(*args, **kwargs)

triton.compile = triton.compiler.compile = triton.compiler.compiler.compile = watched
build = TritonBuild(open(source).read(), "add_kernel", __SIGNATURE__, {"BLOCK": 1024}, target=GpuTarget("cuda", 90, 32))
key = tb.artifact_key(build)[0]
while go != "-" and not __import__("os").path.exists(go):
    time.sleep(0.005)
try:
    artifact = tb.build(build)
except Exception as exc:
    print(json.dumps({"key": key, "error": str(exc)}))
else:
    kernel = tb.compiled_kernel(build)
    print(json.dumps({"key": key, "compiled": artifact.compiled, "name": kernel.name,
                      "cubin": kernel.asm["cubin"] == artifact.entry.file("kernel.cubin").read_bytes()}))
""".replace("__SIGNATURE__", repr(SIGNATURE))


def child(tmp_path: Path, mode: str, *, go: str = "-", cache: Path | None = None) -> subprocess.Popen[str]:
    source = tmp_path / "kernel_src.py"
    source.write_text(SOURCE)
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    return subprocess.Popen([sys.executable, str(script), str(source), str(tmp_path / "compiles.log"), mode, go],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **({"TUNEFORGE_CACHE_DIR": str(cache)} if cache else {})})


def answer(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def compiles(tmp_path: Path) -> int:
    log = tmp_path / "compiles.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_build_stores_cubin_ptx_and_metadata(cache_dir: Path) -> None:
    artifact = tb.build(BUILD)
    assert artifact.compiled and artifact.key.startswith("tri") and artifact.kernel == "add_kernel"
    assert artifact.path.parent.parent.parent == default_store().root  # an entry of this cache's store
    files = tb.kernel_files(BUILD)
    assert {"kernel.cubin", "kernel.ptx", "kernel.json", "kernel.ttgir", "kernel_source.py"} <= set(files)
    assert files["kernel.cubin"][:4] == b"\x7fELF"
    assert ".target sm_90a" in files["kernel.ptx"].decode()
    assert files["kernel_source.py"].decode() == SOURCE
    metadata = json.loads(files["kernel.json"])
    assert metadata == artifact.metadata
    assert (metadata["name"], metadata["num_warps"], metadata["num_stages"]) == ("add_kernel", 4, 3)
    assert metadata["target"] == {"backend": "cuda", "arch": 90, "warp_size": 32}
    assert artifact.entry.key_inputs["target"]["arch"] == 90 and artifact.entry.meta["binary"] == "kernel.cubin"


def test_a_stored_kernel_is_a_hit_here_and_in_another_process_that_cannot_compile(cache_dir: Path,
                                                                                 tmp_path: Path) -> None:
    started = time.perf_counter()
    first = tb.build(BUILD)
    compile_s = time.perf_counter() - started
    started = time.perf_counter()
    again = tb.build(BUILD)
    hit_s = time.perf_counter() - started
    assert first.compiled and not again.compiled and again.key == first.key
    print(f"compile {compile_s:.3f} s, hit {hit_s * 1000:.2f} ms")

    other = answer(child(tmp_path, "forbid"))
    assert other == {"key": first.key, "compiled": False, "name": "add_kernel", "cubin": True}
    assert compiles(tmp_path) == 0

    # The replacement is the one the builder calls: in an empty cache the same child fails on it.
    refused = answer(child(tmp_path, "forbid", cache=tmp_path / "empty"))
    assert "compile forbidden in this process" in refused["error"] and compiles(tmp_path) == 1


def test_compiled_kernel_is_rebuilt_from_the_store_without_compiling(cache_dir: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import triton

    artifact = tb.build(BUILD)

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("triton.compile called for a stored kernel")

    monkeypatch.setattr(triton, "compile", refuse)
    kernel = tb.compiled_kernel(BUILD)
    assert kernel.asm["cubin"] == artifact.binary_path.read_bytes()
    assert kernel.name == "add_kernel" and kernel.metadata.num_warps == 4 and kernel.hash == artifact.metadata["hash"]
    assert kernel.tuneforge_key == artifact.key


def test_keys_follow_what_changes_the_kernel(cache_dir: Path) -> None:
    from dataclasses import replace

    key, inputs = tb.artifact_key(BUILD)
    variants = {
        "arch": replace(BUILD, target=GpuTarget("cuda", 80, 32)),
        "num_warps": replace(BUILD, num_warps=8),
        "num_stages": replace(BUILD, num_stages=2),
        "constexprs": replace(BUILD, constexprs={"BLOCK": 512}),
        "source": replace(BUILD, source=SOURCE + "# a comment\n"),
    }
    keys = {name: tb.artifact_key(build)[0] for name, build in variants.items()}
    assert key not in keys.values() and len(set(keys.values())) == len(keys)
    assert tb.artifact_key(replace(BUILD, signature=dict(SIGNATURE)))[0] == key  # equal builds, equal keys
    assert inputs["ptxas"].startswith("ptxas") and "release" in inputs["ptxas"]
    assert inputs["triton"] == __import__("triton").__version__ and inputs["target"]["arch"] == 90
    text = json.dumps(inputs)
    assert str(cache_dir) not in text and "site-packages" not in text  # no absolute paths in a key

    # The same key in another process (another interpreter, another cache directory).
    other = run_python(f"""
        from tuneforge.compile import triton as tb
        from tuneforge.compile.triton import GpuTarget, TritonBuild
        print(tb.artifact_key(TritonBuild({SOURCE!r}, "add_kernel", {SIGNATURE!r}, {{"BLOCK": 1024}},
                                          target=GpuTarget("cuda", 90, 32)))[0])
    """, env={"TUNEFORGE_CACHE_DIR": str(cache_dir.parent / "elsewhere")}).stdout.strip()
    assert other == key


def test_kernel_errors_are_compile_errors_naming_the_problem(cache_dir: Path) -> None:
    bad_type = SOURCE.replace("x = tl.load(x_ptr + offsets, mask=mask)", "x = tl.load(n)")
    with pytest.raises(CompileError) as info:
        tb.build(TritonBuild(bad_type, "add_kernel", SIGNATURE, {"BLOCK": 1024}, target=GpuTarget()))
    error = info.value
    assert "Unsupported ptr type" in str(error) and "tl.load(n)" in error.stderr
    assert error.command[0] == "triton.compile" and "kernel=add_kernel" in error.command
    assert error.source_path is not None and error.source_path.read_text() == bad_type
    assert not any(name.startswith("tri") for name in _entries()), "a failed build published an entry"

    with pytest.raises(CompileError, match="SyntaxError") as info:
        tb.build(TritonBuild(SOURCE.replace("mask=mask)\n", "mask=mask\n", 1), "add_kernel", SIGNATURE,
                             {"BLOCK": 1024}, target=GpuTarget()))
    assert info.value.source_path is not None and info.value.source_path.is_file()


def _entries() -> list[str]:
    root = default_store().root / "entries"
    return [p.name for p in root.glob("*/*")] if root.exists() else []


def test_two_processes_building_one_key_compile_once(cache_dir: Path, tmp_path: Path) -> None:
    go = tmp_path / "go"
    # Each child computes the key, waits for the go file, then builds; a compile takes 1 s more, so the
    # second process certainly asks while the first holds the key's lock.
    procs = [child(tmp_path, "1.0", go=str(go)) for _ in range(2)]
    time.sleep(0.5)
    go.write_text("go")
    results = [answer(p) for p in procs]
    assert sorted(r["compiled"] for r in results) == [False, True], results
    assert results[0]["key"] == results[1]["key"] and compiles(tmp_path) == 1


@pytest.mark.redis
def test_the_remote_tier_serves_a_kernel_to_another_cache(cache_dir: Path, tmp_path: Path,
                                                         redis_clean: str) -> None:
    from tuneforge.store.remote_registry import flush_all

    with config.patch({"remote.url": redis_clean, "remote.allow_unsigned": True}):
        first = tb.build(BUILD)
        flush_all()
        with config.patch(cache_dir=tmp_path / "other-machine"):
            fetched = tb.build(BUILD)
            assert not fetched.compiled and fetched.key == first.key
            assert fetched.entry.meta.get("fetched_from_remote") is True
            assert fetched.binary_path.read_bytes() == first.binary_path.read_bytes()


@pytest.mark.parametrize(("change", "field"), [
    ({"num_warps": 3}, "num_warps"),
    ({"num_stages": 0}, "num_stages"),
    ({"kernel": "not a name"}, "kernel"),
    ({"source": " "}, "source"),
    ({"constexprs": {}}, "constexprs"),
    ({"constexprs": {"BLOCK": 1024, "n": 3}}, "constexprs['n']"),
    ({"constexprs": {"BLOCK": [1]}}, "constexprs['BLOCK']"),
    ({"signature": {**SIGNATURE, "n": ""}}, "signature['n']"),
    ({"target": "sm_90"}, "target"),
])
def test_invalid_builds_name_the_field(change: dict[str, Any], field: str) -> None:
    args: dict[str, Any] = {"source": SOURCE, "kernel": "add_kernel", "signature": SIGNATURE,
                            "constexprs": {"BLOCK": 1024}, "target": GpuTarget(), **change}
    with pytest.raises(TritonBuildError, match=rf"^TritonBuild\.{re.escape(field)}"):
        TritonBuild(**args)


def test_builds_that_do_not_match_their_source_name_the_field(cache_dir: Path) -> None:
    reordered = dict(reversed(list(SIGNATURE.items())))
    with pytest.raises(TritonBuildError, match=r"TritonBuild\.signature: .* in order"):
        tb.artifact_key(TritonBuild(SOURCE, "add_kernel", reordered, {"BLOCK": 1024}, target=GpuTarget()))
    with pytest.raises(TritonBuildError, match=r"TritonBuild\.kernel: .* 'mul_kernel'"):
        tb.artifact_key(TritonBuild(SOURCE, "mul_kernel", SIGNATURE, {"BLOCK": 1024}, target=GpuTarget()))
    with pytest.raises(TritonBuildError, match=r"GpuTarget\.backend"):
        GpuTarget("hip", 90, 64)
    with pytest.raises(TritonBuildError, match=r"GpuTarget\.arch"):
        GpuTarget("cuda", 0, 32)


def test_builds_are_hashable_values() -> None:
    copy = TritonBuild(SOURCE, "add_kernel", dict(SIGNATURE), {"BLOCK": 1024}, target=GpuTarget())
    assert copy == BUILD and hash(copy) == hash(BUILD) and len({copy, BUILD}) == 1
    mutable = dict(SIGNATURE)
    build = TritonBuild(SOURCE, "add_kernel", mutable, {"BLOCK": 1024})
    mutable["n"] = "i64"
    assert build.signature["n"] == "i32"  # the build kept its own copy


def _has_gpu() -> bool:
    torch = pytest.importorskip("torch")
    return bool(torch.cuda.is_available())


def test_the_current_device_without_a_gpu_is_a_clear_error(cache_dir: Path) -> None:
    if _has_gpu():
        pytest.skip("this machine has a GPU")
    with pytest.raises(TritonBuildError, match=r"target is None.*GpuTarget\("):
        tb.artifact_key(TritonBuild(SOURCE, "add_kernel", SIGNATURE, {"BLOCK": 1024}))
    with pytest.raises(TritonBuildError, match=r"load\(\) .* has no GPU"):
        tb.load(BUILD)


@pytest.mark.gpu
def test_load_and_launch_on_the_gpu(cache_dir: Path) -> None:
    if not _has_gpu():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    import torch

    build = TritonBuild(SOURCE, "add_kernel", SIGNATURE, {"BLOCK": 1024})  # this GPU's target
    kernel = tb.load(build)
    assert tb.load(build) is kernel
    n = 5000
    x, y = torch.rand(n, device="cuda"), torch.rand(n, device="cuda")
    out = torch.empty_like(x)
    kernel[(triton_cdiv(n, 1024), 1, 1)](x, y, out, n, 1024)
    torch.cuda.synchronize()
    torch.testing.assert_close(out, x + y)


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


def test_the_build_pool_compiles_triton_kernels_in_its_workers(cache_dir: Path) -> None:
    from tuneforge.compile.pool import BuildPool

    builds = [(f"w{warps}", TritonBuild(SOURCE, "add_kernel", SIGNATURE, {"BLOCK": 1024}, num_warps=warps,
                                        num_stages=3, target=GpuTarget(arch=90))) for warps in (2, 4)]
    with BuildPool(2) as pool:
        results = pool.build_all(builds, progress=False)
    for label, build in builds:
        result = results[label]
        assert not isinstance(result, BaseException), result
        assert result.compiled and result.key == tb.artifact_key(build)[0]
        assert Path(result.path).read_bytes()[:4] == b"\x7fELF"  # the cubin, built in a worker
    with BuildPool(1) as pool:  # a second pool finds both in the store
        again = pool.build_all(builds, progress=False)
    assert all(not isinstance(r, BaseException) and not r.compiled for r in again.values())
