"""Trials in a persistent worker process that survives crashing and hanging kernels.

The parent sends a job (specs, choices as picklable data, settings) and reads one event per step.
If the worker dies (segfault, abort) the choice it was running is recorded as ``crash`` with the
signal; if a choice runs past ``autotune.bench_timeout_s`` the worker is killed and the choice is
recorded as ``timeout``. Either way a fresh worker continues with the remaining choices.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from tuneforge import config
from tuneforge.store.records import Record
from tuneforge.tune.choices import Choice
from tuneforge.tune.job import TrialJob, make_record
from tuneforge.tune.protocol import ChannelClosed, ChannelTimeout, receive, send

log = logging.getLogger("tuneforge.tune")

_STARTUP_TIMEOUT_S = 120.0


class WorkerProcess:
    """One benchmark worker: a ``python -m tuneforge.tune.worker`` child talking over pipes."""

    def __init__(self) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen([sys.executable, "-m", "tuneforge.tune.worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=None, env=env, close_fds=True)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._write = self.proc.stdin.fileno()
        self._read = self.proc.stdout.fileno()
        cpus = list(config.get("autotune.worker_cpus"))
        send(self._write, {"sys_path": [p for p in sys.path if p], "cpus": cpus})
        ready = self.receive(_STARTUP_TIMEOUT_S)
        if ready[0] != "ready":
            raise RuntimeError(f"benchmark worker sent {ready!r} instead of ready")
        self.pid = int(ready[1])

    def send(self, message: Any) -> None:
        send(self._write, message)

    def receive(self, timeout: float | None) -> Any:
        return receive(self._read, timeout)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def death(self) -> str:
        """Why the worker ended, e.g. 'killed by SIGSEGV' or 'exited with status 3'."""
        code = self.proc.wait()
        if code < 0:
            try:
                return f"killed by {signal.Signals(-code).name}"
            except ValueError:
                return f"killed by signal {-code}"
        return f"exited with status {code}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


_workers: dict[str, WorkerProcess] = {}
_lock = threading.Lock()


def _worker(device: str = "cpu") -> WorkerProcess:
    worker = _workers.get(device)
    if worker is None or not worker.alive():
        worker = _workers[device] = WorkerProcess()
    return worker


def _discard(device: str = "cpu") -> None:
    worker = _workers.pop(device, None)
    if worker is not None:
        worker.kill()


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


def _settings_snapshot() -> dict[str, Any]:
    return dict(config.save()["settings"])


def run_isolated(job: TrialJob, choices: Sequence[Choice], reference: Choice | None,
                 on_record: Callable[[Record], None]) -> tuple[float, float]:
    """Run the trials of `choices` in the worker; returns (verify seconds, benchmark seconds)."""
    timeout = float(config.get("autotune.bench_timeout_s"))
    remaining = list(choices)
    verify_s = bench_s = 0.0
    with _lock:
        try:
            stalls = 0
            while remaining:
                if stalls >= 3:  # the worker keeps dying without finishing anything: stop trying
                    for choice in remaining:
                        on_record(make_record(job, choice, "crash", error="the benchmark worker died repeatedly"))
                    break
                before = len(remaining)
                worker = _worker()
                worker.send(("job", job, remaining, reference, _settings_snapshot()))
                current: int | None = None
                resume_at: int | None = None  # set once the reference has run: where a new worker resumes
                try:
                    while True:
                        event = worker.receive(timeout)
                        if event[0] == "ref":
                            resume_at = 0
                        elif event[0] == "start":
                            current = event[1]
                        elif event[0] == "result":
                            on_record(event[2])
                            current, resume_at = None, event[1] + 1
                        elif event[0] == "confirmed":  # a near tie re-timed: replaces an earlier record
                            on_record(event[2])
                        elif event[0] == "done":
                            verify_s += event[1]
                            bench_s += event[2]
                            remaining = []
                            break
                        elif event[0] == "error":
                            raise RuntimeError(f"benchmark worker failed: {event[1]}")
                except ChannelClosed:
                    reason = worker.death()
                    _discard()
                    remaining = _after_failure(job, remaining, current, resume_at, "crash",
                                               f"the benchmark worker was {reason} while running it", on_record)
                except ChannelTimeout:
                    _discard()
                    remaining = _after_failure(job, remaining, current, resume_at, "timeout",
                                               f"still running after {timeout:g} s (autotune.bench_timeout_s); "
                                               "the worker was killed", on_record)
                stalls = stalls + 1 if remaining and len(remaining) == before else 0
        except BaseException:
            _discard()  # interrupted or broken mid-job: never leave a worker running a kernel
            raise
    return verify_s, bench_s


def _after_failure(job: TrialJob, remaining: list[Choice], current: int | None, resume_at: int | None,
                   status: str, reason: str, on_record: Callable[[Record], None]) -> list[Choice]:
    """Record the choice that was running and return the choices a fresh worker must still try."""
    if current is None:
        if resume_at is not None:  # died between two choices: nobody to blame, go on
            return remaining[resume_at:]
        for choice in remaining:  # the reference itself failed: nothing can be verified in isolation
            on_record(make_record(job, choice, status, error=f"the reference failed in the worker: {reason}"))
        return []
    choice = remaining[current]
    log.warning("%s: %s (%s)", choice.name, status, reason)
    on_record(make_record(job, choice, status, error=reason))
    return remaining[current + 1:]
