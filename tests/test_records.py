"""Tests of the tuning-record database: round trips, ranking, real concurrent writers, bundles, schema, read-only."""

from __future__ import annotations

import json
import math
import os
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tuneforge.store import records as records_mod
from tuneforge.store.records import (
    BUNDLE_FORMAT,
    BUNDLE_VERSION,
    SCHEMA_VERSION,
    STATUSES,
    Record,
    RecordDB,
    RecordError,
    read_bundle,
    write_bundle,
)


def rec(key: str = "k1", choice: str = "c1", status: str = "ok", median: float | None = 1.0, **kw: Any) -> Record:
    fields: dict[str, Any] = {"op": "matmul", "choice_name": f"name-{choice}", "median_ms": median}
    fields.update(kw)
    return Record(key=key, choice=choice, status=status, **fields)


def full_record() -> Record:
    return Record(key="key-abc", choice="choice-xyz", op="matmul", choice_name="tile 64x64 (unroll 4)",
                  status="wrong_result", median_ms=1.25, min_ms=1.0, mean_ms=1.5, p20_ms=1.1, p80_ms=1.7,
                  count=17, method="cpu-perf_counter", error="max abs diff 0.5 > 1e-4",
                  params={"tile": [64, 64], "unroll": 4, "nested": {"a": None, "b": True, "c": "x"}},
                  inputs="float32[512x512], float32[512x512]", system="sys-1234",
                  info={"flags": ["-O3"], "mutates_inputs": False}, created=1_700_000_000.5)


@pytest.fixture
def db(tmp_path: Path) -> Any:
    with RecordDB(tmp_path / "records.sqlite") as database:
        yield database


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


# ----------------------------------------------------------------------------------------- concurrency

_MAKE = """
from tuneforge.store.records import Record

def make(worker, i):
    return Record(key=f"key-{i % 7}", choice=f"w{worker}-c{i:04d}", op=f"op{worker % 2}", choice_name=f"W{worker} #{i}",
                  status="ok" if i % 5 else "runtime_error", median_ms=worker * 1000 + i + 0.25, min_ms=i * 0.5,
                  count=i, method="cpu-perf_counter", error="" if i % 5 else f"error {worker}/{i}",
                  params={"worker": worker, "i": i, "tile": [i, i + 1]}, inputs=f"float32[{i}]", system="sys",
                  info={"even": i % 2 == 0}, created=1e9 + i)
"""

_WRITER = _MAKE + """
import sys, time, pathlib
from tuneforge.store.records import RecordDB
path, work, worker = sys.argv[1], pathlib.Path(sys.argv[2]), int(sys.argv[3])
db = RecordDB(path)
(work / f"ready-{worker}").touch()
while not (work / "go").exists():
    time.sleep(0.001)
for i in range(200):
    db.put(make(worker, i))
    if i % 20 == 0:  # every worker also fights over one shared row
        db.put(Record(key="shared", choice="same", op="op0", choice_name="shared", status="ok", median_ms=i))
for start in range(200, 260, 15):
    db.put_many(make(worker, i) for i in range(start, start + 15))
print("done", worker)
"""


