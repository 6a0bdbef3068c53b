"""The GEMM kernels' own thread pool (kernels/gemm/pool.cpp): correct on any number of threads and chunks, from
several Python threads at once and after a fork; no OpenMP runtime in the process; OMP_WAIT_POLICY obeyed."""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tuneforge import config
from tuneforge.cpuinfo import cpu_info
from tuneforge.kernels.gemm import Problem, default_space
from tuneforge.kernels.gemm.space import small_m_space
from tuneforge.kernels.gemm.template import NO_AHEAD, SMALL_M, TEMPLATE, static_args
from tuneforge.tune.template import KernelTemplate

from .conftest import run_python

Kernel = Callable[[np.ndarray, np.ndarray, np.ndarray, dict[str, Any]], None]


@pytest.fixture(scope="module")
def kernels_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    root = tmp_path_factory.mktemp("gemm-threads")
    with config.patch(cache_dir=root):
        yield root


def compiled(template: KernelTemplate, config_: dict[str, Any]) -> Kernel:
    """A kernel whose run-time parameters (blocking, threads, par) each call may choose."""
    choice = template.choices([config_])[0]
    kernel = choice.kernel()

    def call(a: np.ndarray, b: np.ndarray, out: np.ndarray, runtime: dict[str, Any]) -> None:
        kernel(*static_args(a, b, out, {**config_, **runtime}), 1.0, 0.0, a, b, out, None)

    return call


def operands(m: int, n: int, k: int, dtype: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)


def check(kernel: Kernel, m: int, n: int, k: int, dtype: str, runtime: dict[str, Any], seed: int = 0) -> None:
    a, b = operands(m, n, k, dtype, seed)
    out = np.full((m, n), np.nan, dtype=dtype)
    kernel(a, b, out, runtime)
    tol = 1e-4 if dtype == "float32" else 1e-10
    np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=tol, atol=tol * np.sqrt(k),
                               err_msg=f"{m}x{n}x{k} {dtype} {runtime}")


@pytest.fixture(scope="module")
def blocked(kernels_dir: Path) -> Kernel:
    """The five-loop kernel, fp64, packing A and B (the path with a packed-B phase before each block)."""
    p = Problem(96, 80, 70, "float64")
    config_ = next(c for c in default_space(p, threads=2) if c["PACK_A"] and c["PACK_B"])
    return compiled(TEMPLATE, config_)


@pytest.fixture(scope="module")
def few_rows(kernels_dir: Path) -> Kernel:
    p = Problem(5, 300, 257, "float32")
    return compiled(SMALL_M, small_m_space(p, cpu_info(), 2)[0])


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
@pytest.mark.parametrize("par", [0, 1])
def test_blocked_kernel_any_threads_and_chunks(blocked: Kernel, threads: int, par: int) -> None:
    # Small blocks: many chunks per phase (more than threads), edges in every dimension.
    for mc, kc, nc in ((8, 16, 16), (200, 200, 200), (1, 7, 1)):
        check(blocked, 97, 83, 71, "float64", {"MC": mc, "KC": kc, "NC": nc, "threads": threads, "par": par})


