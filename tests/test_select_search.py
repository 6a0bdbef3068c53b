"""select(..., strategy=, budget=): a search strategy picks which configurations are timed, real timings of a
Python kernel template whose run time is a known function of its parameters."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tuneforge import config
from tuneforge.search import Space, pow2
from tuneforge.store.default import default_records
from tuneforge.store.records import Record
from tuneforge.tune.choices import CallableChoice, Choice, ExternChoice
from tuneforge.tune.searched import SEARCH_INFO, SearchPlan, search_candidates
from tuneforge.tune.select import clear_memo, select_detailed
from tuneforge.tune.template import KernelTemplate

from .conftest import tuning_in_process

# A kernel that takes 0.2 ms at its best configuration (BM=32, BN=16, BK=16, UNROLL=4, ORDER=ij) and up to
# 2.6x that elsewhere: penalties per parameter, added.
SOURCE = """
import time
{% set cost = 1 + {8: 0.4, 16: 0.15, 32: 0.0, 64: 0.2}[BM] + {8: 0.2, 16: 0.0, 32: 0.15, 64: 0.35}[BN]
              + {8: 0.15, 16: 0.0, 32: 0.1}[BK] + {1: 0.2, 2: 0.1, 4: 0.0, 8: 0.1}[UNROLL]
              + {"ij": 0.0, "ji": 0.1}[ORDER] %}
def kernel(x, out):
    end = time.perf_counter() + {{ 0.0002 * cost }}
    while time.perf_counter() < end:
        pass
    out[...] = x * 2
