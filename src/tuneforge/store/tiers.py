"""The cache tiers behind two interfaces, as MetaSchedule's `Database` hides its storage.

`RecordTiers` answers "which records of this selection key are there": the local record database, then
the remote (Redis; a remote hit is copied into the local database), then shipped bundles (read-only);
`commit` keeps a new record locally at once and shares its key's records with the remote, write-behind.
`ArtifactTiers` answers "give me this artifact": the local store under its per-key lock, then the
remote, else the caller's build, which is then shared with the remote; `fetch` never builds.
Callers never walk the tiers by hand.

Remote statistics are kept per process by the RemoteCache and merged into
``<cache_dir>/artifacts/remote_stats.json`` so that `tuneforge cache stats` can show them.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from tuneforge import config
from tuneforge.forksafe import ForkSafeLock
from tuneforge.store.artifacts import ArtifactStore, Entry
from tuneforge.store.default import artifacts_dir, default_records, default_store
from tuneforge.store.record import Record
from tuneforge.store.shipped import BundleSet, Nearest, bundles
from tuneforge.store.stats import StatsFile

if TYPE_CHECKING:
    from tuneforge.store.records import RecordDB
    from tuneforge.store.remote import RemoteCache

log = logging.getLogger("tuneforge.store")

REMOTE_COUNTERS = ("hits", "misses", "errors", "rejected", "puts", "dropped", "skipped", "unusable")
_stats_files: dict[str, StatsFile] = {}

# The tier that answered a record lookup: the local database, the remote, or a shipped bundle.
RecordSource = Literal["records", "remote", "bundle"]


def remote_stats_file() -> StatsFile:
    root = artifacts_dir()
    stats = _stats_files.get(str(root))
    if stats is None:
        stats = _stats_files[str(root)] = StatsFile(root / "remote_stats.json", root / "remote_stats.lock",
                                                    root / "tmp", 10.0, counters=REMOTE_COUNTERS)
    return stats


def remote() -> RemoteCache | None:
    """The configured remote cache, its events counted into the persistent remote statistics."""
    if not config.get_optional_str("remote.url"):
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


# ------------------------------------------------------------------------------------------ records


class RecordTiers:
    """Tuning records of a selection key, wherever they are kept.

    The tiers are given as functions, called on each use, so that a patched setting (cache_dir,
    remote.url, bundles) is honoured; the defaults are the process's own tiers.
    """

    def __init__(self, local: Callable[[], RecordDB] = default_records,
                 remote: Callable[[], RemoteCache | None] = remote,
                 shipped: Callable[[], BundleSet] = bundles) -> None:
        self._local, self._remote, self._shipped = local, remote, shipped

    def lookup(self, key: str, wanted: Collection[str]) -> tuple[dict[str, Record], RecordSource]:
        """The records of `key` whose choice is in `wanted`, by choice hash, and the last tier that added any.

        The local database first; the remote only while some are missing (it wins when it holds more,
        and its records are copied into the local database); then shipped bundles, read-only, for
        what is still missing.
        """
        records = self.local(key, wanted)
        source: RecordSource = "records"
        if len(records) < len(wanted):
            fetched = [r for r in self.remote_records(key) if r.choice in wanted]
            if len(fetched) > len(records):
                records.update({r.choice: r for r in fetched})
                source = "remote"
        if len(records) < len(wanted):
            shipped = [r for r in self._shipped().get(key) if r.choice in wanted and r.choice not in records]
            if shipped:  # read-only: used, not copied into the local database
                records.update({r.choice: r for r in shipped})
                source = "bundle"
        return records, source

    def local(self, key: str, wanted: Collection[str]) -> dict[str, Record]:
        """The local database's records only (what another process on this machine has just measured)."""
        return {r.choice: r for r in self._local().get(key) if r.choice in wanted}

    def remote_records(self, key: str) -> list[Record]:
        """The remote's records of `key`; they are merged into the local database (the better record wins)
        by a background thread, so the answer does not wait for local disk writes."""
        cache = self._remote()
        fetched = cache.get_records(key) if cache is not None else None
        if not fetched:
            return []
        _merge_later(self._local(), fetched)
        return list(fetched)

    def nearest(self, op: str, args: Sequence[Any], system: str) -> Nearest | None:
        """The shipped records of the closest tuned shape of `op` (see `BundleSet.nearest`)."""
        return self._shipped().nearest(op, args, system)

    def commit(self, record: Record) -> None:
        """Keep `record` in the local database at once, and share its key's records with the remote."""
        self._local().put(record)
        self._share(record.key)

    def commit_all(self, key: str, records: Sequence[Record]) -> None:
        """Keep `records` of `key` locally in one transaction, then share the key's records with the remote."""
        self._local().put_many(records)
        self._share(key)

    @contextlib.contextmanager
    def committing(self, key: str) -> Iterator[Callable[[Record], None]]:
        """`commit` for a batch of records of `key`: each is kept locally as it comes, and the key's records
        go to the remote once, when the batch ends without an error (the remote value is a key's whole list)."""
        yield self._local().put
        self._share(key)

    def _share(self, key: str) -> None:
        cache = self._remote()
        if cache is not None:
            records = self._local().get(key)
            if records:
                cache.put_records(key, records)


