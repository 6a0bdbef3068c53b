"""One measurement: build every choice in parallel, then run the trials in-process or isolated.

A failing choice never stops the others: a build error is ``compile_error``, an exception while
running is ``runtime_error``, a result that differs from the reference is ``wrong_result``, and in
the isolated worker a crash or hang is ``crash`` or ``timeout``. A reference that fails (to build or to
run) stops the measurement with NoValidChoicesError: nothing could be verified, and an unverified
choice that does nothing would be the fastest. Each record is handed to
`on_record` as soon as it exists, so an interrupted selection keeps what finished.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import field
from typing import TYPE_CHECKING, Any, NoReturn

from tuneforge import config
from tuneforge.compile.pool import default_pool
from tuneforge.dataclass_lite import dataclass
from tuneforge.errors import NoValidChoicesError
from tuneforge.store.records import Record
from tuneforge.tune import runner, streamed
from tuneforge.tune.choices import Choice
from tuneforge.tune.events import ChoiceConfirmed, ChoiceResult, Event, TrialsDone
from tuneforge.tune.job import TrialJob, error_text, make_record, reference_died, reference_failure
from tuneforge.tune.protocol import check_pickle
from tuneforge.tune.trials import run_trials

if TYPE_CHECKING:
    from tuneforge.tune.report import SelectionReport
    from tuneforge.tune.setup_ahead import SetupAhead

log = logging.getLogger("tuneforge.tune")


@dataclass
class Outcome:
    records: list[Record] = field(default_factory=list)
    build_s: float = 0.0  # until every build has ended: streamed parts (verify_s, bench_s) ran within it
    verify_s: float = 0.0
    bench_s: float = 0.0
    startup_s: float = 0.0  # waiting for the benchmark worker to start (see runner.run_isolated)
    setup_s: float = 0.0  # the trials' inputs and reference run (events.TrialsDone)
    isolated: bool = False
    streamed: int = 0  # choices checked and timed while others compiled (streamed.py)

    def add_trials(self, times: TrialsDone) -> None:
        self.verify_s += times.verify_s
        self.bench_s += times.bench_s
        self.setup_s += times.setup_s

    def describe(self, report: SelectionReport) -> None:
        """Give `report` the phases' seconds, and how the trials ran."""
        report.build_s, report.verify_s, report.bench_s = self.build_s, self.verify_s, self.bench_s
        report.startup_s, report.setup_s, report.isolated = self.startup_s, self.setup_s, self.isolated
        if self.streamed:
            report.extra["streamed"] = self.streamed

    def add(self, other: Outcome) -> None:
        """Another batch's times (a search measures in batches: its report shows their sums)."""
        self.build_s += other.build_s
        self.verify_s += other.verify_s
        self.bench_s += other.bench_s
        self.startup_s += other.startup_s
        self.setup_s += other.setup_s
        self.isolated |= other.isolated
        self.streamed += other.streamed


def _isolating(job: TrialJob, choices: Sequence[Choice]) -> bool:
    return job.live_args is None and config.get_bool("autotune.isolate") and any(c.is_native for c in choices)


def _split(job: TrialJob, choices: Sequence[Choice],
           reference: Choice | None) -> tuple[list[Choice], list[Choice], dict[int, frozenset[str]]]:
    """(choices for the isolated worker, choices to run here, the ``__main__`` names that the job, the
    reference and each of those choices refer to, by id(): see runner._route).

    Each object is pickled once here, for both answers; it is pickled again only when sent.
    """
    if not _isolating(job, choices):
        return [], list(choices), {}
    shared = [job, *([reference] if reference is not None else [])]
    checks = {id(obj): check_pickle(obj) for obj in shared}
    if not all(checks[id(obj)].picklable for obj in shared):
        log.warning("%s: the reference or an input generator cannot be sent to the benchmark worker "
                    "(define it at module level); compiled choices run in this process", job.name)
        return [], list(choices), {}
    for c in choices:
        if id(c) not in checks:  # the reference is often one of the choices too
            checks[id(c)] = check_pickle(c)
    remote = [c for c in choices if checks[id(c)].picklable]
    local = [c for c in choices if not checks[id(c)].picklable]
    return remote, local, {i: check.main_names for i, check in checks.items()}


def _setup_ahead(job: TrialJob, choices: Sequence[Choice], reference: Choice | None,
                 builds: Sequence[Future[Any]]) -> SetupAhead | None:
    """The worker makes the inputs and runs the reference while the choices compile (setup_ahead.py), where there
    are builds to wait for and the reference needs none: a compiled reference that crashes or hangs would do so
    twice, here and in the job proper."""
    if not _isolating(job, choices) or runner.in_worker() or all(f.done() for f in builds) or \
            (reference is not None and not reference.is_extern):
        return None
    from tuneforge.tune.setup_ahead import SetupAhead

    return SetupAhead(job, reference)


def _with_sample_head(job: TrialJob, choices: Sequence[Choice]) -> TrialJob:
    """`job` with the rows of the longest sample a choice runs on (TrialJob.sample_head), where it samples rows
    independent of each other."""
    sample = job.sample
    if sample is None or not sample.independent_rows:
        return job
    specs = job.live_args if job.live_args is not None else [*job.arg_specs, job.out_spec]
    first = specs[sample.args[0]]
    total = len(first) if job.live_args is not None else first.sizes[0]
    rows = [r for c in choices if (r := c.sample_rows(sample.rows, total)) < total]
    return dataclasses.replace(job, sample_head=max(rows, default=sample.rows))


