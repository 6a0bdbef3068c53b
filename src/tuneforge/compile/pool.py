"""Parallel C++ builds in worker processes: futures, de-duplication by artifact key, time-outs, crashes.

    pool = default_pool()                          # one per process, `compile_threads` workers
    future = pool.submit(CppBuild(source))         # Future[BuildResult]
    results = pool.build_all([("a", build_a), ("b", build_b)])   # label -> BuildResult or exception

Each task is one build in a worker process (``cpp.build()`` for a `CppBuild`; other kinds register
in builders.py), under a snapshot of the submitting process's settings taken at ``submit()``.
Builds are de-duplicated by their artifact key (computed in the submitting process): submitting a
key that is pending or built returns the same Future; a failed one is forgotten so that a later
submit retries.  Across processes the store's per-key lock makes sure a key is compiled once.

Failures stay with their own build: a compile error or a compile time-out (``compile_timeout_s``,
the compiler's whole process group is killed) fails that Future with a `CompileError`.  The pool
also waits at most ``compile_timeout_s + 30`` s for a task and then kills its worker; a worker that
dies (crash, OOM killer) fails only the build it was running, naming how it died.

Workers (see pool_crew.py) are started on the first submit and reused.  They ignore Ctrl-C (the
submitting process decides), stop with the process that started them (Linux: ``PR_SET_PDEATHSIG``),
and kill their compiler before they exit.  ``shutdown()`` runs at interpreter exit and when
``build_all`` is interrupted.

With the ``spawn`` or ``forkserver`` start method, worker processes import the program's main module
(as with any use of multiprocessing), so a script that builds in parallel needs the usual guard::

    if __name__ == "__main__":
        main()
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import itertools
import logging
import multiprocessing
import os
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, CancelledError, Future, wait
from types import TracebackType
from typing import Any

from tuneforge import config
from tuneforge.compile import cpp  # noqa: F401  (registers CppBuild with the builders)
from tuneforge.compile.builders import builder_for
from tuneforge.compile.pool_crew import Crew
from tuneforge.compile.pool_task import Task, resolve
from tuneforge.compile.pool_worker import BuildResult
from tuneforge.compile.progress import progress_bar, progress_wanted
from tuneforge.supervisor import settings_snapshot

__all__ = ["START_METHODS", "BuildPool", "BuildResult", "default_pool"]

log = logging.getLogger("tuneforge.compile")

START_METHODS = ("fork", "spawn", "forkserver")
TIMEOUT_GRACE_S = 30.0  # the pool waits compile_timeout_s + this for one task, then kills its worker


_pools: weakref.WeakSet[BuildPool] = weakref.WeakSet()


class BuildPool:
    """Runs builds (`CppBuild` and the other kinds of builders.py) in worker processes; see the module."""

    def __init__(self, workers: int | None = None, *, start_method: str | None = None) -> None:
        if start_method is not None:
            if start_method not in START_METHODS:
                raise ValueError(f"unknown start method {start_method!r}; use one of {', '.join(START_METHODS)} "
                                 "or None for the platform's default")
            if start_method not in multiprocessing.get_all_start_methods():
                raise ValueError(f"start method {start_method!r} is not available on this platform")
        count = config.get_int("compile_threads") if workers is None else workers
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"workers must be a positive integer, got {count!r}")
        self.workers: int = count
        self.start_method = start_method
        self._owner_pid = os.getpid()
        self._lock = threading.RLock()
        self._memo: dict[tuple[str, str], Future[BuildResult]] = {}
        self._runs = itertools.count(1)
        self._crew: Crew | None = None
        _pools.add(self)

    def __repr__(self) -> str:
        return f"BuildPool(workers={self.workers}, start_method={self.start_method!r}, started={self.started})"

    def __enter__(self) -> BuildPool:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.shutdown(cancel=exc is not None)

    @property
    def started(self) -> bool:
        """Whether worker processes are running (or being started) for this pool."""
        with self._lock:
            return self._crew is not None

    def owned_here(self) -> bool:
        """Whether this process made the pool (a forked child must make its own)."""
        return os.getpid() == self._owner_pid

    def worker_pids(self) -> list[int]:
        """Pids of the worker processes (for diagnostics and tests)."""
        with self._lock:
            return self._crew.pids() if self._crew is not None else []

    def running(self) -> dict[str, int]:
        """label -> pid of the worker running it, for the builds that workers have started."""
        with self._lock:
            return self._crew.running() if self._crew is not None else {}

    # ------------------------------------------------------------------------------------ submitting

    def submit(self, build: object, *, label: str = "") -> Future[BuildResult]:
        """Build `build` (a `CppBuild`, or a build of another kind in builders.py) in a worker; the same
        artifact key pending or built returns the same Future."""
        builder = builder_for(build)  # TypeError for anything else
        if not self.owned_here():
            raise RuntimeError("this BuildPool belongs to the parent process of a fork; "
                               "create a new one (default_pool() does)")
        try:
            key = builder.key(build)
            settings = settings_snapshot()
            limit = config.get_float("compile_timeout_s") + TIMEOUT_GRACE_S
            memo_key = (key, str(config.get_path("cache_dir")))
        except Exception as exc:  # e.g. a missing include directory: this build's own failure
            failed: Future[BuildResult] = Future()
            failed.set_exception(exc)
            return failed
        with self._lock:
            future = self._memo.get(memo_key)
            if future is not None and not self._is_stale(future):
                return future
            future = Future()
            task = Task(key=key, label=label or key, build=build, settings=settings, limit_s=limit,
                        future=future, run=next(self._runs))
            self._memo[memo_key] = future
            if self._crew is None:
                self._crew = Crew(self.workers, multiprocessing.get_context(self.start_method), self._finish)
            self._crew.put(task)
        future.add_done_callback(functools.partial(self._on_future_done, memo_key))
        return future

    def build_all(self, builds: Sequence[tuple[str, object]], *,
                  progress: bool | None = None) -> dict[str, BuildResult | BaseException]:
        """Build everything in parallel and wait: label -> result, or the exception of that build.

        A progress bar goes to stderr when `progress` is True, or when it is None, stderr is a terminal
        and the setting ``compile.progress`` is on; otherwise nothing is written anywhere.
        """
        labels = [label for label, _ in builds]
        if len(set(labels)) != len(labels):
            duplicates = sorted({label for label in labels if labels.count(label) > 1})
            raise ValueError(f"build_all: duplicate labels {duplicates}")
        try:
            futures = {label: self.submit(build, label=label) for label, build in builds}
        except KeyboardInterrupt:
            self.shutdown(cancel=True)
            raise
        self.wait(list(futures.values()), progress=progress)
        results: dict[str, BuildResult | BaseException] = {}
        for label, future in futures.items():
            if future.cancelled():
                results[label] = CancelledError(f"build {label} was cancelled")
            else:
                error = future.exception()
                results[label] = future.result() if error is None else error
        return results

    def wait(self, futures: Sequence[Future[Any]], *, progress: bool | None = None) -> None:
        """Wait for `futures` (a progress bar as in build_all); Ctrl-C stops the workers and re-raises."""
        show = progress if progress is not None else progress_wanted()
        try:
            with progress_bar(show, len(futures)) as advance:
                pending = set(futures)
                while pending:
                    _, pending = wait(pending, timeout=0.25, return_when=FIRST_COMPLETED)
                    advance(sum(f.done() for f in futures))
        except KeyboardInterrupt:
            self.shutdown(cancel=True)
            raise

    # ------------------------------------------------------------------------------------ stopping

    def shutdown(self, *, cancel: bool = True) -> None:
        """Stop the workers (and their compilers); idempotent.  A later submit starts new workers.

        ``cancel=True`` cancels the builds that are queued or running; ``cancel=False`` waits for them.
        """
        if not self.owned_here():
            return  # a forked child never touches its parent's workers
        if not cancel:
            self._wait_idle()
        with self._lock:
            crew, self._crew = self._crew, None
        if crew is None:
            return
        for task in crew.stop():
            task.future.cancel()  # _on_future_done wakes wait() / as_completed() on it

    def _wait_idle(self) -> None:
        while True:
            with self._lock:
                futures = [t.future for t in self._crew.tasks()] if self._crew is not None else []
            futures = [f for f in futures if not f.done()]
            if not futures:
                return
            wait(futures)

    # ----------------------------------------------------------------------------------- internals

    def _is_stale(self, future: Future[BuildResult]) -> bool:
        """A finished Future whose library has since left the store (evicted, removed)."""
        if not future.done() or future.cancelled() or future.exception() is not None:
            return future.done()
        return not os.path.exists(future.result().library_path)

    def _finish(self, task: Task, outcome: BuildResult | BaseException) -> None:
        """What the crew calls with each build's outcome (from its thread)."""
        if isinstance(outcome, BuildResult) and outcome.key != task.key:
            log.warning("C++ build %s: the worker computed key %s, the parent %s (settings differ?)",
                        task.label, outcome.key, task.key)
        resolve(task.future, outcome)

    def _on_future_done(self, memo_key: tuple[str, str], future: Future[BuildResult]) -> None:
        if future.cancelled():
            future.set_running_or_notify_cancel()  # a user's cancel(): wake wait() / as_completed()
        if future.cancelled() or future.exception() is not None:
            with self._lock:  # forget failures, so that a later submit tries again
                if self._memo.get(memo_key) is future:
                    del self._memo[memo_key]


