"""Cleanup never follows a symbolic link out of the cache (issue 11, item 12).

Each test plants real links inside the store, pointing at a directory outside it that holds a canary
file, runs the store's cleanups (cleanup_temp, prune, clear, a lookup of a damaged entry) and checks
that the canary is still there.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from tuneforge.store import fsutil as fs
from tuneforge.store.artifacts import ArtifactStore, StoreError

KEY = "ab12cd34ef56"
DAY = 24 * 3600


def _outside(tmp_path: Path, *, entry_like: str | None = None) -> Path:
    """A directory outside the store with a canary file (old, so that age-based cleanup would take it)."""
    outside = tmp_path / "outside"
    target = outside / entry_like if entry_like else outside
    target.mkdir(parents=True)
    canary = target / "canary.txt"
    canary.write_text("precious")
    old = time.time() - 3 * DAY
    for path in (canary, target, outside):
        os.utime(path, (old, old))
    return canary


def _dead_temp_name(label: str) -> str:
    return f"{label}.{fs.hostname()}.{2**22 + 12345}.deadbeef0000"  # a pid above pid_max: never alive


def _filled_store(tmp_path: Path) -> ArtifactStore:
    store = ArtifactStore(tmp_path / "store")
    store.put(KEY, {"lib.so": b"x" * 100})
    return store


def test_links_inside_tmp_are_removed_as_links(tmp_path: Path) -> None:
    canary = _outside(tmp_path)
    store = _filled_store(tmp_path)
    tmp = tmp_path / "store" / "tmp"
    dead, old = tmp / _dead_temp_name("cd34ef56ab12"), tmp / "trash.otherhost.1.0123456789ab"
    dead.symlink_to(canary.parent, target_is_directory=True)
    old.symlink_to(canary.parent, target_is_directory=True)
    os.utime(old, (time.time() - 3 * DAY,) * 2, follow_symlinks=False)
    assert store.cleanup_temp() == 2
    assert not os.path.lexists(dead) and not os.path.lexists(old)
    assert canary.read_text() == "precious"
    store.prune(0)
    store.clear()
    assert canary.read_text() == "precious"


def test_a_linked_shard_or_entry_is_never_followed(tmp_path: Path) -> None:
    shard_canary = _outside(tmp_path, entry_like="zz00000000aa")
    store = _filled_store(tmp_path)
    entries = tmp_path / "store" / "entries"
    (entries / "zz").symlink_to(shard_canary.parent.parent, target_is_directory=True)
    (entries / "cd").mkdir()
    (entries / "cd" / "cd34ef56ab12").symlink_to(shard_canary.parent, target_is_directory=True)
    assert store.keys() == [KEY]
    for operation in (lambda: store.get("zz00000000aa"), lambda: store.put("zz00000000aa", {"f": b"1"})):
        with pytest.raises(StoreError, match=f"{entries / 'zz'} is a symbolic link"):
            operation()
    assert store.get("cd34ef56ab12") is None  # a link is not an entry
    assert not os.path.lexists(entries / "cd" / "cd34ef56ab12")  # removed as a bad entry: the link only
    assert store.prune(0).removed == 1
    store.put(KEY, {"lib.so": b"x" * 100})
    assert store.clear() == 1
    store.cleanup_temp(max_age_s=0)
    assert shard_canary.read_text() == "precious"
    assert (entries / "zz").is_symlink()  # not ours to remove, and never walked


def test_a_shard_turned_into_a_link_after_a_lookup_is_never_written_or_removed_through(tmp_path: Path) -> None:
    """Lookups trust a shard once seen to be a real directory; writes and removals look again."""
    canary = _outside(tmp_path, entry_like=KEY)
    store = _filled_store(tmp_path)
    assert store.get(KEY) is not None and store.contains(KEY)
    shard = tmp_path / "store" / "entries" / KEY[:2]
    shutil.rmtree(shard)
    shard.symlink_to(canary.parent.parent, target_is_directory=True)
    other = KEY[:2] + "99999999zz"  # not there, in the same shard: a build would write through the link
    for operation in (lambda: store.get(KEY), lambda: store.remove(KEY), lambda: store.put(other, {"f": b"1"}),
                      lambda: store.get_or_build(other, lambda d: (d / "f").write_bytes(b"1") and None)):
        with pytest.raises(StoreError, match=f"{shard} is a symbolic link"):
            operation()
    assert canary.read_text() == "precious" and sorted(p.name for p in canary.parent.parent.iterdir()) == [KEY]
    assert store.keys() == [] and store.prune(0).removed == 0 and store.clear() == 0
    assert canary.read_text() == "precious" and shard.is_symlink()


@pytest.mark.parametrize("linked", ["tmp", "entries", "locks"])
def test_a_store_whose_working_directory_is_a_link_is_refused(tmp_path: Path, linked: str) -> None:
    canary = _outside(tmp_path)
    # What the cleanups would take if they followed the link: an old item, a dead writer's staging,
    # an entry-shaped directory.
    (canary.parent / _dead_temp_name("trash")).mkdir()
    (canary.parent / "ab" / KEY).mkdir(parents=True)
    (canary.parent / "ab" / KEY / "canary.txt").write_text("precious")
    root = tmp_path / "store"
    root.mkdir()
    (root / linked).symlink_to(canary.parent, target_is_directory=True)
    store = ArtifactStore(root)
    for operation in (store.cleanup_temp, store.prune, store.clear, lambda: store.get(KEY),
                      lambda: store.put("cd34ef56ab12", {"f": b"1"})):
        with pytest.raises(StoreError, match=f"{root / linked}.*symbolic link"):
            operation()
    assert canary.read_text() == "precious" and (canary.parent / "ab" / KEY / "canary.txt").exists()
    assert (canary.parent / _dead_temp_name("trash")).is_dir()


def test_remove_path_on_a_link_keeps_the_target(tmp_path: Path) -> None:
    canary = _outside(tmp_path)
    link = tmp_path / "link"
    link.symlink_to(canary.parent, target_is_directory=True)
    fs.remove_path(link)
    assert not os.path.lexists(link) and canary.read_text() == "precious"
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "inner").symlink_to(canary.parent, target_is_directory=True)
    fs.remove_path(tree)
    assert not tree.exists() and canary.read_text() == "precious"
