"""The benchmark worker process: ``python -m tuneforge.tune.worker``.

It reads jobs on a private copy of stdin and streams trial events on a private copy of stdout; the
real fds 0 and 1 are pointed at /dev/null and stderr, so whatever a kernel (or an imported script)
reads or prints can never corrupt the protocol. It ignores SIGINT (the parent decides when it
stops), exits when its input closes, and asks the kernel to kill it when the parent dies.

Launchers defined in the user's script arrive as ``__main__.<name>``. On request the worker imports
that script the way multiprocessing's spawn does: under the name ``__mp_main__`` (so its
``if __name__ == "__main__":`` block does not run), aliased as ``__main__`` for unpickling. While it
imports, tuning is answer-only (``autotune.cache_only``): a script that tunes at module level must
not start measuring, and above all not start a worker of its own, inside the worker.

A worker serves one device: the CPU, or the one GPU its ``CUDA_VISIBLE_DEVICES`` shows it (see device.py).
After a choice leaves its CUDA context unusable (an illegal memory access, say) it reports ContextLost and
exits at once, without the interpreter's clean-up (which would touch the broken context): the parent
starts a fresh worker for the remaining choices.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import sys
import traceback
from collections.abc import Iterable, Iterator
from typing import Any

from tuneforge.supervisor import applied_settings, die_with_parent, ignore_interrupts

CONTEXT_LOST_EXIT = 3  # the exit status after a sticky CUDA error (see ContextLost)


def import_main(main: dict[str, Any], settings: dict[str, Any]) -> str | None:
    """Import the parent's main script as ``__mp_main__`` and alias it as ``__main__``.

    Returns None on success, else why it failed (the worker stays usable for everything else).
    """
    import runpy
    import types

    from tuneforge import config

    argv = sys.argv
    sys.argv = list(main.get("argv") or argv)  # a script may read its arguments at module level
    try:
        # Answer-only while importing: module-level selections get records or the fallback, never a
        # measurement, no table is printed and nothing is logged twice.
        with applied_settings(settings), config.patch(autotune_cache_only=True, autotune_verbose=False,
                                                  autotune_log=None):
            if "name" in main:
                namespace = runpy.run_module(main["name"], run_name="__mp_main__", alter_sys=True)
            else:
                namespace = runpy.run_path(main["path"], run_name="__mp_main__")
    except BaseException as exc:  # SystemExit from argparse or sys.exit() too: report it, keep serving
        where = "".join(traceback.format_exception(exc)[-2:]).strip()
        return f"{type(exc).__name__}: {exc} ({where.splitlines()[0].strip() if where else ''})"
    finally:
        sys.argv = argv
    module = types.ModuleType("__mp_main__")
    module.__dict__.update(namespace)
    sys.modules["__main__"] = sys.modules["__mp_main__"] = module
    return None


def _preload(names: Iterable[str]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as exc:  # a choice that needs it reports the failure itself
            print(f"tuneforge benchmark worker: could not import {name}: {exc}", file=sys.stderr)


def serve(read_fd: int, write_fd: int) -> None:
    from tuneforge.tune import input_guard, runner
    from tuneforge.tune.device import DeviceContextLost
    from tuneforge.tune.events import ContextLost, JobFailed, JobUnreadable
    from tuneforge.tune.job import error_text
    from tuneforge.tune.protocol import ChannelClosed, Unreadable, receive, send
    from tuneforge.tune.trials import release_kept, run_trials

    runner.mark_worker()  # a selection made in here never starts a worker of its own
    input_guard.enable()  # its trials watch large inputs for writes instead of comparing them
    hello = receive(read_fd)
    for entry in reversed(hello["sys_path"]):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    if hello.get("cpus"):
        os.sched_setaffinity(0, hello["cpus"])
    _preload(hello.get("preload", ()))
    if hello.get("warm_cuda"):
        _warm_cuda()
    send(write_fd, ("ready", os.getpid()))
    while True:
        try:
            message: Any = receive(read_fd)
        except ChannelClosed:
            return
        except Unreadable as exc:  # e.g. a function this process cannot find: the parent decides
            send(write_fd, JobUnreadable(str(exc)))
            continue
        if message[0] == "exit":
            return
        if message[0] == "release":  # the job the last one kept its inputs for will not come
            release_kept()
            continue
        if message[0] == "preload":
            _preload(message[1])
            continue
        if message[0] == "sync":  # everything sent before it is done (a preload, say): prepare(wait=True)
            send(write_fd, ("synced",))
            continue
        if message[0] == "main":
            send(write_fd, ("main", import_main(message[1], message[2])))
            continue
        _, job, choices, reference, settings = message
        try:
            with applied_settings(settings), _profiled():
                run_trials(job, choices, reference, lambda event: send(write_fd, event))
        except DeviceContextLost as lost:  # this process can run nothing more: the parent replaces it
            send(write_fd, ContextLost(lost.resume_at, lost.culprit, lost.error, lost.verify_s, lost.bench_s))
            os._exit(CONTEXT_LOST_EXIT)
        except Exception as exc:  # a job-level failure (e.g. an input generator raised): report, keep serving
            send(write_fd, JobFailed(error_text(exc)))


_jobs_profiled = 0


@contextlib.contextmanager
def _profiled() -> Iterator[None]:
    """A cProfile of the job, written to ``autotune.worker_profile`` (when set) as worker-<pid>-<n>.prof."""
    global _jobs_profiled
    from tuneforge import config

    folder = config.get_optional_path("autotune.worker_profile")
    if folder is None:
        yield
        return
    import cProfile

    profile = cProfile.Profile()
    profile.enable()
    try:
        yield
    finally:
        profile.disable()
        _jobs_profiled += 1
        path = folder / f"worker-{os.getpid()}-{_jobs_profiled}.prof"
        try:  # whole or not at all: the parent may read it as soon as the job's last event arrives
            folder.mkdir(parents=True, exist_ok=True)
            profile.dump_stats(path.with_suffix(".partial"))
            os.replace(path.with_suffix(".partial"), path)
        except OSError as exc:  # a diagnostic: the job's results matter more
            print(f"tuneforge benchmark worker: could not write its profile to {folder}: {exc}", file=sys.stderr)


def _warm_cuda() -> None:
    """The CUDA context and cuBLAS handle of this worker's GPU, made before it says it is ready: work its first job
    would start with (0.2-0.5 s on an H100), done while the parent still compiles, or ahead of time (prepare)."""
    try:
        import torch

        x = torch.ones(8, 8, device="cuda")
        torch.mm(x, x)
        torch.cuda.synchronize()
    except Exception as exc:  # no usable GPU: the job says so, choice by choice
        print(f"tuneforge benchmark worker: could not start CUDA: {exc}", file=sys.stderr)


def main() -> None:
    ignore_interrupts()
    die_with_parent(signal.SIGKILL)
    read_fd, write_fd = os.dup(0), os.dup(1)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # input() in an imported script gets EOF instead of protocol bytes
    os.close(devnull)
    os.dup2(2, 1)
    try:
        serve(read_fd, write_fd)
    except BrokenPipeError:  # the parent is gone (interrupted while this worker started): no one to report to
        os._exit(0)


if __name__ == "__main__":
    main()
