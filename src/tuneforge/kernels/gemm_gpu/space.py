"""Which Triton GEMM configurations to try: limits of the device, `fits`, and the default and exhaustive spaces.

Configurations that cannot run (shared memory over the opt-in limit, too many threads, an accumulator
that would spill) are filtered here, before anything is compiled.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from tuneforge.dataclass_lite import dataclass
from tuneforge.kernels.gemm_gpu.render import DTYPES, Config, tiles

# Registers a thread needs besides its fp32 accumulator fragment: operand fragments, addresses, loop state.
REG_OVERHEAD = 32
MIN_BLOCK = 16  # tl.dot's smallest tile edge

# Values the exhaustive space crosses; the default space only draws from these (so exhaustive ⊇ default).
BLOCKS_MN = (16, 32, 64, 128, 256)
BLOCKS_K = (16, 32, 64, 128)
GROUPS_M = (1, 8)
SPLITS_K = (1, 2, 4, 8, 16)
WARPS = (2, 4, 8)
STAGES = (2, 3, 4, 5)


@dataclass(frozen=True)
class DeviceLimits:
    name: str
    sm_count: int
    smem_per_block: int  # bytes, the opt-in maximum (cudaFuncAttributeMaxDynamicSharedMemorySize)
    regs_per_sm: int
    regs_per_thread: int  # the most one thread may use (255 on every recent NVIDIA GPU)
    max_threads_per_block: int
    capability: tuple[int, int]
    l2_bytes: int

    @classmethod
    def from_torch(cls, device: Any = None) -> DeviceLimits:
        """The limits of a CUDA device as torch reports them (needs a GPU)."""
        import torch

        props = torch.cuda.get_device_properties(device if device is not None else torch.cuda.current_device())
        optin = getattr(props, "shared_memory_per_block_optin", 0) or getattr(props, "shared_memory_per_block", 0)
        return cls(name=props.name, sm_count=props.multi_processor_count, smem_per_block=int(optin),
                   regs_per_sm=int(getattr(props, "regs_per_multiprocessor", 65536)), regs_per_thread=255,
                   max_threads_per_block=int(getattr(props, "max_threads_per_block", 1024)),
                   capability=(props.major, props.minor), l2_bytes=int(getattr(props, "L2_cache_size", 0)))


H100_SXM = DeviceLimits("NVIDIA H100 80GB HBM3", sm_count=132, smem_per_block=227 * 1024, regs_per_sm=65536,
                        regs_per_thread=255, max_threads_per_block=1024, capability=(9, 0), l2_bytes=50 * 2**20)
A100_SXM = DeviceLimits("NVIDIA A100-SXM4-80GB", sm_count=108, smem_per_block=163 * 1024, regs_per_sm=65536,
                        regs_per_thread=255, max_threads_per_block=1024, capability=(8, 0), l2_bytes=40 * 2**20)


def _pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def smem_bytes(config: Config, dtype: str) -> int:
    """The pipelined A and B tiles in shared memory."""
    return (config.block_m * config.block_k + config.block_k * config.block_n) * DTYPES[dtype][2] * config.num_stages


def why_not(config: Config, dtype: str, limits: DeviceLimits) -> str | None:
    """Why `config` cannot run on `limits` (None: it fits)."""
    blocks = (config.block_m, config.block_n, config.block_k)
    if not all(_pow2(b) and b >= MIN_BLOCK for b in blocks):
        return f"block sizes must be powers of two >= {MIN_BLOCK}: {blocks}"
    if config.group_m < 1 or config.split_k < 1 or config.num_stages < 1 or not _pow2(config.num_warps):
        return "group_m, split_k and num_stages must be >= 1, num_warps a power of two"
    threads = config.num_warps * 32
    if threads > limits.max_threads_per_block:
        return f"{threads} threads > {limits.max_threads_per_block}"
    smem = smem_bytes(config, dtype)
    if smem > limits.smem_per_block:
        return f"shared memory {smem} B > {limits.smem_per_block} B"
    regs = config.block_m * config.block_n // threads + REG_OVERHEAD
    if regs > limits.regs_per_thread or regs * threads > limits.regs_per_sm:
        return f"about {regs} registers per thread for {threads} threads"
    return None


def fits(config: Config, dtype: str, limits: DeviceLimits) -> bool:
    return why_not(config, dtype, limits) is None


def _cap(size: int, choices: tuple[int, ...]) -> int:
    """The smallest choice covering `size`, or the largest: a tile far past the matrix only adds padding."""
    return next((c for c in choices if c >= size), choices[-1])


def _splits(config: Config, m: int, n: int, k: int, limits: DeviceLimits) -> list[int]:
    """Split-K factors worth trying: the output has too few tiles to fill the SMs, and K is long enough
    that every slice keeps at least 4 BLOCK_K steps."""
    count = tiles(config, m, n)
    if count * 2 > limits.sm_count or k < 1024:
        return []
    wanted = [s for s in SPLITS_K[1:] if count * s <= 2 * limits.sm_count and k // s >= 4 * config.block_k]
    return wanted[-2:]


def _candidates(m: int, n: int, k: int, dtype: str) -> list[tuple[int, int, int, int, int]]:
    """(BM, BN, BK, warps, stages) by shape: the well-known large tiles, smaller ones for small or skinny shapes."""
    wide = DTYPES[dtype][2] == 2
    bk = 64 if wide else 32
    if m <= 64:  # skinny: a tall tile would mostly multiply padding; stream B with wide, deep tiles
        bm = _cap(m, BLOCKS_MN[:3])
        return [(bm, 64, 2 * bk, 4, 4), (bm, 128, bk, 4, 4), (bm, 128, 2 * bk, 4, 3), (bm, 256, bk, 4, 3),
                (bm, 64, bk, 4, 5), (bm, 32, 2 * bk, 2, 4)]
    out = [(128, 256, bk, 8, 3), (256, 128, bk, 8, 3), (128, 128, bk, 4, 4), (128, 128, bk, 8, 3),
           (128, 128, bk, 4, 3), (128, 64, bk, 4, 4), (64, 128, bk, 4, 4), (128, 128, 2 * bk, 8, 3),
           (64, 64, bk, 4, 5)]
    if wide and m * n <= 4096 * 1024:
        # A few waves of tiles and a short K (3000x1000x700 on an H200: Inductor's best were 64x128x32 and
        # 128x128x32, 1.4x cuBLAS): half-depth K steps, more tiles in flight per SM.
        out += [(64, 128, bk // 2, 4, 3), (128, 128, bk // 2, 4, 3), (128, 64, bk // 2, 4, 3)]
    if m * n <= 1024 * 1024:  # few output tiles: smaller tiles to fill the SMs
        out += [(64, 64, 2 * bk, 4, 3), (64, 32, bk, 4, 4), (32, 64, bk, 4, 4)]
    return out


def default_space(m: int, n: int, k: int, dtype: str, limits: DeviceLimits) -> list[Config]:
    """A dozen or so configurations for this shape that fit the device, best guesses first."""
    configs: dict[Config, None] = {}
    for bm, bn, bk, warps, stages in _candidates(m, n, k, dtype):
        bm, bn, bk = _cap(bm if m > bm else m, BLOCKS_MN), _cap(min(bn, n), BLOCKS_MN), _cap(min(bk, k), BLOCKS_K)
        base = Config(bm, bn, bk, group_m=8, split_k=1, num_warps=warps, num_stages=stages)
        for split in (1, *_splits(base, m, n, k, limits)):
            # A pipeline too deep for this device's shared memory: the same tiles with fewer stages
            # (a 48 KiB or 99 KiB part would otherwise get no configuration at all for large tiles).
            config = next((c for depth in range(stages, STAGES[0] - 1, -1)
                           if fits(c := Config(bm, bn, bk, 8, split, warps, depth), dtype, limits)), None)
            if config is not None:
                configs[config] = None
    return list(configs)[:16]


def exhaustive_space(m: int, n: int, k: int, dtype: str, limits: DeviceLimits) -> Iterator[Config]:
    """The cross product of every tunable, without tiles past the matrix's size (they only add padding),
    split-K slices shorter than one BLOCK_K step, or configurations that do not fit."""
    for bm, bn, bk, group, split, warps, stages in itertools.product(BLOCKS_MN, BLOCKS_MN, BLOCKS_K, GROUPS_M,
                                                                      SPLITS_K, WARPS, STAGES):
        if bm > _cap(m, BLOCKS_MN) or bn > _cap(n, BLOCKS_MN) or bk > _cap(k, BLOCKS_K):
            continue
        if split > 1 and split * bk > k:
            continue
        config = Config(bm, bn, bk, group, split, warps, stages)
        if fits(config, dtype, limits):
            yield config
