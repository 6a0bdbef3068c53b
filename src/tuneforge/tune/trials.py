"""Verify and time built choices on one set of arguments; the same code runs in-process or in a worker.

A trial of one choice: run it once from the initial state and compare its outputs with the
reference's (a failure is ``runtime_error`` or ``wrong_result``), then time it with the outputs (and
any input it wrote into) restored before every run. Each finished trial is reported at once, so a
crash in the next choice loses nothing.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuneforge import config
from tuneforge.errors import TuneforgeError
from tuneforge.hashing import system_fingerprint
from tuneforge.store.records import Record
from tuneforge.tune import verify
from tuneforge.tune.bench import Timing, benchmark_cpu
from tuneforge.tune.choices import Choice
from tuneforge.tune.specs import TensorSpec, example_input

log = logging.getLogger("tuneforge.tune")

Event = tuple[Any, ...]  # ("ref", error|None) ("start", i) ("result", i, Record) ("done", verify_s, bench_s)


@dataclass
class TrialJob:
    """Everything needed to run trials, as data: picklable when its choices and generators are.

    Either `arg_specs` (+ `out_spec`) describe arguments to generate, or `live_args` holds the caller's
    own arguments (never sent to another process).
    """

    name: str
    key: str
    outputs: list[int]
    arg_specs: list[Any] = field(default_factory=list)
    out_spec: TensorSpec | None = None
    generators: Mapping[int, Callable[..., Any]] = field(default_factory=dict)
    rtol: float | None = None
    atol: float | None = None
    poison_outputs: bool = True
    inputs_text: str = ""
    live_args: list[Any] | None = None

    def materialize(self) -> list[Any]:
        """The arguments: the live ones, or example inputs from the specs (seeded, RNG-neutral)."""
        if self.live_args is not None:
            return self.live_args
        seed = int(config.get("autotune.seed"))
        args = [example_input(s, seed=seed + i, generator=self.generators.get(i)) if isinstance(s, TensorSpec)
                else s for i, s in enumerate(self.arg_specs)]
        if self.out_spec is not None:
            args.append(example_input(self.out_spec, seed=seed + len(args)))
        return args


def error_text(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, TuneforgeError) else f"{type(exc).__name__}: {exc}"


def _jsonable(params: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, (int, float, str, bool, type(None))) else repr(v) for k, v in params.items()}


def args_signature(job: TrialJob) -> list[list[Any]]:
    """Each argument as [dtype, sizes] (scalars as ["scalar:<type>", []]): what "nearest shape" compares."""
    specs = [*job.arg_specs, *([job.out_spec] if job.out_spec is not None else [])]
    return [[s.dtype, list(s.sizes)] if isinstance(s, TensorSpec) else [f"scalar:{type(s).__name__}", []]
            for s in specs]


def make_record(job: TrialJob, choice: Choice, status: str, *, timing: Timing | None = None, error: str = "",
                info: Mapping[str, Any] | None = None) -> Record:
    stats: dict[str, Any] = {}
    if timing is not None:
        stats = {"median_ms": timing.median_ms, "min_ms": timing.min_ms, "mean_ms": timing.mean_ms,
                 "p20_ms": timing.p20_ms, "p80_ms": timing.p80_ms, "count": timing.count, "method": timing.method}
    extra: dict[str, Any] = {"family": choice.family}
    if job.live_args is None:
        extra["args"] = args_signature(job)
    return Record(key=job.key, choice=choice.hash_key, op=job.name, choice_name=choice.name, status=status,
                  error=error[:20000], params=_jsonable(choice.params), inputs=job.inputs_text,
                  system=system_fingerprint()["hash"], info={**extra, **(info or {})}, **stats)


class Trials:
    """Holds the arguments, their initial state and the reference's outputs for a run of trials."""

    def __init__(self, job: TrialJob, args: list[Any], reference: Choice | None) -> None:
        self.job, self.args = job, args
        self.original = verify.snapshot(args)
        if job.poison_outputs:
            for i in job.outputs:
                verify.poison(args[i])
        self.initial = verify.snapshot(args)  # every run starts from here
        self.inputs = [i for i in range(len(args)) if i not in job.outputs]
        self.expected: list[Any] | None = None
        self.reference_error: str | None = None
        self.verify_s = self.bench_s = 0.0
        self.best_ms: float | None = None  # fastest median so far: slower choices may be abandoned early
        if reference is not None and config.get("autotune.verify"):
            try:
                reference.run(args)
                self.expected = verify.snapshot(args)
            except Exception as exc:
                self.reference_error = error_text(exc)
                log.warning("reference %s failed (%s); choices of %s are not verified", reference.name, exc,
                            job.name)
            verify.restore(args, self.initial)
        self.reference = reference

    def run(self, choice: Choice) -> Record:
        started = time.perf_counter()
        try:
            return self._run(choice, started)
        finally:
            verify.restore(self.args, self.initial)

    def _run(self, choice: Choice, started: float) -> Record:
        args = self.args
        try:
            choice.run(args)
        except Exception as exc:
            self.verify_s += time.perf_counter() - started
            tb = "".join(traceback.format_exception(exc)[-3:])
            return make_record(self.job, choice, "runtime_error", error=f"{error_text(exc)}\n{tb}")
        info: dict[str, Any] = {}
        mutated = verify.changed(args, self.initial, self.inputs)
        if mutated:
            info["mutates_inputs"] = mutated
            log.warning("%s writes into its inputs %s; they are restored before every run", choice.name, mutated)
        if self.expected is not None and choice is not self.reference:
            expected = self.expected
            problem = next((p for i in self.job.outputs if (p := verify.compare(
                args[i], expected[i], rtol=self.job.rtol, atol=self.job.atol)) is not None), None)
            if problem is not None:
                self.verify_s += time.perf_counter() - started
                return make_record(self.job, choice, "wrong_result", error=problem, info=info)
        timed = time.perf_counter()
        self.verify_s += timed - started
        restore = [*self.job.outputs, *mutated]

        def setup() -> None:
            verify.restore(args, self.initial, restore)

        ratio = float(config.get("autotune.abandon_ratio"))
        abandon = ratio * self.best_ms if ratio > 0 and self.best_ms is not None else None
        try:
            timing = benchmark_cpu(lambda: choice.run(args), setup=setup, warmed=True, abandon_ms=abandon)
        except Exception as exc:
            return make_record(self.job, choice, "runtime_error", error=error_text(exc))
        finally:
            self.bench_s += time.perf_counter() - timed
        if self.best_ms is None or timing.median_ms < self.best_ms:
            self.best_ms = timing.median_ms
        return make_record(self.job, choice, "ok", timing=timing, info=info)

    def finish(self) -> None:
        verify.restore(self.args, self.original)  # live arguments end as they began


def run_trials(job: TrialJob, choices: Sequence[Choice], reference: Choice | None,
               emit: Callable[[Event], None]) -> None:
    """Run every trial, reporting each event as it happens (the worker streams them to the parent)."""
    trials = Trials(job, job.materialize(), reference)
    emit(("ref", trials.reference_error))
    try:
        for i, choice in enumerate(choices):
            emit(("start", i))
            emit(("result", i, trials.run(choice)))
    finally:
        trials.finish()
    emit(("done", trials.verify_s, trials.bench_s))
