"""Tests of the tuning-record database: round trips, validation, ranking, schema, read-only, delete and keys.

Concurrent writers are in test_records_concurrency.py, bundles in test_records_bundles.py."""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tuneforge.store import records as records_mod
from tuneforge.store.records import SCHEMA_VERSION, STATUSES, Record, RecordDB, RecordError

from .record_helpers import (
    db_fixture,  # noqa: F401 (the `db` fixture)
    filled_db,
    full_record,
    rec,
)

# ------------------------------------------------------------------------------ round trip, validation

def test_round_trip_of_every_field(db: RecordDB) -> None:
    r = full_record()
    db.put(r)
    assert db.get("key-abc") == [r]
    assert db.get_choice("key-abc", "choice-xyz") == r
    assert db.get_choice("key-abc", "other") is None
    assert db.get("missing") == []
    assert Record.from_json(json.loads(json.dumps(r.to_json()))) == r
    # the same values come back through a second, fresh connection
    with RecordDB(db.path) as other:
        assert other.records() == [r]
    raw = sqlite3.connect(db.path)
    types = raw.execute("SELECT typeof(median_ms), typeof(p80_ms), typeof(count), typeof(created), params "
                        "FROM records").fetchone()
    raw.close()
    assert types[:4] == ("real", "real", "integer", "real")
    assert json.loads(types[4]) == r.params


def test_put_sets_created_and_integers_become_floats(db: RecordDB) -> None:
    before = time.time()
    db.put(rec(median=3, min_ms=2))
    after = time.time()
    got = db.get_choice("k1", "c1")
    assert got is not None
    assert before <= got.created <= after
    assert isinstance(got.median_ms, float) and got.median_ms == 3.0 and got.min_ms == 2.0
    assert got.time() == 3.0 and got.time("min") == 2.0 and got.time("mean") is None


def test_upsert_replaces_the_row(db: RecordDB) -> None:
    db.put(rec(median=5.0, error="", params={"v": 1}))
    db.put(rec(status="timeout", median=None, error="took too long", params={"v": 2}))
    assert db.count() == 1
    (got,) = db.get("k1")
    assert (got.status, got.median_ms, got.error, got.params) == ("timeout", None, "took too long", {"v": 2})


def test_status_is_validated() -> None:
    for status in STATUSES:
        assert rec(status=status).status == status
    with pytest.raises(RecordError, match="'fast'"):
        rec(status="fast")
    with pytest.raises(RecordError, match="'OK'"):
        Record.from_json({**rec().to_json(), "status": "OK"})


@pytest.mark.parametrize(("field", "value"), [
    ("median_ms", "1.0"), ("median_ms", math.nan), ("min_ms", -1.0), ("p80_ms", True), ("count", -1),
    ("count", 1.5), ("key", ""), ("op", 3), ("params", {"f": object()}), ("info", [1]), ("created", None),
])
def test_fields_are_validated(field: str, value: Any) -> None:
    with pytest.raises(RecordError, match=repr(field)):
        Record.from_json({**rec().to_json(), field: value})


def test_from_json_names_missing_and_unknown_fields() -> None:
    d = rec().to_json()
    del d["choice_name"]
    with pytest.raises(RecordError, match="'choice_name' is missing"):
        Record.from_json(d)
    with pytest.raises(RecordError, match="'speed'"):
        Record.from_json({**rec().to_json(), "speed": 1})
    with pytest.raises(RecordError, match="JSON object"):
        Record.from_json([1, 2])


def test_statistic_is_validated_and_never_reaches_sql(db: RecordDB) -> None:
    db.put(rec())
    evil = "median_ms; DROP TABLE records; --"
    for bad in ("p99", "median_ms", evil):
        with pytest.raises(RecordError, match="unknown statistic"):
            db.best("k1", bad)
        with pytest.raises(RecordError, match="unknown statistic"):
            db.top_k("k1", 3, bad)
        with pytest.raises(RecordError, match="unknown statistic"):
            rec().time(bad)
    assert db.count() == 1
    with pytest.raises(RecordError, match="k must be"):
        db.top_k("k1", -1)


# ------------------------------------------------------------------------------------------- ranking

