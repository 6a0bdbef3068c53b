"""Persistent, multi-process counters of the artifact store (``stats.json`` under the store root)."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from tuneforge.store._fsutil import LockTimeout, atomic_write, file_lock

log = logging.getLogger("tuneforge.store")

COUNTERS = ("hits", "misses", "puts", "evictions", "corrupt", "bytes")
STATS_VERSION = 1


@dataclass
class StoreStats:
    """A snapshot of the store's counters (all processes, as merged into ``stats.json``)."""

    hits: int
    misses: int
    puts: int
    evictions: int
    corrupt: int
    bytes: int  # total bytes of published entries (files + manifest), as tracked
    entries: int  # number of published entries (from a directory scan)
    max_bytes: int


class StatsFile:
    """Counters accumulated in memory per process and merged into a JSON file under an flock.

    ``bytes`` is a signed delta like the others, except that :meth:`flush` can set it to an exact
    value (after a directory scan).  Flushing never raises: a failure is logged and the pending
    counters are kept for the next attempt.
    """

    def __init__(self, path: Path, lock_path: Path, tmp_dir: Path, lock_timeout_s: float,
                 counters: tuple[str, ...] = COUNTERS) -> None:
        self.counters = counters
        self.path = path
        self.lock_path = lock_path
        self.tmp_dir = tmp_dir
        self.lock_timeout_s = lock_timeout_s
        self._pending = self._zeros()
        self._mutex = threading.Lock()
        self._pid = os.getpid()
        self._last_flush = time.monotonic()

    def _zeros(self) -> dict[str, int]:
        return dict.fromkeys(self.counters, 0)

    def _own_pending(self) -> dict[str, int]:
        # After fork() the child inherits the parent's pending counters; the parent flushes them.
        if os.getpid() != self._pid:
            self._pid = os.getpid()
            self._pending = self._zeros()
        return self._pending

    def add(self, counter: str, n: int = 1) -> None:
        with self._mutex:
            self._own_pending()[counter] += n

    def has_pending(self) -> bool:
        with self._mutex:
            return any(self._own_pending().values())

    def read(self) -> dict[str, int]:
        """The merged counters on disk (zeros, with a warning, if the file is corrupt)."""
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return self._zeros()
        except OSError as exc:
            log.warning("cannot read store statistics %s (%s); treating them as zero", self.path, exc)
            return self._zeros()
        try:
            data = json.loads(raw)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            values = {name: data.get(name, 0) for name in self.counters}
            if not all(type(v) is int for v in values.values()):
                raise ValueError("counter is not an integer")
            return values
        except ValueError as exc:
            log.warning("store statistics file %s is corrupt (%s); resetting it to zero", self.path, exc)
            return self._zeros()

    def flush(self, *, set_bytes: int | None = None, reset: bool = False) -> dict[str, int]:
        """Merge this process's pending counters into the file; return the merged totals.

        ``set_bytes`` replaces the tracked byte total (this process's pending byte delta is dropped,
        since the exact value already includes it).  ``reset`` zeroes every counter except ``bytes``.
        """
        with self._mutex:
            pending = dict(self._own_pending())
            self._pending = self._zeros()
        if not any(pending.values()) and set_bytes is None and not reset:
            self._last_flush = time.monotonic()
            return self.read()
        try:
            with file_lock(self.lock_path, self.lock_timeout_s):
                totals = self.read()
                for name in self.counters:
                    totals[name] = 0 if reset and name != "bytes" else totals[name] + pending[name]
                if set_bytes is not None and "bytes" in totals:
                    totals["bytes"] = set_bytes
                doc = {"format": "tuneforge-store-stats", "version": STATS_VERSION, **totals,
                       "updated": time.time()}
                atomic_write(self.path, json.dumps(doc, indent=1).encode(), self.tmp_dir, label="stats")
        except (OSError, LockTimeout) as exc:
            log.warning("cannot update store statistics %s (%s); will retry later", self.path, exc)
            with self._mutex:
                for name in self.counters:
                    self._own_pending()[name] += pending[name]
            return self.read()
        self._last_flush = time.monotonic()
        return totals

    def maybe_flush(self, interval_s: float) -> None:
        """Flush if something is pending and the last flush is older than ``interval_s``."""
        if time.monotonic() - self._last_flush >= interval_s and self.has_pending():
            self.flush()

    def flush_quietly(self) -> None:
        """Exit/finaliser hook: flush, swallowing anything (the interpreter may be shutting down)."""
        try:
            if self.has_pending():
                self.flush()
        except Exception:  # pragma: no cover - last-chance hook
            pass
