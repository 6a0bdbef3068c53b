"""The worker side of the build pool, and the executor helpers of its parent side.

A worker runs one ``cpp.build()`` per task under the submitter's settings, reports which task it
runs in a small status file (for the pool's deadlines and crash reports), ignores Ctrl-C, and on
SIGTERM (also sent by the kernel when the pool's dispatcher thread dies) kills its compiler's
process group before exiting.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import threading
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from types import FrameType
from typing import Any

from tuneforge import config
from tuneforge.compile import cpp
from tuneforge.compile.cpp import CppBuild
from tuneforge.supervisor import applied_settings, die_with_parent, kill_children

KILL_GRACE_S = 3.0  # a worker told to stop (SIGTERM) gets this long before SIGKILL
TERMINATED_EXIT = 128 + int(signal.SIGTERM)


@dataclass(frozen=True)
class BuildResult:
    key: str  # artifact key in the store
    library_path: str  # absolute path of the built library (or extension module) in the store
    compiled: bool  # this build ran the compiler (False: found in the store)
    seconds: float  # time of the build in the worker


# ----------------------------------------------------------------------------------- executor helpers


def executor_processes(executor: ProcessPoolExecutor) -> dict[int, Any]:
    """pid -> multiprocessing.Process of an executor's workers (empty once it is shut down)."""
    processes = getattr(executor, "_processes", None)
    return dict(processes) if processes else {}


# ---------------------------------------------------------------------------------------- worker side

_worker_status_dir: str | None = None
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
            time.sleep(KILL_GRACE_S)  # the main thread normally exits long before
            os._exit(TERMINATED_EXIT)


def init_worker(parent_pid: int | None, status_dir: str) -> None:
    global _worker_status_dir
    _worker_status_dir = status_dir
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent decides
    signal.signal(signal.SIGTERM, _on_sigterm)
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
    threading.Thread(target=_exit_watch, args=(read_fd,), name="tuneforge-exit-watch", daemon=True).start()
    # SIGTERM rather than SIGKILL: a worker killed outright would leave its compiler running (the
    # compiler has its own session); SIGTERM lets it kill the compiler first, _exit_watch makes sure it ends.
    die_with_parent(signal.SIGTERM, parent_pid)  # exits with TERMINATED_EXIT if the parent is already gone
    config.reset()  # a forked worker drops the patches active at fork: each task brings its own


def _status_path() -> str | None:
    return None if _worker_status_dir is None else os.path.join(_worker_status_dir, str(os.getpid()))


def _report_start(run: int) -> None:
    """Tell the parent which worker runs `run` since when (for its deadline and crash reports)."""
    path = _status_path()
    if path is None:
        return
    tmp = f"{path}.tmp"
    with contextlib.suppress(OSError):  # without it the build still runs, only unwatched
        with open(tmp, "w") as f:
            f.write(f"{run} {time.time()!r}\n")
        os.replace(tmp, path)


def _report_end() -> None:
    path = _status_path()
    if path is not None:
        with contextlib.suppress(OSError):
            os.unlink(path)


def run_task(run: int, build: CppBuild, settings: dict[str, Any]) -> BuildResult:
    """The task a worker runs: one cpp.build() under the submitter's settings."""
    global _in_task
    _in_task = True
    try:
        _report_start(run)
        started = time.perf_counter()
        with applied_settings(settings):
            artifact = cpp.build(build)
            if artifact.compiled and config.get("remote.url"):
                from tuneforge.store.remote import flush_all
                from tuneforge.store.tiers import remote_stats_file

                # Worker processes end without running atexit hooks: send the shared artifact now.
                flush_all(timeout=float(config.get("remote.timeout_s")) * 4 + 5)
                remote_stats_file().flush_quietly()
        return BuildResult(artifact.key, str(artifact.library_path), artifact.compiled,
                           time.perf_counter() - started)
    except _Terminated:
        os._exit(TERMINATED_EXIT)
    except BaseException as exc:
        if _terminating:
            os._exit(TERMINATED_EXIT)
        try:
            pickle.loads(pickle.dumps(exc))
        except Exception:  # an exception that cannot cross to the parent would break the whole pool
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            raise RuntimeError(f"build failed with an exception that cannot be sent back:\n{text}") from None
        raise
    finally:
        _report_end()
        _in_task = False


# ---------------------------------------------------------------------------------------- parent side


def read_status(status_dir: str) -> dict[int, tuple[int, float]]:
    """run id -> (worker pid, start time) of the runs that workers have started and not finished."""
    found: dict[int, tuple[int, float]] = {}
    try:
        names = [name for name in os.listdir(status_dir) if name.isdigit()]
    except OSError:
        return found
    for name in names:
        try:
            with open(os.path.join(status_dir, name)) as f:
                run, started = f.read().split()
            found[int(run)] = (int(name), float(started))
        except (OSError, ValueError):
            continue
    return found


def stop_executor(executor: ProcessPoolExecutor) -> None:
    """Stop an executor's workers now: SIGTERM (they kill their compilers), then SIGKILL."""
    processes = list(executor_processes(executor).values())
    manager = getattr(executor, "_executor_manager_thread", None)
    executor.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        if process.exitcode is None:
            process.terminate()
    deadline = time.monotonic() + KILL_GRACE_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.exitcode is None:
            kill_children(process.pid)
            process.kill()
            process.join(1.0)
    if isinstance(manager, threading.Thread) and manager is not threading.current_thread():
        manager.join(timeout=5)