_MERGE_DELAY_S = 1.0
_merge_lock = ForkSafeLock()
_pending_merges: list[tuple[Any, dict[str, Any]]] = []
_merge_timer: threading.Timer | None = None


def _merge_later(db: RecordDB, fetched: Sequence[Record]) -> None:
    global _merge_timer
    bundle = {"format": "tuneforge-records", "version": 1, "records": [r.to_json() for r in fetched]}
    with _merge_lock:
        _pending_merges.append((db, bundle))
        if _merge_timer is None:
            # Later, off the critical path (sqlite's import and a new database's set-up would delay the
            # first result through the GIL); at exit at the latest, so the local copy is never lost.
            _merge_timer = threading.Timer(_MERGE_DELAY_S, merge_pending)
            _merge_timer.daemon = True
            _merge_timer.start()


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


# ---------------------------------------------------------------------------------------- artifacts


class _NotStored(Exception):
    """Raised inside a store build step by `ArtifactTiers.fetch`: stored neither locally nor remotely."""


def _refuse(staging: Path) -> Mapping[str, Any]:
    raise _NotStored


class ArtifactTiers:
    """Compiled artifacts by key: the local store, else the remote, else (get_or_build only) a build."""

    def __init__(self, store: Callable[[], ArtifactStore] = default_store,
                 remote: Callable[[], RemoteCache | None] = remote) -> None:
        self._store, self._remote = store, remote

    def get_or_build(self, key: str, build: Callable[[Path], Mapping[str, Any] | None], *,
                     key_inputs: Mapping[str, Any] | None = None) -> Entry:
        """The entry for `key`, built by `build(staging)` only if neither tier holds it; a build is shared.

        The remote is asked under the store's per-key lock, so N local processes fetch (or build) once;
        a fetched artifact is checked (manifest, usability) by the remote layer and published like a
        local build. A remote value that cannot be used is a counted miss, never published.
        """
        built = False

        def build_here(staging: Path) -> Mapping[str, Any] | None:
            nonlocal built
            built = True
            return build(staging)

        entry = self._store().get_or_build(key, self._from_remote_or(key, build_here), key_inputs=key_inputs)
        if built:
            self._share(entry)
        return entry

    def fetch(self, key: str) -> Entry | None:
        """The entry for `key` from the local store, else the remote (published locally); None: neither
        holds it. Never builds."""
        store = self._store()
        try:
            return store.get(key) or store.get_or_build(key, self._from_remote_or(key, _refuse))
        except _NotStored:
            return None

    def _from_remote_or(self, key: str,
                        build: Callable[[Path], Mapping[str, Any] | None]) -> Callable[[Path], Mapping[str, Any]]:
        def fetch_or_build(staging: Path) -> Mapping[str, Any]:
            cache = self._remote()
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

    def _share(self, entry: Entry) -> None:
        """Queue a freshly built entry for the remote (nothing when no remote is configured)."""
        cache = self._remote()
        if cache is None or entry.meta.get("fetched_from_remote"):
            return
        try:
            files = {name: entry.file(name).read_bytes() for name in entry.manifest["files"]}
        except OSError as exc:  # evicted meanwhile: nothing to share
            log.debug("not sharing %s: %s", entry.key, exc)
            return
        cache.put_artifact(entry.key, entry.manifest, files)


record_tiers = RecordTiers()
artifact_tiers = ArtifactTiers()
