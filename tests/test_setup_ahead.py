"""The benchmark worker makes the example inputs and runs the reference while the choices compile
(tune/setup_ahead.py): once per selection, before the builds end, and a reference that crashes the worker
there fails the selection without being run again. Real compiler, real worker, real signals."""

from __future__ import annotations

import dataclasses
import functools
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tuneforge
from tuneforge import config
from tuneforge.errors import NoValidChoicesError, TuneforgeError
from tuneforge.tune.choices import ExternChoice
from tuneforge.tune.events import ChoiceResult, Event
from tuneforge.tune.job import TrialJob
from tuneforge.tune.select import select_detailed
from tuneforge.tune.specs import TensorSpec
from tuneforge.tune.trials import run_trials

from . import tuning_kernels as k
from .conftest import cuda_torch

N = 256


def stamped_add(stamps: str, crash: bool, a: Any, b: Any, out: Any) -> None:
    """The reference: adds, after writing its process and the time to `stamps`; `crash`: then segfaults."""
    with open(stamps, "a") as f:
        f.write(f"{os.getpid()} {time.time()}\n")
    if crash:
        os.kill(os.getpid(), signal.SIGSEGV)
    np.add(a, b, out=out)


def reference(stamps: Path, crash: bool = False) -> ExternChoice:
    return ExternChoice(functools.partial(stamped_add, str(stamps), crash), name="stamped_add")


def runs(stamps: Path) -> list[tuple[int, float]]:
    lines = stamps.read_text().splitlines() if stamps.exists() else []
    return [(int(pid), float(when)) for pid, when in (line.split() for line in lines)]


def test_the_worker_runs_the_reference_while_the_choices_compile(quick_tuning: Path, tmp_path: Path) -> None:
    stamps = tmp_path / "reference.txt"
    # Builds that take 3 s at least (a compiler that sleeps first): on a loaded machine, two small builds could
    # end before the worker had its turn, and the test would say nothing of the order.
    slow_cxx = tmp_path / "slow-g++"
    slow_cxx.write_text('#!/bin/sh\ncase " $* " in *" -shared "*) sleep 3 ;; esac\nexec g++ "$@"\n')
    slow_cxx.chmod(0o755)
    # A worker that is up already: on a loaded machine, starting one can outlast the builds.
    assert tuneforge.prepare("cpu", wait=True)
    started = time.time()
    with config.patch(cpp_cxx=str(slow_cxx)):
        s = select_detailed("ahead", k.crash_choices(["good", "good_slow"]), [np.ones(N), np.ones(N)],
                            out=np.empty(N), reference=reference(stamps))
    assert s.choice.params["LABEL"] == "good"
    ran = runs(stamps)
    assert len(ran) == 1, ran  # once: the trials took the inputs and outputs made ahead
    pid, when = ran[0]
    assert pid != os.getpid()  # in the worker
    assert s.report.build_s > 3  # the slow compiler ran (an empty cache)
    assert when - started < s.report.build_s, "the reference ran only after the builds"


def test_a_reference_that_crashes_the_worker_ahead_of_the_trials_is_not_run_again(quick_tuning: Path,
                                                                                   tmp_path: Path) -> None:
    stamps = tmp_path / "reference.txt"
    with pytest.raises(NoValidChoicesError) as info:
        select_detailed("ahead_crash", k.crash_choices(["good", "good_slow"]), [np.ones(N), np.ones(N)],
                        out=np.empty(N), reference=reference(stamps, crash=True))
    assert "crash: the reference crashed the benchmark worker (killed by SIGSEGV)" in info.value.reasons["stamped_add"]
    assert len(runs(stamps)) == 1  # one worker crashed, not a second one for the trials


