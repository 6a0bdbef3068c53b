"""The RESP reader against servers that misbehave on purpose (a byte at a time, a huge announced reply,
an endless line) and against a real redis-server: every call ends within its time-out, nothing is
buffered beyond the size limit, and the reader stays correct for well-formed replies."""

from __future__ import annotations

import socket
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tuneforge.store.remote import RemoteCache
from tuneforge.store.resp import ReplyTooLarge, RespError, RespReader

Handler = Callable[[socket.socket, int, threading.Event], None]
KEY = "selkey-0123456789abcdef"


def _read_command(conn: socket.socket) -> None:
    """Consume one RESP command (an array of bulk strings) from the client."""
    data = b""

    def line() -> bytes:
        nonlocal data
        while b"\r\n" not in data:
            chunk = conn.recv(4096)
            if not chunk:
                raise ConnectionError("client went away")
            data += chunk
        first, _, data = data.partition(b"\r\n")
        return first

    count = int(line()[1:])
    for _ in range(count):
        size = int(line()[1:])
        while len(data) < size + 2:
            chunk = conn.recv(4096)
            if not chunk:
                raise ConnectionError("client went away")
            data += chunk
        data = data[size + 2:]


class FakeServer:
    """A TCP server on 127.0.0.1 that reads one command per connection and lets ``handler`` answer it."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.port: int = self.listener.getsockname()[1]
        self.stop = threading.Event()
        self.connections = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            index, self.connections = self.connections, self.connections + 1
            threading.Thread(target=self._handle, args=(conn, index), daemon=True).start()

    def _handle(self, conn: socket.socket, index: int) -> None:
        conn.settimeout(None)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            try:
                _read_command(conn)
                self.handler(conn, index, self.stop)
            except OSError:
                pass  # the client closed the connection: that is what these tests provoke

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        self._thread.join(5)


@pytest.fixture
def fake_server() -> Iterator[Callable[[Handler], FakeServer]]:
    servers: list[FakeServer] = []

    def make(handler: Handler) -> FakeServer:
        server = FakeServer(handler)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


def reader_for(server: FakeServer, timeout_s: float, max_reply_bytes: int = 2**20) -> RespReader:
    reader = RespReader.for_url(server.url, timeout_s, max_reply_bytes)
    assert reader is not None
    return reader


def in_thread(fn: Callable[[], Any], limit_s: float) -> tuple[list[Any], float]:
    """Run ``fn`` in a thread, wait at most ``limit_s``; return [result or exception] and the seconds it took."""
    outcome: list[Any] = []

    def run() -> None:
        try:
            outcome.append(fn())
        except BaseException as exc:
            outcome.append(exc)

    start = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit_s)
    assert not thread.is_alive(), f"the call was still running after {limit_s}s"
    return outcome, time.monotonic() - start


# ---------------------------------------------------------------------------------------- deadline

def drip(conn: socket.socket, index: int, stop: threading.Event) -> None:
    """A valid reply of 2000 bytes, one byte every 20 ms (40 s in all): no single recv ever waits long."""
    conn.sendall(b"$2000\r\n")
    for _ in range(2002):
        if stop.wait(0.02):
            return
        conn.sendall(b"x")


def test_a_dripping_server_cannot_stretch_a_call_past_its_timeout(fake_server: Callable[[Handler], FakeServer]
                                                                  ) -> None:
    reader = reader_for(fake_server(drip), timeout_s=0.5)
    # The bound is the 0.5 s time-out plus a margin for a loaded machine; the drip alone lasts 40 s.
    (outcome,), took = in_thread(lambda: reader.get(b"k"), limit_s=10)
    assert isinstance(outcome, TimeoutError), outcome
    assert took < 10


def test_a_dripping_server_is_an_outage_for_the_remote_cache(fake_server: Callable[[Handler], FakeServer]) -> None:
    pytest.importorskip("zstandard")
    cache = RemoteCache(fake_server(drip).url, timeout_s=0.5)
    try:
        (outcome,), _ = in_thread(lambda: cache.get_records(KEY), limit_s=10)
        assert outcome is None
        assert cache.stats.errors == 1 and not cache.available
    finally:
        cache.close()


# -------------------------------------------------------------------------------------------- size

def huge(conn: socket.socket, index: int, stop: threading.Event) -> None:
    """The first connection announces a 512 MiB value and sends a little of it; later ones: a miss."""
    if index == 0:
        conn.sendall(b"$536870912\r\n" + b"x" * 4096)
        stop.wait(30)
    else:
        conn.sendall(b"$-1\r\n")
        stop.wait(30)


def test_a_huge_announced_reply_is_refused_without_reading_it(fake_server: Callable[[Handler], FakeServer]) -> None:
    server = fake_server(huge)
    reader = reader_for(server, timeout_s=10, max_reply_bytes=2**20)
    tracemalloc.start()
    try:
        (outcome,), took = in_thread(lambda: reader.get(b"k"), limit_s=30)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert isinstance(outcome, ReplyTooLarge) and "536870912" in str(outcome), outcome
    assert peak < 16 * 2**20  # nothing near the announced size was allocated
    assert took < 5  # refused from the length line, not after the 10 s time-out
    # The rest of that reply cannot be skipped: the connection was dropped, and the next call reconnects.
    assert reader.get(b"k") is None
    assert server.connections == 2


def test_a_remote_value_above_max_entry_bytes_is_rejected_not_read(fake_server: Callable[[Handler], FakeServer]
                                                                   ) -> None:
    pytest.importorskip("zstandard")
    cache = RemoteCache(fake_server(huge).url, timeout_s=10, max_entry_bytes=2**20)
    try:
        tracemalloc.start()
        try:
            (outcome,), took = in_thread(lambda: cache.get_records(KEY), limit_s=30)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert outcome is None
        assert peak < 16 * 2**20 and took < 5
        # A value too large is a bad value, not an outage: the server stays in use.
        assert (cache.stats.rejected, cache.stats.errors) == (1, 0) and cache.available
        assert cache.get_records(KEY) is None and cache.stats.misses == 1
    finally:
        cache.close()


# -------------------------------------------------------------------------------------------- lines

def endless_line(conn: socket.socket, index: int, stop: threading.Event) -> None:
    """A status line of 32 MiB that never ends, in 64 KiB pieces."""
    conn.sendall(b"+")
    piece = b"x" * 65536
    for _ in range(512):
        conn.sendall(piece)
    stop.wait(30)


def test_an_endless_line_is_refused_fast(fake_server: Callable[[Handler], FakeServer]) -> None:
    reader = reader_for(fake_server(endless_line), timeout_s=10)
    (outcome,), took = in_thread(lambda: reader.get(b"k"), limit_s=30)
    assert isinstance(outcome, ConnectionError) and "line longer than" in str(outcome), outcome
    assert took < 5  # refused after the limit, not after buffering 32 MiB and the 10 s time-out


def long_error_then_value(conn: socket.socket, index: int, stop: threading.Event) -> None:
    """An error line just under the line limit in 100-byte pieces, then (next command) a 3 MiB value."""
    message = b"-ERR " + b"e" * 60000 + b"\r\n"
    for start in range(0, len(message), 100):
        conn.sendall(message[start:start + 100])
    _read_command(conn)
    value = bytes(range(256)) * (3 * 4096)
    reply = b"$%d\r\n%s\r\n" % (len(value), value)
    for start in range(0, len(reply), 7919):  # a prime: pieces never align with the reader's reads
        conn.sendall(reply[start:start + 7919])
    stop.wait(30)


def test_well_formed_replies_in_small_pieces_are_read_exactly(fake_server: Callable[[Handler], FakeServer]) -> None:
    reader = reader_for(fake_server(long_error_then_value), timeout_s=20, max_reply_bytes=4 * 2**20)
    with pytest.raises(RespError) as info:
        reader.get(b"k")
    assert str(info.value) == "ERR " + "e" * 60000
    assert reader.get(b"k") == bytes(range(256)) * (3 * 4096)  # same connection: an error keeps it open


# ------------------------------------------------------------------------------------ real server

def test_against_redis_server(redis_clean: str) -> None:
    redis = pytest.importorskip("redis")
    client = redis.Redis.from_url(redis_clean)
    try:
        big = bytes(range(256)) * 12288  # 3 MiB
        client.set(b"big", big)
        client.set(b"small", b"v")
        client.hset(b"hash", b"f", b"v")
        reader = RespReader.for_url(redis_clean, 5.0, max_reply_bytes=4 * 2**20)
        assert reader is not None
        assert reader.get(b"big") == big
        assert reader.get(b"missing") is None
        with pytest.raises(RespError, match="WRONGTYPE"):
            reader.get(b"hash")
        assert reader.get(b"small") == b"v"
        small = RespReader.for_url(redis_clean, 5.0, max_reply_bytes=2**20)
        assert small is not None
        with pytest.raises(ReplyTooLarge):
            small.get(b"big")
        assert small.get(b"small") == b"v"  # reconnected
        reader.close()
        small.close()
    finally:
        client.close()
