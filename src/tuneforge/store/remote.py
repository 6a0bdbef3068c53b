"""The Redis tier: tuning records and artifacts shared by every machine that can reach one server.

Read-through and write-behind: a get asks Redis at once (a miss, an error or a rejected value is
``None``); a put is queued and written by one daemon thread, so a caller never waits for the network.
Nothing here raises into a caller: an unreachable or slow server logs one warning per outage, and a
circuit breaker then skips the server for ``remote.retry_s`` before one trial call.

Keys are ``{namespace}:v{FORMAT_VERSION}:rec:{key}`` (the records of one selection key) and
``{namespace}:v{FORMAT_VERSION}:art:{key}`` (one artifact).  Values are never pickled::

    value    = b"TFS1" + HMAC-SHA256(secret, u32 len(rkey) + rkey + payload) + payload    remote.secret set
             | b"TFU1" + payload                                                          no secret
    payload  = zstd(body)   (content size and checksum in the frame)
    records  : body = JSON list of Record.to_json(), every one with the requested key
    artifact : body = b"TFAR" + u16 FORMAT_VERSION + u32 len(manifest) + manifest JSON
                      + the files concatenated in sorted name order (sizes in the manifest's file table)

Trust model.  A compiled artifact is code: whoever can write a value that a reader accepts can run
code in that reader.  Without a secret the Redis server and everyone who can write to it must be
trusted; checksums then only catch corruption.  With ``remote.secret`` only holders of the secret can
write accepted values, and the Redis key is inside the MAC, so a value cannot be moved to another key
or namespace.  The MAC is checked before anything is decompressed or parsed.  A reader with a secret
rejects unsigned values; a reader without one accepts only unsigned values, because it cannot check a
signature and a signed value means its writers wanted them checked.  No secret in the settings logs
one warning per process unless remote.allow_unsigned is set (remote_settings); an empty one is an error.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tuneforge import config
from tuneforge.dataclass_lite import dataclass
from tuneforge.parsing import mask_url_password
from tuneforge.store.breaker import CircuitBreaker
from tuneforge.store.record import Record
from tuneforge.store.remote_counters import RemoteStats
from tuneforge.store.remote_format import (
    FORMAT_VERSION,
    MAC_LEN,
    SIGNED,
    UNSIGNED,
    check_artifact,
    check_usable,
    decompress,
    join_artifact,
    mac,
    seal,
    split_artifact,
)
from tuneforge.store.remote_registry import abandon, flush_all, track
from tuneforge.store.resp import ReplyTooLarge, RespError, RespReader, parse_url
from tuneforge.store.write_queue import WriteQueue
from tuneforge.warn_once import warn_once

__all__ = ["FORMAT_VERSION", "RemoteCache", "RemoteStats", "flush_all"]

log = logging.getLogger("tuneforge.store.remote")

# A stored body may expand to at most this many times max_entry_bytes: a bound on what a hostile
# frame header can make a reader allocate (unsigned values), far above what real files compress by.
_MAX_EXPANSION = 16
_CLOSE_FLUSH_S = 5.0
_MAX_KEY_CHARS = 1024

_Status = str  # "ok", "skipped" (breaker open, or closed) or "error"


@dataclass(frozen=True)
class QueuedPut:
    kind: str  # "rec" or "art"
    key: str
    encode: Callable[[], bytes | None]  # the body to store, or None (already counted as dropped)


def _warn_once(kind: str, message: str, *args: Any) -> None:
    warn_once(log, f"remote.{kind}", message, *args)  # one per process and kind of trouble


class RemoteCache:
    """Records and artifacts in one Redis server, under one namespace (see the module docstring).

    Construction validates the arguments and connects to nothing; the ``redis`` and ``zstandard``
    packages are imported on first use.
    """

    def __init__(self, url: str, *, namespace: str = "tuneforge", secret: str | bytes | None = None,
                 ttl_s: float = 2592000.0, max_entry_bytes: int = 64 * 2**20, timeout_s: float = 0.5,
                 retry_s: float = 30.0, queue_size: int = 256) -> None:
        config.validate("remote.url", url)
        try:
            self._endpoint = parse_url(url)  # lookups' connection settings (store/resp.py)
        except ValueError as exc:
            raise config.setting_error("remote.url", f"{exc} (in {mask_url_password(url)!r})") from None
        self.url = url
        self.namespace: str = config.validate("remote.namespace", namespace)
        if isinstance(secret, bytes) and secret:
            self._secret: bytes | None = secret
        else:
            checked = config.validate("remote.secret", secret)
            self._secret = None if checked is None else str(checked).encode("utf-8")
        self.ttl_s: float = config.validate("remote.ttl_s", ttl_s)
        self.max_entry_bytes: int = config.validate("remote.max_entry_bytes", max_entry_bytes)
        self.timeout_s: float = config.validate("remote.timeout_s", timeout_s)
        self.retry_s: float = config.validate("remote.retry_s", retry_s)
        self._queue: WriteQueue[QueuedPut] = WriteQueue(self._write, self._lost, size=queue_size,
                                                   name="tuneforge-remote-writer")
        self.queue_size = queue_size
        self.stats = RemoteStats()
        self.shown_url = mask_url_password(url)
        self._client: Any = None
        # Every lookup goes through a small RESP reader with one deadline per call and a size bound
        # (redis-py's import alone costs ~80 ms, and its time-outs are per recv); see store/resp.py.
        self._reader: RespReader | None = None
        self.closed = False
        self._init_threading()
        track(self)

    # Told of every counted event (e.g. to persist statistics across processes); set by the caller.
    listener: Callable[[str], None] | None = None

    def _init_threading(self) -> None:
        """Locks, breaker and queue state (again in a forked child, where the parent's may be held)."""
        self._lock = threading.Lock()  # client creation and counters
        self._read_lock = threading.Lock()  # the RESP reader's one connection
        self._breaker = CircuitBreaker(self.retry_s)
        self._breaker.closed_for_good = self.closed
        # The queue's gate is held around each write; os.fork() waits for it (see _before_fork), so a
        # child is never forked while the writer is inside redis-py, holding its pool lock or half-way
        # through one of its lazy imports (both would be frozen in that state in the child).
        self._queue.reset()

    def __repr__(self) -> str:
        signed = "signed" if self._secret is not None else "unsigned"
        return f"RemoteCache({self.shown_url!r}, namespace={self.namespace!r}, {signed})"

    # ------------------------------------------------------------------------------------- keys, values

    def _redis_key(self, kind: str, key: str) -> bytes:
        return f"{self.namespace}:v{FORMAT_VERSION}:{kind}:{key}".encode()

    @staticmethod
    def _valid_key(key: Any) -> bool:
        return (isinstance(key, str) and 0 < len(key) <= _MAX_KEY_CHARS and key.isprintable()
                and not any(c.isspace() for c in key))

    def _open(self, rkey: bytes, value: Any) -> bytes | None:
        """The body of a value read from ``rkey``, or None (counted and logged) if it is not acceptable."""
        if isinstance(value, ReplyTooLarge):
            self._reject("too-large", rkey, f"{value.size} bytes, above remote.max_entry_bytes (not read)")
            return None
        if not isinstance(value, (bytes, bytearray)):
            self._reject("malformed", rkey, f"Redis returned a {type(value).__name__}")
            return None
        with memoryview(value) as view:  # slices of a view: the value (up to max_entry_bytes) is not copied
            return self._unseal(rkey, value, view)

    def _unseal(self, rkey: bytes, value: bytes | bytearray, view: memoryview) -> bytes | None:
        if len(value) > self.max_entry_bytes:
            self._reject("too-large", rkey, f"{len(value)} bytes, above remote.max_entry_bytes")
            return None
        magic = value[:4]
        if self._secret is not None:
            if magic == UNSIGNED:
                self._reject("unsigned", rkey, "an unsigned value, but remote.secret is set")
                return None
            if magic != SIGNED or len(value) < len(SIGNED) + MAC_LEN:
                self._reject("malformed", rkey, "not a tuneforge value")
                return None
            signature, payload = bytes(view[4:4 + MAC_LEN]), view[4 + MAC_LEN:]
            if not hmac.compare_digest(signature, mac(self._secret, rkey, payload)):
                self._reject("bad-signature", rkey, "its signature does not match remote.secret "
                             "(tampered, moved from another key, or written with another secret)")
                return None
        elif magic == SIGNED:
            self._reject("signed", rkey, "a signed value, but remote.secret is not set, so it cannot "
                         "be checked (set remote.secret to read this namespace)")
            return None
        elif magic == UNSIGNED:
            payload = view[4:]
        else:
            self._reject("malformed", rkey, "not a tuneforge value")
            return None
        try:
            return decompress(payload, self.max_entry_bytes * _MAX_EXPANSION)
        except Exception as exc:
            self._reject("malformed", rkey, f"it does not decompress ({exc})")
            return None

    def _reject(self, kind: str, rkey: bytes, why: str) -> None:
        self._count("rejected")
        _warn_once(kind, "remote cache %s: rejected the value of %s: %s (treated as a miss)",
                   self.shown_url, rkey.decode("utf-8", "replace"), why)
        return None

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self.stats, name, getattr(self.stats, name) + 1)
        listener = self.listener
        if listener is not None:
            listener(name)

    # ---------------------------------------------------------------------------- calls, circuit breaker

    @property
    def available(self) -> bool:
        """False while the circuit breaker is open (after an error, for retry_s) or after close()."""
        return self._breaker.available

    def _redis(self) -> Any:
        with self._lock:
            if self._client is None:
                import redis
                import zstandard  # noqa: F401  (fail here, as an outage with a hint, if it is missing)
                from redis.backoff import NoBackoff
                from redis.retry import Retry

                # No retries inside redis-py: one failure opens our circuit breaker instead.
                self._client = redis.Redis.from_url(
                    self.url, socket_timeout=self.timeout_s, socket_connect_timeout=self.timeout_s,
                    retry=Retry(NoBackoff(), 0), retry_on_timeout=False, health_check_interval=0)
            return self._client

    def _call(self, what: str, fn: Callable[[], Any]) -> tuple[_Status, Any]:
        if not self._breaker.admit():
            return "skipped", None
        try:
            result = fn()
        except Exception as exc:
            self._failed(what, exc)
            return "error", None
        self._succeeded()
        return "ok", result

    def _failed(self, what: str, exc: Exception) -> None:
        first = self._breaker.failed()
        self._count("errors")  # told to the listener too: `cache stats` shows outages and time-outs
        hint = " (pip install 'tuneforge[redis]')" if isinstance(exc, ImportError) else ""
        if first:
            log.warning("remote cache %s failed during %s (%s: %s)%s; using local caches only, next try in "
                        "%gs", self.shown_url, what, type(exc).__name__, exc, hint, self.retry_s)
        else:
            log.debug("remote cache %s still failing during %s (%s: %s)", self.shown_url, what,
                      type(exc).__name__, exc)

    def _succeeded(self) -> None:
        outage_s = self._breaker.succeeded()
        if outage_s is not None:
            log.info("remote cache %s is back after %.1fs", self.shown_url, outage_s)

    def _get_value(self, rkey: bytes) -> Any:
        import zstandard  # noqa: F401  (fail here, as an outage with a hint, if it is missing)

        try:
            with self._read_lock:
                if self._reader is None:
                    self._reader = RespReader(self._endpoint, self.timeout_s, self.max_entry_bytes)
                return self._reader.get(rkey)
        except ReplyTooLarge as exc:  # a value too large to accept: rejected, not an outage
            return exc
        except RespError as exc:
            if str(exc).startswith("WRONGTYPE"):  # a value of another type: rejected, not an outage
                return exc
            raise

    def _fetch(self, kind: str, key: str) -> bytes | None:
        """The verified body stored for ``key``, or None (a miss, error, skip or rejection: counted)."""
        if not self._valid_key(key):
            _warn_once("bad-key", "remote cache: %r is not a usable key (treated as a miss)", key)
            self._count("misses")
            return None
        rkey = self._redis_key(kind, key)
        status, value = self._call(f"get {rkey.decode()}", lambda: self._get_value(rkey))
        if status != "ok":
            if status == "skipped":
                self._count("skipped")
            return None  # errors are counted by _failed
        if value is None:
            self._count("misses")
            return None
        return self._open(rkey, value)

    # ------------------------------------------------------------------------------------------ records

    def get_records(self, key: str) -> list[Record] | None:
        """All records stored for the selection ``key``; None on a miss, an error or a rejected value."""
        try:
            body = self._fetch("rec", key)
            if body is None:
                return None
            rkey = self._redis_key("rec", key)
            try:
                rows = json.loads(body)
                if not isinstance(rows, list) or not rows:
                    raise ValueError("expected a non-empty JSON list of records")
                records = [Record.from_json(row) for row in rows]
            except Exception as exc:
                self._reject("malformed", rkey, f"not a list of records ({exc})")
                return None
            wrong = sorted({r.key for r in records if r.key != key})
            if wrong:
                self._reject("wrong-key", rkey, f"it holds records of key(s) {wrong}")
                return None
            self._count("hits")
            return records
        except Exception:  # pragma: no cover - a bug here must still not break a selection
            log.exception("remote cache %s: unexpected error in get_records", self.shown_url)
            return None

    def put_records(self, key: str, records: Sequence[Record]) -> None:
        """Queue all records of ``key`` for writing (they replace what Redis holds for it)."""
        try:
            rows = [record.to_json() for record in records]  # copies: the caller may change its objects
            if not self._valid_key(key) or not rows or any(row["key"] != key for row in rows):
                _warn_once("bad-put", "remote cache: not storing records under %r: they must be a non-empty "
                           "list of records of that key", key)
                self._count("dropped")
                return
            body = json.dumps(rows, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()
            self._enqueue(QueuedPut("rec", key, lambda: body))
        except Exception as exc:
            _warn_once("bad-put", "remote cache: cannot store records of %r: %s", key, exc)
            self._count("dropped")

    # ---------------------------------------------------------------------------------------- artifacts

    def get_artifact(self, key: str) -> tuple[dict[str, Any], dict[str, bytes]] | None:
        """The manifest and file contents of the artifact ``key``, verified; None on a miss or a bad value."""
        try:
            body = self._fetch("art", key)
            if body is None:
                return None
            rkey = self._redis_key("art", key)
            try:
                manifest, files = split_artifact(body)
            except Exception as exc:
                self._reject("malformed", rkey, f"not an artifact ({exc})")
                return None
            problem = check_artifact(key, manifest, files)
            if problem is not None:
                self._reject("checksum", rkey, problem)
                return None
            problem = check_usable(manifest, files)
            if problem is not None:  # intact, but e.g. not a shared library of this machine: a miss
                self._count("unusable")
                _warn_once("unusable", "remote cache %s: cannot use the artifact %s: %s (treated as a miss)",
                           self.shown_url, rkey.decode("utf-8", "replace"), problem)
                return None
            self._count("hits")
            return manifest, files
        except Exception:  # pragma: no cover
            log.exception("remote cache %s: unexpected error in get_artifact", self.shown_url)
            return None

    def put_artifact(self, key: str, manifest: Mapping[str, Any], files: Mapping[str, bytes]) -> None:
        """Queue an artifact (its store manifest and file contents) for writing."""
        try:
            manifest_json = json.dumps(dict(manifest), sort_keys=True, separators=(",", ":"),
                                       allow_nan=False).encode()
            contents = {name: value if isinstance(value, bytes) else bytes(value) for name, value in files.items()}
            if not self._valid_key(key):
                raise ValueError("not a usable key")
        except Exception as exc:
            _warn_once("bad-put", "remote cache: cannot store artifact %r: %s", key, exc)
            self._count("dropped")
            return

        def encode() -> bytes | None:  # in the writer thread: hashing and compression take time
            problem = check_artifact(key, json.loads(manifest_json), contents)
            if problem is not None:
                _warn_once("bad-put", "remote cache: not storing artifact %s: %s", key, problem)
                return None
            return join_artifact(manifest_json, contents)

        self._enqueue(QueuedPut("art", key, encode))

    # ------------------------------------------------------------------------------------- write-behind

    def _enqueue(self, item: QueuedPut) -> None:
        if not self.available:
            self._count("dropped")
            log.debug("remote cache %s unavailable: dropped the put of %s", self.shown_url, item.key)
            return
        try:
            # Import redis and zstandard here, in the caller's thread, never first in the writer: a fork
            # while the writer is half-way through an import leaves the child a half-initialised module.
            self._redis()
        except Exception as exc:
            self._failed("setup", exc)  # counted as an error
            return
        if not self._queue.offer(item):
            self._count("dropped")
            log.debug("remote cache %s: write queue full, dropped the put of %s", self.shown_url, item.key)

    def _lost(self, item: QueuedPut) -> None:
        self._count("dropped")

    def _write(self, item: QueuedPut) -> None:
        rkey = self._redis_key(item.kind, item.key)
        if not self.available:
            self._count("dropped")
            return
        body = item.encode()
        if body is None:
            self._count("dropped")
            return
        if len(body) > self.max_entry_bytes * _MAX_EXPANSION:
            self._count("dropped")
            log.debug("remote cache: %s not stored: %d bytes uncompressed", item.key, len(body))
            return
        value = seal(self._secret, rkey, body)
        if len(value) > self.max_entry_bytes:
            self._count("dropped")
            log.debug("remote cache: %s not stored: %d bytes compressed, above remote.max_entry_bytes=%d",
                      item.key, len(value), self.max_entry_bytes)
            return
        px = max(1, round(self.ttl_s * 1000)) if self.ttl_s > 0 else None
        status, _ = self._call(f"set {rkey.decode()}", lambda: self._redis().set(rkey, value, px=px))
        if status == "ok":
            self._count("puts")
        elif status == "skipped":
            self._count("dropped")

    # ------------------------------------------------------------------- first writer wins (tune/agree.py)

    def put_first(self, kind: str, key: str, body: bytes, ttl_s: float | None = None,
                  replace: bool = False) -> bool | None:
        """Store `body` under ``kind:key`` now, unless a value is there (SET NX; `replace`: regardless): True if
        this call stored it, False if one was there, None when the server could not be asked. Sealed."""
        if not self._valid_key(key):
            return None
        rkey = self._redis_key(kind, key)
        value, seconds = seal(self._secret, rkey, body), self.ttl_s if ttl_s is None else ttl_s
        px = max(1, round(seconds * 1000)) if seconds > 0 else None
        status, stored = self._call(f"set-nx {rkey.decode()}",
                                    lambda: self._redis().set(rkey, value, px=px, nx=not replace))
        return bool(stored) if status == "ok" else None

    def get_first(self, kind: str, key: str) -> bytes | None:
        """The verified body that put_first stored under ``kind:key``, or None."""
        return self._fetch(kind, key) if self._valid_key(key) else None

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every queued put has been written or dropped; False if ``timeout`` ran out first."""
        return self._queue.flush(timeout)

    def close(self) -> None:
        """Flush (for a few seconds at most), stop the writer and disconnect; later calls do nothing."""
        self.flush(_CLOSE_FLUSH_S)
        self.closed = self._breaker.closed_for_good = True
        for _ in self._queue.close(self.timeout_s + 1.0):
            self._count("dropped")
        with self._lock:
            client, self._client = self._client, None
            reader, self._reader = self._reader, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
        if reader is not None:
            with contextlib.suppress(Exception):
                reader.close()

    @property
    def write_gate(self) -> threading.Lock:
        """Held around each write: a fork waits for it (see remote_registry)."""
        return self._queue.gate

    def after_fork(self) -> None:
        # The parent's writer thread does not exist here, and its locks may have been held at the fork;
        # the parent writes its own queued puts.  The Redis client is the parent's too: its pool's lock
        # may be held by the parent's writer, so the child neither uses it nor closes it (closing takes
        # that lock): it is kept alive, unused, and the child connects afresh.
        if self._client is not None:
            abandon(self._client)
            self._client = None
        self._reader = None  # the parent's socket is not ours to use
        self._init_threading()
