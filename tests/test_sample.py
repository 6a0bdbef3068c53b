"""Ranking choices on a sample of the problem (tune/sample.py): the first rows of some arguments, each choice
rounding them to its own blocks; no decision rests on a sample: the pick is always checked and timed on the whole
problem, and no record of a sample looks faster than it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import tuneforge
from tuneforge import config
from tuneforge.kernels.gemm import op
from tuneforge.kernels.gemm.space import Problem
from tuneforge.kernels.gemm.template import sample_rows
from tuneforge.store.default import default_records
from tuneforge.store.records import Record
from tuneforge.tune.bench import Timing
from tuneforge.tune.choices import ExternChoice
from tuneforge.tune.sample import SAMPLED, RowSample, scaled
from tuneforge.tune.select import clear_memo, select_detailed

ROWS, SAMPLE = 128, 16
rows_seen: dict[str, list[int]] = {}


@pytest.fixture
def tuning(cache_dir: Path) -> Iterator[Path]:
    clear_memo()
    rows_seen.clear()
    with config.patch(autotune_bench_time_s=0.005, autotune_warmup_s=0.0, autotune_min_repeats=3,
                      autotune_settle_s=0.0):
        yield cache_dir
    clear_memo()


def _seen(name: str, x: np.ndarray) -> None:
    rows_seen.setdefault(name, []).append(len(x))


def copy(x: np.ndarray, out: np.ndarray) -> None:  # the reference: 4 ms on the whole, in proportion to the rows
    _seen("copy", x)
    time.sleep(0.004 * len(x) / ROWS)
    np.copyto(out, x)


def right_on_samples_only(x: np.ndarray, out: np.ndarray) -> None:  # the fastest, and wrong past row 64
    _seen("right_on_samples_only", x)
    np.copyto(out, x)
    out[64:] = 0


def slow_on_the_whole(x: np.ndarray, out: np.ndarray) -> None:  # 0.1 ms on a sample: 40 ms on the whole
    _seen("slow_on_the_whole", x)
    time.sleep(0.04 if len(x) > 64 else 0.0001)


def slower_on_the_whole(x: np.ndarray, out: np.ndarray) -> None:  # 0.1 ms on a sample: 200 ms on the whole
    _seen("slower_on_the_whole", x)
    # far slower than copy's estimate (its sample's sleep, 8x), however late a busy host wakes that sleep
    time.sleep(0.2 if len(x) > 64 else 0.0001)
    np.copyto(out, x)


class Sampled(ExternChoice):  # a library call runs whole unless it says its cost per row holds on a sample
    def sample_rows(self, rows: int, total: int) -> int:
        return rows


class InBlocksOf48(Sampled):
    def sample_rows(self, rows: int, total: int) -> int:
        return min(total, -(-rows // 48) * 48)


def blocked_copy(x: np.ndarray, out: np.ndarray) -> None:  # 8 ms on the whole, in proportion to the rows
    _seen("blocked_copy", x)
    time.sleep(0.008 * len(x) / ROWS)
    np.copyto(out, x)


def whole_copy(x: np.ndarray, out: np.ndarray) -> None:  # 8 ms: not sampled, it never says it can be
    _seen("whole_copy", x)
    time.sleep(0.008)
    np.copyto(out, x)


def test_the_pick_is_checked_and_timed_on_the_whole_problem(tuning: Path) -> None:
    x = np.arange(ROWS * 8, dtype=np.float64).reshape(ROWS, 8)
    choices = [Sampled(copy), Sampled(right_on_samples_only), Sampled(slower_on_the_whole),
               InBlocksOf48(blocked_copy), ExternChoice(whole_copy)]
    selection = select_detailed("rows", choices, [x], out=np.empty_like(x), sample=RowSample(args=(0, 1), rows=SAMPLE))
    assert selection.choice.name == "copy"
    records = {r.choice_name: r for r in default_records().get(selection.key)}
    assert records["right_on_samples_only"].status == "wrong_result"  # right on every sample, wrong on the whole
    # its 4 ms on the whole (7.4 ms with a second test process on the 2 cores), far from the sample's 0.5 ms and
    # slower_on_the_whole's 200
    assert SAMPLED not in records["copy"].method and 3.5 < records["copy"].median_ms < 40
    assert SAMPLED not in records["slower_on_the_whole"].method  # its estimate was the best: it ran on the whole
    assert records["slower_on_the_whole"].median_ms > 150
    assert SAMPLED in records["blocked_copy"].method  # never the fastest: an estimate only, ranked after the pick
    assert records["blocked_copy"].median_ms > records["copy"].median_ms
    assert set(rows_seen["blocked_copy"]) == {48}  # rounded by the choice to its blocks
    assert SAMPLE in rows_seen["copy"] and ROWS in rows_seen["copy"]  # the whole: the reference, then the pick
    assert set(rows_seen["whole_copy"]) == {ROWS} and SAMPLED not in records["whole_copy"].method
    ok = [r.median_ms for r in records.values() if r.status == "ok"]
    assert min(ok) == records["copy"].median_ms


def paced_copy(x: np.ndarray, out: np.ndarray, *, ms: float) -> None:  # `ms` on the whole, in proportion
    _seen("paced_copy", x)
    time.sleep(ms / 1000 * len(x) / ROWS)
    np.copyto(out, x)


def test_screened_contenders_are_timed_again_on_their_samples(tuning: Path) -> None:
    """More than 8 choices: each is screened on its sample, the contenders timed again there, the fastest on the
    whole; the arguments are restored whole between choices."""
    x = np.arange(ROWS * 8, dtype=np.float64).reshape(ROWS, 8)
    # three close contenders, six far behind (sleeps on a busy host wake late: close ones can swap places)
    choices = [Sampled(paced_copy, name=f"paced_{i}", ms=(4.0 if i < 3 else 12.0) + 0.2 * i) for i in range(9)]
    selection = select_detailed("rows", choices, [x], out=np.empty_like(x), sample=RowSample(args=(0, 1), rows=SAMPLE))
    records = {r.choice_name: r for r in default_records().get(selection.key)}
    assert len(records) == 9 and all(r.status == "ok" for r in records.values())
    assert any("+screened" not in r.method and SAMPLED in r.method for r in records.values())  # timed again
    assert SAMPLED not in records[selection.choice.name].method
    assert selection.choice.name in ("paced_0", "paced_1", "paced_2")


def test_a_selection_without_a_sample_runs_everything_whole(tuning: Path) -> None:
    x = np.ones((ROWS, 8))
    selection = select_detailed("rows", [ExternChoice(copy), ExternChoice(slow_on_the_whole)], [x],
                                out=np.empty_like(x))
    assert {r for rows in rows_seen.values() for r in rows} == {ROWS}
    assert all(SAMPLED not in r.method for r in default_records().get(selection.key))


def test_the_reference_run_is_the_references_check(tuning: Path) -> None:
    """A large problem's run can take a second: the reference, whose run made the expected outputs, is not run
    again to be checked; its timed runs follow."""
    x = np.ones((ROWS, 8))
    selection = select_detailed("rows", [ExternChoice(copy), ExternChoice(slow_on_the_whole)], [x],
                                out=np.empty_like(x))
    timed = {r.choice_name: r.count for r in default_records().get(selection.key)}
    # the reference run, one untimed run to wake it up again (a short run: see Trials._run), then the timed runs
    assert len(rows_seen["copy"]) == 2 + timed["copy"]
    assert len(rows_seen["slow_on_the_whole"]) == 1 + timed["slow_on_the_whole"]  # its check, then the timed runs


def test_a_sample_must_name_arrays_of_equal_rows(tuning: Path) -> None:
    x, y = np.ones((ROWS, 8)), np.ones((ROWS // 2, 8))
    choices = [ExternChoice(copy), ExternChoice(whole_copy)]
    with pytest.raises(ValueError, match=r"names \[3\], which are not arrays: positions 0..0 are the inputs, 1 the"):
        select_detailed("rows", choices, [x], out=np.empty_like(x), sample=RowSample(args=(0, 3), rows=4))
    with pytest.raises(ValueError, match=r"differ in rows \(\[64, 128\]\)"):
        select_detailed("rows", choices, [x], out=np.empty_like(y), sample=RowSample(args=(0, 1), rows=4))
    assert default_records().count() == 0  # nothing ran


def test_row_sample_contract() -> None:
    with pytest.raises(ValueError, match="rows must be at least 1"):
        RowSample(args=(0,), rows=0)
    with pytest.raises(ValueError, match="names no argument"):
        RowSample(args=(), rows=4)
    sample = RowSample(args=(0, 2), rows=3)
    a, b, out = np.arange(20).reshape(10, 2), np.ones(4), np.zeros((10, 2))
    assert sample.total([a, b, out]) == 10
    with pytest.raises(ValueError, match="differ in rows"):
        sample.total([a, b, np.zeros((9, 2))])
    cut = sample.cut([a, b, out], 3)
    assert cut[0].shape == (3, 2) and cut[1] is b and cut[2].shape == (3, 2)
    cut[2][:] = 7  # a view: writing into the sample writes into the whole
    assert (out[:3] == 7).all() and (out[3:] == 0).all()
    assert sample.cut([None, b, out], 3)[0] is None  # nothing kept there (a snapshot of outputs only)
    timing = scaled(Timing(1.0, 0.5, 1.0, 0.8, 1.2, 2.0, 5, "cpu-perf_counter"), 4.0)
    assert (timing.median_ms, timing.min_ms, timing.max_ms, timing.count) == (4.0, 2.0, 8.0, 5)
    assert timing.method == "cpu-perf_counter" + SAMPLED


def test_gemm_configurations_sample_whole_blocks() -> None:
    config_ = {"MC": 100, "threads": 2, "par": 0}
    assert sample_rows(config_, 150, 1000) == 200  # one M block for each thread
    assert sample_rows(config_, 250, 1000) == 400
    assert sample_rows({**config_, "par": 1}, 150, 1000) == 200  # threads split N: whole M blocks only
    assert sample_rows(config_, 900, 1000) == 1000  # never more than the whole
    assert sample_rows({"MMAX": 8, "MC": 0, "threads": 2, "par": 0}, 4, 8) == 8  # the few-rows kernel: whole
    few_cols = {"NCOLS": 5, "ROWS": 3, "MC": 0, "threads": 2, "par": 0}  # each row its own: whole passes of 3
    assert [sample_rows(few_cols, rows, 1000) for rows in (100, 998, 1000)] == [102, 999, 1000]


def test_gemm_samples_large_problems_only() -> None:
    assert op.sample_for(Problem(1024, 1024, 1024, "float32")) is None
    sample = op.sample_for(Problem(2048, 2048, 2048, "float32"))
    assert sample is not None and sample.args == (0, 5) and sample.rows == 256
    assert op.sample_for(Problem(8192, 2048, 2048, "float64")).rows == 1024  # type: ignore[union-attr]
    assert op.sample_for(Problem(300, 8192, 8192, "float32")) is None  # too few rows to cut


def test_sampled_gemm_tuning_is_right_and_picks_a_whole_timing(tuning: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(op, "SAMPLE_FLOPS", 0)
    monkeypatch.setattr(op, "SAMPLE_ROWS", 32)
    rng = np.random.default_rng(3)
    # K deep enough for M blocks of a few hundred rows: a sample is a few blocks, not the whole
    a, b = rng.standard_normal((1024, 512)), rng.standard_normal((512, 64))
    out = tuneforge.gemm(a, b)
    np.testing.assert_allclose(out, a @ b, rtol=1e-10, atol=1e-10)
    records = default_records().records("gemm")
    assert any(SAMPLED in r.method for r in records), [r.method for r in records]
    ok = sorted((r for r in records if r.status == "ok"), key=lambda r: r.median_ms)
    assert ok and SAMPLED not in ok[0].method  # the fastest record, the pick's, was timed on the whole



def long_copy(x: np.ndarray, out: np.ndarray) -> None:  # 60 ms a run, whatever the rows
    _seen("long_copy", x)
    time.sleep(0.06)
    np.copyto(out, x)


def test_a_check_that_lasted_max_bench_s_is_the_timing(tuning: Path) -> None:
    """An unsampled choice whose checked run alone lasted autotune.max_bench_s is not run again to be timed (a large
    library call's second run was a quarter of a cold tuning); a shorter check is followed by timed runs."""
    x = np.ones((ROWS, 8))
    choices = [ExternChoice(long_copy), ExternChoice(copy)]  # copy: 4 ms, far ahead of the reference's 60
    with config.patch(autotune_max_bench_s=0.05):
        selection = select_detailed("rows", choices, [x], out=np.empty_like(x))
    timed = {r.choice_name: r.count for r in default_records().get(selection.key)}
    assert selection.choice.name == "copy"
    assert len(rows_seen["long_copy"]) == 1 and timed["long_copy"] == 1  # the reference's run: check and timing
    assert timed["copy"] >= 3 and len(rows_seen["copy"]) == 1 + timed["copy"]  # its check, then timed runs
    rows_seen.clear()
    clear_memo()
    with config.patch(autotune_max_bench_s=0.5):  # a check shorter than the cap: timed runs follow it
        selection = select_detailed("rows2", choices, [x], out=np.empty_like(x))
    timed = {r.choice_name: r.count for r in default_records().get(selection.key)}
    assert timed["long_copy"] >= 2 and len(rows_seen["long_copy"]) >= 2


def long_library(x: np.ndarray, out: np.ndarray) -> None:  # the reference: 70 ms a run, whatever the rows
    _seen("long_library", x)
    time.sleep(0.07)
    np.copyto(out, x)


def long_kernel(x: np.ndarray, out: np.ndarray) -> None:  # 60 ms on the whole, in proportion to the rows
    _seen("long_kernel", x)
    time.sleep(0.06 * len(x) / ROWS)
    np.copyto(out, x)


def _library_against_a_long_kernel(max_bench_s: float) -> dict[str, Record]:
    """The records of a sampled selection of long_library (the reference) and long_kernel, which narrowly beats it."""
    x = np.arange(ROWS * 8, dtype=np.float64).reshape(ROWS, 8)
    with config.patch(autotune_max_bench_s=max_bench_s):
        selection = select_detailed("rows", [ExternChoice(long_library), Sampled(long_kernel)], [x],
                                    out=np.empty_like(x), sample=RowSample(args=(0, 1), rows=SAMPLE))
    return {r.choice_name: r for r in default_records().get(selection.key)}


def test_a_long_whole_run_just_made_is_its_first_round_beside_the_library(tuning: Path) -> None:
    """The sampled pick's whole run (its check and timing, a long one) came right before its side-by-side re-timing
    beside the library call it narrowly beats: it is that re-timing's first round, not run again (a 4096^3 GEMM
    kernel's second whole run was 0.7-1.4 s of a cold tuning); long runs make one round, so it ran whole once."""
    records = _library_against_a_long_kernel(max_bench_s=0.05)
    assert "+paired" in records["long_kernel"].method and "+paired" in records["long_library"].method
    assert rows_seen["long_kernel"].count(ROWS) == 1  # its whole run, which the paired round took as it was
    assert rows_seen["long_library"].count(ROWS) == 2  # the reference's run, then its paired round
    assert records["long_kernel"].count == 1 and 55 < records["long_kernel"].median_ms < 200


def test_with_max_bench_s_0_no_run_is_long(tuning: Path) -> None:
    """autotune.max_bench_s 0 means never: the pick's whole run is no paired round of its own (nor its check a
    timing), and the side-by-side re-timing makes its full rounds."""
    records = _library_against_a_long_kernel(max_bench_s=0.0)
    assert "+paired" in records["long_kernel"].method
    whole_runs = rows_seen["long_kernel"].count(ROWS)
    # its check and at least one timed run before the rounds, then every round (MIN_ROUNDS at least)
    assert whole_runs >= 2 + records["long_kernel"].count >= 2 + 5, (whole_runs, records["long_kernel"].count)
