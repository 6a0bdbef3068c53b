"""Tests of record bundles: export and import round trips, keep policies, bad records, bad bundle files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tuneforge.store.records import BUNDLE_FORMAT, BUNDLE_VERSION, RecordDB, RecordError, read_bundle, write_bundle

from .record_helpers import filled_db, rec


def test_export_import_round_trip(tmp_path: Path) -> None:
    with filled_db(tmp_path / "a.sqlite") as src, RecordDB(tmp_path / "b.sqlite") as dst:
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
    with filled_db(tmp_path / "a.sqlite") as src, RecordDB(tmp_path / "b.sqlite") as dst:
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
