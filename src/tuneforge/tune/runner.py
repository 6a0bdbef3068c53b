"""Trials in a persistent worker process that survives crashing and hanging kernels.

The parent sends a job (specs, choices as picklable data, settings) and reads one event per step.
If the worker dies (segfault, abort) the choice it was running is recorded as ``crash`` with the
signal; if a choice runs past ``autotune.bench_timeout_s`` the worker is killed and the choice is
recorded as ``timeout``. Either way a fresh worker continues with the remaining choices.

The events tell which phase a worker died in (see events.Event). While running the reference: the
selection fails as it does when the reference raises (nothing could be verified), and the reference
never runs in this process, where it would crash or hang the caller. While making the example inputs
(e.g. the out-of-memory killer) or again and again between choices: the machinery failed, not a
choice, so this raises and the selection falls back with one warning, recording nothing.

A launcher or reference defined in the user's script is pickled as ``__main__.<name>``, which the
worker resolves only after importing that script (see worker.py; as multiprocessing's spawn does).
Before anything is benchmarked the parent finds such names, has the worker import the script, and
when that cannot work (the main module is not a file: ``python -c``, stdin, a REPL, a notebook; or
the import fails) runs those trials here with one warning naming the functions. A job the worker
cannot read is likewise run here: a failure of the machinery is never recorded as a crash of every
choice.

There is one worker per device (see device.py): the CPU's, and one per GPU that sees that GPU alone. A
choice that leaves a GPU's CUDA context unusable (an illegal memory access, say) gets its
``runtime_error`` record; its worker then exits (ContextLost) and a fresh one runs the remaining choices.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

from tuneforge import config
from tuneforge.dataclass_lite import dataclass
from tuneforge.store.records import Record
from tuneforge.supervisor import settings_snapshot
from tuneforge.tune.choices import Choice
from tuneforge.tune.events import (
    ChoiceConfirmed,
    ChoiceResult,
    ChoiceStarted,
    ContextLost,
    Event,
    InputsReady,
    JobFailed,
    JobUnreadable,
    ReferenceRan,
    TrialsDone,
)
from tuneforge.tune.job import TrialJob, make_record, reference_died, reference_failure
from tuneforge.tune.protocol import ChannelClosed, ChannelTimeout, check_pickle
from tuneforge.tune.trials import run_trials
from tuneforge.tune.worker_process import STARTUP_TIMEOUT_S, WorkerProcess
from tuneforge.warn_once import first_time, warn_once

log = logging.getLogger("tuneforge.tune")

# Libraries a worker may import ahead of a job that needs them (TrialJob.libraries), or, where `prepare` starts
# it with no job in view, that the parent has loaded: the choices would otherwise import them on their first
# (checked) run, inside the selection. torch takes about 2 s here; a worker started ahead of the builds
# (prestart) imports it while they compile.
PRELOADED = ("torch",)


_workers: dict[str, WorkerProcess] = {}
_lock = threading.Lock()
_in_worker = False  # set in the benchmark worker itself: it never starts a worker of its own
_main_problem: str | None = None  # why the worker cannot import this process's main script, once known


def _started(device: str, libraries: Sequence[str] = ()) -> WorkerProcess:
    """The worker for `device`, started now if none runs (not waited for), importing `libraries`. Callers hold
    _lock."""
    worker = _workers.get(device)
    if worker is None or not worker.alive():
        worker = _workers[device] = WorkerProcess(device, libraries)
    else:
        worker.load(libraries)
    return worker


def _worker(device: str = "cpu", libraries: Sequence[str] = ()) -> WorkerProcess:
    worker = _started(device, libraries)
    try:
        worker.wait_ready()
    except BaseException:
        _discard(device)
        raise
    return worker


def prestart(device: str = "cpu", libraries: Sequence[str] = ()) -> None:
    """Start the worker for `device` if none runs, without waiting for it: it starts up (0.15 s: Python, numpy),
    and imports `libraries`, while the choices are compiled. Nothing when another thread is using the workers."""
    if _in_worker or not _lock.acquire(blocking=False):
        return
    try:
        _started(device, libraries)
    except (OSError, RuntimeError) as exc:  # tried again, and reported, when a job needs it
        log.debug("could not start the benchmark worker ahead of the builds: %s", exc)
    finally:
        _lock.release()


def prepare(device: str = "cpu", *, wait: bool = False) -> bool:
    """Start the benchmark worker of `device` ("cpu", "cuda" for torch's current GPU, or "cuda:N") now, in the
    background, so that a later selection that measures does not wait for it. A GPU's worker imports torch and
    makes its CUDA context before it takes a job: 2-3.5 s that a program's first cold selection otherwise waits
    for (an H100 host, torch 2.11), on top of its builds. `wait`: return once it is ready.

    On a GPU the build pool's workers also make their first Triton compile now (compile/triton_warmup.py), whether
    or not trials are isolated.

    Returns whether a worker runs (or is starting) for that device; False with ``autotune.isolate`` off, where
    trials run in the calling process and there is nothing to start.
    """
    from tuneforge.tune.device import cuda_index, current_cuda_device

    if device == "cuda":
        device = f"cuda:{current_cuda_device()}"
    index = cuda_index(device)  # "cpu" or "cuda:N", else a ValueError naming it
    if _in_worker:
        return False
    isolated = config.get_bool("autotune.isolate")
    if isolated:
        libraries = [name for name in PRELOADED if name in sys.modules]  # no job in view: what this process uses
        with _lock:
            (_worker if wait else _started)(device, libraries)
    if index is not None:  # after the worker's start: a fork while it starts would hold its exec pipe (measure.py)
        from tuneforge.compile.triton_warmup import warm_for_gpu

        warm_for_gpu(index, block=wait)
    return isolated


def _discard(device: str = "cpu") -> None:
    worker = _workers.pop(device, None)
    if worker is not None:
        worker.kill()


discard_worker = _discard  # for setup_ahead, which holds the lock through worker_for


@contextlib.contextmanager
def worker_for(job: TrialJob) -> Iterator[WorkerProcess]:
    """The ready worker of `job`'s device, held (no other job reaches it) until the block ends."""
    with _lock:
        if _in_worker:
            raise RuntimeError("the benchmark worker starts no worker of its own")
        yield _worker(job.device, job.libraries())


def release_kept(device: str) -> None:
    """Have the worker of `device` drop the inputs a job kept (TrialJob.keep_inputs) for a job that will not come."""
    with _lock:
        worker = _workers.get(device)
        if worker is not None and worker.alive():
            with contextlib.suppress(OSError):
                worker.send(("release",))


def shutdown() -> None:
    """Stop every benchmark worker (at exit, and after an interrupted selection)."""
    for device in list(_workers):
        worker = _workers.pop(device)
        try:
            if worker.alive():
                worker.send(("exit",))
                worker.proc.wait(timeout=2)
        except (OSError, subprocess.TimeoutExpired):
            pass
        worker.kill()


atexit.register(shutdown)


def in_worker() -> bool:
    """Whether this process is a benchmark worker (whose selections run their trials in it)."""
    return _in_worker


def mark_worker() -> None:
    """Called by the benchmark worker: a selection made in it runs its trials in that process."""
    global _in_worker
    _in_worker = True


def main_script() -> dict[str, Any] | None:
    """How a worker can import this process's ``__main__``, or None when it cannot.

    ``python -m pkg.mod`` is imported by name; ``python script.py`` by path. A package's
    ``__main__.py`` is not: it usually does its work unguarded (multiprocessing skips it too).
    """
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None:
        name = getattr(spec, "name", None)
        if not isinstance(name, str) or name == "__main__" or name.endswith(".__main__"):
            return None
        return {"name": name, "argv": list(sys.argv)}
    path = getattr(main, "__file__", None)
    if not isinstance(path, str) or not os.path.isfile(path):
        return None  # python -c, standard input, an interactive session, a notebook
    return {"path": os.path.abspath(path), "argv": list(sys.argv)}


def _main_names(obj: object, known: Mapping[int, frozenset[str]] | None) -> frozenset[str]:
    if known is not None and id(obj) in known:
        return known[id(obj)]
    # Not picklable at all gives no names: measure() keeps such choices in this process anyway.
    return check_pickle(obj).main_names


def _load_main(worker: WorkerProcess, main: dict[str, Any]) -> str | None:
    """Have `worker` import the main script (once per worker): None, or why it could not."""
    if worker.main_loaded:
        return None
    try:
        worker.send(("main", main, settings_snapshot()))
        reply = worker.receive(STARTUP_TIMEOUT_S)
    except ChannelClosed:
        reason = worker.death()
        _discard(worker.device)
        return f"the worker was {reason} while importing it"
    except ChannelTimeout:
        _discard(worker.device)
        return f"importing it in the worker took longer than {STARTUP_TIMEOUT_S:g} s"
    if reply[0] != "main" or reply[1] is not None:
        _discard(worker.device)  # a half-imported script may have left anything behind: start clean
        detail = reply[1] if reply[0] == "main" else f"unexpected reply {reply[0]!r}"
        return f"importing it in the worker failed: {detail}"
    worker.main_loaded = True
    return None


def _route(job: TrialJob, choices: Sequence[Choice], reference: Choice | None,
           main_names: Mapping[int, frozenset[str]] | None = None
           ) -> tuple[list[Choice], list[Choice], dict[str, Any] | None]:
    """(choices for the worker, choices to run here, the main script the worker must import first).

    Decided before anything is benchmarked, so an unusable ``__main__`` costs a warning, not records.
    `main_names` holds what an earlier pickling pass found (see measure._split), by id().
    """
    global _main_problem
    shared = _main_names(job, main_names) | (_main_names(reference, main_names) if reference is not None
                                             else frozenset())
    own = {id(c): _main_names(c, main_names) for c in choices}
    if not shared and not any(own.values()):
        return list(choices), [], None
    # What the worker sends back (records, errors) may name its alias of the script; as multiprocessing does.
    if "__main__" in sys.modules:
        sys.modules.setdefault("__mp_main__", sys.modules["__main__"])
    main = main_script()
    problem: str | None = "the main module is not a file (python -c, standard input, an interactive session " \
                          "or a notebook)"
    if main is not None:
        problem = _main_problem or _load_main(_worker(job.device, job.libraries()), main)
        _main_problem = problem  # a script that failed to import is not tried again in this process
    if problem is None:
        return list(choices), [], main
    here = {id(c) for c in choices if shared or own[id(c)]}
    names = sorted(shared.union(*(own[i] for i in here)))
    new = [name for name in names if first_time(f"tune.runner:main-function:{name}")]  # marks every one
    if new:  # one warning, naming every function of this selection at once
        hint = " or keep the script's own work under `if __name__ == \"__main__\":`" if main is not None else ""
        it = "it" if len(names) == 1 else "them"
        log.warning("%s: %s, defined in the main script, cannot reach the benchmark worker (%s); the trials that "
                    "use %s run in this process, where a crash or hang is not isolated. Define %s in an importable "
                    "module (a .py file the script imports)%s to run them isolated",
                    job.name, ", ".join(names), problem, it, it, hint)
    return [c for c in choices if id(c) not in here], [c for c in choices if id(c) in here], None


def _run_here(job: TrialJob, choices: Sequence[Choice], reference: Choice | None,
              on_record: Callable[[Record], None]) -> TrialsDone:
    times = [TrialsDone(0.0, 0.0)]

    def emit(event: Event) -> None:
        if isinstance(event, (ChoiceResult, ChoiceConfirmed)):
            on_record(event.record)
        elif isinstance(event, TrialsDone):
            times[0] = event

    run_trials(job, choices, reference, emit)
    return times[0]


def run_isolated(job: TrialJob, choices: Sequence[Choice], reference: Choice | None,
                 on_record: Callable[[Record], None],
                 main_names: Mapping[int, frozenset[str]] | None = None) -> tuple[TrialsDone, float]:
    """Run the trials of `choices` in the worker; returns their times (summed over the workers and this process)
    and the seconds spent waiting for a worker to start (a process's first selection pays for its interpreter
    and imports).

    Choices the worker cannot receive (see `_route`) run in this process, after the others, unless
    the reference failed in the worker: then nothing could be verified, and a reference that crashed
    or hung the worker must not run here. `main_names`: see `_route`.
    """
    reference_failed = False

    def record(r: Record) -> None:
        nonlocal reference_failed
        reference_failed = reference_failed or reference_failure(r) is not None
        on_record(r)

    with _lock:
        try:
            remote, here, main = (([], list(choices), None) if _in_worker
                                  else _route(job, choices, reference, main_names))
            times, startup_s, unsent = _run_in_worker(job, remote, reference, main, record)
        except BaseException:
            _discard(job.device)  # interrupted or broken mid-job: never leave a worker running a kernel
            raise
    here_ids = {id(c) for c in [*here, *unsent]}
    if here_ids and not reference_failed:  # in the caller's order (library calls last, see measure)
        times = times.plus(_run_here(job, [c for c in choices if id(c) in here_ids], reference, on_record))
    return times, startup_s


def _run_in_worker(job: TrialJob, choices: Sequence[Choice], reference: Choice | None, main: dict[str, Any] | None,
                   on_record: Callable[[Record], None]) -> tuple[TrialsDone, float, list[Choice]]:
    """The worker loop: (the trials' times, seconds waiting for workers to start, choices it could not take, to
    run here)."""
    timeout = config.get_float("autotune.bench_timeout_s")
    device, sent = job.device, job.for_worker()
    remaining = list(choices)
    times, startup_s = TrialsDone(0.0, 0.0), 0.0
    stalls = 0
    while remaining:
        if stalls >= 3:  # dying again and again between choices is the machinery's fault, not theirs
            raise RuntimeError("the benchmark worker died repeatedly before running a choice")
        before = len(remaining)
        started = time.perf_counter()
        worker = _worker(device, job.libraries())
        problem = _load_main(worker, main) if main is not None else None
        startup_s += time.perf_counter() - started
        if problem:  # it worked for an earlier worker: unlikely, and not the choices' fault
            warn_once(log, f"tune.runner:main:{problem}", "%s: the main script stopped importing in the benchmark "
                      "worker (%s); the remaining trials run in this process", job.name, problem)
            return times, startup_s, remaining
        worker.send(("job", sent, remaining, reference, settings_snapshot()))
        progress = _Progress()
        try:
            while True:
                event = worker.receive(timeout)
                match event:
                    case InputsReady(runs_reference=runs_reference):
                        progress.reference_running = runs_reference
                    case ReferenceRan():
                        progress.reference_running, progress.resume_at = False, 0
                    case ChoiceStarted(index=index):
                        progress.current = index
                    case ChoiceResult(index=index, record=result):
                        on_record(result)
                        progress.current, progress.resume_at = None, index + 1
                    case ChoiceConfirmed(record=result):  # re-timed (a near tie, the whole problem): replaces
                        on_record(result)
                        progress.current = None
                    case TrialsDone():
                        times = times.plus(event)
                        remaining = []
                        break
                    case JobUnreadable(why=why):  # the machinery failed, not a choice: never a crash record
                        warn_once(log, f"tune.runner:unreadable:{why}", "%s: the benchmark worker cannot read the "
                                  "trials (%s); they run in this process, where a crash or hang is not isolated. "
                                  "Define launchers, references and generators in an importable module to run "
                                  "them isolated", job.name, why)
                        return times, startup_s, remaining
                    case JobFailed(error=error):
                        raise RuntimeError(f"benchmark worker failed: {error}")
                    case ContextLost(resume_at=resume_at, culprit=culprit, error=error, verify_s=verified,
                                     bench_s=benched):  # its record came first; the worker exits by itself
                        log.warning("%s: %s left the CUDA context of the benchmark worker unusable (%s); a fresh "
                                    "worker runs the remaining choices", job.name, culprit, error.partition("\n")[0])
                        times = times.plus(TrialsDone(verified, benched))
                        _discard(device)
                        remaining = remaining[resume_at:]
                        break
        except ChannelClosed:
            death = worker.death()
            _discard(device)
            remaining = _after_failure(job, remaining, progress, reference, "crash", death, on_record)
        except ChannelTimeout:
            _discard(device)
            remaining = _after_failure(job, remaining, progress, reference, "timeout", f"{timeout:g} s", on_record)
        stalls = stalls + 1 if remaining and len(remaining) == before else 0
    return times, startup_s, []


@dataclass
class _Progress:
    """How far one job in a worker got, from its events: which phase a death interrupted."""

    reference_running: bool = False  # the inputs exist and the reference runs now
    resume_at: int | None = None  # set once the reference has run: where a new worker resumes
    current: int | None = None  # the choice running now


def _after_failure(job: TrialJob, remaining: list[Choice], progress: _Progress, reference: Choice | None,
                   status: Literal["crash", "timeout"], detail: str,
                   on_record: Callable[[Record], None]) -> list[Choice]:
    """Record what the worker was running when it died (`status` crash, `detail` e.g. 'killed by SIGSEGV')
    or hung (timeout, after `detail` seconds); return the choices a fresh worker must still try.

    A failure while making the example inputs (e.g. the out-of-memory killer) is no choice's fault: it
    raises, so the selection falls back without recording anything a later selection would take for a
    measurement. A failure of the reference gives each remaining choice its stand-in record: the
    selection then fails as it does when the reference raises.
    """
    if progress.current is None:
        if progress.resume_at is not None:  # died between two choices: nobody to blame, go on
            return remaining[progress.resume_at:]
        if progress.reference_running and reference is not None:
            reference_died(job, remaining, reference, status, detail, on_record)
            return []
        what = f"it was {detail}" if status == "crash" else f"no answer within {detail}"
        raise RuntimeError(f"the benchmark worker failed before any choice ran, while making the example inputs "
                           f"({status}: {what})")
    reason = (f"the benchmark worker was {detail} while running it" if status == "crash" else
              f"still running after {detail} (autotune.bench_timeout_s); the worker was killed")
    choice = remaining[progress.current]
    log.warning("%s: %s (%s)", choice.name, status, reason)
    on_record(make_record(job, choice, status, error=reason))
    return remaining[max(progress.current + 1, progress.resume_at or 0):]  # a choice confirmed late: all ran
