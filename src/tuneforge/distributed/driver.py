"""tune_many: many jobs on a Ray cluster, in two phases per fingerprint group.

1. Builds: every distinct build of every job's candidates, as Ray tasks spread over the group's nodes
   (`RayBuilds`); artifacts go to each node's store and the shared tier.
2. Measurements: one `BenchActor` per host of the group (`per="node"`: per node; CUDA jobs: per GPU), each
   running one job's selection at a time; jobs are handed to whichever actor of their device is free.

The phases do not overlap, so no build ever shares cores with a measurement. A job whose actor dies (its node
killed) is handed to another actor of the group, at most `retries` more times; the others go on. Ctrl-C
cancels the builds and kills the actors, then re-raises. Every record a job made is returned and written to
this process's record database; with a remote tier configured the nodes have shared them there already.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import ray

from tuneforge.dataclass_lite import dataclass
from tuneforge.distributed.bench import BenchActor, JobResult, thread_environment
from tuneforge.distributed.builds import RayBuilds, planned_builds
from tuneforge.distributed.cluster import Node, connect, groups, pinned, survey
from tuneforge.kernels.jobs import ShapeJob
from tuneforge.supervisor import settings_snapshot

log = logging.getLogger("tuneforge.distributed")

# Settings that name this machine's own things: the nodes keep theirs.
LOCAL_SETTINGS = ("cache_dir",)


@dataclass
class Phases:
    """What one tune_many did, for reports and the benchmark: counts and seconds."""

    nodes: int = 0
    groups: int = 0
    builds: int = 0
    builds_lost: int = 0
    build_s: float = 0.0
    measure_s: float = 0.0
    jobs_retried: int = 0
    builds_by_node: dict[str, int] | None = None


def shipped_settings() -> dict[str, Any]:
    """This process's settings as the nodes apply them: all but the machine-local ones."""
    return {name: value for name, value in settings_snapshot().items() if name not in LOCAL_SETTINGS}


