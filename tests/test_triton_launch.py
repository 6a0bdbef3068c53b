"""Stored Triton kernels launched through the CUDA driver, and found again from a tuning record's key.

The launch plan is checked without a GPU against the parameters the PTX of real compiles declares
(sm_90); the launches themselves are gpu tests.
"""

from __future__ import annotations

import json
import logging
import re
import struct
import textwrap
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("triton", reason="the Triton builder needs the triton package")

from tuneforge.compile import triton as tb
from tuneforge.compile.triton import GpuTarget, TritonBuild
from tuneforge.compile.triton_launch import LaunchUnsupported, StoredTritonKernel, converter, plan
from tuneforge.kernels.gemm_gpu.choice import GemmLayout, GemmTritonChoice
from tuneforge.kernels.gemm_gpu.render import Config, Epilogue

from .conftest import run_python

H100 = GpuTarget(arch=90)
SOURCE = textwrap.dedent("""\
    import triton
    import triton.language as tl


    @triton.jit
    def scaled_add(x_ptr, out_ptr, n, scale, shift, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, x * scale + shift, mask=mask)
    """)
SIGNATURE = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "scale": "fp32", "shift": "i64", "BLOCK": "constexpr"}
BUILD = TritonBuild(SOURCE, "scaled_add", SIGNATURE, {"BLOCK": 256}, num_warps=2, target=H100)


def ptx_parameters(ptx: str) -> tuple[str, list[str]]:
    """The entry's name and its parameters' types (u64 for pointers) as the PTX declares them."""
    found = re.search(r"\.entry\s+(\w+)\(([^)]*)\)", ptx, re.S)
    assert found is not None, "no .entry in the PTX"
    return found.group(1), [re.match(r"\s*\.param\s+\.(\w+)", p).group(1)  # type: ignore[union-attr]
                            for p in found.group(2).split(",")]


def gemm_builds() -> dict[str, TritonBuild]:
    """The mm kernel with every epilogue part, and split-K's two kernels, specialized for a row-major layout."""
    with_all = Epilogue(bias=True, beta=True, activation="relu", precision="ieee")
    mm = GemmTritonChoice(Config(64, 64, 32, group_m=4, num_warps=4, num_stages=3), "float16", with_all,
                          GemmLayout.contiguous(96, 80, 64, True))
    split = GemmTritonChoice(Config(32, 32, 32, split_k=4, num_warps=4, num_stages=3), "float32",
                             Epilogue(precision="ieee"), GemmLayout.contiguous(16, 40, 512))
    return {**mm.triton_builds(target=H100), **split.triton_builds(target=H100)}


@pytest.mark.parametrize("which", ["template", "mm", "splitk", "splitk_reduce"])
def test_the_launch_plan_matches_the_parameters_the_ptx_declares(cache_dir: Path, which: str) -> None:
    build = {"template": BUILD, **gemm_builds()}[which]
    artifact = tb.build(build)
    launch = plan(artifact.metadata, build.signature)
    name, params = ptx_parameters(artifact.entry.file("kernel.ptx").read_text())
    assert launch.name == name == artifact.metadata["name"]
    assert launch.parameters() == params  # the run-time arguments, then the scratch pointers, in order
    assert launch.threads == 32 * build.num_warps
    assert launch.shared == artifact.metadata["shared"]


@pytest.mark.parametrize(("field", "value", "says"), [
    ("global_scratch_size", 256, "global scratch"), ("profile_scratch_size", 64, "profile scratch"),
    ("num_ctas", 2, "cluster"), ("launch_cooperative_grid", True, "cooperative"), ("launch_pdl", True, "dependent"),
    ("tensordesc_meta", [{"swizzle": 3}], "TMA"),
])
def test_what_only_tritons_launcher_does_is_unsupported(cache_dir: Path, field: str, value: Any, says: str) -> None:
    metadata = {**tb.build(BUILD).metadata, field: value}
    with pytest.raises(LaunchUnsupported, match=says):
        plan(metadata, BUILD.signature)
    with pytest.raises(LaunchUnsupported, match="tensor descriptors"):
        plan(tb.build(BUILD).metadata, {**BUILD.signature, "x_ptr": "tensordesc<fp16[64, 64]>"})


