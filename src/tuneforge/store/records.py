"""The tuning-record database: one SQLite file in WAL mode, shared safely by many processes.

One row per (key, choice) holds the timing statistics of one choice for one selection key, its status
and the reason of a failure.  Writes are ``BEGIN IMMEDIATE`` transactions retried with back-off while
another process holds the write lock, so concurrent writers lose nothing.  The schema is versioned in a
``meta`` table and migrated forward on open; a database newer than this code is refused.

A damaged file (truncated, a garbled page) is moved aside as ``<name>.corrupt-<time>`` with one warning
and a fresh database takes its place; the move holds the side lock ``<name>.quarantine.lock``, which
every writable open takes too, so no process opens a half-moved file or a fresh one beside the old WAL.
A row that no longer decodes is skipped with one warning.  A database that cannot be written (a shared
cache mounted read-only) is opened read-only, with no journal-mode switch, and what this process
measures goes to an overlay database in a private temp directory, whose rows are merged into every read.

The `Record` type and bundle files (export/import as versioned JSON) live in `record.py`; they are
re-exported here, so ``tuneforge.store.records`` is the one module to import.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sqlite3
import time
import urllib.parse
import weakref
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from tuneforge.forksafe import ForkSafeLock
from tuneforge.store import fsutil as fs
from tuneforge.store.record import (
    BUNDLE_FORMAT,
    BUNDLE_VERSION,
    STATUSES,
    Record,
    RecordError,
    check_bundle,
    check_statistic,
    read_bundle,
    write_bundle,
)
from tuneforge.store.records_schema import (
    BUSY,
    COLUMN_SQL,
    COLUMNS,
    CORRUPT,
    MIGRATIONS,
    SELECT_RECORDS,
    Damaged,
    immediate,
    is_error,
    record_to_row,
    row_to_record,
    schema_version,
)

__all__ = ["BUNDLE_FORMAT", "BUNDLE_VERSION", "KEEP_POLICIES", "SCHEMA_VERSION", "STATUSES", "Record", "RecordDB",
           "RecordError", "read_bundle", "write_bundle"]

log = logging.getLogger("tuneforge.store")

SCHEMA_VERSION = 1
KEEP_POLICIES = ("better", "newer", "theirs")

T = TypeVar("T")


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
        self._ino = -1  # of the file the connection opened: a damaged file is moved aside only if still there
        self._ignored = False  # damaged and read-only: treated as absent
        self._bad_rows: set[tuple[str, str]] = set()
        self._mode_checked = False
        self._overlay: RecordDB | None = None  # takes the writes when the file cannot be written
        self._pid = os.getpid()
        self._mutex = ForkSafeLock(reentrant=True)
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
        self._mutex = ForkSafeLock(reentrant=True)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        if self._pid != os.getpid():  # forked without the at-fork hook (defensive)
            self._forget_connection()
        with self._mutex:
            yield

    def _writes_elsewhere(self) -> RecordDB | None:
        """The overlay database that takes this one's writes because its file cannot be written."""
        if not self._mode_checked and not self.readonly:
            self._mode_checked = True
            if not fs.writable_file(self.path):
                self._overlay = RecordDB(fs.overlay_dir(self.path.parent) / self.path.name, timeout_s=self.timeout_s)
                fs.warn_readonly(self.path.parent, self._overlay.path.parent, "not writable")
        return self._overlay

    def _connect_readonly(self, immutable: bool = False) -> sqlite3.Connection:
        # A WAL database needs its -shm file; where that cannot be created, immutable=1 reads the file
        # without it (nobody can be writing into a read-only directory).
        uri = f"file:{urllib.parse.quote(str(self.path))}?mode=ro{'&immutable=1' if immutable else ''}"
        conn = sqlite3.connect(uri, uri=True, timeout=self.timeout_s, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
        except sqlite3.OperationalError as exc:
            conn.close()
            if immutable or not is_error(exc, ((8, 14), ("unable to open", "readonly"))):  # READONLY, CANTOPEN
                raise
            return self._connect_readonly(immutable=True)
        return conn

    def _open(self, create: bool) -> sqlite3.Connection | None:
        """The connection, opened and migrated on first use; None if there is nothing to read yet."""
        if self._conn is not None:
            return self._conn
        readonly = self.readonly or self._writes_elsewhere() is not None
        if self._ignored or ((not create or readonly) and not self.path.exists()):
            return None
        if readonly:
            self._conn = self._prepared(self._connect_readonly(), readonly=True)
            return self._conn
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._no_quarantine():  # never open a file (nor its WAL) while another process moves it aside
            conn = sqlite3.connect(self.path, timeout=self.timeout_s, isolation_level=None, check_same_thread=False)
            self._conn = self._prepared(conn, readonly=False)
        return self._conn

    def _prepared(self, conn: sqlite3.Connection, readonly: bool) -> sqlite3.Connection | None:
        """``conn`` set up (WAL mode, schema checked and migrated), or None if it has no schema to read."""
        try:
            with contextlib.suppress(OSError):
                self._ino = os.stat(self.path).st_ino
            conn.execute(f"PRAGMA busy_timeout = {int(self.timeout_s * 1000)}")
            if not readonly:
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
        return conn

    @contextlib.contextmanager
    def _no_quarantine(self) -> Iterator[None]:
        """Hold the side lock under which a damaged file and its WAL are moved aside (see _quarantine)."""
        lock = self.path.with_name(f"{self.path.name}.quarantine.lock")
        with contextlib.ExitStack() as held:
            try:
                held.enter_context(fs.file_lock(lock, self.timeout_s))
            except fs.LockTimeout as exc:
                raise RecordError(f"record database {self.path}: another process has been moving a damaged "
                                  f"file aside for {self.timeout_s:g}s (it holds {lock})") from exc
            except OSError as exc:
                raise RecordError(f"record database {self.path}: cannot create the lock {lock} ({exc})") from exc
            yield

    def _check_schema(self, conn: sqlite3.Connection) -> bool:
        """Refuse a newer schema, migrate an older one; False if a read-only database has no schema yet."""
        target = len(MIGRATIONS)
        version = schema_version(conn, self.path)
        readonly = self.readonly or self._overlay is not None
        if version < target and not readonly:
            with immediate(conn):
                version = schema_version(conn, self.path)  # again, under the write lock
                if version < target:
                    log.info("record database %s: migrating schema %d -> %d", self.path, version, target)
                for step in range(version, target):
                    MIGRATIONS[step](conn)
                    conn.execute("INSERT OR REPLACE INTO meta (name, value) VALUES ('schema_version', ?)",
                                 (str(step + 1),))
        if version > target:
            raise RecordError(f"record database {self.path} has schema version {version}, newer than this "
                              f"tuneforge supports ({target}); upgrade tuneforge to use it")
        if version < target and readonly:
            if version == 0:
                return False
            raise RecordError(f"record database {self.path} has the old schema version {version} (current: "
                              f"{target}); open it once without readonly=True to migrate it")
        return True

    def _run(self, fn: Callable[[sqlite3.Connection], T], *, write: bool, default: T) -> T:
        """Run ``fn`` (in a BEGIN IMMEDIATE transaction if ``write``), retrying while the database is locked."""
        if write and self.readonly:
            raise RecordError(f"record database {self.path} is open read-only; cannot write to it")
        if write and self._writes_elsewhere() is not None:  # delete or clear: nothing else gets here
            raise RecordError(f"record database {self.path} is read-only; cannot delete from it (make it "
                              "writable, or point TUNEFORGE_CACHE_DIR at a writable directory)")
        deadline = time.monotonic() + self.timeout_s
        pause = 0.002
        quarantined = False
        with self._locked():
            while True:
                try:
                    conn = self._open(create=write)
                    if conn is None:
                        return default
                    if not write:
                        return fn(conn)
                    with immediate(conn):
                        return fn(conn)
                except sqlite3.OperationalError as exc:
                    if not is_error(exc, BUSY):
                        raise RecordError(f"record database {self.path}: {exc}") from exc
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise RecordError(f"record database {self.path} is locked by another process; gave up "
                                          f"after {self.timeout_s:g}s ({exc})") from exc
                    log.debug("record database %s is busy (%s); retrying", self.path, exc)
                    time.sleep(min(pause, remaining))
                    pause = min(pause * 2, 0.1)
                except (sqlite3.DatabaseError, Damaged) as exc:
                    if quarantined or not (isinstance(exc, Damaged) or is_error(exc, CORRUPT)):
                        raise RecordError(f"record database {self.path}: {exc}") from exc
                    self._quarantine(exc)
                    quarantined = True

    def _quarantine(self, problem: Exception) -> None:
        """Move a damaged file aside (its WAL first) so that a fresh database replaces it; a file that
        cannot be moved (read-only) is ignored from now on.  Openers take the same side lock, so no
        process opens the file, or makes a fresh one, halfway through the move."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(sqlite3.Error):
                conn.close()
        if self.readonly or self._overlay is not None:
            self._ignored = True
            log.warning("record database %s is damaged (%s); ignoring it (it is read-only, so it stays)",
                        self.path, problem)
            return
        try:  # only the file we found damaged: another process may have put a fresh one there already
            with self._no_quarantine():
                aside = fs.move_aside(self.path, "corrupt", self._ino, companions=("-wal",), drop=("-shm",))
        except (OSError, RecordError) as exc:
            self._ignored = True
            log.warning("record database %s is damaged (%s) and cannot be moved aside (%s); ignoring it",
                        self.path, problem, exc)
            return
        if aside is not None:
            log.warning("record database %s is damaged (%s); moved it to %s and started a fresh one",
                        self.path, problem, aside)

    def _decode(self, rows: Iterable[tuple[Any, ...]]) -> list[Record]:
        """The rows that decode; each bad one is skipped with one warning (per database object)."""
        records = []
        for row in rows:
            try:
                records.append(row_to_record(row, self.path))
            except RecordError as exc:
                if (row[0], row[1]) not in self._bad_rows:
                    self._bad_rows.add((row[0], row[1]))
                    log.warning("%s; skipping it (`tuneforge records clear` removes it)", exc)
        return records

    def _query(self, sql: str, args: tuple[Any, ...] = ()) -> list[Record]:
        return self._run(lambda conn: self._decode(conn.execute(sql, args)), write=False, default=[])

    def _merged(self, ours: list[Record], theirs: Callable[[RecordDB], list[Record]]) -> list[Record]:
        """``ours`` with the overlay's rows (which win) merged in, ordered by key, then choice."""
        if self._overlay is None:
            return ours
        rows = {(r.key, r.choice): r for r in ours}
        rows.update({(r.key, r.choice): r for r in theirs(self._overlay)})
        return [rows[k] for k in sorted(rows)]

    # ------------------------------------------------------------------------------------ reads

    def get(self, key: str) -> list[Record]:
        """Every row of ``key`` (any status), ordered by choice."""
        return self._merged(self._query(f'{SELECT_RECORDS} WHERE "key" = ? ORDER BY "choice"', (key,)),
                            lambda db: db.get(key))

    def get_choice(self, key: str, choice: str) -> Record | None:
        rows = self._query(f'{SELECT_RECORDS} WHERE "key" = ? AND "choice" = ?', (key, choice))
        if self._overlay is not None:
            rows = [r for r in self.get(key) if r.choice == choice]
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
        rows = self._query(f'{SELECT_RECORDS} WHERE "key" = ? AND "status" = \'ok\' AND "{column}" IS NOT NULL '
                           f'ORDER BY "{column}", "choice" LIMIT ?', (key, k))
        if self._overlay is None:
            return rows
        ok = [r for r in self.get(key) if r.status == "ok" and getattr(r, column) is not None]
        return sorted(ok, key=lambda r: (getattr(r, column), r.choice))[:k]

    def keys(self, op: str | None = None) -> list[str]:
        def go(conn: sqlite3.Connection) -> list[str]:
            if op is None:
                rows = conn.execute('SELECT DISTINCT "key" FROM records ORDER BY "key"')
            else:
                rows = conn.execute('SELECT DISTINCT "key" FROM records WHERE "op" = ? ORDER BY "key"', (op,))
            return [row[0] for row in rows]
        keys: list[str] = self._run(go, write=False, default=[])
        return keys if self._overlay is None else sorted({*keys, *self._overlay.keys(op)})

    def records(self, op: str | None = None) -> list[Record]:
        """Every row that decodes (optionally of one op), ordered by key, then choice."""
        if op is None:
            rows = self._query(f'{SELECT_RECORDS} ORDER BY "key", "choice"')
        else:
            rows = self._query(f'{SELECT_RECORDS} WHERE "op" = ? ORDER BY "key", "choice"', (op,))
        return self._merged(rows, lambda db: db.records(op))

    def count(self) -> int:
        def go(conn: sqlite3.Connection) -> int:
            return int(conn.execute("SELECT COUNT(*) FROM records").fetchone()[0])
        return self._run(go, write=False, default=0) if self._overlay is None else len(self.records())

    # ----------------------------------------------------------------------------------- writes

    def put(self, record: Record) -> None:
        """Insert or replace the row of (record.key, record.choice); ``created == 0`` becomes now."""
        self.put_many([record])

    def put_many(self, records: Iterable[Record]) -> None:
        """Insert or replace many rows in one transaction."""
        now = time.time()
        stamped = []
        for record in records:
            if not isinstance(record, Record):
                raise RecordError(f"expected a Record, got {type(record).__name__}")
            stamped.append(record if record.created else dataclasses.replace(record, created=now))
        overlay = self._writes_elsewhere()
        if not stamped or overlay is not None:
            return None if overlay is None else overlay.put_many(stamped)
        rows = [record_to_row(record) for record in stamped]
        sql = f"INSERT OR REPLACE INTO records ({COLUMN_SQL}) VALUES ({', '.join('?' * len(COLUMNS))})"
        self._run(lambda conn: conn.executemany(sql, rows), write=True, default=None)

    def delete(self, key: str) -> int:
        """Remove every row of ``key``; returns the number removed."""
        return self._run(lambda conn: conn.execute('DELETE FROM records WHERE "key" = ?', (key,)).rowcount,
                         write=True, default=0)

    def clear(self, op: str | None = None) -> int:
        """Remove every row (or every row of one op); returns the number removed.  A damaged file is
        replaced by a fresh one (the old one is kept aside)."""
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
        overlay = self._writes_elsewhere()
        if overlay is not None:
            return overlay.import_bundle({"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION,
                                          "records": [r.to_json() for r in incoming]}, keep=keep)
        now = time.time()
        insert = f"INSERT OR REPLACE INTO records ({COLUMN_SQL}) VALUES ({', '.join('?' * len(COLUMNS))})"

        def merge(conn: sqlite3.Connection) -> int:
            written = 0
            for theirs in incoming:
                row = conn.execute(f'{SELECT_RECORDS} WHERE "key" = ? AND "choice" = ?', (theirs.key, theirs.choice))
                found = self._decode(row.fetchall())  # a row that no longer decodes is replaced
                if found:
                    ours = found[0]
                    if keep == "better" and not _better(theirs, ours):
                        continue
                    if keep == "newer" and not theirs.created > ours.created:
                        continue
                fresh = theirs if theirs.created else dataclasses.replace(theirs, created=now)
                conn.execute(insert, record_to_row(fresh))
                written += 1
            return written

        written = self._run(merge, write=True, default=0)
        log.debug("record database %s: imported %d of %d records (keep=%s)", self.path, written,
                  len(incoming), keep)
        return written
