"""A minimal Redis reader (RESP2 over TCP, TLS or a unix socket) for the latency-critical lookup path.

Importing redis-py costs about 80 ms here (it loads asyncio and its parsers), which alone would
exceed the budget of a fresh process's first tuned result. Lookups are single GETs, so every lookup,
whatever the URL form, uses this reader; writes (queued, off the caller's path) use redis-py.

The server is not trusted to be well behaved, because a lookup must never stall or exhaust a
selection: every call has one total deadline (a server that drips a byte at a time cannot stretch it
the way redis-py's per-recv socket time-outs would), a bulk reply longer than ``max_reply_bytes`` is
refused from its announced length before anything is read or allocated, the accepted reply is read
into one buffer of its exact size (no second copy), a status line longer than ``_MAX_LINE`` is
refused, and line ends are searched only in bytes not searched before (linear in the reply).

URLs are read as redis-py reads them (``parse_url``), so one ``remote.url`` serves both:

- ``redis://[[user]:password@]host[:port][/db]``, ``rediss://`` (the same, over TLS) and
  ``unix://[[user]:password@]/path/to/socket``;
- query options: ``db``, ``username``, ``password`` (the URL's user part wins, as in redis-py);
  for ``rediss://`` also ``ssl_cert_reqs`` (``none``, ``optional`` or ``required``, the default),
  ``ssl_ca_certs`` (a PEM file of trusted CAs), ``ssl_ca_path`` (a directory of them),
  ``ssl_check_hostname`` (default true; off with ``ssl_cert_reqs=none``), ``ssl_certfile``,
  ``ssl_keyfile`` and ``ssl_password`` (a client certificate). TLS starts from
  ``ssl.create_default_context()``, so without these options the system's CAs are trusted;
- redis-py's tuning of its own connections (``socket_timeout``, ``max_connections``,
  ``health_check_interval``, ...; see ``_IGNORED``) is accepted and does not apply here: a lookup's
  bound is ``remote.timeout_s``.  Any other option is refused (``ValueError``) rather than silently
  dropped, since it could be one that matters, such as a certificate check.
"""

from __future__ import annotations

import socket
import time
from typing import TYPE_CHECKING, NamedTuple
from urllib.parse import parse_qsl, unquote, urlsplit

if TYPE_CHECKING:
    import ssl

# Status, error and length lines of GET, AUTH and SELECT replies are short; anything longer is not
# a Redis server answering those commands.
_MAX_LINE = 64 * 1024
_RECV = 65536

_TLS_OPTIONS = frozenset({"ssl_cert_reqs", "ssl_ca_certs", "ssl_ca_path", "ssl_check_hostname",
                          "ssl_certfile", "ssl_keyfile", "ssl_password"})
# Options of redis-py's own connections: they shape the writer's connections, never a lookup.
_IGNORED = frozenset({"socket_timeout", "socket_connect_timeout", "timeout", "socket_keepalive",
                      "socket_read_size", "retry_on_timeout", "retry_on_error", "max_connections",
                      "health_check_interval", "client_name", "protocol", "decode_responses", "encoding",
                      "encoding_errors", "legacy_responses", "lib_name", "lib_version"})
_TRUE, _FALSE = ("1", "true", "yes", "y", "t", "on"), ("0", "false", "no", "n", "f", "off")


class RespError(Exception):
    """The server answered with an error (e.g. WRONGTYPE, NOAUTH)."""


