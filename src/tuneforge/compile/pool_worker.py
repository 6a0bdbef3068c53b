"""The worker side of the build pool: one build per task (see builders.py), announced before it starts.

A worker reads tasks from its end of a pipe: ``(run, build, settings)``.  It answers ``("started",
run)`` as it begins (the pool counts the task's deadline from then, not from a slow worker start) and
``("done", run, BuildResult or exception)`` when it ends; ``None`` or a closed pipe ends the worker.
It ignores Ctrl-C (the submitting process decides), and on SIGTERM (also sent by the kernel when the
pool's dispatcher thread dies) kills its compiler's process group before exiting.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection
from types import FrameType
from typing import Any

from tuneforge import config
from tuneforge.compile.builders import builder_for
from tuneforge.dataclass_lite import dataclass
from tuneforge.supervisor import STOP_GRACE_S, applied_settings, die_with_parent, ignore_interrupts, kill_children

TERMINATED_EXIT = 128 + int(signal.SIGTERM)


@dataclass(frozen=True)
class BuildResult:
    key: str  # artifact key in the store
    path: str  # absolute path of the artifact's main file in the store (a C++ build's library)
    compiled: bool  # this build ran the compiler (False: found in the store)
    seconds: float  # time of the build in the worker

    @property
    def library_path(self) -> str:
        """A C++ build's library (or extension module): its `path`."""
        return self.path


_in_task = False
_terminating = False


class _Terminated(BaseException):
    """Raised in a worker's main thread by SIGTERM during a build, so that the compiler is killed."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    global _terminating
    _terminating = True
    if _in_task:
        raise _Terminated  # run_command kills the compiler's group, the store drops the staging dir
    os._exit(TERMINATED_EXIT)


def _on_unraisable(unraisable: Any) -> None:
    """SIGTERM's exception raised where Python can only report it (a weakref callback of the import
    system, a ``__del__``): it would be printed and lost, and the build would go on. End here instead."""
    if isinstance(unraisable.exc_value, _Terminated):
        kill_children(os.getpid())
        os._exit(TERMINATED_EXIT)
    sys.__unraisablehook__(unraisable)


def _exit_watch(fd: int) -> None:
    """Backstop for SIGTERM that does not need the main thread: kill the compilers, then exit."""
    global _terminating
    while True:
        try:
            data = os.read(fd, 64)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            return
        if int(signal.SIGTERM) in data:
            _terminating = True
            kill_children(os.getpid())
            time.sleep(STOP_GRACE_S)  # the main thread normally exits long before
            os._exit(TERMINATED_EXIT)


def _init_worker(parent_pid: int | None) -> None:
    ignore_interrupts()  # Ctrl-C reaches the whole process group: the parent decides
    signal.signal(signal.SIGTERM, _on_sigterm)
    sys.unraisablehook = _on_unraisable
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    threading.Thread(target=_exit_watch, args=(read_fd,), name="tuneforge-exit-watch", daemon=True).start()
    # SIGTERM rather than SIGKILL: a worker killed outright would leave its compiler running (the
    # compiler has its own session); SIGTERM lets it kill the compiler first, _exit_watch makes sure it ends.
    die_with_parent(signal.SIGTERM, parent_pid)  # exits with TERMINATED_EXIT if the parent is already gone
    config.reset()  # a forked worker drops the patches active at fork: each task brings its own


def serve(conn: Connection, parent_pid: int | None) -> None:
    """A worker's life (the target of its process): run the tasks that arrive on `conn`, one at a time."""
    _init_worker(parent_pid)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the pool is gone
        if message is None:
            return
        run, build, settings = message
        conn.send(("started", run))
        outcome = run_task(build, settings)
        try:
            conn.send(("done", run, outcome))
        except (EOFError, OSError):
            return


def run_task(build: object, settings: dict[str, Any]) -> BuildResult | BaseException:
    """One build under the submitter's settings: its result, or the exception to send back."""
    global _in_task
    _in_task = True
    try:
        started = time.perf_counter()
        with applied_settings(settings):
            key, path, compiled = builder_for(build).build(build)
            if config.get_optional_str("remote.url"):
                from tuneforge.store.remote import flush_all
                from tuneforge.store.tiers import remote_stats_file

                # Worker processes end without running atexit hooks: send the shared artifact now, and count
                # what the remote did (a fetched artifact's hit too: it was lost when the worker ended)
                if compiled:
                    flush_all(timeout=config.get_float("remote.timeout_s") * 4 + 5)
                remote_stats_file().flush_quietly()
        return BuildResult(key, str(path), compiled, time.perf_counter() - started)
    except _Terminated:
        os._exit(TERMINATED_EXIT)
    except BaseException as exc:
        if _terminating:
            os._exit(TERMINATED_EXIT)
        return _sendable(exc)
    finally:
        _in_task = False


def _sendable(exc: BaseException) -> BaseException:
    """`exc`, or a RuntimeError with its text when it cannot cross to the parent."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        return RuntimeError(f"build failed with an exception that cannot be sent back:\n{text}")
    return exc
