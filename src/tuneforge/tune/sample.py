"""Ranking choices on a sample of the problem: the first rows of some arguments.

Why: a large problem's run is long (a 4096^3 GEMM takes 0.4-0.8 s on 2 cores), and verifying and timing a
handful of configurations a few times each on the whole of it made cold tuning take 5-22 s. Cut to its first
rows, the same problem runs each configuration's blocks as the whole would (its cache blocking and its thread
split are set for the whole problem, and a choice rounds the rows to whole blocks, `Choice.sample_rows`), so
choices are checked and ranked there, their times scaled to the whole. No decision rests on a sample: the
fastest is then checked and timed on the whole problem, and so is any choice whose estimate beats that.

Where every output row depends only on the same rows of the arguments cut, wherever they lie (`independent_rows`:
a GEMM's rows of A and C), the reference runs on spans of rows only, never on the whole: 4096^3 float32 took 0.93
s a run here, a seventh of a cold tuning, and the library call runs whole as a choice in any case. A choice's run
on the whole problem is then compared with the reference on its first, middle and last rows, and a poisoned output
must have been written everywhere (no NaN left: else the reference runs on the whole after all, see expected.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tuneforge.dataclass_lite import dataclass

if TYPE_CHECKING:  # a selection answered from records reads SAMPLED without loading the benchmarking code
    from tuneforge.store.records import Record
    from tuneforge.tune.bench import Timing

# Rows about the middle and at the end on which a whole run is compared with the reference (with independent_rows):
# several of any kernel's M blocks, for the reference a few percent of a large problem's run
CHECK_ROWS = 64
SAMPLED = "+sample"  # in a record's method: timed on a sample, scaled to the whole problem
CALIBRATED = "+calibrated"  # ... then scaled by how whole runs of other choices compared with their samples


@dataclass(frozen=True)
class RowSample:
    """Cut the arguments at positions `args` (the output's position included: the inputs come first, then the
    output) to their first `rows` rows; those arguments must be arrays of the same number of rows.
    `independent_rows`: each output row depends only on the same row of the arguments cut, wherever it lies (not on
    its index), so the reference may run on any span of rows (see above)."""

    args: tuple[int, ...]
    rows: int
    independent_rows: bool = False

    def __post_init__(self) -> None:
        if not self.args:
            raise ValueError("RowSample: args names no argument to cut")
        if self.rows < 1:
            raise ValueError(f"RowSample: rows must be at least 1, not {self.rows}")

    def total(self, args: Sequence[Any]) -> int:
        """The rows of the whole problem (checked to agree between the arguments cut)."""
        counts = {len(args[i]) for i in self.args}
        if len(counts) != 1:
            raise ValueError(f"RowSample: the arguments {list(self.args)} differ in rows ({sorted(counts)})")
        return counts.pop()

    def cut(self, values: Sequence[Any], rows: int) -> list[Any]:
        """`values` (arguments or snapshots of them, None where nothing was kept) with the sampled positions cut to
        their first `rows` rows: views, so writing into them writes into the whole."""
        return self.span(values, 0, rows)

    def span(self, values: Sequence[Any], start: int, stop: int) -> list[Any]:
        """`values` with the sampled positions cut to their rows `start` to `stop` (views)."""
        return [v[start:stop] if i in self.args and v is not None else v for i, v in enumerate(values)]

    def check_spans(self, total: int, head: int) -> list[tuple[int, int]]:
        """The spans of rows (start, stop) on which a run of the whole problem is compared with the reference: the
        first `head` rows (a sample's, whose outputs are at hand), CHECK_ROWS about the middle and the last ones
        (where M's blocks and the threads' shares end), overlapping spans merged."""
        rows = min(CHECK_ROWS, total)
        middle = max(0, min(total - rows, total // 2 - rows // 2))
        spans: list[tuple[int, int]] = []
        for start, stop in sorted([(0, min(head, total)), (middle, middle + rows), (total - rows, total)]):
            if spans and start <= spans[-1][1]:
                spans[-1] = (spans[-1][0], max(spans[-1][1], stop))
            else:
                spans.append((start, stop))
        return spans


def scaled(timing: Timing, factor: float) -> Timing:
    """A sample's timing as an estimate for the whole problem."""
    return timing.scaled(factor, SAMPLED)


def calibrated(record: Record, factor: float) -> Record:
    """A sample's record scaled by `factor`: whole runs of other choices took that many times their estimates."""
    def times(value: float | None) -> float | None:
        return None if value is None else value * factor

    return dataclasses.replace(record, median_ms=times(record.median_ms), min_ms=times(record.min_ms),
                               mean_ms=times(record.mean_ms), p20_ms=times(record.p20_ms),
                               p80_ms=times(record.p80_ms), method=record.method + CALIBRATED)