class ReplyTooLarge(Exception):
    """A bulk reply announced more bytes than the reader accepts; nothing of it was read."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"the server announced a {size}-byte reply, above the limit of {limit} bytes")
        self.size, self.limit = size, limit


class Endpoint(NamedTuple):
    """Where and how to connect, from a ``remote.url`` (see ``parse_url``).

    A NamedTuple, not a dataclass: creating the class costs a tenth, on the path of a process's first lookup.
    """

    host: str | None = None  # TCP (with port); None for a unix socket (with path)
    port: int = 6379
    path: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False
    cert_reqs: str = "required"  # "none", "optional" or "required"
    check_hostname: bool = True
    ca_certs: str | None = None
    ca_path: str | None = None
    certfile: str | None = None
    keyfile: str | None = None
    key_password: str | None = None

    def __repr__(self) -> str:  # never show the passwords
        where = self.path if self.host is None else f"{self.host}:{self.port}"
        return f"Endpoint({where!r}, db={self.db}, tls={self.tls})"

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS settings of this endpoint (files are read here, at connection time)."""
        import ssl

        context = ssl.create_default_context(cafile=self.ca_certs, capath=self.ca_path)
        if self.certfile is not None:
            context.load_cert_chain(self.certfile, self.keyfile, self.key_password)
        context.check_hostname = self.check_hostname and self.cert_reqs != "none"
        context.verify_mode = {"none": ssl.CERT_NONE, "optional": ssl.CERT_OPTIONAL,
                               "required": ssl.CERT_REQUIRED}[self.cert_reqs]
        return context


def _flag(name: str, text: str) -> bool:
    if text.lower() in _TRUE:
        return True
    if text.lower() in _FALSE:
        return False
    raise ValueError(f"{name}={text!r} in the URL is not a boolean (true or false)")


def parse_url(url: str) -> Endpoint:
    """The endpoint of a ``redis://``, ``rediss://`` or ``unix://`` URL (module docstring: the options).

    ValueError names what cannot be used; it never echoes a password.
    """
    parts = urlsplit(url)
    options: dict[str, str] = {}
    for name, value in parse_qsl(parts.query):  # blank values are dropped, as redis-py does
        options.setdefault(name, value)  # the first one wins, as in redis-py
    unknown = sorted(set(options) - _IGNORED - _TLS_OPTIONS - {"db", "username", "password"})
    if unknown:
        raise ValueError(f"unsupported URL option(s) {', '.join(unknown)}; supported: db, username, password, "
                         f"and for rediss:// {', '.join(sorted(_TLS_OPTIONS))}")
    tls_given = sorted(set(options) & _TLS_OPTIONS)
    if tls_given and parts.scheme != "rediss":
        raise ValueError(f"{', '.join(tls_given)} apply only to rediss:// (TLS) URLs")
    username = unquote(parts.username) if parts.username else options.get("username")
    password = unquote(parts.password) if parts.password else options.get("password")
    db_text = options.get("db")
    if parts.scheme == "unix":
        if not parts.path:
            raise ValueError("a unix:// URL needs the socket path (unix:///run/redis.sock)")
        where: dict[str, object] = {"path": unquote(parts.path)}
    elif parts.scheme in ("redis", "rediss"):
        if not parts.hostname:
            raise ValueError(f"a {parts.scheme}:// URL needs a host ({parts.scheme}://host:6379/0)")
        where = {"host": unquote(parts.hostname), "port": parts.port or 6379}
        path = unquote(parts.path).strip("/")
        if path and not path.isdigit():
            raise ValueError(f"the path of a {parts.scheme}:// URL is the database number, got {path!r}")
        if db_text is None and path:
            db_text = path
    else:
        raise ValueError(f"expected a redis://, rediss:// or unix:// URL, got scheme {parts.scheme!r}")
    if db_text is not None and not db_text.isdigit():
        raise ValueError(f"db={db_text!r} in the URL is not a database number")
    cert_reqs = options.get("ssl_cert_reqs", "required").lower()
    if cert_reqs not in ("none", "optional", "required"):
        raise ValueError(f"ssl_cert_reqs={cert_reqs!r} in the URL: expected none, optional or required")
    return Endpoint(**where, db=int(db_text or 0), username=username, password=password,  # type: ignore[arg-type]
                    tls=parts.scheme == "rediss", cert_reqs=cert_reqs,
                    check_hostname=_flag("ssl_check_hostname", options.get("ssl_check_hostname", "true")),
                    ca_certs=options.get("ssl_ca_certs"), ca_path=options.get("ssl_ca_path"),
                    certfile=options.get("ssl_certfile"), keyfile=options.get("ssl_keyfile"),
                    key_password=options.get("ssl_password"))


