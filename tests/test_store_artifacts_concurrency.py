"""Tests of the artifact store under concurrency: processes and threads racing to build one entry, a writer
killed mid-put, leftover staging directories, lock time-outs."""

from __future__ import annotations

import fcntl
import hashlib
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tuneforge.store import fsutil as fs
from tuneforge.store.artifacts import ArtifactStore, StoreError

from .artifact_store_helpers import (
    KEY,
    KEY2,
    file_writer,
    root_fixture,  # noqa: F401 (the `root` fixture)
    spawn,
)


def _wait_for(path: Path, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline, f"timed out waiting for {path}"
        time.sleep(0.01)


_BUILDER = """
i = sys.argv[3]
(work / f"ready.{i}").touch()
while not (work / "go").exists():
    time.sleep(0.002)

def build(staging):
    with open(work / "builds.txt", "a") as f:
        f.write(i + "\\n")
    time.sleep(0.3)
    (staging / "out.bin").write_bytes(b"payload-" * 4096)
    return {"builder": i}

entry = ArtifactStore(root).get_or_build(sys.argv[4], build)
import hashlib
print(hashlib.sha256(entry.file("out.bin").read_bytes()).hexdigest(), entry.meta["builder"])
"""


def test_concurrent_processes_build_once(root: Path, tmp_path: Path) -> None:
    n = 8
    procs = [spawn(_BUILDER, root, tmp_path, i, KEY) for i in range(n)]
    try:
        for i in range(n):
            _wait_for(tmp_path / f"ready.{i}")
        (tmp_path / "go").touch()
        outputs = [p.communicate(timeout=60) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert all(p.returncode == 0 for p in procs), [err for _, err in outputs]
    builds = (tmp_path / "builds.txt").read_text().split()
    assert len(builds) == 1
    results = {out.strip() for out, _ in outputs}
    assert results == {f"{hashlib.sha256(b'payload-' * 4096).hexdigest()} {builds[0]}"}
    stats = ArtifactStore(root).stats()
    assert (stats.misses, stats.hits, stats.puts, stats.entries) == (1, n - 1, 1, 1)


def test_concurrent_threads_build_once(root: Path) -> None:
    store = ArtifactStore(root)
    builds: list[int] = []
    barrier = threading.Barrier(6)
    results: list[bytes] = []

    def build(staging: Path) -> None:
        builds.append(1)
        time.sleep(0.2)
        (staging / "x").write_bytes(b"threaded")

    def worker() -> None:
        barrier.wait()
        results.append(store.get_or_build(KEY, build).file("x").read_bytes())

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert builds == [1] and results == [b"threaded"] * 6


_KILLED_WRITER = """
def build(staging):
    with open(staging / "big.bin", "wb") as f:
        f.write(b"x" * 100_000)
        f.flush()
        (work / "ready").touch()
        time.sleep(120)

ArtifactStore(root).get_or_build(sys.argv[3], build)
"""


def test_writer_killed_mid_put_leaves_nothing_visible(root: Path, tmp_path: Path) -> None:
    proc = spawn(_KILLED_WRITER, root, tmp_path, KEY)
    try:
        _wait_for(tmp_path / "ready")
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGKILL

    store = ArtifactStore(root, lock_timeout_s=0.5)
    assert store.get(KEY) is None and store.keys() == [] and not store.contains(KEY)
    leftovers = [p.name for p in (root / "tmp").iterdir()]
    assert len(leftovers) == 1 and leftovers[0].startswith(f"{KEY}.") and f".{proc.pid}." in leftovers[0]
    # The kernel released the dead writer's flock.
    fd = os.open(root / "locks" / KEY[:2] / f"{KEY}.lock", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    assert store.cleanup_temp() == 1
    assert list((root / "tmp").iterdir()) == []
    entry = store.get_or_build(KEY, file_writer("big.bin", b"y" * 10))
    assert entry.file("big.bin").read_bytes() == b"y" * 10
    assert store.put(KEY2, {"f": b"z"}).file("f").read_bytes() == b"z"


def test_cleanup_temp_rules(root: Path) -> None:
    store = ArtifactStore(root)
    tmp = root / "tmp"
    tmp.mkdir(parents=True)
    mine = tmp / f"{KEY}.{fs.hostname()}.{os.getpid()}.aaaa"  # live writer: kept
    elsewhere_new = tmp / f"{KEY}.otherhost.1.bbbb"  # other host, recent: kept
    elsewhere_old = tmp / f"{KEY}.otherhost.1.cccc"  # other host, old: removed
    stray_old = tmp / "junk"  # not a staging name, old: removed
    for p in (mine, elsewhere_new, elsewhere_old):
        p.mkdir()
    stray_old.write_bytes(b"")
    old = time.time() - 7200
    for p in (elsewhere_old, stray_old):
        os.utime(p, (old, old))
    assert store.cleanup_temp(max_age_s=3600) == 2
    assert sorted(p.name for p in tmp.iterdir()) == sorted([mine.name, elsewhere_new.name])


def test_lock_timeout_names_key_and_lock(root: Path, tmp_path: Path) -> None:
    holder = spawn(_KILLED_WRITER, root, tmp_path, KEY)
    try:
        _wait_for(tmp_path / "ready")
        store = ArtifactStore(root, lock_timeout_s=0.5)
        start = time.monotonic()
        with pytest.raises(StoreError) as info:
            store.get_or_build(KEY, file_writer("a", b"a"))
        elapsed = time.monotonic() - start
    finally:
        holder.kill()
        holder.wait(30)
    assert 0.45 <= elapsed < 5
    assert KEY in str(info.value) and str(root / "locks" / KEY[:2] / f"{KEY}.lock") in str(info.value)
