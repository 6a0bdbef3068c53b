"""One benchmark worker as its parent sees it: the ``python -m tuneforge.tune.worker`` child, its pipes, and
whether it can take a job at once (runner.py keeps one per device and runs the jobs)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

from tuneforge import config
from tuneforge.supervisor import Supervised, interrupts_held, stop_all
from tuneforge.tune.device import worker_env
from tuneforge.tune.protocol import receive, send

STARTUP_TIMEOUT_S = 120.0  # for its start, a preload, and importing the main script


class WorkerProcess:
    """One benchmark worker: a ``python -m tuneforge.tune.worker`` child talking over pipes, for `device`
    ("cpu", or "cuda:N": then it sees that GPU alone, as cuda:0)."""

    def __init__(self, device: str = "cpu", libraries: Sequence[str] = ()) -> None:
        self.device = device
        env = worker_env(device, os.environ)
        with interrupts_held():
            self.proc = subprocess.Popen([sys.executable, "-m", "tuneforge.tune.worker"], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=None, env=env, close_fds=True)
        self.supervised = Supervised(self.proc)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._write = self.proc.stdin.fileno()
        self._read = self.proc.stdout.fileno()
        cpus = list(config.get_ints("autotune.worker_cpus"))
        gpu = device != "cpu"  # a GPU's worker needs torch, and makes its CUDA context before it says it is ready
        self.libraries = {"torch"} if gpu else set()
        self.libraries.update(libraries)
        send(self._write, {"sys_path": [p for p in sys.path if p], "cpus": cpus, "warm_cuda": gpu,
                           "preload": sorted(self.libraries)})
        self.pid = self.proc.pid
        self.ready = False  # whether it can take a job without first importing something (wait_ready)
        self._started = False  # whether it sent its first message ("ready")
        self._imported = set(self.libraries)  # what it has imported once it says so (or answers a sync)
        self.main_loaded = False  # whether this worker has imported the parent's main script

    def send(self, message: Any) -> None:
        send(self._write, message)

    def load(self, libraries: Sequence[str]) -> None:
        """Have it import `libraries` it has not yet, before its next job (no answer: a failed import is the job's
        choices' to report; wait_ready waits for the imports)."""
        missing = sorted(set(libraries) - self.libraries)
        if missing:
            self.send(("preload", missing))
            self.libraries.update(missing)
            self.ready = False

    def wait_ready(self) -> None:
        """Wait until it can take a job at once: its first message (it has started, with the libraries it was
        started with), then, after a later `load`, the answer to a sync sent behind the imports."""
        if self.ready:
            return
        if not self._started:
            self._expect("ready")
            self._started = True
        if self.libraries != self._imported:
            self.send(("sync",))
            self._expect("synced")
            self._imported = set(self.libraries)
        self.ready = True

    def _expect(self, what: str) -> None:
        answer = self.receive(STARTUP_TIMEOUT_S)
        if answer[0] != what:
            raise RuntimeError(f"benchmark worker sent {answer!r} instead of {what}")

    def receive(self, timeout: float | None) -> Any:
        return receive(self._read, timeout)

    def alive(self) -> bool:
        return self.supervised.exit_code() is None

    def death(self) -> str:
        """Why the worker ended, e.g. 'killed by SIGSEGV' or 'exited with status 3'."""
        return self.supervised.death(timeout=None)

    def kill(self) -> None:
        """Kill it at once (nothing of a kernel's run is worth saving), with anything it started."""
        stop_all([self.supervised], grace_s=0)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