def test_best_and_top_k_order_and_filtering(db: RecordDB) -> None:
    rows = [
        rec(choice="a", median=2.0, min_ms=1.9, mean_ms=2.2),
        rec(choice="c", median=1.0, min_ms=0.9, mean_ms=1.1),   # ties with b on the median
        rec(choice="b", median=1.0, min_ms=0.95, mean_ms=1.0),
        rec(choice="d", status="compile_error", median=0.5, min_ms=0.1, error="boom"),  # failed: never best
        rec(choice="e", median=None, min_ms=0.2),               # ok, but no median
        rec(choice="f", status="timeout", median=None),
        rec(key="k2", choice="z", median=0.01),                 # another key
    ]
    db.put_many(reversed(rows))  # insertion order must not matter
    assert [r.choice for r in db.top_k("k1", 10)] == ["b", "c", "a"]
    assert [r.choice for r in db.top_k("k1", 2)] == ["b", "c"]
    assert db.top_k("k1", 0) == []
    best = db.best("k1")
    assert best is not None and best.choice == "b"
    assert [r.choice for r in db.top_k("k1", 10, "min")] == ["e", "c", "b", "a"]
    best_mean = db.best("k1", "mean")
    assert best_mean is not None and best_mean.choice == "b"
    assert db.best("missing") is None
    assert [r.choice for r in db.get("k1")] == ["a", "b", "c", "d", "e", "f"]


def test_best_when_every_choice_failed(db: RecordDB) -> None:
    db.put_many([rec(choice="a", status="crash", median=None), rec(choice="b", status="wrong_result", median=1.0)])
    assert db.best("k1") is None
    assert db.top_k("k1", 5) == []
    assert len(db.get("k1")) == 2


# ---------------------------------------------------------------------------------------------- schema

