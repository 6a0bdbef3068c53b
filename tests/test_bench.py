"""CPU benchmarking. Asserts bound what load cannot make more true the wrong way: a sleep never
runs shorter than asked, so lower bounds on sleeps are exact; where a fast call must look fast, the
thing it must not include is made long (tens of ms), or the runs are counted instead of timed."""

from __future__ import annotations

import time

import numpy as np
import pytest

from tuneforge import config
from tuneforge.tune import bench
from tuneforge.tune.bench import Timing, benchmark_cpu, flush_buffer_bytes, flush_last_level_cache


def test_sleep_median_is_about_right() -> None:
    timing = benchmark_cpu(lambda: time.sleep(0.002), warmup_s=0.0, budget_s=0.05, min_repeats=5, max_repeats=30)
    assert 1.9 <= timing.median_ms <= 200.0  # milliseconds: neither seconds nor microseconds
    assert timing.min_ms <= timing.p20_ms <= timing.median_ms <= timing.p80_ms <= timing.max_ms
    assert timing.min_ms <= timing.mean_ms <= timing.max_ms
    assert timing.method == "cpu-perf_counter"


def test_count_respects_min_and_max_repeats() -> None:
    assert benchmark_cpu(lambda: None, min_repeats=7, max_repeats=50, warmup_s=0.0, budget_s=0.0).count == 7
    assert benchmark_cpu(lambda: None, warmup_s=0.0, budget_s=10.0, min_repeats=1, max_repeats=12).count == 12
    # max wins over min
    assert benchmark_cpu(lambda: None, min_repeats=20, max_repeats=4, warmup_s=0.0, budget_s=0.0).count == 4


def test_long_runs_stop_after_two_once_max_bench_s_is_spent() -> None:
    slow = benchmark_cpu(lambda: time.sleep(0.03), warmup_s=0.0, budget_s=0.0, min_repeats=10, max_repeats=50,
                         max_bench_s=0.05)
    assert slow.count == 2
    assert benchmark_cpu(lambda: time.sleep(0.03), warmup_s=0.0, budget_s=0.0, min_repeats=5, max_repeats=50,
                         max_bench_s=0.0).count == 5  # 0 turns the cap off
    assert benchmark_cpu(lambda: None, warmup_s=0.0, budget_s=0.0, min_repeats=8, max_repeats=50,
                         max_bench_s=2.0).count == 8  # fast choices still get min_repeats
    with config.patch(autotune_max_bench_s=0.02):
        assert benchmark_cpu(lambda: time.sleep(0.01), warmup_s=0.0, budget_s=0.0, min_repeats=9).count == 2


def test_a_long_checked_run_counts_as_the_first_timed_run() -> None:
    calls: list[int] = []

    def run(seconds: float) -> None:
        calls.append(1)
        time.sleep(seconds)

    timing = benchmark_cpu(lambda: run(0.06), warmup_s=0.0, budget_s=0.0, min_repeats=9, max_repeats=50,
                           max_bench_s=0.1, warmed=True, first_ns=60_000_000)
    assert timing.count == 2 and len(calls) == 1  # the checked run and one more: 120 ms >= max_bench_s
    assert timing.min_ms >= 60.0
    # A checked run just short of 50 ms is not a sample (cold effects): all 3 samples are new runs.
    calls.clear()
    short = benchmark_cpu(lambda: run(0.0), warmup_s=0.0, budget_s=0.0, min_repeats=3, max_repeats=3,
                          warmed=True, first_ns=49_999_999)
    assert short.count == 3 and len(calls) == 3


def test_two_long_runs_that_agree_are_enough_where_agreement_is_asked() -> None:
    calls: list[int] = []

    def run() -> None:
        calls.append(1)
        time.sleep(0.06)

    # the checked run (60 ms) and one more within the ratio: done before min_repeats (a 1.5 ratio leaves room for
    # a busy host's late wake-ups of the sleep)
    agreed = benchmark_cpu(run, warmup_s=0.0, budget_s=10.0, min_repeats=3, max_repeats=50, max_bench_s=10.0,
                           warmed=True, first_ns=60_000_000, agree=1.5)
    assert agreed.count == 2 and len(calls) == 1, agreed
    # a checked run 1.7x the next one's is no agreement: min_repeats as without it
    calls.clear()
    apart = benchmark_cpu(run, warmup_s=0.0, budget_s=0.0, min_repeats=3, max_repeats=50, max_bench_s=10.0,
                          warmed=True, first_ns=100_000_000, agree=1.5)
    assert apart.count == 3 and len(calls) == 2, apart
    # short runs never stop early, however alike
    calls.clear()
    short = benchmark_cpu(lambda: calls.append(1), warmup_s=0.0, budget_s=0.0, min_repeats=4, max_repeats=50,
                          warmed=True, agree=1.5)
    assert short.count == 4 and len(calls) == 4


