"""The GPU benchmark: the run-count policy everywhere, the CUDA-event timing on a real GPU (marked gpu)."""

from __future__ import annotations

import pytest

from tuneforge.tune.bench_gpu import GRAPH_BATCH, benchmark_gpu, host_ahead_ms, l2_flush_bytes, plan_runs


def test_run_counts_follow_the_time_budget() -> None:
    # 0.1 ms a run: 20 ms of warm-up is 200 runs, 50 ms of timing 500, capped at max_repeats.
    assert plan_runs(0.1, warmup_s=0.02, budget_s=0.05, min_repeats=5, max_repeats=10_000) == (200, 500)
    assert plan_runs(0.1, warmup_s=0.02, budget_s=0.05, min_repeats=5, max_repeats=100) == (200, 100)
    # A 40 ms kernel: one warm-up run, and min_repeats even though two runs pass the budget.
    assert plan_runs(40.0, warmup_s=0.02, budget_s=0.05, min_repeats=5, max_repeats=100) == (1, 5)
    # A kernel reported as taking no time at all does not ask for unbounded runs.
    warmup, repeats = plan_runs(0.0, warmup_s=0.02, budget_s=0.05, min_repeats=5, max_repeats=100)
    assert warmup == 1000 and repeats == 100
    with pytest.raises(ValueError, match="max_repeats"):
        plan_runs(1.0, warmup_s=0.0, budget_s=0.0, min_repeats=1, max_repeats=0)


def test_the_l2_flush_writes_twice_the_cache() -> None:
    assert l2_flush_bytes(50 * 2**20) == 100 * 2**20
    assert l2_flush_bytes(None) == l2_flush_bytes(0) == 100 * 2**20  # unknown: an H100's size


def _need_cuda() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.mark.gpu
def test_a_matmul_is_timed_with_events_and_a_flushed_l2() -> None:
    _need_cuda()
    import torch as t

    a = t.randn(2048, 2048, device="cuda", dtype=t.float16)
    b = t.randn(2048, 2048, device="cuda", dtype=t.float16)
    small = benchmark_gpu(lambda: a[:256, :256] @ b[:256, :256], budget_s=0.02, warmup_s=0.005,
                          min_repeats=5, max_repeats=1000)
    large = benchmark_gpu(lambda: a @ b, budget_s=0.02, warmup_s=0.005, min_repeats=5, max_repeats=1000)
    assert small.method == large.method == "cuda-events+l2flush"
    assert 0 < small.min_ms < large.median_ms  # 512x more work takes longer
    assert 5 <= large.count <= 1000
    flops = 2 * 2048**3 / (large.median_ms * 1e-3)
    assert 1e12 < flops < 5e15  # a plausible rate for a GPU, not a host-side launch time


@pytest.mark.gpu
def test_graph_replay_divides_by_the_calls_it_captured() -> None:
    _need_cuda()
    import torch as t

    x = t.zeros(1024, device="cuda")
    calls = []

    def setup() -> None:
        calls.append("setup")

    timing = benchmark_gpu(lambda: x.add_(1.0), setup=setup, graph=True, flush_l2=False, budget_s=0.01,
                           warmup_s=0.001, min_repeats=3, max_repeats=50)
    assert timing.method == "cuda-events+graph"
    assert calls == ["setup"]  # once, before the capture
    t.cuda.synchronize()
    # Every replay ran GRAPH_BATCH captured adds on top of the one warm call outside the capture.
    assert int(x[0].item()) % GRAPH_BATCH == 1
    assert timing.median_ms < 0.5  # a tiny add, its launch cost amortised over the batch


def test_gpu_timing_settings_default_to_a_flushed_l2_and_a_short_budget() -> None:
    from tuneforge import config

    assert config.get_bool("cuda.flush_l2") is True
    assert 0 < config.get_float("cuda.bench_time_s") < config.get_float("autotune.bench_time_s")
    assert config.get_float("cuda.spin_up_s") > 0


@pytest.mark.gpu
def test_the_first_timing_of_a_process_follows_a_spin_up_of_the_clocks() -> None:
    _need_cuda()
    import torch as t

    from tuneforge.tune import bench_gpu

    bench_gpu._spun_up.clear()
    device = t.device("cuda", t.cuda.current_device())
    started = t.cuda.Event(enable_timing=True)
    started.record()
    bench_gpu.spin_up(t, device, seconds=0.05)
    ended = t.cuda.Event(enable_timing=True)
    ended.record()
    t.cuda.synchronize()
    assert started.elapsed_time(ended) >= 40  # the GPU was kept busy, not just the host
    again = time_of(lambda: bench_gpu.spin_up(t, device, seconds=1.0))
    assert again < 0.05  # once per device and process


def time_of(fn: object) -> float:
    import time

    started = time.perf_counter()
    fn()  # type: ignore[operator]
    return time.perf_counter() - started


