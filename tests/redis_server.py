"""A real redis-server for tests: started on a free loopback port, killed and restarted at will.

Fixtures (exposed to every test by one import line in conftest.py):

- ``redis_url``: one server for the whole session (``redis://127.0.0.1:<port>/0``);
- ``redis_clean``: the same URL, after FLUSHALL: each test starts with an empty server;
- ``redis_private``: a `RedisServer` of the test's own, which the test may kill, restart or pause.

A `RedisServer` can also listen on a unix socket (``unixsocket=True``) and on a TLS port (``tls=`` a
certificate and key, e.g. from `self_signed_certificate`), beside its plain loopback port.

Tests that use them are skipped, with the reason, when ``redis-server`` is not on PATH.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REDIS_SERVER = shutil.which("redis-server")
_SKIP_REASON = "redis-server is not on PATH (apt-get install redis-server; CI installs it)"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def _encode(*args: str) -> bytes:
    parts = [f"*{len(args)}\r\n".encode()]
    for arg in args:
        data = arg.encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def redis_command(port: int, *args: str, timeout: float = 5.0) -> bytes:
    """Send one command to 127.0.0.1:port; return the first line of the reply (enough for PING, FLUSHALL,
    CLIENT PAUSE), without a redis client library."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(_encode(*args))
        reply = b""
        while not reply.endswith(b"\r\n"):
            chunk = s.recv(4096)
            if not chunk:
                raise ConnectionError(f"redis-server closed the connection after {reply!r}")
            reply += chunk
    return reply.rstrip(b"\r\n")


def self_signed_certificate(directory: Path) -> tuple[Path, Path] | None:
    """A throw-away certificate for 127.0.0.1 and localhost (cert.pem, key.pem in ``directory``), made with
    the ``openssl`` command; None when it is not on PATH (the caller skips, saying so)."""
    openssl = shutil.which("openssl")
    if openssl is None:
        return None
    cert, key = Path(directory) / "cert.pem", Path(directory) / "key.pem"
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    return cert, key


class RedisServer:
    """One redis-server process: no persistence, loopback only, its files in ``directory``."""

    def __init__(self, directory: Path, port: int | None = None, *, unixsocket: bool = False,
                 tls: tuple[Path, Path] | None = None) -> None:
        if REDIS_SERVER is None:
            raise RuntimeError(_SKIP_REASON)
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.port = port
        self.tls = tls
        self.tls_port: int | None = None
        # A socket path is limited to ~107 bytes, which pytest's tmp_path can exceed: a short dir of its own.
        self._socket_dir = tempfile.mkdtemp(prefix="tf-redis-") if unixsocket else None
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def socket_path(self) -> str:
        assert self._socket_dir is not None, "started without unixsocket=True"
        return os.path.join(self._socket_dir, "redis.sock")

    @property
    def tls_url(self) -> str:
        """``rediss://127.0.0.1:<tls port>`` (no path, no options: the caller adds them)."""
        assert self.tls_port is not None, "started without tls="
        return f"rediss://127.0.0.1:{self.tls_port}"

    @property
    def log_path(self) -> Path:
        return self.directory / "redis.log"

    def command(self, *args: str, timeout: float = 5.0) -> bytes:
        """Send one command; return the first line of its reply."""
        assert self.port is not None
        return redis_command(self.port, *args, timeout=timeout)

    def start(self, timeout: float = 10.0) -> None:
        """Start the server (on a new free port the first time, else on the same port) and wait for PING."""
        fixed_port = self.port is not None
        for _ in range(1 if fixed_port else 5):
            if not fixed_port:
                self.port = free_port()
            if self.tls is not None and (self.tls_port is None or not fixed_port):
                self.tls_port = free_port()
            if self._try_start(timeout):
                return
        raise RuntimeError(f"redis-server did not start on port {self.port}; its log:\n{self._log_tail()}")

    def _try_start(self, timeout: float) -> bool:
        assert REDIS_SERVER is not None
        cmd = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
               "--appendonly", "no", "--dir", str(self.directory), "--logfile", str(self.log_path),
               "--daemonize", "no"]
        if self._socket_dir is not None:
            os.makedirs(self._socket_dir, exist_ok=True)  # again after a stop()
            cmd += ["--unixsocket", self.socket_path, "--unixsocketperm", "700"]
        if self.tls is not None:
            cert, key = self.tls
            cmd += ["--tls-port", str(self.tls_port), "--tls-cert-file", str(cert), "--tls-key-file", str(key),
                    "--tls-ca-cert-file", str(cert), "--tls-auth-clients", "no"]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:  # e.g. the port was taken between free_port() and bind
                self.proc = None
                return False
            with contextlib.suppress(OSError):
                if self.command("PING", timeout=0.5) == b"+PONG":
                    return True
            time.sleep(0.02)
        self.kill()
        return False

    def _log_tail(self) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-20:])
        except OSError:
            return "(no log)"

    def kill(self) -> None:
        """SIGKILL the server (an outage: no shutdown, connections reset) and reap it."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            self.proc = None

    def restart(self) -> None:
        """Kill the server if it runs, then start a fresh, empty one on the same port."""
        self.kill()
        self.start()

    def pause(self, ms: int) -> None:
        """Make the server answer no client for ``ms`` milliseconds (a slow server)."""
        assert self.command("CLIENT", "PAUSE", str(ms)) == b"+OK"

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.kill()
            self.proc = None
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)

    @contextlib.contextmanager
    def running(self) -> Iterator[RedisServer]:
        self.start()
        try:
            yield self
        finally:
            self.stop()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The URL of a redis-server shared by the whole session."""
    if REDIS_SERVER is None:
        pytest.skip(_SKIP_REASON)
    with RedisServer(tmp_path_factory.mktemp("redis")).running() as server:
        yield server.url


@pytest.fixture
def redis_clean(redis_url: str) -> str:
    """The session server's URL, emptied (FLUSHALL) before the test."""
    port = int(redis_url.rsplit(":", 1)[1].split("/")[0])
    assert redis_command(port, "FLUSHALL") == b"+OK"
    return redis_url


@pytest.fixture
def redis_private(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of this test's own, to kill, restart or pause."""
    if REDIS_SERVER is None:
        pytest.skip(_SKIP_REASON)
    with RedisServer(tmp_path / "redis").running() as server:
        yield server
