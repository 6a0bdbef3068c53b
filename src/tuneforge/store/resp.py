"""A minimal Redis reader (RESP2 over one TCP socket) for the latency-critical lookup path.

Importing redis-py costs about 80 ms here (it loads asyncio and its parsers), which alone would
exceed the budget of a fresh process's first tuned result. Lookups are single GETs, so they use this
reader for plain ``redis://`` URLs; everything else (writes, TLS, unix sockets) uses redis-py.
"""

from __future__ import annotations

import socket
from urllib.parse import unquote, urlsplit


class RespError(Exception):
    """The server answered with an error (e.g. WRONGTYPE, NOAUTH)."""


class RespReader:
    """GET over one lazily opened connection; any failure closes it (the next call reconnects)."""

    def __init__(self, host: str, port: int, db: int, username: str | None, password: str | None,
                 timeout_s: float) -> None:
        self.host, self.port, self.db = host, port, db
        self.username, self.password, self.timeout_s = username, password, timeout_s
        self._sock: socket.socket | None = None
        self._buffer = b""

    @classmethod
    def for_url(cls, url: str, timeout_s: float) -> RespReader | None:
        """A reader for a plain ``redis://host:port/db`` URL (with optional credentials), else None."""
        parts = urlsplit(url)
        if parts.scheme != "redis" or parts.query or not parts.hostname:
            return None
        path = parts.path.strip("/")
        if path and not path.isdigit():
            return None
        return cls(parts.hostname, parts.port or 6379, int(path or 0),
                   unquote(parts.username) if parts.username else None,
                   unquote(parts.password) if parts.password else None, timeout_s)

    def _send(self, *args: bytes) -> None:
        assert self._sock is not None
        out = [b"*%d\r\n" % len(args)]
        for arg in args:
            out.append(b"$%d\r\n%s\r\n" % (len(arg), arg))
        self._sock.sendall(b"".join(out))

    def _line(self) -> bytes:
        assert self._sock is not None
        while b"\r\n" not in self._buffer:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise ConnectionError("connection closed by the server")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\r\n")
        return line

    def _exactly(self, size: int) -> bytes:
        assert self._sock is not None
        parts, have = [self._buffer], len(self._buffer)
        while have < size + 2:
            chunk = self._sock.recv(max(65536, size + 2 - have))
            if not chunk:
                raise ConnectionError("connection closed by the server")
            parts.append(chunk)
            have += len(chunk)
        data = b"".join(parts)
        self._buffer = data[size + 2:]
        return data[:size]

    def _reply(self) -> bytes | None:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"-":
            raise RespError(rest.decode(errors="replace"))
        if kind == b"$":
            size = int(rest)
            return None if size < 0 else self._exactly(size)
        if kind in (b"+", b":"):
            return rest
        raise ConnectionError(f"unexpected reply {line[:40]!r}")

    def _connect(self) -> None:
        self._sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._buffer = b""
        if self.password is not None:
            credentials = [self.username.encode()] if self.username else []
            self._send(b"AUTH", *credentials, self.password.encode())
            self._reply()
        if self.db:
            self._send(b"SELECT", str(self.db).encode())
            self._reply()

    def get(self, key: bytes) -> bytes | None:
        try:
            if self._sock is None:
                self._connect()
            self._send(b"GET", key)
            return self._reply()
        except RespError:
            raise
        except Exception:
            self.close()
            raise

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock, self._buffer = None, b""
