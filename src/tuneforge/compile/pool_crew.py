"""The worker processes of a build pool and the one thread that feeds and watches them.

Each worker has a pipe of its own and runs one task at a time, so the crew always knows which task
a worker holds; the worker announces when it starts it (deadlines count from then).  The thread
waits on every pipe and every worker's exit at once:

- ``("done", run, outcome)`` completes that task;
- a worker that ends fails the task it had started, in words ("killed by SIGKILL"), or, when it
  timed out, with the time-out; a task handed to a worker that died before starting it goes to
  another worker (a few times: then the start-up failure is the task's error);
- a task past its deadline gets its worker stopped: SIGTERM (the worker kills its compiler), then
  SIGKILL for the worker and what it started.

Workers are started by this long-lived thread only: their parent-death signal fires when the
*thread* that started them ends, so a caller's short-lived thread must never start one.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.connection import wait as wait_ready
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess

from tuneforge.compile.pool_task import Task
from tuneforge.compile.pool_worker import BuildResult, serve
from tuneforge.dataclass_lite import dataclass
from tuneforge.errors import CompileError
from tuneforge.forksafe import forking_worker
from tuneforge.supervisor import STOP_GRACE_S, Supervised, interrupts_held, kill_children, stop_all

log = logging.getLogger("tuneforge.compile")

TICK_S = 0.2  # how often the thread looks for tasks past their deadline while any runs
START_ATTEMPTS = 3  # workers that may die before starting a task, before it fails

Finish = Callable[[Task, BuildResult | BaseException], None]


def pool_error(message: str) -> CompileError:
    """A build's failure that is the pool's to tell (no compiler command or output to show)."""
    return CompileError(message, command=[], stderr="", source_path=None)


@dataclass(eq=False)
class _Slot:
    """One worker process, the crew's end of its pipe, and the task it holds."""

    process: BaseProcess
    worker: Supervised
    conn: Connection
    task: Task | None = None


