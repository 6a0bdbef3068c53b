"""The cache tiers in the order a lookup walks them: local (artifact store, record database), then
the remote (Redis), then shipped bundles. A remote hit is copied into the local tier; what this
process builds or measures is shared with the remote, write-behind.

Remote statistics are kept per process by the RemoteCache and merged into
``<cache_dir>/artifacts/remote_stats.json`` so that `tuneforge cache stats` can show them.
"""

from __future__ import annotations

import atexit
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuneforge import config
from tuneforge.store.artifacts import Entry
from tuneforge.store.default import artifacts_dir, default_records
from tuneforge.store.record import Record
from tuneforge.store.stats import StatsFile

if TYPE_CHECKING:
    from tuneforge.store.remote import RemoteCache

log = logging.getLogger("tuneforge.store")

REMOTE_COUNTERS = ("hits", "misses", "errors", "rejected", "puts", "dropped", "skipped", "unusable")
_stats_files: dict[str, StatsFile] = {}


def remote_stats_file() -> StatsFile:
    root = artifacts_dir()
    stats = _stats_files.get(str(root))
    if stats is None:
        stats = _stats_files[str(root)] = StatsFile(root / "remote_stats.json", root / "remote_stats.lock",
                                                    root / "tmp", 10.0, counters=REMOTE_COUNTERS)
    return stats


def remote() -> RemoteCache | None:
    """The configured remote cache, its events counted into the persistent remote statistics."""
    if not config.get("remote.url"):
        return None  # without a remote, its module (and redis) never load
    from tuneforge.store.remote_settings import default_remote

    cache = default_remote()
    if cache is not None:
        add = remote_stats_file().add  # the cache directory's, which a patch may change
        if cache.listener != add:
            cache.listener = add
    return cache


def _flush_stats() -> None:
    for stats in list(_stats_files.values()):
        stats.flush_quietly()


atexit.register(_flush_stats)


# ---------------------------------------------------------------------------------------- artifacts


def from_remote_or(key: str, build: Callable[[Path], Mapping[str, Any] | None]) -> Callable[[Path], Mapping[str, Any]]:
    """A build step for ArtifactStore.get_or_build that first asks the remote for the artifact.

    It runs under the store's per-key lock, so N local processes fetch once; the fetched files are
    checked against their manifest, and for usability (meta, output, ELF libraries), by the remote
    layer, and published like a local build.  Anything else is built here: a remote value that cannot
    be used is a counted miss, never published.
    """

    def fetch_or_build(staging: Path) -> Mapping[str, Any]:
        cache = remote()
        fetched = cache.get_artifact(key) if cache is not None else None
        if fetched is not None:
            manifest, files = fetched
            meta = manifest.get("meta", {})
            if isinstance(meta, dict):  # get_artifact checked it; a second look costs nothing
                for name, data in files.items():
                    (staging / name).write_bytes(data)
                return {**meta, "fetched_from_remote": True}
        return dict(build(staging) or {})

    return fetch_or_build


def share_artifact(entry: Entry) -> None:
    """Queue a freshly built entry for the remote (nothing when no remote is configured)."""
    cache = remote()
    if cache is None or entry.meta.get("fetched_from_remote"):
        return
    try:
        files = {name: entry.file(name).read_bytes() for name in entry.manifest["files"]}
    except OSError as exc:  # evicted meanwhile: nothing to share
        log.debug("not sharing %s: %s", entry.key, exc)
        return
    cache.put_artifact(entry.key, entry.manifest, files)


# ------------------------------------------------------------------------------------------ records


def remote_records(key: str) -> list[Record]:
    """The remote's records of `key`; they are merged into the local database (the better record wins)
    by a background thread, so the answer does not wait for local disk writes."""
    cache = remote()
    fetched = cache.get_records(key) if cache is not None else None
    if not fetched:
        return []
    bundle = {"format": "tuneforge-records", "version": 1, "records": [r.to_json() for r in fetched]}
    with _merge_lock:
        _pending_merges.append((default_records(), bundle))
        global _merge_timer
        if _merge_timer is None:
            # Later, off the critical path (sqlite's import and a new database's set-up would delay the
            # first result through the GIL); at exit at the latest, so the local copy is never lost.
            _merge_timer = threading.Timer(_MERGE_DELAY_S, merge_pending)
            _merge_timer.daemon = True
            _merge_timer.start()
    return list(fetched)


_MERGE_DELAY_S = 1.0
_merge_lock = threading.Lock()
_pending_merges: list[tuple[Any, dict[str, Any]]] = []
_merge_timer: threading.Timer | None = None


def merge_pending() -> None:
    """Copy remote records fetched so far into the local database (runs late, and at exit)."""
    global _merge_timer
    with _merge_lock:
        pending = list(_pending_merges)
        _pending_merges.clear()
        _merge_timer = None
    for db, bundle in pending:
        try:
            db.import_bundle(bundle, keep="better")
        except Exception as exc:  # the local copy is an optimisation: never fail a selection over it
            log.warning("could not copy remote records into the local database: %s", exc)


atexit.register(merge_pending)


def share_records(key: str) -> None:
    """Queue every local record of `key` for the remote (the remote value holds a key's whole list)."""
    cache = remote()
    if cache is not None:
        records = default_records().get(key)
        if records:
            cache.put_records(key, records)


def remote_configured() -> bool:
    return bool(config.get("remote.url"))


def describe_remote(counters: Mapping[str, int]) -> Sequence[tuple[str, Any]]:
    lookups = counters["hits"] + counters["misses"]
    rate = f"{100 * counters['hits'] / lookups:.1f}%" if lookups else "-"
    return [("remote hits", counters["hits"]), ("remote misses", counters["misses"]), ("remote hit rate", rate),
            ("remote errors", counters["errors"]),
            ("remote lookups skipped", counters.get("skipped", 0)),
            ("remote rejected entries", counters["rejected"]),
            ("remote unusable entries", counters.get("unusable", 0)),
            ("remote puts", counters["puts"]), ("remote puts dropped", counters["dropped"])]
