"""Device-aware trials (issue 12, item 4): a job's device, one benchmark worker per GPU, and a sticky CUDA
error that costs its choice only.

Without a GPU: the device of a job from its specs, the job a GPU's worker receives, the environment that
worker is started with, and the sticky-error path end to end through real CPU workers (a choice that
raises torch's text of an illegal memory access), proved by the worker's process id. The real CUDA job
in its GPU's worker is marked gpu.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tuneforge.store.records import Record
from tuneforge.tune import runner
from tuneforge.tune.choices import Choice, ExternChoice
from tuneforge.tune.device import DeviceContextLost, is_sticky_cuda_error, job_device, worker_env
from tuneforge.tune.events import ChoiceResult, ChoiceStarted, Event
from tuneforge.tune.job import TrialJob, reference_failure
from tuneforge.tune.specs import TensorSpec
from tuneforge.tune.trials import run_trials
from tuneforge.tune.worker_process import WorkerProcess

from .conftest import cuda_torch

ILLEGAL_ACCESS = ("CUDA error: an illegal memory access was encountered\nCUDA kernel errors might be "
                  "asynchronously reported at some other API call, so the stacktrace below might be incorrect.")


def cpu(n: int = 64) -> TensorSpec:
    return TensorSpec.contiguous((n,), "float64")


def gpu(index: int | None, n: int = 64, dtype: str = "float32") -> TensorSpec:
    return TensorSpec.contiguous((n,), dtype, device="cuda", device_index=index)


def job_of(*specs: TensorSpec, name: str = "add") -> TrialJob:
    *inputs, out = specs
    return TrialJob(name=name, key=f"test-{name}", outputs=[len(inputs)], arg_specs=list(inputs), out_spec=out,
                    inputs_text="described here")


# --- the device of a job ---------------------------------------------------------------------------------


def test_a_jobs_device_comes_from_its_first_spec_off_the_cpu() -> None:
    assert job_of(cpu(), cpu(), cpu()).device == "cpu"
    assert job_of(cpu(), gpu(1), gpu(1)).device == "cuda:1"
    assert job_of(gpu(None), gpu(None), gpu(0)).device == "cuda:0"  # no index: torch's current device, 0 here
    assert job_device([3, "text", None, np.ones(2)]) == "cpu"  # scalars and arrays carry no device
    assert job_device([TensorSpec.contiguous((2,), "float32", device="cuda:2")]) == "cuda:2"


def test_arguments_on_two_gpus_are_an_error_when_the_job_is_made() -> None:
    with pytest.raises(ValueError, match=r"different GPUs \(argument 1 on cuda:0, argument 2 on cuda:1\)"):
        job_of(cpu(), gpu(0), gpu(1))
    with pytest.raises(ValueError, match="'mps'"):
        job_of(cpu(), TensorSpec.contiguous((4,), "float32", device="mps"), cpu())


def test_a_gpus_worker_receives_the_job_on_the_one_gpu_it_sees() -> None:
    job = job_of(gpu(3), cpu(), gpu(3, dtype="float16"))
    sent = job.for_worker()
    assert sent.device == "cuda:0"
    assert [s.device_index for s in sent.arg_specs] == [0, None] and sent.out_spec == gpu(0, dtype="float16")
    assert sent.arg_specs[1] == cpu()  # what is on the CPU stays there
    # What records are made of is the parent's: the key, the inputs' text, the outputs, the tolerances.
    assert (sent.key, sent.inputs_text, sent.outputs, sent.name) == (job.key, job.inputs_text, job.outputs, job.name)
    assert job.device == "cuda:3" and job.arg_specs[0].device_index == 3  # the parent's job is left alone
    plain = job_of(cpu(), cpu(), cpu())
    assert plain.for_worker() is plain  # the CPU worker gets exactly what it got before


def test_a_gpus_worker_sees_that_gpu_alone() -> None:
    base = {"PATH": "/bin", "HOME": "/home/x"}
    assert worker_env("cpu", base) == {**base, "PYTHONUNBUFFERED": "1"}  # as before: nothing hidden or added
    assert worker_env("cpu", {**base, "CUDA_VISIBLE_DEVICES": "2"})["CUDA_VISIBLE_DEVICES"] == "2"
    assert worker_env("cuda:1", base) == {**base, "PYTHONUNBUFFERED": "1", "CUDA_VISIBLE_DEVICES": "1"}
    # This process's own restriction: its cuda:1 is the second GPU it was given.
    assert worker_env("cuda:1", {**base, "CUDA_VISIBLE_DEVICES": "4, 5"})["CUDA_VISIBLE_DEVICES"] == "5"
    assert worker_env("cuda:0", {"CUDA_VISIBLE_DEVICES": "GPU-8a1b,GPU-77c2"})["CUDA_VISIBLE_DEVICES"] == "GPU-8a1b"
    with pytest.raises(ValueError, match="not one of the GPUs this process sees"):
        worker_env("cuda:2", {"CUDA_VISIBLE_DEVICES": "4,5"})


def test_the_started_gpu_worker_has_that_environment(quick_tuning: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Starting a worker touches no GPU: its environment is checked on a machine without one.
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    worker = WorkerProcess("cuda:3")
    try:
        worker.wait_ready()  # started: until its exec is through, /proc shows no environment at all
        environ = Path(f"/proc/{worker.pid}/environ").read_bytes().split(b"\0")
        assert b"CUDA_VISIBLE_DEVICES=3" in environ
    finally:
        worker.kill()


# --- sticky CUDA errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize("text", [
    ILLEGAL_ACCESS,
    "RuntimeError: CUDA error: unspecified launch failure",
    "AcceleratorError: CUDA error: misaligned address\nSearch for `cudaErrorMisalignedAddress'",
    "CUDA error: device-side assert triggered",
    "RuntimeError: Triton Error [CUDA]: an illegal memory access was encountered",
    "cuLaunchKernel failed: CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered",
    "cuCtxSynchronize failed: CUDA_ERROR_LAUNCH_FAILED: unspecified launch failure",
    "CUDA error: an illegal instruction was encountered",
])
def test_errors_that_break_the_cuda_context_are_recognised(text: str) -> None:
    assert is_sticky_cuda_error(text)


@pytest.mark.parametrize("text", [
    "RuntimeError: kernel exploded",
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",  # the context survives it
    "cuLaunchKernel failed: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many resources requested for launch",
    "ValueError: misaligned address in my CPU kernel",  # the words alone, nothing about CUDA
    "",
])
def test_other_errors_are_not_sticky(text: str) -> None:
    assert not is_sticky_cuda_error(text)


# --- end to end, in real CPU workers: the choices note the process they ran in ------------------------------


def add_noting_pid(a: Any, b: Any, out: Any, *, log: str, label: str) -> None:
    with open(log, "a") as f:
        f.write(f"{label} {os.getpid()}\n")
    np.add(a, b, out=out)


def fails_noting_pid(a: Any, b: Any, out: Any, *, log: str, label: str, error: str) -> None:
    with open(log, "a") as f:
        f.write(f"{label} {os.getpid()}\n")
    raise RuntimeError(error)


@pytest.fixture
def fresh_workers(quick_tuning: Path, tmp_path: Path) -> Iterator[Path]:
    """No benchmark worker of an earlier test; none left behind. Yields the file the choices note pids in."""
    runner.shutdown()
    yield tmp_path / "pids.log"
    runner.shutdown()


def three_choices(log: Path, error: str) -> list[Choice]:
    return [ExternChoice(add_noting_pid, "before", log=str(log), label="before"),
            ExternChoice(fails_noting_pid, "failing", log=str(log), label="failing", error=error),
            ExternChoice(add_noting_pid, "after", log=str(log), label="after")]


def pids(log: Path) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {}
    for line in log.read_text().splitlines():
        label, pid = line.split()
        found.setdefault(label, set()).add(int(pid))
    return found


def run_isolated(job: TrialJob, choices: list[Choice], reference: Choice | None = None) -> dict[str, Record]:
    records: list[Record] = []
    runner.run_isolated(job, choices, reference, records.append)
    return {r.choice_name: r for r in records}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_sticky_cuda_error_costs_its_choice_and_a_fresh_worker_runs_the_rest(
        fresh_workers: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="tuneforge.tune"):
        records = run_isolated(job_of(cpu(), cpu(), cpu()), three_choices(fresh_workers, ILLEGAL_ACCESS))
    assert records["before"].status == "ok" and records["after"].status == "ok"
    failed = records["failing"]
    assert failed.status == "runtime_error" and "an illegal memory access was encountered" in failed.error
    ran_in = pids(fresh_workers)
    assert len(ran_in["before"]) == len(ran_in["failing"]) == len(ran_in["after"]) == 1
    assert ran_in["before"] == ran_in["failing"]
    (broken,), (fresh,) = ran_in["failing"], ran_in["after"]
    assert fresh != broken and fresh != os.getpid()  # the next choice did not inherit the broken context
    assert not alive(broken)  # the worker exited and was reaped
    assert runner._workers["cpu"].pid == fresh  # the fresh one is kept for the next selection
    assert "failing left the CUDA context of the benchmark worker unusable" in caplog.text


def test_an_ordinary_error_keeps_the_worker(fresh_workers: Path) -> None:
    records = run_isolated(job_of(cpu(), cpu(), cpu()), three_choices(fresh_workers, "kernel exploded"))
    assert [records[n].status for n in ("before", "failing", "after")] == ["ok", "runtime_error", "ok"]
    assert "kernel exploded" in records["failing"].error
    ran_in = pids(fresh_workers)
    assert ran_in["before"] == ran_in["failing"] == ran_in["after"] == {runner._workers["cpu"].pid}


def test_a_reference_that_breaks_the_context_fails_the_trials_and_retires_its_worker(fresh_workers: Path) -> None:
    reference = ExternChoice(fails_noting_pid, "reference", log=str(fresh_workers), label="reference",
                             error=ILLEGAL_ACCESS)
    choices: list[Choice] = [ExternChoice(add_noting_pid, "only", log=str(fresh_workers), label="only")]
    records = run_isolated(job_of(cpu(), cpu(), cpu()), choices, reference)
    failure = reference_failure(records["only"])
    assert failure is not None and "illegal memory access" in failure[1]  # the selection fails as usual
    (worker,) = pids(fresh_workers)["reference"]
    assert not alive(worker) and "cpu" not in runner._workers  # nothing was left to run: no new worker


def test_in_process_a_sticky_error_stops_the_trials_with_a_clear_error(quick_tuning: Path, tmp_path: Path) -> None:
    events: list[Event] = []
    with pytest.raises(DeviceContextLost, match=r"failing left the CUDA context unusable \(RuntimeError: CUDA "
                                                r"error: an illegal memory access was encountered\); 1 remaining "
                                                r"choice not run\. .*restart it") as info:
        run_trials(job_of(cpu(), cpu(), cpu()), three_choices(tmp_path / "pids.log", ILLEGAL_ACCESS), None,
                   events.append)
    results = {e.index: e.record for e in events if isinstance(e, ChoiceResult)}
    assert results[0].status == "ok" and results[1].status == "runtime_error" and 2 not in results
    assert ChoiceStarted(2) not in events  # the choice after it never ran in the broken context
    assert info.value.resume_at == 2 and "after" not in pids(tmp_path / "pids.log")


# --- on a real GPU ---------------------------------------------------------------------------------------


def torch_add(a: Any, b: Any, out: Any) -> None:
    import torch

    torch.add(a, b, out=out)


def torch_add_twice(a: Any, b: Any, out: Any) -> None:
    import torch

    torch.add(a, b, out=out)
    torch.add(a, b, out=out)


def torch_out_of_bounds(a: Any, b: Any, out: Any) -> None:
    import torch

    beyond = torch.full(a.shape, a.shape[0] + 1000, dtype=torch.long, device=a.device)
    out.copy_(a[beyond] + b)  # a device-side assert: every later call in this context fails


@pytest.mark.gpu
def test_a_cuda_job_is_timed_with_events_in_its_gpus_own_worker(fresh_workers: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    torch = cuda_torch()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    index = torch.cuda.device_count() - 1
    job = job_of(*(gpu(index, n=1 << 20) for _ in range(3)))
    assert job.device == f"cuda:{index}"
    choices: list[Choice] = [ExternChoice(torch_add), ExternChoice(torch_out_of_bounds),
                             ExternChoice(torch_add_twice)]
    records = run_isolated(job, choices, reference=choices[0])
    assert records["torch_add"].status == "ok" and records["torch_add"].method.startswith("cuda-events")
    assert records["torch_out_of_bounds"].status == "runtime_error"
    assert is_sticky_cuda_error(records["torch_out_of_bounds"].error)
    # Run after the assert, in a fresh worker: an inherited context would have failed it.
    assert records["torch_add_twice"].status == "ok" and records["torch_add_twice"].method.startswith("cuda-events")
    worker = runner._workers[f"cuda:{index}"]
    assert f"CUDA_VISIBLE_DEVICES={index}".encode() in Path(f"/proc/{worker.pid}/environ").read_bytes().split(b"\0")
    assert "cpu" not in runner._workers  # a GPU job never used the CPU's worker


def torch_add_again(a: Any, b: Any, out: Any) -> None:
    import torch

    torch.add(a, b, out=out)


@pytest.mark.gpu
def test_a_near_tie_on_a_gpu_is_timed_again_side_by_side(fresh_workers: Path) -> None:
    cuda_torch()
    job = job_of(*(gpu(0, n=1 << 22) for _ in range(3)))
    choices: list[Choice] = [ExternChoice(torch_add), ExternChoice(torch_add_again)]
    records = run_isolated(job, choices, reference=choices[0])
    # The same work twice: a tie, re-timed in paired rounds of CUDA events (a host clock would time launches).
    assert {r.method for r in records.values()} == {"cuda-events+l2flush+paired"}
    sure = [r.info["confidence"] for r in records.values() if "confidence" in r.info]
    assert len(sure) == 1 and sure[0][0]["rounds"] >= 5


@pytest.mark.gpu
def test_a_prepared_gpu_worker_has_its_cuda_context_before_the_first_job(fresh_workers: Path) -> None:
    cuda_torch()
    import tuneforge

    assert tuneforge.prepare("cuda", wait=True) is True
    worker = runner._workers["cuda:0"]
    assert worker.ready
    job = job_of(*(gpu(0, n=1 << 20) for _ in range(3)))
    records = run_isolated(job, [ExternChoice(torch_add)], reference=None)
    assert records["torch_add"].status == "ok" and runner._workers["cuda:0"] is worker  # the prepared one ran it
