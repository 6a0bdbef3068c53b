"""benchmarks/search_gemm.py's children on a tiny shape: a cold search of the GEMM exhaustive space, and its pick
timed in steady state (the whole benchmark times every candidate of larger shapes: minutes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def child(*args: str, cache: Path) -> dict[str, object]:
    import os

    proc = subprocess.run([sys.executable, str(BENCHMARKS / "search_gemm.py"), *args], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "TUNEFORGE_CACHE_DIR": str(cache)})
    assert proc.returncode == 0, proc.stderr[-3000:]
    found: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return found


def test_a_cold_search_and_its_pick_in_steady_state(tmp_path: Path) -> None:
    cold = child("--cold", "16x24x32", "float32", "default", cache=tmp_path / "cold")
    assert isinstance(cold["pick"], str) and int(str(cold["timed"])) > 0 and float(str(cold["seconds"])) > 0
    steady = child("--steady", "16x24x32", "float32", str(cold["pick"]), "--rounds", "1", cache=tmp_path / "steady")
    times, rounds = steady["steady_ms"], steady["rounds_ms"]
    assert isinstance(times, dict) and list(times) == [cold["pick"]] and times[cold["pick"]] > 0
    assert isinstance(rounds, dict) and rounds == {cold["pick"]: [times[cold["pick"]]]}  # one round: its median


def test_a_picks_ratio_is_judged_round_by_round_with_the_judges_own_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from common import paired_ratio

    # The host slows down for the second half of the rounds: each round's ratio stays 1.02, the medians' would not.
    theirs = [1.0] * 10 + [2.0] * 11
    ours = [1.02 * t for t in theirs]
    assert paired_ratio(ours, theirs) == pytest.approx((0.02, 0.02, 0.02))
    # 21 noisy rounds: the 90% interval runs from the 7th smallest ratio to the 7th largest (sign-test order
    # statistics: P(Binomial(21, 1/2) <= 6) = 0.039 on each side)
    spread = [0.10, -0.04, 0.06, 0.01, 0.08, -0.02, 0.03, 0.05, 0.00, 0.07, 0.02,
              0.09, -0.01, 0.04, 0.11, -0.03, 0.12, 0.13, -0.05, 0.14, 0.15]
    median, low, high = paired_ratio([1 + r for r in spread], [1.0] * 21)
    ordered = sorted(spread)
    assert median == pytest.approx(ordered[10]) and low == pytest.approx(ordered[6]) \
        and high == pytest.approx(ordered[14])
    assert low < 0.03 < median  # a miss by the median that the judge's noise leaves open
    # too few rounds for 90%: the whole range
    assert paired_ratio([1.1, 0.9, 1.0], [1.0, 1.0, 1.0]) == pytest.approx((0.0, -0.1, 0.1))
    with pytest.raises(ValueError, match="positive"):
        paired_ratio([1.0], [0.0])


def test_side_by_side_pauses_after_a_library_calls_burst(monkeypatch: pytest.MonkeyPatch) -> None:
    """OpenBLAS's threads spin after numpy's burst: the next candidate's burst waits until the process is idle."""
    import tuneforge.tune.quiet as quiet

    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from common import side_by_side

    order: list[str] = []
    monkeypatch.setattr(quiet, "settle", lambda max_s: order.append("settle") or 0.0)
    times = side_by_side({"kernel": lambda: order.append("kernel"), "library": lambda: order.append("library")},
                         rounds=2, burst_s=0.0, settle_after={"library"})
    assert set(times) == {"kernel", "library"}
    bursts = [name for i, name in enumerate(order) if name != "settle" and (i == 0 or order[i - 1] != name)]
    assert bursts == ["kernel", "library", "library", "kernel"]  # the order reversed in the second round
    settled_after = [order[i - 1] for i, name in enumerate(order) if name == "settle"]
    assert settled_after == ["library", "library"]


def test_the_table_says_how_the_picks_record_compares_with_its_steady_time(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    from search_gemm import record_ratio

    assert record_ratio({"tuned_ms": 1.9, "steady_ms": 2.5}) == "0.76"  # a record that reads faster than it runs
    assert record_ratio({"tuned_ms": None, "steady_ms": 2.5}) == "-"
