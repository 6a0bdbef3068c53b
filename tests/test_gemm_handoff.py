"""The C dispatcher hands a multi-threaded kernel's plain calls to numpy.matmul while another thread of the
process is running (busy_threads.h, dispatch.cpp's plan): OpenBLAS's workers, spinning for ~0.1 s after each
numpy call, would take the cores the kernel's helpers need. Real numpy, real kernels, real threads."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from .conftest import run_python


def openblas_threads() -> int:
    import numpy  # noqa: F401  (threadpoolctl sees only the libraries loaded)
    from threadpoolctl import threadpool_info  # type: ignore[import-untyped]

    return max((p["num_threads"] for p in threadpool_info() if p.get("internal_api") == "openblas"), default=0)


pytestmark = [
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="threads' states are read from /proc"),
    pytest.mark.skipif(openblas_threads() < 2, reason="needs numpy on OpenBLAS with worker threads"),
]

def two_thread_kernel(library_ratio: float) -> str:
    """A child program's start: tuneforge.gemm tunes only its first two-thread kernel, and numpy's tuned time over
    the kernel's is `library_ratio` (what the hand-off first expects of numpy)."""
    return f"""
import time
import numpy as np
import tuneforge
from tuneforge.kernels.gemm import dispatch, op

everything = op.choices
op.choices = lambda problem, space="default", library="numpy": [
    c for c in everything(problem, space, library) if getattr(c, "config", {{}}).get("threads") == 2][:1]
op._library_ratio = lambda *args: {library_ratio!r}
"""


# numpy counts as fast as the kernel, so it takes the calls once the kernel has been tried beside the running
# threads, whatever this machine's timings (the kernel then takes 1.5-2.5x its best, on all its threads or on the
# one left free).
_CHILD = two_thread_kernel(1.0) + """
rng = np.random.default_rng(0)
a, b = rng.standard_normal((512, 512)).astype(np.float32), rng.standard_normal((512, 512)).astype(np.float32)
out, c = np.empty((512, 512), np.float32), np.zeros((512, 512), np.float32)
p, q, r = np.ones((64, 1024), np.float32), np.ones((1024, 64), np.float32), np.empty((64, 64), np.float32)
for _ in range(3):
    tuneforge.gemm(a, b, out)
fast = dispatch.wait(60)
tuneforge.gemm(a, b, out)  # registers the layout with the C dispatcher, now loaded
assert fast is not None and fast.size() == 1, fast
tuneforge.gemm(a, b, c, beta=1.0)  # tunes the beta != 0 layout too
c[:] = 0


def deferred_over(step, times):
    before = fast.deferred()
    for _ in range(times):
        step()
    return fast.deferred() - before


def gemm():
    tuneforge.gemm(a, b, out)


def side():  # a numpy matmul large enough for OpenBLAS to use its workers
    np.matmul(p, q, out=r)


time.sleep(1.0)  # OpenBLAS's workers, busy in tuning, go to sleep
idle = fast.busy_threads()
quiet = deferred_over(gemm, 100)
side()
after_numpy = fast.busy_threads()
# the kernel on both threads, then on one, then numpy: a numpy call before each, so that its workers spin at every
# call however slow the host (five calls after one numpy call could outlast its workers' spin)
first = deferred_over(lambda: (side(), gemm()), 5)
# A fresh spin: under load the five calls above can outlast the first one, and the hand-off, which has tried the
# kernel beside the running threads by now, must give numpy the calls at once.
side()
then = deferred_over(gemm, 400)
last = deferred_over(gemm, 200)
import platform
echo = fast.echo_ns()  # OpenBLAS's spin after a call: 1.1 x 2^28 counter ticks, whose rate is measured by now
floor = int(2**28 / 1.5)  # counted at 1.5 GHz until then, and where there is no counter to read
assert (echo != floor and 25e6 < echo < 600e6) if platform.machine() in ("x86_64", "AMD64") else echo == floor, echo
learned = sorted(fast.handoff(), key=lambda e: e["best_ns"])  # the beta != 0 layout's, then the plain one's
assert len(learned) == 2 and all(e["threads"] == 2 and e["m"] == 512 for e in learned), learned
assert learned[0]["best_ns"] == learned[0]["library_ns"] == 0, learned  # never watched: no plain calls
plain = learned[1]
assert plain["best_ns"] > 0 and plain["library_ns"] > 0 and plain["window_ns"] == 0, learned
assert plain["contended_ns"] > plain["best_ns"] and plain["fewer_ns"] > plain["best_ns"], learned  # both tried
np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-3)
side()
accumulated = deferred_over(lambda: tuneforge.gemm(a, b, c, beta=1.0), 1)
np.testing.assert_allclose(c, a @ b, rtol=1e-4, atol=1e-3)
print(idle, quiet, after_numpy, first, then, last, accumulated)
"""


