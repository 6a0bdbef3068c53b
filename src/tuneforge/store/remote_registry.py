"""Every remote cache of this process: a flush at exit, and the fork hooks (a fork waits for writes in
flight, so that no lock is copied held; the child starts its own threads).

It knows the caches only through `Tracked`, so it stands below `remote.py` and imports nothing of it;
the cache that the settings name is `remote_settings.default_remote()`."""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
import weakref
from typing import Any, Protocol

log = logging.getLogger("tuneforge.store.remote")


class Tracked(Protocol):
    """What the registry needs of a remote cache."""

    @property
    def shown_url(self) -> str:
        """For logs: the URL with its password masked."""
        ...

    def flush(self, timeout: float) -> bool: ...

    @property
    def write_gate(self) -> threading.Lock:
        """Held around each write: a fork waits for it, so no write is copied half done."""
        ...

    def after_fork(self) -> None:
        """In a forked child: drop the parent's threads, locks and connections."""
        ...


_instances: weakref.WeakSet[Tracked] = weakref.WeakSet()
_abandoned: list[Any] = []  # in a forked child: the parent's Redis clients (see RemoteCache.after_fork)


def track(cache: Tracked) -> None:
    """Flush ``cache`` at exit and keep its writes and threads consistent across fork."""
    _instances.add(cache)


def abandon(client: Any) -> None:
    """Keep a Redis client alive, unused, for the life of this process (see RemoteCache.after_fork)."""
    _abandoned.append(client)


def flush_all(timeout: float = 10.0) -> None:
    """Flush every RemoteCache of this process (runs at exit, so that the last puts reach Redis)."""
    for cache in list(_instances):
        try:
            cache.flush(timeout)
        except Exception:  # pragma: no cover
            log.exception("remote cache %s: flush failed", cache.shown_url)


_held_gates: list[threading.Lock] = []
_FORK_WAIT_S = 10.0  # a fork waits at most this long for writes in flight


def _before_fork() -> None:
    deadline = time.monotonic() + _FORK_WAIT_S
    for cache in sorted(_instances, key=id):
        gate = cache.write_gate
        if gate.acquire(timeout=max(0.0, deadline - time.monotonic())):
            _held_gates.append(gate)
        else:  # pragma: no cover - a write stuck for seconds: fork anyway, as without this hook
            log.debug("remote cache %s: forking while a write is in flight", cache.shown_url)


def _after_fork_in_parent() -> None:
    while _held_gates:
        _held_gates.pop().release()


def _after_fork_in_child() -> None:
    _held_gates.clear()  # the child's caches get new gates
    for cache in list(_instances):
        cache.after_fork()


atexit.register(flush_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)
