"""Locks that a forked child gets back unlocked.

The build pool forks its workers from a thread of its own, while other threads of the parent may hold
a lock (computing a key, importing a generated module). The child has a copy of that lock, held by a
thread that does not exist there, and the first worker to take it waits forever. Every lock that a
forked worker may take is a `ForkSafeLock`: each one is renewed in the child right after the fork, as
CPython renews its own import lock. Data the lock guarded is left as the parent had it at the fork,
which is consistent for what these locks guard (memo dicts that are only ever added to as a whole).
Kept at the bottom of the package (it imports nothing of tuneforge) so every layer can use it.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import weakref
from collections.abc import Iterator
from types import TracebackType
from typing import Any

__all__ = ["ForkSafeLock", "forking_worker"]


class ForkSafeLock:
    """A threading.Lock (RLock with ``reentrant=True``) that is new and unlocked in a forked child."""

    __slots__ = ("__weakref__", "_lock", "_reentrant")

    def __init__(self, *, reentrant: bool = False) -> None:
        self._reentrant = reentrant
        self._lock: Any = threading.RLock() if reentrant else threading.Lock()
        _locks.add(self)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return bool(self._lock.acquire(blocking, timeout))

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return bool(self._lock.acquire())

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._lock.release()

    def _renew(self) -> None:
        self._lock = threading.RLock() if self._reentrant else threading.Lock()

    def __repr__(self) -> str:
        return f"<ForkSafeLock {'reentrant ' if self._reentrant else ''}{self._lock!r}>"


_locks: weakref.WeakSet[ForkSafeLock] = weakref.WeakSet()


_forking = threading.local()


@contextlib.contextmanager
def forking_worker() -> Iterator[None]:
    """Around the start of a worker process by fork, in the thread that forks it: the child drops stdin."""
    _forking.worker = True
    try:
        yield
    finally:
        _forking.worker = False


def _after_fork_in_child() -> None:
    for lock in list(_locks):
        lock._renew()
    if getattr(_forking, "worker", False):
        # The parent's main thread may be blocked reading stdin, holding its buffer's lock; multiprocessing closes
        # stdin in the child before the worker runs and would wait for that lock forever. None: left alone.
        sys.stdin = None


os.register_at_fork(after_in_child=_after_fork_in_child)
