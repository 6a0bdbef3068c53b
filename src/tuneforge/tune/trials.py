"""Verify and time built choices on one set of arguments; the same code runs in-process or in a worker.

The example inputs are made first, then the reference runs (each step is reported, so the parent of
a worker that dies knows which one killed it). When the reference raises, no choice runs at all (each
gets a stand-in record that the caller turns into an error), because an unverified choice that does
nothing would be the fastest.
A trial of one choice: run it once from the initial state and compare its outputs with the
reference's (a failure is ``runtime_error`` or ``wrong_result``), then time it with the outputs (and
any input it wrote into) restored before every run. Each finished trial is reported at once, so a
crash in the next choice loses nothing.

A job on a GPU ("cuda:N", see device.py) is timed with CUDA events (bench_gpu.py) under the same settings,
with a device synchronisation after the checked run, so an asynchronous kernel error is that choice's;
a near tie is re-timed side by side with CUDA events (bench_gpu.time_side_by_side_gpu). A choice that leaves
the CUDA context unusable gets its ``runtime_error`` record, then `DeviceContextLost` stops the run:
nothing more can run in this process (a benchmark worker exits, and its parent starts a fresh one).
"""

from __future__ import annotations

import dataclasses
import logging
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

from tuneforge import config
from tuneforge.store.records import Record
from tuneforge.tune import verify
from tuneforge.tune.bench import LONG_RUN_NS, RAMP_NS, Timing, benchmark_cpu, long_run_s
from tuneforge.tune.bench_gpu import benchmark_gpu
from tuneforge.tune.choices import Choice
from tuneforge.tune.confirm import contenders, near_tie
from tuneforge.tune.device import DeviceContextLost, device_sync, is_sticky_cuda_error
from tuneforge.tune.events import (
    ChoiceConfirmed,
    ChoiceResult,
    ChoiceStarted,
    Event,
    InputsReady,
    ReferenceRan,
    TrialsDone,
)
from tuneforge.tune.expected import Expected
from tuneforge.tune.input_guard import InputGuard
from tuneforge.tune.job import TrialJob, error_text, make_record, reference_failed_record
from tuneforge.tune.paired import time_paired
from tuneforge.tune.quiet import settle
from tuneforge.tune.sample import SAMPLED, scaled
from tuneforge.tune.screening import (
    LEVEL_INFO,
    SCREEN_CROWD,
    SCREEN_REPEATS,
    ScreenLevel,
    abandon_ratio,
    gpu_screening,
    screen_budget,
    screened_contenders,
)
from tuneforge.tune.whole_run import settle_sampled

log = logging.getLogger("tuneforge.tune")


