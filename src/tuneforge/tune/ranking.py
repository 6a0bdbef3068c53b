"""How a selection ranks its candidates from their records, and when a library call keeps its place.

The fastest ok record wins, with three exceptions. A choice timed on a sample of the problem only comes after every
choice timed on the whole of it (sample.py: a finished selection's fastest always was; a worker that died
confirming one leaves the others unconfirmed). A choice timed briefly only (screening.py: not among the contenders,
which were then timed fully) comes after every choice timed fully: its brief figure, within noise of theirs, was
taken at another moment (a CI run's pick was a fifth-placed screened choice whose brief timing fell below the
contenders' full ones). And a library call (an extern choice: numpy, cuBLAS) gives way to
a generated kernel only when the kernel is faster by more than ``autotune.library_margin``: a tuning run's
conditions are not the program's (other work between calls, another library's threads, a GPU's power limit
reached later), and a kernel picked for a 1% lead that does not hold loses to the library the op promises never
to lose to. On an H200 the very same cuBLAS call measured 3-4% apart in one steady-state benchmark (its place in
each timing round); a lead under the margin is no evidence either way, and the library is the safe side.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from tuneforge import config
from tuneforge.store.records import Record
from tuneforge.tune.choices import Choice
from tuneforge.tune.sample import SAMPLED

SCREENED = "+screened"  # in a record's method: timed briefly only (screening.py)


def ranked(candidates: Sequence[Choice], records: Mapping[str, Record], statistic: str) -> tuple[list[Choice],
                                                                                                  Choice | None]:
    """Candidates with an ok record, the pick first (ties: list order), and the kernel the library call was kept
    ahead of by ``autotune.library_margin`` (None: the fastest is first)."""
    timed = sorted((SAMPLED in (method := records[c.hash_key].method), SCREENED in method, t, i, c)
                   for i, c in enumerate(candidates)
                   if c.hash_key in records and records[c.hash_key].status == "ok"
                   and (t := records[c.hash_key].time(statistic)) is not None)
    order = [c for *_, c in timed]
    if not timed or timed[0][0] or timed[0][4].is_extern:
        return order, None
    margin = config.get_float("autotune.library_margin")
    library = next((entry for entry in timed if entry[4].is_extern and not entry[0]), None)
    if margin <= 0 or library is None or library[2] > timed[0][2] * (1 + margin):
        return order, None
    order.remove(library[4])
    return [library[4], *order], timed[0][4]
