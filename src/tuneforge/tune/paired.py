"""Re-time a few checked choices of a run of trials side by side, and make their records (confirm.py says why).

Two uses: a near tie or a narrow win over the reference after every choice was timed (`Trials.confirm`), and, on
the CPU, the contenders a brief screening left (trials.py): timed one after another, a spell of the host's
contention (a pure FMA loop here ran at 150-180 GFLOP/s from one second to the next) fell on some of them and not
on others, and ranked them by it; in alternating rounds it falls on all of them alike.
"""

from __future__ import annotations

import logging
import math
import statistics
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol

from tuneforge import config
from tuneforge.store.records import Record
from tuneforge.tune import verify
from tuneforge.tune.bench import Timing
from tuneforge.tune.bench_gpu import time_side_by_side_gpu
from tuneforge.tune.choices import Choice
from tuneforge.tune.confirm import CONFIDENCE, PAIRED_SCALE, confidence, time_side_by_side
from tuneforge.tune.input_guard import InputGuard
from tuneforge.tune.job import TrialJob, make_record
from tuneforge.tune.ranking import SCREENED

log = logging.getLogger("tuneforge.tune")


class Trials(Protocol):
    """What of trials.Trials (which imports this module) the re-timing uses."""

    job: TrialJob
    args: list[Any]
    initial: list[Any]
    bench_s: float
    guard: InputGuard

    def restored_for_timing(self, mutated: Sequence[int]) -> list[int]: ...


def time_paired(trials: Trials, tie: Sequence[tuple[Choice, Record]], anchors: Collection[int] = (),
                carried: Mapping[int, float] | None = None) -> list[Record]:
    """New records for the choices of `tie` (each with its earlier record), timed in alternating rounds on the
    whole problem; [] when that failed (the earlier records stand). `anchors`: positions in `tie` of choices
    timed in an earlier batch, whose earlier records set the level of the new ones (see below). `carried`:
    positions whose first round is a run just timed (ms; confirm.time_side_by_side's `first_round`, CPU only)."""
    job, args = trials.job, trials.args
    statistic = config.get_str("autotune.statistic")
    restore = trials.restored_for_timing(sorted({m for _, r in tie for m in r.info.get("mutates_inputs", [])}))
    typical = min(r.median_ms for _, r in tie if r.median_ms is not None)
    started = time.perf_counter()
    runs = [choice.bound(args) for choice, _ in tie]
    try:
        if job.device == "cpu":
            timings, rounds = time_side_by_side(runs, lambda: verify.restore(args, trials.initial, restore),
                                                typical, [choice.is_extern for choice, _ in tie],
                                                [(carried or {}).get(i) for i in range(len(tie))])
        else:
            timings, rounds = time_side_by_side_gpu(runs, lambda: verify.restore(args, trials.initial, restore),
                                                    typical, job.device)
    except Exception as exc:  # they ran before: keep the first figures
        log.warning("%s: re-timing %d choices side by side failed (%s); keeping their first timings", job.name,
                    len(tie), exc)
        return []
    finally:
        trials.bench_s += time.perf_counter() - started
        trials.guard.restore()
    timings = levelled(timings, rounds, statistic)
    fastest = min(range(len(tie)), key=lambda i: timings[i].stat(statistic))
    sure = [confidence(rounds[fastest], rounds[i], tie[i][0].name) for i in range(len(tie)) if i != fastest]
    # Paired rounds can run at another level than the first timings, which the other choices keep (a library's
    # threads spinning between the batches: 128^3 kernels paired beside numpy measured 5-15% slower): the
    # re-timed keep their ratios, at the level of their first full timings: the median of each one's first figure
    # over its paired one. Not the fastest first figure over the fastest paired one (the least of a few figures
    # is the likeliest to be low by noise), and not a brief one (screening.py): a screened figure is compared over
    # the screening's level, which a slow timing of its control can set wrong, and contenders anchored at the
    # fastest of them (then divided by it) were recorded at 0.51-0.83 of their paired figures (512^3 fp64
    # searches here), up to 150 GFLOP/s on cores that peak at 116. A choice timed briefly only cannot overtake
    # those re-timed by the change of method: ranking.py ranks it after them. So contenders of a screening keep
    # their paired figures.
    # With anchors (a search's best so far, re-timed in each of its batches), the level is theirs: a batch timed
    # in another spell of the host's contention than the one before keeps its ratios to the best so far, not
    # the spell's level (two 128^3 kernels timed for 40 ms each, every 0.2 s: each 40-73 us, their ratio mostly
    # 1.0-1.17).
    # The kernels' ratios where there are some: a library call's first full timing can hold its threads' wake-up
    # (numpy's 2-thread GEMM: up to 3x its steady time, trials.py), and in a tie of two the median is the mean.
    full = [i for i in anchors or range(len(tie)) if SCREENED not in tie[i][1].method]
    levels = [t / timings[i].stat(statistic) for i in [i for i in full if not tie[i][0].is_extern] or full
              if (t := tie[i][1].time(statistic))]
    anchor = statistics.median(levels) if levels else 1.0
    records = []
    for i, ((choice, record), timing) in enumerate(zip(tie, timings, strict=True)):
        info = {k: v for k, v in record.info.items() if k != CONFIDENCE} | {PAIRED_SCALE: round(anchor, 4)}
        if i == fastest:
            info[CONFIDENCE] = sure
        records.append(make_record(job, choice, "ok", timing=timing.scaled(anchor), info=info))
    return records


def levelled(timings: Sequence[Timing], rounds: Sequence[Sequence[float]], statistic: str) -> list[Timing]:
    """The timings of side-by-side rounds with each round's level taken out (statistic "median"): a choice's
    figure is the median over rounds of its round's median over that round's level (the geometric mean of every
    choice's median in it), times the median level. The median of all of a choice's runs let the rounds' levels
    decide, not the pairs: numpy, slower than a kernel in 3 of 5 rounds and by 4.9% in the median round (96x1000x300
    fp32, a search's finalists), was picked on its median over all its runs. The other statistics ("min", "mean")
    are the user's choice of estimator: kept as they are."""
    count = min((len(r) for r in rounds), default=0)
    if statistic != "median" or count == 0 or len(rounds) != len(timings) or \
            not all(x > 0 and math.isfinite(x) for r in rounds for x in r[:count]):
        return list(timings)
    levels = [math.exp(statistics.fmean(math.log(r[k]) for r in rounds)) for k in range(count)]
    base = statistics.median(levels)
    out = []
    for timing, own in zip(timings, rounds, strict=True):
        figure = statistics.median(own[k] / levels[k] for k in range(count)) * base
        out.append(timing.scaled(figure / timing.median_ms) if timing.median_ms > 0 else timing)
    return out
