"""float32 products on CUDA: the setting cuda.fp32_precision (ieee, tf32, tf32x3, or torch's own flag)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the GPU GEMM takes torch tensors")

import torch

from tuneforge import config
from tuneforge.errors import ConfigError
from tuneforge.kernels.gemm_gpu.op import cublas_choice, fp32_precision, gpu_choices, op_name
from tuneforge.kernels.gemm_gpu.render import Epilogue
from tuneforge.kernels.gemm_gpu.space import H100_SXM


@pytest.fixture
def torch_tf32() -> object:
    saved = torch.backends.cuda.matmul.allow_tf32
    yield torch.backends.cuda.matmul
    torch.backends.cuda.matmul.allow_tf32 = saved


def test_the_default_follows_torchs_flag_and_an_explicit_setting_wins(torch_tf32: object) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    assert fp32_precision() == "ieee"
    torch.backends.cuda.matmul.allow_tf32 = True
    assert fp32_precision() == "tf32"
    for value in ("ieee", "tf32x3", "tf32"):
        with config.patch({"cuda.fp32_precision": value}):
            assert fp32_precision() == value


def test_an_unknown_precision_names_the_setting_and_the_choices() -> None:
    with pytest.raises(ConfigError, match=r"cuda\.fp32_precision.*torch, ieee, tf32, tf32x3"), \
            config.patch({"cuda.fp32_precision": "fp16"}):
        pass


def test_each_precision_is_a_decision_of_its_own() -> None:
    assert op_name(0.0, None) == "gemm" and op_name(0.0, None, precision="tf32") == "gemm_tf32"
    assert op_name(1.0, object(), "relu", "tf32x3") == "gemm_beta_bias_relu_tf32x3"
    ieee = gpu_choices(512, 512, 512, "float32", Epilogue(precision="ieee"), H100_SXM)
    tf32 = gpu_choices(512, 512, 512, "float32", Epilogue(precision="tf32"), H100_SXM)
    assert ieee[0].hash_key != tf32[0].hash_key  # cuBLAS with and without TF32
    assert {c.hash_key for c in ieee[1:]}.isdisjoint(c.hash_key for c in tf32[1:])
    assert cublas_choice("none", "tf32x3").hash_key == ieee[0].hash_key  # no cuBLAS tf32x3: IEEE is closest
    fp16 = gpu_choices(512, 512, 512, "float16", Epilogue(precision="tf32"), H100_SXM)
    assert fp16[0].hash_key == gpu_choices(512, 512, 512, "float16", Epilogue(), H100_SXM)[0].hash_key


def test_the_cublas_reference_sets_tf32_for_its_call_only(torch_tf32: object) -> None:
    seen: list[bool] = []
    real_mm = torch.mm

    def watching_mm(*args: object, **kwargs: object) -> object:
        seen.append(torch.backends.cuda.matmul.allow_tf32)
        return real_mm(*args, **kwargs)

    a, b = torch.randn(8, 16), torch.randn(16, 4)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.mm = watching_mm  # type: ignore[assignment]
    try:
        tf32, ieee = cublas_choice("none", "tf32"), cublas_choice("none", "ieee")
        out = torch.empty(8, 4)
        tf32.run([a, b, 1.0, 0.0, None, out])
        ieee.run([a, b, 1.0, 0.0, None, out])
        torch.backends.cuda.matmul.allow_tf32 = True
        ieee.run([a, b, 1.0, 0.0, None, out])
    finally:
        torch.mm = real_mm  # type: ignore[assignment]
    assert seen == [True, False, False]
    assert torch.backends.cuda.matmul.allow_tf32 is True  # the caller's flag, restored
    torch.testing.assert_close(out, a @ b)