def test_inputs_kept_for_trials_that_never_came_are_dropped(quick_tuning: Path, tmp_path: Path) -> None:
    stamps = tmp_path / "reference.txt"
    args = [np.ones(N), np.ones(N)]
    broken = k.CRASH_TEMPLATE.choices([{"BODY": k.BAD_BODIES["broken"], "LABEL": label} for label in ("x", "y")])
    with config.patch(autotune_force=True), pytest.raises(TuneforgeError):  # nothing compiles: nothing to time
        select_detailed("ahead_kept", broken, args, out=np.empty(N), reference=reference(stamps))
    assert len(runs(stamps)) == 1
    choices = k.crash_choices(["good", "good_slow"])
    s = select_detailed("ahead_kept", choices, args, out=np.empty(N), reference=reference(stamps))
    # (twice, on CI, good_slow was picked: the records say why, should it happen again; kept short, or pytest cuts
    # the message)
    assert s.choice.params["LABEL"] == "good", {c.params["LABEL"]: (r.status, r.median_ms, r.method, r.error[:60])
                                                if (r := s.records.get(c.hash_key)) else None for c in choices}
    # Had the worker kept the first selection's inputs and outputs, the second would have taken them.
    assert len(runs(stamps)) == 2


def stamped_torch_gemm(stamps: str, a: Any, b: Any, alpha: float, beta: float, bias: Any, out: Any) -> None:
    """The GPU GEMM's reference (cuBLAS), after writing its process and the time to `stamps`."""
    from tuneforge.kernels.gemm_gpu.choice import torch_gemm

    stamped_add(stamps, False, np.zeros(1), np.zeros(1), np.zeros(1))
    torch_gemm(a, b, alpha, beta, bias, out)


@pytest.mark.gpu
def test_a_gpus_worker_runs_cublas_while_the_triton_kernels_compile(quick_tuning: Path, tmp_path: Path) -> None:
    torch = cuda_torch()
    from tuneforge.kernels.gemm_gpu.op import device_limits, gpu_choices
    from tuneforge.kernels.gemm_gpu.render import Epilogue

    m, n, k = 384, 640, 320  # a shape of its own: Triton's cache holds no kernel of it (static shapes)
    triton = gpu_choices(m, n, k, "float16", Epilogue(), device_limits(0))[1:4]
    stamps = tmp_path / "reference.txt"
    ref = ExternChoice(functools.partial(stamped_torch_gemm, str(stamps)), name="stamped_cublas")
    a, b = (torch.randn(rows, cols, device="cuda", dtype=torch.float16) for rows, cols in ((m, k), (k, n)))
    out = torch.empty(m, n, device="cuda", dtype=torch.float16)
    assert tuneforge.prepare("cuda", wait=True)
    started = time.time()
    s = select_detailed("ahead_gpu", triton, [a, b, 1.0, 0.0, None], out=out, reference=ref)
    ran = runs(stamps)
    assert len(ran) == 1 and ran[0][0] != os.getpid(), ran  # once, in the GPU's worker
    assert s.report.isolated and s.report.build_s > 0.2  # Triton compiled
    assert ran[0][1] - started < s.report.build_s, "cuBLAS ran only after the builds"


def add_slowly(calls: list[float], a: Any, b: Any, out: Any) -> None:
    """The reference of the next test: its first run (made ahead, beside compilers) takes 100 ms, later ones 20."""
    time.sleep(0.1 if not calls else 0.02)
    calls.append(time.time())
    np.add(a, b, out=out)


def test_the_references_run_made_ahead_is_not_one_of_its_timings(quick_tuning: Path) -> None:
    spec = TensorSpec.contiguous((N,), "float64")
    job = TrialJob(name="ahead_timing", key="test-ahead-timing", outputs=[2], arg_specs=[spec, spec], out_spec=spec)
    calls: list[float] = []
    ref = ExternChoice(functools.partial(add_slowly, calls), name="add_slowly")
    events: list[Event] = []
    run_trials(dataclasses.replace(job, keep_inputs=True, ahead=True), [], ref, events.append)
    assert len(calls) == 1
    with config.patch(autotune_min_repeats=2, autotune_bench_time_s=0.003):
        run_trials(job, [ref], ref, events.append)
    record = next(e.record for e in events if isinstance(e, ChoiceResult))
    assert len(calls) == 3  # its check was the run made ahead; then two timed runs
    # Counted, the 100 ms run would have made the median of two runs 60 ms (20 ms sleeps may wake late on a busy host)
    assert record.count == 2 and record.time("median") < 45, (record.median_ms, record.count)