"""
PENALTY = {"BM": {8: 0.4, 16: 0.15, 32: 0.0, 64: 0.2}, "BN": {8: 0.2, 16: 0.0, 32: 0.15, 64: 0.35},
           "BK": {8: 0.15, 16: 0.0, 32: 0.1}, "UNROLL": {1: 0.2, 2: 0.1, 4: 0.0, 8: 0.1},
           "ORDER": {"ij": 0.0, "ji": 0.1}}
CONFIGS = [{"BM": bm, "BN": bn, "BK": bk, "UNROLL": u, "ORDER": o} for bm in pow2(8, 64) for bn in pow2(8, 64)
           for bk in pow2(8, 32) for u in (1, 2, 4, 8) for o in ("ij", "ji")]  # 384
OPTIMAL = {"BM": 32, "BN": 16, "BK": 16, "UNROLL": 4, "ORDER": "ij"}


def cost(params: dict[str, Any]) -> float:
    return 1 + sum(PENALTY[name][params[name]] for name in PENALTY)


def double(x: Any, out: Any) -> Any:  # the library call: right, and slower than any configuration
    end = time.perf_counter() + 0.0006
    while time.perf_counter() < end:
        pass
    out[...] = x * 2
    return out


made = {"inputs": 0}


def counted_input(spec: Any, rng: Any) -> Any:
    made["inputs"] += 1
    return rng.standard_normal(spec.sizes)


@pytest.fixture
def quick(cache_dir: Path) -> Iterator[Path]:
    with tuning_in_process(cache_dir, bench_time_s=0.004, min_repeats=3) as where:
        yield where


def candidates() -> list[Any]:
    template = KernelTemplate("searched_spin", SOURCE, signature="kernel", language="python")
    return [ExternChoice(double, name="double"), *template.choices(CONFIGS)]


def test_a_search_times_a_sixth_of_the_space_and_finds_a_near_best(quick: Path) -> None:
    choices = candidates()
    made["inputs"] = 0
    started = time.perf_counter()
    selection = select_detailed("searched", choices, [np.ones(64)], out=np.empty(64), strategy="default",
                                budget="15%", generators={0: counted_input})
    elapsed = time.perf_counter() - started
    timed = {r.choice for r in default_records().get(selection.key)}
    assert len(timed) <= 58 + 1  # 15% of 384, and the library call
    assert selection.source == "tuned" and selection.choice.name != "double"
    assert cost(selection.choice.params) <= 1.1, selection.choice.params  # the best is 1.0; the median 1.6
    assert made["inputs"] == 1  # one set of example inputs for every batch
    winner = default_records().get_choice(selection.key, selection.choice.hash_key)
    assert winner is not None and winner.info[SEARCH_INFO]  # the search's end, kept with the winner
    assert elapsed < 60

    clear_memo()  # a later process: the records hold the finished search, nothing is timed again
    again = select_detailed("searched", candidates(), [np.ones(64)], out=np.empty(64), strategy="default",
                            budget="15%", generators={0: counted_input})
    assert again.source != "tuned" and not again.benchmarked and again.choice.hash_key == selection.choice.hash_key
    clear_memo()  # another budget is another search: recorded configurations cost it no timing
    more = select_detailed("searched", candidates(), [np.ones(64)], out=np.empty(64), strategy="default",
                           budget="25%", generators={0: counted_input})
    timed_again = [name for name in more.benchmarked if name in {c.name for c in choices if c.hash_key in timed}]
    assert more.source == "tuned" and 0 < len(more.benchmarked) <= 96 + 4  # its budget, and the finalists
    assert len(timed_again) <= 4  # of the first search's, only finalists are timed again


@pytest.mark.parametrize(("budget", "jobs"), [("6", 2), ("12", 3)])
def test_finalists_are_timed_again_after_the_batches(cache_dir: Path, budget: str, jobs: int) -> None:
    calls: list[tuple[list[str], str]] = []
    records: dict[str, Record] = {}

    def measure_some(choices: Any, role: str) -> None:  # what select's measuring records, by the cost model
        calls.append(([c.name for c in choices], role))
        for c in choices:
            records[c.hash_key] = Record(key="k", choice=c.hash_key, op="searched", choice_name=c.name, status="ok",
                                         median_ms=cost(c.params) if c.params else 3.0)

    choices: list[Choice] = candidates()
    plan = SearchPlan("random", SearchPlan.of("default", budget).budget, batch=6)
    winner = search_candidates(plan, choices, records, measure_some, "median")
    assert winner is not None and winner.info[SEARCH_INFO]
    # 6 builds: one batch; 12: two. Batches keep their inputs and leave near ties to the finalists' job, the last;
    # the batch that spends the budget is the last: its builds' costs steer no other batch
    assert len(calls) == jobs and [role for _, role in calls] == ["batch"] * (jobs - 2) + ["last", "finalists"]
    finalists = calls[-1][0]
    assert len(finalists) == plan.finalists + 1 and "double" in finalists
    timed = sorted((cost(c.params), c.name) for c in choices if c.params and c.hash_key in records)
    assert set(finalists) - {"double"} == {name for _, name in timed[:plan.finalists]}


def test_the_records_end_at_the_finalists_measured_level(cache_dir: Path) -> None:
    """The batches' figures came down a chain of anchors that drifted to half of what runs measure; the finalists'
    side-by-side re-timing measures them at cost() and is anchored at the chain (paired_scale 0.5). Every record
    is then put at the finalists' level: the finalists read what they measured, the others keep their ratios,
    and all of them are handed to be stored again."""
    records: dict[str, Record] = {}
    restated: list[Record] = []
    drift = 0.5

    def measure_some(choices: Any, role: str) -> None:
        for c in choices:
            true_ms = cost(c.params) if c.params else 3.0
            paired = role == "finalists"
            records[c.hash_key] = Record(key="k", choice=c.hash_key, op="searched", choice_name=c.name, status="ok",
                                         median_ms=true_ms * drift, min_ms=true_ms * drift * 0.9,
                                         method="cpu-perf_counter+paired" if paired else "cpu-perf_counter",
                                         info={"paired_scale": drift} if paired else {})

    choices: list[Choice] = candidates()
    plan = SearchPlan("random", SearchPlan.of("default", "12").budget, batch=6)
    winner = search_candidates(plan, choices, records, measure_some, "median", restate=restated.extend)
    assert winner is not None
    timed = [c for c in choices if c.hash_key in records]
    assert len(restated) == len(timed) > plan.finalists + 1
    for c in timed:
        record = records[c.hash_key]
        assert record.median_ms == pytest.approx(cost(c.params) if c.params else 3.0), c.name
        assert record.min_ms == pytest.approx(record.median_ms * 0.9)
        assert record.info["search_level"] == pytest.approx(1 / drift)
    assert winner.median_ms == pytest.approx(min(cost(c.params) for c in timed if c.params))


def test_a_budget_alone_searches_with_the_default_strategy(quick: Path) -> None:
    selection = select_detailed("budgeted", candidates(), [np.ones(64)], out=np.empty(64), budget="30")
    assert 0 < len(default_records().get(selection.key)) <= 30 + 1 + 4  # and the finalists' re-timing
    plan = SearchPlan.of("default", "30")
    assert plan.budget is not None and plan.budget.evaluations == 30


def test_every_strategy_runs_through_select(quick: Path) -> None:
    for name in ("random", "coordinate_descent", "genetic", "exhaustive"):
        clear_memo()
        selection = select_detailed(f"via_{name}", candidates(), [np.ones(64)], out=np.empty(64), strategy=name,
                                    budget="24")
        records = [r for r in default_records().get(selection.key) if r.params]
        assert 0 < len(records) <= 24 and selection.choice.name != "double", name
    with pytest.raises(ValueError, match="unknown search strategy 'annealing'"):
        select_detailed("bad", candidates(), [np.ones(64)], out=np.empty(64), strategy="annealing")


def test_tune_command_searches_with_a_strategy_and_budget(cache_dir: Path) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "TUNEFORGE_AUTOTUNE_BENCH_TIME_S": "0.005"}
    command = [sys.executable, "-m", "tuneforge", "tune", "matmul", "--shape", "48x40x32", "--space", "exhaustive"]
    proc = subprocess.run([*command, "--strategy", "random", "--budget", "6"], capture_output=True, text=True,
                          env=env)
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stderr.splitlines() if line.startswith("  tiled_matmul_")]
    assert 1 <= len(rows) <= 6 and any(line.startswith("  numpy_matmul ") for line in proc.stderr.splitlines())
    assert "decided from tuned" in proc.stdout  # 6 of the 36 configurations built and timed
    again = subprocess.run([*command, "--strategy", "random", "--budget", "6"], capture_output=True, text=True,
                           env=env)
    assert "decided from records" in again.stdout and "nothing benchmarked" in again.stderr
    bad = subprocess.run([*command, "--budget", "lots"], capture_output=True, text=True, env=env)
    assert bad.returncode == 2 and "--budget" in bad.stderr and "cannot read 'lots'" in bad.stderr
    unknown = subprocess.run([*command, "--strategy", "annealing"], capture_output=True, text=True, env=env)
    assert unknown.returncode == 2 and "unknown search strategy 'annealing'" in unknown.stderr


# A space far too large to list: the five parameters the kernel's time depends on, times six it ignores.
HUGE = {"BM": pow2(8, 64), "BN": pow2(8, 64), "BK": pow2(8, 32), "UNROLL": [1, 2, 4, 8], "ORDER": ["ij", "ji"],
        **{f"PAD{i}": list(range(10)) for i in range(6)}}


def spin_template() -> KernelTemplate:
    return KernelTemplate("searched_spin", SOURCE, signature="kernel", language="python")


def test_a_template_space_makes_only_the_choices_its_search_asks_for(quick: Path) -> None:
    space = spin_template().space(Space(HUGE, ["BM * BN <= 2048"]))
    assert space.space.listed() is None and space.space.size_bound == 384 * 10**6
    selection = select_detailed("spaced", [ExternChoice(double, name="double"), space], [np.ones(64)],
                                out=np.empty(64), strategy="default", budget="40")
    assert selection.source == "tuned" and selection.choice.name != "double"
    assert cost(selection.choice.params) <= 1.5, selection.choice.params  # the median is 1.6
    assert 0 < space.made <= 40  # nothing listed, nothing made but what was timed
    timed = [r for r in default_records().get(selection.key) if r.params]
    assert 0 < len(timed) <= 40
    winner = default_records().get_choice(selection.key, selection.choice.hash_key)
    assert winner is not None and winner.info[SEARCH_INFO]

    clear_memo()  # a later process: the finished search is in the records, its winner made from them
    fresh = spin_template().space(Space(HUGE, ["BM * BN <= 2048"]))
    again = select_detailed("spaced", [ExternChoice(double, name="double"), fresh], [np.ones(64)],
                            out=np.empty(64), strategy="default", budget="40")
    assert again.source != "tuned" and not again.benchmarked
    assert again.choice.hash_key == selection.choice.hash_key and fresh.made == len(timed)


def test_a_template_space_without_a_search(quick: Path) -> None:
    small = spin_template().space(Space({"BM": [16, 32], "BN": [16], "BK": [16], "UNROLL": [2, 4], "ORDER": ["ij"]}))
    selection = select_detailed("listed", [ExternChoice(double, name="double"), small], [np.ones(64)],
                                out=np.empty(64))
    assert sorted(selection.benchmarked) == sorted(["double", *(f"searched_spin_{i}" for i in range(4))])
    huge = spin_template().space(Space(HUGE))
    with pytest.raises(ValueError, match="too large to time every configuration: pass strategy="):
        select_detailed("unlisted", [ExternChoice(double), huge], [np.ones(64)], out=np.empty(64))


def test_a_template_space_is_searched_beside_library_calls_only(quick: Path) -> None:
    space = spin_template().space(Space(HUGE))
    other = spin_template().choices([{"BM": 8, "BN": 8, "BK": 8, "UNROLL": 1, "ORDER": "ij"}])[0]
    with pytest.raises(ValueError, match="beside library calls only"):
        select_detailed("mixed", [other, space], [np.ones(64)], out=np.empty(64), strategy="default")
    with pytest.raises(ValueError, match="one template space per selection"):
        select_detailed("two", [space, spin_template().space(Space(HUGE))], [np.ones(64)], out=np.empty(64),
                        strategy="default")
    with pytest.raises(TypeError, match="takes a tuneforge.Space"):
        spin_template().space({"BM": [8]})  # type: ignore[arg-type]


def test_selecting_without_a_search_loads_no_strategy() -> None:
    """A warm start searches nothing: select() and the search package's names load no strategy until asked."""
    import subprocess
    import sys

    code = ("import sys, tuneforge.tune.select, tuneforge.search as s; before = 'tuneforge.search.registry' in "
            "sys.modules; s.make; print(before, 'tuneforge.search.registry' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "True"]


def test_the_finalists_alone_are_re_timed_side_by_side(quick: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuneforge.search import Budget
    from tuneforge.tune import paired as pairing
    from tuneforge.tune import trials

    paired: list[int] = []
    side_by_side = pairing.time_side_by_side

    def counted(runs: Any, *args: Any) -> Any:
        paired.append(len(runs))
        return side_by_side(runs, *args)

    monkeypatch.setattr(pairing, "time_side_by_side", counted)
    checked: list[str] = []
    run = trials.Trials.run

    def run_counted(self: Any, choice: Any, *args: Any, **kwargs: Any) -> Any:
        checked.append(choice.name)
        return run(self, choice, *args, **kwargs)

    monkeypatch.setattr(trials.Trials, "run", run_counted)
    tied = [c for c in CONFIGS if cost(c) <= 1.1]  # 5 of them, 1.0 and four at 1.1: near ties in every batch
    template = KernelTemplate("searched_tie", SOURCE, signature="kernel", language="python")
    plan = SearchPlan("random", Budget(evaluations=4), batch=2)  # two batches, then the finalists
    selection = select_detailed("tied", [ExternChoice(double, name="double"), *template.choices(tied)],
                                [np.ones(64)], out=np.empty(64), strategy=plan)
    records = default_records().get(selection.key)
    # once, in the finalists' job, all of them (the library call, 3x slower, was abandoned): the batches left it
    assert paired == [plan.finalists]
    winner = next(r for r in records if r.choice == selection.choice.hash_key)
    assert sum("+paired" in r.method for r in records) == plan.finalists and "+paired" in winner.method
    assert len(winner.info["confidence"]) == plan.finalists - 1  # the winner against each of the others
    assert sorted(checked) == sorted({*checked})  # each checked and timed once: the finalists' job re-used that


def test_a_search_starts_from_the_suggested_candidates(cache_dir: Path) -> None:
    calls: list[list[str]] = []
    records: dict[str, Record] = {}

    def measure_some(choices: Any, role: str) -> None:
        calls.append([c.name for c in choices])
        for c in choices:
            records[c.hash_key] = Record(key="k", choice=c.hash_key, op="searched", choice_name=c.name, status="ok",
                                         median_ms=cost(c.params) if c.params else 3.0)

    choices = candidates()
    hints = [c for c in choices if c.params in ({**OPTIMAL, "UNROLL": 1}, {**OPTIMAL, "BM": 8, "ORDER": "ji"})]
    for c in hints:
        c.suggested = True
    search_candidates(SearchPlan.of("default", "30"), choices, records, measure_some, "median")
    assert calls[0] == ["double", *(c.name for c in hints)]  # the library call, and the suggestions alone
    assert any(name == choices[CONFIGS.index(OPTIMAL) + 1].name for batch in calls for name in batch)
    plain = SearchPlan.of("default", "30").identity(candidates())
    assert SearchPlan.of("default", "30").identity(choices) != plain  # suggestions change what the search does


def test_a_batch_timed_in_a_slow_spell_keeps_its_place_beside_the_best_so_far(quick: Path) -> None:
    """The host slows every run 2x from the second batch on (another tenant). Its best, `k14` (0.7 ms), then times
    1.4 ms, slower than three of the first batch's (0.8-1.0 ms): it would not even be a finalist. The first batch's
    best is re-timed beside the second batch's contenders, and their figures take its level: `k14` wins."""
    from tuneforge.search import Budget

    spell = {"on": False}
    times = {i: 0.003 for i in range(24)} | {0: 0.0008, 1: 0.0009, 2: 0.001, 14: 0.0007, 15: 0.0012}

    def spin(x: Any, out: Any, seconds: float) -> None:
        end = time.perf_counter() + seconds * (2 if spell["on"] else 1)
        while time.perf_counter() < end:
            pass
        out[...] = x * 2

    def kernel(x: Any, out: Any, i: int = 0) -> None:
        spell["on"] = spell["on"] or i >= 12  # the second batch's first check
        spin(x, out, times[i])

    def library(x: Any, out: Any) -> None:
        spin(x, out, 0.003)

    choices: list[Choice] = [ExternChoice(library, name="library"),
                             *(CallableChoice(kernel, {"i": i}, name=f"k{i}") for i in range(24))]
    plan = SearchPlan("exhaustive", Budget(evaluations=24), batch=12)
    with config.patch(autotune_bench_time_s=0.02, autotune_abandon_ratio=0.0):
        selection = select_detailed("spell", choices, [np.ones(64)], out=np.empty(64), strategy=plan)
    records = {r.choice_name: r for r in default_records().get(selection.key)}
    assert spell["on"]
    assert selection.choice.name == "k14", {n: records[n].median_ms for n in ("k0", "k1", "k14", "k15")}
    k14 = records["k14"]
    assert "+paired" in k14.method and k14.median_ms is not None and k14.median_ms < records["k0"].median_ms


def test_a_library_call_among_a_batchs_contenders_is_timed_on_its_own(quick: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A library call leaves its thread pool spinning after each of its batches of runs, and each kernel batch
    after it waits for the pool to go idle: in a search's batch it is timed alone, after the paired kernels (the
    finalists time it beside the best configurations)."""
    from tuneforge.search import Budget
    from tuneforge.tune import paired as pairing
    from tuneforge.tune import trials

    flags: list[list[bool]] = []
    side_by_side = pairing.time_side_by_side

    def counted(runs: Any, setup: Any, typical: float, settle_after: Any, *rest: Any) -> Any:
        flags.append(list(settle_after))
        return side_by_side(runs, setup, typical, settle_after, *rest)

    monkeypatch.setattr(pairing, "time_side_by_side", counted)
    alone: list[str] = []
    retime = trials.Trials.retime

    def retime_counted(self: Any, choice: Any, *args: Any, **kwargs: Any) -> Any:
        if "budget_s" not in kwargs:  # a full timing, not a crowded screening's control
            alone.append(choice.name)
        return retime(self, choice, *args, **kwargs)

    monkeypatch.setattr(trials.Trials, "retime", retime_counted)
    times = {i: 0.003 for i in range(20)} | {0: 0.0009, 1: 0.001, 11: 0.00095}

    def kernel(x: Any, out: Any, i: int = 0) -> None:
        end = time.perf_counter() + times[i]
        while time.perf_counter() < end:
            pass
        out[...] = x * 2

    def library(x: Any, out: Any) -> None:
        kernel(x, out, 1)

    choices: list[Choice] = [ExternChoice(library, name="library"),
                             *(CallableChoice(kernel, {"i": i}, name=f"k{i}") for i in range(20))]
    plan = SearchPlan("exhaustive", Budget(evaluations=20), batch=10)  # two batches of 10, then the finalists
    with config.patch(autotune_abandon_ratio=0.0):
        selection = select_detailed("alone", choices, [np.ones(64)], out=np.empty(64), strategy=plan)
    assert selection.choice.name in ("k0", "k11", "k1", "library")
    assert "library" in alone  # a contender of the first batch, timed on its own
    batches, finalists = flags[:-1], flags[-1]
    assert batches and not any(True in f for f in batches), flags  # no library call paired in a batch
    assert finalists.count(True) == 1, flags  # the finalists' job: beside the best configurations


def test_only_batches_that_steer_the_search_time_each_build_s_fastest_fully(quick: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A batch's builds' costs steer the next batch (each build's fastest configuration is timed fully: TrialJob.
    rank_builds); the batch that spends the budget steers none: only its fastest few are, for the finalists."""
    from tuneforge.search import Budget
    from tuneforge.tune import measure as measuring

    jobs: list[tuple[bool, str, bool]] = []
    real = measuring.measure

    def seen(job: Any, *args: Any, **kwargs: Any) -> Any:
        jobs.append((job.rank_builds, job.confirm, job.keep_inputs))
        return real(job, *args, **kwargs)

    monkeypatch.setattr(measuring, "measure", seen)
    plan = SearchPlan("random", Budget(evaluations=8), batch=4)  # two batches of 4, then the finalists
    select_detailed("steering", candidates(), [np.ones(64)], out=np.empty(64), strategy=plan)
    assert jobs == [(True, "none", True), (False, "none", True), (False, "all", False)]
