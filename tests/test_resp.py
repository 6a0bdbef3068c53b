"""The RESP reader against servers that misbehave on purpose (a byte at a time, a huge announced reply,
an endless line) and against a real redis-server: every call ends within its time-out, nothing is
buffered beyond the size limit, and the reader stays correct for well-formed replies, over every URL
form the settings accept (TCP, TLS, unix socket, query options, credentials)."""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import tempfile
import threading
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tuneforge.store import resp
from tuneforge.store.records import Record
from tuneforge.store.remote import RemoteCache
from tuneforge.store.resp import ReplyTooLarge, RespError, RespReader

from .redis_server import REDIS_SERVER, RedisServer, self_signed_certificate

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
    """A server on 127.0.0.1 (``kind`` "tcp" or "tls") or a unix socket ("unix") that reads one command per
    connection and lets ``handler`` answer it; ``query`` is added to its URL."""

    def __init__(self, handler: Handler, kind: str = "tcp", query: str = "",
                 certificate: tuple[Path, Path] | None = None) -> None:
        self.handler, self.kind, self.query = handler, kind, query
        self.tls: ssl.SSLContext | None = None
        self.certificate = certificate
        if kind == "tls":
            assert certificate is not None
            self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.tls.load_cert_chain(*certificate)
        self._dir = tempfile.mkdtemp(prefix="tf-fake-")  # short: socket paths are limited to ~107 bytes
        self.path = os.path.join(self._dir, "s.sock")
        if kind == "unix":
            self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.listener.bind(self.path)
            self.listener.listen()
            self.port = 0
        else:
            self.listener = socket.create_server(("127.0.0.1", 0))
            self.port = self.listener.getsockname()[1]
        self.listener.settimeout(0.1)
        self.stop = threading.Event()
        self.connections = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        query = f"?{self.query}" if self.query else ""
        if self.kind == "unix":
            return f"unix://{self.path}{query}"
        if self.kind == "tls":
            assert self.certificate is not None
            query = f"?ssl_ca_certs={self.certificate[0]}" + (f"&{self.query}" if self.query else "")
            return f"rediss://127.0.0.1:{self.port}/0{query}"
        return f"redis://127.0.0.1:{self.port}/0{query}"

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
        if self.kind != "unix":
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with conn:
            try:
                if self.tls is not None:
                    conn = self.tls.wrap_socket(conn, server_side=True)
                _read_command(conn)
                self.handler(conn, index, self.stop)
            except OSError:
                pass  # the client closed the connection: that is what these tests provoke

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        self._thread.join(5)
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        os.rmdir(self._dir)


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    made = self_signed_certificate(tmp_path_factory.mktemp("tls"))
    if made is None:
        pytest.skip("the openssl command is not on PATH: no certificate for the TLS tests (apt-get install openssl)")
    return made


@pytest.fixture
def fake_server() -> Iterator[Callable[..., FakeServer]]:
    servers: list[FakeServer] = []

    def make(handler: Handler, kind: str = "tcp", query: str = "",
             certificate: tuple[Path, Path] | None = None) -> FakeServer:
        server = FakeServer(handler, kind, query, certificate)
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


def traced_lookup(cache: RemoteCache) -> tuple[Any, float, int]:
    """(what get_records returned, how long it took, the peak of memory allocated meanwhile)."""
    tracemalloc.start()
    try:
        (outcome,), took = in_thread(lambda: cache.get_records(KEY), limit_s=30)
        return outcome, took, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_a_remote_value_above_max_entry_bytes_is_rejected_not_read(fake_server: Callable[[Handler], FakeServer]
                                                                   ) -> None:
    pytest.importorskip("zstandard")
    cache = RemoteCache(fake_server(huge).url, timeout_s=10, max_entry_bytes=2**20)
    try:
        outcome, took, peak = traced_lookup(cache)
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


# ------------------------------------------------------------------------- every URL form, one path

# The lookup of each URL form the settings accept must go through the bounded reader; these forms used
# to go through redis-py, whose time-out is per recv and which buffers a reply before its size is known.
FORMS = {"unix": ("unix", ""), "tls": ("tls", ""), "query": ("tcp", "db=0&socket_timeout=5"),
         "unix-query": ("unix", "db=0"), "tls-query": ("tls", "db=0&ssl_check_hostname=true")}