class Trials:
    """Holds the arguments, their initial state and the reference's outputs for a run of trials."""

    def __init__(self, job: TrialJob, args: list[Any]) -> None:
        self.job, self.args = job, args
        # live arguments are the caller's: they end as they began (generated ones are nobody's)
        self.original = verify.snapshot(args) if job.live_args is not None else None
        if job.poison_outputs:
            for i in job.outputs:
                verify.poison(args[i])
        self.initial = verify.snapshot(args)  # every run starts from here
        self.inputs = [i for i in range(len(args)) if i not in job.outputs]
        self.guard = InputGuard(args, self.initial, self.inputs)  # large inputs found unwritten without comparing
        self.expected = Expected(job.outputs)
        self.reference: Choice | None = None
        self.reference_error: str | None = None
        self.verify_s = self.bench_s = 0.0
        self.best_ms: float | None = None  # fastest median so far: slower choices may be abandoned early
        self.reference_ns: int | None = None  # how long the reference's run took, and what inputs it wrote into
        self.reference_mutated: list[int] = []
        self.reference_contended = job.ahead  # its run shared the cores with compilers: no timing (TrialJob.ahead)
        self.sync = device_sync(job.device)
        self.lost: str | None = None  # the sticky CUDA error after which nothing runs or is restored here
        self.screen_level: ScreenLevel | None = None  # a crowded screening's (screening.py), while it runs

    @staticmethod
    def checks_with(reference: Choice | None) -> bool:
        """Whether `run_reference` runs `reference` (verification is on and there is one)."""
        return reference is not None and config.get_bool("autotune.verify")

    def run_reference(self, reference: Choice | None) -> None:
        """Take the expected outputs from `reference`, or note its error (then no choice runs)."""
        self.reference = reference
        if reference is None or not self.checks_with(reference):
            return
        args, sample = self.args, self.job.sample
        try:
            if sample is not None and sample.independent_rows:  # on spans of rows only (sample.py)
                for start, stop in sample.check_spans(sample.total(args), max(self.job.sample_head, sample.rows)):
                    self.expected.spans[(start, stop)] = self._reference_on(start, stop)
            else:
                started = time.perf_counter_ns()
                reference.run(args)
                self.sync()
                self.reference_ns = time.perf_counter_ns() - started
                self.reference_mutated = self.guard.changed(args, self.initial)
                self.expected.whole = verify.snapshot(args, self.job.outputs)  # only outputs are compared
        except Exception as exc:  # no choice is run then (see run_trials): nothing could check it
            self.reference_error = error_text(exc)
            if is_sticky_cuda_error(self.reference_error):
                self.lost = self.reference_error
                return
        self.guard.restore()
        self._settle_reference()

    def _settle_reference(self) -> None:
        if self.reference is not None and self.reference.is_extern:
            # A library call may leave its own thread pool spinning for a while (OpenBLAS does for
            # ~0.1 s); a multi-threaded kernel timed meanwhile would share the cores with it.
            settle(config.get_float("autotune.settle_s"))

    def _reference_on(self, start: int, stop: int) -> list[Any]:
        """The reference's outputs on rows `start`..`stop` of the arguments the job's sample cuts, run into copies
        of the outputs' initial state (the arguments' outputs may hold a choice's, still to be compared); any input
        it wrote into is set back."""
        assert self.reference is not None and self.job.sample is not None
        args, initial = self.job.sample.span(self.args, start, stop), self.job.sample.span(self.initial, start, stop)
        outputs = verify.snapshot(initial, self.job.outputs)
        self.reference.run([outputs[i] if i in self.job.outputs else a for i, a in enumerate(args)])
        self.sync()
        verify.restore(args, initial, self.guard.changed(args, initial))
        return outputs

    def problem(self, choice: Choice, whole: bool = False) -> tuple[list[Any], list[Any], int | None, float]:
        """What `choice` runs on: (arguments, their initial state, the rows they were cut to (None: the whole
        problem), and the factor from its times to the whole problem's): the job's sample as the choice rounds it
        (sample.py), or the whole."""
        sample = self.job.sample
        if sample is None or whole:
            return self.args, self.initial, None, 1.0
        total = sample.total(self.args)
        rows = min(total, max(1, choice.sample_rows(sample.rows, total)))
        if rows >= total:
            return self.args, self.initial, None, 1.0
        return sample.cut(self.args, rows), sample.cut(self.initial, rows), rows, total / rows

    def check(self, args: list[Any], rows: int | None) -> str | None:
        """How a choice's outputs in `args` (on the first `rows` rows, None: the whole problem) differ from the
        reference's; None where they match."""
        def reference_on(start: int, stop: int) -> list[Any]:  # run late: its library's threads must settle
            outputs = self._reference_on(start, stop)
            self._settle_reference()
            return outputs

        return self.expected.check(args, rows, self.job, reference_on)

    def run(self, choice: Choice, budget_s: float | None = None, whole: bool = False) -> Record:
        """Check `choice` against the reference, then time it (for `budget_s`; None: autotune.bench_time_s), on
        the job's sample unless `whole`."""
        started = time.perf_counter()
        try:
            record = self._run(choice, started, budget_s, whole)
        except Exception as exc:
            if not is_sticky_cuda_error(error_text(exc)):
                self.guard.restore()
                raise
            # Surfaced in the checking or the copies after the run (CUDA reports errors late): still its own.
            tb = "".join(traceback.format_exception(exc)[-3:])
            record = make_record(self.job, choice, "runtime_error", error=f"{error_text(exc)}\n{tb}")
        if record.status == "runtime_error" and is_sticky_cuda_error(record.error):
            self.lost = record.error  # restoring the arguments would fail as well
            return record
        self.guard.restore()
        return record

    def _run(self, choice: Choice, started: float, budget_s: float | None, whole: bool) -> Record:
        args, initial, rows, factor = self.problem(choice, whole)
        reference_ns = self.reference_ns if choice is self.reference and factor == 1.0 else None
        # A check just run warmed the choice up; the reference's ran before every other choice, and its library's
        # threads have gone to sleep since: an untimed run first, or waking them takes the first two timed runs
        # (numpy on 128^3 fp32 was abandoned at 5 ms a call, 170x its time). Not for long runs, which that hardly
        # changes and whose one more run would cost seconds.
        cold = reference_ns is not None and reference_ns < LONG_RUN_NS
        if reference_ns is not None:
            # the reference's run, on these arguments, was its check: a large problem's run can take a second
            checked_ns, mutated = reference_ns, self.reference_mutated
        else:
            try:
                run_started = time.perf_counter_ns()
                choice.run(args)
                self.sync()
                checked_ns = time.perf_counter_ns() - run_started
            except Exception as exc:
                self.verify_s += time.perf_counter() - started
                tb = "".join(traceback.format_exception(exc)[-3:])
                return make_record(self.job, choice, "runtime_error", error=f"{error_text(exc)}\n{tb}")
            mutated = self.guard.changed(args, initial)
        info: dict[str, Any] = {}
        if mutated:
            info["mutates_inputs"] = mutated
            log.warning("%s writes into its inputs %s; they are restored before every run", choice.name, mutated)
        if self.expected.known() and choice is not self.reference:
            problem = self.check(args, rows)
            if problem is not None:
                self.verify_s += time.perf_counter() - started
                return make_record(self.job, choice, "wrong_result", error=problem, info=info)
        timed = time.perf_counter()
        self.verify_s += timed - started
        restore = self.restored_for_timing(mutated)

        def setup() -> None:
            verify.restore(args, initial, restore)

        ratio = abandon_ratio(brief=budget_s is not None)
        # the best so far is at the screening's first level; runs now take `level` times as long (screening.py)
        level = self.screen_level.level if self.screen_level is not None and budget_s is not None else 1.0
        # Never a library call: after its threads slept, its first runs read up to 3x slow (numpy's 2-thread GEMM
        # here), and abandoned it was never re-timed beside the pick (confirm.near_tie), a kernel 19% slower
        abandon = ratio * self.best_ms * level if ratio > 0 and self.best_ms is not None and not choice.is_extern \
            else None
        try:
            if self.job.device == "cpu":
                # a whole run's check is its first call at that size (larger buffers): a timing only where it lasted
                # max_bench_s, which such effects hardly change
                long_check = checked_ns >= long_run_s() * 1e9
                counted = (not whole or long_check) and not (reference_ns is not None and self.reference_contended)
                # An unsampled choice whose check alone lasted max_bench_s is timed by it: a 4096^3 library call's
                # second run was a quarter of that shape's cold tuning, and long runs vary little.
                # a check shorter than the ramp (bench.RAMP_S) warmed the code, not quite the cores: untimed runs
                # for the rest of it, where that is more than half a run (after a 2.8 ms check, the 3 ms of them
                # cost a 512^3 fp64 search 0.3-0.5 s of its 2.7-3.0 s of brief timings); one that needed none is
                # a brief timing's first run for abandoning it
                ramp = not cold and 3 * checked_ns < 2 * RAMP_NS
                timing = benchmark_cpu(choice.bound(args), setup=setup, warmed=not cold and not ramp,
                                       warmup_s=(RAMP_NS - checked_ns) / 1e9 if ramp else None,
                                       abandon_ms=None if abandon is None else abandon / factor,
                                       first_ns=checked_ns if counted else None,
                                       agree=SAMPLE_AGREE if factor != 1.0 else None,
                                       abandon_first=budget_s is not None and not cold and not ramp,
                                       budget_s=budget_s, min_repeats=SCREEN_REPEATS if budget_s is not None else
                                       WHOLE_REPEATS if whole or (long_check and factor == 1.0) else
                                       SAMPLE_REPEATS if factor != 1.0 else None)
            else:
                warmup_s, min_repeats = gpu_screening(budget_s)
                timing = benchmark_gpu(choice.bound(args), setup=setup, device=self.job.device,
                                       budget_s=budget_s, warmup_s=warmup_s, min_repeats=min_repeats)
            if budget_s is not None:
                timing = dataclasses.replace(timing, method=timing.method + "+screened")
                if level != 1.0:  # the record keeps what was measured; the screening compares it over the level
                    info[LEVEL_INFO] = round(level, 4)
        except Exception as exc:
            return make_record(self.job, choice, "runtime_error", error=error_text(exc))
        finally:
            self.bench_s += time.perf_counter() - timed
        return self._timed(choice, scaled(timing, factor) if factor != 1.0 else timing, info, level)

    def restored_for_timing(self, mutated: Sequence[int]) -> list[int]:
        """The arguments set back before each timed run: inputs the choice writes into, and outputs whose initial
        contents it reads (accumulating jobs). A poisoned output is overwritten whole by any choice that passed its
        check, so restoring it would only add a copy of it to every run (64 MB for a 4096^2 fp32 GEMM: about as
        long as the run)."""
        return [*([] if self.job.poison_outputs else self.job.outputs), *mutated]

    def _timed(self, choice: Choice, timing: Timing, info: dict[str, Any], level: float = 1.0) -> Record:
        """The record of a timed choice; its median over the screening's `level` counts towards the best so far
        (for abandoning)."""
        if self.best_ms is None or timing.median_ms / level < self.best_ms:
            self.best_ms = timing.median_ms / level
        return make_record(self.job, choice, "ok", timing=timing, info=info)

    def retime(self, choice: Choice, screened: Record, budget_s: float | None = None) -> Record:
        """Time a screened contender again with the full budget (its output was checked when screened), or, for
        `budget_s`, briefly and as it runs now (a crowded screening's control: screening.py)."""
        restore = self.restored_for_timing(screened.info.get("mutates_inputs", []))
        args, initial, _, factor = self.problem(choice)  # where it was screened
        started = time.perf_counter()
        try:
            run, setup = choice.bound(args), (lambda: verify.restore(args, initial, restore))
            timing = benchmark_cpu(run, setup=setup, budget_s=budget_s,
                                   min_repeats=None if budget_s is None else SCREEN_REPEATS) \
                if self.job.device == "cpu" else benchmark_gpu(run, setup=setup, device=self.job.device)
            timing = scaled(timing, factor) if factor != 1.0 else timing
        except Exception as exc:  # it ran when screened: keep those figures
            log.warning("%s: timing %s again failed (%s); keeping its first timing", self.job.name, choice.name, exc)
            return screened
        finally:
            self.bench_s += time.perf_counter() - started
            self.guard.restore()
        if budget_s is not None:
            return make_record(self.job, choice, "ok", timing=timing, info=screened.info)
        return self._timed(choice, timing, screened.info)

    def confirm(self, results: Sequence[tuple[int, Choice, Record]], latest: Choice | None = None
                ) -> list[tuple[int, Record]]:
        """Re-time a near tie of the two fastest, or a narrow win over the reference (the job's `confirm`
        "all": every choice timed), side by side (see confirm.py): their new records, by index. `latest`: the
        choice whose whole run was the last timing made (whole_run.settle_sampled): a long one is its first paired
        round."""
        # a choice timed on a sample only was never checked on the whole problem: it must not win here
        whole = [(choice, record) for _, choice, record in results if SAMPLED not in record.method]
        statistic = config.get_str("autotune.statistic")
        tie = contenders(whole, statistic) if self.job.confirm == "all" else near_tie(whole, statistic, self.reference)
        if not tie:
            return []
        paired = time_paired(self, tie, carried={i: t for i, (choice, record) in enumerate(tie) if choice is latest
                                                 and (t := record.time(statistic)) is not None
                                                 and t >= long_run_s() * 1e3})
        if not paired:  # re-timing failed: the first timings stand
            return []
        index = {id(choice): i for i, choice, _ in results}
        return [(index[id(choice)], record) for (choice, _), record in zip(tie, paired, strict=True)]

    def finish(self) -> None:
        # on a broken CUDA context every copy fails: nothing can be restored
        if self.lost is None and self.original is not None:
            self.guard.close()
            verify.restore(self.args, self.original)

    def context_lost(self, culprit: str, resume_at: int, total: int) -> DeviceContextLost:
        assert self.lost is not None
        return DeviceContextLost(culprit, self.lost, resume_at, total, verify_s=self.verify_s, bench_s=self.bench_s)


