"""What the build pool keeps for one build in flight, and the small helpers around it."""

from __future__ import annotations

import contextlib
from concurrent.futures import Future, InvalidStateError
from typing import Any

from tuneforge.compile.pool_worker import BuildResult
from tuneforge.dataclass_lite import dataclass


@dataclass(eq=False)
class Task:
    """One distinct build in flight.  Mutable fields are guarded by the pool's lock."""

    key: str
    label: str
    build: object  # a build of a registered kind (builders.py), e.g. a CppBuild
    settings: dict[str, Any]
    limit_s: float  # compile_timeout_s + TIMEOUT_GRACE_S
    future: Future[BuildResult]
    run: int  # id of this task in the pool and its workers' messages
    pid: int | None = None  # the worker it was handed to
    handed: float = 0.0  # time.monotonic() when it was handed to that worker
    started: float | None = None  # time.monotonic() when that worker said it started it
    timed_out: bool = False
    kill_sent: float | None = None  # time.monotonic() when its worker was told to stop


def resolve(future: Future[BuildResult], outcome: BuildResult | BaseException) -> None:
    """Complete `future` unless the user cancelled it meanwhile."""
    with contextlib.suppress(InvalidStateError):
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