def form_server(make: Callable[..., FakeServer], form: str, handler: Handler,
                request: pytest.FixtureRequest) -> FakeServer:
    kind, query = FORMS[form]
    certificate = request.getfixturevalue("certificate") if kind == "tls" else None
    return make(handler, kind, query, certificate)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_dripping_server_cannot_stretch_a_lookup_of_any_url_form(
        form: str, fake_server: Callable[..., FakeServer], request: pytest.FixtureRequest) -> None:
    pytest.importorskip("zstandard")
    cache = RemoteCache(form_server(fake_server, form, drip, request).url, timeout_s=0.5)
    try:
        # The drip lasts 40 s; the limit is the 0.5 s time-out plus a wide margin for a loaded machine.
        (outcome,), _ = in_thread(lambda: cache.get_records(KEY), limit_s=10)
        assert outcome is None
        assert cache.stats.errors == 1 and not cache.available
        assert cache._client is None  # the lookup never went through redis-py
    finally:
        cache.close()


@pytest.mark.parametrize("form", sorted(FORMS))
def test_a_huge_announced_reply_is_refused_on_any_url_form(
        form: str, fake_server: Callable[..., FakeServer], request: pytest.FixtureRequest) -> None:
    pytest.importorskip("zstandard")
    cache = RemoteCache(form_server(fake_server, form, huge, request).url, timeout_s=10, max_entry_bytes=2**20)
    try:
        outcome, took, peak = traced_lookup(cache)
        assert outcome is None
        assert peak < 16 * 2**20 and took < 5  # refused from the length line, not after the 10 s time-out
        assert (cache.stats.rejected, cache.stats.errors) == (1, 0) and cache.available
    finally:
        cache.close()


def test_a_large_value_is_read_and_checked_without_copies(fake_server: Callable[..., FakeServer]) -> None:
    """The reply is one buffer of its size, handed over as is, and the signature is checked in place:
    the peak stays near one value (it used to be four: reader, copy, payload slice, MAC message)."""
    pytest.importorskip("zstandard")
    value = b"TFS1" + b"\0" * 32 + os.urandom(16 * 2**20)  # signed, with a wrong signature

    def big_signed_value(conn: socket.socket, index: int, stop: threading.Event) -> None:
        # In pieces, built before tracing starts: the server's memory is traced too.
        conn.sendall(b"$%d\r\n" % len(value))
        conn.sendall(value)
        conn.sendall(b"\r\n")
        stop.wait(30)

    server = fake_server(big_signed_value)
    cache = RemoteCache(server.url, secret="s", timeout_s=30, max_entry_bytes=32 * 2**20)
    try:
        tracemalloc.start()
        try:
            assert cache.get_records(KEY) is None
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert cache.stats.rejected == 1 and cache.stats.errors == 0  # a bad signature, read in full
        assert peak < 24 * 2**20, f"peak {peak / 2**20:.1f} MiB for a 16 MiB value"
    finally:
        cache.close()


# ----------------------------------------------------------------------------------------- URL options

@pytest.mark.parametrize(("url", "expected"), [
    ("redis://h", dict(host="h", port=6379, db=0, tls=False)),
    ("redis://u:p%40ss@h:7000/3", dict(host="h", port=7000, db=3, username="u", password="p@ss")),
    ("redis://:pw@h/2?db=5", dict(db=5, username=None, password="pw")),  # the query's db wins, as in redis-py
    ("redis://h?username=u&password=pw&socket_timeout=3&max_connections=9", dict(username="u", password="pw")),
    ("unix:///run/redis.sock", dict(host=None, path="/run/redis.sock", db=0)),
    ("unix://u:pw@/run/r%20s.sock?db=4", dict(path="/run/r s.sock", db=4, username="u", password="pw")),
    ("rediss://h:6380/1", dict(tls=True, cert_reqs="required", check_hostname=True, ca_certs=None, db=1)),
    ("rediss://h?ssl_cert_reqs=none", dict(cert_reqs="none")),
    ("rediss://h?ssl_ca_certs=/etc/ca.pem&ssl_check_hostname=false&ssl_certfile=c&ssl_keyfile=k",
     dict(ca_certs="/etc/ca.pem", check_hostname=False, certfile="c", keyfile="k")),
])
def test_urls_are_read_as_redis_py_reads_them(url: str, expected: dict[str, Any]) -> None:
    endpoint = resp.parse_url(url)
    assert {name: getattr(endpoint, name) for name in expected} == expected
    assert "pw" not in repr(endpoint) and "p@ss" not in repr(endpoint)


