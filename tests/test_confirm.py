"""Near ties between the two fastest choices are re-timed side by side."""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tuneforge import config
from tuneforge.store.default import default_records
from tuneforge.store.records import Record
from tuneforge.tune.choices import CallableChoice, Choice, ExternChoice
from tuneforge.tune.confirm import MIN_ROUNDS, confidence, near_tie, time_side_by_side
from tuneforge.tune.report import describe_confidence, format_table
from tuneforge.tune.screening import screened_contenders
from tuneforge.tune.select import select_detailed

from .conftest import tuning_in_process


@pytest.fixture
def tuning(cache_dir: Path) -> Iterator[Path]:
    with tuning_in_process(cache_dir, bench_time_s=0.000001, min_repeats=5) as where:
        yield where


def spin(seconds: float) -> None:
    """Busy-wait: steadier than sleep() at a millisecond."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def sleepy_library(idle_s: float, slow_s: float, fast_s: float, slow_calls: int = 2) -> Callable[[], None]:
    """A library call whose thread pool falls asleep after `idle_s` without calls: its next `slow_calls` calls then
    take `slow_s` (waking it), the others `fast_s`."""
    state = {"last": 0.0, "slow_left": 0}

    def call() -> None:
        if time.perf_counter() - state["last"] > idle_s:
            state["slow_left"] = slow_calls
        slow = state["slow_left"] > 0
        state["slow_left"] -= slow
        spin(slow_s if slow else fast_s)
        state["last"] = time.perf_counter()
    return call


def spinning_add(seconds: float) -> Any:
    """A kernel that adds its inputs after spinning for `seconds`."""
    def run(a: Any, b: Any, out: Any) -> None:
        spin(seconds)
        np.add(a, b, out=out)
    return run


def record(name: str, median_ms: float | None, status: str = "ok", method: str = "cpu-perf_counter") -> Record:
    return Record(key="k", choice=name, op="op", choice_name=name, status=status, median_ms=median_ms,
                  min_ms=median_ms, mean_ms=median_ms, method=method)


def paired_selection(name: str, choices: list[Choice]) -> tuple[str, dict[str, Record]]:
    """Select among `choices` on small arrays: the winner's name and the records, checked to be all re-timed side
    by side."""
    selection = select_detailed(name, choices, [np.ones(16), np.ones(16)], out=np.empty(16))
    records = {r.choice_name: r for r in default_records().get(selection.key)}
    assert {r.method for r in records.values()} == {"cpu-perf_counter+paired"}, records
    winner = selection.choice.name
    sure, = records[winner].info["confidence"]  # the fastest's verdict over the other, kept on its record
    assert sure["versus"] in records and sure["versus"] != winner and 0 <= sure["faster_in"] <= sure["rounds"]
    assert all("confidence" not in r.info for name, r in records.items() if name != winner)
    assert selection.report is not None and selection.report.extra["confidence"] == [sure]
    assert f"AUTOTUNE confidence: {winner} faster than {sure['versus']} in " in format_table(selection.report, None)
    return winner, records


def named(name: str) -> Choice:
    return CallableChoice(lambda *args: None, {}, name=name)


def test_near_tie_takes_the_two_fastest_within_the_margin() -> None:
    a, b, c, d = named("a"), named("b"), named("c"), named("d")
    results = [(a, record("a", 1.30)), (b, record("b", 1.0)), (c, record("c", 1.05)), (d, record("d", None, "crash"))]
    assert [choice for choice, _ in near_tie(results, "median")] == [b, c]
    far = [(a, record("a", 1.0)), (b, record("b", 1.2))]
    assert near_tie(far, "median") == []  # 20% apart: no tie at the default 10% margin
    with config.patch(autotune_confirm_margin=0.25):
        assert len(near_tie(far, "median")) == 2
    with config.patch(autotune_confirm_margin=0.0):
        assert near_tie(results, "median") == []
    abandoned = [(a, record("a", 1.0)), (b, record("b", 1.01, method="cpu-perf_counter+abandoned"))]
    assert near_tie(abandoned, "median") == []  # only partly timed: it lost anyway


def test_a_narrow_win_over_the_reference_is_re_timed_beside_it() -> None:
    ref, a, b, c = named("ref"), named("a"), named("b"), named("c")
    results = [(ref, record("ref", 1.4)), (a, record("a", 1.0)), (b, record("b", 1.3)), (c, record("c", 1.05))]
    assert [choice for choice, _ in near_tie(results, "median", ref)] == [a, c, ref]  # the tie, then the reference
    assert [choice for choice, _ in near_tie(results[:3], "median", ref)] == [a, ref]  # no tie: a and ref only
    assert near_tie(results[:3], "median", b) == [(a, results[1][1]), (b, results[2][1])]
    assert near_tie(results[:3], "median", None) == []
    far = [(ref, record("ref", 1.6)), (a, record("a", 1.0))]
    assert near_tie(far, "median", ref) == []  # beaten by more than the default 1.5x
    with config.patch(autotune_confirm_reference_ratio=2.0):
        assert len(near_tie(far, "median", ref)) == 2
    library = ExternChoice(lambda *args: None, name="library")  # timed alone, it may read up to 2x slow
    alone = [(library, record("library", 2.9)), (a, record("a", 1.0))]
    assert [choice for choice, _ in near_tie(alone, "median", library)] == [a, library]
    assert near_tie([(library, record("library", 3.1)), alone[1]], "median", library) == []
    paired = [(library, record("library", 1.6, method="cpu-perf_counter+paired")), alone[1]]
    assert near_tie(paired, "median", library) == []  # side by side already: the plain ratio
    with config.patch(autotune_confirm_reference_ratio=0.0, autotune_confirm_margin=0.0):
        assert near_tie(results, "median", ref) == []
    fastest = [(ref, record("ref", 0.95)), (a, record("a", 1.0))]
    assert near_tie(fastest, "median", ref) == [(ref, fastest[0][1]), (a, fastest[1][1])]  # within the margin


def test_a_reference_timed_in_a_slow_phase_still_wins(tuning: Path) -> None:
    """The machine was slow while the reference (the first extern choice) was first timed, and `kernel` looked
    20% faster: beyond the near-tie margin, but within the reference ratio, so both are re-timed side by side,
    which finds the reference faster."""
    calls = {"library": 0}

    def library(a: Any, b: Any, out: Any) -> None:
        calls["library"] += 1
        spin(0.0012 if calls["library"] <= 7 else 0.0006)  # reference run, verify and 5 timed runs: slow
        np.add(a, b, out=out)

    def kernel(a: Any, b: Any, out: Any) -> None:
        spin(0.0010)
        np.add(a, b, out=out)

    winner, records = paired_selection("slow-reference", [ExternChoice(library, name="library"),
                                                           CallableChoice(kernel, {}, name="kernel")])
    assert winner == "library" and records["library"].median_ms < records["kernel"].median_ms


def test_the_reference_is_warmed_up_again_before_it_is_timed(tuning: Path) -> None:
    """The reference's check runs before every other choice, so a library's threads have gone to sleep by the time
    it is timed: its first calls then are slow (here two, as OpenBLAS's were), and they must not be its timing."""
    wake = sleepy_library(idle_s=0.005, slow_s=0.02, fast_s=0.0005)  # two calls of 20 ms after 5 ms idle

    def library(a: Any, b: Any, out: Any) -> None:
        wake()
        np.add(a, b, out=out)

    pick, records = _library_against_a_kernel("sleepy-library", library)
    assert pick == "library", records
    assert records["library"].median_ms < 0.8 and "+abandoned" not in records["library"].method


def test_a_library_call_is_never_abandoned(tuning: Path) -> None:
    """Its first runs after its threads slept can be several times slow for a while (numpy's 2-thread GEMM on a
    2-vCPU VM): abandoned on them, it was never compared again, and a slower kernel was picked."""
    state = {"last": 0.0, "slow_until": 0.0}

    def library(a: Any, b: Any, out: Any) -> None:
        now = time.perf_counter()
        if now - state["last"] > 0.005:  # idle for 5 ms: slow for the next 8 ms, three calls
            state["slow_until"] = now + 0.008
        spin(0.003 if now < state["slow_until"] else 0.0005)
        np.add(a, b, out=out)
        state["last"] = time.perf_counter()

    pick, records = _library_against_a_kernel("waking-library", library, autotune_warmup_s=0.0)
    assert "+abandoned" not in records["library"].method, records
    assert pick == "library", records


def _library_against_a_kernel(name: str, library: Callable[..., None],
                              **settings: Any) -> tuple[str, dict[str, Record]]:
    """Select between `library` (a library call: the reference) and a kernel of 1 ms a call, not re-timing them side
    by side: the pick, and the records by name."""
    def kernel(a: Any, b: Any, out: Any) -> None:
        spin(0.001)
        np.add(a, b, out=out)

    choices = [ExternChoice(library, name="library"), CallableChoice(kernel, {}, name="kernel")]
    with config.patch(autotune_bench_time_s=0.02, autotune_confirm_reference_ratio=0.0, **settings):
        selection = select_detailed(name, choices, [np.ones(16), np.ones(16)], out=np.empty(16))
    return selection.choice.name, {r.choice_name: r for r in default_records().get(selection.key)}


def test_side_by_side_timing_alternates_and_measures_each() -> None:
    order: list[str] = []

    def fast() -> None:
        order.append("f")
        spin(0.0005)

    def slow() -> None:
        order.append("s")
        spin(0.001)

    with config.patch(autotune_bench_time_s=0.000001, autotune_settle_s=0.0):
        (first, second), rounds = time_side_by_side([fast, slow], lambda: None, typical_ms=5.0,
                                                    settle_after=[False, True])
    assert first.method == second.method == "cpu-perf_counter+paired"
    assert first.count == second.count >= MIN_ROUNDS * 2  # batches of 2 runs: 10 ms of (typically) 5 ms runs
    assert first.median_ms < second.median_ms
    assert len(rounds[0]) == len(rounds[1]) >= MIN_ROUNDS  # each batch's median, per round
    sure = confidence(rounds[0], rounds[1], "slow")
    # a preempted batch on a busy 2-core VM can lose a round (seen in CI: a 0.5 ms run's batch at 1.65 ms): a
    # majority of the rounds, and the median above, say which is faster
    n, wins = sure["rounds"], sure["faster_in"]
    assert sure["versus"] == "slow" and n == len(rounds[0]) and wins > n / 2
    tail = sum(math.comb(n, k) for k in range(wins, n + 1)) / 2**n  # a fair coin's chance of that many wins or more
    assert sure["by"] > 0.5 and sure["p"] == pytest.approx(tail, abs=1e-4)
    # the order alternates (f s | s f | f s ...: a round's last batch and the next's first are the same run's); each
    # batch of 2 timed runs follows untimed ones for bench.RAMP_S, at least one (runs of 0.5 ms: 1 to 6)
    groups = [(run, len(list(batch))) for run, batch in itertools.groupby(order)]
    assert [run for run, _ in groups] == ["f", "s"] * (len(groups) // 2) + ["f"] * (len(groups) % 2)
    assert 3 <= groups[0][1] <= 8 and all(6 <= n <= 16 for _, n in groups[1:-1])


def test_a_library_batch_is_timed_once_its_threads_are_awake() -> None:
    """A library's threads sleep through the pause before its batch, and waking them takes its first runs (here two
    of 4 ms, as numpy's GEMM took up to 2x its time on the second call): they are not the batch's timing."""
    # Asleep after 6 ms idle: a preemption between two of its calls on a busy host stays shorter than that
    library = sleepy_library(idle_s=0.006, slow_s=0.004, fast_s=0.001)

    def kernel() -> None:
        spin(0.001)
        time.sleep(0.01)  # the library's pool falls asleep meanwhile

    with config.patch(autotune_bench_time_s=0.000001, autotune_settle_s=0.0):
        (_, lib), rounds = time_side_by_side([kernel, library], lambda: None, typical_ms=5.0,
                                             settle_after=[False, True])
    # timed wake-up runs would make every batch ~4 ms; one preempted batch is the host's
    assert lib.median_ms < 2.0 and sorted(rounds[1])[-2] < 2.5, rounds[1]


def test_library_batches_pause_once_per_pair(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rounds alternate (k L | L k | k L): a kernel's batch waits for the library's threads to go idle once per
    pair of library batches, and a library batch waits KERNEL_PAUSE_S after a kernel's."""
    from tuneforge.tune import confirm

    pauses: list[object] = []

    def settle(max_s: float) -> float:
        pauses.append(("until idle", max_s))
        return max_s

    monkeypatch.setattr(confirm.time, "sleep", pauses.append)
    monkeypatch.setattr(confirm, "settle", settle)
    with config.patch(autotune_bench_time_s=0.000001, autotune_settle_s=0.05):
        time_side_by_side([lambda: None, lambda: None], lambda: None, typical_ms=5.0, settle_after=[False, True])
    # 5 rounds: k L | L k | k L | L k | k L
    assert pauses == [("until idle", 0.05), confirm.KERNEL_PAUSE_S] * 3


def test_a_drifted_first_timing_is_corrected(tuning: Path) -> None:
    """`late` is the faster choice, but the machine was slow while it was first timed: within the margin,
    the side-by-side rounds find it out."""
    calls = {"late": 0}

    def steady(a: Any, b: Any, out: Any) -> None:
        spin(0.0010)
        np.add(a, b, out=out)

    def late(a: Any, b: Any, out: Any) -> None:
        calls["late"] += 1
        spin(0.00105 if calls["late"] <= 6 else 0.0007)  # the first pass: verify + 5 timed runs
        np.add(a, b, out=out)

    with config.patch(autotune_confirm_margin=0.25):  # room for a noisy machine in the first pass
        winner, records = paired_selection("drift", [ExternChoice(steady, name="steady"),
                                                     ExternChoice(late, name="late")])
    assert winner == "late" and records["late"].median_ms < records["steady"].median_ms


def test_paired_timings_at_another_level_keep_their_place(tuning: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tie's paired rounds ran 1.6x slower than the first pass (another library's threads between the batches):
    anchored at the fastest first timing among them, a choice outside the tie does not overtake them."""
    from tuneforge.tune import paired

    side_by_side = paired.time_side_by_side

    def slowed(*args: Any) -> Any:
        timings, rounds = side_by_side(*args)
        return [t.scaled(1.6) for t in timings], [[x * 1.6 for x in r] for r in rounds]

    monkeypatch.setattr(paired, "time_side_by_side", slowed)

    # `best` and `close` tie (5% apart); `third` is 25% slower than `best`, outside the margin
    choices = [ExternChoice(spinning_add(s), name=n)
               for n, s in (("best", 0.0010), ("close", 0.00105), ("third", 0.00125))]
    selection = select_detailed("anchored", choices, [np.ones(16), np.ones(16)], out=np.empty(16))
    records = {r.choice_name: r for r in default_records().get(selection.key)}
    assert "+paired" in records["best"].method and "+paired" not in records["third"].method
    assert selection.choice.name == "best" and records["best"].median_ms < records["third"].median_ms
    scale = records["best"].info["paired_scale"]
    assert 0.5 < scale < 0.75 and records["close"].info["paired_scale"] == scale  # about 1/1.6, one for the tie


def test_without_a_tie_the_first_timings_stand(tuning: Path) -> None:
    def quick(a: Any, b: Any, out: Any) -> None:
        np.add(a, b, out=out)

    def sluggish(a: Any, b: Any, out: Any) -> None:
        spin(0.002)
        np.add(a, b, out=out)

    choices = [ExternChoice(quick, name="quick"), ExternChoice(sluggish, name="sluggish")]
    selection = select_detailed("no-tie", choices, [np.ones(16), np.ones(16)], out=np.empty(16))
    methods = {r.choice_name: r.method for r in default_records().get(selection.key)}
    assert selection.choice.name == "quick" and "+paired" not in "".join(methods.values())


def test_many_choices_are_screened_and_only_contenders_timed_fully(tuning: Path) -> None:
    """Nine choices: each is first timed briefly; the clearly slower ones keep that short timing (``+screened``),
    the ones within autotune.screen_ratio of the fastest are timed again with the full budget."""
    def make(name: str, seconds: float) -> Choice:
        def run(a: Any, b: Any, out: Any) -> None:
            spin(seconds)
            np.add(a, b, out=out)

        return ExternChoice(run, name=name)

    slow = [f"slow{i}" for i in range(7)]
    choices = [make(slow[0], 0.003), make("fast", 0.0005), make(slow[1], 0.003), make("close", 0.00055),
               *(make(name, 0.003) for name in slow[2:])]
    inputs = [np.ones(16), np.ones(16)]
    with config.patch(autotune_bench_time_s=0.02, autotune_min_repeats=3, autotune_confirm_margin=0.0):
        selection = select_detailed("screened", choices, inputs, out=np.empty(16))
    records = {r.choice_name: r for r in default_records().get(selection.key)}
    assert selection.choice.name == "fast"
    for name in slow:
        assert "+screened" in records[name].method, records[name]
    for name in ("fast", "close"):  # re-timed for the whole budget: 20 ms of 0.5 ms runs (screened: 4 ms)
        assert "+screened" not in records[name].method and records[name].count >= 12, records[name]  # a busy host


def test_screened_contenders_are_timed_side_by_side_through_a_spell_of_contention(
        tuning: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A spell of the host's contention (here: every run slowed 2x for 60 ms) starts as the contenders' full timing
    begins. Timed one after another, the spell fell on the fastest's whole timing and `close` won; in alternating
    rounds it falls on both alike and fades from their medians."""
    from tuneforge.tune import trials

    spell: dict[str, float | None] = {"start": None}

    def contended(seconds: float) -> float:
        started = spell["start"]
        return 2 * seconds if started is not None and time.perf_counter() - started < 0.06 else seconds

    def screened_then_spell(*args: Any, **kwargs: Any) -> list[int]:
        picked = screened_contenders(*args, **kwargs)
        spell["start"] = time.perf_counter()  # the screening is done: the contenders' timing begins
        return picked

    monkeypatch.setattr(trials, "screened_contenders", screened_then_spell)

    def make(name: str, seconds: float) -> Choice:
        def run(a: Any, b: Any, out: Any) -> None:
            spin(contended(seconds))
            np.add(a, b, out=out)

        return ExternChoice(run, name=name)

    slow = [f"slow{i}" for i in range(7)]
    choices = [*(make(name, 0.003) for name in slow), make("close", 0.0006), make("fast", 0.0005)]
    with config.patch(autotune_bench_time_s=0.03, autotune_min_repeats=3, autotune_confirm_margin=0.0,
                      autotune_confirm_reference_ratio=0.0, autotune_abandon_ratio=0.0):
        selection = select_detailed("spell", choices, [np.ones(16), np.ones(16)], out=np.empty(16))
    records = {r.choice_name: r for r in default_records().get(selection.key)}
    assert spell["start"] is not None
    assert selection.choice.name == "fast", {n: records[n].median_ms for n in ("fast", "close")}
    assert "+paired" in records["fast"].method and "+paired" in records["close"].method
    assert [c["versus"] for c in records["fast"].info["confidence"]] == ["close"]


def test_at_most_four_contenders_are_timed_fully(tuning: Path) -> None:
    """Nine choices all within the screen ratio of the fastest: only the four the brief timing found fastest are
    timed again with the full budget (screening.SCREEN_KEEP)."""
    def make(name: str, seconds: float) -> Choice:
        def run(a: Any, b: Any, out: Any) -> None:
            spin(seconds)
            np.add(a, b, out=out)

        return ExternChoice(run, name=name)

    fast = {"c0": 0.0005, "c1": 0.00055, "c2": 0.0006, "c3": 0.00065}
    slower = {f"s{i}": 0.0008 + 0.00005 * i for i in range(5)}
    choices = [make(name, t) for name, t in [*slower.items(), *fast.items()]]  # the fastest last
    # s0, a library call, is the reference: not re-timed beside the pick here (confirm_reference_ratio 0)
    with config.patch(autotune_bench_time_s=0.02, autotune_min_repeats=3, autotune_confirm_margin=0.0,
                      autotune_screen_ratio=3.0, autotune_confirm_reference_ratio=0.0):
        selection = select_detailed("kept", choices, [np.ones(16), np.ones(16)], out=np.empty(16))
    records = {r.choice_name: r for r in default_records().get(selection.key)}
    assert selection.choice.name == "c0"
    assert all("+screened" not in records[name].method for name in fast), records
    assert all("+screened" in records[name].method for name in slower), records


def test_screening_is_off_with_a_ratio_of_zero_or_few_choices(tuning: Path) -> None:
    def run(a: Any, b: Any, out: Any) -> None:
        np.add(a, b, out=out)

    many = [ExternChoice(run, name=f"c{i}") for i in range(10)]
    with config.patch(autotune_screen_ratio=0.0):
        selection = select_detailed("unscreened", many, [np.ones(8), np.ones(8)], out=np.empty(8))
    assert not any("+screened" in r.method for r in default_records().get(selection.key))
    few = [ExternChoice(run, name=f"d{i}") for i in range(8)]
    selection = select_detailed("few", few, [np.ones(8), np.ones(8)], out=np.empty(8))
    assert not any("+screened" in r.method for r in default_records().get(selection.key))


def test_a_search_batch_times_each_build_s_fastest_fully() -> None:
    """Screened (brief) figures rank configurations within a build; a search ranks builds by their fastest one, so in
    its batches (confirm "none") each build of several configurations gets its fastest timed fully as well."""
    from types import SimpleNamespace

    from tuneforge.tune.screening import SCREEN_KEEP

    def entry(build: str | None, ms: float) -> Any:
        choice = SimpleNamespace(render_identity=build) if build else named("lib")
        return (0, choice, record(f"{build}{ms}", ms, method="cpu-perf_counter+screened"))

    # build a: the five fastest; build b: its best 10% behind; c: a single configuration; d: beyond the screen ratio
    results = [entry("a", 1.0 + 0.01 * i) for i in range(5)] + [entry("b", 1.1), entry("b", 1.2), entry("c", 1.05),
                                                                    entry("d", 2.0), entry("d", 2.1), entry(None, 1.3)]
    assert screened_contenders(results, "median") == list(range(SCREEN_KEEP))  # the fastest four, all of build a
    assert screened_contenders(results, "median", per_build=True) == [*range(SCREEN_KEEP), 5]  # and b's fastest


def test_a_tie_the_rounds_do_not_decide_is_called_level() -> None:
    clear = {"versus": "b", "rounds": 5, "faster_in": 5, "by": 0.12, "p": 0.0312}
    assert describe_confidence(clear) == "faster than b in 5 of 5 paired rounds, by 12.0% (sign test p=0.0312)"
    split = {"versus": "b", "rounds": 5, "faster_in": 2, "by": -0.007, "p": 0.812}
    assert describe_confidence(split) == "level with b: faster in 2 of 5 paired rounds, by -0.7% (sign test p=0.812)"


def test_a_crowded_screening_levels_out_a_slow_spell(tuning: Path) -> None:
    """Forty choices; the host runs every call 2x slower from the 21st on. `best` (0.5 ms), screened late, then
    times 1.0 ms, far past screen_ratio (1.3) over `early` (0.6 ms, screened before the spell): it would keep its
    brief timing and `early` would win. The fastest of the first 16 is timed again every 16 choices, and what
    follows is compared over how much slower it ran than the first time again: `best` is a contender, and wins.
    The records keep the figures measured (1.8 ms for a 0.9 ms choice screened in the spell)."""
    spell = {"on": False}

    def make(name: str, seconds: float, index: int) -> Choice:
        def run(a: Any, b: Any, out: Any) -> None:
            spell["on"] = spell["on"] or index >= 20
            spin(seconds * (2 if spell["on"] else 1))
            np.add(a, b, out=out)

        return ExternChoice(run, name=name)

    times = {i: 0.0009 for i in range(40)} | {1: 0.0006, 35: 0.0005}
    names = {1: "early", 35: "best"}
    choices = [make(names.get(i, f"c{i}"), t, i) for i, t in times.items()]
    # abandon_ratio at its default (1.5): `best`'s runs in the spell (1.0 ms) are within 1.5x of `early` at the level
    with config.patch(autotune_bench_time_s=0.02, autotune_min_repeats=3, autotune_confirm_margin=0.0):
        selection = select_detailed("level", choices, [np.ones(16), np.ones(16)], out=np.empty(16))
    records = {r.choice_name: r for r in default_records().get(selection.key)}
    assert spell["on"]
    assert selection.choice.name == "best", {n: records[n].median_ms for n in ("early", "best")}
    assert "+paired" in records["best"].method  # a contender, not abandoned in the spell
    assert records["c37"].info["screen_level"] > 1.5  # screened in the spell, compared over the level ...
    assert records["c37"].median_ms is not None and records["c37"].median_ms > 1.5  # ... its record as measured
    assert "screen_level" not in records["c25"].info  # in the spell too, but before the control showed it


def test_a_short_choice_is_timed_after_the_cores_ramp(tuning: Path) -> None:
    """A 0.2 ms choice whose first calls after its check run 1.5 ms (an idle core coming back to speed): its brief
    timing starts once bench.RAMP_S of untimed runs have passed, and its figure is its own, not the ramp's (which
    would put it past the screen ratio of eight 0.5 ms choices, with no full timing to set it right)."""
    from tuneforge.tune.bench import RAMP_S

    calls = {"ramping": 0}

    def make(name: str, seconds: float) -> Choice:
        def run(a: Any, b: Any, out: Any) -> None:
            if name == "ramping":
                calls[name] += 1
                slow = 2 <= calls[name] <= 1 + math.ceil(RAMP_S / 0.0015)  # the calls right after the check
                spin(0.0015 if slow else seconds)
            else:
                spin(seconds)
            np.add(a, b, out=out)

        return ExternChoice(run, name=name)

    choices = [*(make(f"steady{i}", 0.0005) for i in range(8)), make("ramping", 0.0002)]  # ramping: 1.5 ms first
    with config.patch(autotune_bench_time_s=0.01, autotune_min_repeats=3, autotune_screen_ratio=1.01):
        selection = select_detailed("ramp", choices, [np.ones(16), np.ones(16)], out=np.empty(16))
    records = {r.choice_name: r for r in default_records().get(selection.key)}
    assert selection.choice.name == "ramping"
    assert records["ramping"].median_ms is not None and records["ramping"].median_ms < 0.5, records["ramping"]


def test_a_check_of_most_of_the_ramp_is_warm_up_enough(tuning: Path) -> None:
    """A 2.6 ms choice's check covers most of bench.RAMP_S (3 ms): its brief timing starts right after it, with no
    untimed run (one more run would have lasted 2.6 ms for the 0.4 ms left of the ramp)."""
    calls = {"n": 0}

    def make(name: str, seconds: float) -> Choice:
        def run(a: Any, b: Any, out: Any) -> None:
            calls["n"] += name == "nearly"
            spin(seconds)
            np.add(a, b, out=out)

        return ExternChoice(run, name=name)

    choices = [*(make(f"quick{i}", 0.0018) for i in range(8)), make("nearly", 0.0026)]  # not a contender: 1.44x
    with config.patch(autotune_bench_time_s=0.001, autotune_min_repeats=3, autotune_screen_ratio=1.2,
                      autotune_abandon_ratio=0.0):
        selection = select_detailed("nearly_ramped", choices, [np.ones(16), np.ones(16)], out=np.empty(16))
    record = {r.choice_name: r for r in default_records().get(selection.key)}["nearly"]
    assert "+screened" in record.method
    assert calls["n"] == 1 + record.count, (calls["n"], record.count)  # its check and its timed runs


def test_a_brief_timing_past_the_screen_ratio_stops_at_two_runs(tuning: Path) -> None:
    """`between` runs 1.4x the fastest: within abandon_ratio (1.5) but past screen_ratio (1.3). Its first two brief
    runs put its median past the ratio whatever the third: it stops there (a contender it could not be)."""
    def kernel(seconds: float) -> Callable[..., None]:
        def run(a: Any, b: Any, out: Any, **params: Any) -> None:  # params: set apart only
            spin(seconds)
            np.add(a, b, out=out)
        return run

    choices = [*(CallableChoice(kernel(0.001), {"i": i}, name=f"quick{i}") for i in range(8)),
               CallableChoice(kernel(0.0014), {"i": 8}, name="between")]
    with config.patch(autotune_bench_time_s=0.001, autotune_min_repeats=3, autotune_screen_ratio=1.3,
                      autotune_abandon_ratio=1.5):
        selection = select_detailed("screen_abandon", choices, [np.ones(16), np.ones(16)], out=np.empty(16))
    record = {r.choice_name: r for r in default_records().get(selection.key)}["between"]
    assert "+abandoned" in record.method and record.count == 2, (record.method, record.count)


def test_the_pick_of_paired_rounds_follows_the_rounds_not_the_pooled_runs(tuning: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """`best` is 5% faster than `close` in every round of the side-by-side re-timing, while the host's level moves
    2x between rounds; the median over all of each one's runs says `close` (crafted here: a pooled median can side
    with either when the rounds' levels differ). The rounds decide: `best` wins, by about 5%."""
    from tuneforge.tune import paired
    from tuneforge.tune.bench import Timing

    side_by_side = paired.time_side_by_side
    levels = [1.0, 2.0, 1.0, 2.0, 1.0]

    def crafted(*args: Any) -> Any:
        side_by_side(*args)
        rounds = [list(levels), [1.05 * level for level in levels]]
        return [Timing.from_samples([1.6] * 5, "cpu-perf_counter+paired"),
                Timing.from_samples([1.2] * 5, "cpu-perf_counter+paired")], rounds

    monkeypatch.setattr(paired, "time_side_by_side", crafted)

    choices = [ExternChoice(spinning_add(s), name=n) for n, s in (("best", 0.0010), ("close", 0.00102))]
    winner, records = paired_selection("levelled", choices)
    assert winner == "best"
    assert records["close"].median_ms / records["best"].median_ms == pytest.approx(1.05, rel=1e-6)
    sure, = records["best"].info["confidence"]
    assert sure["faster_in"] == len(levels) and sure["by"] == pytest.approx(0.05, abs=1e-4)


def test_a_figure_carried_into_the_first_round_is_not_run_there() -> None:
    calls = {"carried": 0, "other": 0}

    def carried() -> None:
        calls["carried"] += 1

    def other() -> None:
        calls["other"] += 1

    with config.patch(autotune_bench_time_s=0.000001, autotune_settle_s=0.0):
        (kept, _), rounds = time_side_by_side([carried, other], lambda: None, typical_ms=100.0,
                                              settle_after=[False, False], first_round=[123.0, None])
    assert rounds[0][0] == 123.0 and len(rounds[0]) == len(rounds[1]) >= MIN_ROUNDS
    # one run a round (100 ms typical: batches of one), the first round's given: one run fewer than the other
    assert calls["other"] == len(rounds[1]) and calls["carried"] == len(rounds[0]) - 1
    assert kept.count == len(rounds[0]) and kept.max_ms == 123.0


def test_a_library_batch_after_a_carried_kernel_run_pauses_as_after_any(monkeypatch: pytest.MonkeyPatch) -> None:
    # The carried run is the last that ran: a library batch first in the order still waits KERNEL_PAUSE_S for the
    # kernel's pool, as it would right after the kernel's batch.
    from tuneforge.tune import confirm

    events: list[Any] = []
    monkeypatch.setattr(confirm.time, "sleep", lambda seconds: events.append(("sleep", seconds)))
    monkeypatch.setattr(confirm, "settle", lambda seconds: 0.0)
    with config.patch(autotune_bench_time_s=0.000001, autotune_settle_s=1.0):
        time_side_by_side([lambda: events.append("kernel"), lambda: events.append("library")], lambda: None,
                          typical_ms=100.0, settle_after=[False, True], first_round=[None, None])
        assert events[0] == "kernel"  # nothing carried: the first pass may have ended with a library call
        events.clear()
        time_side_by_side([lambda: events.append("library"), lambda: events.append("kernel")], lambda: None,
                          typical_ms=100.0, settle_after=[True, False], first_round=[None, 5.0])
    assert events[:2] == [("sleep", confirm.KERNEL_PAUSE_S), "library"]
