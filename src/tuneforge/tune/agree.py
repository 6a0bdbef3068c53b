"""One pick per selection key across the processes that share a remote tier (the ranks of a distributed job).

Processes that measure one selection each on their own time the candidates differently and may pick
differently; the ranks of one job must not (their layouts or numerics would differ). With a remote tier and
``remote.agree`` on, select() asks here:

- `before_measuring`: a pick already published for the key is taken as it is. Otherwise the process claims the
  key's lease (SET NX, expiring after ``remote.agree_wait_s``) and measures; a process that finds the lease
  held waits that long at most for the holder's pick, then measures on its own.
- `publish`: the pick is stored with SET NX, so the first process to finish wins; one that finds another's
  pick there takes that one instead of its own.
- `recalled`: a process that decided from records (measured nothing) takes the published pick if there is one,
  and publishes nothing.

A pick names its choice by hash; one that is not among a process's candidates (a different candidate list) is
not taken, with a warning. Without a remote tier, or while its server is down, each process decides alone.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tuneforge import config
from tuneforge.tune.choices import Choice
from tuneforge.warn_once import warn_once

if TYPE_CHECKING:
    from tuneforge.store.remote import RemoteCache

log = logging.getLogger("tuneforge.tune")

PICK, LEASE = "pick", "lease"  # the kinds of the Redis keys (beside "rec" and "art")
POLL_S = 0.05  # how often a waiting process looks for the pick (doubling up to POLL_MAX_S)
POLL_MAX_S = 1.0


def _remote() -> RemoteCache | None:
    if not config.get_bool("remote.agree"):
        return None
    from tuneforge.store.tiers import remote

    cache = remote()
    return cache if cache is not None and cache.available else None


def _published(cache: RemoteCache, key: str, candidates: Sequence[Choice]) -> Choice | None:
    body = cache.get_first(PICK, key)
    if body is None:
        return None
    try:
        choice_hash = json.loads(body)["choice"]
    except (ValueError, KeyError, TypeError):
        warn_once(log, "agree-malformed", "remote cache: the published pick of %s is not readable: ignored", key)
        return None
    for candidate in candidates:
        if candidate.hash_key == choice_hash:
            return candidate
    warn_once(log, f"agree-unknown:{key}", "the pick published for %s (%s) is not among this process's candidates: "
              "deciding alone", key, json.loads(body).get("name", choice_hash))
    return None


def before_measuring(key: str, candidates: Sequence[Choice]) -> Choice | None:
    """The pick to take instead of measuring (published, or published by the lease holder while this process
    waited), or None: measure (this process holds the lease, or waited long enough, or there is no remote)."""
    cache = _remote()
    if cache is None:
        return None
    found = _published(cache, key, candidates)
    if found is not None:
        return found
    wait_s = config.get_float("remote.agree_wait_s")
    owner = f"{socket.gethostname()}:{os.getpid()}".encode()
    if cache.put_first(LEASE, key, owner, ttl_s=wait_s) is not False:  # ours (or no answer: decide alone)
        return None
    log.info("%s is being measured by another process: waiting up to %.0f s for its pick", key, wait_s)
    deadline, pause = time.monotonic() + wait_s, POLL_S
    while time.monotonic() < deadline:
        time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
        pause = min(2 * pause, POLL_MAX_S)
        found = _published(cache, key, candidates)
        if found is not None:
            return found
    log.warning("no pick was published for %s in %.0f s: measuring here", key, wait_s)
    return None


def recalled(key: str, candidates: Sequence[Choice], winner: Choice) -> Choice:
    """The pick for a decision taken from records (nothing measured here): the published one where there is
    one among the candidates, else `winner`. A read only, through the RESP reader: a warm start writes
    nothing and never imports redis-py (~80 ms, more than a warm start's budget)."""
    cache = _remote()
    if cache is None:
        return winner
    return _published(cache, key, candidates) or winner


def publish(key: str, candidates: Sequence[Choice], winner: Choice, *, replace: bool = False) -> Choice:
    """`winner` stored as the key's pick unless another was first (`replace`, after a forced re-measure:
    regardless): the pick every process takes."""
    cache = _remote()
    if cache is None:
        return winner
    body = json.dumps({"choice": winner.hash_key, "name": winner.name}, sort_keys=True).encode()
    if cache.put_first(PICK, key, body, replace=replace) is not False:  # stored (or the server was not asked)
        return winner
    return _published(cache, key, candidates) or winner
