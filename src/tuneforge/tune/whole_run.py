"""A sampled job's choices settled on the whole problem: no decision rests on a sample (sample.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from tuneforge import config
from tuneforge.store.records import Record
from tuneforge.tune.choices import Choice
from tuneforge.tune.device import DeviceContextLost
from tuneforge.tune.events import ChoiceConfirmed, ChoiceStarted, Event
from tuneforge.tune.quiet import settle
from tuneforge.tune.sample import SAMPLED, calibrated

CALIBRATION_MAX = 1.25  # estimates are scaled by at most this much either way


class Trials(Protocol):
    """What of trials.Trials (which imports this module) settling uses."""

    lost: str | None

    def run(self, choice: Choice, budget_s: float | None = None, whole: bool = False) -> Record: ...

    def context_lost(self, culprit: str, resume_at: int, total: int) -> DeviceContextLost: ...


def settle_sampled(trials: Trials, results: list[tuple[int, Choice, Record]], emit: Callable[[Event], None]
                   ) -> Choice | None:
    """Until the fastest choice was checked and timed on the whole problem, not on a sample only, do so; the choice
    last run so, if any.

    Samples are biased (a kernel that packs all of A's rows at once keeps more of them in cache on a sample;
    a library call's fixed costs weigh more), so each comparison scales the estimates by how the whole runs so far
    compared with their own estimates, and the estimates left are recorded so scaled: no record of a sample
    then looks faster than the pick.
    """
    statistic = config.get_str("autotune.statistic")
    ratios: list[float] = []  # each whole run's time over its own sample's estimate
    latest = None
    while True:
        # bounded: one choice's odd sample (a cache effect, a fixed cost) must not rank all the others
        calibration = min(CALIBRATION_MAX, max(1 / CALIBRATION_MAX, sum(ratios) / len(ratios))) if ratios else 1.0
        timed = [(t * (calibration if SAMPLED in record.method else 1.0), pos)
                 for pos, (_, _, record) in enumerate(results)
                 if record.status == "ok" and (t := record.time(statistic)) is not None]
        if not timed:
            return latest
        pos = min(timed)[1]
        i, choice, estimated = results[pos]
        if SAMPLED not in estimated.method:
            break
        emit(ChoiceStarted(i))  # a crash now is this choice's
        if not ratios and any(c.is_extern for _, c, _ in results):
            settle(config.get_float("autotune.settle_s"))  # library calls ran last: let their threads go idle
        whole, latest = trials.run(choice, whole=True), choice
        emit(ChoiceConfirmed(i, whole))
        results[pos] = (i, choice, whole)
        if trials.lost is not None:
            raise trials.context_lost(choice.name, len(results), len(results))
        if whole.status == "ok" and (after := whole.time(statistic)) and (before := estimated.time(statistic)):
            ratios.append(after / before)
    for pos, (i, choice, record) in enumerate(results):
        if record.status == "ok" and SAMPLED in record.method and calibration != 1.0:
            results[pos] = (i, choice, calibrated(record, calibration))
            emit(ChoiceConfirmed(i, results[pos][2]))
    return latest
