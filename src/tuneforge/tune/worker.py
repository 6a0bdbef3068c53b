"""The benchmark worker process: ``python -m tuneforge.tune.worker``.

It reads jobs on stdin and streams trial events on a private copy of stdout; the real fd 1 is
pointed at stderr, so whatever a kernel prints can never corrupt the protocol. It ignores SIGINT
(the parent decides when it stops), exits when its stdin closes, and asks the kernel to kill it
when the parent dies.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from typing import Any

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def serve(read_fd: int, write_fd: int) -> None:
    from tuneforge import config
    from tuneforge.tune.job import error_text
    from tuneforge.tune.protocol import ChannelClosed, receive, send
    from tuneforge.tune.trials import run_trials

    hello = receive(read_fd)
    for entry in reversed(hello["sys_path"]):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    if hello.get("cpus"):
        os.sched_setaffinity(0, hello["cpus"])
    send(write_fd, ("ready", os.getpid()))
    while True:
        try:
            message: Any = receive(read_fd)
        except ChannelClosed:
            return
        if message[0] == "exit":
            return
        _, job, choices, reference, settings = message
        try:
            with config.patch(settings):
                run_trials(job, choices, reference, lambda event: send(write_fd, event))
        except Exception as exc:  # a job-level failure (e.g. an input generator raised): report, keep serving
            send(write_fd, ("error", error_text(exc)))


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    write_fd = os.dup(1)
    os.dup2(2, 1)
    serve(0, write_fd)


if __name__ == "__main__":
    main()