def test_four_processes_writing_concurrently_lose_nothing(tmp_path: Path) -> None:
    path, work = tmp_path / "db" / "records.sqlite", tmp_path / "work"
    work.mkdir()
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(path), str(work), str(w)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in range(4)]
    try:
        deadline = time.monotonic() + 60
        while len(list(work.glob("ready-*"))) < 4:
            assert time.monotonic() < deadline, "writers did not start"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs if p.poll() is not None]
            time.sleep(0.005)
        (work / "go").touch()  # the barrier: every writer starts now
        outputs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for p, (out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
        assert out.startswith("done")
    namespace: dict[str, Any] = {}
    exec(_MAKE, namespace)
    expected = {(r.key, r.choice): r for r in (namespace["make"](w, i) for w in range(4) for i in range(260))}
    with RecordDB(path, readonly=True) as db:
        assert db.count() == len(expected) + 1 == 1041
        stored = {(r.key, r.choice): r for r in db.records()}
    assert stored.pop(("shared", "same")).median_ms in {float(i) for i in range(0, 200, 20)}
    assert stored == expected


def test_threads_share_one_instance(db: RecordDB) -> None:
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            for i in range(40):
                db.put(rec(key=f"t{t}", choice=f"c{i}", median=float(i)))
                db.get(f"t{t}")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert db.count() == 160


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_opens_its_own_connection(db: RecordDB) -> None:
    db.put(rec(choice="parent"))
    parent_conn = db._conn
    assert parent_conn is not None
    pid = os.fork()
    if pid == 0:  # child: must not reuse the parent's connection
        code = 1
        try:
            db.put(rec(choice="child"))
            code = 0 if db._conn is not None and db._conn is not parent_conn else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert db._conn is parent_conn
    assert [r.choice for r in db.get("k1")] == ["child", "parent"]
    db.put(rec(choice="parent-again"))
    assert db.count() == 3


def test_locked_database_retries_then_gives_up_naming_the_path(tmp_path: Path) -> None:
    path = tmp_path / "records.sqlite"
    with RecordDB(path) as db:
        db.put(rec(choice="first"))
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")
    try:
        start = time.monotonic()
        with RecordDB(path, timeout_s=0.3) as db, pytest.raises(RecordError, match="locked") as info:
            db.put(rec(choice="second"))
        assert time.monotonic() - start >= 0.25
        assert str(path) in str(info.value)
        releaser = threading.Timer(0.3, lambda: holder.execute("COMMIT"))
        releaser.start()
        with RecordDB(path, timeout_s=10) as db:  # waits for the holder, then succeeds
            db.put(rec(choice="third"))
            releaser.join()
            assert [r.choice for r in db.get("k1")] == ["first", "third"]
    finally:
        if holder.in_transaction:
            holder.execute("ROLLBACK")
        holder.close()


# --------------------------------------------------------------------------------------------- bundles

def _filled(path: Path) -> RecordDB:
    db = RecordDB(path)
    db.put_many([full_record(), rec(choice="a", median=2.0, created=100.0),
                 rec(key="k2", choice="b", op="conv", status="crash", median=None, error="SIGSEGV", created=100.0)])
    return db


def test_export_import_round_trip(tmp_path: Path) -> None:
    with _filled(tmp_path / "a.sqlite") as src, RecordDB(tmp_path / "b.sqlite") as dst:
        bundle = src.export_bundle()
        assert (bundle["format"], bundle["version"]) == (BUNDLE_FORMAT, BUNDLE_VERSION)
        assert isinstance(bundle["exported"], float) and len(bundle["records"]) == 3
        file = tmp_path / "out" / "bundle.json"
        write_bundle(bundle, file)
        assert [p.name for p in file.parent.iterdir()] == ["bundle.json"]  # no temp file left behind
        assert read_bundle(file) == json.loads(json.dumps(bundle))
        assert dst.import_bundle(file) == 3
        assert dst.records() == src.records()
        assert dst.import_bundle(bundle) == 0  # importing the same rows again changes nothing
        conv = src.export_bundle(op="conv")["records"]
        assert [r["key"] for r in conv] == ["k2"]


def test_import_keep_policies(tmp_path: Path) -> None:
    ours = [rec(choice="fast", median=1.0, created=200.0), rec(choice="failed", status="timeout", median=None,
                                                                created=200.0),
            rec(choice="slow", median=9.0, created=200.0), rec(choice="nomedian", median=None, created=200.0)]
    theirs = [rec(choice="fast", median=2.0, created=300.0),     # worse but newer
              rec(choice="failed", median=5.0, created=100.0),   # ok beats failed, older
              rec(choice="slow", median=3.0, created=100.0),     # better, older
              rec(choice="nomedian", median=4.0, created=300.0),  # a median beats none
              rec(choice="new", status="crash", median=None, created=50.0)]  # no conflict: always written
    bundle = {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "exported": 0.0,
              "records": [r.to_json() for r in theirs]}
    expected = {
        "better": {"fast": 1.0, "failed": 5.0, "slow": 3.0, "nomedian": 4.0, "new": None},
        "newer": {"fast": 2.0, "failed": None, "slow": 9.0, "nomedian": 4.0, "new": None},
        "theirs": {"fast": 2.0, "failed": 5.0, "slow": 3.0, "nomedian": 4.0, "new": None},
    }
    written = {"better": 4, "newer": 3, "theirs": 5}
    for keep, medians in expected.items():
        with RecordDB(tmp_path / f"{keep}.sqlite") as db:
            db.put_many(ours)
            assert db.import_bundle(bundle, keep=keep) == written[keep], keep
            assert {r.choice: r.median_ms for r in db.get("k1")} == medians, keep
    with RecordDB(tmp_path / "x.sqlite") as db, pytest.raises(RecordError, match="keep policy 'mine'"):
        db.import_bundle(bundle, keep="mine")
    # keep="better" between two failed rows keeps ours
    with RecordDB(tmp_path / "failed.sqlite") as db:
        db.put(rec(status="crash", median=None, error="ours", created=1.0))
        failed = {**bundle, "records": [rec(status="timeout", median=None, error="theirs", created=2.0).to_json()]}
        assert db.import_bundle(failed) == 0
        assert db.get("k1")[0].error == "ours"


def test_bad_record_imports_nothing_and_names_index_and_field(tmp_path: Path) -> None:
    with _filled(tmp_path / "a.sqlite") as src, RecordDB(tmp_path / "b.sqlite") as dst:
        dst.put(rec(key="mine", choice="x"))
        bundle = src.export_bundle()
        bundle["records"].append(rec(key="late", choice="y").to_json())
        bundle["records"][2]["median_ms"] = "fast"
        with pytest.raises(RecordError, match=r"record 2: record field 'median_ms'"):
            dst.import_bundle(bundle)
        bundle["records"][2]["median_ms"] = 1.0
        bundle["records"][1]["status"] = "great"
        with pytest.raises(RecordError, match=r"record 1: .*'great'"):
            dst.import_bundle(bundle)
        assert [r.key for r in dst.records()] == ["mine"]
        with pytest.raises(RecordError, match="record 1"):
            write_bundle(bundle, tmp_path / "bad.json")
        assert not (tmp_path / "bad.json").exists()


def test_bundle_files_with_wrong_format_or_version(tmp_path: Path) -> None:
    good = {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "exported": 1.0, "records": [rec().to_json()]}
    cases: list[tuple[Any, str]] = [
        ({**good, "format": "something-else"}, "not a tuneforge records bundle"),
        ({**good, "version": BUNDLE_VERSION + 1}, "newer than this tuneforge supports.*upgrade tuneforge"),
        ({**good, "version": "1"}, "invalid bundle version"),
        ({**good, "records": {"a": 1}}, "'records' must be a list"),
        ([good], "not a tuneforge records bundle"),
    ]
    for i, (doc, message) in enumerate(cases):
        file = tmp_path / f"case{i}.json"
        file.write_text(json.dumps(doc))
        with pytest.raises(RecordError, match=message) as info:
            read_bundle(file)
        assert str(file) in str(info.value)
        with RecordDB(tmp_path / "db.sqlite") as db, pytest.raises(RecordError, match=message):
            db.import_bundle(file)
        with pytest.raises(RecordError, match=message):
            write_bundle(doc, tmp_path / "never.json")
    (tmp_path / "garbage.json").write_text("{not json")
    with pytest.raises(RecordError, match=r"garbage\.json is not valid JSON"):
        read_bundle(tmp_path / "garbage.json")
    with pytest.raises(RecordError, match=r"missing\.json does not exist"):
        read_bundle(tmp_path / "missing.json")
    assert not (tmp_path / "never.json").exists()
    assert not (tmp_path / "db.sqlite").exists()
    # write_bundle replaces an existing file atomically
    target = tmp_path / "b.json"
    target.write_text("old")
    write_bundle(good, target)
    assert read_bundle(target) == good


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
                      lambda: db.clear(), lambda: db.import_bundle(_filled(tmp_path / "src.sqlite").export_bundle())):
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
