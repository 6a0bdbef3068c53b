"""`tuneforge.prepare("cuda")` warms the build pool: each worker makes its first Triton compile ahead of the first
selection (compile/triton_warmup.py). Compiles for an explicit target (sm_90), which needs no GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("triton", reason="the warm-up compiles with Triton")

from tuneforge.compile.pool import BuildPool
from tuneforge.compile.triton_env import GpuTarget
from tuneforge.compile.triton_warmup import warm_build_pool
from tuneforge.store.default import default_store

from .conftest import cuda_torch


def test_every_worker_of_the_pool_makes_a_triton_compile_and_no_kernel_is_stored(cache_dir: Path) -> None:
    with BuildPool(2) as pool:
        futures = warm_build_pool(GpuTarget("cuda", 90, 32), pool)
        assert len(futures) == 2
        results = [f.result(timeout=120) for f in futures]
        assert all(r.compiled and r.key.startswith("warmup-") for r in results)
        assert len({r.key for r in results}) == 2  # two tasks, not one de-duplicated
        assert len(pool.worker_pids()) == 2  # started, one task each (two idle workers, two tasks)
    # No kernel is stored (only the small kernel's Python module, content-keyed, as every Triton build's source is)
    stored = [p.parent.name for p in (default_store().root / "entries").glob("*/*")]
    assert stored and all(kind == "py" for kind in stored), stored
    assert not any(Path(r.path).exists() for r in results)  # its scratch directory is gone


def test_without_a_gpu_prepare_warms_nothing_and_says_nothing(cache_dir: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    import tuneforge
    from tuneforge import config

    with config.patch(autotune_isolate=False), caplog.at_level("WARNING"):
        assert tuneforge.prepare("cuda:0", wait=True) is False  # no worker to start; no GPU to target
    assert not caplog.records


@pytest.mark.gpu
def test_prepare_warms_the_build_pool_for_the_gpu(cache_dir: Path) -> None:
    cuda_torch()
    import tuneforge
    from tuneforge.compile import triton_warmup
    from tuneforge.compile.pool import default_pool

    assert tuneforge.prepare("cuda", wait=True) is True
    pool = default_pool()
    assert pool.started and len(pool.worker_pids()) == pool.workers
    (warmed,) = triton_warmup._warming.values()
    assert len(warmed) == pool.workers and all(f.done() and f.exception() is None for f in warmed)
    tuneforge.prepare("cuda", wait=True)
    assert list(triton_warmup._warming.values()) == [warmed]  # once per process and target
