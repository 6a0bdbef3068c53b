"""The two tier interfaces (`store/tiers.py`) against a real SQLite database, a real artifact store and a
real redis-server: the order of a record lookup and what each tier contributes, `commit` and
`committing` (local at once, remote once per key), and artifacts fetched or built once and shared."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tuneforge import warn_once
from tuneforge.store import tiers
from tuneforge.store.artifacts import ArtifactStore
from tuneforge.store.record import Record
from tuneforge.store.records import RecordDB
from tuneforge.store.remote import RemoteCache
from tuneforge.store.shipped import BundleSet
from tuneforge.store.tiers import ArtifactTiers, RecordTiers

KEY = "selkey-0123456789abcdef"
ART = "cppabcdefghijklmnop234567"


def record(choice: str, median_ms: float = 1.0, key: str = KEY) -> Record:
    return Record(key=key, choice=choice, op="mm", choice_name=f"tile-{choice}", status="ok", median_ms=median_ms,
                  min_ms=median_ms, count=3, method="cpu", params={"tile": 16}, inputs='[["f32",[64,64]]]',
                  system="sys1", info={}, created=1700000000.0)


def bundle_of(path: Path, *records: Record) -> BundleSet:
    path.write_text(json.dumps({"format": "tuneforge-records", "version": 1,
                                "records": [r.to_json() for r in records]}))
    shipped = BundleSet()
    shipped.add(path)
    return shipped


@pytest.fixture
def db(tmp_path: Path) -> Iterator[RecordDB]:
    database = RecordDB(tmp_path / "records.db")
    yield database
    database.close()


@pytest.fixture
def make_remote() -> Iterator[Callable[[str], RemoteCache]]:
    pytest.importorskip("redis")
    pytest.importorskip("zstandard")
    made: list[RemoteCache] = []
    warn_once.forget()

    def make(url: str) -> RemoteCache:
        made.append(RemoteCache(url))
        return made[-1]

    yield make
    for cache in made:
        cache.close()


# ------------------------------------------------------------------------------------- records, no remote

def test_local_records_answer_first_and_only_the_wanted_choices(db: RecordDB, tmp_path: Path) -> None:
    db.put_many([record("a"), record("b"), record("gone")])
    shipped = bundle_of(tmp_path / "b.json", record("a", 9.0))
    found, source = RecordTiers(lambda: db, lambda: None, lambda: shipped).lookup(KEY, {"a", "b"})
    assert source == "records" and sorted(found) == ["a", "b"] and found["a"].median_ms == 1.0


def test_a_bundle_fills_what_is_missing_read_only(db: RecordDB, tmp_path: Path) -> None:
    db.put(record("a"))
    shipped = bundle_of(tmp_path / "b.json", record("a", 9.0), record("b", 2.0))
    found, source = RecordTiers(lambda: db, lambda: None, lambda: shipped).lookup(KEY, {"a", "b", "c"})
    assert source == "bundle" and found["a"].median_ms == 1.0 and found["b"].median_ms == 2.0
    assert [r.choice for r in db.get(KEY)] == ["a"]  # never copied into the local database


def test_no_tier_holds_the_key(db: RecordDB) -> None:
    assert RecordTiers(lambda: db, lambda: None, BundleSet).lookup(KEY, {"a"}) == ({}, "records")


def test_commit_keeps_a_record_locally_at_once(db: RecordDB) -> None:
    record_tiers = RecordTiers(lambda: db, lambda: None, BundleSet)
    record_tiers.commit(record("a"))
    assert record_tiers.local(KEY, {"a", "b"}) == {"a": record("a")}
    with record_tiers.committing(KEY) as commit:
        commit(record("b"))
        assert "b" in record_tiers.local(KEY, {"b"})  # kept as it comes, not when the batch ends


# ----------------------------------------------------------------------------------- records with a remote

@pytest.mark.redis
def test_the_remote_answers_when_it_holds_more_and_is_copied_locally(
        db: RecordDB, redis_clean: str, make_remote: Callable[[str], RemoteCache]) -> None:
    writer, reader = make_remote(redis_clean), make_remote(redis_clean)
    writer.put_records(KEY, [record("a", 5.0), record("b", 2.0)])
    assert writer.flush(10)
    db.put(record("a"))
    record_tiers = RecordTiers(lambda: db, lambda: reader, BundleSet)
    found, source = record_tiers.lookup(KEY, {"a", "b"})
    assert source == "remote" and sorted(found) == ["a", "b"]
    tiers.merge_pending()  # what the background timer (or exit) does
    assert sorted(r.choice for r in db.get(KEY)) == ["a", "b"]
    assert db.get_choice(KEY, "a") == record("a")  # the better (faster) local record is kept
    assert record_tiers.lookup(KEY, {"a", "b"})[1] == "records"


@pytest.mark.redis
def test_the_remote_is_not_asked_when_the_local_database_has_everything(
        db: RecordDB, redis_clean: str, make_remote: Callable[[str], RemoteCache]) -> None:
    reader = make_remote(redis_clean)
    db.put(record("a"))
    assert RecordTiers(lambda: db, lambda: reader, BundleSet).lookup(KEY, {"a"})[1] == "records"
    assert reader.stats.hits + reader.stats.misses == 0


@pytest.mark.redis
def test_a_batch_is_shared_once_as_the_whole_list_and_not_after_an_error(
        db: RecordDB, redis_clean: str, make_remote: Callable[[str], RemoteCache]) -> None:
    writer, reader = make_remote(redis_clean), make_remote(redis_clean)
    record_tiers = RecordTiers(lambda: db, lambda: writer, BundleSet)
    db.put(record("old"))
    with record_tiers.committing(KEY) as commit:
        commit(record("a"))
        commit(record("b"))
    assert writer.flush(10) and writer.stats.puts == 1
    assert sorted(r.choice for r in reader.get_records(KEY) or []) == ["a", "b", "old"]
    with pytest.raises(RuntimeError), record_tiers.committing(KEY) as commit:
        commit(record("c"))
        raise RuntimeError("the tuning machinery failed")
    assert writer.flush(10) and writer.stats.puts == 1  # kept locally, not shared
    assert "c" in record_tiers.local(KEY, {"c"})
    record_tiers.commit(record("d"))
    assert writer.flush(10) and writer.stats.puts == 2
    assert len(reader.get_records(KEY) or []) == 5


# --------------------------------------------------------------------------------------------- artifacts

def store_in(root: Path) -> ArtifactStore:
    return ArtifactStore(root, 2**30, lock_timeout_s=30.0)


def writes(text: str, calls: list[str]) -> Callable[[Path], dict[str, Any]]:
    def build(staging: Path) -> dict[str, Any]:
        calls.append(text)
        (staging / "note.txt").write_text(text)
        return {"built": text}

    return build


def test_get_or_build_builds_once_and_fetch_never_builds(tmp_path: Path) -> None:
    store = store_in(tmp_path / "a")
    artifacts = ArtifactTiers(lambda: store, lambda: None)
    assert artifacts.fetch(ART) is None
    assert store.get(ART) is None  # the refused fetch published nothing
    calls: list[str] = []
    entry = artifacts.get_or_build(ART, writes("one", calls), key_inputs={"source": "x"})
    again = artifacts.get_or_build(ART, writes("two", calls))
    assert calls == ["one"] and entry.meta["built"] == again.meta["built"] == "one"
    fetched = artifacts.fetch(ART)
    assert fetched is not None and fetched.file("note.txt").read_text() == "one"


@pytest.mark.redis
def test_an_artifact_built_on_one_machine_is_fetched_on_another(
        tmp_path: Path, redis_clean: str, make_remote: Callable[[str], RemoteCache]) -> None:
    writer, reader = make_remote(redis_clean), make_remote(redis_clean)
    calls: list[str] = []
    ArtifactTiers(lambda: store_in(tmp_path / "a"), lambda: writer).get_or_build(ART, writes("a", calls))
    assert writer.flush(10) and writer.stats.puts == 1  # a build is shared

    other = store_in(tmp_path / "b")
    fetched = ArtifactTiers(lambda: other, lambda: reader).fetch(ART)
    assert fetched is not None and fetched.meta["fetched_from_remote"] is True
    assert fetched.file("note.txt").read_text() == "a" and other.get(ART) is not None  # published locally
    third = store_in(tmp_path / "c")
    entry = ArtifactTiers(lambda: third, lambda: reader).get_or_build(ART, writes("c", calls))
    assert calls == ["a"] and entry.meta["built"] == "a"  # fetched, not built
    assert reader.flush(10) and reader.stats.puts == 0  # and a fetched artifact is not shared back


@pytest.mark.redis
def test_fetch_is_a_miss_when_no_tier_holds_it(tmp_path: Path, redis_clean: str,
                                                make_remote: Callable[[str], RemoteCache]) -> None:
    reader = make_remote(redis_clean)
    store = store_in(tmp_path / "a")
    assert ArtifactTiers(lambda: store, lambda: reader).fetch(ART) is None
    assert reader.stats.misses == 1 and store.get(ART) is None


# ------------------------------------------------------------------------------------------------ seams

def test_select_sources_name_the_record_tiers() -> None:
    from typing import get_args

    from tuneforge.tune.select import SOURCES

    assert set(get_args(tiers.RecordSource)) <= set(SOURCES)


def test_cache_stats_rows_are_formatted_by_the_cli() -> None:
    from tuneforge.cli import describe_remote

    counters = dict.fromkeys(tiers.REMOTE_COUNTERS, 0) | {"hits": 3, "misses": 1}
    rows = dict(describe_remote(counters))
    assert rows["remote hit rate"] == "75.0%" and rows["remote unusable entries"] == 0
    assert not hasattr(tiers, "describe_remote")
