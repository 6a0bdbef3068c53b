"""The example inputs and the reference's outputs, made in the benchmark worker while the choices compile.

A cold selection's trials start by making the inputs and running the reference: on an H100 0.2-1.0 s of a
4-6 s first call (8192^2 fp16 operands, cuBLAS's first call), spent after 1.5-1.9 s of builds during which the
worker, started ahead of them (runner.prestart), has nothing to do. So measure() sends the worker a job with no
choices that keeps what it made (TrialJob.keep_inputs, as a search's batches do), while the builds run; the job
proper then finds them (trials._trials_for) and goes straight to the choices.

Best effort, never a second source of truth: anything that goes wrong here (the worker dies or hangs while making
the inputs, the reference raises, the job cannot be read) discards what was made, and the job proper makes it
again, where every failure is reported and recorded as before. Only a reference that crashed or hung the worker is
taken as found (`reference_death`): the selection fails at once, as the job proper would have made it fail after
crashing or hanging a second worker.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Literal

from tuneforge import config
from tuneforge.supervisor import settings_snapshot
from tuneforge.tune import runner
from tuneforge.tune.choices import Choice
from tuneforge.tune.events import ContextLost, InputsReady, JobFailed, JobUnreadable, ReferenceRan, TrialsDone
from tuneforge.tune.job import TrialJob
from tuneforge.tune.protocol import ChannelClosed, ChannelTimeout, check_pickle
from tuneforge.tune.worker_process import WorkerProcess

log = logging.getLogger("tuneforge.tune")


class SetupAhead:
    """Makes `job`'s inputs and runs `reference` (None, or a library call: nothing to build) in the worker of
    `job.device`, in a thread started now. `join()` after the builds."""

    def __init__(self, job: TrialJob, reference: Choice | None) -> None:
        self.kept = False  # whether the worker holds what it made (a failed reference's too, which no job takes)
        # How the reference ended the worker ("crash", how it ended / "timeout", the limit): the job proper takes
        # it as its own finding instead of crashing or hanging a worker again (runner.reference_died)
        self.reference_death: tuple[Literal["crash", "timeout"], str] | None = None
        self._device = job.device
        self._ready_at: float | None = None  # when the worker was ready for it
        self._settings = settings_snapshot()  # the caller's, as the job proper sends them
        self._thread = threading.Thread(target=self._run, args=(job, reference),
                                        name="tuneforge-setup-ahead", daemon=True)
        self._thread.start()

    def join(self) -> tuple[float, float]:
        """Wait until the worker has made them (or failed to): the seconds waited for its start, then for the rest
        (the inputs, the reference), as a selection reports them (startup_s, setup_s)."""
        started = time.perf_counter()
        self._thread.join()
        ended = time.perf_counter()
        ready = min(ended, max(started, self._ready_at or ended))
        return ready - started, ended - ready

    def release(self) -> None:
        """After join(): the job proper will not come (no choice built), so the worker drops what it kept."""
        if self.kept:
            runner.release_kept(self._device)

    def _run(self, job: TrialJob, reference: Choice | None) -> None:
        try:
            if not all(check.picklable and not check.main_names for check in map(check_pickle, (job, reference))):
                return  # unpicklable, or from the main script: the job proper routes those (runner._route)
            sent = dataclasses.replace(job.for_worker(), keep_inputs=True, ahead=True)
            with runner.worker_for(job) as worker:
                self._ready_at = time.perf_counter()
                self.kept = self._make(worker, job.device, sent, reference)
        except Exception as exc:  # best effort: the job proper does it again and reports what fails
            log.debug("%s: making the inputs ahead of the builds failed: %s", job.name, exc)

    def _make(self, worker: WorkerProcess, device: str, job: TrialJob, reference: Choice | None) -> bool:
        """Send the choice-less `job` (as the worker of `device` receives it); whether the worker kept what it made."""
        timeout = config.get_float("autotune.bench_timeout_s")
        worker.send(("job", job, [], reference, self._settings))
        reference_running = False
        try:
            while True:
                event = worker.receive(timeout)
                if isinstance(event, InputsReady):
                    reference_running = event.runs_reference
                elif isinstance(event, ReferenceRan):
                    reference_running = False
                elif isinstance(event, TrialsDone):
                    return True
                elif isinstance(event, (JobFailed, JobUnreadable)):
                    return False
                elif isinstance(event, ContextLost):  # the worker exits by itself
                    runner.discard_worker(device)
                    return False
        except ChannelClosed:
            death = worker.death()
            runner.discard_worker(device)
            if reference_running:
                self.reference_death = ("crash", death)
        except ChannelTimeout:
            runner.discard_worker(device)
            if reference_running:
                self.reference_death = ("timeout", f"{timeout:g} s")
        return False
