"""Locks a forked child gets back unlocked: the build pool forks workers while other threads hold locks."""

from __future__ import annotations

import os
import textwrap
import threading
from pathlib import Path

import pytest

from tuneforge.forksafe import ForkSafeLock


def _child_can_take(lock: ForkSafeLock) -> bool:
    pid = os.fork()
    if pid == 0:  # the child: exit 0 if the lock is free here
        os._exit(0 if lock.acquire(timeout=5) else 1)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == 0


@pytest.mark.parametrize("reentrant", [False, True])
def test_a_lock_held_by_another_thread_at_the_fork_is_free_in_the_child(reentrant: bool) -> None:
    lock = ForkSafeLock(reentrant=reentrant)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            held.set()
            release.wait(30)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10)
        assert not lock.acquire(timeout=0.05)  # held here, in the parent
        assert _child_can_take(lock)
    finally:
        release.set()
        holder.join()
    assert lock.acquire(timeout=1)  # and the parent's lock still works
    lock.release()


def test_a_build_worker_forked_while_a_generated_module_loads_can_load_one_itself(cache_dir: Path) -> None:
    """The build pool forks its workers from its own thread; here the main thread holds the lock of
    generated modules then (as it does while computing a Triton build's key). The worker's own Triton
    build needs that lock: with a plain lock it waited forever."""
    pytest.importorskip("triton", reason="a Triton build takes the generated-module lock in the worker")
    from tuneforge.compile import python as generated
    from tuneforge.compile.cpp import module_request
    from tuneforge.compile.pool import BuildPool
    from tuneforge.compile.triton import GpuTarget, TritonBuild

    source = textwrap.dedent("""\
        import triton
        import triton.language as tl


        @triton.jit
        def copy(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
            offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            tl.store(out_ptr + offsets, tl.load(x_ptr + offsets, mask=offsets < n), mask=offsets < n)
        """)
    triton_build = TritonBuild(source, "copy", {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32",
                                                "BLOCK": "constexpr"}, {"BLOCK": 128}, target=GpuTarget(arch=90))
    with BuildPool(1) as pool:
        with generated._lock:  # held while the pool forks its worker for the first build
            first = pool.submit(module_request('extern "C" int one(void) { return 1; }', functions=["int one(void)"]))
            first.result(timeout=120)
        result = pool.submit(triton_build).result(timeout=120)
    assert result.compiled and Path(result.path).read_bytes()[:4] == b"\x7fELF"
