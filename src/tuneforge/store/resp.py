"""A minimal Redis reader (RESP2 over one TCP socket) for the latency-critical lookup path.

Importing redis-py costs about 80 ms here (it loads asyncio and its parsers), which alone would
exceed the budget of a fresh process's first tuned result. Lookups are single GETs, so they use this
reader for plain ``redis://`` URLs; everything else (writes, TLS, unix sockets) uses redis-py.

The server is not trusted to be well behaved, because a lookup must never stall or exhaust a
selection: every call has one total deadline (a server that drips a byte at a time cannot stretch it
the way per-recv socket time-outs would), a bulk reply longer than ``max_reply_bytes`` is refused from
its announced length before anything is read or allocated, a status line longer than ``_MAX_LINE``
is refused, and line ends are searched only in bytes not searched before (linear in the reply).
"""

from __future__ import annotations

import socket
import time
from urllib.parse import unquote, urlsplit

# Status, error and length lines of GET, AUTH and SELECT replies are short; anything longer is not
# a Redis server answering those commands.
_MAX_LINE = 64 * 1024
_RECV = 65536


class RespError(Exception):
    """The server answered with an error (e.g. WRONGTYPE, NOAUTH)."""


class ReplyTooLarge(Exception):
    """A bulk reply announced more bytes than the reader accepts; nothing of it was read."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"the server announced a {size}-byte reply, above the limit of {limit} bytes")
        self.size, self.limit = size, limit


class RespReader:
    """GET over one lazily opened connection; any failure closes it (the next call reconnects).

    ``timeout_s`` bounds a whole call (connecting, authenticating and reading the reply included).
    """

    def __init__(self, host: str, port: int, db: int, username: str | None, password: str | None,
                 timeout_s: float, max_reply_bytes: int = 512 * 2**20) -> None:
        self.host, self.port, self.db = host, port, db
        self.username, self.password, self.timeout_s = username, password, timeout_s
        self.max_reply_bytes = max_reply_bytes
        self._sock: socket.socket | None = None
        self._buffer = bytearray()
        self._pos = 0  # start of the unread bytes in _buffer
        self._deadline = 0.0

    @classmethod
    def for_url(cls, url: str, timeout_s: float, max_reply_bytes: int = 512 * 2**20) -> RespReader | None:
        """A reader for a plain ``redis://host:port/db`` URL (with optional credentials), else None."""
        parts = urlsplit(url)
        if parts.scheme != "redis" or parts.query or not parts.hostname:
            return None
        path = parts.path.strip("/")
        if path and not path.isdigit():
            return None
        return cls(parts.hostname, parts.port or 6379, int(path or 0),
                   unquote(parts.username) if parts.username else None,
                   unquote(parts.password) if parts.password else None, timeout_s, max_reply_bytes)

    # ------------------------------------------------------------------------------- socket, deadline

    def _remaining(self) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no complete reply within {self.timeout_s:g}s")
        return left

    def _send(self, *args: bytes) -> None:
        assert self._sock is not None
        out = [b"*%d\r\n" % len(args)]
        for arg in args:
            out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
        self._sock.settimeout(self._remaining())  # since 3.5, a bound on the whole sendall
        self._sock.sendall(b"".join(out))

    def _fill(self) -> None:
        """Append at least one received byte to the buffer."""
        assert self._sock is not None
        self._sock.settimeout(self._remaining())
        chunk = self._sock.recv(_RECV)
        if not chunk:
            raise ConnectionError("connection closed by the server")
        self._buffer += chunk

    def _line(self) -> bytes:
        start = search = self._pos
        while True:
            end = self._buffer.find(b"\r\n", search)
            if end >= 0:
                break
            if len(self._buffer) - start > _MAX_LINE:
                raise ConnectionError(f"a reply line longer than {_MAX_LINE} bytes: not a Redis server")
            search = max(start, len(self._buffer) - 1)  # a '\r' at the end may start the line end
            self._fill()
        line = bytes(self._buffer[start:end])
        self._pos = end + 2
        return line

    def _exactly(self, size: int) -> bytes:
        assert self._sock is not None
        if size > self.max_reply_bytes:
            raise ReplyTooLarge(size, self.max_reply_bytes)
        need = size + 2
        data = bytearray(need)
        view = memoryview(data)
        have = min(need, len(self._buffer) - self._pos)
        view[:have] = self._buffer[self._pos:self._pos + have]
        self._pos += have
        while have < need:
            self._sock.settimeout(self._remaining())
            got = self._sock.recv_into(view[have:], min(need - have, 16 * _RECV))
            if not got:
                raise ConnectionError("connection closed by the server")
            have += got
        if bytes(view[size:]) != b"\r\n":
            raise ConnectionError("a bulk reply without its line end")
        view.release()
        del data[size:]
        return bytes(data)

    def _reply(self) -> bytes | None:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"-":
            raise RespError(rest.decode(errors="replace"))
        if kind == b"$":
            size = int(rest)
            if size < -1:
                raise ConnectionError(f"unexpected bulk length {size}")
            reply = None if size == -1 else self._exactly(size)
        elif kind in (b"+", b":"):
            reply = rest
        else:
            raise ConnectionError(f"unexpected reply {line[:40]!r}")
        del self._buffer[:self._pos]  # what is left (nothing, for one command at a time) stays
        self._pos = 0
        return reply

    def _connect(self) -> None:
        self._sock = socket.create_connection((self.host, self.port), timeout=self._remaining())
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer, self._pos = bytearray(), 0
        if self.password is not None:
            credentials = [self.username.encode()] if self.username else []
            self._send(b"AUTH", *credentials, self.password.encode())
            self._reply()
        if self.db:
            self._send(b"SELECT", str(self.db).encode())
            self._reply()

    def get(self, key: bytes) -> bytes | None:
        """The value of ``key`` (None if absent), within ``timeout_s`` in all.

        RespError: the server answered with an error (the connection stays usable).  ReplyTooLarge,
        TimeoutError, OSError and the like: the connection is closed first.
        """
        self._deadline = time.monotonic() + self.timeout_s
        if self._sock is None:
            try:
                self._connect()
            except BaseException:  # a refused AUTH too: the next call must authenticate again
                self.close()
                raise
        try:
            self._send(b"GET", key)
            return self._reply()
        except RespError:
            raise
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock, self._buffer, self._pos = None, bytearray(), 0
