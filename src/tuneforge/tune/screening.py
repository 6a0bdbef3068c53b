"""Screening: with many choices, each is timed briefly first and only the contenders are timed fully (trials.py);
and a crowded screening's level: how fast the host runs now against when the screening began.

Why the level: screening hundreds of choices (a GEMM's exhaustive space: 433 of them at 128^3) lasts seconds, and this
host's speed moves in spells. Over three exhaustive screenings of the same 433 choices, the medians of blocks of
16 consecutive choices ran at 0.70-1.38x those choices' median over the three; a choice screened in a slow spell
looked up to 38% slower than it is, past `autotune.screen_ratio` (1.3), and was never timed fully (the steady-best
configuration was once screened 66% slow, 87th of 433, and a library call won). So every CONTROL_EVERY choices one
of them (the control) is timed briefly again, and the choices screened after it are compared by their figures over
how its time moved (`compared`): all of them as if screened when the screening began. Their records keep the
figures measured: a level is an estimate (a lone slow timing of the control set levels of 0.33 and 1.55 for
sixteen choices; figures of a 512^3 fp64 search divided by a level of 1.74, and contenders anchored at them,
read 157 GFLOP/s on cores that peak at 116), fit to rank the screened among themselves, and a choice timed
briefly only ranks after every choice timed fully (ranking.py).
Only crowded screenings on the CPU: a screening of a few dozen choices lasts a fraction of a second, and CUDA
events hardly drift.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence

from tuneforge import config
from tuneforge.store.records import Record
from tuneforge.tune.choices import Choice
from tuneforge.tune.job import TrialJob
from tuneforge.tune.ranking import SCREENED

# Screening (autotune.screen_ratio): with more than SCREEN_ABOVE choices, each is first timed for
# SCREEN_SHARE of the budget (at least SCREEN_REPEATS runs); only the contenders get the full budget. The GEMV
# and skinny GEMM spaces have 13-23 choices, most of them clearly slower: timing each fully made most of a cold
# tuning. Fewer choices gain little, and each contender is timed twice. At most SCREEN_KEEP contenders, the
# fastest: a memory-bound GEMV's choices are all within the ratio (1x4096x4096 fp64: 10 of 13, 1.3 s of its 4.3 s
# cold tuning re-timing them), and those the brief timing put fifth or later are rarely more than noise ahead.
SCREEN_ABOVE, SCREEN_SHARE, SCREEN_REPEATS, SCREEN_KEEP = 8, 0.2, 3, 4


# From SCREEN_CROWD choices on, the brief timings shrink in proportion (to SCREEN_REPEATS runs at least): a search's
# batch of 8 builds of 25 configurations each spent 7 s of a 512^3 search's 14 screening them at 20 ms each.
SCREEN_CROWD = 32


def screen_budget(job: TrialJob, count: int) -> float | None:
    """The brief timing's budget for `job`'s `count` choices, or None: every choice is timed fully. The count is
    the selection's when the job holds a part of it (TrialJob.screen_among)."""
    count = job.screen_among or count
    if count <= SCREEN_ABOVE or config.get_float("autotune.screen_ratio") <= 0:
        return None
    if job.device != "cpu":
        return SCREEN_SHARE * config.get_float("cuda.bench_time_s")
    return SCREEN_SHARE * config.get_float("autotune.bench_time_s") * min(1.0, SCREEN_CROWD / count)


def abandon_ratio(brief: bool) -> float:
    """How many times the best so far a choice's first two timed runs must both exceed for it to stop there
    (0: never): autotune.abandon_ratio, and for a `brief` timing autotune.screen_ratio where lower. A brief timing
    (at least SCREEN_REPEATS runs) whose first two are past screen_ratio cannot make a contender: its median is
    past it too (a 512^3 fp64 search's brief timings: -0.3 s)."""
    ratio = config.get_float("autotune.abandon_ratio")
    screen_ratio = config.get_float("autotune.screen_ratio")
    return min(ratio, screen_ratio) if brief and ratio > 0 and screen_ratio > 0 else ratio


def gpu_screening(budget_s: float | None) -> tuple[float | None, int | None]:
    """benchmark_gpu's warm-up and least repeats for a brief timing of `budget_s` (None: a full timing, the
    settings' own). A GPU's 16 default GEMM choices timed fully took 0.7-1.4 s of an H100's 2.9-4.0 s prepared cold
    selection, where events time a 20 us kernel within 1% in a hundred runs: the brief one's warm-up is cut
    alike (the checked run loaded the kernel)."""
    if budget_s is None:
        return None, None
    return SCREEN_SHARE * config.get_float("autotune.warmup_s"), SCREEN_REPEATS