def test_running_threads_take_the_kernels_plain_calls(tmp_path: Path) -> None:
    """With OpenBLAS's workers idle the kernel makes every call; right after a numpy call they are running, and
    once the kernel has been tried beside them (on both threads, then on the one left free) numpy takes the calls,
    at once after the next numpy call; once numpy has been left alone for its workers' spin time they sleep and
    the kernel makes the calls again. Results stay right, and a call numpy cannot make alone (beta != 0) is never
    handed over."""
    proc = run_python(_CHILD, env={"TUNEFORGE_CACHE_DIR": str(tmp_path)}, timeout=300)
    idle, quiet, after_numpy, first, then, last, accumulated = map(int, proc.stdout.split()[-7:])
    assert idle == 0 and quiet == 0, proc.stdout
    assert after_numpy >= 1 and 1 <= first <= 3, proc.stdout
    assert then > 0 and last == 0, proc.stdout
    assert accumulated == 0, proc.stdout


# A tuning that put numpy at 1000x the kernel's time: a guess no crowded call would ever test but for the
# exploration (handoff.h's EXPLORE_EVERY), which makes every 64th crowded call the next way in turn.
_EXPLORING_CHILD = two_thread_kernel(1000.0) + """
rng = np.random.default_rng(0)
a, b = rng.standard_normal((256, 256)), rng.standard_normal((256, 256))
out = np.empty((256, 256))
p, q, r = np.ones((64, 1024)), np.ones((1024, 64)), np.empty((64, 64))
for _ in range(3):
    tuneforge.gemm(a, b, out)
fast = dispatch.wait(60)
for _ in range(20):  # registered now; quiet calls teach the hand-off the kernel's best time
    tuneforge.gemm(a, b, out)
assert fast is not None and fast.size() == 1, fast
before = fast.deferred()
for _ in range(800):  # each call crowded by OpenBLAS's workers, spinning after the numpy matmul
    np.matmul(p, q, out=r)
    tuneforge.gemm(a, b, out)
learned, = fast.handoff()
np.testing.assert_allclose(out, a @ b, rtol=1e-10, atol=1e-9)
print(fast.deferred() - before, learned["crowded"], learned["library_ns"], learned["library_ratio"])
"""


def test_a_way_guessed_slow_is_still_tried_now_and_then(tmp_path: Path) -> None:
    """numpy, guessed 1000x slower than the kernel from the tuning, still makes some crowded calls (an exploration
    every 64th), and what it took is learned: a way once thought slow is not written off for good."""
    proc = run_python(_EXPLORING_CHILD, env={"TUNEFORGE_CACHE_DIR": str(tmp_path)}, timeout=300)
    deferred, crowded, library_ns, ratio = proc.stdout.split()[-4:]
    assert float(ratio) == 1000.0, proc.stdout
    # the 64th crowded call explores numpy first (then one in 3); most of the 800 calls are crowded (a second test
    # process on the same 2 cores left 171 so), and at least the 64 that an exploration needs
    assert int(crowded) >= 64, proc.stdout
    assert int(deferred) >= 1 and int(library_ns) > 0, proc.stdout
