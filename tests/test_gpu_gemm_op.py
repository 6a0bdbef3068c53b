"""The GPU GEMM op: its choices (composition, keys, pickling, builds), selection among them under Triton's
interpreter on CPU tensors, routing of tuneforge.gemm, and `tuneforge tune gemm --device cuda`.

Selection runs in a child process started with TRITON_INTERPRET=1 (Triton decides at import whether it
interprets), as in test_triton_template.py. The GPU test proper is marked gpu and skips without one.
"""

from __future__ import annotations

import json
import pickle
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="the GPU GEMM takes torch tensors")

from tuneforge.errors import TemplateError
from tuneforge.kernels.gemm_gpu import (
    A100_SXM,
    H100_SXM,
    Config,
    DeviceLimits,
    Epilogue,
    GemmLayout,
    GemmTritonChoice,
    fits,
    gpu_choices,
)
from tuneforge.tune.choices import ExternChoice

from .conftest import run_python

SMALL = DeviceLimits("small", sm_count=24, smem_per_block=99 * 1024, regs_per_sm=65536, regs_per_thread=255,
                     max_threads_per_block=1024, capability=(8, 9), l2_bytes=32 * 2**20)


def configs(choices: list[Any]) -> list[Config]:
    return [c.gemm_config for c in choices if isinstance(c, GemmTritonChoice)]


def _has_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


# --- choices ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("limits", [H100_SXM, A100_SXM, SMALL], ids=lambda lim: lim.name)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("space", ["default", "exhaustive"])
def test_choices_are_cublas_then_configurations_that_fit(limits: DeviceLimits, dtype: str, space: str) -> None:
    shape = (512, 384, 1024) if space == "exhaustive" else (4096, 4096, 4096)
    choices = gpu_choices(*shape, dtype, Epilogue(bias=True, activation="relu"), limits, space)
    cublas, *triton = choices
    tf32 = {"tf32": True} if dtype == "float32" else {}  # Epilogue's default precision: tf32 products for fp32
    assert isinstance(cublas, ExternChoice) and cublas.name == "cublas"
    assert cublas.params == {"activation": "relu", **tf32}
    assert triton and all(isinstance(c, GemmTritonChoice) for c in triton)
    assert all(fits(c, dtype, limits) for c in configs(triton))
    assert len({c.hash_key for c in choices}) == len(choices)


def test_a_smaller_device_filters_what_the_h100_takes() -> None:
    big = set(configs(gpu_choices(4096, 4096, 4096, "float32", Epilogue(), H100_SXM)))
    small = set(configs(gpu_choices(4096, 4096, 4096, "float32", Epilogue(), SMALL)))
    assert all(fits(c, "float32", SMALL) for c in small)
    # fp32 128x256x32 tiles with 3 stages need 144 KiB of shared memory: on the small device the same
    # tiles come with a shallower pipeline instead.
    assert small - big and all(replace(c, num_stages=1) in {replace(b, num_stages=1) for b in big} for c in small)
    assert all(any(replace(c, num_stages=s) in big for s in range(c.num_stages + 1, 6)) for c in small - big)


@pytest.mark.parametrize("shape", [(16, 4096, 8192), (32, 2048, 16384), (64, 1024, 8192)])
def test_skinny_large_k_shapes_get_split_k_on_an_h100(shape: tuple[int, int, int]) -> None:
    found = configs(gpu_choices(*shape, "bfloat16", Epilogue(), H100_SXM))
    assert any(c.split_k > 1 for c in found) and any(c.split_k == 1 for c in found)


def test_square_shapes_get_no_split_k() -> None:
    found = configs(gpu_choices(4096, 4096, 4096, "float16", Epilogue(), H100_SXM))
    assert found and all(c.split_k == 1 for c in found)


