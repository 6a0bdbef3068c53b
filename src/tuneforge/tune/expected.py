"""The reference's outputs that the choices' outputs are compared with: of the whole problem, or, where a selection
samples rows that do not depend on each other (sample.RowSample.independent_rows), of a few spans of rows.

Kept by trials.Trials, which runs the reference (and hands `Expected.check` a way to run it on more rows); here is
what is kept and how a choice's outputs are compared with it. A run of the whole problem compared on spans only is
also required to have written all of each poisoned output (`verify.poison_left`); where that cannot be told, the
reference is run on the whole after all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tuneforge.tune import verify

if TYPE_CHECKING:
    from tuneforge.tune.job import TrialJob

Span = tuple[int, int]  # rows start .. stop (exclusive) of the arguments a sample cuts


class _NotChecked(Exception):
    """The reference, run on more rows during the trials, raised."""


class Expected:
    """The reference's outputs (snapshots, None at positions that are not outputs), for the whole problem
    (`whole`) or by span of rows (`spans`)."""

    def __init__(self, outputs: Sequence[int]) -> None:
        self.outputs = list(outputs)
        self.whole: list[Any] | None = None
        self.spans: dict[Span, list[Any]] = {}

    def known(self) -> bool:
        return self.whole is not None or bool(self.spans)

    def head(self) -> int:
        """How many of the first rows the spans cover (a sample of up to that many rows is compared on them)."""
        return max((stop for start, stop in self.spans if start == 0), default=0)

    def set_head(self, rows: int, outputs: list[Any]) -> None:
        """The reference's outputs on the first `rows` rows, replacing shorter heads."""
        self.spans = {span: kept for span, kept in self.spans.items() if span[0] != 0}
        self.spans[(0, rows)] = outputs

    def compare_head(self, args: Sequence[Any], rows: int, rtol: float | None, atol: float | None) -> str | None:
        """How a choice's outputs on a sample of the first `rows` rows (`args`, cut) differ from the reference's
        (None: they match); the head must cover them."""
        kept = self.spans[(0, self.head())]
        return self.compare(args, [None if v is None else v[:rows] for v in kept], rtol, atol)

    def compare_spans(self, args: Sequence[Any], total: int, rtol: float | None, atol: float | None) -> str | None:
        """How a choice's outputs on the whole problem (`args`) differ from the reference's on each span kept."""
        for (start, stop), kept in sorted(self.spans.items()):
            problem = self.compare([None if i not in self.outputs else a[start:stop] for i, a in enumerate(args)],
                                    kept, rtol, atol)
            if problem is not None:
                return f"in rows {start}..{stop - 1} of {total}: {problem}"
        return None

    def compare(self, args: Sequence[Any], kept: Sequence[Any], rtol: float | None, atol: float | None) -> str | None:
        return next((problem for i in self.outputs
                     if (problem := verify.compare(args[i], kept[i], rtol=rtol, atol=atol)) is not None), None)

    def check(self, args: Sequence[Any], rows: int | None, job: TrialJob,
              reference_on: Callable[[int, int], list[Any]]) -> str | None:
        """How a choice's outputs in `args` (on the first `rows` rows of `job`'s sample, None: the whole problem)
        differ from the reference's (None: they match). `reference_on(start, stop)` runs the reference on those
        rows of the sample's arguments: for a head longer than kept, or where a run of the whole problem must be
        compared on the whole (its outputs may not all have been written)."""
        try:
            return self._check(args, rows, job, reference_on)
        except _NotChecked as exc:  # it ran on the first spans: not the choice's fault, but nothing checks it
            return str(exc)

    def _check(self, args: Sequence[Any], rows: int | None, job: TrialJob,
               reference_on: Callable[[int, int], list[Any]]) -> str | None:
        def reference(start: int, stop: int) -> list[Any]:
            try:
                return reference_on(start, stop)
            except Exception as exc:
                raise _NotChecked(f"not checked: the reference failed on rows {start}..{stop - 1}: "
                                  f"{type(exc).__name__}: {exc}") from exc

        sample, rtol, atol = job.sample, job.rtol, job.atol
        if self.whole is not None:
            return self.compare(args, self.whole if rows is None or sample is None else sample.cut(self.whole, rows),
                                rtol, atol)
        assert sample is not None  # spans are kept for a sample's rows only
        if rows is not None:
            if rows > self.head():  # a choice of a later batch of the job, rounding the sample to more rows
                self.set_head(rows, reference(0, rows))
            return self.compare_head(args, rows, rtol, atol)
        total = sample.total(args)
        problem = self.compare_spans(args, total, rtol, atol)
        if problem is not None or (job.poison_outputs and not any(verify.poison_left(args[i]) for i in self.outputs)):
            return problem
        # Whether every row was written cannot be told (or some output is not finite): compared on the whole after all
        self.whole = reference(0, total)
        return self.compare(args, self.whole, rtol, atol)
