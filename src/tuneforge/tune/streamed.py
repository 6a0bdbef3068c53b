"""Trials while the choices still compile: a selection's choices sent to the benchmark worker in parts, as their
builds end.

A cold GPU selection on an H100 compiled its ~16 Triton kernels for 1.5-1.9 s and only then checked and timed them
(0.25-0.4 s, then 0.7-1.4 s), while the worker, started ahead of the builds, waited. The GPU can work while the
CPUs compile: CUDA events time the GPU's own work, and each batch of timed runs is queued behind a hold (bench_gpu),
so a busy host hardly enters a timing. So while builds are pending, each time the worker is free, measure() sends
it the choices built since the last part: they are checked and timed briefly (screened as among the whole
selection: TrialJob.part, TrialJob.screen_among), and the worker keeps the example inputs and the reference's
outputs for the next part (TrialJob.keep_inputs). The selection's last job, once every build has ended, holds
every choice not yet decided: those timed in a part come with their records (TrialJob.timed), and only the
contenders among all are timed fully, and near ties side by side, with the compilers done.

On the CPU the kernels timed would share the cores with the compilers: `autotune.stream` ("auto") streams GPU jobs
only. A choice whose part failed (wrong result, crash) is recorded there and not run again; a reference that
fails in a part stops the streaming, and measure() fails the selection as it would have.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from typing import TYPE_CHECKING, Any

from tuneforge import config
from tuneforge.dataclass_lite import dataclass
from tuneforge.store.records import Record
from tuneforge.tune.choices import Choice
from tuneforge.tune.events import TrialsDone
from tuneforge.tune.job import TrialJob, reference_failure

if TYPE_CHECKING:
    from tuneforge.compile.pool import BuildPool

_POLL_S = 0.25  # how often a wait for builds wakes up (a Ctrl-C is seen then)


def wanted(job: TrialJob, futures: Sequence[Future[Any]]) -> bool:
    """Whether `job`'s trials should start while builds are pending (`autotune.stream`): there are builds left to
    wait for, and the job runs on a GPU (or the setting says "on")."""
    setting = config.get_str("autotune.stream")
    if setting == "off" or (setting == "auto" and job.device == "cpu"):
        return False
    return not all(f.done() for f in futures)


@dataclass
class Parts:
    """What the parts did: each choice's record from its part, by hash; whether any part was sent (then the
    worker keeps the inputs for the last job, or must be told to drop them); their times, and the seconds waited
    for a worker to start."""

    records: dict[str, Record] = dataclasses.field(default_factory=dict)
    sent: bool = False
    reference_failed: bool = False
    times: TrialsDone = dataclasses.field(default_factory=lambda: TrialsDone(0.0, 0.0))
    startup_s: float = 0.0

    def last_job(self, job: TrialJob, among: int) -> TrialJob:
        """The selection's last job: the choices timed ok in a part stand as timed (left to the contenders' full
        timing and the side-by-side re-timing), screening decided among `among` choices."""
        timed = {**job.timed, **{k: r for k, r in self.records.items() if r.status == "ok"}}
        return dataclasses.replace(job, timed=timed, screen_among=among) if self.sent else job

    def undecided(self, choices: Sequence[Choice]) -> list[Choice]:
        """`choices` less those a part found failing (recorded there: not run again)."""
        return [c for c in choices if (r := self.records.get(c.hash_key)) is None or r.status == "ok"]


def run_parts(job: TrialJob, choices: Sequence[Choice], reference: Choice | None, futures: Mapping[str, Future[Any]],
              pool: BuildPool, record: Callable[[Record], None], main_names: Mapping[int, frozenset[str]],
              among: int) -> Parts:
    """While builds are pending, send the worker the `choices` built since the last part (all of them sendable to
    it: measure._split), each part's records handed to `record`. Returns when every build has ended (what was
    built last is the last job's), or the reference failed."""
    from tuneforge.tune.runner import run_isolated

    parts = Parts()
    part = dataclasses.replace(job, keep_inputs=True, ahead=True, part=True, confirm="none", screen_among=among)
    reference_build = futures.get(reference.hash_key) if reference is not None else None
    sent: set[str] = set()

    def take(r: Record) -> None:
        parts.reference_failed |= reference_failure(r) is not None
        parts.records[r.choice] = r
        record(r)

    try:
        while not all(f.done() for f in futures.values()):
            if reference_build is not None and reference_build.done() and reference_build.exception() is not None:
                break  # nothing can be checked: measure() reports it
            ready = [] if reference_build is not None and not reference_build.done() else \
                [c for c in choices if c.hash_key not in sent and futures[c.hash_key].done()]
            if not ready:
                wait([f for f in futures.values() if not f.done()], timeout=_POLL_S, return_when=FIRST_COMPLETED)
                continue
            sent.update(c.hash_key for c in ready)
            built = sorted((c for c in ready if futures[c.hash_key].exception() is None), key=lambda c: c.is_extern)
            if not built:
                continue
            times, startup_s = run_isolated(part, built, reference, take, main_names)
            parts.sent = True
            parts.times, parts.startup_s = parts.times.plus(times), parts.startup_s + startup_s
            if parts.reference_failed:
                break
    except KeyboardInterrupt:
        pool.shutdown(cancel=True)  # as pool.wait does: no compiler left running
        raise
    return parts
