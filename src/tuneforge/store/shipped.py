"""Shipped bundles of tuning records, consulted read-only after the local and remote tiers.

A package tunes its kernels once, exports a bundle (``tuneforge records export``), ships the file and
registers it (`load_bundle` or the ``bundles`` setting). A selection whose key a bundle holds uses
those records without benchmarking. A key no bundle holds may be answered by the nearest tuned
shape of the same op and argument types (setting ``bundles_nearest``), which also lets a bundle
tuned on another machine (whose keys carry another system fingerprint) answer approximately.

A shipped bundle is read once, when it is registered, and every row is validated then (including
the ``info.args`` that nearest-shape lookups compare). A file that is not a bundle at all is an
error naming it (most likely a wrong path in the setting). A bad row inside a good bundle is left
out with one warning naming the file and the rows, and counted (`BundleSet.skipped`): the rest of
the shipped tuning still serves, and a damaged row can never fail a selection later.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tuneforge import config
from tuneforge.dataclass_lite import dataclass
from tuneforge.forksafe import ForkSafeLock
from tuneforge.store.record import Record, RecordError, read_records

log = logging.getLogger("tuneforge.store")


@dataclass(frozen=True)
class Nearest:
    """The records of the closest tuned shape, and how far it is (sum of |log2| size differences)."""

    key: str
    records: list[Record]
    distance: float
    inputs: str


def _distance(ours: Sequence[Any], theirs: Sequence[Any]) -> float | None:
    """None when the argument lists are not comparable (count, dtypes, ranks, scalar types)."""
    if len(ours) != len(theirs):
        return None
    total = 0.0
    for a, b in zip(ours, theirs, strict=True):
        if a[0] != b[0] or len(a[1]) != len(b[1]):
            return None
        total += sum(abs(math.log2(max(x, 1)) - math.log2(max(y, 1))) for x, y in zip(a[1], b[1], strict=True))
    return total


class BundleSet:
    """Every registered bundle, indexed by selection key and by op."""

    def __init__(self) -> None:
        self._by_key: dict[str, list[Record]] = {}
        self._by_op: dict[str, set[str]] = {}
        self._paths: set[str] = set()
        self._skipped: dict[str, int] = {}
        self._lock = ForkSafeLock()

    def add(self, path: str | os.PathLike[str]) -> int:
        """Register a bundle file (read once, validated); returns how many records it serves.

        RecordError if the file is missing or not a bundle; bad rows are skipped (see the module docs).
        """
        resolved = str(Path(path).resolve())
        bad: list[tuple[int, RecordError]] = []
        with self._lock:
            if resolved in self._paths:
                return 0
            records = read_records(resolved, on_bad_row=lambda index, exc: bad.append((index, exc)))
            if bad:
                self._skipped[resolved] = len(bad)
                shown = "; ".join(f"record {index}: {exc}" for index, exc in bad[:3])
                log.warning("bundle file %s: skipped %d bad record(s) of %d (%s%s); the others are used",
                            resolved, len(bad), len(bad) + len(records), shown, "; ..." if len(bad) > 3 else "")
            for record in records:
                self._by_key.setdefault(record.key, []).append(record)
                self._by_op.setdefault(record.op, set()).add(record.key)
            self._paths.add(resolved)
        log.debug("loaded %d tuning records from bundle %s", len(records), resolved)
        return len(records)

    @property
    def paths(self) -> list[str]:
        return sorted(self._paths)

    @property
    def skipped(self) -> dict[str, int]:
        """Bundle file -> how many of its rows were left out as invalid when it was registered."""
        with self._lock:
            return dict(self._skipped)

    def get(self, key: str) -> list[Record]:
        return list(self._by_key.get(key, ()))

    def nearest(self, op: str, args: Sequence[Any], system: str) -> Nearest | None:
        """The closest key of `op` with comparable arguments and an ok record; same-system first."""
        best: tuple[float, bool, str] | None = None
        for key in self._by_op.get(op, ()):
            records = self._by_key[key]
            ok = [r for r in records if r.status == "ok"]
            shape = ok[0].info.get("args") if ok else None
            if shape is None:
                continue
            distance = _distance(args, shape)
            if distance is None:
                continue
            rank = (distance, ok[0].system != system, key)
            if best is None or rank < best:
                best = rank
        if best is None:
            return None
        records = self._by_key[best[2]]
        return Nearest(best[2], list(records), best[0], records[0].inputs)


_bundles = BundleSet()
_loaded_settings: tuple[Path, ...] = ()


def bundles() -> BundleSet:
    """The process's bundles: those named by the ``bundles`` setting plus those passed to load_bundle."""
    global _loaded_settings
    configured = config.get_paths("bundles")
    if configured != _loaded_settings:
        for path in configured:
            _bundles.add(path)
        _loaded_settings = configured
    return _bundles


def load_bundle(path: str | os.PathLike[str]) -> int:
    """Register a bundle of tuning records (e.g. shipped inside a package); returns its record count."""
    return bundles().add(path)
