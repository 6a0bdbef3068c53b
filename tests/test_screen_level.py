"""A crowded screening's level and the side-by-side re-timing's anchor do not let one slow or low timing set the
figures of many choices (screening.ScreenLevel.unsteady, paired.time_paired): no record reads faster than its
choice runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tuneforge import config
from tuneforge.store.default import default_records
from tuneforge.store.records import Record
from tuneforge.tune import trials as trials_module
from tuneforge.tune.bench import Timing
from tuneforge.tune.choices import CallableChoice, Choice, ExternChoice
from tuneforge.tune.input_guard import InputGuard
from tuneforge.tune.job import TrialJob, make_record
from tuneforge.tune.paired import time_paired
from tuneforge.tune.screening import CONTROL_EVERY, ScreenLevel
from tuneforge.tune.select import select_detailed
from tuneforge.tune.specs import TensorSpec

from .conftest import tuning_in_process
from .test_confirm import spin, spinning_add


@pytest.fixture
def tuning(cache_dir: Path) -> Iterator[Path]:
    with tuning_in_process(cache_dir, bench_time_s=0.000001, min_repeats=5) as where:
        yield where


def _job() -> TrialJob:
    spec = TensorSpec(dtype="float64", sizes=(16,), strides=(1,))
    return TrialJob(name="level", key="sel-level", outputs=[2], arg_specs=[spec, spec], out_spec=spec)


def _timing(ms: float, method: str = "cpu-perf_counter") -> Timing:
    return Timing(median_ms=ms, min_ms=ms, mean_ms=ms, p20_ms=ms, p80_ms=ms, max_ms=ms, count=3, method=method)


def _screened_control(level: ScreenLevel, ms: float) -> None:
    """Screen CONTROL_EVERY choices, the first of them the fastest (`ms`): it becomes the control."""
    job = _job()
    for i in range(CONTROL_EVERY):
        choice = ExternChoice(spinning_add(0.0), name=f"c{i}")
        level.seen(choice, make_record(job, choice, "ok", timing=_timing(ms if i == 0 else 2 * ms,
                                                                        "cpu-perf_counter+screened")))


def _measure(level: ScreenLevel, timings: list[float]) -> int:
    """Take the level from the control's timings in turn; how many were asked for."""
    asked = iter(timings)
    count = 0

    def time_control() -> float:
        nonlocal count
        count += 1
        return next(asked)
    level.measure(time_control)
    return count


def test_a_slow_base_timing_is_taken_again() -> None:
    """The control screened at 1.0 ms times 3.0 ms right after the first choices (a hiccup): it is timed again
    at once (1.0), and the lower sets the base, not a level of 1/3 for what follows."""
    level = ScreenLevel()
    _screened_control(level, 1.0)
    assert _measure(level, [3.0, 1.0]) == 2
    assert _measure(level, [1.02]) == 1
    assert level.level == pytest.approx(1.02)


def test_a_lone_slow_control_timing_does_not_move_the_level() -> None:
    """A control timing 3x the base is taken again; the second is as before: the level stays near 1, where the
    lone timing would have divided the next sixteen choices' figures by 3."""
    level = ScreenLevel()
    _screened_control(level, 1.0)
    _measure(level, [1.0])
    assert _measure(level, [3.0, 1.05]) == 2
    assert level.level == pytest.approx(1.05)


def test_a_slow_spell_moves_the_level_when_both_timings_show_it() -> None:
    level = ScreenLevel()
    _screened_control(level, 1.0)
    _measure(level, [1.0])
    assert _measure(level, [2.0, 2.1]) == 2
    assert level.level == pytest.approx(2.0)
    assert _measure(level, [2.1]) == 1  # steady at the new level: one timing
    assert level.level == pytest.approx(2.1)


class _Trials:
    """What time_paired uses of a run of trials (paired.Trials), on real inputs."""

    def __init__(self, job: TrialJob) -> None:
        self.job = job
        self.args: list[Any] = [np.ones(16), np.ones(16), np.empty(16)]
        self.initial: list[Any] = [a.copy() for a in self.args]
        self.bench_s = 0.0
        self.guard = InputGuard(self.args, self.initial, [])

    def restored_for_timing(self, mutated: Any) -> list[int]:
        return []


