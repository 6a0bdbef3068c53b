"""The Redis tier against a real redis-server: round trips, signing, garbage, TTL, size limits, construction.

Write-behind delivery is in test_remote_write_behind.py, outages in test_remote_outages.py."""

from __future__ import annotations

import importlib.util
import json
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tuneforge import config
from tuneforge.errors import ConfigError
from tuneforge.store import remote, remote_format, remote_settings
from tuneforge.store.remote import RemoteCache

from .conftest import run_python
from .remote_helpers import (
    ART,
    KEY,
    LOGGER,
    artifact,
    fresh_warnings,  # noqa: F401 (an autouse fixture)
    make_cache_fixture,  # noqa: F401 (the `make_cache` fixture)
    record,
    wait_for,
    warnings_of,
)

redis = pytest.importorskip("redis")
zstandard = pytest.importorskip("zstandard")

pytestmark = pytest.mark.redis


def rkey(kind: str, key: str, namespace: str = "tuneforge") -> bytes:
    return f"{namespace}:v{remote.FORMAT_VERSION}:{kind}:{key}".encode()


def zc(body: bytes) -> bytes:
    return bytes(zstandard.ZstdCompressor().compress(body))


def zd(payload: bytes) -> bytes:
    return bytes(zstandard.ZstdDecompressor().decompress(payload))


@pytest.fixture
def raw(redis_clean: str) -> Iterator[Any]:
    """A plain redis-py client on the session server, for reading and tampering with values."""
    client = redis.Redis.from_url(redis_clean)
    yield client
    client.close()


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
