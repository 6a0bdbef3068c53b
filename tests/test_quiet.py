"""quiet.settle: the pause after a library call ends once no thread of the process runs (its pool went idle)."""

from __future__ import annotations

import threading

from tuneforge.tune.quiet import settle


def test_a_quiet_process_waits_a_step_not_the_whole_pause() -> None:
    assert settle(1.0) < 0.5


def test_a_spinning_thread_keeps_it_waiting_to_the_end() -> None:
    stop = threading.Event()

    def spin() -> None:  # what a library's pool does after a call: run, holding a core
        while not stop.is_set():
            pass

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        for _ in range(3):  # a busy host can take the spinner's core away for a whole step: that step reads quiet
            waited = settle(0.3)
            if waited >= 0.29:
                break
    finally:
        stop.set()
        spinner.join()
    assert waited >= 0.29
    assert settle(1.0) < 0.5  # stopped: quiet again
