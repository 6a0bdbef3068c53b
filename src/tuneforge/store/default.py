"""The artifact store named by the settings (``cache_dir``, ``cache_max_bytes``), one per process."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tuneforge import config
from tuneforge.store.artifacts import ArtifactStore

if TYPE_CHECKING:
    from tuneforge.store.records import RecordDB

_stores: dict[tuple[str, int, float], ArtifactStore] = {}


def artifacts_dir() -> Path:
    return config.get_path("cache_dir") / "artifacts"


def default_store() -> ArtifactStore:
    """The store for the current settings; a patched cache_dir gets its own store object."""
    spec = (str(artifacts_dir()), config.get_int("cache_max_bytes"), config.get_float("lock_timeout_s"))
    store = _stores.get(spec)
    if store is None:
        store = _stores[spec] = ArtifactStore(spec[0], spec[1], lock_timeout_s=spec[2])
    return store


_record_dbs: dict[str, RecordDB] = {}


def records_path() -> Path:
    return config.get_path("cache_dir") / "records.db"


def default_records() -> RecordDB:
    """The tuning-record database in the cache directory (one connection per process)."""
    from tuneforge.store.records import RecordDB  # sqlite3 loads only when records are used

    path = str(records_path())
    db = _record_dbs.get(path)
    if db is None:
        db = _record_dbs[path] = RecordDB(path)
    return db