@pytest.mark.parametrize("method", ["cpu-perf_counter", "cpu-perf_counter+screened"])
def test_paired_records_keep_the_level_of_most_first_timings_not_the_lowest(tuning: Path, method: str) -> None:
    """Three choices that each run 1 ms, first timed 1.0, 1.05 and 0.4 ms (the last low: screened after a slow
    control timing). Re-timed side by side, their records are at the level of most of their first full timings
    (anchored at the lowest first figure, all three read 0.4 ms, 2.5x faster than they run); first timed briefly
    (screened), they keep their paired figures."""
    job = _job()
    with config.patch(autotune_bench_time_s=0.02, autotune_min_repeats=3):
        tie = [(choice, make_record(job, choice, "ok", timing=_timing(ms, method)))
               for choice, ms in ((ExternChoice(spinning_add(0.001), name=f"k{i}"), ms)
                                  for i, ms in enumerate((1.0, 1.05, 0.4)))]
        records = time_paired(_Trials(job), tie)
    assert len(records) == 3
    assert all(r.median_ms is not None and r.median_ms >= 0.8 for r in records), [r.median_ms for r in records]
    if "+screened" in method:
        assert all(r.info["paired_scale"] == 1.0 for r in records)


def test_a_library_calls_slow_first_timing_sets_no_level_for_the_kernels(tuning: Path) -> None:
    """A kernel and a library call that both run 1 ms, first timed 1.0 and 5.0 ms (the library's threads waking):
    re-timed side by side, the kernel keeps its first figure; the mean of the two ratios (the median of two) would
    have recorded it at 3 ms."""
    def kernel(a: Any, b: Any, out: Any, **params: Any) -> None:
        spin(0.001)
        np.add(a, b, out=out)

    job = _job()
    with config.patch(autotune_bench_time_s=0.02, autotune_min_repeats=3):
        tie = [(choice, make_record(job, choice, "ok", timing=_timing(ms)))
               for choice, ms in ((CallableChoice(kernel, {"i": 0}, name="kernel"), 1.0),
                                  (ExternChoice(spinning_add(0.001), name="library"), 5.0))]
        records = time_paired(_Trials(job), tie)
    assert records and records[0].median_ms is not None and records[0].median_ms < 1.5, [r.median_ms for r in records]


def test_a_hiccup_in_the_control_timing_sets_no_record_below_its_choice(tuning: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Forty choices of known times; the host stalls (every run 3x slow) while the screening's control is timed
    after the 32nd, and only then. Taken from that timing alone, the level (3) divided the last choices' brief
    figures by 3 (c33, 0.9 ms, read 0.30), the contenders re-timed side by side were anchored at the lowest of
    them, and `control` (0.6 ms) was recorded at 0.30 ms and picked over `late` (0.5). Timed again at once,
    the control shows no change, and no record reads much faster than its choice runs."""
    stall = {"on": False}
    retimes = {"count": 0}
    original = trials_module.Trials.retime

    def stalling_retime(self: Any, choice: Choice, screened: Record, budget_s: float | None = None) -> Record:
        retimes["count"] += 1
        stall["on"] = budget_s is not None and retimes["count"] == 2  # the control's first timing after 32 choices
        try:
            return original(self, choice, screened, budget_s)
        finally:
            stall["on"] = False

    def make(name: str, seconds: float) -> Choice:
        def run(a: Any, b: Any, out: Any) -> None:
            spin(seconds * (3 if stall["on"] else 1))
            np.add(a, b, out=out)
        return ExternChoice(run, name=name)

    monkeypatch.setattr(trials_module.Trials, "retime", stalling_retime)
    times = {i: 0.0009 for i in range(40)} | {0: 0.0006, 36: 0.0005}
    names = {0: "control", 36: "late"}
    choices = [make(names.get(i, f"c{i}"), t) for i, t in times.items()]
    with config.patch(autotune_bench_time_s=0.02, autotune_min_repeats=3, autotune_confirm_margin=0.0):
        selection = select_detailed("stall", choices, [np.ones(16), np.ones(16)], out=np.empty(16))
    records = {r.choice_name: r for r in default_records().get(selection.key)}
    assert retimes["count"] >= 3  # the stalled timing was taken again
    assert selection.choice.name == "late"
    low = {name: r.median_ms for name, r in records.items()
           if r.status == "ok" and r.median_ms is not None and r.median_ms < 0.7 * 1000 * times[
               next(i for i, c in enumerate(choices) if c.name == name)]}
    assert not low, low
    assert all(r.info.get("screen_level", 1.0) < 1.5 for r in records.values())
