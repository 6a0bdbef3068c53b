"""The measuring side of a Ray cluster: one actor per host (or per node, or per GPU) runs one job at a time.

An actor runs a job's whole selection where it lives, exactly as `tuneforge tune` would there: records first,
else its builds (from the node's store, or fetched from the shared tier where the build phase put them), then
the measurements in the node's isolated benchmark worker. One job at a time per actor, and one actor per host
by default, so no two measurements share cores (nodes of one host, as a test cluster's several raylets on
127.0.0.1, would); per node when the nodes are separate machines, or to simulate them.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping
from dataclasses import field
from typing import Any

import ray

from tuneforge.cpuinfo import BLAS_THREAD_VARIABLES
from tuneforge.dataclass_lite import dataclass
from tuneforge.kernels.jobs import ShapeJob
from tuneforge.store.record import Record


@dataclass
class JobResult:
    """How one job ended on the cluster: its pick (None when it failed) and every record its selection made."""

    job: ShapeJob
    fingerprint: str
    node_id: str = ""
    host: str = ""
    choice: str | None = None  # the pick's name
    params: dict[str, Any] = field(default_factory=dict)
    median_ms: float | None = None
    source: str = ""  # where the decision came from: "benchmark", "records", "remote", ...
    records: list[Record] = field(default_factory=list)
    error: str | None = None
    attempts: int = 1
    seconds: float = 0.0  # the selection's time on the actor

    @property
    def ok(self) -> bool:
        return self.error is None


# The variables that size a library's thread pool when it loads (OpenBLAS's, then MKL's; torch reads OMP_NUM_THREADS).
# Ray sets OMP_NUM_THREADS in every worker to the CPUs it reserved, 1 for an actor that reserves none: measured
# under it, numpy's OpenBLAS ran one thread beside two-thread kernels, and its record (keyed by that thread count,
# cpuinfo.blas_threads) never answered a user's process on the same machine.
THREAD_VARIABLES = (*BLAS_THREAD_VARIABLES, "MKL_NUM_THREADS")


def thread_environment() -> dict[str, str | None]:
    """This process's thread-count variables (None: not set), for the measuring actors to take over."""
    return {name: os.environ.get(name) for name in THREAD_VARIABLES}


def apply_thread_environment(values: Mapping[str, str | None]) -> None:
    """Set (or, for None, remove) each of these variables in this process's environment."""
    for name, value in values.items():
        if name not in THREAD_VARIABLES:
            raise ValueError(f"{name} is not a thread-count variable ({', '.join(THREAD_VARIABLES)})")
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


@ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)
class BenchActor:
    """Runs jobs' selections, one at a time, on the node it was placed on, with the driver's thread-count variables
    (`threads`, from thread_environment) in place of Ray's: its benchmark worker, started after, runs the
    libraries as a process of the driver's would there. Libraries the actor process loaded itself keep Ray's
    count, so the measurements need the isolated worker (autotune.isolate, on by default)."""

    def __init__(self, threads: Mapping[str, str | None]) -> None:
        apply_thread_environment(threads)

    def where(self) -> tuple[str, str, int]:
        return ray.get_runtime_context().get_node_id(), socket.gethostname(), os.getpid()

    def run(self, job: ShapeJob, fingerprint: str, settings: dict[str, Any], force: bool) -> JobResult:
        from tuneforge import config
        from tuneforge.kernels.jobs import run_job
        from tuneforge.store.remote_registry import flush_all
        from tuneforge.supervisor import applied_settings
        from tuneforge.tune.fingerprint import system_fingerprint

        node_id, host, _ = self.where()
        result = JobResult(job, fingerprint, node_id, host)
        started = time.perf_counter()
        with applied_settings(settings), config.patch(autotune_verbose=False,
                                                      autotune_force=force or config.get_bool("autotune.force")):
            here = system_fingerprint()["hash"]
            if here != fingerprint:  # never answer for another machine
                result.error = f"node {node_id} has fingerprint {here}, not {fingerprint}"
                return result
            try:
                selection = run_job(job)
            except Exception as exc:  # the job's own failure (no valid choice, say): reported, the actor lives on
                result.error = f"{type(exc).__name__}: {exc}"
                return result
            finally:
                flush_all()  # its records are in the shared tier before the driver hears of them
        record = selection.records.get(selection.choice.hash_key)
        result.choice, result.params = selection.choice.name, dict(selection.choice.params)
        result.median_ms = record.median_ms if record is not None else None
        result.source = str(selection.source)
        result.records = list(selection.records.values())
        result.seconds = time.perf_counter() - started
        return result
