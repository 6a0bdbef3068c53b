"""The remote cache that the settings name (``remote.url``, ``remote.namespace``, ``remote.secret``):
one per url, namespace and secret in a process, created on first use with the trust warning."""

from __future__ import annotations

import importlib.util
import logging
from typing import TYPE_CHECKING

from tuneforge import config
from tuneforge.forksafe import ForkSafeLock
from tuneforge.parsing import mask_url_password
from tuneforge.warn_once import warn_once

if TYPE_CHECKING:
    from tuneforge.store.remote import RemoteCache

log = logging.getLogger("tuneforge.store.remote")

_defaults: dict[tuple[str, str, str | None, float, int, float, float], RemoteCache] = {}
_defaults_lock = ForkSafeLock()


def default_remote() -> RemoteCache | None:
    """The RemoteCache named by the settings (one per url, namespace, secret, time-outs and limits: a
    changed remote.timeout_s gets a cache that keeps it); None without remote.url.

    None too, with one warning, when the ``redis`` or ``zstandard`` package is missing.  A malformed
    setting raises ConfigError (an empty secret is refused by the settings themselves: it would
    otherwise read as "no secret" and silently turn signing off).  Without a secret, one warning per
    process says that the remote's artifacts are unsigned, unless remote.allow_unsigned is set.
    """
    url = config.get_optional_str("remote.url")
    if not url:
        return None
    secret = config.get_optional_str("remote.secret")  # never "": the settings refuse an empty secret (it is not "off")
    missing = [name for name in ("redis", "zstandard") if importlib.util.find_spec(name) is None]
    if missing:
        warn_once(log, "remote.no-package", "remote.url is set but the Python package(s) %s are not installed: "
                   "pip install 'tuneforge[redis]'; continuing without the remote cache", ", ".join(missing))
        return None
    from tuneforge.store.remote import RemoteCache

    namespace, ttl_s, max_bytes = (config.get_str("remote.namespace"), config.get_float("remote.ttl_s"),
                                   config.get_int("remote.max_entry_bytes"))
    timeout_s, retry_s = config.get_float("remote.timeout_s"), config.get_float("remote.retry_s")
    spec = (url, namespace, secret, ttl_s, max_bytes, timeout_s, retry_s)
    with _defaults_lock:
        cache = _defaults.get(spec)
        if cache is None or cache.closed:
            cache = _defaults[spec] = RemoteCache(url, namespace=namespace, secret=secret, ttl_s=ttl_s,
                                                  max_entry_bytes=max_bytes, timeout_s=timeout_s, retry_s=retry_s)
            if secret is None and not config.get_bool("remote.allow_unsigned"):
                warn_once(log, "remote.unsigned", "remote artifacts are unsigned: anyone who can write to this "
                           "server can run code here (remote cache %s). Set TUNEFORGE_REMOTE_SECRET (setting "
                           "remote.secret) to one shared secret on every machine to sign them, or set "
                           "remote.allow_unsigned=true (TUNEFORGE_REMOTE_ALLOW_UNSIGNED=1) if every writer "
                           "of this server is trusted", mask_url_password(url))
        return cache
