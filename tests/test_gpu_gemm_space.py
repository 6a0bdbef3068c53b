"""The Triton GEMM configuration spaces against H100 and A100 limits (no GPU needed)."""

from __future__ import annotations

import pytest

from tuneforge.kernels.gemm_gpu import A100_SXM, H100_SXM, Config, DeviceLimits, default_space, exhaustive_space, fits
from tuneforge.kernels.gemm_gpu.space import smem_bytes, why_not

SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (16, 4096, 4096), (32, 8192, 8192), (4096, 14336, 4096),
          (3000, 1000, 700), (1, 8192, 8192), (8192, 8192, 128), (5, 130, 7)]
LIMITS = [H100_SXM, A100_SXM]


@pytest.mark.parametrize("limits", LIMITS, ids=lambda lim: lim.name)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_default_space_fits_and_is_in_exhaustive(shape: tuple[int, int, int], dtype: str,
                                                  limits: DeviceLimits) -> None:
    configs = default_space(*shape, dtype, limits)
    assert 4 <= len(configs) <= 16
    assert len(set(configs)) == len(configs)
    assert all(fits(c, dtype, limits) for c in configs), [why_not(c, dtype, limits) for c in configs]
    assert set(configs) <= set(exhaustive_space(*shape, dtype, limits))


def test_fits_rejects_what_cannot_run() -> None:
    good = Config(128, 128, 64, num_warps=4, num_stages=4)
    assert fits(good, "float16", H100_SXM)
    big_smem = Config(256, 256, 128, num_warps=8, num_stages=4)  # 512 KiB of pipelined tiles
    assert smem_bytes(big_smem, "float16") > H100_SXM.smem_per_block
    assert "shared memory" in (why_not(big_smem, "float16", H100_SXM) or "")
    # 128x128x128 fp16 with 3 stages: 192 KiB, under H100's 227 KiB but over A100's 163 KiB
    mid = Config(128, 128, 128, num_warps=8, num_stages=3)
    assert fits(mid, "float16", H100_SXM) and not fits(mid, "float16", A100_SXM)
    assert not fits(mid, "float32", H100_SXM)  # the same tiles in fp32 take twice the bytes
    assert "threads" in (why_not(Config(64, 64, 32, num_warps=64), "float16", H100_SXM) or "")
    assert "registers" in (why_not(Config(256, 256, 32, num_warps=4, num_stages=2), "float16", H100_SXM) or "")
    assert not fits(Config(8, 64, 32), "float16", H100_SXM)  # below tl.dot's 16
    assert not fits(Config(48, 64, 32), "float16", H100_SXM)  # not a power of two
    assert not fits(Config(64, 64, 32, num_warps=3), "float16", H100_SXM)


def test_skinny_m_gets_small_tiles_and_split_k() -> None:
    configs = default_space(16, 4096, 4096, "float16", H100_SXM)
    assert {c.block_m for c in configs} == {16}
    assert any(c.split_k > 1 for c in configs)
    # every split leaves each slice at least 4 BLOCK_K steps and keeps the grid within 2 waves
    for c in configs:
        assert 4096 // c.split_k >= 4 * c.block_k
        assert (4096 // c.block_n) * c.split_k <= 2 * H100_SXM.sm_count
    assert {c.block_m for c in default_space(1, 8192, 8192, "bfloat16", H100_SXM)} == {16}
    assert {c.block_m for c in default_space(32, 8192, 8192, "float16", H100_SXM)} == {32}


def test_large_shapes_get_large_tiles_and_no_split_k() -> None:
    configs = default_space(4096, 4096, 4096, "float16", H100_SXM)
    assert max(c.block_m * c.block_n for c in configs) >= 128 * 256
    assert all(c.split_k == 1 for c in configs)
    assert all(c.block_k <= 128 for c in default_space(8192, 8192, 128, "float16", H100_SXM))


def test_tiny_shapes_never_get_tiles_far_past_the_matrix() -> None:
    for c in default_space(5, 130, 7, "float32", A100_SXM):
        assert c.block_m == 16 and c.block_k == 16 and c.block_n <= 256 and c.split_k == 1


def test_exhaustive_filters_by_fits_and_shape() -> None:
    configs = list(exhaustive_space(4096, 4096, 4096, "float32", A100_SXM))
    assert len(configs) > 1000
    assert all(fits(c, "float32", A100_SXM) for c in configs)
    small = list(exhaustive_space(20, 40, 24, "float16", H100_SXM))
    assert small and all(c.block_m <= 32 and c.block_n <= 64 and c.block_k <= 32 for c in small)
    assert all(c.split_k * c.block_k <= 24 or c.split_k == 1 for c in small)


def test_config_names_are_stable_and_distinct() -> None:
    assert Config(128, 64, 32, 8, 1, 4, 3).name == "128x64x32_g8_k1_w4_s3"
    configs = list(exhaustive_space(512, 512, 512, "float16", H100_SXM))
    assert len({c.name for c in configs}) == len(configs)
    assert Config(16, 16, 16, split_k=2).kernels == ("splitk", "splitk_reduce")


@pytest.mark.gpu
def test_limits_from_torch_on_a_gpu() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    limits = DeviceLimits.from_torch()
    assert limits.sm_count > 0 and limits.smem_per_block >= 48 * 1024 and limits.capability >= (7, 0)
    assert default_space(4096, 4096, 4096, "float16", limits)


def test_a_small_shared_memory_gets_shallower_pipelines_not_nothing() -> None:
    from dataclasses import replace

    small = replace(H100_SXM, name="48 KiB", smem_per_block=48 * 1024)
    configs = default_space(4096, 4096, 4096, "float16", small)
    assert configs and all(fits(c, "float16", small) for c in configs)
    assert min(c.num_stages for c in configs) < min(c.num_stages for c in default_space(4096, 4096, 4096, "float16",
                                                                                      H100_SXM))
