"""Shared by the record-database tests (test_records.py, test_records_concurrency.py,
test_records_bundles.py): records to store, a database per test, and a database with a few rows.

The `db` fixture is defined under another function name so that a test module can import it without
its tests' `db` argument shadowing the import (ruff F811); it is not in conftest.py because the name
is too generic for the whole suite.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tuneforge.store.records import Record, RecordDB


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


@pytest.fixture(name="db")
def db_fixture(tmp_path: Path) -> Iterator[RecordDB]:
    with RecordDB(tmp_path / "records.sqlite") as database:
        yield database


def filled_db(path: Path) -> RecordDB:
    db = RecordDB(path)
    db.put_many([full_record(), rec(choice="a", median=2.0, created=100.0),
                 rec(key="k2", choice="b", op="conv", status="crash", median=None, error="SIGSEGV", created=100.0)])
    return db