_kept: Trials | None = None  # the last job's, when it asked to keep its inputs (TrialJob.keep_inputs)


def _same_inputs(kept: TrialJob, job: TrialJob) -> bool:
    return (kept.key, kept.arg_specs, kept.out_spec, kept.outputs, kept.sample, kept.rtol, kept.atol,
            kept.poison_outputs, dict(kept.generators)) == \
        (job.key, job.arg_specs, job.out_spec, job.outputs, job.sample, job.rtol, job.atol, job.poison_outputs,
         dict(job.generators))


def release_kept() -> None:
    """Drop the kept trials (their inputs hold memory, a GPU's too) when the job they were kept for will not come."""
    global _kept
    _kept = None


def _trials_for(job: TrialJob, reference: Choice | None) -> Trials | None:
    """The kept trials of an earlier batch of this very job (same inputs, same reference), else None."""
    global _kept
    kept, _kept = _kept, None  # released whatever comes: a job of another key must not keep them alive
    if kept is None or job.live_args is not None or kept.lost is not None or kept.reference_error is not None:
        return None
    same_reference = (reference is None) == (kept.reference is None) and \
        (reference is None or kept.reference is None or reference.hash_key == kept.reference.hash_key)
    if not same_reference or not _same_inputs(kept.job, job):
        return None
    kept.job = job
    kept.reference = reference  # its record is this batch's to make, if it is among the choices
    kept.verify_s = kept.bench_s = 0.0  # each batch reports its own
    return kept