def _raw(path: Path, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()


def test_schema_version_and_wal_mode_are_stored(db: RecordDB) -> None:
    assert len(records_mod.MIGRATIONS) == SCHEMA_VERSION
    assert db.count() == 0 and not db.path.exists()  # reading never creates the file
    db.put(rec())
    assert _raw(db.path, "SELECT value FROM meta WHERE name = 'schema_version'") == [(str(SCHEMA_VERSION),)]
    assert _raw(db.path, "PRAGMA journal_mode") == [("wal",)]


def test_future_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "records.sqlite"
    with RecordDB(path) as db:
        db.put(rec())
    _raw(path, "UPDATE meta SET value = '99' WHERE name = 'schema_version'")
    for readonly in (False, True):
        with RecordDB(path, readonly=readonly) as db, pytest.raises(RecordError, match="upgrade tuneforge") as info:
            db.get("k1")
        assert "99" in str(info.value) and str(path) in str(info.value)


def test_v0_database_is_migrated(tmp_path: Path) -> None:
    path = tmp_path / "records.sqlite"
    _raw(path, "CREATE TABLE unrelated (x INTEGER)")  # an existing file without a meta table: version 0
    _raw(path, "INSERT INTO unrelated VALUES (7)")
    with RecordDB(path, readonly=True) as ro:
        assert ro.get("k1") == [] and ro.count() == 0  # nothing to read yet, nothing changed
    assert _raw(path, "SELECT name FROM sqlite_master WHERE type = 'table'") == [("unrelated",)]
    with RecordDB(path) as db:
        assert db.count() == 0
        db.put(rec())
    assert _raw(path, "SELECT value FROM meta WHERE name = 'schema_version'") == [("1",)]
    assert _raw(path, "SELECT x FROM unrelated") == [(7,)]


def test_migrations_run_in_order_on_an_older_database(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "records.sqlite"
    with RecordDB(path) as db:
        db.put(rec(median=4.0))
    calls: list[int] = []

    def to_v2(conn: sqlite3.Connection) -> None:
        calls.append(2)
        conn.execute("CREATE TABLE extra_v2 (x INTEGER)")

    def to_v3(conn: sqlite3.Connection) -> None:
        calls.append(3)
        conn.execute("INSERT INTO extra_v2 VALUES (3)")

    monkeypatch.setattr(records_mod, "MIGRATIONS", [*records_mod.MIGRATIONS, to_v2, to_v3])
    with RecordDB(path) as db:
        assert [r.median_ms for r in db.get("k1")] == [4.0]  # data kept
    assert calls == [2, 3]
    assert _raw(path, "SELECT value FROM meta WHERE name = 'schema_version'") == [("3",)]
    assert _raw(path, "SELECT x FROM extra_v2") == [(3,)]
    with RecordDB(path) as db:
        db.count()
    assert calls == [2, 3]  # an up-to-date database is not migrated again
    monkeypatch.undo()
    with RecordDB(path) as db, pytest.raises(RecordError, match="schema version 3, newer"):
        db.count()


def test_a_file_that_is_not_a_database_is_moved_aside(tmp_path: Path) -> None:
    path = tmp_path / "records.sqlite"
    path.write_bytes(b"this is not a database" * 100)
    with RecordDB(path) as db:
        assert db.get("k1") == []
        db.put(rec("k1", "c1"))
        assert [r.choice for r in db.get("k1")] == ["c1"]
    assert [p.read_bytes() for p in tmp_path.glob("records.sqlite.corrupt-*")] == [b"this is not a database" * 100]


# ------------------------------------------------------------------------------------------- read-only

def test_readonly_missing_file_is_empty_and_never_created(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "records.sqlite"
    with RecordDB(path, readonly=True) as db:
        assert db.get("k1") == [] and db.records() == [] and db.keys() == [] and db.count() == 0
        assert db.best("k1") is None and db.top_k("k1", 3) == [] and db.get_choice("k1", "c1") is None
        assert db.export_bundle()["records"] == []
        for write in (lambda: db.put(rec()), lambda: db.put_many([rec()]), lambda: db.delete("k1"),
                      lambda: db.clear(), lambda: db.import_bundle(filled_db(tmp_path / "src.sqlite").export_bundle())):
            with pytest.raises(RecordError, match="read-only"):
                write()
    assert not path.parent.exists()


def test_readonly_reads_an_existing_database_and_sees_new_rows(tmp_path: Path) -> None:
    path = tmp_path / "records.sqlite"
    with RecordDB(path) as writer, RecordDB(path, readonly=True) as reader:
        writer.put(rec(choice="a"))
        assert [r.choice for r in reader.get("k1")] == ["a"]
        writer.put(rec(choice="b", median=0.5))
        best = reader.best("k1")
        assert best is not None and best.choice == "b"
        with pytest.raises(RecordError, match="read-only"):
            reader.put(rec(choice="c"))
        assert writer.count() == 2


# ----------------------------------------------------------------------------------- delete, clear, keys

def test_delete_clear_and_keys(db: RecordDB) -> None:
    db.put_many([rec(key="m1", choice="a"), rec(key="m1", choice="b"), rec(key="m2", choice="a"),
                 rec(key="c1", choice="a", op="conv"), rec(key="c2", choice="a", op="conv")])
    assert db.keys() == ["c1", "c2", "m1", "m2"]
    assert db.keys(op="matmul") == ["m1", "m2"]
    assert db.keys(op="nothing") == []
    assert [(r.key, r.choice) for r in db.records(op="matmul")] == [("m1", "a"), ("m1", "b"), ("m2", "a")]
    assert db.delete("m1") == 2
    assert db.delete("m1") == 0
    assert db.keys() == ["c1", "c2", "m2"]
    assert db.clear(op="conv") == 2
    assert db.keys() == ["m2"]
    assert db.clear() == 1
    assert db.count() == 0 and db.keys() == []


def test_put_many_of_nothing_creates_nothing(tmp_path: Path) -> None:
    with RecordDB(tmp_path / "sub" / "records.sqlite") as db:
        db.put_many([])
        assert not db.path.parent.exists()
        with pytest.raises(RecordError, match="expected a Record"):
            db.put_many([rec().to_json()])  # type: ignore[list-item]


def test_module_stays_out_of_upper_layers() -> None:
    code = textwrap.dedent("""
        import sys
        import tuneforge.store.records
        bad = [m for m in sys.modules if m.startswith(("tuneforge.tune", "tuneforge.compile"))]
        assert not bad, bad
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_numpy_scalars_are_accepted() -> None:
    np = pytest.importorskip("numpy")
    r = rec(median=np.float64(1.5), min_ms=np.float32(0.5), count=np.int64(3))
    assert (r.median_ms, r.min_ms, r.count) == (1.5, 0.5, 3)
    assert type(r.median_ms) is float and type(r.count) is int
    json.dumps(r.to_json())


def test_a_scaled_record_scales_every_timing_figure_and_adds_to_its_info() -> None:
    record = Record(key="k", choice="c", op="op", choice_name="c", status="ok", median_ms=2.0, min_ms=1.5,
                    p80_ms=None, count=5, info={"family": "f"})
    scaled = record.scaled(1.5, search_level=1.5)
    assert (scaled.median_ms, scaled.min_ms, scaled.p80_ms, scaled.count) == (3.0, 2.25, None, 5)
    assert scaled.info == {"family": "f", "search_level": 1.5} and record.info == {"family": "f"}