@pytest.mark.gpu
def test_side_by_side_rounds_order_two_products_by_their_work() -> None:
    _need_cuda()
    import torch as t

    from tuneforge.tune.bench_gpu import time_side_by_side_gpu
    from tuneforge.tune.confirm import confidence

    a = t.randn(4096, 4096, device="cuda", dtype=t.float16)
    b = t.randn(4096, 4096, device="cuda", dtype=t.float16)
    out = t.empty(4096, 4096, device="cuda", dtype=t.float16)
    setups = []
    timings, rounds = time_side_by_side_gpu(
        [lambda: t.mm(a[:, :2048], b[:2048], out=out), lambda: t.mm(a, b, out=out)],
        lambda: setups.append(1), typical_ms=0.1, budget_s=0.0)
    assert [len(r) for r in rounds] == [5, 5]  # the minimum of rounds, the budget being spent
    assert all(timing.method == "cuda-events+l2flush+paired" for timing in timings)
    assert timings[0].median_ms < timings[1].median_ms  # half the K, half the work
    sure = confidence(rounds[0], rounds[1], "full")
    assert sure["faster_in"] == 5 and sure["p"] <= 1 / 32
    assert len(setups) == sum(t_.count for t_ in timings) + 2  # before every timed run and each warm run


def test_the_gpu_is_held_long_enough_for_the_host_to_queue_a_batch_and_no_longer() -> None:
    assert host_ahead_ms(0.05, 100) == pytest.approx(7.5)  # 100 runs of 50 us each, with half again as margin
    assert host_ahead_ms(0.05, 100, gpu_ms=0.03) == pytest.approx(4.5)  # the GPU's own work gives the host time
    assert host_ahead_ms(0.05, 100, gpu_ms=0.2) == 0.0  # the GPU is the slower side: the queue never drains
    assert host_ahead_ms(0.05, 100_000) == 100.0  # capped
    assert host_ahead_ms(-1.0, 10) == 0.0


@pytest.mark.gpu
def test_a_slow_host_side_is_not_timed_as_the_kernels_time() -> None:
    """A run whose host side takes 1 ms before it launches a microsecond kernel: timed at the kernel's time,
    because the GPU waits until the host has queued every run (a Python launch path is no kernel's cost)."""
    _need_cuda()
    import time

    import torch as t

    x = t.zeros(1 << 16, device="cuda")

    def slow_host() -> None:
        time.sleep(0.001)
        x.add_(1.0)

    timing = benchmark_gpu(slow_host, budget_s=0.02, warmup_s=0.0, min_repeats=10, max_repeats=20)
    assert timing.median_ms < 0.3, timing  # not the 1 ms the host took per run


class _Log:
    """A stand-in for torch's CUDA calls that queue_held makes: each call noted in order."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        log = self.calls

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                self.name = "event"

            def record(self) -> None:
                log.append(self.name)

            def synchronize(self) -> None:
                pass

            def elapsed_time(self, other: object) -> float:
                return 5.0  # the calibration's 10M cycles: 2M cycles a millisecond

        def sleep(cycles: int) -> None:
            log.append(f"hold {cycles}")

        self.cuda = type("cuda", (), {"Event": Event, "_sleep": staticmethod(sleep)})


def test_timed_runs_are_queued_in_parts_each_behind_a_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuneforge.tune import bench_gpu

    monkeypatch.setattr(bench_gpu, "_cycles_per_ms", {})
    monkeypatch.setattr(bench_gpu, "_peak_cycles_per_ms", lambda index: None)  # the driver won't say
    fake = _Log()
    device = type("device", (), {"index": 0})()
    pairs = [(fake.cuda.Event(), fake.cuda.Event()) for _ in range(120)]
    for start, end in pairs:
        start.name, end.name = "start", "end"
    host_ms = bench_gpu.queue_held(fake, device, pairs, lambda: fake.calls.append("run"),
                                   lambda: fake.calls.append("setup"), None, 0.1)
    holds = [call for call in fake.calls if call.startswith("hold")]
    assert holds[0] == "hold 10000000"  # the calibration, once
    assert len(holds) == 1 + 3  # parts of 50, 50 and 20 runs
    assert holds[1] == f"hold {int(bench_gpu.host_ahead_ms(0.1, 50) * 2_000_000)}"
    runs = [call for call in fake.calls if not call.startswith("hold") and call != "event"]
    assert runs == ["setup", "start", "run", "end"] * 120  # each run's setup before its start event
    first_part = fake.calls.index(holds[2])
    assert fake.calls[:first_part].count("run") == 50 and host_ms >= 0


@pytest.mark.parametrize(("peak", "rate"), [(3_000_000.0, 3_000_000.0), (1_000_000.0, 2_000_000.0)])
def test_a_hold_lasts_long_enough_at_the_clocks_peak(monkeypatch: pytest.MonkeyPatch, peak: float,
                                                      rate: float) -> None:
    """Calibrated at a lower clock than the peak (2M cycles a ms measured, 3M at the peak), a hold counts its
    cycles at the peak's rate: the clock can only make it longer then, never shorter than the host needs."""
    from tuneforge.tune import bench_gpu

    monkeypatch.setattr(bench_gpu, "_cycles_per_ms", {})
    monkeypatch.setattr(bench_gpu, "_peak_cycles_per_ms", lambda index: peak)
    fake = _Log()
    bench_gpu.hold(fake, type("device", (), {"index": 0})(), 4.0)
    assert fake.calls[-1] == f"hold {int(4.0 * rate)}"
