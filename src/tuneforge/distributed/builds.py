"""Builds on a Ray cluster: a `Builder` (the seam every choice builds through) whose builds are Ray tasks.

    builds = RayBuilds(group_nodes, settings, retries=2)
    futures = [choice.build(builds) for choice in choices]   # queued
    builds.wait()                                             # sent as Ray tasks; every Future resolved

A build runs on a node of the fingerprint its artifact is for (the compiler and ISA there make its key), in a
Ray task of one CPU that builds a batch of them (up to MAX_BATCH, a few tasks per CPU), nodes taken in turn.
It stores the artifact in that node's store, which shares it with the remote tier (Redis) when one is
configured, flushed before the task returns: a node that measures later fetches it instead of compiling
again. A build that fails (a compile error) fails its Future alone; the builds of a task whose node or worker
died are sent to the next live node of the group, at most `retries` more times. Identical builds (the same
pickled build) are submitted once.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import pickle
from concurrent.futures import Future
from typing import Any

import ray

from tuneforge.dataclass_lite import dataclass
from tuneforge.distributed.cluster import Node, live_nodes, pinned

log = logging.getLogger("tuneforge.distributed")

MAX_BATCH = 8  # builds per Ray task at most: the driver's time per task (about 1 ms) is paid once per batch
TASKS_PER_CPU = 3  # ... and at least this many tasks per CPU of the group, so that a slow batch evens out


@ray.remote(num_cpus=1, max_retries=0)
def _build_batch(builds: list[Any], settings: dict[str, Any]) -> list[Any]:
    """Each build's BuildResult, or the exception it failed with (one failure never fails the others)."""
    from tuneforge.compile.pool_worker import run_task
    from tuneforge.store.remote_registry import flush_all
    from tuneforge.supervisor import applied_settings

    with applied_settings(settings):
        outcomes = [run_task(build, settings) for build in builds]
        flush_all()  # the artifacts are in the shared tier before anyone is told they are built
    return outcomes


class _Collected:
    """A Builder that keeps what choices submit instead of building it (a plan of the builds)."""

    def __init__(self) -> None:
        self.builds: list[tuple[str, Any]] = []

    def submit(self, build: Any, *, label: str = "") -> Future[Any]:
        self.builds.append((label, build))
        done: Future[Any] = Future()
        done.set_result(None)
        return done


@ray.remote(num_cpus=0, max_retries=0)
def _plan(jobs: list[Any], settings: dict[str, Any]) -> list[tuple[str, Any]]:
    from tuneforge.kernels.jobs import tuning_problem
    from tuneforge.supervisor import applied_settings

    collected = _Collected()
    with applied_settings(settings):
        for job in jobs:
            for choice in tuning_problem(job).choices:
                if choice.is_native:
                    choice.build(collected)
    return collected.builds


def planned_builds(jobs: list[Any], nodes: list[Node], settings: dict[str, Any]) -> list[tuple[str, Any]]:
    """(label, build) of every native candidate of `jobs`, as a node of the group makes them: the candidates
    depend on the machine (its ISA, caches and cores), so the driver's own would not do. The next node is
    asked when one dies."""
    last: BaseException | None = None
    for node in nodes:
        try:
            found: list[tuple[str, Any]] = ray.get(_plan.options(scheduling_strategy=pinned(node.node_id)).remote(
                jobs, settings))
            return found
        except ray.exceptions.RayTaskError as exc:  # the jobs' own problem (a bad job): the same on every node
            raise _cause(exc) from None
        except ray.exceptions.RayError as exc:
            last = exc
    raise RuntimeError(f"no node of the group could plan the builds: {last}")


@dataclass
class _Build:
    future: Future[Any]
    build: Any
    label: str
    attempt: int = 0


@dataclass
class _InFlight:
    builds: list[_Build]
    node: Node


