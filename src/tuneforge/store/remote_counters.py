"""What a RemoteCache counts in one process (merged into the cache directory's remote statistics by tiers.py)."""

from __future__ import annotations

import dataclasses

from tuneforge.dataclass_lite import dataclass


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
