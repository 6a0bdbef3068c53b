"""The pieces every worker supervisor shares (issue 18, part 5), tried on real child processes."""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tuneforge import config
from tuneforge.supervisor import (
    Supervised,
    describe_exit,
    interrupts_held,
    kill_children,
    settings_snapshot,
    stop_all,
)

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux's")


def python(code: str, **kwargs: Any) -> subprocess.Popen[str]:
    """A fresh interpreter running `code` (text mode; Popen's keyword arguments)."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], text=True, **kwargs)


def gone(pid: int, deadline_s: float = 30.0) -> bool:
    """Whether process `pid` has ended (exited or a zombie) within `deadline_s`."""
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


@pytest.mark.parametrize("code, expected", [
    (None, "exit status unknown"),
    (0, "exited with status 0"),
    (3, "exited with status 3"),
    (-9, "killed by SIGKILL"),
    (-11, "killed by SIGSEGV"),
    (-200, "killed by signal 200"),
])
def test_exit_codes_are_described_in_words(code: int | None, expected: str) -> None:
    assert describe_exit(code) == expected


@pytest.mark.parametrize("body, expected", [
    ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", "killed by SIGSEGV"),
    ("import os; os.abort()", "killed by SIGABRT"),
    ("import sys; sys.exit(3)", "exited with status 3"),
])
def test_a_dead_child_is_described_by_its_signal_or_status(body: str, expected: str) -> None:
    child = python(body, stderr=subprocess.DEVNULL)
    assert describe_exit(child.wait(timeout=60)) == expected


def test_a_killed_child_is_described_by_signal_name() -> None:
    child = python("import time; time.sleep(60)")
    child.kill()
    assert describe_exit(child.wait(timeout=60)) == "killed by SIGKILL"


@linux_only
def test_the_death_signal_kills_a_worker_when_its_parent_dies() -> None:
    # parent (killed below) -> worker (armed with SIGKILL); the worker must not outlive its parent.
    parent = python("""
        import subprocess, sys
        worker = subprocess.Popen([sys.executable, "-c", '''
        import signal, time
        from tuneforge.supervisor import die_with_parent
        die_with_parent(signal.SIGKILL)
        print("armed", flush=True)
        time.sleep(120)
        '''], stdout=subprocess.PIPE, text=True)
        assert worker.stdout.readline() == "armed\\n"
        print(worker.pid, flush=True)
        import time
        time.sleep(120)
    """, stdout=subprocess.PIPE)
    assert parent.stdout is not None
    worker = int(parent.stdout.readline())
    try:
        assert not gone(worker, deadline_s=0.5)  # alive while its parent lives
        parent.kill()
        parent.wait(timeout=60)
        assert gone(worker), f"worker {worker} outlived its parent"
    finally:
        parent.kill()
        kill_quietly(worker)


@linux_only
def test_a_worker_whose_parent_is_already_gone_exits_at_once() -> None:
    # The race the check closes: the parent died before the signal was armed (here: a parent id that is
    # not this process's parent stands for it). The status is the one the signal would have given.
    child = python("""
        import os, signal
        from tuneforge.supervisor import die_with_parent
        die_with_parent(signal.SIGTERM, os.getppid() + 1 if os.getppid() != 1 else 2)
        print("survived")
    """, stdout=subprocess.PIPE)
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 128 + signal.SIGTERM and out == ""


def test_settings_taken_in_the_parent_are_in_force_in_the_worker() -> None:
    with config.patch(compile_timeout_s=7.5, compile_threads=3):
        snapshot = settings_snapshot()
    assert snapshot["compile_timeout_s"] == 7.5 and snapshot["compile_threads"] == 3
    assert "compile_timeout_s" not in settings_snapshot()  # only what differs from the defaults
    child = python("""
        import json, sys
        from tuneforge import config
        from tuneforge.supervisor import applied_settings
        with applied_settings(json.loads(sys.stdin.read())):
            print(config.get("compile_timeout_s"), config.get("compile_threads"))
        print(config.get("compile_timeout_s"))
    """, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    out, _ = child.communicate(json.dumps(snapshot), timeout=60)
    assert out.split("\n")[:2] == ["7.5 3", "600.0"]


@linux_only
def test_kill_children_kills_a_child_in_its_own_session() -> None:
    worker = python("""
        import subprocess, time
        compiler = subprocess.Popen(["sleep", "120"], start_new_session=True)
        print(compiler.pid, flush=True)
        time.sleep(120)
    """, stdout=subprocess.PIPE)
    assert worker.stdout is not None
    compiler = int(worker.stdout.readline())
    try:
        assert not gone(compiler, deadline_s=0.2)
        kill_children(worker.pid)
        assert gone(compiler)
        assert worker.poll() is None  # the worker itself is left alone
    finally:
        worker.kill()
        worker.wait(timeout=60)
        kill_quietly(compiler)


def kill_quietly(pid: int) -> None:
    with contextlib.suppress(OSError):  # already gone
        os.kill(pid, signal.SIGKILL)


def _sleep_then_exit(code: int) -> None:  # a multiprocessing target (module level: spawn imports it)
    time.sleep(0.2)
    os._exit(code)


@pytest.mark.parametrize("kind", ["subprocess", "multiprocessing"])
def test_supervised_tells_how_either_kind_of_process_ended(kind: str) -> None:
    process: Any
    if kind == "subprocess":
        process = python("import os, time; time.sleep(0.2); os._exit(5)")
    else:
        process = multiprocessing.get_context("spawn").Process(target=_sleep_then_exit, args=(5,))
        process.start()
    worker = Supervised(process)
    assert worker.pid == process.pid and worker.exit_code() is None  # running: never waits
    assert worker.death(timeout=60) == "exited with status 5"
    assert worker.exit_code() == 5


TERM_IGNORING_WORKER = """
    import signal, subprocess, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    compiler = subprocess.Popen(["sleep", "121"], start_new_session=True)
    print(compiler.pid, flush=True)
    time.sleep(121)
