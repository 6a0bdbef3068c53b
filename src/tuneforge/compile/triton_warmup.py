"""A build pool worker's first Triton compile, done ahead of the first selection (`tuneforge.prepare("cuda")`).

A process's first Triton compile costs far more than the next ones: importing triton, loading its compiler and
initialising LLVM come before the kernel's own work. Measured on the 2-core CI-like VM: a small kernel 0.67 s
the first time in a process, 0.06-0.07 s afterwards, after 0.26 s of `import triton`; a cold pool took 2.1-2.7 s
for three GEMM kernels its warm workers built in 1.15 s. A cold GPU selection's build phase (1.5-1.9 s on an H100
host, run 9) pays that in every worker before its first kernel. So `prepare` has each worker compile a small
kernel for the device's target in the background, into a scratch directory: no kernel is stored, in tuneforge's
store or in Triton's cache (only the small kernel's Python module, content-keyed, as every Triton build's is).
"""

from __future__ import annotations

import importlib.util
import logging
import os
import tempfile
import uuid
from concurrent.futures import Future, wait
from pathlib import Path
from typing import TYPE_CHECKING

from tuneforge.compile import builders
from tuneforge.compile.pool_worker import BuildResult
from tuneforge.compile.triton import TritonBuild, compile_into
from tuneforge.compile.triton_env import GpuTarget
from tuneforge.dataclass_lite import dataclass

if TYPE_CHECKING:
    from tuneforge.compile.pool import BuildPool

__all__ = ["TritonWarmup", "warm_build_pool", "warm_for_gpu"]

log = logging.getLogger("tuneforge.compile")

_SOURCE = """\
import triton
import triton.language as tl


@triton.jit
def tuneforge_warmup(a_ptr, b_ptr, c_ptr, BLOCK: tl.constexpr):
    # a tiled product's path through the compiler (tl.dot: the tensor-core lowering), as the GEMM kernels take it
    rows = tl.arange(0, BLOCK)[:, None] * BLOCK + tl.arange(0, BLOCK)[None, :]
    acc = tl.dot(tl.load(a_ptr + rows), tl.load(b_ptr + rows))
    tl.store(c_ptr + rows, acc.to(tl.float16))
"""


@dataclass(frozen=True)
class TritonWarmup:
    """One worker's warm-up compile for `target`; `nonce` makes each a task of its own (the pool de-duplicates
    builds by key)."""

    target: GpuTarget
    nonce: str


def _key(warmup: TritonWarmup) -> str:
    return f"warmup-{warmup.nonce}"


def _build(warmup: TritonWarmup) -> tuple[str, Path, bool]:
    signature = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "BLOCK": "constexpr"}
    build = TritonBuild(_SOURCE, "tuneforge_warmup", signature, {"BLOCK": 64}, num_warps=4, num_stages=3,
                        target=warmup.target)
    with tempfile.TemporaryDirectory(prefix="tuneforge-warmup-") as staging:
        compile_into(Path(staging), _key(warmup), build, warmup.target)
    return _key(warmup), Path(staging), True


builders.register(TritonWarmup, _key, _build)


def warm_build_pool(target: GpuTarget, pool: BuildPool | None = None) -> list[Future[BuildResult]]:
    """Start the workers of `pool` (default: the default build pool), each compiling a small kernel for `target`
    (not waited for; the futures say when they are done). Nothing where triton is not installed."""
    if importlib.util.find_spec("triton") is None:
        return []
    from tuneforge.compile.pool import default_pool

    pool = pool or default_pool()
    return [pool.submit(TritonWarmup(target, uuid.uuid4().hex), label="triton warm-up") for _ in range(pool.workers)]


_warming: dict[tuple[int, GpuTarget], list[Future[BuildResult]]] = {}  # (process, target) -> its warm-ups


def warm_for_gpu(index: int, *, block: bool = False) -> None:
    """`warm_build_pool` for CUDA device `index`'s target (torch's numbering), once per process and target; `block`:
    until the workers are warm. Nothing, but a debug line, where there is no torch or no such GPU: a selection on it
    says so."""
    from tuneforge.compile.triton_env import device_target

    try:
        target = device_target(index)
        futures = _warming.get((os.getpid(), target))
        if futures is None:
            futures = _warming[(os.getpid(), target)] = warm_build_pool(target)
    except Exception as exc:
        log.debug("no Triton warm-up for cuda:%d: %s", index, exc)
        return
    if block:
        wait(futures)
