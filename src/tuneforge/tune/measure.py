"""Build, verify and time a list of choices on generated example inputs; one Record per choice.

A failing choice never stops the others: a build error is ``compile_error``, an exception while
running is ``runtime_error``, a result that differs from the reference is ``wrong_result``.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor, wait
from dataclasses import dataclass
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

METHOD = "cpu-perf_counter"


@dataclass
class Workload:
    """The arguments every choice is called with, and which of them are outputs.

    Outputs are compared with the reference and restored to their initial contents before every
    run; the other arrays are watched for in-place writes (flagged, then restored).
    """

    name: str
    key: str
    args: list[Any]
    outputs: list[int]
    rtol: float | None = None
    atol: float | None = None
    poison_outputs: bool = True  # start verification runs from NaN so unwritten elements show
    inputs_text: str = ""


@dataclass
class Outcome:
    records: list[Record]
    build_s: float = 0.0
    verify_s: float = 0.0
    bench_s: float = 0.0


def make_args(arg_specs: Sequence[Any], generators: Mapping[int, Callable[..., Any]]) -> list[Any]:
    """Example values for the arguments: arrays from specs (seeded, RNG-neutral), scalars as given."""
    seed = int(config.get("autotune.seed"))
    return [example_input(s, seed=seed + i, generator=generators.get(i)) if isinstance(s, TensorSpec) else s
            for i, s in enumerate(arg_specs)]


def example_workload(name: str, key: str, arg_specs: Sequence[Any], out_spec: TensorSpec, *,
                     generators: Mapping[int, Callable[..., Any]], rtol: float | None, atol: float | None,
                     accumulate: bool, inputs_text: str) -> Workload:
    """select()'s workload: generated inputs, then the output buffer as the last argument."""
    args = make_args(arg_specs, generators)
    args.append(example_input(out_spec, seed=int(config.get("autotune.seed")) + len(args)))
    return Workload(name=name, key=key, args=args, outputs=[len(args) - 1], rtol=rtol, atol=atol,
                    poison_outputs=not accumulate, inputs_text=inputs_text)


_executor: ThreadPoolExecutor | None = None


def build_executor() -> Executor:
    """Compiles run in threads: each waits on a compiler subprocess, so they overlap on every core."""
    global _executor
    if _executor is None:
        _executor = ThreadPoolExecutor(max_workers=int(config.get("compile_threads")),
                                       thread_name_prefix="tuneforge-build")
    return _executor


def _error_text(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, TuneforgeError) else f"{type(exc).__name__}: {exc}"


def _record(workload: Workload, choice: Choice, status: str, *, timing: Timing | None = None, error: str = "",
            info: Mapping[str, Any] | None = None) -> Record:
    stats: dict[str, Any] = {}
    if timing is not None:
        stats = {"median_ms": timing.median_ms, "min_ms": timing.min_ms, "mean_ms": timing.mean_ms,
                 "p20_ms": timing.p20_ms, "p80_ms": timing.p80_ms, "count": timing.count, "method": timing.method}
    return Record(key=workload.key, choice=choice.hash_key, op=workload.name, choice_name=choice.name,
                  status=status, error=error[:20000], params=_jsonable(choice.params), inputs=workload.inputs_text,
                  system=system_fingerprint()["hash"], info=dict(info or {}), **stats)


def _jsonable(params: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, (int, float, str, bool, type(None))) else repr(v) for k, v in params.items()}


def measure(workload: Workload, choices: Sequence[Choice], reference: Choice | None) -> Outcome:
    outcome = Outcome(records=[])
    failed: dict[str, Record] = {}

    started = time.perf_counter()
    to_build = list(choices) + ([reference] if reference is not None and reference not in choices else [])
    futures = {c.hash_key: c.build(build_executor()) for c in to_build}
    wait(list(futures.values()))
    for c in choices:
        exc = futures[c.hash_key].exception()
        if exc is not None:
            failed[c.hash_key] = _record(workload, c, "compile_error", error=_error_text(exc))
    ref_ok = reference is not None and futures[reference.hash_key].exception() is None
    outcome.build_s = time.perf_counter() - started

    started = time.perf_counter()
    args = workload.args
    original = verify.snapshot(args)
    if workload.poison_outputs:
        for i in workload.outputs:
            verify.poison(args[i])
    saved = verify.snapshot(args)  # the initial state every run starts from
    input_indices = [i for i in range(len(args)) if i not in workload.outputs]
    expected: list[Any] | None = None
    if ref_ok and reference is not None and config.get("autotune.verify"):
        try:
            reference.run(args)
            expected = verify.snapshot(args)
        except Exception as exc:
            log.warning("reference %s failed (%s); choices of %s are not verified", reference.name, exc,
                        workload.name)
        verify.restore(args, saved)
    flags: dict[str, dict[str, Any]] = {}
    for c in choices:
        if c.hash_key in failed:
            continue
        try:
            c.run(args)
        except Exception as exc:
            failed[c.hash_key] = _record(workload, c, "runtime_error", error=_error_text(exc) + "\n" +
                                         "".join(traceback.format_exception(exc)[-3:]))
            verify.restore(args, saved)
            continue
        mutated = verify.changed(args, saved, input_indices)
        if mutated:
            flags[c.hash_key] = {"mutates_inputs": mutated}
            log.warning("%s writes into its inputs %s; they are restored before every run", c.name, mutated)
        if expected is not None and c is not reference:
            problem = next((p for i in workload.outputs if (p := verify.compare(
                args[i], expected[i], rtol=workload.rtol, atol=workload.atol)) is not None), None)
            if problem is not None:
                failed[c.hash_key] = _record(workload, c, "wrong_result", error=problem, info=flags.get(c.hash_key))
        verify.restore(args, saved)
    outcome.verify_s = time.perf_counter() - started

    started = time.perf_counter()
    for c in choices:
        if c.hash_key in failed:
            outcome.records.append(failed[c.hash_key])
            continue
        restore_indices = [*workload.outputs, *flags.get(c.hash_key, {}).get("mutates_inputs", [])]

        def setup(indices: list[int] = restore_indices) -> None:
            verify.restore(args, saved, indices)

        def run(choice: Choice = c) -> None:
            choice.run(args)

        try:
            timing = benchmark_cpu(run, setup=setup)
        except Exception as exc:
            outcome.records.append(_record(workload, c, "runtime_error", error=_error_text(exc)))
            continue
        outcome.records.append(_record(workload, c, "ok", timing=timing, info=flags.get(c.hash_key)))
    outcome.bench_s = time.perf_counter() - started
    verify.restore(args, original)  # the caller's arrays (for @autotune) end as they began
    return outcome