def run_trials(job: TrialJob, choices: Sequence[Choice], reference: Choice | None,
               emit: Callable[[Event], None]) -> None:
    """Run every trial, reporting each event as it happens (the worker streams them to the parent)."""
    global _kept
    started = time.perf_counter()
    trials = _trials_for(job, reference)
    if trials is None:
        trials = Trials(job, job.materialize())
        # The parent of a worker that dies from here on blames the reference, not the machinery (see runner).
        emit(InputsReady(Trials.checks_with(reference)))
        trials.run_reference(reference)
    else:
        emit(InputsReady(False))
    setup_s = time.perf_counter() - started
    emit(ReferenceRan(trials.reference_error))
    try:
        if trials.reference_error is not None:
            assert reference is not None
            # Timed unverified, a choice that does nothing would be the fastest and be recorded as ok.
            for i, choice in enumerate(choices):
                emit(ChoiceResult(i, reference_failed_record(job, choice, reference.name, trials.reference_error)))
            if trials.lost is not None:
                raise trials.context_lost(f"the reference {reference.name}", len(choices), len(choices))
        else:
            _run_all(trials, choices, emit)
    finally:
        trials.finish()
    if job.keep_inputs and job.live_args is None and trials.lost is None:
        _kept = trials
    else:
        trials.guard.close()
    emit(TrialsDone(trials.verify_s, trials.bench_s, setup_s))


