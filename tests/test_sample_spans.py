"""A sample whose rows are independent of each other (RowSample(independent_rows=True), as tuneforge.gemm's): the
reference runs on spans of rows (the longest sample, the middle, the end), never on the whole problem, and a run
of the whole problem is compared there and required to have written every row; where that cannot be told, the
reference runs on the whole after all."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tuneforge.store.default import default_records
from tuneforge.tune import verify
from tuneforge.tune.choices import ExternChoice
from tuneforge.tune.expected import Expected
from tuneforge.tune.job import TrialJob
from tuneforge.tune.sample import CHECK_ROWS, RowSample
from tuneforge.tune.select import clear_memo, select_detailed
from tuneforge.tune.specs import TensorSpec

from .conftest import tuning_in_process

ROWS, SAMPLE = 512, 32
seen: dict[str, list[int]] = {}


@pytest.fixture
def tuning(cache_dir: Path) -> Iterator[Path]:
    seen.clear()
    with tuning_in_process(cache_dir, bench_time_s=0.003, min_repeats=3):
        yield cache_dir


class Sampled(ExternChoice):  # opts in to samples (a library call runs whole by default)
    def sample_rows(self, rows: int, total: int) -> int:
        return rows


def reference(x: np.ndarray, out: np.ndarray) -> None:
    seen.setdefault("reference", []).append(len(x))
    np.multiply(x, 2.0, out=out)


def doubled(x: np.ndarray, out: np.ndarray) -> None:  # 2 ms on the whole, in proportion to the rows
    seen.setdefault("doubled", []).append(len(x))
    time.sleep(0.002 * len(x) / ROWS)
    np.multiply(x, 2.0, out=out)


def doubled_slowly(x: np.ndarray, out: np.ndarray) -> None:  # 8 ms on the whole: a second choice, never the pick
    time.sleep(0.008 * len(x) / ROWS)
    np.multiply(x, 2.0, out=out)


def wrong_in_the_last_rows(x: np.ndarray, out: np.ndarray) -> None:  # right on every sample (its first rows)
    np.multiply(x, 2.0, out=out)
    if len(x) == ROWS:
        out[-3] += 1.0


def skips_rows(x: np.ndarray, out: np.ndarray) -> None:  # leaves rows 100..109 unwritten: no span holds them
    out[:100] = 2.0 * x[:100]
    out[110:] = 2.0 * x[110:]


def _select(choices: list[ExternChoice], sample: RowSample, name: str = "spans") -> dict[str, Any]:
    x = np.random.default_rng(0).standard_normal((ROWS, 16))
    selection = select_detailed(name, choices, [x], out=np.empty_like(x), reference=ExternChoice(reference),
                                sample=sample)
    return {r.choice_name: r for r in default_records().get(selection.key)}


def test_the_reference_runs_on_spans_of_rows_only(tuning: Path) -> None:
    records = _select([Sampled(doubled), Sampled(doubled_slowly)],
                      RowSample(args=(0, 1), rows=SAMPLE, independent_rows=True))
    assert records["doubled"].status == "ok"
    assert ROWS in seen["doubled"]  # the pick ran on the whole problem, checked there
    # the sample's rows, then CHECK_ROWS about the middle and at the end: never the whole
    assert seen["reference"] == [SAMPLE, CHECK_ROWS, CHECK_ROWS]
    seen.clear()
    clear_memo()
    # rows that may depend on each other: the whole problem
    _select([Sampled(doubled), Sampled(doubled_slowly)], RowSample(args=(0, 1), rows=SAMPLE), name="dependent")
    assert seen["reference"] == [ROWS]


def test_a_whole_run_wrong_in_its_last_rows_is_a_wrong_result(tuning: Path) -> None:
    records = _select([Sampled(wrong_in_the_last_rows), Sampled(doubled)],
                      RowSample(args=(0, 1), rows=SAMPLE, independent_rows=True))
    assert records["wrong_in_the_last_rows"].status == "wrong_result"
    assert f"in rows {ROWS - CHECK_ROWS}..{ROWS - 1} of {ROWS}" in records["wrong_in_the_last_rows"].error
    assert records["doubled"].status == "ok"


def test_rows_left_unwritten_between_the_spans_are_found_on_the_whole(tuning: Path) -> None:
    records = _select([Sampled(skips_rows), Sampled(doubled_slowly)],
                      RowSample(args=(0, 1), rows=SAMPLE, independent_rows=True))
    assert records["skips_rows"].status == "wrong_result"
    assert "non-finite value mismatch at index (100, 0)" in records["skips_rows"].error
    assert ROWS in seen["reference"]  # poison left: compared on the whole after all


def test_an_accumulating_output_is_compared_on_the_whole(tuning: Path) -> None:
    """Its initial contents are not poison: rows left unwritten cannot be told from written ones. The faulty choice
    must be the pick, the one run on the whole (a choice that lost runs on its sample only, right there)."""
    def accumulate(x: np.ndarray, out: np.ndarray) -> None:
        seen.setdefault("reference", []).append(len(x))
        out += x

    def accumulate_some(x: np.ndarray, out: np.ndarray) -> None:
        out[:100] += x[:100]
        out[110:] += x[110:]

    def accumulate_twice(x: np.ndarray, out: np.ndarray) -> None:  # 8 ms on the whole: never the pick
        time.sleep(0.008 * len(x) / ROWS)
        out += 0.5 * x
        out += 0.5 * x

    x = np.random.default_rng(0).standard_normal((ROWS, 16))
    selection = select_detailed("acc", [Sampled(accumulate_some), Sampled(accumulate_twice)], [x], out=np.empty_like(x),
                                reference=ExternChoice(accumulate), accumulate=True,
                                sample=RowSample(args=(0, 1), rows=SAMPLE, independent_rows=True))
    records = {r.choice_name: r for r in default_records().get(selection.key)}
    assert records["accumulate_some"].status == "wrong_result"
    assert seen["reference"][-1] == ROWS


def test_a_later_sample_of_more_rows_extends_the_head() -> None:
    """A choice of a later batch may round the sample to more rows than the head kept: the reference runs there."""
    job = TrialJob(name="t", key="k", outputs=[1], arg_specs=[TensorSpec.of(np.ones((ROWS, 4)))],
                   out_spec=TensorSpec.of(np.ones((ROWS, 4))),
                   sample=RowSample(args=(0, 1), rows=SAMPLE, independent_rows=True))
    x = np.arange(ROWS * 4, dtype=np.float64).reshape(ROWS, 4)
    out = np.full_like(x, np.nan)
    runs: list[tuple[int, int]] = []

    def reference_on(start: int, stop: int) -> list[Any]:
        runs.append((start, stop))
        return [None, 2.0 * x[start:stop]]

    expected = Expected([1])
    for start, stop in job.sample.check_spans(ROWS, SAMPLE):  # type: ignore[union-attr]
        expected.spans[(start, stop)] = reference_on(start, stop)
    runs.clear()
    out[:96] = 2.0 * x[:96]
    assert expected.check([x[:96], out[:96]], 96, job, reference_on) is None
    assert runs == [(0, 96)] and expected.head() == 96
    out[:] = 2.0 * x
    assert expected.check([x, out], None, job, reference_on) is None  # written everywhere: the spans suffice
    assert runs == [(0, 96)]
    out[200] = np.inf  # not finite: compared on the whole
    assert "non-finite" in (expected.check([x, out], None, job, reference_on) or "")
    assert runs[-1] == (0, ROWS) and expected.whole is not None


def test_check_spans() -> None:
    sample = RowSample(args=(0,), rows=8, independent_rows=True)
    assert sample.check_spans(4096, 512) == [(0, 512), (2016, 2080), (4032, 4096)]
    assert sample.check_spans(600, 512) == [(0, 512), (536, 600)]  # the middle's inside the head
    assert sample.check_spans(100, 40) == [(0, 100)]  # overlapping spans merge
    assert sample.check_spans(30, 8) == [(0, 30)]


def test_independent_rows_must_cut_the_output(tuning: Path) -> None:
    x = np.ones((ROWS, 4))
    with pytest.raises(ValueError, match=r"independent_rows=True\) must cut the output \(1\) too"):
        select_detailed("spans", [Sampled(doubled)], [x], out=np.empty_like(x),
                        sample=RowSample(args=(0,), rows=SAMPLE, independent_rows=True))


def test_poison_left() -> None:
    out = np.ones((8, 3), dtype=np.float32)
    assert not verify.poison_left(out)
    out[5, 1] = np.nan
    assert verify.poison_left(out)
    assert verify.poison_left(np.ones(4, dtype=np.int64))  # cannot be told: taken as poisoned
    verify.poison(out)
    assert verify.poison_left(out)


class InBlocksOf48(Sampled):
    def sample_rows(self, rows: int, total: int) -> int:
        return min(total, -(-rows // 48) * 48)


def test_the_head_covers_the_longest_sample_of_the_choices() -> None:
    """Made before any choice runs (in the worker, while the choices compile): as long as any choice's sample."""
    from tuneforge.tune.measure import _with_sample_head

    spec = TensorSpec.of(np.ones((ROWS, 4)))
    job = TrialJob(name="t", key="k", outputs=[1], arg_specs=[spec], out_spec=spec,
                   sample=RowSample(args=(0, 1), rows=SAMPLE, independent_rows=True))
    choices = [Sampled(doubled), InBlocksOf48(doubled), ExternChoice(doubled)]  # the last runs whole: no sample
    assert _with_sample_head(job, choices).sample_head == 48
    assert _with_sample_head(job, [ExternChoice(doubled)]).sample_head == SAMPLE
    dependent = TrialJob(name="t", key="k", outputs=[1], arg_specs=[spec], out_spec=spec,
                         sample=RowSample(args=(0, 1), rows=SAMPLE))
    assert _with_sample_head(dependent, choices).sample_head == 0  # the reference runs on the whole


def test_a_reference_failing_on_more_rows_leaves_the_choice_unchecked() -> None:
    """It ran on the first spans; where it fails on more rows later, the choice is not taken as right."""
    job = TrialJob(name="t", key="k", outputs=[1], arg_specs=[TensorSpec.of(np.ones((ROWS, 4)))],
                   out_spec=TensorSpec.of(np.ones((ROWS, 4))),
                   sample=RowSample(args=(0, 1), rows=SAMPLE, independent_rows=True))
    x = np.arange(ROWS * 4, dtype=np.float64).reshape(ROWS, 4)

    def failing(start: int, stop: int) -> list[Any]:
        raise MemoryError("no room")

    expected = Expected([1])
    expected.spans[(0, SAMPLE)] = [None, 2.0 * x[:SAMPLE]]
    problem = expected.check([x[:64], 2.0 * x[:64]], 64, job, failing)
    assert problem == "not checked: the reference failed on rows 0..63: MemoryError: no room"
