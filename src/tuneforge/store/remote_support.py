"""Small pieces of the remote tier: its counters, queued puts, warnings, setting checks, URL display."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tuneforge.errors import ConfigError
from tuneforge.parsing import mask_url_password
from tuneforge.warn_once import warn_once

log = logging.getLogger("tuneforge.store.remote")


@dataclass
class RemoteStats:
    """Counters of one RemoteCache in this process.

    Every get ends in exactly one of hits, misses (not in Redis), rejected (a value that failed its
    signature, format, size or checksum), unusable (an intact artifact that cannot be used here: its
    meta is malformed, it names a file it lacks, or a library is not one this machine can load),
    errors (Redis failed or timed out) or skipped (the circuit breaker was open).  Every put ends in
    exactly one of puts, dropped (queue full, breaker open, too large, inconsistent) or errors.
    """

    hits: int = 0
    misses: int = 0
    errors: int = 0
    rejected: int = 0
    puts: int = 0
    dropped: int = 0
    skipped: int = 0
    unusable: int = 0

    def to_json(self) -> dict[str, int]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class _Put:
    kind: str  # "rec" or "art"
    key: str
    encode: Callable[[], bytes | None]  # the body to store, or None (already counted as dropped)


# One warning per process for each kind of rejected value; later ones go to the debug log.


def _warn_once(kind: str, message: str, *args: Any) -> None:
    warn_once(log, f"remote.{kind}", message, *args)


def _setting_error(name: str, exc: Exception | str) -> ConfigError:
    env = "TUNEFORGE_" + name.replace(".", "_").upper()
    return ConfigError(f"invalid value for setting {name!r} (environment variable {env}): {exc}")


def _checked(name: str, coerce: Callable[[Any], Any], value: Any) -> Any:
    try:
        return coerce(value)
    except (TypeError, ValueError) as exc:
        raise _setting_error(name, exc) from None


def _display_url(url: str) -> str:
    """The URL with its password masked, for logs (the same masking as `config show`)."""
    return mask_url_password(url)
