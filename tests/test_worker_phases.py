"""Which phase of a job the benchmark worker died in decides who is to blame (issue 11, items 4 and 9).

Dying while making the example inputs is the machinery's failure: the selection falls back with one
warning (tests/test_select.py). Dying or hanging while running the reference is the reference's: the
selection fails as it does when the reference raises, no record is stored, and the reference is never
run in this process, where it would crash or hang the caller. Real workers, real signals.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tuneforge import config
from tuneforge.errors import NoValidChoicesError
from tuneforge.store.default import default_records
from tuneforge.tune.choices import Choice, ExternChoice
from tuneforge.tune.select import select_detailed

from . import tuning_kernels as k
from .conftest import run_python

N = 256
PARENT = "TUNEFORGE_TEST_PARENT_PID"  # set to the pytest process's pid: "not in the worker" when it matches
ran_here: list[str] = []  # what the reference did in this process (never anything, if it stays isolated)


def in_the_worker() -> bool:
    return os.environ.get(PARENT) != str(os.getpid())


def add_but_segfaults_in_the_worker(a: Any, b: Any, out: Any) -> None:
    if in_the_worker():
        os.kill(os.getpid(), signal.SIGSEGV)
    ran_here.append("segfault")
    np.add(a, b, out=out)


def add_but_hangs_in_the_worker(a: Any, b: Any, out: Any) -> None:
    if in_the_worker():
        time.sleep(3600)
    ran_here.append("hang")
    np.add(a, b, out=out)


@pytest.fixture
def marked(quick_tuning: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """quick_tuning, with this process marked as the worker's parent and nothing run here yet."""
    monkeypatch.setenv(PARENT, str(os.getpid()))
    ran_here.clear()
    return quick_tuning


def select_with(reference: Choice, **settings: Any) -> NoValidChoicesError:
    """Tune two good native kernels (isolated) against `reference`: the error the selection must raise."""
    choices = k.crash_choices(["good", "good_slow"])
    assert all(c.is_native for c in choices) and config.get("autotune.isolate")
    with config.patch(**settings), pytest.raises(NoValidChoicesError) as info:
        select_detailed("add", choices, [np.ones(N), np.ones(N)], out=np.empty(N), reference=reference)
    return info.value


def test_a_native_reference_that_crashes_the_worker_fails_the_selection(marked: Path) -> None:
    reference = k.crash_choices(["segfault"])[0]
    error = select_with(reference)
    assert f"the reference {reference.name} of add failed" in str(error)
    assert "crash: the reference crashed the benchmark worker (killed by SIGSEGV)" in error.reasons[reference.name]
    assert default_records().count() == 0  # nothing was measured, nothing a later selection would reuse


def test_a_library_reference_runs_in_the_worker_and_its_crash_fails_the_selection(marked: Path) -> None:
    reference = ExternChoice(add_but_segfaults_in_the_worker)
    error = select_with(reference)
    assert "crashed the benchmark worker (killed by SIGSEGV)" in error.reasons["add_but_segfaults_in_the_worker"]
    assert ran_here == []  # not retried in this process, where it would have crashed the caller
    assert default_records().count() == 0


def test_a_reference_that_hangs_in_the_worker_fails_the_selection(marked: Path) -> None:
    reference = ExternChoice(add_but_hangs_in_the_worker)
    # A limit short enough for a test, and long enough for a loaded machine to make the inputs in time.
    error = select_with(reference, autotune_bench_timeout_s=5.0)
    reason = error.reasons["add_but_hangs_in_the_worker"]
    assert "timeout: the reference did not finish within 5 s (autotune.bench_timeout_s)" in reason, reason
    assert ran_here == []  # not retried in this process, where it would have hung the caller
    assert default_records().count() == 0


def test_a_crashing_reference_never_runs_the_trials_kept_in_this_process(cache_dir: Path) -> None:
    # `python -c`: a launcher of __main__ cannot reach the worker, so its trial is kept in this process,
    # after the worker's. The reference crashed the worker first: nothing here may run it again.
    proc = run_python("""
        import numpy as np
        from tuneforge import config
        from tuneforge.errors import NoValidChoicesError
        from tuneforge.tune.choices import ExternChoice
        from tuneforge.tune.select import select_detailed
        from tests import tuning_kernels as k

        def mine(a, b, out):
            np.add(a, b, out=out)

        reference = k.crash_choices(["segfault"])[0]
        with config.patch(autotune_bench_time_s=0.003, autotune_warmup_s=0.0, autotune_min_repeats=2):
            try:
                select_detailed("add", [*k.crash_choices(["good"]), ExternChoice(mine)],
                                [np.ones(64), np.ones(64)], out=np.empty(64), reference=reference)
            except NoValidChoicesError as exc:
                print("raised:", exc.reasons[reference.name])
    """, check=False)
    assert proc.returncode == 0, f"the caller died ({proc.returncode}):\n{proc.stderr[-3000:]}"
    assert "raised: crash: the reference crashed the benchmark worker (killed by SIGSEGV)" in proc.stdout, proc.stdout
