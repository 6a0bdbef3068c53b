"""Persistent, multi-process counters of the artifact store (``stats.json`` under the store root).

A damaged file does not zero what can be known: the byte total is recounted from the entries on disk
(the owner passes the recount), and only the event counters that cannot be recovered start again at 0.
A file that cannot be rewritten (a read-only store) stays damaged, so its repair is remembered for as
long as the file is unchanged: the periodic flushes and `cache stats` neither rescan nor warn again.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from tuneforge.dataclass_lite import dataclass
from tuneforge.forksafe import ForkSafeLock
from tuneforge.store.fsutil import LockTimeout, atomic_write, file_lock, is_readonly_error
from tuneforge.warn_once import warn_once

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


@dataclass
class PruneResult:
    """What a prune did (returned by ``ArtifactStore.prune``)."""

    removed: int
    freed_bytes: int
    remaining_bytes: int


class StatsFile:
    """Counters accumulated in memory per process and merged into a JSON file under an flock.

    ``bytes`` is a signed delta like the others, except that :meth:`flush` can set it to an exact
    value (after a directory scan).  Flushing never raises: a failure is logged and the pending
    counters are kept for the next attempt.  ``recount_bytes`` (if given) recomputes the byte total
    when the file is corrupt.  A ``readonly`` file is never written: counters stay in this process.
    """

    def __init__(self, path: Path, lock_path: Path, tmp_dir: Path, lock_timeout_s: float,
                 counters: tuple[str, ...] = COUNTERS, recount_bytes: Callable[[], int] | None = None) -> None:
        self.counters = counters
        self.recount_bytes = recount_bytes
        self.readonly = False
        self.path = path
        self.lock_path = lock_path
        self.tmp_dir = tmp_dir
        self.lock_timeout_s = lock_timeout_s
        self._pending = self._zeros()
        self._kept = self._zeros()  # counters of a read-only file, kept in this process
        self._mutex = ForkSafeLock()
        self._pid = os.getpid()
        self._last_flush = time.monotonic()
        # (file identity, counters) of the damaged file last repaired
        self._repair: tuple[tuple[int, int, int, int], dict[str, int]] | None = None

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
        """The merged counters on disk (repaired, with one warning, if the file is corrupt)."""
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                identity = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size)
                if self._repair is not None and self._repair[0] == identity:
                    return dict(self._repair[1])
                raw = f.read()
        except FileNotFoundError:
            return self._zeros()
        except OSError as exc:
            log.warning("cannot read store statistics %s (%s); treating them as zero", self.path, exc)
            return self._zeros()
        problem, values = self._parse(raw)
        if problem is None:
            return values
        repaired = self._repaired(values, problem, identity)
        self._repair = (identity, repaired)
        return dict(repaired)

    def _parse(self, raw: bytes) -> tuple[str | None, dict[str, int]]:
        """(None, the counters) of a good file, else (what is wrong, the counters that are good)."""
        try:
            data = json.loads(raw)
        except ValueError as exc:  # UnicodeDecodeError included
            return f"not JSON: {exc}", {}
        if not isinstance(data, dict):
            return "not a JSON object", {}
        values = {name: data.get(name, 0) for name in self.counters}
        bad = sorted(name for name, v in values.items() if type(v) is not int or (v < 0 and name != "bytes"))
        if bad or values.get("bytes", 0) < 0:
            return f"bad value of {', '.join(bad) or 'bytes'}", {n: v for n, v in values.items() if n not in bad}
        return None, values

    def _repaired(self, good: dict[str, int], problem: str, identity: tuple[int, ...]) -> dict[str, int]:
        """The counters of a damaged file: the good ones kept, bytes recounted, the rest zero."""
        values = {**self._zeros(), **good}
        recounted = ""
        if "bytes" in values and self.recount_bytes is not None:
            try:
                values["bytes"] = int(self.recount_bytes())
                recounted = "; the byte total is recounted from the entries"
            except Exception as exc:  # a recount is a repair attempt: never fail a read over it
                log.debug("cannot recount the bytes of %s: %s", self.path, exc)
                values["bytes"] = max(values["bytes"], 0)
        elif values.get("bytes", 0) < 0:
            values["bytes"] = 0
        warn_once(log, f"corrupt stats {self.path} {identity}", "store statistics file %s is corrupt (%s); counters "
                  "that cannot be recovered start again at 0%s", self.path, problem, recounted)
        return values

    def flush(self, *, set_bytes: int | None = None, reset: bool = False) -> dict[str, int]:
        """Merge this process's pending counters into the file; return the merged totals.

        ``set_bytes`` replaces the tracked byte total (this process's pending byte delta is dropped,
        since the exact value already includes it).  ``reset`` zeroes every counter except ``bytes``.
        """
        with self._mutex:
            pending = dict(self._own_pending())
            self._pending = self._zeros()
        if not any(pending.values()) and set_bytes is None and not reset and not self.readonly:
            self._last_flush = time.monotonic()
            return self.read()
        if self.readonly:
            return self._unwritten(pending, set_bytes)
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
            if is_readonly_error(exc):
                log.debug("store statistics %s cannot be written (%s); keeping them in memory", self.path, exc)
                self.readonly = True
                return self._unwritten(pending, set_bytes)
            log.warning("cannot update store statistics %s (%s); will retry later", self.path, exc)
            with self._mutex:
                for name in self.counters:
                    self._own_pending()[name] += pending[name]
            return self.read()
        self._last_flush = time.monotonic()
        return totals

    def _unwritten(self, pending: dict[str, int], set_bytes: int | None) -> dict[str, int]:
        """Flush of a read-only file: this process's counters add up in memory over the file's (a reset
        cannot zero the file, so it is ignored)."""
        with self._mutex:
            for name in self.counters:
                self._kept[name] += pending[name]
            totals = self.read()
            for name in self.counters:
                totals[name] += self._kept[name]
            if set_bytes is not None and "bytes" in totals:
                self._kept["bytes"] += set_bytes - totals["bytes"]
                totals["bytes"] = set_bytes
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
