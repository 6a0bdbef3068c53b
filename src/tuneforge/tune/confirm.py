"""Side-by-side re-timing of a near tie between the two fastest choices.

Choices are first timed one after another, so a drift of the machine between two of them (another
tenant, a clock change) can reverse their order when they are close. When the two fastest are within
`autotune.confirm_margin` of each other, they are timed again in alternating rounds, so that the same
conditions hit both, and their records are replaced by those paired figures (method ``+paired``).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence

from tuneforge import config
from tuneforge.store.records import Record
from tuneforge.tune.bench import Timing
from tuneforge.tune.choices import Choice

MIN_ROUNDS, MAX_ROUNDS = 3, 15
# An OpenMP runtime's threads spin for a few ms after a parallel region (libgomp: ~5 ms measured on a
# Zen 5), slowing a library call that runs right after: a short pause after each kernel's batch.
KERNEL_PAUSE_S = 0.01
# After a pause, the first run of a multi-threaded kernel is slower (sleeping threads, an idle core):
# each batch starts with an untimed run, except for long runs, where that costs more than it skews.
WARM_UP_BELOW_MS = 50.0
ROUND_BATCH_S = 0.01  # each choice runs at least this long per round: 3 rounds of a 1 ms kernel give 30 runs


def near_tie(results: Sequence[tuple[Choice, Record]], statistic: str) -> list[tuple[Choice, Record]]:
    """The two fastest fully timed choices, if they are within the margin of each other; else []."""
    margin = config.get_float("autotune.confirm_margin")
    timed = [(t, choice, record) for choice, record in results
             if record.status == "ok" and "+abandoned" not in record.method
             and (t := record.time(statistic)) is not None]
    if margin <= 0 or len(timed) < 2:
        return []
    timed.sort(key=lambda item: item[0])
    (best, a, ra), (second, b, rb) = timed[0], timed[1]
    return [(a, ra), (b, rb)] if second <= best * (1 + margin) else []


def time_side_by_side(runs: Sequence[Callable[[], object]], setup: Callable[[], object], typical_ms: float,
                      settle_after: Sequence[bool]) -> list[Timing]:
    """Alternating rounds of each run (each a batch long enough to time), then one Timing per run.

    ``settle_after[i]``: pause for `autotune.settle_s` after run i, because it is a library call whose
    thread pool may keep spinning and slow down whatever runs next; after the others, KERNEL_PAUSE_S.
    """
    batch = max(1, min(100, int(ROUND_BATCH_S * 1e3 / max(typical_ms, 1e-6))))
    warm_up = typical_ms < WARM_UP_BELOW_MS
    budget_s = 2 * config.get_float("autotune.bench_time_s")
    long_s = config.get_float("autotune.max_bench_s") or float("inf")  # long kernels: one round can do
    settle_s = config.get_float("autotune.settle_s")
    samples: list[list[float]] = [[] for _ in runs]
    if settle_s > 0:  # the first pass ends with the library calls: let their threads go idle
        time.sleep(settle_s)
    started = time.perf_counter()
    rounds = 0
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        while rounds < MIN_ROUNDS or (rounds < MAX_ROUNDS and time.perf_counter() - started < budget_s):
            if rounds >= 1 and time.perf_counter() - started >= long_s:
                break
            order = range(len(runs)) if rounds % 2 == 0 else reversed(range(len(runs)))
            for i in order:
                if warm_up:  # untimed: wakes the thread pool and the core up after the pause
                    setup()
                    runs[i]()
                for _ in range(batch):
                    setup()
                    t0 = time.perf_counter_ns()
                    runs[i]()
                    samples[i].append((time.perf_counter_ns() - t0) / 1e6)
                pause = settle_s if settle_after[i] else min(settle_s, KERNEL_PAUSE_S)
                if pause > 0:
                    time.sleep(pause)
            rounds += 1
    finally:
        if gc_was_enabled:
            gc.enable()
    return [Timing.from_samples(s, "cpu-perf_counter+paired") for s in samples]