class RespReader:
    """GET over one lazily opened connection; any failure closes it (the next call reconnects).

    ``timeout_s`` bounds a whole call (connecting, the TLS handshake, authenticating and reading the
    reply included).
    """

    def __init__(self, endpoint: Endpoint, timeout_s: float, max_reply_bytes: int = 512 * 2**20) -> None:
        self.endpoint, self.timeout_s, self.max_reply_bytes = endpoint, timeout_s, max_reply_bytes
        self._sock: socket.socket | None = None
        self._context: ssl.SSLContext | None = None
        self._buffer = bytearray()
        self._pos = 0  # start of the unread bytes in _buffer
        self._deadline = 0.0

    @classmethod
    def for_url(cls, url: str, timeout_s: float, max_reply_bytes: int = 512 * 2**20) -> RespReader:
        """A reader for any URL ``parse_url`` accepts (ValueError otherwise)."""
        return cls(parse_url(url), timeout_s, max_reply_bytes)

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
        # A bound on the whole sendall (since 3.5), and on a whole TLS read or write or handshake: the
        # ssl module turns a socket time-out into a deadline for the call, not a per-wait time-out.
        self._sock.settimeout(self._remaining())
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

    def _exactly(self, size: int) -> bytearray:
        """The next ``size`` bytes and their line end, in one buffer of ``size`` bytes (returned as is)."""
        assert self._sock is not None
        if size > self.max_reply_bytes:
            raise ReplyTooLarge(size, self.max_reply_bytes)
        need = size + 2
        data = bytearray(need)
        with memoryview(data) as view, memoryview(self._buffer) as buffered:
            have = min(need, len(self._buffer) - self._pos)
            view[:have] = buffered[self._pos:self._pos + have]
            self._pos += have
            while have < need:
                self._sock.settimeout(self._remaining())
                got = self._sock.recv_into(view[have:], min(need - have, 16 * _RECV))
                if not got:
                    raise ConnectionError("connection closed by the server")
                have += got
            if view[size:].tobytes() != b"\r\n":
                raise ConnectionError("a bulk reply without its line end")
        del data[size:]  # shrinks in place: no copy of the value
        return data

    def _reply(self) -> bytearray | None:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"-":
            raise RespError(rest.decode(errors="replace"))
        reply: bytearray | None
        if kind == b"$":
            size = int(rest)
            if size < -1:
                raise ConnectionError(f"unexpected bulk length {size}")
            reply = None if size == -1 else self._exactly(size)
        elif kind in (b"+", b":"):
            reply = bytearray(rest)  # not GET's reply: the caller rejects it as a malformed value
        else:
            raise ConnectionError(f"unexpected reply {line[:40]!r}")
        del self._buffer[:self._pos]  # what is left (nothing, for one command at a time) stays
        self._pos = 0
        return reply

    def _open_socket(self) -> socket.socket:
        end = self.endpoint
        if end.host is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                assert end.path is not None
                sock.settimeout(self._remaining())
                sock.connect(end.path)
            except BaseException:
                sock.close()
                raise
            return sock
        sock = socket.create_connection((end.host, end.port), timeout=self._remaining())
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if not end.tls:
                return sock
            if self._context is None:
                self._context = end.ssl_context()
            tls = self._context.wrap_socket(sock, server_hostname=end.host, do_handshake_on_connect=False)
        except BaseException:
            sock.close()
            raise
        try:
            tls.settimeout(self._remaining())
            tls.do_handshake()
        except BaseException:
            tls.close()
            raise
        return tls

    def _connect(self) -> None:
        self._sock = self._open_socket()
        self._buffer, self._pos = bytearray(), 0
        end = self.endpoint
        if end.password is not None:
            credentials = [end.username.encode()] if end.username else []
            self._send(b"AUTH", *credentials, end.password.encode())
            self._reply()
        if end.db:
            self._send(b"SELECT", str(end.db).encode())
            self._reply()

    def get(self, key: bytes) -> bytearray | None:
        """The value of ``key`` (None if absent), within ``timeout_s`` in all.

        The value is the reader's own buffer of exactly its size, handed over without a copy.
        RespError: the server answered with an error (the connection stays usable).  ReplyTooLarge,
        TimeoutError, OSError (ssl.SSLError among them) and the like: the connection is closed first.
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
