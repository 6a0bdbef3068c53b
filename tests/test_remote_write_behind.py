"""The Redis tier's write-behind queue against a real redis-server: puts delivered by a process that exits at
once, by concurrent processes and by forked children; puts that never wait for the server; a full queue;
close()."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any

import pytest

from tuneforge.store.remote import RemoteCache

from .conftest import run_python
from .redis_server import RedisServer
from .remote_helpers import (
    ART,
    KEY,
    artifact,
    fresh_warnings,  # noqa: F401 (an autouse fixture)
    make_cache_fixture,  # noqa: F401 (the `make_cache` fixture)
    record,
)

redis = pytest.importorskip("redis")
zstandard = pytest.importorskip("zstandard")

pytestmark = pytest.mark.redis


# --------------------------------------------------------------------------------- delivery at exit

def test_a_process_exiting_right_after_its_puts_still_delivers_them(redis_clean: str,
                                                                    make_cache: Callable[..., RemoteCache]) -> None:
    # No flush() in the child: the atexit hook must drain the write-behind queue before the process ends.
    run_python(f"""
        import os
        from tuneforge.store.entry import make_manifest
        from tuneforge.store.records import Record
        from tuneforge.store.remote import RemoteCache
        import hashlib

        cache = RemoteCache({redis_clean!r})
        for i in range(50):
            key = f"proc-a-key-{{i:03d}}"
            cache.put_records(key, [Record(key=key, choice="c", op="mm", choice_name="n", status="ok",
                                           median_ms=float(i))])
        data = os.urandom(1 << 21)
        manifest = make_manifest("artproca0000000", {{"payload.bin": {{"size": len(data),
                                 "sha256": hashlib.sha256(data).hexdigest()}}}}, {{}}, {{}})
        cache.put_artifact("artproca0000000", manifest, {{"payload.bin": data}})
    """)
    reader = make_cache(redis_clean)
    for i in range(50):
        got = reader.get_records(f"proc-a-key-{i:03d}")
        assert got is not None and got[0].median_ms == float(i)
    entry = reader.get_artifact("artproca0000000")
    assert entry is not None and len(entry[1]["payload.bin"]) == 1 << 21


# -------------------------------------------------------------------------------------- concurrency

def test_four_processes_putting_at_once_lose_nothing(redis_clean: str, make_cache: Callable[..., RemoteCache],
                                                     tmp_path: Any) -> None:
    code = textwrap.dedent("""
        import json, sys
        from tuneforge.store.records import Record
        from tuneforge.store.remote import RemoteCache

        url, worker = sys.argv[1], int(sys.argv[2])
        cache = RemoteCache(url)
        for i in range(50):
            key = f"w{worker}-key-{i:03d}"
            records = [Record(key=key, choice=f"c{j}", op="mm", choice_name="n", status="ok",
                              median_ms=worker + i / 100 + j) for j in range(2)]
            cache.put_records(key, records)
        assert cache.flush(20)
        print(json.dumps(cache.stats.to_json()))
    """)
    procs = [subprocess.Popen([sys.executable, "-c", code, redis_clean, str(w)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for w in range(4)]
    outputs = [p.communicate(timeout=60) for p in procs]
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
    reader = make_cache(redis_clean)
    stats = [json.loads(out) for out, _ in outputs]
    assert [(s["puts"], s["dropped"], s["errors"]) for s in stats] == [(50, 0, 0)] * 4
    for w in range(4):
        for i in range(50):
            got = reader.get_records(f"w{w}-key-{i:03d}")
            assert got is not None and [r.choice for r in got] == ["c0", "c1"], (w, i)
            assert got[0].median_ms == pytest.approx(w + i / 100)
    assert reader.stats.hits == 200


def _forked_child(cache: RemoteCache, key: str) -> None:
    cache.put_records(key, [record(key)])
    assert cache.flush(5)
    assert cache.get_records(key) == [record(key)], cache.stats


def test_a_forked_child_can_use_its_parents_cache(redis_clean: str, make_cache: Callable[..., RemoteCache]) -> None:
    import multiprocessing

    cache = make_cache(redis_clean)
    for i in range(100):  # the writer thread is busy when the children are forked
        cache.put_records(f"parent-key-{i:04d}", [record(f"parent-key-{i:04d}")])
    children = [multiprocessing.get_context("fork").Process(target=_forked_child, args=(cache, f"child-key-{i:04d}"))
                for i in range(3)]
    for child in children:
        child.start()
    for child in children:
        child.join(20)
    assert [child.exitcode for child in children] == [0, 0, 0]
    assert cache.flush(5) and cache.stats.puts == 100
    reader = make_cache(redis_clean)
    assert all(reader.get_records(f"child-key-{i:04d}") is not None for i in range(3))


def test_full_queue_drops_without_blocking(redis_private: RedisServer,
                                           make_cache: Callable[..., RemoteCache]) -> None:
    cache = make_cache(redis_private.url, queue_size=1, timeout_s=20)
    assert cache.get_records(KEY) is None  # connected
    redis_private.pause(4000)
    start = time.monotonic()
    for i in range(5):
        cache.put_records(f"key-{i:010d}", [record(f"key-{i:010d}")])
    # The puts returned while the paused server held the writer: they did not wait for it.
    assert time.monotonic() - start < 2.0 and not cache.flush(0)
    assert cache.flush(20)
    assert cache.stats.dropped >= 3 and cache.stats.puts + cache.stats.dropped == 5


# ------------------------------------------------------------------------------------- write-behind

def test_put_does_not_wait_for_the_server(redis_private: RedisServer,
                                          make_cache: Callable[..., RemoteCache]) -> None:
    cache = make_cache(redis_private.url, timeout_s=20)
    assert cache.get_records(KEY) is None  # connected
    redis_private.pause(4000)
    start = time.monotonic()
    cache.put_records(KEY, [record()])
    cache.put_artifact(ART, *artifact())
    assert time.monotonic() - start < 2.0  # a round trip takes 4 s now
    assert not cache.flush(0)  # still waiting for the paused server
    assert cache.flush(30)
    assert time.monotonic() - start > 2.0
    assert cache.stats.puts == 2 and cache.stats.errors == 0
    assert cache.get_records(KEY) == [record()]


def test_close_stops_everything(redis_clean: str, make_cache: Callable[..., RemoteCache]) -> None:
    cache = make_cache(redis_clean)
    cache.put_records(KEY, [record()])
    cache.close()  # flushes first
    assert cache.stats.puts == 1
    assert not cache.available
    assert cache.get_records(KEY) is None
    cache.put_records(KEY, [record()])
    assert cache.stats.dropped == 1 and cache.stats.skipped == 1
    assert make_cache(redis_clean).get_records(KEY) == [record()]