def test_bad_requests_are_refused() -> None:
    with pytest.raises(ValueError, match="float64"):
        gpu_choices(64, 64, 64, "float64", Epilogue(), H100_SXM)
    with pytest.raises(ValueError, match="space"):
        gpu_choices(64, 64, 64, "float16", Epilogue(), H100_SXM, "huge")
    with pytest.raises(TemplateError, match="activation"):
        Epilogue(activation="tanh")


SPLIT = Config(32, 64, 32, split_k=4, num_warps=4, num_stages=3)
MM = Config(64, 64, 32)


def test_hash_keys_are_stable_and_follow_what_runs() -> None:
    layout = GemmLayout.contiguous(64, 64, 512)
    base = GemmTritonChoice(MM, "float16", Epilogue(), layout)
    assert base.hash_key == GemmTritonChoice(MM, "float16", Epilogue(), layout).hash_key
    # the layout is only what is built ahead: the same code runs for another one
    assert base.hash_key == GemmTritonChoice(MM, "float16", Epilogue(), GemmLayout.contiguous(8, 8, 8)).hash_key
    others = [GemmTritonChoice(MM, "bfloat16", Epilogue(), layout),
              GemmTritonChoice(SPLIT, "float16", Epilogue(), layout),
              GemmTritonChoice(replace(MM, num_warps=8), "float16", Epilogue(), layout),
              GemmTritonChoice(MM, "float16", Epilogue(bias=True), layout),
              GemmTritonChoice(MM, "float16", Epilogue(activation="silu"), layout)]
    assert len({base.hash_key, *(c.hash_key for c in others)}) == 1 + len(others)
    assert base.family == others[1].family == "triton:gemm_gpu" and base.params == MM.as_dict()
    assert base.name == "triton_mm_64x64x32_g8_k1_w4_s3" and others[1].name.startswith("triton_splitk_")
    # a key computed in another process is the same
    other = run_python("""
        from tuneforge.kernels.gemm_gpu import Config, Epilogue, GemmLayout, GemmTritonChoice
        print(GemmTritonChoice(Config(64, 64, 32), "float16", Epilogue(), GemmLayout.contiguous(64, 64, 512)).hash_key)
    """).stdout.strip()
    assert other == base.hash_key


def test_choices_survive_pickling() -> None:
    choice = GemmTritonChoice(SPLIT, "float32", Epilogue(bias=True, beta=True, activation="gelu_tanh"),
                              GemmLayout.contiguous(30, 70, 900, bias=True))
    choice._kernels[("x",)] = object()  # what a process loaded stays there
    copy = pickle.loads(pickle.dumps(choice))
    assert (copy.hash_key, copy.name, copy.params, copy.family) == (choice.hash_key, choice.name, choice.params,
                                                                     choice.family)
    assert copy._kernels == {} and copy.layout == choice.layout and copy.epilogue == choice.epilogue


def test_builds_specialize_for_the_layout() -> None:
    pytest.importorskip("triton")
    from tuneforge.compile.triton import GpuTarget

    layout = GemmLayout.contiguous(48, 96, 1024, bias=True)
    choice = GemmTritonChoice(SPLIT, "float16", Epilogue(bias=True, activation="relu"), layout)
    builds = choice.triton_builds(target=GpuTarget(arch=90))
    assert list(builds) == ["splitk", "splitk_reduce"]
    partial = builds["splitk"]
    assert partial.constexprs["stride_ak"] == 1 and partial.constexprs["stride_bn"] == 1  # unit strides fixed
    assert partial.constexprs["SPLIT_K"] == 4 and partial.constexprs["EVEN_K"] == 1
    names = list(partial.signature)
    aligned = {names[i] for (i,) in partial.attrs}
    assert aligned == {"a_ptr", "b_ptr", "ws_ptr"}  # the sizes are constexprs: (M, N, K) = (48, 96, 1024)
    assert (partial.constexprs["M"], partial.constexprs["N"], partial.constexprs["K"]) == (48, 96, 1024)
    # a misaligned A and an odd M: no divisibility promised for A, and M is what it is
    odd = replace(layout, m=47, aligned=(False, True, True, True))
    odd_builds = choice.triton_builds(odd, GpuTarget(arch=90))
    names_attrs = {list(b.signature)[i] for b in odd_builds.values() for (i,) in b.attrs}
    assert "a_ptr" not in names_attrs and "b_ptr" in names_attrs and odd_builds["splitk"].constexprs["M"] == 47
    transposed = replace(layout, a_strides=(1, 48))
    assert choice.triton_builds(transposed, GpuTarget(arch=90))["splitk"].constexprs["stride_am"] == 1
    if not _has_gpu():  # building for this process's GPU: the choice's own failure, in its future
        from tuneforge.compile.triton import TritonBuildError

        with pytest.raises(TritonBuildError, match="no GPU"):
            choice.build().result()