@pytest.mark.parametrize("threads", [2, 3, 5])
@pytest.mark.parametrize("par", [0, 1])
def test_blocked_kernel_after_the_workers_slept(blocked: Kernel, threads: int, par: int) -> None:
    # Workers asleep for milliseconds wake late: a call with fewer than 4 chunks a thread then cuts each block's
    # slivers into more parts (kernel.cpp.j2, LATE_CHUNKS), down to one sliver a chunk, edges included.
    for m, n, mc, nc in ((97, 83, 200, 200), (40, 300, 16, 128), (5, 9, 8, 8), (97, 83, 50, 30)):
        time.sleep(0.02)  # the pool's workers sleep after 5 ms without work (pool.cpp's SPIN_NS)
        check(blocked, m, n, 71, "float64", {"MC": mc, "KC": 32, "NC": nc, "threads": threads, "par": par})


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize(("par", "mc"), [(0, 16), (1, 48)])
def test_prefetching_the_next_b_block_changes_no_result(kernels_dir: Path, threads: int, par: int, mc: int) -> None:
    # Few rows of A and a B of 8 MiB or more: the kernel prefetches each next block of B while it computes one, on
    # the shared path (par 0: three blocks of rows) and on the private-columns one (par 1, one block); with the
    # NO_AHEAD bit it does not. Same bits either way and right, with edges in every dimension and B a view with
    # padded rows.
    p = Problem(40, 1100, 1030, "float64")
    config_ = {**next(c for c in default_space(p, threads=2) if c["PACK_A"] and c["PACK_B"]),
               "MC": mc, "KC": 200, "NC": 104, "threads": threads, "par": par}
    kernel = TEMPLATE.choices([config_])[0].kernel()
    rng = np.random.default_rng(5)
    a = rng.standard_normal((40, 1030))
    b = rng.standard_normal((1032, 1107))[1:-1, 4:-3]
    assert b.nbytes >= 8 << 20
    results = []
    for bits in (0, NO_AHEAD):
        out = np.full((40, 1100), np.nan)
        *head, mode = static_args(a, b, out, config_)
        kernel(*head, mode | bits, 1.0, 0.0, a, b, out, None)
        results.append(out)
    np.testing.assert_allclose(results[0], a @ b, rtol=1e-10, atol=1e-9)
    assert np.array_equal(results[0], results[1])


@pytest.mark.parametrize("threads", [1, 2, 3, 5])
@pytest.mark.parametrize("par", [0, 1])
def test_few_rows_kernel_any_threads_and_chunks(few_rows: Kernel, threads: int, par: int) -> None:
    for m, nb in ((1, 64), (5, 48), (13, 1000)):
        check(few_rows, m, 300, 257, "float32", {"NC": nb, "threads": threads, "par": par})


def test_depth_split_is_deterministic(few_rows: Kernel) -> None:
    # Partial sums are added in part order, whichever thread made each: bitwise equal results on every run.
    a, b = operands(3, 500, 4001, "float32", seed=3)
    first = np.empty((3, 500), np.float32)
    few_rows(a, b, first, {"NC": 500, "threads": 2, "par": 1})
    for _ in range(20):
        again = np.empty_like(first)
        few_rows(a, b, again, {"NC": 500, "threads": 2, "par": 1})
        assert np.array_equal(first, again)


def test_concurrent_callers(blocked: Kernel, few_rows: Kernel) -> None:
    """Calls release the GIL: Python threads calling the kernels at once share one pool (a caller finding it
    busy works alone) and all get correct results."""
    errors: list[BaseException] = []
    start = threading.Barrier(6)

    def caller(index: int) -> None:
        try:
            start.wait()
            for round_ in range(15):
                if index % 2:
                    blocking = {"MC": 8, "KC": 16, "NC": 16, "threads": 2, "par": index % 4 // 2}
                    check(blocked, 60, 50, 40, "float64", blocking, seed=index * 100 + round_)
                else:
                    check(few_rows, 4, 300, 257, "float32", {"NC": 64, "threads": 2 + index % 3, "par": round_ % 2},
                          seed=index * 100 + round_)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads), "a caller hung"
    assert not errors, errors[0]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_fork_after_parallel_call(few_rows: Kernel) -> None:
    """The workers do not survive a fork: the child's pool starts afresh instead of waiting for them."""
    check(few_rows, 5, 300, 257, "float32", {"NC": 64, "threads": 2, "par": 0})
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        status = 1
        try:
            check(few_rows, 5, 300, 257, "float32", {"NC": 64, "threads": 2, "par": 0})
            check(few_rows, 5, 300, 257, "float32", {"NC": 300, "threads": 2, "par": 1})
            status = 0
        finally:
            os.write(w, bytes([status]))
            os._exit(status)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    assert os.read(r, 1) == b"\x00"
    assert os.waitstatus_to_exitcode(status) == 0