"""


@linux_only
def test_stop_all_kills_a_worker_that_ignores_sigterm_with_its_children() -> None:
    stubborn = python(TERM_IGNORING_WORKER, stdout=subprocess.PIPE)
    polite = python("import time; time.sleep(122)")
    assert stubborn.stdout is not None
    compiler = int(stubborn.stdout.readline())
    try:
        started = time.monotonic()
        stop_all([Supervised(stubborn), Supervised(polite)], grace_s=0.5)
        assert time.monotonic() - started < 30  # the grace, then SIGKILL: not the 121 s sleep
        assert polite.returncode == -signal.SIGTERM  # took the polite way
        assert stubborn.returncode == -signal.SIGKILL  # was killed after the grace
        assert gone(compiler)  # with what it started in its own session
    finally:
        for child in (stubborn, polite):
            child.kill()
            child.wait(timeout=60)
        kill_quietly(compiler)


def test_stop_all_without_grace_kills_at_once_and_spares_the_ended() -> None:
    ended = python("pass")
    ended.wait(timeout=60)
    running = python("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(123)")
    stop_all([Supervised(ended), Supervised(running)], grace_s=0)
    assert (ended.returncode, running.returncode) == (0, -signal.SIGKILL)


# A worker still importing when Ctrl-C reaches the process group: it waits a moment (standing for its
# imports), then ignores SIGINT as every tuneforge worker does first thing.
_SLOW_STARTING_WORKER = """
    import time
    time.sleep(1.0)
    from tuneforge.supervisor import ignore_interrupts
    ignore_interrupts()
    time.sleep(0.2)
    print("served")
"""


@pytest.mark.parametrize("held", [True, False])
def test_a_worker_interrupted_while_it_starts_carries_on_only_if_started_with_interrupts_held(held: bool) -> None:
    with interrupts_held() if held else contextlib.nullcontext():
        child = python(_SLOW_STARTING_WORKER, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(0.3)
    os.kill(child.pid, signal.SIGINT)
    stdout, stderr = child.communicate(timeout=60)
    if held:  # the signal waited, blocked, and was dropped once the worker ignored it
        assert (child.returncode, stdout.strip()) == (0, "served"), stderr
    else:  # what happened before: a KeyboardInterrupt traceback from the worker's imports (or, on a host slow to
        # start Python, death by SIGINT before Python's handler was installed): either way it did not carry on
        assert child.returncode != 0 and "served" not in stdout
        assert "KeyboardInterrupt" in stderr or child.returncode == -signal.SIGINT, (child.returncode, stderr)


def test_a_ctrl_c_to_the_parent_while_it_starts_a_worker_is_deferred_not_lost() -> None:
    code = """
        import os, signal, time
        from tuneforge.supervisor import interrupts_held
        try:
            with interrupts_held():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)
                print("held")
            time.sleep(5)
        except KeyboardInterrupt:
            print("interrupted")
    """
    proc = python(code, stdout=subprocess.PIPE)
    stdout, _ = proc.communicate(timeout=60)
    assert stdout.split() == ["held", "interrupted"]
