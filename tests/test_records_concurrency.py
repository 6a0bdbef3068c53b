"""Tests of the tuning-record database under concurrency: real processes writing at once, threads sharing one
instance, a forked child, a locked database."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tuneforge.store.records import RecordDB, RecordError

from .record_helpers import (
    db_fixture,  # noqa: F401 (the `db` fixture)
    rec,
)

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
