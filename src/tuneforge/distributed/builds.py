"""Builds on a Ray cluster: a `Builder` (the seam every choice builds through) whose builds are Ray tasks.

    builds = RayBuilds(group_nodes, settings, retries=2)
    futures = [choice.build(builds) for choice in choices]   # each a Ray task on a node of the group
    builds.wait()                                             # every Future resolved

A build runs on a node of the fingerprint its artifact is for (the compiler and ISA there make its key), one
CPU each, nodes taken in turn. It stores the artifact in that node's store, which shares it with the remote
tier (Redis) when one is configured, flushed before the task returns: a node that measures later fetches it
instead of compiling again. A build that fails (a compile error) fails its Future; one whose node or worker
died is sent to the next live node of the group, at most `retries` more times. Identical builds (the same
pickled build) are submitted once.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import pickle
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import ray

from tuneforge.distributed.cluster import Node, live_nodes, pinned

log = logging.getLogger("tuneforge.distributed")

# Failures of the machinery, not of the build: the build is sent to another node.
LOST = (ray.exceptions.WorkerCrashedError, ray.exceptions.NodeDiedError, ray.exceptions.TaskUnschedulableError,
        ray.exceptions.ObjectLostError, ray.exceptions.OwnerDiedError, ray.exceptions.LocalRayletDiedError)


@ray.remote(num_cpus=1, max_retries=0)
def _build(build: Any, settings: dict[str, Any]) -> Any:
    from tuneforge.compile.pool_worker import run_task
    from tuneforge.store.remote_registry import flush_all
    from tuneforge.supervisor import applied_settings

    with applied_settings(settings):
        outcome = run_task(build, settings)
        flush_all()  # the artifact is in the shared tier before anyone is told it is built
    if isinstance(outcome, BaseException):
        raise outcome
    return outcome


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
class _InFlight:
    future: Future[Any]
    build: Any
    label: str
    node: Node
    attempt: int


class RayBuilds:
    """Builds as Ray tasks on `nodes` (one fingerprint group); see the module."""

    def __init__(self, nodes: list[Node], settings: dict[str, Any], *, retries: int = 2) -> None:
        if not nodes:
            raise ValueError("RayBuilds needs at least one node")
        self._nodes = list(nodes)
        self._turn = itertools.cycle(range(len(self._nodes)))
        self._settings = settings
        self._retries = retries
        self._in_flight: dict[ray.ObjectRef[Any], _InFlight] = {}
        self._by_content: dict[str, Future[Any]] = {}
        self.submitted = 0
        self.lost = 0  # builds sent again after their node or worker died
        self.where: dict[str, int] = {}  # node id -> builds it finished

    def submit(self, build: Any, *, label: str = "") -> Future[Any]:
        content = hashlib.sha256(pickle.dumps(build)).hexdigest()
        future = self._by_content.get(content)
        if future is None:
            future = self._by_content[content] = Future()
            self._send(_InFlight(future, build, label or content[:12], self._next_node(), 0))
            self.submitted += 1
        return future

    def _next_node(self) -> Node:
        return self._nodes[next(self._turn) % len(self._nodes)]

    def _send(self, flight: _InFlight) -> None:
        ref = _build.options(scheduling_strategy=pinned(flight.node.node_id)).remote(flight.build, self._settings)
        self._in_flight[ref] = flight

    def wait(self) -> None:
        """Resolve every Future submitted so far; Ctrl-C cancels the builds still running, then re-raises."""
        try:
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
            flight.future.cancel()
        self._in_flight.clear()

    def _settle(self, ref: ray.ObjectRef[Any], flight: _InFlight) -> None:
        try:
            result = ray.get(ref)
        except LOST as exc:
            self._lost(flight, exc)
            return
        except ray.exceptions.RayTaskError as exc:  # the build's own failure (a compile error): its Future's
            flight.future.set_exception(_cause(exc))
            return
        except ray.exceptions.RayError as exc:
            self._lost(flight, exc)
            return
        self.where[flight.node.node_id] = self.where.get(flight.node.node_id, 0) + 1
        flight.future.set_result(result)

    def _lost(self, flight: _InFlight, exc: BaseException) -> None:
        self.lost += 1
        dead = flight.node
        self._nodes = [n for n in self._nodes if n.node_id != dead.node_id] or self._nodes
        if flight.attempt >= self._retries or not _alive(self._nodes):
            flight.future.set_exception(RuntimeError(
                f"build {flight.label} was lost {flight.attempt + 1} times (last on node {dead.node_id}: "
                f"{type(exc).__name__}: {exc})"))
            return
        log.warning("build %s lost on node %s (%s): sent to another node", flight.label, dead.node_id,
                    type(exc).__name__)
        self._send(_InFlight(flight.future, flight.build, flight.label, self._next_node(), flight.attempt + 1))


def _alive(nodes: list[Node]) -> bool:
    ids = {n["NodeID"] for n in live_nodes()}
    return any(node.node_id in ids for node in nodes)


def _cause(exc: ray.exceptions.RayTaskError) -> BaseException:
    """The exception the task raised (a CompileError, say), not Ray's wrapper of it."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc
