"""Timing one choice on the CPU: warm-up, then timed runs within a time budget, summarised as quantiles.

Each timed run calls ``setup()`` first (untimed: reset outputs, restore inputs), optionally evicts the
last-level cache (untimed), then times ``fn()`` alone with ``time.perf_counter_ns``. Unset arguments come
from the ``autotune.*`` settings. Exceptions from ``fn`` or ``setup`` propagate unchanged.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from typing import Any

import numpy as np

from tuneforge import config
from tuneforge.dataclass_lite import dataclass

__all__ = ["STATISTICS", "Timing", "benchmark_cpu", "flush_last_level_cache"]

STATISTICS = ("median", "min", "mean")
_DEFAULT_L3_BYTES = 32 * 2**20
_MAX_FLUSH_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Timing:
    """Summary of the timed runs of one choice, in milliseconds."""

    median_ms: float
    min_ms: float
    mean_ms: float
    p20_ms: float
    p80_ms: float
    max_ms: float
    count: int  # timed runs
    method: str  # how it was measured, e.g. "cpu-perf_counter" or "cpu-perf_counter+flush"

    def stat(self, name: str) -> float:
        """The statistic a winner is picked by: ``median``, ``min`` or ``mean``."""
        if name not in STATISTICS:
            raise ValueError(f"unknown timing statistic {name!r}; expected one of {', '.join(STATISTICS)}")
        value: float = getattr(self, f"{name}_ms")
        return value

    def scaled(self, factor: float, method: str = "") -> Timing:
        """Every figure times `factor`, `method` appended to the method."""
        return replace(self, median_ms=self.median_ms * factor, min_ms=self.min_ms * factor,
                       mean_ms=self.mean_ms * factor, p20_ms=self.p20_ms * factor, p80_ms=self.p80_ms * factor,
                       max_ms=self.max_ms * factor, method=self.method + method)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Timing:
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})

    @classmethod
    def from_samples(cls, samples_ms: Sequence[float], method: str) -> Timing:
        if not samples_ms:
            raise ValueError("Timing.from_samples: no samples")
        ordered = sorted(samples_ms)
        return cls(median_ms=_quantile(ordered, 0.5), min_ms=ordered[0], mean_ms=sum(ordered) / len(ordered),
                   p20_ms=_quantile(ordered, 0.2), p80_ms=_quantile(ordered, 0.8), max_ms=ordered[-1],
                   count=len(ordered), method=method)


def _quantile(ordered: Sequence[float], q: float) -> float:
    """Linear interpolation between the closest ranks (numpy's default method) of a sorted sample."""
    position = q * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


_LONG_RUN_REPEATS = 2  # enough once single runs last a large part of a second: their spread is small
LONG_RUN_NS = 50_000_000  # a checked run this long counts as a timed run (first-call effects are noise by then)
FIRST_RUN_SLACK = 2.0  # ... unless the next run is this many times faster: the checked one held a one-time cost
# A core left idle comes back to speed over a few milliseconds (here, a 2-vCPU VM: a 2-thread 128^3 GEMM kernel
# timed right after a 1-thread one ran 85, 80, 59, 56, 46 us a call, medians of 10 calls, before settling at 41;
# after another 2-thread one, 54 from the first call on). A brief timing of a short kernel that began at once
# ranked every 2-thread choice that followed a 1-thread one by its ramp: short runs are timed after this long of
# untimed runs.
RAMP_S = 0.003
RAMP_NS = int(RAMP_S * 1e9)


def long_run_s() -> float:
    """`autotune.max_bench_s`: from this long on a run is long, its timing hardly needs another (0: never)."""
    seconds = config.get_float("autotune.max_bench_s")
    return seconds if seconds > 0 else float("inf")


def warm_up(fn: Callable[[], object], seconds: float, setup: Callable[[], object] | None = None,
            at_least: int = 1, enough_s: float | None = None) -> None:
    """Untimed ``setup(); fn()`` runs until `seconds` have passed, and at least `at_least` of them; with
    `enough_s`, one run or more that have lasted that long are enough, however few."""
    started = time.perf_counter()
    until = started + seconds
    done = 0
    while done < at_least or time.perf_counter() < until:
        if setup is not None:
            setup()
        fn()
        done += 1
        if enough_s is not None and time.perf_counter() - started >= max(enough_s, seconds):
            break


def benchmark_cpu(fn: Callable[[], object], *, setup: Callable[[], object] | None = None,
                  warmup_s: float | None = None, budget_s: float | None = None, min_repeats: int | None = None,
                  max_repeats: int | None = None, flush_cache: bool | None = None, warmed: bool = False,
                  abandon_ms: float | None = None, max_bench_s: float | None = None,
                  first_ns: int | None = None, abandon_first: bool = False, agree: float | None = None) -> Timing:
    """Time ``fn()`` with wall-clock `time.perf_counter_ns`.

    Warm-up: untimed ``setup(); fn()`` runs, at least one, until `warmup_s` has passed (none when the
    caller has just run `fn`, e.g. to verify it: `warmed`). Timed runs stop once at least `min_repeats` were
    done and the timed phase (runs, setups and flushes) has lasted `budget_s`, or at `max_repeats`
    runs, or once it has lasted `max_bench_s` with at least 2 runs (a 300 ms kernel needs no 5 runs).
    `first_ns`: the duration of a run the caller has just made (the checked run); from 50 ms on it
    counts as the first timed run (unless the next run is FIRST_RUN_SLACK times faster), and with
    `min_repeats` 1, from `max_bench_s` on it is the only one.
    With `abandon_ms`, a choice whose first two timed runs both exceed it stops there (method
    ``+abandoned``): it cannot win, and timing it fully would dominate tuning time for large shapes. With
    `abandon_first` a shorter checked run counts as the first of the two, for abandoning only (a 512^3 fp64 search's
    abandoned choices cost one run less): counted as a timed run as well, it left 3 of 3 such searches' picks 4-7%
    behind the exhaustive pick (a first call's costs, buffers allocated and touched, are not alike for all).
    With `agree`, long runs (LONG_RUN_NS or more) stop at two that lie within that ratio of each other, before
    `min_repeats`: a third run of a 4096^3 GEMM's sample costs 0.13-0.26 s and moves a median of two close runs by
    less than their gap.
    The garbage collector is paused during the timed runs.
    """
    warmup_s = config.get_float("autotune.warmup_s") if warmup_s is None else warmup_s
    budget_s = config.get_float("autotune.bench_time_s") if budget_s is None else budget_s
    min_repeats = config.get_int("autotune.min_repeats") if min_repeats is None else min_repeats
    max_repeats = config.get_int("autotune.max_repeats") if max_repeats is None else max_repeats
    flush_cache = config.get_bool("autotune.flush_cache") if flush_cache is None else flush_cache
    max_bench_s = config.get_float("autotune.max_bench_s") if max_bench_s is None else max_bench_s
    if max_repeats < 1:
        raise ValueError(f"benchmark_cpu: max_repeats must be at least 1, not {max_repeats}")
    min_repeats = min(min_repeats, max_repeats)

    if not warmed:
        warm_up(fn, warmup_s, setup)

    budget_ns = budget_s * 1e9
    long_ns = max_bench_s * 1e9 if max_bench_s > 0 else float("inf")
    samples_ns: list[int] = []
    abandoned = False
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        start_ns = time.perf_counter_ns()
        counted_first = first_ns is not None and first_ns >= LONG_RUN_NS
        abandon_early = abandon_first and first_ns is not None and not counted_first
        if counted_first:
            samples_ns.append(int(first_ns or 0))
            start_ns -= int(first_ns or 0)
        # a checked run that alone lasted max_bench_s is enough where one run is asked for
        enough = bool(samples_ns) and min_repeats <= 1 and samples_ns[0] >= long_ns
        while not enough:
            if setup is not None:
                setup()
            if flush_cache:
                flush_last_level_cache()
            t0 = time.perf_counter_ns()
            fn()
            t1 = time.perf_counter_ns()
            if counted_first and len(samples_ns) == 1 and samples_ns[0] > FIRST_RUN_SLACK * (t1 - t0):
                # the checked run held a one-time cost (a library imported on first use: torch's extern in a
                # fresh worker was timed at 1.7 s, then 2.6 ms): not a sample, nor part of the budget
                start_ns += samples_ns.pop()
                counted_first = False
            samples_ns.append(t1 - t0)
            if abandon_early and abandon_ms is not None and min(samples_ns[0], first_ns or 0) > abandon_ms * 1e6:
                samples_ns.insert(0, int(first_ns or 0))
                abandoned = True
                break
            abandon_early = False
            if len(samples_ns) >= max_repeats:
                break
            if abandon_ms is not None and len(samples_ns) == 2 and min(samples_ns) > abandon_ms * 1e6:
                abandoned = True
                break
            if len(samples_ns) >= min_repeats and t1 - start_ns >= budget_ns:
                break
            if len(samples_ns) >= _LONG_RUN_REPEATS and t1 - start_ns >= long_ns:
                break
            if agree is not None and len(samples_ns) == _LONG_RUN_REPEATS and min(samples_ns) >= LONG_RUN_NS \
                    and max(samples_ns) <= min(samples_ns) * agree:
                break
    finally:
        if gc_was_enabled:
            gc.enable()
    method = "cpu-perf_counter" + ("+flush" if flush_cache else "") + ("+abandoned" if abandoned else "")
    return Timing.from_samples([ns / 1e6 for ns in samples_ns], method)


_flush_lock = threading.Lock()
_flush_buffer: np.ndarray[Any, np.dtype[np.int64]] | None = None
_flush_sink = 0


def flush_buffer_bytes(l3_bytes: int | None) -> int:
    """Bytes written to evict the last-level cache: twice its size (32 MiB assumed when unknown), at most 256 MiB."""
    return min(2 * (l3_bytes or _DEFAULT_L3_BYTES), _MAX_FLUSH_BYTES)


def flush_last_level_cache() -> None:
    """Evict the last-level cache by writing and reading back a buffer twice its size (allocated once)."""
    global _flush_buffer, _flush_sink
    with _flush_lock:
        if _flush_buffer is None:
            from tuneforge.cpuinfo import cpu_info

            nbytes = flush_buffer_bytes(cpu_info().caches().get("L3"))
            _flush_buffer = np.zeros(nbytes // 8, dtype=np.int64)
        buffer = _flush_buffer
        buffer += 1
        _flush_sink = int(buffer.sum())