# A sampled job's problem is large (sample.py): its samples' runs last tens of milliseconds and vary little, so
# 3 make a timing, or 2 within 3% of each other (4096^3 fp32's ran within 1-5% of their checks, 130-270 ms each: a
# third was a tenth of a cold tuning); on the whole problem only the fastest is run, to check and time it (once).
SAMPLE_REPEATS, SAMPLE_AGREE, WHOLE_REPEATS = 3, 1.03, 1


def _run_all(trials: Trials, choices: Sequence[Choice], emit: Callable[[Event], None]) -> None:
    results = []
    screen_s = screen_budget(trials.job, len(choices))
    job = trials.job
    crowded = screen_s is not None and job.device == "cpu" and job.sample is None and len(choices) >= SCREEN_CROWD
    trials.screen_level = level = ScreenLevel() if crowded else None
    for i, choice in enumerate(choices):
        earlier = trials.job.timed.get(choice.hash_key)
        if earlier is not None:  # timed in an earlier batch: left to the side-by-side re-timing
            emit(ChoiceResult(i, earlier))
            results.append((i, choice, earlier))
            continue
        if level is not None and (control := level.due()) is not None:
            level.measure(lambda: (r.median_ms if (r := trials.retime(*control, budget_s=screen_s)) is not control[1]
                                   else None))
        emit(ChoiceStarted(i))
        record = trials.run(choice, screen_s)
        if level is not None:
            level.seen(choice, record)
        emit(ChoiceResult(i, record))
        if trials.lost is not None:
            raise trials.context_lost(choice.name, i + 1, len(choices))
        results.append((i, choice, record))
    trials.screen_level = None
    if trials.job.part:  # its contenders are the selection's last job's to time fully, among all (streamed.py)
        return
    if screen_s is not None:
        _time_contenders(trials, results, emit)
    latest = settle_sampled(trials, results, emit)
    if trials.job.confirm != "none":
        for i, record in trials.confirm(results, latest):
            emit(ChoiceConfirmed(i, record))