class RayBuilds:
    """Builds as Ray tasks on `nodes` (one fingerprint group); see the module."""

    def __init__(self, nodes: list[Node], settings: dict[str, Any], *, retries: int = 2,
                 max_batch: int = MAX_BATCH) -> None:
        if not nodes:
            raise ValueError("RayBuilds needs at least one node")
        self._nodes = list(nodes)
        self._turn = itertools.cycle(range(len(self._nodes)))
        self._settings = settings
        self._retries = retries
        self._max_batch = max_batch
        self._queued: list[_Build] = []
        self._in_flight: dict[ray.ObjectRef[Any], _InFlight] = {}
        self._by_content: dict[str, Future[Any]] = {}
        self.submitted = 0
        self.tasks = 0  # Ray tasks sent (a task builds a batch)
        self.lost = 0  # builds sent again after their node or worker died
        self.where: dict[str, int] = {}  # node id -> builds it finished

    def submit(self, build: Any, *, label: str = "") -> Future[Any]:
        """Queue `build` (sent by wait()); the same build submitted again gets the same Future."""
        content = hashlib.sha256(pickle.dumps(build)).hexdigest()
        future = self._by_content.get(content)
        if future is None:
            future = self._by_content[content] = Future()
            self._queued.append(_Build(future, build, label or content[:12]))
            self.submitted += 1
        return future

    def _next_node(self) -> Node:
        return self._nodes[next(self._turn) % len(self._nodes)]

    def _send_queued(self) -> None:
        """Batches of the queued builds, each a task: a few per CPU of the group (so that the nodes even out),
        at most max_batch builds each (so that the driver's own time per task does not bound a large cluster)."""
        queued, self._queued = self._queued, []
        cpus = max(1.0, sum(n.cpus for n in self._nodes))
        size = max(1, min(self._max_batch, int(len(queued) / (TASKS_PER_CPU * cpus))))
        for start in range(0, len(queued), size):
            self._send(queued[start:start + size], self._next_node())

    def _send(self, builds: list[_Build], node: Node) -> None:
        ref = _build_batch.options(scheduling_strategy=pinned(node.node_id)).remote([b.build for b in builds],
                                                                                    self._settings)
        self._in_flight[ref] = _InFlight(builds, node)
        self.tasks += 1

    def wait(self) -> None:
        """Send what is queued and resolve every Future; Ctrl-C cancels the builds still running, then re-raises."""
        try:
            self._send_queued()
            while self._in_flight:
                done, _ = ray.wait(list(self._in_flight), num_returns=1, timeout=1.0)
                for ref in done:
                    self._settle(ref, self._in_flight.pop(ref))
        except KeyboardInterrupt:
            self.cancel()
            raise

    def cancel(self) -> None:
        for ref, flight in list(self._in_flight.items()):
            ray.cancel(ref, force=True)
            for build in flight.builds:
                build.future.cancel()
        self._in_flight.clear()
        for build in self._queued:
            build.future.cancel()
        self._queued.clear()

    def _settle(self, ref: ray.ObjectRef[Any], flight: _InFlight) -> None:
        try:
            outcomes = ray.get(ref)
        except ray.exceptions.RayError as exc:  # the task itself was lost (its node or worker died)
            self._lost(flight, exc)
            return
        node = flight.node.node_id
        for build, outcome in zip(flight.builds, outcomes, strict=True):
            if isinstance(outcome, BaseException):  # the build's own failure (a compile error)
                build.future.set_exception(outcome)
            else:
                self.where[node] = self.where.get(node, 0) + 1
                build.future.set_result(outcome)

    def _lost(self, flight: _InFlight, exc: BaseException) -> None:
        dead = flight.node
        self._nodes = [n for n in self._nodes if n.node_id != dead.node_id] or self._nodes
        again = []
        for build in flight.builds:
            if build.attempt >= self._retries or not _alive(self._nodes):
                build.future.set_exception(RuntimeError(
                    f"build {build.label} was lost {build.attempt + 1} times (last on node {dead.node_id}: "
                    f"{type(exc).__name__}: {exc})"))
            else:
                build.attempt += 1
                again.append(build)
        if again:
            self.lost += len(again)
            log.warning("%d build(s) lost on node %s (%s): sent to another node", len(again), dead.node_id,
                        type(exc).__name__)
            self._send(again, self._next_node())


def _alive(nodes: list[Node]) -> bool:
    ids = {n["NodeID"] for n in live_nodes()}
    return any(node.node_id in ids for node in nodes)


def _cause(exc: ray.exceptions.RayTaskError) -> BaseException:
    """The exception the task raised (a CompileError, say), not Ray's wrapper of it."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc
