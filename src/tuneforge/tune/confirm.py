"""Side-by-side re-timing of the choices a drift of the machine could have put in the wrong order.

Choices are first timed one after another, so a drift of the machine between two of them (another
tenant, a clock change, a phase of the host's memory bandwidth) can reverse their order when they are
close. They are timed again in alternating rounds, so that the same conditions hit all of them, and their
records are replaced by those paired figures (method ``+paired``):

- the two fastest, when they are within `autotune.confirm_margin` of each other;
- the fastest and the reference (the library call the tuned op must never lose to), when a choice beat
  the reference by less than `autotune.confirm_reference_ratio` (twice that for a library call's timing of its
  own: LIBRARY_SPELL). On a 2-core VM whose read bandwidth
  moved 1.5-2x within seconds, a kernel timed 4% faster than numpy on a memory-bound shape
  (3000x5x700 fp64) ran at 0.67x numpy in steady state;
- on the CPU, the contenders a screening left (more than 8 choices), instead of timing them one after another
  (paired.py); a near tie among them is not re-timed again.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from tuneforge import config
from tuneforge.store.records import Record
from tuneforge.tune.bench import RAMP_S, Timing, long_run_s, warm_up
from tuneforge.tune.choices import Choice
from tuneforge.tune.quiet import settle

# At least 5 rounds: the fewest in which a choice faster in every one is a statement (sign test p = 1/32);
# 3 could never say better than p = 1/8.
MIN_ROUNDS, MAX_ROUNDS = 5, 15
CONFIDENCE = "confidence"  # the record info key of the fastest's `confidence` entries
PAIRED_SCALE = "paired_scale"  # ... and of the factor the paired timings were anchored by (Trials.confirm)
# An OpenMP runtime's threads spin for a few ms after a parallel region (libgomp: ~5 ms measured on a
# Zen 5), slowing a library call that runs right after: a short pause after each kernel's batch.
KERNEL_PAUSE_S = 0.01
# After a pause, the first run of a multi-threaded kernel is slower (sleeping threads, an idle core):
# each batch starts with an untimed run, except for long runs, where that costs more than it skews.
WARM_UP_BELOW_MS = 50.0
ROUND_BATCH_S = 0.01  # each choice runs at least this long per round: 3 rounds of a 1 ms kernel give 30 runs


# How much slower a library call's own timing (not side by side) can read than it runs. On this 2-vCPU VM, numpy's
# 2-thread 96x1000x300 float32 GEMM was timed at 0.95-1.03 ms in 4 of 17 cold tunings, 0.50-0.62 in the others and
# in steady state: OpenBLAS splits a call statically between its threads, so a spell in which one vCPU is
# descheduled (or its thread shares the caller's) runs it at one thread's speed, while the kernels' pool gives the
# chunks to the threads that run. Beaten by 1.9x, it was not re-timed beside the pick, a kernel 19% slower than it.
LIBRARY_SPELL = 2.0


# A library batch starts with this many untimed runs at least: its threads slept through the settle before it, and
# waking them took more than the first run. numpy's 2-thread GEMM after 1 s idle, six wake-ups: 96x1000x300 fp32
# calls 0-3 took 1.3-12, 0.77-1.15, 0.63-2.4 and 0.60-0.81 ms, then ~0.5; 512^3 fp64 after 0.02-0.5 s (medians of 8)
# the first 7.0-8.2 ms, the second 5.7-6.2, later 5.3-5.7. With batches of one or two runs (ROUND_BATCH_S), one
# untimed run left the second run's wake-up in every library batch.
LIBRARY_WAKE_RUNS = 3
# ... unless they have lasted this long: the wake-up is over by then (the calls above), and three untimed runs of a
# long call (4096x32x4096 fp64 numpy, 33 ms) were 0.2 s of a 4 s cold tuning.
LIBRARY_WAKE_S = 0.015


def _timed(results: Sequence[tuple[Choice, Record]], statistic: str) -> list[tuple[float, Choice, Record]]:
    """The fully timed ones, fastest first."""
    timed = [(t, choice, record) for choice, record in results
             if record.status == "ok" and "+abandoned" not in record.method
             and (t := record.time(statistic)) is not None]
    return sorted(timed, key=lambda item: item[0])


def contenders(results: Sequence[tuple[Choice, Record]], statistic: str) -> list[tuple[Choice, Record]]:
    """Every fully timed choice within `autotune.confirm_reference_ratio` of the fastest, fastest first (a search's
    finalists are all re-timed side by side); [] for one."""
    timed = _timed(results, statistic)
    ratio = config.get_float("autotune.confirm_reference_ratio")
    near = [(choice, record) for t, choice, record in timed if ratio <= 0 or t <= timed[0][0] * ratio]
    return near if len(near) > 1 else []


def near_tie(results: Sequence[tuple[Choice, Record]], statistic: str,
             reference: Choice | None = None) -> list[tuple[Choice, Record]]:
    """The choices to re-time side by side, fastest first: the two fastest fully timed ones if they are within
    the margin of each other, and `reference` if it is not the fastest and within the reference ratio; else [],
    also where all of those were timed side by side already."""
    margin = config.get_float("autotune.confirm_margin")
    guard = config.get_float("autotune.confirm_reference_ratio")
    timed = _timed(results, statistic)
    if len(timed) < 2:
        return []
    best = timed[0][0]
    picked = [timed[0]]
    if margin > 0 and timed[1][0] <= best * (1 + margin):
        picked.append(timed[1])
    own = next((item for item in timed[1:] if item[1] is reference), None) if guard > 0 else None
    if own is not None and "+paired" not in own[2].method and own[1].is_extern:
        guard *= LIBRARY_SPELL  # timed on its own: it may have met a spell that halves a library call's speed
    if own is not None and own[0] <= best * guard and all(choice is not reference for _, choice, _ in picked):
        picked.append(own)
    if len(picked) < 2 or all("+paired" in record.method for _, _, record in picked):
        return []  # timed side by side already (a screening's contenders, paired.py)
    return [(choice, record) for _, choice, record in picked]


def time_side_by_side(runs: Sequence[Callable[[], object]], setup: Callable[[], object], typical_ms: float,
                      settle_after: Sequence[bool], first_round: Sequence[float | None] = ()
                      ) -> tuple[list[Timing], list[list[float]]]:
    """Alternating rounds of each run (each a batch long enough to time): one Timing per run, and per run its
    batch's median in each round (what `confidence` compares).

    ``first_round[i]``: run i's figure in the first round, a run just timed (ms), which is not run again there:
    a 4096^3 GEMM kernel's whole run, its check and timing, came right before its one round beside numpy (long
    runs make one round), and running it again took 0.7 s on two cores, 1.4 s on one. It ran last: the first batch
    pauses after it as after any batch of its kind.

    ``settle_after[i]``: run i is a library call whose thread pool may keep spinning and slow down whatever
    runs next, so a batch of another run that follows it starts once the pool is idle (quiet.py; at most
    `autotune.settle_s`); a library batch that follows a kernel's starts after KERNEL_PAUSE_S. Rounds alternate
    their order, so library batches come in pairs (k L | L k | k L ...): one pause per pair, not one per batch.
    """
    batch = max(1, min(100, int(ROUND_BATCH_S * 1e3 / max(typical_ms, 1e-6))))
    warm = typical_ms < WARM_UP_BELOW_MS
    budget_s = 2 * config.get_float("autotune.bench_time_s")
    long_s = long_run_s()  # long kernels: one round can do
    settle_s = config.get_float("autotune.settle_s")
    samples: list[list[float]] = [[] for _ in runs]
    per_round: list[list[float]] = [[] for _ in runs]
    # the first pass may have ended with a library call; a carried run ran last, just before
    carried = {i: figure for i, figure in enumerate(first_round[:len(runs)]) if figure is not None}
    after_library = settle_after[max(carried)] if carried else True
    started = time.perf_counter()
    paused = 0.0  # the pauses are no timing: a long kernel's limit counts the runs only
    rounds = 0
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        while rounds < MIN_ROUNDS or (rounds < MAX_ROUNDS and time.perf_counter() - started < budget_s):
            if rounds >= 1 and time.perf_counter() - started - paused >= long_s:
                break
            order = range(len(runs)) if rounds % 2 == 0 else reversed(range(len(runs)))
            for i in order:
                if rounds == 0 and i in carried:
                    samples[i].append(carried[i])
                    per_round[i].append(carried[i])
                    continue
                if after_library and not settle_after[i]:
                    paused += settle(settle_s)  # until the library's pool has gone idle (quiet.py)
                elif settle_after[i] and not after_library and (pause := min(settle_s, KERNEL_PAUSE_S)) > 0:
                    time.sleep(pause)
                    paused += pause
                after_library = settle_after[i]
                if warm:  # untimed: wakes the thread pool and the cores up after the pause (bench.RAMP_S)
                    warm_up(runs[i], RAMP_S, setup, at_least=LIBRARY_WAKE_RUNS if settle_after[i] else 1,
                            enough_s=LIBRARY_WAKE_S)
                for _ in range(batch):
                    setup()
                    t0 = time.perf_counter_ns()
                    runs[i]()
                    samples[i].append((time.perf_counter_ns() - t0) / 1e6)
                per_round[i].append(statistics.median(samples[i][-batch:]))
            rounds += 1
    finally:
        if gc_was_enabled:
            gc.enable()
    return [Timing.from_samples(s, "cpu-perf_counter+paired") for s in samples], per_round


def confidence(fast: Sequence[float], other: Sequence[float], versus: str) -> dict[str, Any]:
    """How sure a side-by-side re-timing is that `fast` beats `other`, from their per-round medians: in how many
    rounds it was faster, by how much (the median of the rounds' ratios), and the one-sided sign test's p-value
    (the chance of that many wins or more if neither were faster)."""
    rounds = min(len(fast), len(other))
    wins = sum(f < o for f, o in zip(fast, other, strict=False))
    by = statistics.median(o / f - 1 for f, o in zip(fast, other, strict=False) if f > 0) if rounds else 0.0
    p = sum(math.comb(rounds, k) for k in range(wins, rounds + 1)) / 2**rounds if rounds else 1.0
    return {"versus": versus, "rounds": rounds, "faster_in": wins, "by": round(by, 4), "p": round(p, 4)}

