"""What the build pool keeps for one build in flight, and the small helpers around it."""

from __future__ import annotations

import contextlib
from concurrent.futures import Future, InvalidStateError, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from tuneforge.compile.cpp import CppBuild
from tuneforge.compile.pool_worker import BuildResult


@dataclass(eq=False)
class Task:
    """One distinct build in flight.  Mutable fields are guarded by the pool's lock."""

    key: str
    label: str
    build: CppBuild
    settings: dict[str, Any]
    limit_s: float  # compile_timeout_s + TIMEOUT_GRACE_S
    future: Future[BuildResult]
    run: int = 0  # id of the current submission to an executor (a resubmitted task gets a new one)
    executor: ProcessPoolExecutor | None = None  # where the current submission went
    pid: int | None = None  # the worker running it, once it has reported in
    started: float | None = None  # time.time() when that worker started it
    timed_out: bool = False
    kill_sent: float | None = None
    resubmits: int = 0


def resolve(future: Future[BuildResult], outcome: BuildResult | BaseException) -> None:
    """Complete `future` unless the user cancelled it meanwhile."""
    with contextlib.suppress(InvalidStateError):
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