def test_divisibility_attrs_reach_the_compiler_and_the_key(cache_dir: Path) -> None:
    pytest.importorskip("triton")
    from tuneforge.compile import triton as tb
    from tuneforge.compile.triton import GpuTarget

    choice = GemmTritonChoice(MM, "float16", Epilogue(), GemmLayout.contiguous(64, 64, 256))
    build = choice.triton_builds(target=GpuTarget(arch=90))["mm"]
    assert build.attrs
    bare = replace(build, attrs={})
    key, material = tb.artifact_key(build)
    bare_key, bare_material = tb.artifact_key(bare)
    assert key != bare_key and "attrs" in material and "attrs" not in bare_material
    assert hash(build) != hash(bare) and build != bare
    files = tb.kernel_files(build)  # compiled for sm_90, no GPU needed
    assert "tt.divisibility = 16" in files["kernel.ttir"].decode()
    assert "tt.divisibility = 16" not in tb.kernel_files(bare)["kernel.ttir"].decode()


@pytest.mark.parametrize(("attrs", "match"), [
    ([("tt.divisibility", 16)], "mapping"),
    ({0: [["tt.divisibility", 16]]}, "tuple of argument indices"),
    ({(99,): [["tt.divisibility", 16]]}, "tuple of argument indices"),
    ({(0,): ["tt.divisibility"]}, r"\[name, value\] pairs"),
])
def test_invalid_attrs_name_the_field(attrs: Any, match: str) -> None:
    pytest.importorskip("triton")
    from tuneforge.compile.triton import TritonBuild, TritonBuildError

    with pytest.raises(TritonBuildError, match=rf"^TritonBuild\.attrs.*{match}"):
        TritonBuild("x = 1", "k", {"x": "*fp32", "B": "constexpr"}, {"B": 1}, attrs=attrs)


# --- selection under the interpreter ---------------------------------------------------------------------------

WRONG = '''
from tuneforge.kernels.gemm_gpu import GemmTritonChoice


class WrongAlpha(GemmTritonChoice):
    """A configuration whose run scales by the wrong alpha: verification must catch it."""

    def __init__(self, *args):
        super().__init__(*args)
        self.name = "wrong_" + self.name
        self._hash = "wrong" + self._hash

    def run(self, args):
        a, b, alpha, beta, bias, out = args
        return super().run([a, b, alpha * 1.5, beta, bias, out])
'''

