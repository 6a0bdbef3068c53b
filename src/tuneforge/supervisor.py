"""What every tuneforge worker process shares, whoever supervises it (build pool, benchmark runner, GPU worker).

A worker must die with the process that started it, run under that process's settings, and, when it
dies anyway, be described in words in the error of whatever it was running.  The three pieces:

    with interrupts_held(): start the worker     # in the parent
    ignore_interrupts()                          # in the worker, first thing
    die_with_parent(signal.SIGKILL)              # in the worker, next
    settings = settings_snapshot()               # in the parent, when the work is handed over
    with applied_settings(settings): ...         # in the worker, around the work
    describe_exit(-11)                           # in the parent: 'killed by SIGSEGV'

and, for the parent, one handle over a started worker whichever way it was started
(``multiprocessing`` or ``subprocess``), with one way to stop workers and their own children
(compilers run in their own sessions)::

    worker = Supervised(process)                 # a multiprocessing Process or a subprocess.Popen
    worker.death()                               # once it ended: 'killed by SIGKILL'
    stop_all(workers)                            # SIGTERM, STOP_GRACE_S to clean up, then SIGKILL

Kept at the bottom of the package (it imports only `config`), so that every layer can supervise.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator
from multiprocessing.process import BaseProcess
from typing import Any

from tuneforge import config

_PR_SET_PDEATHSIG = 1  # linux/prctl.h
STOP_GRACE_S = 3.0  # a worker told to stop (SIGTERM) gets this long to clean up before SIGKILL


def set_parent_death_signal(sig: int) -> bool:
    """Linux: have the kernel send `sig` to this process when the thread that started it exits.

    Best effort: returns whether the signal was armed (False elsewhere, or if prctl is missing).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        return int(ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent(sig: int, parent_pid: int | None = None) -> None:
    """Arm the parent-death signal; with `parent_pid`, also exit now if that parent is already gone.

    The check closes the race of a parent that died before the signal was armed: the kernel sends
    nothing then, and the orphan's parent id is no longer `parent_pid`.  The exit status is the one
    the signal would have given (128 + sig), without running any cleanup of this process.
    """
    set_parent_death_signal(sig)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(128 + int(sig))


@contextlib.contextmanager
def interrupts_held() -> Iterator[None]:
    """Start workers inside this block: they begin life with SIGINT blocked.

    Ctrl-C in a terminal signals the whole process group, workers included, and the parent decides
    what stops.  A worker ignores SIGINT once it runs its first line, but Python raises
    KeyboardInterrupt (and prints a traceback) for one that arrives while the worker is still
    importing.  A blocked signal mask survives fork and exec, so the signal waits, pending, until the
    worker's `ignore_interrupts()` discards it.  The calling thread's own Ctrl-C is deferred, never
    lost: the kernel hands it to another thread, or to this one when the block ends.
    """
    if not hasattr(signal, "pthread_sigmask"):  # not POSIX: nothing to hold
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def ignore_interrupts() -> None:
    """In a worker, first thing: ignore SIGINT (the parent decides when it stops), then unblock it, which
    drops a Ctrl-C that arrived while the worker started (see `interrupts_held`)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def settings_snapshot() -> dict[str, Any]:
    """Every setting not at its default (set, patched, from the environment or a file), as plain data.

    Taken in the parent when work is handed to a worker, which applies it with `applied_settings`.
    """
    settings = config.save()["settings"]
    assert isinstance(settings, dict)
    return dict(settings)


def applied_settings(settings: dict[str, Any]) -> config.patch:
    """Context manager: the parent's `settings_snapshot()` in force in this (worker) process."""
    return config.patch(settings)


def describe_exit(code: int | None) -> str:
    """How a process ended, in words: 'killed by SIGSEGV', 'exited with status 3' (a Popen/Process code)."""
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


# ------------------------------------------------------------------------------- a worker's children


def _numbered(directory: str) -> list[str]:
    """The entries of `directory` named by a number (process ids); none if it cannot be read."""
    try:
        return [name for name in os.listdir(directory) if name.isdigit()]
    except OSError:
        return []


def children(pid: int) -> list[int]:
    """Child process ids of `pid` (Linux /proc; an empty list elsewhere)."""
    found: list[int] = []
    for name in _numbered("/proc"):
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
            if int(stat[stat.rindex(b")") + 2:].split()[1]) == pid:
                found.append(int(name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def kill_children(pid: int) -> None:
    """Kill what a worker started: each child that leads its own group (a compiler run in its own
    session: the driver, cc1plus, as, ld) with its whole group, any other child alone."""
    for child in children(pid):
        with contextlib.suppress(OSError):
            if os.getpgid(child) == child:
                os.killpg(child, signal.SIGKILL)
            else:  # not (yet) a group leader: never signal a group we might share
                os.kill(child, signal.SIGKILL)


# ------------------------------------------------------------------------------------- the parent side


class Supervised:
    """The parent's handle on one started worker process, from `multiprocessing` or `subprocess`."""

    def __init__(self, process: BaseProcess | subprocess.Popen[bytes]) -> None:
        self.process = process
        pid = process.pid
        assert pid is not None, "a worker is supervised once it is started"
        self.pid: int = pid

    def __repr__(self) -> str:
        return f"Supervised(pid={self.pid}, exit={self.exit_code()})"

    def exit_code(self) -> int | None:
        """The exit code (negative: killed by that signal) once it ended, else None; never waits."""
        if isinstance(self.process, subprocess.Popen):
            return self.process.poll()
        return self.process.exitcode

    def wait(self, timeout: float | None = None) -> int | None:
        """Wait at most `timeout` seconds (None: for good) for it to end; its exit code or None."""
        if isinstance(self.process, subprocess.Popen):
            try:
                return self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                return None
        self.process.join(timeout)
        return self.process.exitcode

    def death(self, timeout: float | None = 1.0) -> str:
        """How it ended, in words ('killed by SIGSEGV'); waits up to `timeout` for the end to be known."""
        return describe_exit(self.wait(timeout))

    def signal(self, sig: int) -> None:
        """Send `sig` unless it already ended (and was reaped: its pid may be another process's now)."""
        if self.exit_code() is None:
            with contextlib.suppress(OSError):
                os.kill(self.pid, sig)


def stop_all(workers: Iterable[Supervised], grace_s: float = STOP_GRACE_S) -> None:
    """Stop `workers` together and wait for them: SIGTERM, then after `grace_s` (0: at once) SIGKILL,
    each with what it started (see `kill_children`)."""
    workers = list(workers)
    if grace_s > 0:
        for worker in workers:
            worker.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for worker in workers:
            worker.wait(max(0.0, deadline - time.monotonic()))
    for worker in workers:
        if worker.exit_code() is None:
            kill_children(worker.pid)
            worker.signal(signal.SIGKILL)
            worker.wait(5.0)
