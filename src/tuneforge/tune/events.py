"""The events of a run of trials, as frozen dataclasses: what trials emit, the worker forwards and the
runner reads."""

from __future__ import annotations

from typing import TypeAlias

from tuneforge.dataclass_lite import dataclass
from tuneforge.store.record import Record

# The events of a run of trials, in order: InputsReady once the example inputs exist, ReferenceRan once the
# reference has run, then per choice ChoiceStarted and ChoiceResult, ChoiceConfirmed for a re-timed near tie,
# and TrialsDone. The parent of a worker that dies tells the phases apart by them: making the inputs (the
# machinery's failure), running the reference (the reference's), running choice i (its own). They cross the
# worker's pipe as pickles: plain frozen dataclasses of data. Kept out of job.py, which a selection answered
# from records imports: defining eight dataclasses costs about 2 ms at import, which only measuring needs.


@dataclass(frozen=True)
class InputsReady:
    """The example inputs exist; `runs_reference`: the reference runs next (a death now is its fault)."""

    runs_reference: bool


@dataclass(frozen=True)
class ReferenceRan:
    """The reference has run: `error` is why it failed (then no choice runs), None when it worked."""

    error: str | None


@dataclass(frozen=True)
class ChoiceStarted:
    """Choice `index` (of the choices sent) runs now: a death or hang from here on is its own."""

    index: int


@dataclass(frozen=True)
class ChoiceResult:
    """Choice `index` finished its trial with `record` (a stand-in when the reference failed)."""

    index: int
    record: Record


@dataclass(frozen=True)
class ChoiceConfirmed:
    """Choice `index` was re-timed in a near tie: `record` replaces its ChoiceResult record."""

    index: int
    record: Record


@dataclass(frozen=True)
class TrialsDone:
    """Every trial ran: seconds spent verifying and benchmarking, and before those making the inputs and running
    the reference (in a fresh worker: its CUDA context and first kernels too)."""

    verify_s: float
    bench_s: float
    setup_s: float = 0.0

    def plus(self, other: TrialsDone) -> TrialsDone:
        return TrialsDone(self.verify_s + other.verify_s, self.bench_s + other.bench_s, self.setup_s + other.setup_s)


Event: TypeAlias = InputsReady | ReferenceRan | ChoiceStarted | ChoiceResult | ChoiceConfirmed | TrialsDone


@dataclass(frozen=True)
class JobUnreadable:
    """Worker only: the job could not be unpickled there (`why`); the parent runs it itself."""

    why: str


@dataclass(frozen=True)
class JobFailed:
    """Worker only: the job failed as a whole (`error`, e.g. an input generator raised)."""

    error: str


@dataclass(frozen=True)
class ContextLost:
    """Worker only: `culprit` (a choice, or the reference) left the CUDA context unusable with `error`,
    after its record was sent. The worker exits; a fresh one resumes at choice `resume_at`. Times as in
    TrialsDone."""

    resume_at: int
    culprit: str
    error: str
    verify_s: float
    bench_s: float


# What a benchmark worker answers to a job: the trials' events, or why it could not run them (or no more).
WorkerEvent: TypeAlias = Event | JobUnreadable | JobFailed | ContextLost
