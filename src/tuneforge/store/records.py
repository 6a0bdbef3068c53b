"""The tuning-record database: one SQLite file in WAL mode, shared safely by many processes.

One row per (key, choice) holds the timing statistics of one choice for one selection key, its status
and the reason of a failure.  Writes are ``BEGIN IMMEDIATE`` transactions retried with back-off while
another process holds the write lock, so concurrent writers lose nothing.  The schema is versioned in a
``meta`` table and migrated forward on open; a database newer than this code is refused.

The `Record` type and bundle files (export/import as versioned JSON) live in `bundle.py`; they are
re-exported here, so ``tuneforge.store.records`` is the one module to import.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sqlite3
import threading
import time
import urllib.parse
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from tuneforge.store.bundle import (
    BUNDLE_FORMAT,
    BUNDLE_VERSION,
    STATUSES,
    Record,
    RecordError,
    check_bundle,
    check_statistic,
    json_text,
    read_bundle,
    write_bundle,
)

__all__ = ["BUNDLE_FORMAT", "BUNDLE_VERSION", "KEEP_POLICIES", "SCHEMA_VERSION", "STATUSES", "Record", "RecordDB",
           "RecordError", "read_bundle", "write_bundle"]

log = logging.getLogger("tuneforge.store")

SCHEMA_VERSION = 1
KEEP_POLICIES = ("better", "newer", "theirs")

T = TypeVar("T")


# ------------------------------------------------------------------------------------------- schema

_COLUMNS = tuple(f.name for f in dataclasses.fields(Record))
_COLUMN_SQL = ", ".join(f'"{c}"' for c in _COLUMNS)
_SELECT = f"SELECT {_COLUMN_SQL} FROM records"


def _migrate_0_to_1(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL)")
    conn.execute("""
        CREATE TABLE IF NOT EXISTS records (
            "key" TEXT NOT NULL, "choice" TEXT NOT NULL, "op" TEXT NOT NULL, "choice_name" TEXT NOT NULL,
            "status" TEXT NOT NULL,
            "median_ms" REAL, "min_ms" REAL, "mean_ms" REAL, "p20_ms" REAL, "p80_ms" REAL,
            "count" INTEGER NOT NULL DEFAULT 0, "method" TEXT NOT NULL DEFAULT '',
            "error" TEXT NOT NULL DEFAULT '', "params" TEXT NOT NULL DEFAULT '{}',
            "inputs" TEXT NOT NULL DEFAULT '', "system" TEXT NOT NULL DEFAULT '',
            "info" TEXT NOT NULL DEFAULT '{}', "created" REAL NOT NULL,
            PRIMARY KEY ("key", "choice")
        ) WITHOUT ROWID""")
    conn.execute('CREATE INDEX IF NOT EXISTS records_by_op ON records ("op", "key")')


# _MIGRATIONS[i] takes a database from schema version i to i + 1, inside one write transaction.
_MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_migrate_0_to_1]


def _schema_version(conn: sqlite3.Connection, path: Path) -> int:
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone() is None:
        return 0
    row = conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
    if row is None:
        return 0
    try:
        return int(row[0])
    except (TypeError, ValueError):
        raise RecordError(f"record database {path} has an invalid schema_version {row[0]!r}") from None


def _row_to_record(row: tuple[Any, ...], path: Path) -> Record:
    values = dict(zip(_COLUMNS, row, strict=True))
    try:
        values["params"] = json.loads(values["params"])
        values["info"] = json.loads(values["info"])
        return Record(**values)
    except (ValueError, TypeError, RecordError) as exc:
        raise RecordError(f"record database {path}: bad row for key {values['key']!r}, choice "
                          f"{values['choice']!r}: {exc}") from None


def _record_to_row(record: Record) -> tuple[Any, ...]:
    return tuple(json_text(getattr(record, c), c) if c in ("params", "info") else getattr(record, c)
                 for c in _COLUMNS)


@contextlib.contextmanager
def _immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """A BEGIN IMMEDIATE transaction: committed if the block ends normally, rolled back otherwise."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