def test_a_checked_run_far_slower_than_the_next_is_not_a_sample() -> None:
    # A first call that imported a library (torch's extern in a fresh worker: 1.7 s, then 2.6 ms a run) is no
    # sample, and its time is not taken from the budget: the runs after it are timed as any others.
    calls: list[int] = []

    def run() -> None:
        calls.append(1)
        time.sleep(0.005)

    # a budget of 40 runs of 5 ms: however late a busy host wakes the sleeps, more than the 3 runs that counting the
    # first run against the budget would leave
    timing = benchmark_cpu(run, warmup_s=0.0, budget_s=0.2, min_repeats=3, max_repeats=50, max_bench_s=2.0,
                           warmed=True, first_ns=1_700_000_000)
    assert timing.max_ms < 1000 and timing.count == len(calls) >= 5, timing


def test_unset_arguments_come_from_settings() -> None:
    with config.patch(autotune_warmup_s=0.0, autotune_bench_time_s=30.0, autotune_min_repeats=1,
                      autotune_max_repeats=9):
        assert benchmark_cpu(lambda: None).count == 9
    # max_bench_s off: on a cold machine two runs with the first flush (allocating its buffer) can pass
    # the 0.5 s default, which stops a long kernel's timing after two runs.
    with config.patch(autotune_bench_time_s=0.000001, autotune_min_repeats=6, autotune_max_repeats=100,
                      autotune_flush_cache=True, autotune_max_bench_s=0.0):
        timing = benchmark_cpu(lambda: None, warmup_s=0.0)
    assert timing.count == 6 and timing.method == "cpu-perf_counter+flush"


def test_setup_once_per_run_and_not_timed() -> None:
    calls = {"setup": 0, "fn": 0}

    def setup() -> None:
        calls["setup"] += 1
        time.sleep(0.02)

    def fn() -> None:
        calls["fn"] += 1

    timing = benchmark_cpu(fn, setup=setup, warmup_s=0.0, budget_s=0.0, min_repeats=6, max_repeats=6)
    assert timing.count == 6
    assert calls["setup"] == calls["fn"]  # warm-up runs call setup too
    assert calls["fn"] >= 7  # at least one warm-up run plus the timed ones
    assert timing.median_ms < 10.0  # a timed setup would make every run >= 20 ms


def test_warmup_runs_until_its_time_has_passed() -> None:
    ends: list[float] = []

    def run() -> None:
        time.sleep(0.001)
        ends.append(time.perf_counter())

    started = time.perf_counter()
    benchmark_cpu(run, warmup_s=0.2, budget_s=0.0, min_repeats=1, max_repeats=1)
    *warmup, _timed = ends
    # Warm-up went on until its 200 ms had passed (load only lengthens it), in more than one run.
    assert len(warmup) >= 2 and warmup[-1] >= started + 0.2


def test_budget_stops_the_loop() -> None:
    timing = benchmark_cpu(lambda: time.sleep(0.001), warmup_s=0.0, budget_s=0.05, min_repeats=3, max_repeats=2000)
    assert 3 <= timing.count <= 100


def test_flush_is_called_per_timed_run(monkeypatch: pytest.MonkeyPatch) -> None:
    flushes = []
    monkeypatch.setattr(bench, "flush_last_level_cache", lambda: flushes.append(1))
    timing = benchmark_cpu(lambda: None, flush_cache=True, min_repeats=5, max_repeats=5, warmup_s=0.0, budget_s=0.0)
    assert timing.method == "cpu-perf_counter+flush"
    assert len(flushes) == 5
    flushes.clear()
    plain = benchmark_cpu(lambda: None, flush_cache=False, min_repeats=5, max_repeats=5, warmup_s=0.0, budget_s=0.0)
    assert plain.method == "cpu-perf_counter"
    assert flushes == []


def test_flush_buffer_size() -> None:
    assert flush_buffer_bytes(8 * 2**20) == 16 * 2**20
    assert flush_buffer_bytes(None) == 64 * 2**20
    assert flush_buffer_bytes(2**30) == 256 * 2**20


def test_flush_last_level_cache_writes_its_buffer() -> None:
    flush_last_level_cache()
    buffer = bench._flush_buffer
    assert buffer is not None
    first = int(buffer[0])
    flush_last_level_cache()
    assert bench._flush_buffer is buffer  # allocated once
    assert int(buffer[0]) == first + 1 and int(buffer[-1]) == first + 1
    assert 2 * 2**20 <= buffer.nbytes <= 256 * 2**20


def test_exceptions_propagate_unchanged() -> None:
    class Boom(Exception):
        pass

    def fails() -> None:
        raise Boom("fn")

    with pytest.raises(Boom, match="fn"):
        benchmark_cpu(fails, warmup_s=0.0, budget_s=0.0)
    runs = []

    def fails_later() -> None:
        runs.append(1)
        if len(runs) == 3:
            raise Boom("third")

    with pytest.raises(Boom, match="third"):
        benchmark_cpu(fails_later, min_repeats=10, max_repeats=10, warmup_s=0.0, budget_s=0.0)

    def bad_setup() -> None:
        raise KeyError("setup")

    with pytest.raises(KeyError, match="setup"):
        benchmark_cpu(lambda: None, setup=bad_setup, warmup_s=0.0, budget_s=0.0)