@pytest.mark.parametrize(("url", "message"), [
    ("redis://h?ssl_cert_reqs=none", "apply only to rediss://"),
    ("rediss://h?ssl_cert_reqs=maybe", "expected none, optional or required"),
    ("rediss://h?ssl_ciphers=ALL", "unsupported URL option(s) ssl_ciphers"),
    ("redis://h?db=x", "not a database number"),
    ("redis://h/cache", "the database number"),
    ("rediss://h?ssl_check_hostname=perhaps", "not a boolean"),
])
def test_url_options_that_cannot_be_honoured_are_refused(url: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resp.parse_url(url)
    with pytest.raises(Exception, match="remote.url"):  # a setting error, at construction
        RemoteCache(url)


# ------------------------------------------------------------- a real server: unix socket, TLS, ACL user

@pytest.mark.skipif(REDIS_SERVER is None, reason="redis-server is not on PATH")
def test_every_url_form_reads_a_real_server(tmp_path: Path, certificate: tuple[Path, Path],
                                            caplog: pytest.LogCaptureFixture) -> None:
    redis = pytest.importorskip("redis")
    pytest.importorskip("zstandard")
    with RedisServer(tmp_path / "redis", unixsocket=True, tls=certificate).running() as server:
        assert server.command("ACL", "SETUSER", "tf", "on", ">pw", "~*", "+@all") == b"+OK"
        records = [Record(key=KEY, choice="c", op="mm", choice_name="n", status="ok", median_ms=1.0,
                          min_ms=1.0, count=3, method="cpu", params={}, inputs="[]", system="s", info={},
                          created=1.0)]
        writer = RemoteCache(f"redis://127.0.0.1:{server.port}/2", timeout_s=5)
        writer.put_records(KEY, records)
        assert writer.flush(10) and writer.stats.puts == 1
        writer.close()
        big = bytes(range(256)) * 12288  # 3 MiB: many reads, over TLS many records
        client = redis.Redis(port=server.port, db=2)
        client.set(b"big", big)
        client.close()
        ca, sock, tls = certificate[0], server.socket_path, server.tls_url
        for url in [f"unix://{sock}?db=2", f"unix://tf:pw@{sock}?db=2", f"redis://tf:pw@127.0.0.1:{server.port}/2",
                    f"redis://127.0.0.1:{server.port}?db=2&socket_timeout=3", f"{tls}/2?ssl_ca_certs={ca}",
                    f"{tls}?db=2&ssl_cert_reqs=none", f"rediss://tf:pw@localhost:{server.tls_port}/2?ssl_ca_certs={ca}"]:
            reader = RespReader.for_url(url, 5.0, max_reply_bytes=4 * 2**20)
            assert reader.get(b"big") == big and reader.get(b"missing") is None, url
            reader.close()
            cache = RemoteCache(url, timeout_s=5)
            assert cache.get_records(KEY) == records, url
            assert cache.stats.hits == 1 and cache._client is None, url  # read without redis-py
            cache.close()
        # Certificates are checked unless told otherwise: the system's CAs do not know this one.
        cache = RemoteCache(f"{tls}/2", timeout_s=5)
        assert cache.get_records(KEY) is None and cache.stats.errors == 1
        assert any("CERTIFICATE_VERIFY_FAILED" in r.getMessage() for r in caplog.records)
        cache.close()
        # A wrong password is an error, not a miss.
        cache = RemoteCache(f"unix://tf:wrong@{sock}?db=2", timeout_s=5)
        assert cache.get_records(KEY) is None and cache.stats.errors == 1
        cache.close()
