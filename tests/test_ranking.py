"""A selection's pick from its records: the fastest, unless a library call is within the margin of it."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tuneforge import config
from tuneforge.store.default import default_records
from tuneforge.store.records import Record
from tuneforge.tune.choices import CallableChoice, Choice, ExternChoice
from tuneforge.tune.ranking import ranked
from tuneforge.tune.report import format_table
from tuneforge.tune.select import clear_memo, select_detailed

from .conftest import tuning_in_process


def library(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    np.add(a, b, out=out)


def kernel(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    out[:] = a + b


LIBRARY, KERNEL = ExternChoice(library), CallableChoice(kernel, {}, name="kernel")
OTHER = CallableChoice(kernel, {"x": 1}, name="kernel_x1")


def records(times: dict[Choice, float], method: str = "cpu-perf_counter") -> dict[str, Record]:
    return {c.hash_key: Record(key="k", choice=c.hash_key, op="add", choice_name=c.name, status="ok", median_ms=t,
                               min_ms=t, mean_ms=t, method=method) for c, t in times.items()}


def test_a_library_call_within_the_margin_stays_the_pick() -> None:
    order, displaced = ranked([LIBRARY, KERNEL, OTHER], records({LIBRARY: 1.015, KERNEL: 1.0, OTHER: 1.1}), "median")
    assert order == [LIBRARY, KERNEL, OTHER] and displaced is KERNEL


def test_a_kernel_faster_by_more_than_the_margin_wins() -> None:
    order, displaced = ranked([LIBRARY, KERNEL, OTHER], records({LIBRARY: 1.03, KERNEL: 1.0, OTHER: 1.01}), "median")
    assert order == [KERNEL, OTHER, LIBRARY] and displaced is None
    with config.patch(autotune_library_margin=0.0):  # 0: whichever timed fastest
        order, displaced = ranked([LIBRARY, KERNEL], records({LIBRARY: 1.0001, KERNEL: 1.0}), "median")
    assert order == [KERNEL, LIBRARY] and displaced is None
    with config.patch(autotune_library_margin=0.05):
        order, displaced = ranked([LIBRARY, KERNEL], records({LIBRARY: 1.03, KERNEL: 1.0}), "median")
    assert order == [LIBRARY, KERNEL] and displaced is KERNEL


def test_a_library_timed_on_a_sample_only_keeps_no_place() -> None:
    times = records({KERNEL: 1.0})
    times.update(records({LIBRARY: 1.005}, method="cpu-perf_counter+sample"))
    assert ranked([LIBRARY, KERNEL], times, "median") == ([KERNEL, LIBRARY], None)


def test_a_choice_timed_briefly_only_comes_after_those_timed_fully() -> None:
    """Screened, not a contender: its brief figure, taken at another moment, does not beat the contenders' full ones."""
    times = records({KERNEL: 1.0})
    times.update(records({OTHER: 0.97}, method="cpu-perf_counter+screened"))
    assert ranked([KERNEL, OTHER], times, "median") == ([KERNEL, OTHER], None)
    only_screened = records({KERNEL: 1.0, OTHER: 0.97}, method="cpu-perf_counter+screened")
    assert ranked([KERNEL, OTHER], only_screened, "median")[0] == [OTHER, KERNEL]  # among themselves: the fastest


def test_the_fastest_library_call_is_the_pick_whatever_the_margin() -> None:
    other_library = ExternChoice(kernel, name="other_library")
    order, displaced = ranked([LIBRARY, other_library, KERNEL],
                              records({LIBRARY: 1.0, other_library: 0.99, KERNEL: 1.2}), "median")
    assert order[0] is other_library and displaced is None


@pytest.fixture
def tuning(cache_dir: Path) -> Iterator[Path]:
    clear_memo()
    with tuning_in_process(cache_dir, bench_time_s=0.000001, min_repeats=3) as where:
        yield where
    clear_memo()


def test_a_selection_from_records_keeps_the_library_and_says_why(tuning: Path) -> None:
    inputs = [np.ones(16), np.ones(16)]
    first = select_detailed("add", [LIBRARY, KERNEL], inputs, out=np.empty(16))
    clear_memo()
    # the records rewritten: the kernel 1% ahead of the library
    for r in default_records().get(first.key):
        t = 1.0 if r.choice_name == "kernel" else 1.01
        default_records().put(dataclasses.replace(r, median_ms=t, min_ms=t, mean_ms=t))
    again = select_detailed("add", [LIBRARY, KERNEL], inputs, out=np.empty(16))
    assert again.source == "records" and again.choice.name == LIBRARY.name
    clear_memo()
    with config.patch(autotune_library_margin=0.0):
        assert select_detailed("add", [LIBRARY, KERNEL], inputs, out=np.empty(16)).choice.name == "kernel"
    assert again.report is not None and again.report.extra["library_margin"]["over"] == "kernel"
    assert "AUTOTUNE pick: library, a library call, kept ahead of kernel: within 2% of it" in \
        format_table(again.report, None)
    clear_memo()
    with config.patch(autotune_library_margin=0.0):
        fastest = select_detailed("add", [LIBRARY, KERNEL], inputs, out=np.empty(16))
    assert fastest.choice.name == "kernel" and "library_margin" not in fastest.report.extra  # type: ignore[union-attr]