_CHILD = """
import time
import numpy as np
import tuneforge
from tuneforge.kernels.gemm import Problem
from tuneforge.kernels.gemm.space import small_m_space
from tuneforge.kernels.gemm.template import SMALL_M, static_args
from tuneforge.cpuinfo import cpu_info
config = dict(small_m_space(Problem(2, 512, 512, "float32"), cpu_info(), 2)[0], threads=2, par=0, NC=256)
kernel = SMALL_M.choices([config])[0].kernel()
a, b = np.ones((2, 512), np.float32), np.ones((512, 512), np.float32)
out = np.empty((2, 512), np.float32)
args = static_args(a, b, out, config)
kernel(*args, 1.0, 0.0, a, b, out, None)
assert (out == 512).all()
if MODE == "maps":
    print("libgomp" in open("/proc/self/maps").read(), "libomp" in open("/proc/self/maps").read())
elif MODE == "affinity":  # the process's CPUs, then each worker's: all of them but the caller's
    import os
    print(len(os.sched_getaffinity(0)))
    for task in sorted(int(t) for t in os.listdir("/proc/self/task")):
        if open(f"/proc/self/task/{task}/comm").read().strip() == "tuneforge-pool":
            print(task, len(os.sched_getaffinity(task)), os.sched_getaffinity(task) <= os.sched_getaffinity(0))
else:  # the workers' CPU time while the process sleeps between calls: their idle spinning
    hog = None
    if MODE == "crowded":  # a busy process on the one CPU the workers may use (the caller keeps CPU 0)
        import os, subprocess, sys
        hog = subprocess.Popen([sys.executable, "-c", "while True: pass"],
                               preexec_fn=lambda: os.sched_setaffinity(0, {1}))
        time.sleep(0.2)
    busy = 0.0
    for _ in range(20):
        kernel(*args, 1.0, 0.0, a, b, out, None)
        before = time.process_time() - time.thread_time()
        time.sleep(0.03)
        busy += time.process_time() - time.thread_time() - before
    if hog is not None:  # how often the busy process lost its CPU meanwhile (to a worker scheduled in)
        status = open(f"/proc/{hog.pid}/status").read()
        hog.kill()
        busy = int(status.split("nonvoluntary_ctxt_switches:")[1].split()[0])
    print(busy)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_kernels_bring_no_openmp_runtime(kernels_dir: Path) -> None:
    """A kernel's threads are tuneforge's own: no OpenMP runtime whose spinning threads could fight OpenBLAS's."""
    proc = run_python("MODE = 'maps'\n" + _CHILD, env={"TUNEFORGE_CACHE_DIR": str(kernels_dir)}, timeout=300)
    assert proc.stdout.split() == ["False", "False"]


@pytest.mark.skipif(not sys.platform.startswith("linux") or len(os.sched_getaffinity(0)) < 2,
                    reason="thread affinity on Linux, with two CPUs or more")
def test_workers_are_kept_off_the_callers_cpu(kernels_dir: Path) -> None:
    """A woken worker could land on the caller's CPU and wait there for a time slice (the call then runs at one
    thread's speed): each worker may run on every CPU of the process but one, the caller's."""
    proc = run_python("MODE = 'affinity'\n" + _CHILD, env={"TUNEFORGE_CACHE_DIR": str(kernels_dir)}, timeout=300)
    lines = proc.stdout.split("\n")
    cpus = int(lines[0])
    workers = [line.split() for line in lines[1:] if line.strip()]
    assert workers, proc.stdout
    assert all(int(count) == cpus - 1 and subset == "True" for _, count, subset in workers), proc.stdout


def idle_spin_seconds(kernels_dir: Path, policy: str | None, mode: str = "spin") -> float:
    env = {"TUNEFORGE_CACHE_DIR": str(kernels_dir)}
    code = f"MODE = {mode!r}\n" + ("import os\nos.sched_setaffinity(0, {0, 1})\n" if mode == "crowded" else "") + _CHILD
    if policy is None:
        code = "import os\nos.environ.pop('OMP_WAIT_POLICY', None)\n" + code
    else:
        env["OMP_WAIT_POLICY"] = policy
    return float(run_python(code, env=env, timeout=300).stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="futex sleep on Linux only")
