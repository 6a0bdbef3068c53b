"""Timing one choice on a CUDA GPU: CUDA events around each run, the L2 cache flushed between runs.

A run is timed by a pair of CUDA events recorded on the current stream right before and right after
``fn()``; ``setup()`` (restore outputs, inputs) and the L2 flush (writing a buffer twice the L2 size)
are queued before the first event, so the timed region holds the kernel's own work and nothing else.
The events are read once, after all runs, so the host never waits between runs.

How many runs: a first measurement of a few runs estimates one run's time, then the warm-up lasts
``warmup_s`` and the timed runs ``budget_s`` (``cuda.bench_time_s``; at least ``min_repeats``, at most
``max_repeats``, shared with the CPU benchmark's ``autotune.*``).

The L2 flush (``cuda.flush_l2``, on by default) makes each run read its operands from memory, as in a
program where other kernels ran in between. Before each part of a batch of timed runs (50 runs at most,
`queue_held`) the GPU is held (`hold`) until the host has queued them, so the runs are timed back to back
and a choice with a slower host-side launch (a Python launch path: 40-60 us) is not timed at the host's
pace: its kernel is what is compared (seen on an H200: without both, every Triton kernel of a 20 us
product lost to cuBLAS by its launch).
An idle GPU runs at its lowest clock (345 MHz on an H200); the first timing of a process is preceded by
``cuda.spin_up_s`` of matrix products, so the choice timed first is not timed while the clock ramps up.

Side by side (`time_side_by_side_gpu`): close choices are timed again in alternating rounds, each a
batch of event-timed runs, so that a drift of the GPU (clock, temperature) hits all of them alike.

Microsecond kernels: with ``graph=True`` the runs are captured in a CUDA graph, ``GRAPH_BATCH`` calls
per replay, and a sample is one replay's time divided by the calls in it; launch overhead, which a
framework-level caller would not pay per kernel, no longer dominates.  ``fn`` must then be capturable
(no host synchronisation, no allocation), and ``setup`` runs once before the capture only.

torch is imported when a benchmark runs: importing this module costs nothing without a GPU.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from tuneforge import config
from tuneforge.tune.bench import Timing

__all__ = ["GRAPH_BATCH", "benchmark_gpu", "hold", "host_ahead_ms", "l2_flush_bytes", "plan_runs", "queue_held",
           "spin_up", "time_side_by_side_gpu"]

GRAPH_BATCH = 20  # calls captured per graph replay
_ESTIMATE_RUNS = 3
_MAX_WARMUP_RUNS = 1000
_FIRST_HOST_MS = 0.1  # assumed host time to queue one run, until measured
_MAX_HOLD_MS = 100.0  # at most this long: `_HOLD_RUNS` runs of a slow host side fit in it
_HOLD_RUNS = 50  # runs queued behind one hold: 50 runs of setup, flush, events and kernels fit the launch queue
_CALIBRATION_CYCLES = 10_000_000  # ~5 ms at an H100's 1.98 GHz
_cycles_per_ms: dict[int, float | None] = {}  # device index -> torch.cuda._sleep cycles per ms
_ATTR_CLOCK_RATE = 13  # CU_DEVICE_ATTRIBUTE_CLOCK_RATE: the SM clock's peak, kHz
_ROUND_BATCH_MS = 2.0  # each run's batch in a side-by-side round lasts about this long
_DEFAULT_L2_BYTES = 50 * 2**20  # an H100's L2, when the device does not say
_flush_buffers: dict[int, Any] = {}  # device index -> int8 tensor
_spun_up: set[int] = set()  # device indices this process has run its spin-up on
_SPIN_UP_SIZE = 2048  # a bf16 product of this size takes ~20 us on an H100: short steps, a busy GPU


def plan_runs(estimate_ms: float, *, warmup_s: float, budget_s: float, min_repeats: int,
              max_repeats: int) -> tuple[int, int]:
    """(warm-up runs, timed runs) for a run that takes about `estimate_ms`: the warm-up lasts `warmup_s`
    (at least one run), the timed runs `budget_s`, within [`min_repeats`, `max_repeats`]."""
    if max_repeats < 1:
        raise ValueError(f"benchmark_gpu: max_repeats must be at least 1, not {max_repeats}")
    per_run_s = max(estimate_ms, 1e-6) / 1e3
    warmup = min(max(1, math.ceil(warmup_s / per_run_s)), _MAX_WARMUP_RUNS)
    repeats = min(max(min_repeats, math.ceil(budget_s / per_run_s)), max_repeats)
    return warmup, max(1, repeats)


def l2_flush_bytes(l2_bytes: int | None) -> int:
    """Bytes written to flush the L2 cache: twice its size (an H100's 50 MiB assumed when unknown)."""
    return 2 * (l2_bytes or _DEFAULT_L2_BYTES)


def _flush_buffer(torch: Any, device: Any) -> Any:
    index = _device_index(torch, device)
    buffer = _flush_buffers.get(index)
    if buffer is None:
        l2 = getattr(torch.cuda.get_device_properties(index), "L2_cache_size", None)
        buffer = _flush_buffers[index] = torch.empty(l2_flush_bytes(l2), dtype=torch.int8, device=device)
    return buffer


def host_ahead_ms(host_ms: float, runs: int, gpu_ms: float = 0.0) -> float:
    """How long to hold the GPU before `runs` timed runs that take the host `host_ms` each to queue and the GPU
    at least `gpu_ms` each to run: long enough for the host to stay ahead of the GPU through them (with a
    margin; nothing when the GPU is the slower side), at most `_MAX_HOLD_MS`."""
    return min(_MAX_HOLD_MS, max(0.0, 1.5 * host_ms - max(gpu_ms, 0.0)) * runs)


def _peak_cycles_per_ms(index: int) -> float | None:
    """The SM clock's peak on GPU `index`, in cycles a millisecond (its kHz); None where the driver won't say."""
    from tuneforge.compile import cuda_driver

    try:
        return float(cuda_driver.device_attribute(_ATTR_CLOCK_RATE, index)) or None
    except (cuda_driver.CudaError, OSError):
        return None


def _sleep_cycles_per_ms(torch: Any, device: Any) -> float | None:
    """How many cycles of ``torch.cuda._sleep`` make at least a millisecond on `device`, whatever its clock
    then: the higher of one measurement per process and the clock's peak. The sleep counts SM cycles, so at
    a higher clock than measured at, a hold would end early, and the runs behind it be timed at the host's
    pace again (seen on an H100: calibrated while its clock was still low, half of a test's runs were). None
    where torch has no such kernel (then nothing is held)."""
    index = _device_index(torch, device)
    if index not in _cycles_per_ms:
        rate = None
        sleep = getattr(torch.cuda, "_sleep", None)
        if sleep is not None:
            try:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                sleep(_CALIBRATION_CYCLES)
                end.record()
                end.synchronize()
                rate = _CALIBRATION_CYCLES / max(float(start.elapsed_time(end)), 1e-3)
            except Exception:  # a torch without a working _sleep: timed as before, at the host's pace
                rate = None
        peak = _peak_cycles_per_ms(index) if rate is not None else None
        _cycles_per_ms[index] = max(rate, peak) if rate is not None and peak is not None else rate
    return _cycles_per_ms[index]


def hold(torch: Any, device: Any, ms: float) -> None:
    """Queue a kernel that keeps the GPU busy for about `ms`, so that the host queues what follows before the
    GPU gets to it. Without it, a run whose host side (a Python launch path: 40-60 us) outlasts the GPU's
    work of one iteration (the L2 flush and a 20 us kernel) is timed at the host's pace: the start event
    is reached, then the GPU waits for the launch. Seen on an H200: every Triton configuration of
    3000x1000x700 fp16 timed 0.061-0.066 ms, the same tiles 0.020-0.031 ms in Inductor's timing."""
    rate = _sleep_cycles_per_ms(torch, device) if ms > 0 else None
    if rate is not None:
        torch.cuda._sleep(int(ms * rate))


def queue_held(torch: Any, device: Any, events: Sequence[tuple[Any, Any]], run: Callable[[], object],
               setup: Callable[[], object] | None, flush: Any, host_ms: float, gpu_ms: float = 0.0) -> float:
    """Queue one event-timed run of `run` per (start, end) pair, `setup` and the L2 flush before each start, in
    parts of at most `_HOLD_RUNS` runs, each behind a `hold` long enough for the host to queue it: the GPU's
    launch queue holds about a thousand operations, and a batch that overflowed it would drain faster than the
    host refills it, and be timed at the host's pace again. `gpu_ms`: a run's known GPU time (its kernel's,
    the flush left out: the holds err long). Returns the host's time per run, as measured."""
    for first in range(0, len(events), _HOLD_RUNS):
        part = events[first:first + _HOLD_RUNS]
        hold(torch, device, host_ahead_ms(host_ms, len(part), gpu_ms))
        queued = time.perf_counter()
        for start, end in part:
            if setup is not None:
                setup()
            if flush is not None:
                flush.zero_()
            start.record()
            run()
            end.record()
        host_ms = (time.perf_counter() - queued) * 1e3 / len(part)
    return host_ms


def _device_index(torch: Any, device: Any) -> int:
    return int(device.index if device.index is not None else torch.cuda.current_device())


def spin_up(torch: Any, device: Any, seconds: float | None = None) -> None:
    """Keep the GPU busy with matrix products for `seconds` (``cuda.spin_up_s``), once per device and process:
    its clocks leave their idle state before the first timing."""
    index = _device_index(torch, device)
    seconds = config.get_float("cuda.spin_up_s") if seconds is None else seconds
    if index in _spun_up or seconds <= 0:
        return
    _spun_up.add(index)
    x = torch.randn(_SPIN_UP_SIZE, _SPIN_UP_SIZE, device=device).to(torch.bfloat16)
    y = torch.empty_like(x)
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(20):
            torch.mm(x, x, out=y)
        torch.cuda.synchronize(device)


def benchmark_gpu(fn: Callable[[], object], *, setup: Callable[[], object] | None = None,
                  warmup_s: float | None = None, budget_s: float | None = None, min_repeats: int | None = None,
                  max_repeats: int | None = None, flush_l2: bool | None = None, graph: bool = False,
                  device: Any = None) -> Timing:
    """Time ``fn()`` (kernels queued on the current CUDA stream) with CUDA events; see the module."""
    import torch

    warmup_s = config.get_float("autotune.warmup_s") if warmup_s is None else warmup_s
    budget_s = config.get_float("cuda.bench_time_s") if budget_s is None else budget_s
    min_repeats = config.get_int("autotune.min_repeats") if min_repeats is None else min_repeats
    max_repeats = config.get_int("autotune.max_repeats") if max_repeats is None else max_repeats
    flush_l2 = config.get_bool("cuda.flush_l2") if flush_l2 is None else flush_l2
    device = torch.device("cuda") if device is None else torch.device(device)
    with torch.cuda.device(device):
        spin_up(torch, device)
        flush = _flush_buffer(torch, device) if flush_l2 else None
        run = _graph_replay(torch, fn, setup) if graph else fn
        calls = GRAPH_BATCH if graph else 1
        before = None if graph else setup

        event: Any = torch.cuda.Event  # untyped in torch's stubs

        host_ms = [_FIRST_HOST_MS]  # the host's time to queue one timed run, as last measured
        gpu_ms = [0.0]  # a run's GPU time, once estimated

        def timed(runs: int) -> list[float]:
            events = [(event(enable_timing=True), event(enable_timing=True)) for _ in range(runs)]
            host_ms[0] = queue_held(torch, device, events, run, before, flush, host_ms[0], gpu_ms[0])
            torch.cuda.synchronize()
            return [start.elapsed_time(end) / calls for start, end in events]

        estimate = sorted(timed(_ESTIMATE_RUNS))[_ESTIMATE_RUNS // 2]
        # Trusted as the GPU's time only well above the host's (the first runs' hold was a guess: runs about as
        # long as the host's are perhaps its pace); a run lasts at least the host's time to queue it, so the
        # budget is planned on the longer of the two.
        gpu_ms[0] = estimate * calls if estimate * calls > 2 * host_ms[0] else 0.0
        warmup, repeats = plan_runs(max(estimate, host_ms[0] / calls), warmup_s=warmup_s, budget_s=budget_s,
                                    min_repeats=min_repeats, max_repeats=max_repeats)
        for _ in range(warmup):
            if before is not None:
                before()
            run()
        samples = timed(repeats)
    method = "cuda-events" + ("+graph" if graph else "") + ("+l2flush" if flush_l2 else "")
    return Timing.from_samples(samples, method)


def _graph_replay(torch: Any, fn: Callable[[], object], setup: Callable[[], object] | None) -> Callable[[], object]:
    """A function replaying ``GRAPH_BATCH`` captured calls of `fn` (after one `setup` and a warm call)."""
    if setup is not None:
        setup()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # a call outside capture first: lazy initialisation must not be captured
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(GRAPH_BATCH):
            fn()
    replay: Callable[[], object] = graph.replay
    return replay


def time_side_by_side_gpu(runs: Sequence[Callable[[], object]], setup: Callable[[], object], typical_ms: float,
                          device: Any = None, *, min_rounds: int = 5, max_rounds: int = 15,
                          budget_s: float | None = None) -> tuple[list[Timing], list[list[float]]]:
    """Alternating rounds of each run, each a batch of event-timed runs (L2 flushed before each, as in
    `benchmark_gpu`): one Timing per run (method ``cuda-events+l2flush+paired``), and per run its batch's
    median in each round (what confirm.confidence compares). Rounds continue past `min_rounds` while the
    budget (twice ``cuda.bench_time_s`` per run) lasts, up to `max_rounds`."""
    import torch

    device = torch.device("cuda") if device is None else torch.device(device)
    flush_l2 = config.get_bool("cuda.flush_l2")
    budget_s = 2 * len(runs) * config.get_float("cuda.bench_time_s") if budget_s is None else budget_s
    batch = max(3, min(100, int(_ROUND_BATCH_MS / max(typical_ms, 1e-6))))
    samples: list[list[float]] = [[] for _ in runs]
    per_round: list[list[float]] = [[] for _ in runs]
    event: Any = torch.cuda.Event
    with torch.cuda.device(device):
        spin_up(torch, device)
        flush = _flush_buffer(torch, device) if flush_l2 else None
        for run in runs:  # warm: a first launch's lazy loading is no round's
            setup()
            run()
        started = time.perf_counter()
        rounds = 0
        host_ms = _FIRST_HOST_MS
        while rounds < min_rounds or (rounds < max_rounds and time.perf_counter() - started < budget_s):
            order = list(range(len(runs)))
            if rounds % 2:
                order.reverse()
            pending: list[tuple[int, list[tuple[Any, Any]]]] = []
            for i in order:
                events = [(event(enable_timing=True), event(enable_timing=True)) for _ in range(batch)]
                host_ms = queue_held(torch, device, events, runs[i], setup, flush, host_ms, typical_ms)
                pending.append((i, events))
            torch.cuda.synchronize()
            for i, events in pending:
                times = [start.elapsed_time(end) for start, end in events]
                samples[i].extend(times)
                per_round[i].append(statistics.median(times))
            rounds += 1
    method = "cuda-events" + ("+l2flush" if flush_l2 else "") + "+paired"
    return [Timing.from_samples(s, method) for s in samples], per_round