class Crew:
    """`workers` worker processes of one pool generation, started on first need; see the module."""

    def __init__(self, workers: int, context: BaseContext, finish: Finish) -> None:
        self.workers = workers
        self._context = context
        self._finish = finish
        # A forkserver starts workers from its own process: they cannot check that we are their parent.
        self._parent = None if context.get_start_method() == "forkserver" else os.getpid()
        self._lock = threading.Lock()
        self._pending: collections.deque[Task] = collections.deque()
        self._slots: list[_Slot] = []
        self._failed_starts: dict[int, int] = {}  # run -> workers that died holding it unstarted
        self._stopping = False
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)
        self._thread = threading.Thread(target=self._loop, name="tuneforge-build-pool", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------ for the pool's threads

    def put(self, task: Task) -> None:
        with self._lock:
            if self._stopping:
                raise RuntimeError("this build pool crew is stopped")
            self._pending.append(task)
        self._wake()

    def tasks(self) -> list[Task]:
        """The tasks queued or held by a worker."""
        with self._lock:
            return [*(s.task for s in self._slots if s.task is not None), *self._pending]

    def pids(self) -> list[int]:
        with self._lock:
            return sorted(s.worker.pid for s in self._slots)

    def running(self) -> dict[str, int]:
        """label -> pid of the worker, for the tasks that workers have started."""
        with self._lock:
            return {s.task.label: s.worker.pid for s in self._slots
                    if s.task is not None and s.task.started is not None}

    def stop(self) -> list[Task]:
        """Stop the thread and the workers (and their compilers); returns the tasks left unfinished."""
        with self._lock:
            if self._stopping:
                return []
            self._stopping = True
            slots, self._slots = self._slots, []
            left = [*(s.task for s in slots if s.task is not None), *self._pending]
            self._pending.clear()
        self._wake()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        stop_all(slot.worker for slot in slots)
        for slot in slots:
            slot.conn.close()
        if not self._thread.is_alive():
            os.close(self._wake_read)
            os.close(self._wake_write)
        return left

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # full (a wake-up is pending anyway) or closed (stopped)
            os.write(self._wake_write, b"!")

    # ------------------------------------------------------------------------------------ the thread

    def _loop(self) -> None:
        while True:
            done: list[tuple[Task, BuildResult | BaseException]] = []
            with self._lock:
                if self._stopping:
                    return
                try:
                    self._assign(done)
                except Exception:  # e.g. no process can be started: fail what waits, never the thread
                    log.exception("build pool: cannot start a worker process")
                    done.extend((task, pool_error(f"C++ build {task.label}: cannot start build worker processes "
                                                  "(see the log)")) for task in self._pending)
                    self._pending.clear()
                ready_on: list[Connection | int] = [self._wake_read, *(s.conn for s in self._slots),
                                                    *(s.process.sentinel for s in self._slots)]
                busy = any(s.task is not None for s in self._slots)
            self._complete(done)
            ready = set(wait_ready(ready_on, timeout=TICK_S if busy else None))
            if self._wake_read in ready:
                os.read(self._wake_read, 4096)
            with self._lock:
                if self._stopped():
                    return
                for slot in list(self._slots):
                    if slot.conn in ready or slot.process.sentinel in ready:
                        self._service(slot, done)
                self._check_deadlines()
            self._complete(done)

    def _stopped(self) -> bool:
        return self._stopping

    def _complete(self, done: list[tuple[Task, BuildResult | BaseException]]) -> None:
        """Hand results over outside the lock: Future callbacks may run anything, even a shutdown."""
        for task, outcome in done:
            try:
                self._finish(task, outcome)
            except Exception:
                log.exception("build pool: completing %s failed", task.label)
        done.clear()

    def _assign(self, done: list[tuple[Task, BuildResult | BaseException]]) -> None:
        """Hand queued tasks to idle workers, starting workers while fewer than `workers` run."""
        while self._pending:
            task = self._pending[0]
            if task.future.done():  # cancelled while queued
                self._pending.popleft()
                continue
            slot = next((s for s in self._slots if s.task is None), None)
            if slot is None:
                if len(self._slots) >= self.workers:
                    return
                # All missing workers at once: with the fork start method, each fork copies every fd
                # open at that moment, such as the pipe another thread's subprocess waits on for its
                # exec; forking once, early, rather than now and then keeps that window small.
                while len(self._slots) < self.workers:
                    self._start_worker()
                slot = next(s for s in self._slots if s.task is None)
            self._pending.popleft()
            slot.task, task.pid, task.handed, task.started = task, slot.worker.pid, time.monotonic(), None
            try:
                slot.conn.send((task.run, task.build, task.settings))
            except (OSError, ValueError):  # the worker is gone already: _service buries it
                pass
            except Exception as exc:  # the task cannot be sent (pickling): its own failure
                slot.task = None
                done.append((task, pool_error(f"C++ build {task.label}: cannot be sent to a worker: {exc}")))

    def _start_worker(self) -> None:
        mine, theirs = self._context.Pipe()
        # typeshed declares Process on the concrete contexts only, which get_context(name) does not name
        make: type[BaseProcess] = self._context.Process  # type: ignore[attr-defined]
        process = make(target=serve, args=(theirs, self._parent), daemon=True, name="tuneforge-build-worker")
        with interrupts_held(), forking_worker():
            process.start()
        theirs.close()
        self._slots.append(_Slot(process, Supervised(process), mine))

    def _service(self, slot: _Slot, done: list[tuple[Task, BuildResult | BaseException]]) -> None:
        """Read what `slot`'s worker said; bury it if it ended."""
        ended = False
        try:
            while slot.conn.poll(0):
                message = slot.conn.recv()
                task = slot.task
                if task is None or message[1] != task.run:
                    continue  # an answer for a task that is no longer its (cannot happen; be safe)
                if message[0] == "started":
                    task.started = time.monotonic()
                elif message[0] == "done":
                    slot.task = None
                    done.append((task, message[2]))
        except (EOFError, OSError):
            ended = True
        except Exception as exc:  # an answer this process cannot unpickle: that task's failure
            if slot.task is not None:
                done.append((slot.task, pool_error(f"C++ build {slot.task.label}: its result cannot be read: "
                                                   f"{type(exc).__name__}: {exc}")))
                slot.task = None
        if ended or slot.process.sentinel in wait_ready([slot.process.sentinel], timeout=0):
            self._bury(slot, done)

    def _bury(self, slot: _Slot, done: list[tuple[Task, BuildResult | BaseException]]) -> None:
        """A worker ended: fail the task it had started, hand an unstarted one to another worker."""
        self._slots.remove(slot)
        slot.conn.close()
        task, death = slot.task, slot.worker.death(timeout=1.0)
        if task is None:
            if not self._stopping:
                log.warning("build pool: an idle worker process (pid %d) ended (%s)", slot.worker.pid, death)
            return
        if task.timed_out:
            message = (f"C++ build {task.label} timed out: no result after {task.limit_s:g} s "
                       "(setting compile_timeout_s + the pool's grace); its worker process was killed")
        elif task.started is not None:
            message = (f"C++ build {task.label}: its worker process (pid {slot.worker.pid}) died ({death}) "
                       "during the build")
        else:
            failures = self._failed_starts[task.run] = self._failed_starts.get(task.run, 0) + 1
            if failures < START_ATTEMPTS:
                task.pid = None
                self._pending.appendleft(task)
                return
            message = (f"C++ build {task.label}: {failures} build worker processes died before they could start "
                       f"it (the last {death})")
        self._failed_starts.pop(task.run, None)
        done.append((task, pool_error(message)))

    def _check_deadlines(self) -> None:
        """Stop the worker of a task past its limit: SIGTERM, then after STOP_GRACE_S SIGKILL."""
        now = time.monotonic()
        for slot in self._slots:
            task = slot.task
            if task is None:
                continue
            since = task.started if task.started is not None else task.handed  # a worker stuck starting too
            if task.kill_sent is None and now - since > task.limit_s:
                task.timed_out, task.kill_sent = True, now
                log.warning("C++ build %s: no result after %g s; killing its worker (pid %d)",
                            task.label, task.limit_s, slot.worker.pid)
                slot.worker.signal(signal.SIGTERM)
            elif task.kill_sent is not None and now - task.kill_sent > STOP_GRACE_S:
                task.kill_sent = float("inf")
                kill_children(slot.worker.pid)
                slot.worker.signal(signal.SIGKILL)