def screened_contenders(results: Sequence[tuple[int, Choice, Record]], statistic: str,
                        per_build: bool = False) -> list[int]:
    """Positions in `results` of the screened choices within autotune.screen_ratio of the fastest, at most
    SCREEN_KEEP of them, the fastest first; `per_build` (a search's batch, which ranks builds by their fastest
    configuration): also the fastest of each build of several configurations within the ratio. Its brief timing
    is no figure to rank a build by: a 512^3 3x4v build screened at 4.5 ms (3 runs) runs 3.7 ms, the best build,
    and the search descended from another one."""
    timed = [(pos, t) for pos, (_, _, record) in enumerate(results)
             if record.status == "ok" and SCREENED in record.method and "+abandoned" not in record.method
             and (t := compared(record, statistic)) is not None]
    if not timed:
        return []
    best = min(t for _, t in timed)
    ratio = config.get_float("autotune.screen_ratio")
    near = sorted((t, pos) for pos, t in timed if t <= best * ratio)
    picked = [pos for _, pos in near[:SCREEN_KEEP]]
    if per_build:
        builds = [getattr(choice, "render_identity", None) for _, choice, _ in results]
        shared = {b for b, n in collections.Counter(builds).items() if b is not None and n > 1}
        fastest: dict[str, int] = {}
        for _, pos in near:
            if (build := builds[pos]) is not None and build in shared:
                fastest.setdefault(build, pos)
        picked += [pos for pos in fastest.values() if pos not in picked]
    return picked


CONTROL_EVERY = 16
LEVEL_CONFIRM = 1.15  # a control timing that moves the level more than this either way is taken twice (unsteady)
LEVEL_INFO = "screen_level"  # the record info key of the level a screened timing is compared over


def compared(record: Record, statistic: str) -> float | None:
    """The figure `record` is compared by: a screened one's over its screening's level (LEVEL_INFO)."""
    value = record.time(statistic)
    level = record.info.get(LEVEL_INFO, 1.0) if SCREENED in record.method else 1.0
    return value / level if value is not None and isinstance(level, (int, float)) and level > 0 else value


class ScreenLevel:
    """The control and the level of one screening. The control is the fastest of the first CONTROL_EVERY choices,
    and stays: its first brief timing again, right after them, is the base, and later ones over the base are the
    level. Not its screened figure: a choice's first brief timing follows its first call ever and ran 3-21% slower
    than a timing of the same choice later on (a fresh library's code and buffers), and a level taken against
    it favoured the first choices over all the others."""

    def __init__(self) -> None:
        self.level = 1.0  # the host's time for a run now over its time when the screening began
        self._control: tuple[Choice, Record] | None = None
        self._base_ms: float | None = None  # the control's first timing again
        self._seen = self._since = 0  # choices screened in all, and since the last timing of the control

    def due(self) -> tuple[Choice, Record] | None:
        """The control and its record, when it is time to time it again."""
        return self._control if self._control is not None and self._since >= CONTROL_EVERY else None

    def unsteady(self, control_ms: float | None) -> bool:
        """Whether the control's brief timing now would move the level by more than LEVEL_CONFIRM (the base: would
        be that much slower than its screened figure): it is then taken again at once and the lower of the two
        kept. A lone slow timing of the control set the level of the next sixteen choices: 512^3 fp64 searches
        here screened choices at levels 0.33-0.39 (a base timing 3x slow) and 1.42-1.55, and a record of a
        choice screened after a slow control read 150 GFLOP/s, past the cores' peak (116). Contention only slows
        a run, so of two timings back to back the lower is the nearer to how fast the host runs now."""
        if control_ms is None or control_ms <= 0 or self._control is None:
            return False
        if self._base_ms is None:
            screened = self._control[1].median_ms
            return screened is not None and control_ms > screened * LEVEL_CONFIRM
        change = control_ms / self._base_ms / self.level
        return not 1 / LEVEL_CONFIRM <= change <= LEVEL_CONFIRM

    def measure(self, time_control: Callable[[], float | None]) -> None:
        """Take the level from `time_control()` (the control's brief timing now, None where it failed): where that
        is unsteady, from the lower of it and a second one."""
        control_ms = time_control()
        if self.unsteady(control_ms) and (again := time_control()) is not None and control_ms is not None:
            control_ms = min(control_ms, again)
        self.measured(control_ms)

    def measured(self, control_ms: float | None) -> None:
        """The control's brief timing now (None: it failed; the level stands)."""
        self._since = 0
        if control_ms is None or control_ms <= 0:
            return
        if self._base_ms is None:
            self._base_ms = control_ms
        else:
            self.level = control_ms / self._base_ms

    def seen(self, choice: Choice, record: Record) -> None:
        """A choice screened at the current level."""
        self._seen += 1
        self._since += 1
        median = record.median_ms
        if self._seen <= CONTROL_EVERY and record.status == "ok" and SCREENED in record.method \
                and "+abandoned" not in record.method and median is not None and median > 0 and \
                (self._control is None or median < (self._control[1].median_ms or float("inf"))):
            self._control = (choice, record)