def test_wait_policy_from_the_environment(kernels_dir: Path) -> None:
    """Idle workers spin 5 ms by default, then sleep (20 sleeps of 30 ms: up to 100 ms of CPU); a user's
    OMP_WAIT_POLICY=active makes them spin 0.2 s (through every sleep: up to 600 ms), passive sleep at once."""
    active = default = 0.0
    for _ in range(3):  # a worker spins on the CPU that is not the caller's: a busy host can take it away
        active = max(active, idle_spin_seconds(kernels_dir, "active"))
        default = max(default, idle_spin_seconds(kernels_dir, None))
        if active > 0.3 and default > 0.02:
            break
    passive = idle_spin_seconds(kernels_dir, "passive")
    assert active > 0.3 and default > 0.02, (default, active)
    assert default < active / 3 and passive < default / 3, (passive, default, active)


@pytest.mark.skipif(not sys.platform.startswith("linux") or not {0, 1} <= os.sched_getaffinity(0),
                    reason="thread affinity on Linux, with CPUs 0 and 1")
def test_a_spinning_worker_sleeps_once_another_thread_needs_its_core(kernels_dir: Path) -> None:
    """An idle worker yields its core while it spins; once a yield gave the core away (to a busy process on it), it
    sleeps at once instead of coming back after every time slice for the rest of its spin. Counted as the busy
    process's lost CPU turns over 20 calls 30 ms apart: with OMP_WAIT_POLICY=active's 0.2 s spin 45-49 here, with
    passive's none 24-26, and 158 where a worker kept spinning."""
    passive = idle_spin_seconds(kernels_dir, "passive", mode="crowded")
    active = min(idle_spin_seconds(kernels_dir, "active", mode="crowded") for _ in range(2))
    assert active < 2.5 * passive + 20, (active, passive)


_TWO_MODULES = """
import os
import numpy as np
from tuneforge.cpuinfo import cpu_info
from tuneforge.kernels.gemm import Problem, default_space
from tuneforge.tune import process_library
from tuneforge.kernels.gemm.space import small_m_space
from tuneforge.kernels.gemm.template import SMALL_M, TEMPLATE, static_args
if not SHARED:  # as where the library did not build: each module runs the pool linked into it
    process_library._loaded[TEMPLATE.process_library] = False
blocked = next(c for c in default_space(Problem(96, 80, 70, "float64"), threads=2) if c["PACK_A"])
few_rows = small_m_space(Problem(5, 300, 257, "float64"), cpu_info(), 2)[0]
for template, config, m in ((TEMPLATE, blocked, 96), (SMALL_M, few_rows, 5)):
    config = dict(config, threads=2, par=0, NC=16)
    kernel = template.choices([config])[0].kernel()
    a, b = np.random.rand(m, 257), np.random.rand(257, 300)
    out = np.full((m, 300), np.nan)
    for _ in range(3):
        kernel(*static_args(a, b, out, config), 1.0, 0.0, a, b, out, None)
        np.testing.assert_allclose(out, a @ b, rtol=1e-12)
tasks = os.listdir("/proc/self/task")
print(sum(open(f"/proc/self/task/{t}/comm").read().strip() == "tuneforge-pool" for t in tasks))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")
@pytest.mark.parametrize("shared", [True, False])
def test_kernel_modules_share_the_process_pool(kernels_dir: Path, shared: bool) -> None:
    """Two kernel modules' two-thread calls run on one worker thread, the process pool's (a module's own pool,
    spinning after its call, took a core from the next module's call); a module without it runs its own pool."""
    proc = run_python(f"SHARED = {shared}\n" + _TWO_MODULES, env={"TUNEFORGE_CACHE_DIR": str(kernels_dir)},
                      timeout=300)
    assert int(proc.stdout.split()[-1]) == (1 if shared else 2), proc.stdout