CHILD = '''
import json, os
assert os.environ["TRITON_INTERPRET"] == "1"
import torch
from tuneforge import config
from tuneforge.kernels.gemm_gpu import H100_SXM, Config, Epilogue, GemmLayout, GemmTritonChoice, cublas_choice
from tuneforge.kernels.gemm_gpu.op import op_name
from tuneforge.tune.select import select_detailed
import wrongchoice

case = json.loads(CASE)
m, n, k = case["shape"]
dtype = getattr(torch, case["dtype"])
ep = Epilogue(**case["epilogue"])
gen = torch.Generator().manual_seed(0)
a = torch.randn(k, m, generator=gen).to(dtype).t()  # column-major A
b = torch.randn(k, n, generator=gen).to(dtype)
bias = torch.randn(n, generator=gen).to(dtype) if ep.bias else None
out = torch.randn(m, n, generator=gen).to(dtype)
beta = 0.5 if ep.beta else 0.0
layout = GemmLayout.of(a, b, out, bias)
configs = [Config(**c) for c in case["configs"]]
choices = [GemmTritonChoice(c, case["dtype"], ep, layout) for c in configs]
wrong = wrongchoice.WrongAlpha(configs[0], case["dtype"], ep, layout)
reference = cublas_choice(ep.activation)
with config.patch(autotune_bench_time_s=0.01, autotune_warmup_s=0.0):
    selection = select_detailed(op_name(beta, bias, ep.activation), [reference, *choices, wrong],
                                [a, b, 1.0, beta, bias], out=out, reference=reference, accumulate=ep.beta)
expected = reference.fn(a.double(), b.double(), 0.75, beta, None if bias is None else bias.double(),
                        out.double().clone(), activation=ep.activation)
got = out.clone()
selection.choice.run([a, b, 0.75, beta, bias, got])
print(json.dumps({"winner": selection.choice.name, "source": selection.source,
                  "status": {r.choice_name: r.status for r in selection.records.values()},
                  "errors": {r.choice_name: r.error for r in selection.records.values() if r.error},
                  "error": float((got.double() - expected).abs().max())}))
'''


def _select(tmp_path: Path, case: dict[str, Any]) -> dict[str, Any]:
    pytest.importorskip("triton")
    (tmp_path / "wrongchoice.py").write_text(WRONG)
    proc = run_python(CHILD.replace("CASE", repr(json.dumps(case))),
                      env={"TRITON_INTERPRET": "1", "PYTHONPATH": str(tmp_path)}, timeout=600)
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("case", [
    {"shape": (37, 29, 83), "dtype": "float32", "epilogue": {"bias": True, "activation": "relu"},
     "configs": [{"block_m": 16, "block_n": 32, "block_k": 16}, {"block_m": 32, "block_n": 16, "block_k": 32,
                                                                "split_k": 3, "group_m": 2}]},
    {"shape": (19, 45, 70), "dtype": "float16", "epilogue": {"bias": True, "beta": True, "activation": "gelu_tanh"},
     "configs": [{"block_m": 16, "block_n": 16, "block_k": 32, "split_k": 2},
                 {"block_m": 32, "block_n": 32, "block_k": 16, "num_warps": 2}]},
], ids=["fp32-bias-relu", "fp16-bias-beta-gelu"])
def test_select_verifies_triton_choices_and_catches_a_wrong_one(cache_dir: Path, tmp_path: Path,
                                                               case: dict[str, Any]) -> None:
    result = _select(tmp_path, case)
    status = result["status"]
    assert len(status) == 4, result
    wrong = {name for name, s in status.items() if s == "wrong_result"}
    assert len(wrong) == 1 and next(iter(wrong)).startswith("wrong_triton_"), result
    assert all(s == "ok" for name, s in status.items() if name not in wrong), result
    assert any(name.startswith("triton_splitk_") for name in status) and "cublas" in status
    assert result["source"] == "tuned" and not result["winner"].startswith("wrong_")
    limit = 1e-3 if case["dtype"] == "float32" else 5e-2
    assert result["error"] <= limit, result  # the winner, called with another alpha, computes the op


# --- routing and the op's checks ---------------------------------------------------------------------------------

class CudaLooking:
    """Says it is on a CUDA device, and is nothing else: where tuneforge.gemm sends it shows the routing."""

    is_cuda = True
    ndim = 2
    shape = (4, 4)
    dtype = "float16"


