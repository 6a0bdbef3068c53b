"""Every RemoteCache of this process: the one the settings name, a flush at exit, and the fork hooks
(a fork waits for writes in flight, so that no lock is copied held; the child starts its own threads)."""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any

from tuneforge import config
from tuneforge.store.remote_support import _display_url, _warn_once, reset_after_fork

if TYPE_CHECKING:
    from tuneforge.store.remote import RemoteCache

log = logging.getLogger("tuneforge.store.remote")

_instances: weakref.WeakSet[RemoteCache] = weakref.WeakSet()
_abandoned: list[Any] = []  # in a forked child: the parent's Redis clients (see RemoteCache._after_fork)
_defaults: dict[tuple[str, str, str | None], RemoteCache] = {}
_defaults_lock = threading.Lock()


def track(cache: RemoteCache) -> None:
    """Flush ``cache`` at exit and keep its writes and threads consistent across fork."""
    _instances.add(cache)


def abandon(client: Any) -> None:
    """Keep a Redis client alive, unused, for the life of this process (see RemoteCache._after_fork)."""
    _abandoned.append(client)


def default_remote() -> RemoteCache | None:
    """The RemoteCache named by the settings (one per url, namespace and secret); None without remote.url.

    None too, with one warning, when the ``redis`` or ``zstandard`` package is missing.  A malformed
    setting raises ConfigError (an empty secret is refused by the settings themselves: it would
    otherwise read as "no secret" and silently turn signing off).  Without a secret, one warning per
    process says that the remote's artifacts are unsigned, unless remote.allow_unsigned is set.
    """
    url = config.get("remote.url")
    if not url:
        return None
    secret = config.get("remote.secret")  # never "": the settings refuse an empty secret (it is not "off")
    missing = [name for name in ("redis", "zstandard") if importlib.util.find_spec(name) is None]
    if missing:
        _warn_once("no-package", "remote.url is set but the Python package(s) %s are not installed: "
                   "pip install 'tuneforge[redis]'; continuing without the remote cache", ", ".join(missing))
        return None
    from tuneforge.store.remote import RemoteCache

    spec = (url, config.get("remote.namespace"), secret)
    with _defaults_lock:
        cache = _defaults.get(spec)
        if cache is None or cache._closed:
            cache = _defaults[spec] = RemoteCache(
                url, namespace=spec[1], secret=spec[2], ttl_s=config.get("remote.ttl_s"),
                max_entry_bytes=config.get("remote.max_entry_bytes"), timeout_s=config.get("remote.timeout_s"),
                retry_s=config.get("remote.retry_s"))
            if secret is None and not config.get("remote.allow_unsigned"):
                _warn_once("unsigned-remote", "remote artifacts are unsigned: anyone who can write to this "
                           "server can run code here (remote cache %s). Set TUNEFORGE_REMOTE_SECRET (setting "
                           "remote.secret) to one shared secret on every machine to sign them, or set "
                           "remote.allow_unsigned=true (TUNEFORGE_REMOTE_ALLOW_UNSIGNED=1) if every writer "
                           "of this server is trusted", _display_url(url))
        return cache


def flush_all(timeout: float = 10.0) -> None:
    """Flush every RemoteCache of this process (runs at exit, so that the last puts reach Redis)."""
    for cache in list(_instances):
        try:
            cache.flush(timeout)
        except Exception:  # pragma: no cover
            log.exception("remote cache %s: flush failed", cache._shown_url)


_held_gates: list[threading.Lock] = []
_FORK_WAIT_S = 10.0  # a fork waits at most this long for writes in flight


def _before_fork() -> None:
    deadline = time.monotonic() + _FORK_WAIT_S
    for cache in sorted(_instances, key=id):
        gate = cache._queue.gate
        if gate.acquire(timeout=max(0.0, deadline - time.monotonic())):
            _held_gates.append(gate)
        else:  # pragma: no cover - a write stuck for seconds: fork anyway, as without this hook
            log.debug("remote cache %s: forking while a write is in flight", cache._shown_url)


def _after_fork_in_parent() -> None:
    while _held_gates:
        _held_gates.pop().release()


def _after_fork_in_child() -> None:
    global _defaults_lock
    _held_gates.clear()  # the child's caches get new gates
    _defaults_lock = threading.Lock()
    reset_after_fork()
    for cache in list(_instances):
        cache._after_fork()


atexit.register(flush_all)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=_after_fork_in_child)
