"""Tests of the artifact store against corrupted entries: flipped, truncated or deleted files and bad manifests
are misses that get rebuilt, in this process and in a fresh one; verification is cached per instance."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tuneforge.store import entry as entry_mod
from tuneforge.store.artifacts import ArtifactStore

from .artifact_store_helpers import (
    KEY,
    KEY2,
    file_writer,
    root_fixture,  # noqa: F401 (the `root` fixture)
    run_script,
)


def _corrupt(path: Path, how: str) -> None:
    data_file = path / "data.bin"
    if how == "flip":
        data = bytearray(data_file.read_bytes())
        data[1234] ^= 0x01
        data_file.write_bytes(bytes(data))
    elif how == "truncate":
        data_file.write_bytes(data_file.read_bytes()[:-10])
    elif how == "delete":
        data_file.unlink()
    elif how == "garbage_manifest":
        (path / "manifest.json").write_bytes(b"{not json")
    elif how == "wrong_key_manifest":
        manifest = json.loads((path / "manifest.json").read_text())
        manifest["key"] = KEY2
        (path / "manifest.json").write_text(json.dumps(manifest))
    else:  # pragma: no cover
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["flip", "truncate", "delete", "garbage_manifest", "wrong_key_manifest"])
def test_corruption_is_a_miss_and_is_rebuilt(root: Path, how: str) -> None:
    payload = os.urandom(5000)
    writer = ArtifactStore(root)
    entry = writer.put(KEY, {"data.bin": payload, "other.txt": "ok"})
    _corrupt(entry.path, how)

    store = ArtifactStore(root)  # a new instance has not verified anything yet
    assert store.get(KEY) is None
    assert not entry.path.exists() and store.keys() == []
    assert not any((root / "tmp").iterdir()), "the bad entry must be deleted, not just moved"
    stats = store.stats()
    assert (stats.corrupt, stats.misses, stats.hits) == (1, 1, 0)
    # The tracked total may drift by what the corruption changed on disk; prune() recomputes it.
    assert store.prune().remaining_bytes == 0 == store.stats().bytes

    calls: list[int] = []

    def build(staging: Path) -> None:
        calls.append(1)
        (staging / "data.bin").write_bytes(payload)

    rebuilt = store.get_or_build(KEY, build)
    assert calls == [1] and rebuilt.file("data.bin").read_bytes() == payload
    assert ArtifactStore(root).get(KEY) is not None


def test_corruption_detected_in_fresh_process(root: Path, tmp_path: Path) -> None:
    ArtifactStore(root).put(KEY, {"data.bin": os.urandom(5000)})
    _corrupt(root / "entries" / KEY[:2] / KEY, "flip")
    out = run_script("s = ArtifactStore(root)\nprint(s.get(sys.argv[3]) is None, s.stats().corrupt)",
               root, tmp_path, KEY)
    assert out.split() == ["True", "1"]
    assert ArtifactStore(root).keys() == []


def test_corruption_detected_inside_get_or_build(root: Path) -> None:
    ArtifactStore(root).put(KEY, {"data.bin": b"a" * 3000})
    _corrupt(root / "entries" / KEY[:2] / KEY, "flip")
    store = ArtifactStore(root)
    entry = store.get_or_build(KEY, file_writer("data.bin", b"a" * 3000))
    assert entry.file("data.bin").read_bytes() == b"a" * 3000
    stats = store.stats()
    assert (stats.corrupt, stats.misses, stats.puts) == (1, 1, 2)


def test_verification_is_cached_per_instance(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = ArtifactStore(root)
    store.put(KEY, {"data.bin": b"q" * 10_000})
    hashed: list[Path] = []
    real = entry_mod.hash_file

    def counting(path: Path, *, fsync: bool = False) -> tuple[int, str]:
        hashed.append(path)
        return real(path, fsync=fsync)

    monkeypatch.setattr(entry_mod, "hash_file", counting)
    for _ in range(3):
        assert store.get(KEY) is not None
    assert hashed == [], "the writer already knows its entry is good"
    other = ArtifactStore(root)
    for _ in range(3):
        assert other.get(KEY) is not None
    assert len(hashed) == 1, "a new instance verifies once, then trusts its cache"
    # A size change is still caught cheaply, even by an instance that verified the entry.
    _corrupt(root / "entries" / KEY[:2] / KEY, "truncate")
    assert other.get(KEY) is None and other.stats().corrupt == 1