# ------------------------------------------------------------------------------------- default pool

_default: BuildPool | None = None
_default_lock = threading.Lock()


def default_pool() -> BuildPool:
    """The process's pool with `compile_threads` workers started by `compile.start_method`; a new one after either
    setting changes or a fork."""
    global _default
    workers = config.get_int("compile_threads")
    method = config.get_str("compile.start_method")
    start_method = None if method == "default" else method
    with _default_lock:
        pool = _default
        if pool is not None and pool.owned_here() and pool.workers == workers and pool.start_method == start_method:
            return pool
        if pool is not None and pool.owned_here():
            # Settings changed: the old pool finishes what it was given, then stops.
            threading.Thread(target=pool.shutdown, kwargs={"cancel": False}, daemon=True,
                             name="tuneforge-build-pool-retire").start()
        _default = BuildPool(workers, start_method=start_method)
        return _default


def _after_fork_in_child() -> None:
    global _default, _default_lock
    _default = None
    _default_lock = threading.Lock()


def _shutdown_all() -> None:
    for pool in list(_pools):
        try:
            pool.shutdown(cancel=True)
        except Exception:  # at exit: never hide the program's own outcome
            log.debug("build pool shutdown failed", exc_info=True)


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_shutdown_all)
# concurrent.futures joins its executor threads (waiting for running builds) before atexit handlers
# run; stop the workers first so that the interpreter exits without waiting for compilers.
_register_threading_atexit = getattr(threading, "_register_atexit", None)
if _register_threading_atexit is not None:
    with contextlib.suppress(RuntimeError):
        _register_threading_atexit(_shutdown_all)
