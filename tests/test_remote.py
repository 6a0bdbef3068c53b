"""The Redis tier against a real redis-server: round trips, signing, garbage, TTL, outages, write-behind."""

from __future__ import annotations

import _ctypes
import hashlib
import importlib.util
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tuneforge import config, warn_once
from tuneforge.errors import ConfigError
from tuneforge.store import remote, remote_format, remote_settings
from tuneforge.store.entry import make_manifest
from tuneforge.store.records import Record
from tuneforge.store.remote import RemoteCache

from .conftest import run_python
from .redis_server import RedisServer

redis = pytest.importorskip("redis")
zstandard = pytest.importorskip("zstandard")

pytestmark = pytest.mark.redis

LOGGER = "tuneforge.store.remote"
KEY = "selkey-0123456789abcdef"
ART = "cppabcdefghijklmnop234567"


def record(key: str = KEY, choice: str = "c1", median_ms: float = 1.5) -> Record:
    return Record(key=key, choice=choice, op="mm", choice_name=f"tile-{choice}", status="ok",
                  median_ms=median_ms, min_ms=median_ms * 0.9, count=7, method="cpu", params={"tile": 16},
                  inputs='[["f32",[64,64]]]', system="sys1", info={"note": "x"}, created=1700000000.25)


def elf_library(size: int = 23000) -> bytes:
    """A file that reads as a shared library of this machine (a real one's ELF header) and is random after it."""
    with open(_ctypes.__file__, "rb") as f:
        header = f.read(64)
    return header + os.urandom(3000) + bytes(size - 3064)


def artifact(key: str = ART, files: dict[str, bytes] | None = None) -> tuple[dict[str, Any], dict[str, bytes]]:
    files = files if files is not None else {"kernel.so": elf_library(),
                                             "source.cpp": b"extern \"C\" void k() {}\n"}
    table = {name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()}
    return make_manifest(key, table, {"lang": "c++"}, {"source": "abc", "flags": ["-O3"]}), files


def rkey(kind: str, key: str, namespace: str = "tuneforge") -> bytes:
    return f"{namespace}:v{remote.FORMAT_VERSION}:{kind}:{key}".encode()


def zc(body: bytes) -> bytes:
    return bytes(zstandard.ZstdCompressor().compress(body))


def zd(payload: bytes) -> bytes:
    return bytes(zstandard.ZstdDecompressor().decompress(payload))


@pytest.fixture(autouse=True)
def _fresh_warnings() -> None:
    warn_once.forget()  # one warning per process per kind: each test starts with none given


@pytest.fixture
def make_cache() -> Iterator[Callable[..., RemoteCache]]:
    made: list[RemoteCache] = []

    def make(url: str, **kwargs: Any) -> RemoteCache:
        cache = RemoteCache(url, **kwargs)
        made.append(cache)
        return cache

    yield make
    for cache in made:
        cache.close()


@pytest.fixture
def raw(redis_clean: str) -> Iterator[Any]:
    """A plain redis-py client on the session server, for reading and tampering with values."""
    client = redis.Redis.from_url(redis_clean)
    yield client
    client.close()


def is_available(cache: RemoteCache) -> bool:
    return cache.available


