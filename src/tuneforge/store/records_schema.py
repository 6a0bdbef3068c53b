"""The record database's SQLite schema: columns, migrations, row conversion, and error classes.

Kept apart from `records.py` (the database's behaviour: opening, damage handling, overlays, reads and
writes) because the schema is what a migration changes, and it reads best on its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tuneforge.store.record import Record, RecordError, json_text

COLUMNS = tuple(f.name for f in dataclasses.fields(Record))
COLUMN_SQL = ", ".join(f'"{c}"' for c in COLUMNS)
SELECT_RECORDS = f"SELECT {COLUMN_SQL} FROM records"


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


# MIGRATIONS[i] takes a database from schema version i to i + 1, inside one write transaction.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [_migrate_0_to_1]


def schema_version(conn: sqlite3.Connection, path: Path) -> int:
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone() is None:
        return 0
    row = conn.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
    if row is None:
        return 0
    try:
        return int(row[0])
    except (TypeError, ValueError):
        raise Damaged(f"record database {path} has an invalid schema_version {row[0]!r}") from None


class Damaged(RecordError):
    """The file's content is damaged (as opposed to locked, newer, or read-only)."""


def row_to_record(row: tuple[Any, ...], path: Path) -> Record:
    values = dict(zip(COLUMNS, row, strict=True))
    try:
        values["params"] = json.loads(values["params"])
        values["info"] = json.loads(values["info"])
        return Record(**values)
    except (ValueError, TypeError, RecordError) as exc:
        raise RecordError(f"record database {path}: bad row for key {values['key']!r}, choice "
                          f"{values['choice']!r}: {exc}") from None


def record_to_row(record: Record) -> tuple[Any, ...]:
    return tuple(json_text(getattr(record, c), c) if c in ("params", "info") else getattr(record, c)
                 for c in COLUMNS)


@contextlib.contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[None]:
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


BUSY = ((5, 6), ("locked", "busy"))  # SQLITE_BUSY, SQLITE_LOCKED
CORRUPT = ((11, 26), ("malformed", "not a database"))  # SQLITE_CORRUPT, SQLITE_NOTADB


def is_error(exc: sqlite3.Error, kind: tuple[tuple[int, ...], tuple[str, ...]]) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)  # Python >= 3.11
    if code is not None:
        return (code & 0xFF) in kind[0]
    return any(word in str(exc).lower() for word in kind[1])
