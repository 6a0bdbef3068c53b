"""The Ray cluster as tuneforge sees it: its live nodes, each with the system fingerprint its records carry.

A record answers only for the fingerprint it was measured on (tune/fingerprint.py), so nodes are grouped by
it: a job for a fingerprint is built and measured on nodes of that group. Nodes on one host (a test cluster's
several raylets on 127.0.0.1) share its cores: `host` tells them apart from separate machines.
"""

from __future__ import annotations

import logging
import os
import socket
from collections import defaultdict
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from tuneforge.dataclass_lite import dataclass

log = logging.getLogger("tuneforge.distributed")

PROBE_TIMEOUT_S = 120.0
CONNECT_TIMEOUT_S = 5.0  # a node that cannot run a probe task in this long is left out (and named)


@dataclass(frozen=True)
class Node:
    """One live Ray node: its id, host, fingerprint (hash and a short description) and resources."""

    node_id: str
    host: str
    fingerprint: str
    described: str  # e.g. "AMD EPYC, 2 cores, avx2"
    cpus: float
    gpus: float


def connect(address: str | None) -> None:
    """Join the Ray cluster at `address` ("auto": the one this machine belongs to; None: Ray's default, which
    starts a local one when none is found), once per process."""
    if ray.is_initialized():
        return
    if address not in (None, "auto", "local") and "://" not in address:
        _check_reachable(address)
    ray.init(address=address, log_to_driver=False, configure_logging=False, include_dashboard=False)


def _check_reachable(address: str) -> None:
    """Fail at once, naming the address, when nothing listens there (Ray itself waits minutes, then fails)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"a Ray address is host:port (or auto), not {address!r}")
    try:
        socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except OSError as exc:
        raise ConnectionError(f"no Ray cluster answers at {address} ({exc}); start one with `ray start --head` "
                              "or give the address that `ray status` shows") from None


def live_nodes() -> list[dict[str, Any]]:
    """Ray's descriptions of the nodes that are alive now."""
    return [n for n in ray.nodes() if n.get("Alive")]  # type: ignore[no-untyped-call]


def pinned(node_id: str) -> NodeAffinitySchedulingStrategy:
    """Run on that node, or fail (never silently elsewhere: another node may have another fingerprint)."""
    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


@ray.remote(num_cpus=0, max_retries=0)
def _probe(settings: dict[str, Any]) -> dict[str, Any]:
    from tuneforge.supervisor import applied_settings
    from tuneforge.tune.fingerprint import system_fingerprint

    with applied_settings(settings):
        facts = system_fingerprint()
    return {"host": socket.gethostname(), "pid": os.getpid(), "node_id": ray.get_runtime_context().get_node_id(),
            "fingerprint": facts["hash"],
            "described": f"{facts['cpu_model']}, {facts['cores']} cores, {' '.join(facts['isa'][-1:]) or 'no ISA'}"}


def survey(settings: dict[str, Any]) -> list[Node]:
    """The live nodes that can run tuneforge, each probed on itself for its fingerprint. A node whose probe
    fails or hangs is left out with a warning naming it."""
    alive = live_nodes()
    refs = {n["NodeID"]: _probe.options(scheduling_strategy=pinned(n["NodeID"])).remote(settings) for n in alive}
    nodes = []
    for info in alive:
        ref = refs[info["NodeID"]]
        ready, _ = ray.wait([ref], timeout=PROBE_TIMEOUT_S)
        if not ready:
            ray.cancel(ref, force=True)
            log.warning("Ray node %s did not answer tuneforge's probe in %.0f s: left out", info["NodeID"],
                        PROBE_TIMEOUT_S)
            continue
        try:
            found = ray.get(ref)
        except ray.exceptions.RayError as exc:
            log.warning("Ray node %s cannot run tuneforge (%s): left out", info["NodeID"], exc)
            continue
        resources = info.get("Resources", {})
        nodes.append(Node(info["NodeID"], found["host"], found["fingerprint"], found["described"],
                          float(resources.get("CPU", 0)), float(resources.get("GPU", 0))))
    return nodes


def groups(nodes: list[Node]) -> dict[str, list[Node]]:
    """fingerprint -> its nodes, in a stable order."""
    found: dict[str, list[Node]] = defaultdict(list)
    for node in sorted(nodes, key=lambda n: (n.fingerprint, n.host, n.node_id)):
        found[node.fingerprint].append(node)
    return dict(found)
