"""Choices checked and timed while others still compile (tune/streamed.py, `autotune.stream`): parts sent to the
benchmark worker as builds end, the inputs made once for all of them, failures recorded once, contenders timed
fully among the whole selection by its last job. Real compiler, real worker; the GPU's own case is marked gpu."""

from __future__ import annotations

import dataclasses
import functools
import os
import threading
from collections import Counter
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tuneforge
from tuneforge import config
from tuneforge.errors import NoValidChoicesError
from tuneforge.store.records import Record
from tuneforge.tune import streamed
from tuneforge.tune.choices import ExternChoice
from tuneforge.tune.job import TrialJob
from tuneforge.tune.measure import measure
from tuneforge.tune.ranking import ranked
from tuneforge.tune.select import select_detailed
from tuneforge.tune.specs import TensorSpec

from . import tuning_kernels as k
from .conftest import cuda_torch

N = 256


def stamped_add(stamps: str, fail: bool, a: Any, b: Any, out: Any) -> None:
    """The reference: adds (or raises, `fail`), after writing its process to `stamps`."""
    with open(stamps, "a") as f:
        f.write(f"{os.getpid()}\n")
    if fail:
        raise ValueError("the reference is broken")
    np.add(a, b, out=out)


def reference(stamps: Path, fail: bool = False) -> ExternChoice:
    return ExternChoice(functools.partial(stamped_add, str(stamps), fail), name="stamped_add")


def reference_runs(stamps: Path) -> int:
    return len(stamps.read_text().splitlines()) if stamps.exists() else 0


def labelled(bodies: list[tuple[str, str]]) -> list[Any]:
    """Choices of the test template, one per (label, body name): a label of its own makes a build of its own."""
    return k.CRASH_TEMPLATE.choices([{"BODY": k.BAD_BODIES[body], "LABEL": label} for label, body in bodies])


def job(name: str) -> TrialJob:
    spec = TensorSpec.contiguous((N,), "float64")
    return TrialJob(name=name, key=f"test-{name}", outputs=[2], arg_specs=[spec, spec], out_spec=spec)


class Gate:
    """A slow build's end, given by the test once `wanted` records have arrived (or by a timer after TIMEOUT_S,
    which a test then fails on: the records waited for the build)."""

    TIMEOUT_S = 30.0

    def __init__(self, wanted: int) -> None:
        self.future: Future[Any] = Future()
        self.wanted, self.timed_out = wanted, False
        self.records: list[Record] = []
        self._timer = threading.Timer(self.TIMEOUT_S, self._expire)
        self._timer.start()

    def choice(self, label: str) -> k.GatedBuild:
        return k.GatedBuild(k.add_configured, {"label": label}, self.future)

    def on_record(self, r: Record) -> None:
        self.records.append(r)
        if len(self.records) >= self.wanted and not self.future.done():
            self.future.set_result(None)

    def _expire(self) -> None:
        self.timed_out = not self.future.done()
        if self.timed_out:
            self.future.set_result(None)

    def close(self) -> None:
        self._timer.cancel()


def test_choices_built_early_are_timed_while_a_slow_one_compiles(quick_tuning: Path, tmp_path: Path) -> None:
    stamps = tmp_path / "reference.txt"
    early = labelled([("early", "good"), ("early_slow", "good_slow")])  # compiled by g++
    gate = Gate(wanted=2)  # the slow build ends once both early choices have their records
    slow = gate.choice("late")
    try:
        with config.patch(autotune_stream="on"):
            outcome = measure(job("streamed"), [slow, *early], reference(stamps), on_record=gate.on_record)
    finally:
        gate.close()
    assert not gate.timed_out, "the early choices waited for the slow build"
    assert {r.choice_name: r.status for r in outcome.records} == {c.name: "ok" for c in [slow, *early]}
    assert {r.choice_name for r in gate.records[:2]} == {c.name for c in early}  # before the slow one built
    assert outcome.streamed == 2 and outcome.isolated
    # The last job gave the parts' records back: none was recorded (stored) twice.
    assert len(gate.records) == len({(r.choice, r.median_ms, r.method) for r in gate.records})
    assert reference_runs(stamps) == 1  # the inputs and the reference's outputs, made once for every job


def test_the_selections_contenders_are_timed_fully_by_its_last_job(quick_tuning: Path, tmp_path: Path) -> None:
    # 11 choices: screened (screening.SCREEN_ABOVE), though each part holds fewer
    compiled = labelled([*((f"good{i}", "good") for i in range(9)), ("lagging", "good_slow")])
    gate = Gate(wanted=len(compiled))
    choices = [gate.choice("late"), *compiled]
    try:
        with config.patch(autotune_stream="on"):
            outcome = measure(job("streamed_screened"), choices, reference(tmp_path / "reference.txt"),
                              on_record=gate.on_record)
    finally:
        gate.close()
    assert not gate.timed_out and outcome.streamed == len(compiled)
    final = {r.choice: r for r in outcome.records}  # the latest record of each choice
    pick = ranked(choices, final, "median")[0][0]
    assert "+screened" not in final[pick.hash_key].method  # timed fully, once the builds were done
    lagging = final[compiled[-1].hash_key]
    assert lagging.status == "ok" and "+screened" in lagging.method  # ~60 times slower: no contender
    assert reference_runs(tmp_path / "reference.txt") == 1


def test_a_choice_that_fails_in_a_part_is_recorded_once_and_not_run_again(quick_tuning: Path,
                                                                           tmp_path: Path) -> None:
    stamps = tmp_path / "reference.txt"
    choices = labelled([("wrong", "wrong"), ("crash", "segfault"), ("fine", "good")])
    gate = Gate(wanted=3)
    try:
        with config.patch(autotune_stream="on"):
            outcome = measure(job("streamed_failures"), [gate.choice("late"), *choices], reference(stamps),
                              on_record=gate.on_record)
    finally:
        gate.close()
    assert not gate.timed_out
    statuses = {r.choice_name: r.status for r in outcome.records}
    assert statuses == {"add_configured[label=late]": "ok", choices[0].name: "wrong_result",
                        choices[1].name: "crash", choices[2].name: "ok"}
    assert outcome.streamed == 3
    # Each failure once: the last job ran neither again (a second crash would be a second record).
    counts = Counter(r.choice_name for r in gate.records)
    assert counts[choices[0].name] == counts[choices[1].name] == 1
    # Ahead of the builds, then in the worker started after the crash (the crashed one's kept inputs are gone).
    assert reference_runs(stamps) == 2


def test_a_reference_that_fails_in_a_part_fails_the_selection(quick_tuning: Path, tmp_path: Path) -> None:
    stamps = tmp_path / "reference.txt"
    choices = labelled([("slow", "slow_build"), ("fine", "good")])
    with config.patch(autotune_stream="on"), pytest.raises(NoValidChoicesError) as info:
        measure(job("streamed_bad_reference"), choices, reference(stamps, fail=True))
    assert "the reference stamped_add" in str(info.value)
    assert "ValueError: the reference is broken" in info.value.reasons["stamped_add"]
    # Ahead of the builds, then in the first part (where the slow build ended first: the last job); no part after.
    assert reference_runs(stamps) == 2


def test_streaming_is_for_gpu_jobs_unless_set(quick_tuning: Path) -> None:
    pending: Future[Any] = Future()
    done: Future[Any] = Future()
    done.set_result(None)
    cpu_job = job("wanted")
    assert not streamed.wanted(cpu_job, [pending, done])  # "auto": kernels timed beside compilers on a CPU
    with config.patch(autotune_stream="on"):
        assert streamed.wanted(cpu_job, [pending, done])
        assert not streamed.wanted(cpu_job, [done])  # nothing left to overlap
    with config.patch(autotune_stream="off"):
        assert not streamed.wanted(cpu_job, [pending])
    with pytest.raises(tuneforge.ConfigError, match="autotune.stream"), config.patch(autotune_stream="sometimes"):
        config.get_str("autotune.stream")


@pytest.mark.gpu
def test_a_gpu_selection_times_cublas_and_the_first_kernels_while_the_rest_compile(quick_tuning: Path) -> None:
    torch = cuda_torch()
    from tuneforge.kernels.gemm_gpu.op import device_limits, gpu_choices
    from tuneforge.kernels.gemm_gpu.render import Epilogue

    m, n, kk = 448, 576, 320  # a shape of its own: Triton's cache holds no kernel of it (static shapes)
    candidates = gpu_choices(m, n, kk, "float16", Epilogue(), device_limits(0))
    assert len(candidates) > 9  # cuBLAS and the default space: screened
    a, b = (torch.randn(rows, cols, device="cuda", dtype=torch.float16) for rows, cols in ((m, kk), (kk, n)))
    out = torch.empty(m, n, device="cuda", dtype=torch.float16)
    assert tuneforge.prepare("cuda", wait=True)
    s = select_detailed("streamed_gpu", candidates, [a, b, 1.0, 0.0, None], out=out)  # "auto": on for a GPU
    assert s.report.isolated and s.report.extra.get("streamed", 0) >= 1
    assert "+screened" not in s.records[s.choice.hash_key].method
    assert any("+screened" in r.method for r in s.records.values() if r.status == "ok")
    torch.testing.assert_close(s.choice(a, b, 1.0, 0.0, None, out), a @ b, rtol=2e-2, atol=2e-2)


def test_gpu_choices_are_screened_among_the_whole_selection() -> None:
    from tuneforge.tune.screening import SCREEN_REPEATS, SCREEN_SHARE, gpu_screening, screen_budget

    spec = TensorSpec.contiguous((N,), "float16", device="cuda", device_index=0)  # a spec: no GPU needed
    gpu = TrialJob(name="screen", key="test-screen", outputs=[2], arg_specs=[spec, spec], out_spec=spec)
    assert gpu.device == "cuda:0"
    brief = SCREEN_SHARE * config.get_float("cuda.bench_time_s")
    assert screen_budget(gpu, 17) == pytest.approx(brief)  # the GEMM's default space and cuBLAS
    assert screen_budget(gpu, 8) is None  # few: each timed fully
    part = dataclasses.replace(gpu, part=True, screen_among=17)
    assert screen_budget(part, 3) == pytest.approx(brief)  # three built so far, of seventeen
    assert screen_budget(dataclasses.replace(gpu, screen_among=5), 3) is None
    with config.patch(autotune_screen_ratio=0.0):
        assert screen_budget(part, 3) is None
    # the CPU's brief budget shrinks with the crowd; the GPU's keeps a hundred runs of a microsecond kernel
    assert screen_budget(job("screen_cpu"), 64) == pytest.approx(
        SCREEN_SHARE * config.get_float("autotune.bench_time_s") / 2)
    assert gpu_screening(None) == (None, None)  # a full timing: the settings' own
    warmup_s, repeats = gpu_screening(brief)
    assert warmup_s == pytest.approx(SCREEN_SHARE * config.get_float("autotune.warmup_s")) and repeats == SCREEN_REPEATS