def _is_busy(exc: sqlite3.OperationalError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)  # Python >= 3.11
    if code is not None:
        return (code & 0xFF) in (5, 6)  # SQLITE_BUSY, SQLITE_LOCKED
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _better(theirs: Record, ours: Record) -> bool:
    """keep="better": an ok row beats a failed one; among ok rows a (lower) median beats none (higher)."""
    if (theirs.status == "ok") != (ours.status == "ok"):
        return theirs.status == "ok"
    if theirs.status != "ok" or theirs.median_ms is None:
        return False
    return ours.median_ms is None or theirs.median_ms < ours.median_ms


# ----------------------------------------------------------------------------------------- database

# Connections inherited through fork() are never used nor closed by the child (closing could disturb
# the parent's locks and WAL); they are parked here for the life of the child process.
_abandoned: list[sqlite3.Connection] = []
_instances: weakref.WeakSet[RecordDB] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for db in list(_instances):
        db._forget_connection()


os.register_at_fork(after_in_child=_after_fork_in_child)


class RecordDB:
    """A tuning-record database file. The file is created on first write; reads of a missing file are empty.

    One connection per instance per process (reopened after ``fork``), shared by threads under a lock.
    """

    def __init__(self, path: str | os.PathLike[str], *, readonly: bool = False, timeout_s: float = 30.0) -> None:
        if timeout_s < 0:
            raise RecordError(f"timeout_s must be >= 0, got {timeout_s}")
        self.path = Path(os.path.abspath(os.path.expanduser(path)))
        self.readonly = bool(readonly)
        self.timeout_s = float(timeout_s)
        self._conn: sqlite3.Connection | None = None
        self._pid = os.getpid()
        self._mutex = threading.RLock()
        _instances.add(self)

    def __repr__(self) -> str:
        return f"RecordDB({str(self.path)!r}{', readonly=True' if self.readonly else ''})"

    def __enter__(self) -> RecordDB:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._locked():
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.close()

    # ------------------------------------------------------------------------------- connection

    def _forget_connection(self) -> None:
        if self._conn is not None:
            _abandoned.append(self._conn)
        self._conn = None
        self._pid = os.getpid()
        self._mutex = threading.RLock()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self._pid != os.getpid():  # forked without the at-fork hook (defensive)
            self._forget_connection()
        with self._mutex:
            yield

    def _open(self, create: bool) -> sqlite3.Connection | None:
        """The connection, opened and migrated on first use; None if there is nothing to read yet."""
        if self._conn is not None:
            return self._conn
        if not create and not self.path.exists():
            return None
        if self.readonly:
            uri = f"file:{urllib.parse.quote(str(self.path))}?mode=ro"
            conn = sqlite3.connect(uri, uri=True, timeout=self.timeout_s, isolation_level=None,
                                   check_same_thread=False)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None,
                                   check_same_thread=False)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.timeout_s * 1000)}")
            if not self.readonly:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    log.warning("record database %s: WAL mode unavailable (journal_mode=%s)", self.path, mode)
                conn.execute("PRAGMA synchronous = NORMAL")
            if not self._check_schema(conn):
                conn.close()
                return None
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return conn

    def _check_schema(self, conn: sqlite3.Connection) -> bool:
        """Refuse a newer schema, migrate an older one; False if a read-only database has no schema yet."""
        target = len(_MIGRATIONS)
        version = _schema_version(conn, self.path)
        if version < target and not self.readonly:
            with _immediate(conn):
                version = _schema_version(conn, self.path)  # again, under the write lock
                if version < target:
                    log.info("record database %s: migrating schema %d -> %d", self.path, version, target)
                for step in range(version, target):
                    _MIGRATIONS[step](conn)
                    conn.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('schema_version', ?)",
                                 (str(step + 1),))
        if version > target:
            raise RecordError(f"record database {self.path} has schema version {version}, newer than this "
                              f"tuneforge supports ({target}); upgrade tuneforge to use it")
        if version < target and self.readonly:
            if version == 0:
                return False
            raise RecordError(f"record database {self.path} has the old schema version {version} (current: "
                              f"{target}); open it once without readonly=True to migrate it")
        return True

    def _run(self, fn: Callable[[sqlite3.Connection], T], *, write: bool, default: T) -> T:
        """Run ``fn`` (in a BEGIN IMMEDIATE transaction if ``write``), retrying while the database is locked."""
        if write and self.readonly:
            raise RecordError(f"record database {self.path} is open read-only; cannot write to it")
        deadline = time.monotonic() + self.timeout_s
        pause = 0.002
        with self._locked():
            while True:
                try:
                    conn = self._open(create=write)
                    if conn is None:
                        return default
                    if not write:
                        return fn(conn)
                    with _immediate(conn):
                        return fn(conn)
                except sqlite3.OperationalError as exc:
                    if not _is_busy(exc):
                        raise RecordError(f"record database {self.path}: {exc}") from exc
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise RecordError(f"record database {self.path} is locked by another process; gave up "
                                          f"after {self.timeout_s:g}s ({exc})") from exc
                    log.debug("record database %s is busy (%s); retrying", self.path, exc)
                    time.sleep(min(pause, remaining))
                    pause = min(pause * 2, 0.1)
                except sqlite3.DatabaseError as exc:
                    raise RecordError(f"record database {self.path}: {exc}") from exc

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[Record]:
        def go(conn: sqlite3.Connection) -> list[Record]:
            return [_row_to_record(row, self.path) for row in conn.execute(sql, args)]
        return self._run(go, write=False, default=[])

    # ------------------------------------------------------------------------------------ reads

    def get(self, key: str) -> list[Record]:
        """Every row of ``key`` (any status), ordered by choice."""
        return self._query(f'{_SELECT} WHERE "key" = ? ORDER BY "choice"', (key,))

    def get_choice(self, key: str, choice: str) -> Record | None:
        rows = self._query(f'{_SELECT} WHERE "key" = ? AND "choice" = ?', (key, choice))
        return rows[0] if rows else None

    def best(self, key: str, statistic: str = "median") -> Record | None:
        """The fastest ``ok`` row of ``key`` by ``statistic`` (ties: the smallest choice text)."""
        rows = self.top_k(key, 1, statistic)
        return rows[0] if rows else None

    def top_k(self, key: str, k: int, statistic: str = "median") -> list[Record]:
        """The ``k`` fastest ``ok`` rows with a value for ``statistic``, ascending (ties by choice)."""
        column = check_statistic(statistic)
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise RecordError(f"k must be an integer >= 0, got {k!r}")
        if k == 0:
            return []
        return self._query(f'{_SELECT} WHERE "key" = ? AND "status" = \'ok\' AND "{column}" IS NOT NULL '
                           f'ORDER BY "{column}", "choice" LIMIT ?', (key, k))

    def keys(self, op: str | None = None) -> list[str]:
        def go(conn: sqlite3.Connection) -> list[str]:
            if op is None:
                rows = conn.execute('SELECT DISTINCT "key" FROM records ORDER BY "key"')
            else:
                rows = conn.execute('SELECT DISTINCT "key" FROM records WHERE "op" = ? ORDER BY "key"', (op,))
            return [row[0] for row in rows]
        return self._run(go, write=False, default=[])

    def records(self, op: str | None = None) -> list[Record]:
        """Every row (optionally of one op), ordered by key, then choice."""
        if op is None:
            return self._query(f'{_SELECT} ORDER BY "key", "choice"')
        return self._query(f'{_SELECT} WHERE "op" = ? ORDER BY "key", "choice"', (op,))

    def count(self) -> int:
        def go(conn: sqlite3.Connection) -> int:
            return int(conn.execute("SELECT COUNT(*) FROM records").fetchone()[0])
        return self._run(go, write=False, default=0)

    # ----------------------------------------------------------------------------------- writes

    def put(self, record: Record) -> None:
        """Insert or replace the row of (record.key, record.choice); ``created == 0`` becomes now."""
        self.put_many([record])

    def put_many(self, records: Iterable[Record]) -> None:
        """Insert or replace many rows in one transaction."""
        now = time.time()
        rows = []
        for record in records:
            if not isinstance(record, Record):
                raise RecordError(f"expected a Record, got {type(record).__name__}")
            rows.append(_record_to_row(record if record.created else dataclasses.replace(record, created=now)))
        if not rows:
            return
        sql = f"INSERT OR REPLACE INTO records ({_COLUMN_SQL}) VALUES ({', '.join('?' * len(_COLUMNS))})"
        self._run(lambda conn: conn.executemany(sql, rows), write=True, default=None)

    def delete(self, key: str) -> int:
        """Remove every row of ``key``; returns the number removed."""
        return self._run(lambda conn: conn.execute('DELETE FROM records WHERE "key" = ?', (key,)).rowcount,
                         write=True, default=0)

    def clear(self, op: str | None = None) -> int:
        """Remove every row (or every row of one op); returns the number removed."""
        if op is None:
            return self._run(lambda conn: conn.execute("DELETE FROM records").rowcount, write=True, default=0)
        return self._run(lambda conn: conn.execute('DELETE FROM records WHERE "op" = ?', (op,)).rowcount,
                         write=True, default=0)

    # ---------------------------------------------------------------------------------- bundles

    def export_bundle(self, op: str | None = None) -> dict[str, Any]:
        """Every row (optionally of one op) as a versioned JSON-able bundle document."""
        return {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "exported": time.time(),
                "records": [r.to_json() for r in self.records(op)]}

    def import_bundle(self, bundle: dict[str, Any] | str | os.PathLike[str], *, keep: str = "better") -> int:
        """Merge a bundle (a document or a file); returns the number of rows written.

        On a (key, choice) already present: ``keep="better"`` writes the bundle's row only if it is better
        (ok beats failed, then a lower median); ``"newer"`` only if its ``created`` is later; ``"theirs"``
        always.  Everything is validated before anything is written.
        """
        if keep not in KEEP_POLICIES:
            raise RecordError(f"unknown keep policy {keep!r} (expected one of {', '.join(KEEP_POLICIES)})")
        if isinstance(bundle, dict):
            incoming = check_bundle(bundle, "bundle")
        else:
            incoming = check_bundle(read_bundle(bundle), f"bundle file {os.fspath(bundle)}")
        if self.readonly:
            raise RecordError(f"record database {self.path} is open read-only; cannot import into it")
        if not incoming:
            return 0
        now = time.time()
        insert = f"INSERT OR REPLACE INTO records ({_COLUMN_SQL}) VALUES ({', '.join('?' * len(_COLUMNS))})"

        def merge(conn: sqlite3.Connection) -> int:
            written = 0
            for theirs in incoming:
                row = conn.execute(f'{_SELECT} WHERE "key" = ? AND "choice" = ?', (theirs.key, theirs.choice))
                found = row.fetchone()
                if found is not None:
                    ours = _row_to_record(found, self.path)
                    if keep == "better" and not _better(theirs, ours):
                        continue
                    if keep == "newer" and not theirs.created > ours.created:
                        continue
                fresh = theirs if theirs.created else dataclasses.replace(theirs, created=now)
                conn.execute(insert, _record_to_row(fresh))
                written += 1
            return written

        written = self._run(merge, write=True, default=0)
        log.debug("record database %s: imported %d of %d records (keep=%s)", self.path, written,
                  len(incoming), keep)
        return written