def measure(job: TrialJob, choices: Sequence[Choice], reference: Choice | None,
            on_record: Callable[[Record], None] | None = None) -> Outcome:
    outcome = Outcome()
    job = _with_sample_head(job, choices)
    reference_failed: list[tuple[str, str]] = []
    recorded: dict[str, Record] = {}

    def record(r: Record) -> None:
        failure = reference_failure(r)
        if failure is not None:  # a stand-in, never stored: see job.reference_failed_record
            reference_failed.append(failure)
            return
        if recorded.get(r.choice) == r:  # a part's record, given back by the last job (streamed.py)
            return
        recorded[r.choice] = r
        outcome.records.append(r)
        if on_record is not None:
            on_record(r)

    started = time.perf_counter()
    to_build = list(choices) + ([reference] if reference is not None and reference not in choices else [])
    pool = default_pool()
    if _isolating(job, choices):
        # It starts up while the choices compile. Before they are submitted: the pool may fork its workers then,
        # and a fork while this thread starts a process would keep the new process's exec-error pipe open in the
        # fork, and this thread waiting for it.
        runner.prestart(job.device, job.libraries())
    futures = {c.hash_key: c.build(pool) for c in to_build}
    ahead = _setup_ahead(job, choices, reference, list(futures.values()))
    routes, parts = None, streamed.Parts()
    if _isolating(job, choices) and not runner.in_worker() and streamed.wanted(job, list(futures.values())):
        # Routed before they are built: a build only adds the keys of what it made, which pickle either way.
        routes = _split(job, choices, reference)
        if ahead is not None:
            _joined(ahead, outcome)  # the worker is free for the first part once it has made the inputs
        if routes[0] and (ahead is None or ahead.reference_death is None):
            parts = streamed.run_parts(job, routes[0], reference, futures, pool, record, routes[2],
                                       among=len(choices))
            outcome.add_trials(parts.times)
            outcome.startup_s += parts.startup_s
            outcome.isolated |= parts.sent
            outcome.streamed = len(parts.records)
    pool.wait(list(futures.values()))
    built = []
    for c in choices:
        exc = futures[c.hash_key].exception()
        if exc is None:
            built.append(c)
        else:
            record(make_record(job, c, "compile_error", error=error_text(exc)))
    if reference is not None and config.get_bool("autotune.verify"):
        exc = futures[reference.hash_key].exception()
        if exc is not None:
            _reference_failed(job, reference.name, f"compile_error: {error_text(exc)}", outcome.records)
    outcome.build_s = time.perf_counter() - started

    # Library calls last: their thread pools can keep spinning after they return (see Trials).
    built.sort(key=lambda c: c.is_extern)
    local_job = job
    if routes is None:
        remote, local, main_names = _split(job, built, reference)
    else:
        sendable = {id(c) for c in routes[0]}
        remote = parts.undecided([c for c in built if id(c) in sendable])
        local, main_names = [c for c in built if id(c) not in sendable], routes[2]
        job = parts.last_job(job, len(choices))
    if parts.reference_failed:
        remote, local = [], []  # a reference that failed in a part fails the selection (below)
    if ahead is not None:
        _joined(ahead, outcome)  # what is left of the worker's start and of making the inputs
        if ahead.reference_death is not None and reference is not None and (remote or local):
            # Nothing runs: not in a worker it would crash again, nor here, where it would crash the caller.
            reference_died(job, [*remote, *local], reference, *ahead.reference_death, record)
            remote, local = [], []
        elif not remote:
            ahead.release()
    if parts.sent and not remote:
        runner.release_kept(job.device)  # the parts' inputs: no last job comes for them
    if remote:
        times, startup_s = runner.run_isolated(job, remote, reference, record, main_names)
        outcome.add_trials(times)
        outcome.startup_s += startup_s
        outcome.isolated = True
    if reference_failed:
        _reference_failed(job, reference_failed[0][0], reference_failed[0][1], outcome.records)
    if local:
        def emit(event: Event) -> None:
            if isinstance(event, (ChoiceResult, ChoiceConfirmed)):
                record(event.record)
            elif isinstance(event, TrialsDone):
                outcome.add_trials(event)

        run_trials(local_job, local, reference, emit)
    if reference_failed:
        _reference_failed(job, reference_failed[0][0], reference_failed[0][1], outcome.records)
    return outcome


def _joined(ahead: SetupAhead, outcome: Outcome) -> None:
    """Wait for the inputs made ahead; the seconds waited for the worker's start, then for the rest, are the
    outcome's (a second call adds what little is left)."""
    waited_start, waited_setup = ahead.join()
    outcome.startup_s += waited_start
    outcome.setup_s += waited_setup


def _reference_failed(job: TrialJob, reference: str, error: str, records: Sequence[Record]) -> NoReturn:
    reasons = {reference: error}
    reasons.update({r.choice_name: f"{r.status}: {r.error}".strip() for r in records if r.choice_name != reference})
    raise NoValidChoicesError(
        f"the reference {reference} of {job.name} failed, so no choice could be verified; none was timed or "
        f"recorded as valid. Fix the reference, pass a working reference= to select(), or set autotune.verify="
        f"false (TUNEFORGE_AUTOTUNE_VERIFY=0) to time the choices unverified", reasons)