def test_gc_state_restored_after_exception() -> None:
    import gc

    assert gc.isenabled()
    with pytest.raises(ZeroDivisionError):
        benchmark_cpu(lambda: 1 / 0, warmup_s=0.0, budget_s=0.0)
    assert gc.isenabled()


def test_timing_stat_json_and_quantiles() -> None:
    timing = Timing.from_samples([5.0, 1.0, 2.0, 4.0, 3.0], "cpu-perf_counter")
    assert (timing.min_ms, timing.median_ms, timing.max_ms, timing.mean_ms) == (1.0, 3.0, 5.0, 3.0)
    assert timing.p20_ms == pytest.approx(np.quantile([1, 2, 3, 4, 5], 0.2))
    assert timing.p80_ms == pytest.approx(np.quantile([1, 2, 3, 4, 5], 0.8))
    assert timing.stat("median") == 3.0 and timing.stat("min") == 1.0 and timing.stat("mean") == 3.0
    with pytest.raises(ValueError, match="unknown timing statistic 'p99'"):
        timing.stat("p99")
    data = timing.to_json()
    assert data["count"] == 5 and data["method"] == "cpu-perf_counter"
    assert Timing.from_json(data) == timing
    single = Timing.from_samples([2.5], "x")
    assert single.p20_ms == single.p80_ms == single.median_ms == 2.5


def test_abandons_a_choice_slower_than_the_threshold() -> None:
    from tuneforge.tune.bench import benchmark_cpu

    calls = []

    def slow() -> None:
        calls.append(1)
        time.sleep(0.003)

    timing = benchmark_cpu(slow, warmup_s=0.0, budget_s=1.0, min_repeats=10, max_repeats=100, abandon_ms=1.0,
                           warmed=True)
    assert timing.count == 2 and timing.method.endswith("+abandoned") and len(calls) == 2
    kept = benchmark_cpu(slow, warmup_s=0.0, budget_s=0.02, min_repeats=3, max_repeats=100, abandon_ms=1000.0)
    assert kept.count >= 3 and "abandoned" not in kept.method


def test_a_checked_run_counts_toward_abandoning_only() -> None:
    """With `abandon_first`, the checked run just made is the first of the two runs past the threshold that abandon
    a choice (one timed run more, not two); a choice not abandoned is timed on runs of its own only."""
    from tuneforge.tune.bench import benchmark_cpu

    calls = []

    def run() -> None:
        calls.append(1)
        time.sleep(0.003)

    timing = benchmark_cpu(run, warmup_s=0.0, budget_s=1.0, min_repeats=5, abandon_ms=1.0, warmed=True,
                           first_ns=3_000_000, abandon_first=True)
    assert timing.method.endswith("+abandoned") and timing.count == 2 and len(calls) == 1
    calls.clear()
    fast_check = benchmark_cpu(run, warmup_s=0.0, budget_s=0.001, min_repeats=3, abandon_ms=1.0, warmed=True,
                               first_ns=500_000, abandon_first=True)  # the check within it: two timed runs decide
    assert fast_check.method.endswith("+abandoned") and len(calls) == 2 and fast_check.min_ms >= 2.5
    calls.clear()
    kept = benchmark_cpu(run, warmup_s=0.0, budget_s=0.001, min_repeats=3, abandon_ms=1000.0, warmed=True,
                         first_ns=100_000, abandon_first=True)
    assert kept.count == 3 and len(calls) == 3 and kept.min_ms >= 2.5  # the 0.1 ms check is no sample


def test_a_warm_up_of_long_runs_stops_once_it_has_lasted_enough() -> None:
    """A library's batch warms its threads up with a few runs, unless those runs are long (confirm.py)."""
    runs: list[float] = []

    def run(seconds: float) -> None:
        runs.append(seconds)
        time.sleep(seconds)

    bench.warm_up(lambda: run(0.02), 0.003, at_least=3, enough_s=0.015)
    assert len(runs) == 1  # 20 ms lasted enough
    runs.clear()
    bench.warm_up(lambda: run(0.02), 0.003, at_least=3)
    assert len(runs) == 3
    runs.clear()
    bench.warm_up(lambda: run(0.001), 0.003, at_least=3, enough_s=0.015)
    assert 3 <= len(runs) < 15  # short runs: the runs asked for (and the ramp's time), long before 15 ms
    started = time.perf_counter()
    bench.warm_up(lambda: run(0.001), 0.03, at_least=1, enough_s=0.015)
    assert time.perf_counter() - started >= 0.03  # never shorter than the time asked for