def wait_for(condition: Callable[[], bool], what: str, deadline_s: float = 20.0) -> None:
    """Poll until ``condition()`` holds: a generous deadline instead of a fixed sleep (the CI machine is loaded)."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {deadline_s}s waiting for {what}"
        time.sleep(0.02)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]


# ----------------------------------------------------------------------------------------- round trips

def test_records_round_trip_between_instances(redis_clean: str, raw: Any,
                                              make_cache: Callable[..., RemoteCache]) -> None:
    writer, reader = make_cache(redis_clean), make_cache(redis_clean)
    records = [record(choice="c1"), record(choice="c2", median_ms=0.5)]
    assert reader.get_records(KEY) is None
    writer.put_records(KEY, records)
    assert writer.flush(5)
    assert reader.get_records(KEY) == records
    assert writer.stats.puts == 1 and writer.stats.dropped == 0
    assert reader.stats.to_json() == {"hits": 1, "misses": 1, "errors": 0, "rejected": 0, "puts": 0,
                                      "dropped": 0, "skipped": 0, "unusable": 0}
    value = raw.get(rkey("rec", KEY))
    assert value.startswith(b"TFU1")  # no pickle: a zstd frame of JSON
    assert [r["choice"] for r in json.loads(zd(value[4:]))] == ["c1", "c2"]
    # another namespace is another cache
    assert make_cache(redis_clean, namespace="other-team").get_records(KEY) is None


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


def test_artifact_round_trip_and_checksum_tamper(redis_clean: str, raw: Any, make_cache: Callable[..., RemoteCache],
                                                 caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    writer, reader = make_cache(redis_clean), make_cache(redis_clean)
    manifest, files = artifact()
    writer.put_artifact(ART, manifest, files)
    assert writer.flush(5)
    got = reader.get_artifact(ART)
    assert got is not None
    assert got[0] == manifest and got[1] == files
    assert reader.stats.hits == 1

    # Change one byte of the .so inside the (unsigned) value; the value stays well-formed.
    value = raw.get(rkey("art", ART))
    body = bytearray(zd(value[4:]))
    body[-len(files["source.cpp"]) - 100] ^= 0x01  # inside kernel.so (files are in sorted name order)
    raw.set(rkey("art", ART), b"TFU1" + zc(bytes(body)))
    assert reader.get_artifact(ART) is None
    assert reader.get_artifact(ART) is None
    assert reader.stats.rejected == 2 and reader.stats.errors == 0 and reader.available
    assert len([m for m in warnings_of(caplog) if "sha256" in m]) == 1  # once per process, not per call

    # An artifact copied under another key names the wrong key in its manifest.
    raw.set(rkey("art", "cppzzzzzzzzzzzzzzzz"), value)
    assert reader.get_artifact("cppzzzzzzzzzzzzzzzz") is None
    assert reader.stats.rejected == 3


def test_inconsistent_artifact_is_not_uploaded(redis_clean: str, raw: Any,
                                               make_cache: Callable[..., RemoteCache]) -> None:
    cache = make_cache(redis_clean)
    manifest, files = artifact()
    cache.put_artifact(ART, manifest, {**files, "kernel.so": files["kernel.so"][:-1] + b"!"})  # sha256 differs
    cache.put_artifact("cppotherkey000000", manifest, files)  # manifest names another key
    cache.put_artifact(ART, manifest, {"kernel.so": files["kernel.so"]})  # a file is missing
    cache.put_artifact(ART, manifest, {**files, "x.so": object()})  # type: ignore[dict-item]
    assert cache.flush(5)
    assert cache.stats.dropped == 4 and cache.stats.puts == 0
    assert raw.keys("*") == []


# ------------------------------------------------------------------------------------------- signing

def test_signed_values(redis_clean: str, raw: Any, make_cache: Callable[..., RemoteCache],
                       monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    signed = make_cache(redis_clean, secret="s3cret")
    manifest, files = artifact()
    signed.put_records(KEY, [record()])
    signed.put_artifact(ART, manifest, files)
    assert signed.flush(5)
    assert signed.get_records(KEY) == [record()]
    assert signed.get_artifact(ART) == (manifest, files)
    value = raw.get(rkey("art", ART))
    assert value.startswith(b"TFS1") and len(value) > 36

    decompressed: list[bytes] = []
    real_decompress = remote.decompress

    def spy(payload: bytes, limit: int) -> bytes:
        decompressed.append(payload)
        return real_decompress(payload, limit)

    monkeypatch.setattr(remote, "decompress", spy)

    # a flipped payload byte: rejected before anything is decompressed or parsed
    tampered = bytearray(value)
    tampered[-5] ^= 0x40
    raw.set(rkey("art", ART), bytes(tampered))
    assert signed.get_artifact(ART) is None
    # a value moved to another key (the Redis key is inside the MAC)
    raw.set(rkey("art", "cppmovedkey000000"), value)
    assert signed.get_artifact("cppmovedkey000000") is None
    raw.set(rkey("rec", "moved-key-000000"), raw.get(rkey("rec", KEY)))
    assert signed.get_records("moved-key-000000") is None
    # written with another secret
    other = make_cache(redis_clean, secret="another secret")
    other.put_records("other-key-000000", [record("other-key-000000")])
    assert other.flush(5)
    assert signed.get_records("other-key-000000") is None
    assert decompressed == []  # none of those was ever decompressed
    assert len([m for m in warnings_of(caplog) if "signature" in m]) == 1

    # an unsigned value is refused by a reader with a secret ...
    unsigned = make_cache(redis_clean)
    unsigned.put_records("plain-key-000000", [record("plain-key-000000")])
    assert unsigned.flush(5)
    assert signed.get_records("plain-key-000000") is None
    # ... and a reader without a secret refuses signed values: it cannot check them
    assert unsigned.get_records(KEY) is None
    assert decompressed == []
    assert signed.stats.rejected == 5 and signed.stats.errors == 0
    assert unsigned.stats.rejected == 1
    assert any("unsigned" in m for m in warnings_of(caplog))
    assert any("remote.secret is not set" in m for m in warnings_of(caplog))
    # the intact values are still fine
    assert signed.get_records(KEY) == [record()]


# ------------------------------------------------------------------------------------------- garbage

def test_garbage_values_are_misses(redis_clean: str, raw: Any, make_cache: Callable[..., RemoteCache]) -> None:
    cache = make_cache(redis_clean)
    good_record = json.dumps([record().to_json()]).encode()
    header = remote_format._ARTIFACT_HEADER
    record_values = [
        os.urandom(200),
        b"",
        b"TFU1",
        b"TFU1" + os.urandom(300),
        b"TFU1" + zc(b"not json"),
        b"TFU1" + zc(b'{"records": 1}'),
        b"TFU1" + zc(b"[]"),
        b"TFU1" + zc(b'[{"key": "selkey-0123456789abcdef"}]'),  # fields missing
        b"TFU1" + zc(json.dumps([record("another-key-000").to_json()]).encode()),  # wrong key
        b"TFU1" + zc(good_record)[:-3],  # truncated frame
        b"TFU1" + zstandard.ZstdCompressor(write_content_size=False).compress(good_record),
        b"TFU1" + zc(b"[" * 100000 + b"]" * 100000),  # deeply nested
        b"TFS1" + os.urandom(40),
    ]
    manifest, files = artifact()
    mjson = json.dumps(manifest).encode()
    artifact_values = [
        b"TFU1" + zc(b"TFAR"),
        b"TFU1" + zc(header.pack(b"TFAR", 99, 2) + b"{}"),
        b"TFU1" + zc(header.pack(b"TFAR", remote.FORMAT_VERSION, 10**6) + mjson),
        b"TFU1" + zc(header.pack(b"TFAR", remote.FORMAT_VERSION, len(mjson)) + mjson + b"short"),
        b"TFU1" + zc(header.pack(b"TFAR", remote.FORMAT_VERSION, len(mjson)) + mjson
                     + files["kernel.so"] + files["source.cpp"] + b"extra"),
        b"TFU1" + zc(header.pack(b"TFAR", remote.FORMAT_VERSION, 4) + b"[1] "),
        b"TFU1" + zc(good_record),
    ]
    for value in record_values:
        raw.set(rkey("rec", KEY), value)
        assert cache.get_records(KEY) is None, value[:40]
    for value in artifact_values:
        raw.set(rkey("art", ART), value)
        assert cache.get_artifact(ART) is None, value[:40]
    raw.delete(rkey("rec", KEY))
    raw.hset(rkey("rec", KEY), "field", "a hash, not a string")  # WRONGTYPE: a bad value, not an outage
    assert cache.get_records(KEY) is None
    assert cache.stats.rejected == len(record_values) + len(artifact_values) + 1
    assert cache.stats.errors == 0 and cache.available
    # and the good ones still work
    raw.set(rkey("art", ART), b"TFU1" + zc(header.pack(b"TFAR", remote.FORMAT_VERSION, len(mjson)) + mjson
                                           + files["kernel.so"] + files["source.cpp"]))
    assert cache.get_artifact(ART) == (manifest, files)


# ------------------------------------------------------------------------------------------------ TTL

def test_ttl_expiry(redis_clean: str, raw: Any, make_cache: Callable[..., RemoteCache]) -> None:
    short = make_cache(redis_clean, ttl_s=3)
    forever = make_cache(redis_clean, ttl_s=0)
    short.put_records(KEY, [record()])
    forever.put_records("kept-key-00000000", [record("kept-key-00000000")])
    assert short.flush(5) and forever.flush(5)
    assert 0 < raw.pttl(rkey("rec", KEY)) <= 3000
    assert raw.pttl(rkey("rec", "kept-key-00000000")) == -1  # no expiry
    # Redis itself expires the value (pttl above), so what the reader sees is checked by polling.
    wait_for(lambda: short.get_records(KEY) is None, "the 3 s TTL to expire")
    assert short.stats.misses == 1
    assert short.get_records("kept-key-00000000") is not None


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


# ------------------------------------------------------------------------------------------- outages

def test_outage_opens_the_breaker_and_recovery_closes_it(redis_private: RedisServer,
                                                         make_cache: Callable[..., RemoteCache],
                                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    cache = make_cache(redis_private.url, retry_s=2.0, timeout_s=0.3)
    cache.put_records(KEY, [record()])
    assert cache.flush(5) and cache.get_records(KEY) is not None

    redis_private.kill()
    results = [cache.get_records(KEY) for _ in range(10)] + [cache.get_artifact(ART) for _ in range(10)]
    assert results == [None] * 20
    assert cache.stats.errors >= 1 and cache.stats.errors + cache.stats.skipped == 20
    assert cache.stats.skipped >= 15  # the breaker, not 20 failing calls
    assert not is_available(cache)
    cache.put_records(KEY, [record()])  # dropped at once, no exception
    cache.put_artifact(ART, *artifact())
    assert cache.flush(2)
    assert cache.stats.dropped == 2
    assert len(warnings_of(caplog)) == 1  # one warning for the whole outage
    assert "failed" in warnings_of(caplog)[0] and "local caches only" in warnings_of(caplog)[0]

    redis_private.restart()
    wait_for(lambda: is_available(cache), "retry_s to pass")
    assert cache.get_records(KEY) is None  # the trial call: reaches the (new, empty) server
    assert is_available(cache)
    cache.put_records(KEY, [record()])
    assert cache.flush(5)
    assert cache.get_records(KEY) == [record()]
    assert len(warnings_of(caplog)) == 1
    assert any("is back" in r.getMessage() for r in caplog.records if r.name == LOGGER)


def test_failed_trial_call_keeps_the_breaker_open(redis_private: RedisServer,
                                                  make_cache: Callable[..., RemoteCache],
                                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    cache = make_cache(redis_private.url, retry_s=1.0, timeout_s=0.3)
    redis_private.kill()
    assert cache.get_records(KEY) is None  # error: open
    assert not is_available(cache)
    wait_for(lambda: is_available(cache), "retry_s to pass")
    assert cache.get_records(KEY) is None  # the trial fails: open again
    assert cache.get_records(KEY) is None  # skipped
    assert (cache.stats.errors, cache.stats.skipped) == (2, 1)
    assert len(warnings_of(caplog)) == 1


def test_server_killed_mid_call(redis_private: RedisServer, make_cache: Callable[..., RemoteCache]) -> None:
    cache = make_cache(redis_private.url, timeout_s=60)
    assert cache.get_records(KEY) is None  # connected
    redis_private.pause(60000)
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(cache.get_records(KEY)))
    thread.start()
    wait_for(cache._read_lock.locked, "the get to be waiting for its reply")
    start = time.monotonic()
    redis_private.kill()
    thread.join(30)
    assert not thread.is_alive() and result == [None]
    assert time.monotonic() - start < 30  # the kill ended it, not the 60 s time-out or pause
    assert cache.stats.errors == 1


def test_slow_server_times_out(redis_private: RedisServer, make_cache: Callable[..., RemoteCache],
                               caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    cache = make_cache(redis_private.url, timeout_s=0.2)
    assert cache.get_records(KEY) is None  # connected
    redis_private.pause(20000)
    start = time.monotonic()
    assert cache.get_records(KEY) is None
    assert time.monotonic() - start < 10.0  # the 0.2 s time-out ended it, far before the 20 s pause
    assert cache.stats.errors == 1
    assert len(warnings_of(caplog)) == 1 and "Timeout" in warnings_of(caplog)[0]


def test_unreachable_url(make_cache: Callable[..., RemoteCache], caplog: pytest.LogCaptureFixture) -> None:
    from .redis_server import free_port

    caplog.set_level(logging.WARNING, logger=LOGGER)
    cache = make_cache(f"redis://user:hunter2@127.0.0.1:{free_port()}/0?password=hunter2", timeout_s=0.2)
    assert cache.get_records(KEY) is None
    cache.put_records(KEY, [record()])
    assert cache.flush(2)
    assert cache.stats.errors == 1 and cache.stats.dropped == 1
    assert len(warnings_of(caplog)) == 1
    assert "hunter2" not in warnings_of(caplog)[0]


# ------------------------------------------------------------------------------------------ limits

def test_oversized_artifact_is_not_stored(redis_clean: str, raw: Any, make_cache: Callable[..., RemoteCache]) -> None:
    cache = make_cache(redis_clean, max_entry_bytes=16384)
    big_manifest, big_files = artifact("cppbigbigbigbig0000", {"lib.so": os.urandom(64 * 1024)})
    small_manifest, small_files = artifact()  # compresses well below the limit
    cache.put_artifact("cppbigbigbigbig0000", big_manifest, big_files)
    cache.put_artifact(ART, small_manifest, small_files)
    assert cache.flush(5)
    assert cache.stats.dropped == 1 and cache.stats.puts == 1
    assert raw.exists(rkey("art", "cppbigbigbigbig0000")) == 0
    assert cache.get_artifact("cppbigbigbigbig0000") is None
    assert cache.get_artifact(ART) == (small_manifest, small_files)
    # a reader refuses a value above its own limit without decompressing it
    raw.set(rkey("art", "cppbigbigbigbig0000"), b"TFU1" + os.urandom(20000))
    assert cache.get_artifact("cppbigbigbigbig0000") is None
    assert cache.stats.rejected == 1


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


# -------------------------------------------------------------------------------------- construction

def test_constructor_rejects_bad_arguments() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
                            ({"url": "http://127.0.0.1:6379"}, "remote.url"),
                            ({"url": "127.0.0.1:6379"}, "remote.url"),
                            ({"namespace": "a b"}, "remote.namespace"),
                            ({"namespace": ""}, "remote.namespace"),
                            ({"secret": ""}, "remote.secret"),
                            ({"ttl_s": -1}, "remote.ttl_s"),
                            ({"max_entry_bytes": 0}, "remote.max_entry_bytes"),
                            ({"timeout_s": 0}, "remote.timeout_s"),
                            ({"retry_s": -1}, "remote.retry_s")]
    for kwargs, setting in cases:
        args: dict[str, Any] = {"url": "redis://127.0.0.1:1/0", **kwargs}
        with pytest.raises(ValueError, match=setting.replace(".", r"\.")) as info:
            RemoteCache(args.pop("url"), **args)
        assert isinstance(info.value, ConfigError)
    with pytest.raises(ValueError, match="queue_size"):
        RemoteCache("redis://127.0.0.1:1/0", queue_size=0)
    RemoteCache("unix:///tmp/redis.sock").close()  # connects to nothing


def test_default_remote_follows_the_settings(redis_clean: str, monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture) -> None:
    with config.patch({"remote.url": None}):
        assert remote_settings.default_remote() is None
    with config.patch({"remote.url": redis_clean, "remote.timeout_s": 0.25, "remote.ttl_s": 60,
                       "remote.allow_unsigned": True}):
        cache = remote_settings.default_remote()
        assert cache is not None and remote_settings.default_remote() is cache
        assert (cache.timeout_s, cache.ttl_s) == (0.25, 60.0)
        with config.patch({"remote.namespace": "team-b"}):
            other = remote_settings.default_remote()
            assert other is not None and other is not cache and other.namespace == "team-b"
        cache.put_records(KEY, [record()])
        remote.flush_all()
        assert cache.stats.puts == 1
        cache.close()
        other.close()
        assert remote_settings.default_remote() is not cache  # a closed cache is replaced

        caplog.set_level(logging.WARNING, logger=LOGGER)
        real_find_spec = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: None if name == "redis" else real_find_spec(name, *a))
        assert remote_settings.default_remote() is None
        assert remote_settings.default_remote() is None
        assert [m for m in warnings_of(caplog) if "pip install 'tuneforge[redis]'" in m] != []
        assert len(warnings_of(caplog)) == 1


def test_import_is_cheap() -> None:
    run_python("""
        import sys
        import tuneforge.store.remote
        assert "redis" not in sys.modules and "zstandard" not in sys.modules, sorted(sys.modules)
        assert "tuneforge.tune" not in sys.modules and "tuneforge.compile" not in sys.modules
    """)
