"""A bounded write-behind queue served by one daemon thread: callers enqueue and never wait for I/O.

The thread starts with the first item and exits after a few idle seconds (the next item starts a new
one). `gate` is held around each write, so a fork can wait for the write in flight (see remote.py's
fork hooks) instead of freezing the child with a half-done network call or import.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Generic, TypeVar

log = logging.getLogger("tuneforge.store.remote")

Item = TypeVar("Item")

IDLE_EXIT_S = 5.0  # the writer thread exits when idle this long


class WriteQueue(Generic[Item]):
    """Items handed to `write` in order by one thread. `write` must not raise; if it does, the error is
    logged and `on_lost` told, and the thread goes on."""

    def __init__(self, write: Callable[[Item], None], on_lost: Callable[[Item], None], *, size: int,
                 name: str) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"queue_size must be an integer >= 1, got {size!r}")
        self.size = size
        self._write, self._on_lost, self._name = write, on_lost, name
        self.reset()

    def reset(self) -> None:
        """Fresh locks and an empty queue: at construction, and in a forked child, where the parent's
        thread does not exist and its locks may have been held at the fork (the parent writes its own)."""
        self._cv = threading.Condition(threading.Lock())
        self._pending: deque[Item] = deque()
        self._busy = 0
        self._closed = False
        self._thread: threading.Thread | None = None
        self.gate = threading.Lock()

    def offer(self, item: Item) -> bool:
        """Queue `item` for writing; False (nothing queued) when the queue is full or closed."""
        with self._cv:
            if self._closed or len(self._pending) >= self.size:
                return False
            self._pending.append(item)
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
                self._thread.start()
            self._cv.notify()
            return True

    def _serve(self) -> None:
        while True:
            with self._cv:
                while not self._pending:
                    timed_out = self._closed or not self._cv.wait(IDLE_EXIT_S)
                    if timed_out and not self._pending:  # closed, or idle: a later item starts a new thread
                        self._thread = None
                        return
                item = self._pending.popleft()
                self._busy += 1
            try:
                with self.gate:
                    self._write(item)
            except Exception:  # never let the writer die
                log.exception("%s: unexpected error writing an item", self._name)
                self._on_lost(item)
            finally:
                with self._cv:
                    self._busy -= 1
                    self._cv.notify_all()

    def flush(self, timeout: float) -> bool:
        """Wait until every queued item has been written; False if `timeout` ran out first."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._cv:
            while self._pending or self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._cv.wait(remaining)
        return True

    def close(self, join_timeout: float) -> list[Item]:
        """Stop taking items, stop the thread (waiting up to `join_timeout` for the write in flight) and
        return the items that were never written."""
        with self._cv:
            self._closed = True
            left = list(self._pending)
            self._pending.clear()
            thread = self._thread
            self._cv.notify_all()
        if thread is not None and thread is not threading.current_thread():
            thread.join(join_timeout)
        return left

    @property
    def closed(self) -> bool:
        return self._closed
