"""The Redis tier when its server fails, against a real redis-server: the circuit breaker through an outage
and recovery, a server killed mid-call, a slow server, an unreachable URL."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from tuneforge.store.remote import RemoteCache

from .redis_server import RedisServer
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


def is_available(cache: RemoteCache) -> bool:
    return cache.available


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
