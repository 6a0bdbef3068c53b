"""Where a set of trials runs: the job's device, the benchmark worker of that device, and the CUDA errors
after which that worker cannot go on.

A job runs on "cpu" or on one GPU, "cuda:N" (torch's numbering in this process). Trials of a GPU job run
in a worker of their own per GPU, started with ``CUDA_VISIBLE_DEVICES`` naming that GPU alone, so inside
it the job's tensors live on "cuda:0" (TrialJob.for_worker). Records name no device: nothing is mapped back.

Some CUDA errors are sticky: after an illegal memory access, a launch failure or a device-side assert,
every later call in that CUDA context fails too. A choice that causes one is recorded as
``runtime_error``; the process it ran in must not run another choice (`DeviceContextLost`). The errors
are told apart by their text (`is_sticky_cuda_error`), as torch, Triton and the driver API word them.

Imported by job.py, which a selection answered from records loads: nothing heavy here (no torch).
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from tuneforge.errors import TuneforgeError
from tuneforge.tune.specs import TensorSpec

__all__ = ["STICKY_CUDA_ERRORS", "DeviceContextLost", "cuda_index", "current_cuda_device", "is_sticky_cuda_error",
           "job_device", "on_visible_gpu", "worker_env"]

# The driver's names (cuda-python, tuneforge.cuda's CudaError: "cuLaunchKernel failed: CUDA_ERROR_...") and
# the runtime's descriptions (torch: "CUDA error: <description>"; Triton: "Triton Error [CUDA]: <description>")
# of the errors that leave a CUDA context unusable. Not CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES or out of memory:
# the context survives those, and the choice is simply a failure.
STICKY_CUDA_ERRORS: tuple[tuple[str, str], ...] = (
    ("CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"),
    ("CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"),
    ("CUDA_ERROR_MISALIGNED_ADDRESS", "misaligned address"),
    ("CUDA_ERROR_ASSERT", "device-side assert triggered"),
    ("CUDA_ERROR_ILLEGAL_INSTRUCTION", "an illegal instruction was encountered"),
    ("CUDA_ERROR_INVALID_PC", "invalid program counter"),
    ("CUDA_ERROR_INVALID_ADDRESS_SPACE", "operation not supported on global/shared address space"),
    ("CUDA_ERROR_HARDWARE_STACK_ERROR", "hardware stack error"),
    ("CUDA_ERROR_LAUNCH_TIMEOUT", "the launch timed out and was terminated"),
    ("CUDA_ERROR_ECC_UNCORRECTABLE", "uncorrectable ecc error encountered"),
    ("CUDA_ERROR_NVLINK_UNCORRECTABLE", "uncorrectable nvlink error was detected"),
)


def is_sticky_cuda_error(text: str) -> bool:
    """Whether an error's text names a CUDA error after which its context is unusable.

    A description alone ("misaligned address") counts only next to "CUDA" (torch's and Triton's prefixes
    say it), so a CPU kernel's own message that happens to use those words is not one.
    """
    if any(name in text for name, _ in STICKY_CUDA_ERRORS):
        return True
    lowered = text.lower()
    return "cuda" in lowered and any(description in lowered for _, description in STICKY_CUDA_ERRORS)


class DeviceContextLost(TuneforgeError, RuntimeError):
    """A trial left the CUDA context of this process unusable: nothing more can run in it.

    `resume_at`: the index (among the choices of the run) of the first choice not run; the failed
    one already has its ``runtime_error`` record. `verify_s`, `bench_s`: the time spent until then.
    """

    def __init__(self, culprit: str, error: str, resume_at: int, total: int, *, verify_s: float = 0.0,
                 bench_s: float = 0.0) -> None:
        left, first_line = total - resume_at, error.partition("\n")[0]
        super().__init__(f"{culprit} left the CUDA context unusable ({first_line}); "
                         f"{left} remaining choice{'' if left == 1 else 's'} not run. Every later CUDA call in "
                         "this process fails: restart it. With autotune.isolate on, such a choice runs in a "
                         "benchmark worker and costs only itself")
        self.culprit, self.error, self.resume_at = culprit, error, resume_at
        self.verify_s, self.bench_s = verify_s, bench_s


def device_sync(device: str) -> Callable[[], None]:
    """Wait for the work queued on `device` (a no-op on the CPU): a kernel's error surfaces here."""
    if device == "cpu":
        return lambda: None
    import torch

    return functools.partial(torch.cuda.synchronize, device)


