"""Tests of the artifact store: round trips, eviction, stats, bad input, and a model-based property test.

Races and crashes are in test_store_artifacts_concurrency.py, corruption in test_store_artifacts_corruption.py."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tuneforge.store.artifacts import ArtifactStore, StoreError, validate_key

from .artifact_store_helpers import (
    KEY,
    KEY2,
    file_writer,
    root_fixture,  # noqa: F401 (the `root` fixture)
    run_script,
)


def _disk_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in (root / "entries").rglob("*") if p.is_file())


# ------------------------------------------------------------------------------------------ basics


def test_put_get_round_trip(root: Path, tmp_path: Path) -> None:
    store = ArtifactStore(root)
    assert not root.exists(), "constructing a store must not touch the disk"
    src = tmp_path / "lib.so"
    src.write_bytes(os.urandom(70_000))
    files = {"raw.bin": b"\x00\x01\xff", "note.txt": "héllo ✓", "lib.so": src}
    put = store.put(KEY, files, meta={"compiler": "cc", "flags": ["-O3"]}, key_inputs={"src": "abc"})

    got = store.get(KEY)
    assert got is not None
    assert got.path == root / "entries" / KEY[:2] / KEY == put.path
    assert got.file("raw.bin").read_bytes() == b"\x00\x01\xff"
    assert got.file("note.txt").read_text(encoding="utf-8") == "héllo ✓"
    assert got.file("lib.so").read_bytes() == src.read_bytes()
    expected = {"raw.bin": b"\x00\x01\xff", "note.txt": "héllo ✓".encode(), "lib.so": src.read_bytes()}
    manifest = json.loads((got.path / "manifest.json").read_text())
    assert manifest == got.manifest
    assert manifest["version"] == 1 and manifest["key"] == KEY and isinstance(manifest["created"], float)
    assert manifest["files"] == {n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()}
                                 for n, d in expected.items()}
    assert got.meta == {"compiler": "cc", "flags": ["-O3"]}
    assert got.key_inputs == {"src": "abc"}
    with pytest.raises(StoreError, match=r"missing\.bin"):
        got.file("missing.bin")

    assert store.get(KEY2) is None
    assert store.contains(KEY) and not store.contains(KEY2)
    assert store.keys() == [KEY]
    stats = store.stats()
    assert (stats.hits, stats.misses, stats.puts, stats.entries) == (1, 1, 1, 1)
    assert stats.bytes == _disk_bytes(root)

    assert store.remove(KEY) and not store.remove(KEY)
    assert store.get(KEY) is None and store.keys() == []
    assert store.stats().bytes == 0


def test_put_existing_key_returns_existing_entry(root: Path) -> None:
    store = ArtifactStore(root)
    store.put(KEY, {"a": b"first"})
    again = store.put(KEY, {"a": b"second"})
    assert again.file("a").read_bytes() == b"first"
    assert store.stats().puts == 1
    assert not any((root / "tmp").iterdir()), "the losing staging dir must be discarded"


def test_put_losing_the_publish_race_returns_winner(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = ArtifactStore(root)
    store.put(KEY, {"a": b"winner"})
    real = ArtifactStore._lookup
    calls: list[str] = []

    def blind_first(self: ArtifactStore, key: str) -> Any:
        calls.append(key)
        return None if len(calls) == 1 else real(self, key)  # the pre-check misses the winner

    monkeypatch.setattr(ArtifactStore, "_lookup", blind_first)
    entry = store.put(KEY, {"a": b"loser"})
    assert len(calls) == 2 and entry.file("a").read_bytes() == b"winner"
    assert store.stats().puts == 1 and store.keys() == [KEY]
    assert not any((root / "tmp").iterdir())


def test_get_or_build_merges_meta_and_counts(root: Path) -> None:
    store = ArtifactStore(root)
    calls = []

    def build(staging: Path) -> dict[str, Any]:
        calls.append(staging)
        assert list(staging.iterdir()) == []
        (staging / "out.o").write_bytes(b"obj")
        return {"compile_s": 1.5}

    e1 = store.get_or_build(KEY, build, meta={"cc": "gcc"}, key_inputs={"k": 1})
    e2 = store.get_or_build(KEY, build)
    assert len(calls) == 1 and not calls[0].exists()
    assert e1.meta == e2.meta == {"cc": "gcc", "compile_s": 1.5} and e2.key_inputs == {"k": 1}
    stats = store.stats()
    assert (stats.misses, stats.hits, stats.puts) == (1, 1, 1)


def test_build_failure_publishes_nothing(root: Path) -> None:
    store = ArtifactStore(root, lock_timeout_s=0.5)

    def bad(staging: Path) -> None:
        (staging / "half.o").write_bytes(b"partial")
        raise RuntimeError("compiler exploded")

    with pytest.raises(RuntimeError, match="exploded"):
        store.get_or_build(KEY, bad)
    assert store.get(KEY) is None and store.keys() == []
    assert list((root / "tmp").iterdir()) == []
    # The lock was released: a second build goes through at once.
    assert store.get_or_build(KEY, file_writer("ok.o", b"ok")).file("ok.o").read_bytes() == b"ok"


def test_build_leaving_a_subdirectory_is_rejected(root: Path) -> None:
    store = ArtifactStore(root)
    with pytest.raises(StoreError, match="'sub'"):
        store.get_or_build(KEY, lambda d: (d / "sub").mkdir())
    assert store.keys() == [] and list((root / "tmp").iterdir()) == []


# ---------------------------------------------------------------------------------------- eviction


def _age(store: ArtifactStore, key: str, seconds_ago: float) -> None:
    t = time.time() - seconds_ago
    os.utime(store.root / "entries" / key[:2] / key / "manifest.json", (t, t))


def test_eviction_drops_least_recently_used(root: Path) -> None:
    keys = [f"key{i}-0123456" for i in range(5)]
    blob = os.urandom(4000)
    ArtifactStore(root).put(keys[0], {"blob": blob})
    size = _disk_bytes(root)  # one entry: blob + manifest
    store = ArtifactStore(root, max_bytes=int(3.5 * size))
    for key in keys[1:3]:
        store.put(key, {"blob": blob})
    _age(store, keys[0], 300)
    _age(store, keys[1], 200)
    _age(store, keys[2], 100)
    assert store.get(keys[0]) is not None  # keys[0] becomes the most recently used
    store.put(keys[3], {"blob": blob})  # 4 entries > 3.5 -> prune to 90 % -> drop one
    assert store.keys() == [keys[0], keys[2], keys[3]]
    stats = store.stats()
    assert stats.evictions == 1 and stats.entries == 3
    assert stats.bytes == _disk_bytes(root) <= store.max_bytes

    _age(store, keys[3], 50)
    result = store.prune(max_bytes=int(1.5 * size))  # LRU order now: keys[2], keys[3], keys[0]
    assert (result.removed, store.keys()) == (2, [keys[0]])
    assert result.remaining_bytes == _disk_bytes(root) <= 1.5 * size
    assert result.freed_bytes == 2 * size or abs(result.freed_bytes - 2 * size) < 16
    assert store.stats().evictions == 3 and store.stats().bytes == result.remaining_bytes

    assert store.clear() == 1 and store.keys() == [] and store.stats().bytes == 0


def test_prune_recomputes_drifted_byte_count(root: Path) -> None:
    store = ArtifactStore(root)
    store.put(KEY, {"a": b"a" * 100})
    (root / "stats.json").write_text(json.dumps({"bytes": 10**9}))  # tracked count drifted
    assert store.prune().remaining_bytes == _disk_bytes(root) == store.stats().bytes
    assert store.keys() == [KEY]


# ------------------------------------------------------------------------------------------- stats

_STATS_CHILD = """
s = ArtifactStore(root)
s.put("aaaa0000" + sys.argv[3], {"f": b"x" * 100})
s.put("bbbb0000" + sys.argv[3], {"f": b"y" * 100})
s.get("aaaa0000" + sys.argv[3]); s.get("bbbb0000" + sys.argv[3]); s.get("cccc0000" + sys.argv[3])
# no explicit flush: put flushes, and pending hits/misses are flushed at exit
"""


def test_stats_persist_across_processes(root: Path, tmp_path: Path) -> None:
    store = ArtifactStore(root)
    store.get(KEY)  # a pending miss in this process
    run_script(_STATS_CHILD, root, tmp_path, "one")
    run_script(_STATS_CHILD, root, tmp_path, "two")
    stats = store.stats()
    assert (stats.puts, stats.hits, stats.misses, stats.entries) == (4, 4, 3, 4)
    assert stats.bytes == _disk_bytes(root)
    store.reset_stats()
    after = ArtifactStore(root).stats()
    assert (after.puts, after.hits, after.misses, after.entries) == (0, 0, 0, 4)
    assert after.bytes == _disk_bytes(root), "reset keeps the byte total"


def test_corrupt_stats_file_resets_with_warning(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = ArtifactStore(root)
    store.put(KEY, {"a": b"1"})
    (root / "stats.json").write_bytes(b"\x00garbage")
    with caplog.at_level(logging.WARNING, logger="tuneforge.store"):
        stats = store.stats()
    assert (stats.puts, stats.hits) == (0, 0)
    assert any("corrupt" in r.message for r in caplog.records)
    store.get(KEY)
    assert store.stats().hits == 1


# --------------------------------------------------------------------------------------- bad input

BAD_KEYS = ["short", "Upper-case-key", "../../etc/passwd", "a" * 129, "-leading-dash", "has space x",
            "", "ab/cdefgh1", "dots.are.bad"]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_bad_keys_are_rejected(root: Path, key: str) -> None:
    store = ArtifactStore(root)
    for call in (lambda: store.get(key), lambda: store.put(key, {"a": b""}), lambda: store.remove(key),
                 lambda: store.contains(key), lambda: store.get_or_build(key, file_writer("a", b""))):
        with pytest.raises(StoreError) as info:
            call()
        assert repr(key) in str(info.value)
    assert not (root / "entries").exists()


def test_good_keys_are_accepted() -> None:
    for key in ["abcdefgh", "0" * 128, "a_b-c_d-e", "sha256-" + "f" * 64]:
        assert validate_key(key) == key


@pytest.mark.parametrize("name", ["../evil", "a/b", "manifest.json", "", ".", "..", "sp ace", "tab\t"])
def test_bad_file_names_are_rejected(root: Path, name: str) -> None:
    store = ArtifactStore(root)
    with pytest.raises(StoreError) as info:
        store.put(KEY, {"fine.txt": b"x", name: b"y"})
    assert repr(name) in str(info.value)
    assert store.keys() == []
    assert not (root / "tmp").exists() or not any((root / "tmp").iterdir())


def test_non_json_meta_is_rejected(root: Path) -> None:
    with pytest.raises(StoreError, match="meta"):
        ArtifactStore(root).put(KEY, {"a": b""}, meta={"x": object()})


# -------------------------------------------------------------------------------- property (model)

_KEYS = ["prop-key-0", "prop-key-1", "prop-key-2"]
_ops = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from(_KEYS), st.binary(max_size=300)),
        st.tuples(st.just("get"), st.sampled_from(_KEYS), st.just(b"")),
        st.tuples(st.just("remove"), st.sampled_from(_KEYS), st.just(b"")),
        st.tuples(st.just("reopen"), st.just(""), st.just(b"")),
    ),
    max_size=25,
)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_ops)
def test_store_behaves_like_a_dict(ops: list[tuple[str, str, bytes]]) -> None:
    root = Path(tempfile.mkdtemp(prefix="tf-store-prop-"))
    try:
        store = ArtifactStore(root)
        model: dict[str, bytes] = {}
        for op, key, data in ops:
            if op == "put":
                entry = store.put(key, {"blob": data})
                model.setdefault(key, data)  # same key = same content: the first put wins
                assert entry.file("blob").read_bytes() == model[key]
            elif op == "get":
                got = store.get(key)
                assert (None if got is None else got.file("blob").read_bytes()) == model.get(key)
            elif op == "remove":
                assert store.remove(key) == (key in model)
                model.pop(key, None)
            else:
                store = ArtifactStore(root)
        assert store.keys() == sorted(model)
        assert store.stats().bytes == _disk_bytes(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
