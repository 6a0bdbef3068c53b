"""Parallel C++ builds in worker processes: futures, de-duplication by artifact key, time-outs, crashes.

    pool = default_pool()                          # one per process, `compile_threads` workers
    future = pool.submit(CppBuild(source))         # Future[BuildResult]
    results = pool.build_all([("a", build_a), ("b", build_b)])   # label -> BuildResult or exception

Each task is ``cpp.build()`` in a worker process, under a snapshot of the submitting process's
settings taken at ``submit()``.  Builds are de-duplicated by their artifact key (computed in the
submitting process): submitting a key that is pending or built returns the same Future; a failed one
is forgotten so that a later submit retries.  Across processes the store's per-key lock makes sure a
key is compiled once.

Failures stay with their own build: a compile error or a compile time-out (``compile_timeout_s``,
the compiler's whole process group is killed) fails that Future with a `CompileError`.  The pool
also waits at most ``compile_timeout_s + 30`` s for a task and then kills its worker; a worker that
dies (crash, OOM killer) fails only the build it was running: the other builds of the broken
executor are submitted again to a fresh one.

Workers are started on the first submit and reused.  They ignore Ctrl-C (the submitting process
decides), stop with the process that started them (Linux: ``PR_SET_PDEATHSIG``), and kill their
compiler before they exit.  ``shutdown()`` runs at interpreter exit and when ``build_all`` is
interrupted.

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
import queue
import shutil
import tempfile
import threading
import time
import weakref
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, CancelledError, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from multiprocessing.connection import wait as mp_wait
from types import TracebackType
from typing import Any

from tuneforge import config
from tuneforge.compile import cpp
from tuneforge.compile.cpp import CppBuild
from tuneforge.compile.pool_task import Task, resolve
from tuneforge.compile.pool_worker import (
    KILL_GRACE_S,
    BuildResult,
    executor_processes,
    init_worker,
    read_status,
    run_task,
    stop_executor,
)
from tuneforge.compile.progress import progress_bar, progress_wanted
from tuneforge.errors import CompileError
from tuneforge.supervisor import describe_exit, kill_children, settings_snapshot

__all__ = ["START_METHODS", "BuildPool", "BuildResult", "default_pool"]

log = logging.getLogger("tuneforge.compile")

START_METHODS = ("fork", "spawn", "forkserver")
TIMEOUT_GRACE_S = 30.0  # the pool waits compile_timeout_s + this for one task, then kills its worker
_TICK_S = 0.2  # how often the dispatcher looks for tasks past their deadline
_MAX_RESUBMITS = 3  # times a task goes back in the queue because another worker's death broke the pool


_pools: weakref.WeakSet[BuildPool] = weakref.WeakSet()


class BuildPool:
    """Builds `CppBuild`s in worker processes; see the module documentation."""

    def __init__(self, workers: int | None = None, *, start_method: str | None = None) -> None:
        if start_method is not None:
            if start_method not in START_METHODS:
                raise ValueError(f"unknown start method {start_method!r}; use one of {', '.join(START_METHODS)} "
                                 "or None for the platform's default")
            if start_method not in multiprocessing.get_all_start_methods():
                raise ValueError(f"start method {start_method!r} is not available on this platform")
        count = config.get("compile_threads") if workers is None else workers
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise ValueError(f"workers must be a positive integer, got {count!r}")
        self.workers: int = count
        self.start_method = start_method
        self._owner_pid = os.getpid()
        self._lock = threading.RLock()
        self._memo: dict[tuple[str, str], Future[BuildResult]] = {}
        self._tasks: dict[int, Task] = {}  # run id -> task
        self._runs = itertools.count(1)
        self._executor: ProcessPoolExecutor | None = None
        self._retired: list[ProcessPoolExecutor] = []  # broken ones, to be shut down
        self._queue: queue.SimpleQueue[Task | None] | None = None
        self._dispatcher: threading.Thread | None = None
        self._status_dir: str | None = None
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
            return self._executor is not None or bool(self._tasks)

    # ------------------------------------------------------------------------------------ submitting

    def submit(self, build: CppBuild, *, label: str = "") -> Future[BuildResult]:
        """Build `build` in a worker; the same artifact key pending or built returns the same Future."""
        if not isinstance(build, CppBuild):
            raise TypeError(f"submit() takes a CppBuild, not {type(build).__name__}")
        if os.getpid() != self._owner_pid:
            raise RuntimeError("this BuildPool belongs to the parent process of a fork; "
                               "create a new one (default_pool() does)")
        try:
            key, _ = cpp.artifact_key(build)
            settings = settings_snapshot()
            limit = float(config.get("compile_timeout_s")) + TIMEOUT_GRACE_S
            memo_key = (key, str(config.get("cache_dir")))
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
            self._tasks[task.run] = task
            self._dispatch_queue().put(task)
        future.add_done_callback(functools.partial(self._on_future_done, memo_key, task))
        return future

    def build_all(self, builds: Sequence[tuple[str, CppBuild]], *,
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
        if os.getpid() != self._owner_pid:
            return  # a forked child never touches its parent's workers
        if not cancel:
            self._wait_idle()
        with self._lock:
            tasks = list(self._tasks.values())
            self._tasks.clear()
            executors = [e for e in (self._executor, *self._retired) if e is not None]
            self._executor, self._retired = None, []
            work_queue, self._queue = self._queue, None
            dispatcher, self._dispatcher = self._dispatcher, None
            status_dir, self._status_dir = self._status_dir, None
        if work_queue is not None:
            work_queue.put(None)
        for task in tasks:
            task.future.cancel()  # _on_future_done wakes wait() / as_completed() on it
        for executor in executors:
            stop_executor(executor)
        if dispatcher is not None and dispatcher is not threading.current_thread():
            dispatcher.join(timeout=5)
        if status_dir is not None:
            shutil.rmtree(status_dir, ignore_errors=True)

    def _wait_idle(self) -> None:
        while True:
            with self._lock:
                futures = [t.future for t in self._tasks.values()]
            if not futures:
                return
            wait(futures)

    # ----------------------------------------------------------------------------------- internals

    def _is_stale(self, future: Future[BuildResult]) -> bool:
        """A finished Future whose library has since left the store (evicted, removed)."""
        if not future.done() or future.cancelled() or future.exception() is not None:
            return future.done()
        return not os.path.exists(future.result().library_path)

    def _on_future_done(self, memo_key: tuple[str, str], task: Task, future: Future[BuildResult]) -> None:
        if future.cancelled():
            future.set_running_or_notify_cancel()  # a user's cancel(): wake wait() / as_completed()
        if future.cancelled() or future.exception() is not None:
            with self._lock:  # forget failures, so that a later submit tries again
                if self._memo.get(memo_key) is future:
                    del self._memo[memo_key]
                if self._tasks.get(task.run) is task and future.cancelled():
                    del self._tasks[task.run]

    def _dispatch_queue(self) -> queue.SimpleQueue[Task | None]:
        """The queue of the dispatcher thread, which is started if needed (call with the lock held).

        One long-lived thread starts every worker: the parent-death signal of a worker fires when the
        *thread* that started it ends, so workers must not be started by a caller's short-lived thread.
        """
        if self._queue is None or self._dispatcher is None:
            self._queue = queue.SimpleQueue()
            self._dispatcher = threading.Thread(target=self._dispatch_loop, args=(self._queue,),
                                                name="tuneforge-build-pool", daemon=True)
            self._dispatcher.start()
        return self._queue

    def _dispatch_loop(self, work: queue.SimpleQueue[Task | None]) -> None:
        while True:
            with self._lock:
                busy = bool(self._tasks)
            try:
                task = work.get(timeout=_TICK_S if busy else None)  # idle: sleep until work arrives
            except queue.Empty:
                task = None
            else:
                if task is None:
                    return  # shut down
            try:
                if task is not None:
                    self._start(task)
                self._check_deadlines()
            except Exception:  # never let the dispatcher die: every Future must complete
                log.exception("build pool dispatcher error")
                if task is not None:
                    self._finish(task, task.executor, CompileError(
                        f"C++ build {task.label}: the build pool could not run it (see the log)",
                        command=[], stderr="", source_path=None))

    def _current_executor(self) -> ProcessPoolExecutor:
        """The live executor, created on first use (call with the lock held, from the dispatcher)."""
        for old in self._retired:
            old.shutdown(wait=False)
        self._retired.clear()
        if self._executor is None:
            if self._status_dir is None:
                self._status_dir = tempfile.mkdtemp(prefix="tuneforge-pool-")
            context = multiprocessing.get_context(self.start_method)
            parent = None if context.get_start_method() == "forkserver" else os.getpid()
            self._executor = ProcessPoolExecutor(self.workers, mp_context=context, initializer=init_worker,
                                                 initargs=(parent, self._status_dir))
        return self._executor

    def _start(self, task: Task) -> None:
        """Submit `task` to the executor (from the dispatcher thread)."""
        for _ in range(2):
            with self._lock:  # held while submitting, so that shutdown() sees every worker started
                if self._tasks.get(task.run) is not task or task.future.done():
                    return
                executor = self._current_executor()
                task.executor, task.pid, task.started = executor, None, None
                try:
                    running = executor.submit(run_task, task.run, task.build, task.settings)
                except (BrokenProcessPool, RuntimeError):  # broke just now: retire it and retry once
                    if self._executor is executor:
                        self._executor = None
                        self._retired.append(executor)
                    continue
            running.add_done_callback(functools.partial(self._on_run_done, task, executor))
            return
        self._finish(task, task.executor, CompileError(
            f"C++ build {task.label}: cannot start build worker processes", command=[], stderr="", source_path=None))

    def _on_run_done(self, task: Task, executor: ProcessPoolExecutor, running: Future[BuildResult]) -> None:
        """Done callback of an executor future (in the executor's thread or the dispatcher)."""
        try:
            outcome: BuildResult | BaseException = running.result()
        except BrokenProcessPool as exc:
            self._on_broken(task, executor, exc)
            return
        except CancelledError:
            self._requeue(task, executor)  # the executor dropped it: run it on the next one
            return
        except BaseException as exc:
            outcome = exc
        if isinstance(outcome, BuildResult) and outcome.key != task.key:
            log.warning("C++ build %s: the worker computed key %s, the parent %s (settings differ?)",
                        task.label, outcome.key, task.key)
        self._finish(task, executor, outcome)

    def _finish(self, task: Task, executor: ProcessPoolExecutor | None, outcome: BuildResult | BaseException) -> None:
        with self._lock:
            if self._tasks.get(task.run) is not task or task.executor is not executor:
                return  # already dealt with (shut down, resubmitted)
            del self._tasks[task.run]
        resolve(task.future, outcome)

    def _requeue(self, task: Task, executor: ProcessPoolExecutor) -> None:
        with self._lock:
            if self._tasks.get(task.run) is not task or task.executor is not executor or self._queue is None:
                return
            del self._tasks[task.run]
            task.run, task.executor, task.pid, task.started = next(self._runs), None, None, None
            task.timed_out, task.kill_sent = False, None
            self._tasks[task.run] = task
            self._queue.put(task)

    def _on_broken(self, task: Task, executor: ProcessPoolExecutor, exc: BrokenProcessPool) -> None:
        """A worker died: fail the build it was running, resubmit the others of that executor."""
        with self._lock:
            if self._tasks.get(task.run) is not task or task.executor is not executor:
                return
            if self._executor is executor:
                self._executor = None  # the next submit gets a fresh one
                self._retired.append(executor)
            if task.pid is None and self._status_dir is not None:
                task.pid, task.started = read_status(self._status_dir).get(task.run, (None, None))
            # Futures are failed before the executor terminates the surviving workers, so the worker
            # that ran this build has ended now only if it is one that broke the pool.
            process = executor_processes(executor).get(task.pid) if task.pid is not None else None
            dead = process is not None and bool(mp_wait([process.sentinel], timeout=0))
            code = None
            if process is not None and dead:
                process.join(1.0)
                code = process.exitcode
            if not dead and not task.timed_out and task.resubmits < _MAX_RESUBMITS:
                task.resubmits += 1
                requeue = True
            else:
                requeue = False
                error = self._broken_error(task, dead, code, exc)
                if self._status_dir is not None and task.pid is not None:
                    with contextlib.suppress(OSError):
                        os.unlink(os.path.join(self._status_dir, str(task.pid)))
        if requeue:
            self._requeue(task, executor)
        else:
            error.__cause__ = exc
            self._finish(task, executor, error)

    def _broken_error(self, task: Task, dead: bool, code: int | None, exc: BrokenProcessPool) -> CompileError:
        if task.timed_out:
            message = (f"C++ build {task.label} timed out: no result after {task.limit_s:g} s "
                       f"(setting compile_timeout_s + {TIMEOUT_GRACE_S:g} s); its worker process was killed")
        elif dead:
            message = (f"C++ build {task.label}: its worker process (pid {task.pid}) died "
                       f"({describe_exit(code)}) during the build")
        else:
            message = (f"C++ build {task.label}: build worker processes died {task.resubmits + 1} times "
                       f"while it was queued or running ({exc})")
        return CompileError(message, command=[], stderr="", source_path=None)

    def _check_deadlines(self) -> None:
        """Kill the worker of a build that is past compile_timeout_s + grace (from the dispatcher)."""
        with self._lock:
            running = [t for t in self._tasks.values() if t.executor is not None]
            status_dir = self._status_dir
        if not running or status_dir is None:
            return
        status = read_status(status_dir)
        now = time.time()
        for task in running:
            with self._lock:
                if self._tasks.get(task.run) is not task or task.executor is None:
                    continue
                if task.pid is None and task.run in status:
                    task.pid, task.started = status[task.run]
                if task.pid is None or task.started is None:
                    continue
                process = executor_processes(task.executor).get(task.pid)
                if process is None or process.exitcode is not None:
                    continue
                if task.kill_sent is None and now - task.started > task.limit_s:
                    task.timed_out, task.kill_sent = True, now
                    log.warning("C++ build %s: no result after %g s; killing its worker (pid %d)",
                                task.label, task.limit_s, task.pid)
                    process.terminate()
                elif task.kill_sent is not None and now - task.kill_sent > KILL_GRACE_S:
                    task.kill_sent = float("inf")
                    kill_children(task.pid)
                    process.kill()

    def _worker_pids(self) -> list[int]:
        """Pids of the current worker processes (for tests and diagnostics)."""
        with self._lock:
            return sorted(executor_processes(self._executor)) if self._executor is not None else []

    def _running_pids(self) -> dict[str, int]:
        """label -> pid of the worker running it, for the builds that workers have started."""
        with self._lock:
            status = read_status(self._status_dir) if self._status_dir is not None else {}
            return {t.label: status[run][0] for run, t in self._tasks.items() if run in status}


# ------------------------------------------------------------------------------------- default pool

_default: BuildPool | None = None
_default_lock = threading.Lock()


def default_pool() -> BuildPool:
    """The process's pool with `compile_threads` workers; a new one after that setting changes or a fork."""
    global _default
    workers = config.get("compile_threads")
    with _default_lock:
        pool = _default
        if pool is not None and pool._owner_pid == os.getpid() and pool.workers == workers:
            return pool
        if pool is not None and pool._owner_pid == os.getpid():
            # Settings changed: the old pool finishes what it was given, then stops.
            threading.Thread(target=pool.shutdown, kwargs={"cancel": False}, daemon=True,
                             name="tuneforge-build-pool-retire").start()
        _default = BuildPool(workers)
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