def test_scalars_are_packed_as_the_kernel_reads_them() -> None:
    assert converter("i32")(-3).value == -3 and converter("i64")(1 << 40).value == 1 << 40
    assert converter("fp32")(0.1).value == pytest.approx(0.1)
    assert struct.pack("<H", converter("fp16")(1.5).value) == struct.pack("<e", 1.5)
    # bf16 is the top half of the fp32, rounded to nearest even
    assert converter("bf16")(1.0).value == 0x3F80 and converter("bf16")(-2.0).value == 0xC000
    assert converter("bf16")(1.0 + 2 ** -8).value == 0x3F80  # a tie: to even
    assert converter("bf16")(1.0 + 3 * 2 ** -9).value == 0x3F81
    assert converter("*fp16")(4096).value == 4096 and converter("*fp16")(None).value is None


def test_a_records_key_is_trusted_only_for_the_build_it_was_made_from(cache_dir: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    artifact = tb.build(BUILD)
    assert artifact.entry.meta["build_identity"] == tb.build_identity(BUILD, H100)
    entry = tb.stored_entry(artifact.key, BUILD)
    assert entry is not None and entry.key == artifact.key
    other = TritonBuild(SOURCE, "scaled_add", SIGNATURE, {"BLOCK": 512}, num_warps=2, target=H100)
    with caplog.at_level(logging.WARNING, logger="tuneforge.compile.triton"):
        assert tb.stored_entry(artifact.key, other) is None  # a record naming another kernel's artifact
    assert "not built from this kernel's build" in caplog.text
    assert tb.stored_entry(artifact.key, TritonBuild(SOURCE, "scaled_add", SIGNATURE, {"BLOCK": 256},
                                                     num_warps=2, target=GpuTarget(arch=80))) is None
    assert tb.stored_entry(artifact.key, TritonBuild(SOURCE, "scaled_add", SIGNATURE, {"BLOCK": 256})) is None
    assert tb.stored_entry("cpp" + artifact.key[3:], BUILD) is None  # not a Triton key
    assert tb.stored_entry("tri" + "0" * 64, BUILD) is None  # stored nowhere
    assert tb.stored_entry("../../etc", BUILD) is None


def test_a_warm_process_finds_and_prepares_a_kernel_without_importing_triton(cache_dir: Path) -> None:
    key = tb.build(BUILD).key
    out = run_python(f"""
        import json, sys
        from tuneforge.compile import triton as tb
        from tuneforge.compile.triton import GpuTarget, TritonBuild
        from tuneforge.compile.triton_launch import StoredTritonKernel
        build = TritonBuild({SOURCE!r}, "scaled_add", {SIGNATURE!r}, {{"BLOCK": 256}}, num_warps=2,
                            target=GpuTarget(arch=90))
        entry = tb.stored_entry({key!r}, build)
        kernel = StoredTritonKernel(entry, build.signature)
        print(json.dumps({{"name": kernel.plan.name, "triton": "triton" in sys.modules}}))
    """).stdout
    assert json.loads(out.strip().splitlines()[-1]) == {"name": "scaled_add", "triton": False}


def test_gemm_choices_record_their_artifacts_and_take_them_back(cache_dir: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from tuneforge.compile import triton_env
    from tuneforge.compile.pool import BuildPool

    monkeypatch.setattr(triton_env, "build_target", lambda: H100)
    monkeypatch.setattr("tuneforge.kernels.gemm_gpu.choice.build_target", lambda: H100)
    choice = GemmTritonChoice(Config(32, 32, 32, split_k=2), "float16", Epilogue(),
                              GemmLayout.contiguous(16, 64, 256))
    assert choice.record_hints() == {}  # not built yet
    with BuildPool(1) as pool:
        choice.build(pool).result(timeout=600)
    expected = {kind: tb.artifact_key(build)[0] for kind, build in choice.triton_builds(target=H100).items()}
    hints = choice.record_hints()
    assert hints == {"artifacts": f"splitk={expected['splitk']},splitk_reduce={expected['splitk_reduce']}"}

    fresh = GemmTritonChoice(choice.gemm_config, "float16", Epilogue(), GemmLayout.contiguous(16, 64, 256))
    fresh.use_record({**hints, "family": "triton:gemm_gpu"})
    assert fresh.key_hints == expected
    for kind, build in fresh.triton_builds(target=H100).items():
        entry = tb.stored_entry(fresh.key_hints[kind], build)
        assert entry is not None and StoredTritonKernel(entry, build.signature).plan.name == build.kernel
    fresh.use_record({"artifacts": "mm=tri123,bogus"})  # kinds this configuration does not have are ignored
    assert fresh.key_hints == {}


def _has_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@pytest.mark.gpu
def test_the_driver_launch_computes_what_tritons_launch_does(cache_dir: Path) -> None:
    if not _has_gpu():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    import torch

    from tuneforge.compile.triton_env import device_target

    build = TritonBuild(SOURCE, "scaled_add", SIGNATURE, {"BLOCK": 256}, num_warps=2, target=device_target(0))
    launcher = tb.launcher(build)
    assert isinstance(launcher, StoredTritonKernel)
    n = 5001
    x = torch.rand(n, device="cuda")
    ours, theirs = torch.empty_like(x), torch.empty_like(x)
    grid = (-(-n // 256), 1, 1)
    launcher(grid, [x, ours, n, 2.5, 7], 0)
    tb.load(build)[grid](x, theirs, n, 2.5, 7, 256)
    torch.cuda.synchronize()
    torch.testing.assert_close(ours, x * 2.5 + 7)
    assert torch.equal(ours, theirs)


class FakeDriver:
    """libcuda's two calls a launch makes, recorded: what cuLaunchKernel was given, its parameter buffer read
    during the call (as the driver copies it) as the kernel's parameter types say."""

    def __init__(self, reads: list[Any]) -> None:
        self.reads = reads
        self.launches: list[tuple[Any, ...]] = []

    def cuLaunchKernel(self, *args: Any) -> int:  # the driver's name
        params = args[9]
        self.launches.append((*args[:9], [kind.from_address(params[i]).value for i, kind in enumerate(self.reads)],
                              args[10]))
        return 0

    def cuFuncSetAttribute(self, *args: Any) -> int:
        return 0


def test_a_launch_passes_each_argument_as_the_kernel_reads_it(cache_dir: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """No GPU: the driver is a recorder, and the parameter buffer it gets is decoded as the kernel would."""
    import ctypes

    from tuneforge.compile import cuda_driver, triton_launch

    kernel = StoredTritonKernel(tb.build(BUILD).entry, SIGNATURE)
    scratch = kernel.plan.scratch_pointers
    # the arguments, then the null scratch pointers
    fake = FakeDriver([ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_float, ctypes.c_int64,
                       *[ctypes.c_void_p] * scratch])
    module = cuda_driver.CudaModule(handle=1, context=7, key="test", arch="sm_90")
    monkeypatch.setattr(cuda_driver, "driver", lambda: fake)
    monkeypatch.setattr(cuda_driver, "current_context", lambda: 7)
    monkeypatch.setattr(cuda_driver, "load_image", lambda image, key, arch: module)
    monkeypatch.setattr(module, "function", lambda name: cuda_driver.CudaFunction(module, name, 42))
    monkeypatch.setattr(triton_launch, "_stream_of", lambda: (lambda device: 1000 + device))
    kernel((5,), [0x7000, 0x8000, 1234, 0.5, -(1 << 40)], 1)
    (call,) = fake.launches
    handle, gx, gy, gz, bx, by, bz, shared, stream, values, extra = call
    assert (handle, (gx, gy, gz), (bx, by, bz), stream, extra) == (42, (5, 1, 1), (64, 1, 1), 1001, None)
    assert shared == kernel.plan.shared and scratch >= 1
    assert values == [0x7000, 0x8000, 1234, 0.5, -(1 << 40), *[None] * scratch]
    kernel((0,), [0x7000, 0x8000, 0, 0.5, 0], 1)  # an empty grid launches nothing
    assert len(fake.launches) == 1
    with pytest.raises(ValueError, match="grid"):
        kernel((1, 2, 3, 4), [0x7000, 0x8000, 1, 0.5, 0], 1)
