"""Wait for a library's thread pool to go idle before timing something else on the same cores.

OpenBLAS (and OpenMP runtimes with an active wait policy) keep their threads spinning for a while after a call,
0.1-0.15 s for OpenBLAS; a kernel timed meanwhile shares the cores with them. A fixed pause of
`autotune.settle_s` covered that, and cost its whole length after every library call, also where the library
ran on one thread and nothing spun (0.2 s of a 1.8 s cold search). Spinning threads are CPU time of this
process, so the wait ends as soon as a short step passes in which the process used (almost) none.
"""

from __future__ import annotations

import time

STEP_S = 0.005  # a step of the wait; a pool that still spins uses about all of it
QUIET_SHARE = 0.1  # at most this share of one core used during a step: the pool sleeps


def settle(max_s: float) -> float:
    """Sleep until no thread of this process runs (at most `max_s`); the seconds waited."""
    started = time.perf_counter()
    end = started + max_s
    while (now := time.perf_counter()) < end:
        cpu = time.process_time()
        time.sleep(min(STEP_S, end - now))
        if time.process_time() - cpu < QUIET_SHARE * (time.perf_counter() - now):
            break
    return time.perf_counter() - started
