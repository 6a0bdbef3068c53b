"""One warning per topic and process: the rule every degraded path follows (an outage, a read-only
cache, an ignored record), so a loop over many keys or choices never floods the log.

Later occurrences of a topic are logged at DEBUG, so `log_level=DEBUG` still shows each of them.
Kept at the bottom of the package (it imports only forksafe) so every layer can use it.
"""

from __future__ import annotations

import logging

from tuneforge.forksafe import ForkSafeLock

_seen: set[str] = set()
_lock = ForkSafeLock()


def first_time(topic: str) -> bool:
    """True the first time `topic` is seen in this process (thread-safe), False after."""
    with _lock:
        if topic in _seen:
            return False
        _seen.add(topic)
        return True


def warn_once(log: logging.Logger, topic: str, message: str, *args: object) -> bool:
    """Log `message` as a warning the first time `topic` comes up in this process, at DEBUG after.
    Returns whether it was the first time."""
    first = first_time(topic)
    log.log(logging.WARNING if first else logging.DEBUG, message, *args)
    return first


def forget(topic: str | None = None) -> None:
    """Let `topic` (or every topic) warn again: for tests, and after the condition has cleared."""
    with _lock:
        if topic is None:
            _seen.clear()
        else:
            _seen.discard(topic)
