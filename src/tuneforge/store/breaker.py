"""A circuit breaker: after a failure, skip a dead server for `retry_s`, then let one trial call through.

Without it every lookup of a process whose remote cache is down would wait out its time-out; with it
an outage costs one time-out per `retry_s`, and the first success closes the breaker again.
"""

from __future__ import annotations

import threading
import time


class CircuitBreaker:
    """Closed (calls go through), open (calls are skipped until the retry time), or half-open (one trial
    call is in flight). Thread-safe; `closed_for_good` is set once its owner is closed."""

    def __init__(self, retry_s: float) -> None:
        self.retry_s = retry_s
        self.closed_for_good = False
        self.reset()

    def reset(self) -> None:
        """Closed, with a new lock (also in a forked child, where the parent's may have been held)."""
        self._lock = threading.Lock()
        self._down_since: float | None = None  # monotonic time of the first failure of this outage
        self._retry_at = 0.0
        self._trial = False  # a trial call is in flight while the breaker is half-open

    @property
    def available(self) -> bool:
        """Whether a call would be let through now (without taking the trial)."""
        with self._lock:
            if self.closed_for_good:
                return False
            return self._down_since is None or (not self._trial and time.monotonic() >= self._retry_at)

    def admit(self) -> bool:
        """Whether this call may go ahead; when the breaker is open and the retry time has come, this call
        becomes the one trial."""
        with self._lock:
            if self.closed_for_good:
                return False
            if self._down_since is None:
                return True
            if self._trial or time.monotonic() < self._retry_at:
                return False
            self._trial = True
            return True

    def failed(self) -> bool:
        """A call failed: open (again) until retry_s from now. Returns whether this began an outage."""
        with self._lock:
            first = self._down_since is None
            now = time.monotonic()
            if first:
                self._down_since = now
            self._retry_at = now + self.retry_s
            self._trial = False
        return first

    def succeeded(self) -> float | None:
        """A call succeeded: closed. Returns how long the outage that this ends lasted, if there was one."""
        with self._lock:
            since = self._down_since
            self._down_since = None
            self._trial = False
        return None if since is None else time.monotonic() - since