def tune_many(jobs: Iterable[ShapeJob], address: str | None = None, *, fingerprints: Sequence[str] | None = None,
              per: Literal["host", "node"] = "host", retries: int = 2, force: bool = False,
              phases: Phases | None = None) -> list[JobResult]:
    """Tune every job on the Ray cluster at `address` (see the module), once per fingerprint group of its nodes
    (`fingerprints`: only those). Returns one JobResult per (job, group), failures included; the records are also
    written to this process's record database."""
    from tuneforge.store.default import default_records

    jobs = list(jobs)
    if per not in ("host", "node"):
        raise ValueError(f"per must be 'host' or 'node', not {per!r}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"retries must be a non-negative integer, not {retries!r}")
    phases = phases if phases is not None else Phases()
    connect(address)
    settings = shipped_settings()
    nodes = survey(settings)
    found = groups(nodes)
    if fingerprints is not None:
        unknown = sorted(set(fingerprints) - set(found))
        if unknown:
            raise ValueError(f"no live node has fingerprint {', '.join(unknown)}; the cluster's: "
                             f"{', '.join(sorted(found)) or 'none'}")
        found = {fp: members for fp, members in found.items() if fp in fingerprints}
    if not found:
        raise RuntimeError("no node of the Ray cluster can run tuneforge (see the warnings above)")
    phases.nodes, phases.groups = len(nodes), len(found)
    started = time.perf_counter()
    for members in found.values():
        _build_phase(jobs, members, settings, retries, phases)
    phases.build_s = time.perf_counter() - started
    started = time.perf_counter()
    results: list[JobResult] = []
    for fingerprint, members in found.items():
        results += _measure_phase(jobs, fingerprint, members, settings, per, retries, force, phases)
    phases.measure_s = time.perf_counter() - started
    default_records().put_many(r for result in results for r in result.records)
    return results


def _build_phase(jobs: list[ShapeJob], nodes: list[Node], settings: dict[str, Any], retries: int,
                 phases: Phases) -> None:
    """The CPU jobs' builds as Ray tasks. CUDA jobs build on their GPU actor (Triton and nvcc compile for the
    GPU they run on, which a CPU task cannot see)."""
    cpu_jobs = [job for job in jobs if job.device == "cpu"]
    if not cpu_jobs:
        return
    builds = RayBuilds(nodes, settings, retries=retries)
    for label, build in planned_builds(cpu_jobs, nodes, settings):
        builds.submit(build, label=label)
    builds.wait()
    phases.builds += builds.submitted
    phases.builds_lost += builds.lost
    by_node = phases.builds_by_node if phases.builds_by_node is not None else {}
    for node, count in builds.where.items():
        by_node[node] = by_node.get(node, 0) + count
    phases.builds_by_node = by_node


def _actors(nodes: list[Node], per: str, device: str) -> list[Any]:
    """The measuring actors of a group for one device: per host (or node) on the CPU; per GPU for CUDA jobs, each
    seeing its GPU alone (Ray sets CUDA_VISIBLE_DEVICES for an actor that asks for one)."""
    threads = thread_environment()
    if device == "cuda":
        return [BenchActor.options(scheduling_strategy=pinned(node.node_id), num_gpus=1)  # type: ignore
                .remote(threads) for node in nodes for _ in range(int(node.gpus))]
    if per == "host":
        first: dict[str, Node] = {}
        for node in nodes:
            first.setdefault(node.host, node)
        nodes = list(first.values())
    return [BenchActor.options(scheduling_strategy=pinned(node.node_id)).remote(threads)  # type: ignore[attr-defined]
            for node in nodes]


def _measure_phase(jobs: list[ShapeJob], fingerprint: str, nodes: list[Node], settings: dict[str, Any], per: str,
                   retries: int, force: bool, phases: Phases) -> list[JobResult]:
    devices = sorted({job.device for job in jobs})
    actors = {device: _actors(nodes, per, device) for device in devices}
    order = {id(job): i for i, job in enumerate(jobs)}
    waiting = {device: deque((job, 1) for job in jobs if job.device == device) for device in devices}
    running: dict[ray.ObjectRef[Any], tuple[Any, ShapeJob, int]] = {}
    idle = {device: list(pool) for device, pool in actors.items()}
    results: list[JobResult] = []
    try:
        while any(waiting.values()) or running:
            for device, queue in waiting.items():
                while queue and idle[device]:
                    actor = idle[device].pop()
                    job, attempt = queue.popleft()
                    running[actor.run.remote(job, fingerprint, settings, force)] = (actor, job, attempt)
                if queue and not any(job.device == device for _, job, _ in running.values()):
                    # jobs left, no actor: the group has no GPU, or every measuring node of it is gone
                    what = "GPU" if device == "cuda" and not actors[device] else "live node"
                    results += [JobResult(job, fingerprint, error=f"no {what} of fingerprint {fingerprint} left "
                                          "to measure on", attempts=attempt - 1) for job, attempt in queue]
                    queue.clear()
            if not running:
                break
            done, _ = ray.wait(list(running), num_returns=1, timeout=1.0)
            for ref in done:
                actor, job, attempt = running.pop(ref)
                try:
                    result: JobResult = ray.get(ref)
                except ray.exceptions.RayError as exc:  # the actor (or its node) died: not the job's fault
                    ray.kill(actor, no_restart=True)
                    if attempt > retries:
                        results.append(JobResult(job, fingerprint, error=f"lost {attempt} times; last: "
                                                 f"{type(exc).__name__}: {exc}", attempts=attempt))
                    else:
                        log.warning("%s lost with its actor (%s): handed to another", job.label, type(exc).__name__)
                        phases.jobs_retried += 1
                        waiting[job.device].appendleft((job, attempt + 1))
                    continue
                result.job, result.attempts = job, attempt  # the driver's own job object (results keep its order)
                results.append(result)
                idle[job.device].append(actor)
    finally:  # Ctrl-C included: killing the actors stops their jobs (and their benchmark workers die with them)
        for pool in actors.values():
            for actor in pool:
                ray.kill(actor, no_restart=True)
    return sorted(results, key=lambda r: order[id(r.job)])