def current_cuda_device() -> int:
    """torch's current device where CUDA is already initialised here; else 0, which it would be."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        return int(torch.cuda.current_device())
    return 0


def _where(value: Any) -> tuple[str, int | None] | None:
    """(device type, index) of a spec or a torch tensor; None for anything else (scalars, numpy arrays)."""
    if isinstance(value, TensorSpec):
        return value.device, value.device_index
    if type(value).__module__.startswith("torch") and hasattr(value, "device") and hasattr(value, "data_ptr"):
        return str(value.device.type), value.device.index
    return None


def job_device(values: Iterable[Any]) -> str:
    """"cpu", or "cuda:N" for the GPU that the specs or tensors in `values` are on.

    A spec without an index is on torch's current device. Arguments on two GPUs, or on a device type
    other than the CPU and CUDA, are an error: one job is timed on one device.
    """
    found: dict[str, str] = {}  # device -> the first argument on it, for the error
    for position, value in enumerate(values):
        where = _where(value)
        if where is None or where[0] == "cpu":
            continue
        kind, index = where
        if kind.startswith("cuda:") and kind[5:].isdigit() and index is None:  # TensorSpec(device="cuda:1")
            kind, index = "cuda", int(kind[5:])
        if kind != "cuda":
            raise ValueError(f"argument {position} is on device {kind!r}: tuneforge times choices on the CPU "
                             "and on CUDA GPUs only")
        device = f"cuda:{current_cuda_device() if index is None else index}"
        found.setdefault(device, f"argument {position}")
    if len(found) > 1:
        raise ValueError("the arguments of one selection are on different GPUs (" +
                         ", ".join(f"{arg} on {device}" for device, arg in found.items()) +
                         "): a choice is timed on one GPU; move them to one device")
    return next(iter(found), "cpu")


def cuda_index(device: str) -> int | None:
    """N of "cuda:N"; None for "cpu"."""
    if device == "cpu":
        return None
    kind, _, index = device.partition(":")
    if kind != "cuda" or not index.isdigit():
        raise ValueError(f"not a trial device: {device!r} (expected 'cpu' or 'cuda:N')")
    return int(index)


def worker_env(device: str, base: Mapping[str, str]) -> dict[str, str]:
    """The environment of the benchmark worker for `device`, from this process's `base` environment.

    A GPU's worker sees that GPU alone: ``CUDA_VISIBLE_DEVICES`` names it, by its entry in this process's
    own ``CUDA_VISIBLE_DEVICES`` when that is set (torch's "cuda:1" under "4,5" is GPU 5), else by index.
    """
    env = {**base, "PYTHONUNBUFFERED": "1"}
    index = cuda_index(device)
    if index is None:
        return env
    visible = base.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        env["CUDA_VISIBLE_DEVICES"] = str(index)
        return env
    entries = [entry.strip() for entry in visible.split(",") if entry.strip()]
    if index >= len(entries):
        raise ValueError(f"{device} is not one of the GPUs this process sees (CUDA_VISIBLE_DEVICES={visible!r})")
    env["CUDA_VISIBLE_DEVICES"] = entries[index]
    return env


def on_visible_gpu(value: Any) -> Any:
    """A GPU's spec as that GPU's worker sees it: on "cuda:0", the one GPU it is shown. Anything else as is."""
    if isinstance(value, TensorSpec) and value.device.startswith("cuda"):
        return dataclasses.replace(value, device="cuda", device_index=0)
    return value