def test_cuda_tensors_go_to_the_gpu_op_cpu_tensors_to_the_cpu_family(cache_dir: Path) -> None:
    import numpy as np
    import torch

    import tuneforge

    with pytest.raises(TypeError, match="gemm on CUDA takes torch tensors; a is a CudaLooking"):
        tuneforge.gemm(CudaLooking(), CudaLooking())  # out=None: the numpy path cannot allocate for it
    with pytest.raises(TypeError, match="gemm on CUDA takes torch tensors"):
        tuneforge.gemm(CudaLooking(), CudaLooking(), CudaLooking())
    cpu = torch.ones(4, 4)  # CPU tensors take the CPU family (tests/test_gemm_torch_cpu.py)
    torch.testing.assert_close(tuneforge.gemm(cpu, cpu), cpu @ cpu)
    with pytest.raises(TypeError, match="^gemm takes numpy arrays$"):
        tuneforge.gemm([[1.0]], [[1.0]], np.empty((1, 1)))
    a = np.ones((3, 5), dtype=np.float32)
    assert np.allclose(tuneforge.gemm(a, a.T.copy()), 5.0)  # numpy as before


def test_the_gpu_op_checks_its_arguments() -> None:
    import torch

    from tuneforge.kernels.gemm_gpu import gemm_cuda

    a = torch.ones(4, 8, dtype=torch.float16)
    with pytest.raises(ValueError, match="one CUDA device; a on cpu, b on cpu"):
        gemm_cuda(a, torch.ones(8, 4, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"A\[M,K\] and B\[K,N\]"):
        gemm_cuda(a, a)
    with pytest.raises(ValueError, match="one dtype"):
        gemm_cuda(a, torch.ones(8, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="beta != 0 needs an out"):
        gemm_cuda(a, a.t(), beta=1.0)
    with pytest.raises(TypeError, match="b is a list"):
        gemm_cuda(a, [[1.0]])


# --- the CLI -----------------------------------------------------------------------------------------------------

def test_tune_on_cuda_without_a_gpu_is_a_usage_error(cache_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    if _has_gpu():
        pytest.skip("this machine has a GPU")
    from tuneforge.cli import _status

    assert _status(["tune", "gemm", "--shape", "64x64x64", "--device", "cuda", "--dtype", "float16"]) == 2
    err = capsys.readouterr().err
    assert "--device cuda: no CUDA GPU here" in err and "Traceback" not in err
    assert _status(["tune", "gemm", "--shape", "64x64x64", "--dtype", "bfloat16"]) == 2
    assert "bfloat16 is for --device cuda" in capsys.readouterr().err
    assert _status(["tune", "matmul", "--shape", "64x64x64", "--device", "cuda"]) == 2
    assert "no GPU family" in capsys.readouterr().err
    assert _status(["tune", "gemm", "--shape", "64x64x64", "--device", "cuda", "--dtype", "float64"]) == 2


# --- on a GPU ---------------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_tuneforge_gemm_on_cuda_tensors(cache_dir: Path, dtype: str) -> None:
    if not _has_gpu():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    import torch

    import tuneforge
    from tuneforge.kernels.gemm_gpu import op

    torch_dtype = getattr(torch, dtype)
    a = torch.randn(300, 500, device="cuda", dtype=torch_dtype)
    b = torch.randn(500, 700, device="cuda", dtype=torch_dtype)
    out = tuneforge.gemm(a, b)
    tol = 1e-2 if dtype != "float32" else 1e-4
    torch.testing.assert_close(out, torch.mm(a, b), rtol=tol, atol=tol * 500 ** 0.5)
    tuned = dict(op._dispatch)
    again = torch.empty_like(out)
    assert tuneforge.gemm(a, b, again) is again and op._dispatch == tuned  # memoised: nothing tuned again
    torch.testing.assert_close(again, out)


@pytest.mark.gpu
def test_split_k_shape_with_epilogue_on_cuda(cache_dir: Path) -> None:
    if not _has_gpu():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    import torch

    from tuneforge.kernels.gemm_gpu import gemm_cuda

    a = torch.randn(16, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 1024, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(1024, device="cuda", dtype=torch.bfloat16)
    out = torch.randn(16, 1024, device="cuda", dtype=torch.bfloat16)
    expected = torch.nn.functional.silu(0.5 * (a.float() @ b.float()) + 2.0 * out.float() + bias.float())
    gemm_cuda(a, b, out, alpha=0.5, beta=2.0, bias=bias, activation="silu")
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2 * 8192 ** 0.5)


@pytest.mark.gpu
def test_a_warm_process_runs_the_tuned_kernels_without_triton_or_jinja(cache_dir: Path) -> None:
    """After one process tuned a shape, a fresh one finds the decision and launches the stored kernels
    by the keys its records kept: no Triton import, no template render, no compile."""
    if not _has_gpu():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    from .conftest import run_python

    code = """
        import json, sys, time, torch
        torch.manual_seed(0)
        a = torch.randn(3000, 700, device="cuda", dtype=torch.float16)
        b = torch.randn(700, 1000, device="cuda", dtype=torch.float16)
        torch.cuda.synchronize()
        started = time.perf_counter()
        import tuneforge
        out = tuneforge.gemm(a, b)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        error = float((out.float() - a.float() @ b.float()).norm() / (a.float() @ b.float()).norm())
        print(json.dumps({"s": seconds, "error": error, "triton": "triton" in sys.modules,
                          "jinja2": "jinja2" in sys.modules}))
    """
    cold = json.loads(run_python(code, timeout=600).stdout.strip().splitlines()[-1])
    warm = json.loads(run_python(code, timeout=120).stdout.strip().splitlines()[-1])
    assert cold["error"] < 1e-2 and warm["error"] < 1e-2
    assert not warm["triton"] and not warm["jinja2"], warm
    assert warm["s"] < cold["s"]


@pytest.mark.gpu
def test_a_warm_process_launches_a_recorded_triton_winner_without_importing_triton(cache_dir: Path) -> None:
    """The Triton configurations alone (cuBLAS may win the op's own selection, which would launch no
    kernel): a fresh process finds the recorded winner, checks its stored entry and launches it, and
    Triton is never imported (keying a build would import it: ~150 ms of a 50 ms budget)."""
    if not _has_gpu():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    from .conftest import run_python

    code = """
        import json, sys, time, torch
        a = torch.randn(512, 256, device="cuda", dtype=torch.float16)
        b = torch.randn(256, 384, device="cuda", dtype=torch.float16)
        out = torch.empty(512, 384, device="cuda", dtype=torch.float16)
        torch.cuda.synchronize()
        started = time.perf_counter()
        from tuneforge.kernels.gemm_gpu.op import device_limits, gpu_choices
        from tuneforge.kernels.gemm_gpu.render import Epilogue
        from tuneforge.tune.select import select
        triton_only = gpu_choices(512, 384, 256, "float16", Epilogue(), device_limits(0))[1:4]
        winner = select("gemm_triton_only", triton_only, [a, b, 1.0, 0.0, None], out=out)
        winner.run([a, b, 1.0, 0.0, None, out])
        torch.cuda.synchronize()
        error = float((out.float() - a.float() @ b.float()).norm() / (a.float() @ b.float()).norm())
        print(json.dumps({"s": time.perf_counter() - started, "error": error, "triton": "triton" in sys.modules,
                          "winner": winner.name}))
    """
    cold = json.loads(run_python(code, timeout=600).stdout.strip().splitlines()[-1])
    warm = json.loads(run_python(code, timeout=120).stdout.strip().splitlines()[-1])
    assert cold["triton"] and cold["winner"] == warm["winner"] and warm["winner"].startswith("triton_mm")
    assert cold["error"] < 1e-2 and warm["error"] < 1e-2
    assert not warm["triton"], warm