def _time_contenders(trials: Trials, results: list[tuple[int, Choice, Record]], emit: Callable[[Event], None]) -> None:
    """Give the contenders of a screening their full timing: on the CPU side by side (paired.py), unless they ran
    on a sample (each on its own cut of the rows); one after another on a GPU, whose timings hardly drift."""
    statistic = config.get_str("autotune.statistic")
    batch = trials.job.confirm == "none"
    positions = screened_contenders(results, statistic, per_build=trials.job.rank_builds)
    # a search's batch: the best so far (timed in an earlier batch) is re-timed beside them and sets their level
    # (fully timed: a streamed part's screened figures, which a last job also holds as timed, set no level)
    anchors = [pos for pos, (_, choice, record) in enumerate(results)
               if batch and choice.hash_key in trials.job.timed and record.status == "ok"
               and "+screened" not in record.method]
    paired_cpu = trials.job.device == "cpu" and trials.job.sample is None
    alone: list[int] = []
    if batch and paired_cpu:
        # A library call among a batch's contenders is timed on its own, after them: in alternating rounds each
        # of its batches left its thread pool spinning, a pause of ~0.1 s before the next kernel (0.7 s of a 512^3
        # float64 search's first batch); the finalists time it beside the best configurations in any case.
        alone = [pos for pos in positions if results[pos][1].is_extern]
        positions = [pos for pos in positions if pos not in alone]
    if paired_cpu and positions and len(positions) + len(anchors) > 1:
        tie = [*positions, *anchors]
        paired = time_paired(trials, [(results[pos][1], results[pos][2]) for pos in tie],
                             anchors=range(len(positions), len(tie)))
        if paired:  # else re-timing failed: the screened figures stand
            for pos, record in zip(positions, paired, strict=False):  # an anchor's earlier record stands
                i, choice, _ = results[pos]
                emit(ChoiceConfirmed(i, record))
                results[pos] = (i, choice, record)
        positions = []
    for pos in [*positions, *alone]:
        i, choice, screened = results[pos]
        record = trials.retime(choice, screened)
        if record is not screened:
            emit(ChoiceConfirmed(i, record))
            results[pos] = (i, choice, record)
