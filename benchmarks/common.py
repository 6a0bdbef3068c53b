"""Shared by the benchmark scripts."""

from __future__ import annotations

import compileall
import json
import math
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import tuneforge
from blas_env import child_env


def precompile_package() -> None:
    """Write tuneforge's .pyc files, as `pip install` does for a regular (non-editable) install.

    An editable install never gets them while PYTHONDONTWRITEBYTECODE is set (as on this machine), so
    start-up figures would otherwise include compiling tuneforge's own modules on every run.
    """
    compileall.compile_dir(str(Path(tuneforge.__file__).parent), quiet=1)


SIGNIFICANT = 1 / 32  # a one-sided sign test's p-value at most this: five rounds of five


def round_verdict(round_ratios: list[float], need: float) -> str:
    """A ratio target's verdict from per-round ratios: "ok" where the median round meets `need`; "FAIL" where so few
    rounds met it that a median truly meeting it would leave that few with a chance of SIGNIFICANT at most (none of
    5, at most one of 9); "fail?" between the two: the median missed, within the rounds' noise."""
    if statistics.median(round_ratios) >= need:
        return "ok"
    n, met = len(round_ratios), sum(r >= need for r in round_ratios)
    chance = sum(math.comb(n, i) for i in range(met + 1)) / 2**n
    return "FAIL" if chance <= SIGNIFICANT else "fail?"


def write_results(name: str, results: Any, path: Path | None = None) -> None:
    """benchmarks/results/<name>.json (or `path`), and say where it went."""
    out = path or Path(__file__).parent / "results" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")


def run_fresh_child(script: str, args: list[str], threads: int | None) -> dict[str, Any]:
    """Run `script args` in a fresh process over a fresh cache (blas_env.child_env with `threads`); the JSON object
    its last line of output holds."""
    cache = tempfile.mkdtemp(prefix="tuneforge-bench-")
    try:
        env = child_env(threads, "auto", {"TUNEFORGE_CACHE_DIR": cache})
        proc = subprocess.run([sys.executable, script, *args], env=env, capture_output=True, text=True, cwd=cache)
        if proc.returncode != 0:
            raise SystemExit(f"child {args} failed:\n{proc.stderr[-3000:]}")
        found: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        return found
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def side_by_side(calls: Mapping[str, Callable[[], object]], rounds: int, burst_s: float = 0.02,
                 settle_after: Collection[str] = ()) -> dict[str, float]:
    """Steady figures of `calls`, timed side by side (side_by_side_rounds): {name: median over rounds of its bursts'
    median, in ms}."""
    return {name: statistics.median(values)
            for name, values in side_by_side_rounds(calls, rounds, burst_s, settle_after).items()}


def side_by_side_rounds(calls: Mapping[str, Callable[[], object]], rounds: int, burst_s: float = 0.02,
                        settle_after: Collection[str] = ()) -> dict[str, list[float]]:
    """`calls` timed side by side: interleaved rounds (the order reversed every other round), each a burst of calls
    (as many as last `burst_s`, 3 to 200) after untimed ones for bench.RAMP_S; {name: its bursts' medians in ms, a
    round each}. After the burst of a name in `settle_after` (a library call: OpenBLAS's threads spin 0.1-0.15 s
    after one), a pause until the process is idle: the next calls' bursts would otherwise share the cores with those
    threads (a 128^3 GEMM kernel timed after numpy's burst: 124 us for its 64 alone)."""
    from tuneforge.tune.bench import RAMP_S, warm_up
    from tuneforge.tune.quiet import settle

    names = list(calls)
    per_round: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names if r % 2 == 0 else list(reversed(names)):
            call = calls[name]
            warm_up(call, RAMP_S)  # untimed: after another candidate's burst
            t0 = time.perf_counter()
            call()
            count = max(3, min(200, round(burst_s / max(time.perf_counter() - t0, 1e-7))))
            times = []
            for _ in range(count):
                t0 = time.perf_counter()
                call()
                times.append(time.perf_counter() - t0)
            per_round[name].append(statistics.median(times) * 1e3)
            if name in settle_after:
                settle(0.3)
    return per_round


def paired_ratio(ours: Sequence[float], theirs: Sequence[float], level: float = 0.9) -> tuple[float, float, float]:
    """How much slower `ours` ran than `theirs` (per-round figures of one side-by-side timing): the median of the
    rounds' ratios minus 1, and the bounds of its `level` confidence interval (distribution-free: the order
    statistics of the ratios that hold the median with that chance). A drift of the host's speed from one round to
    the next moves both of a round's figures alike and leaves its ratio be; what moves within a round (this host's
    spells of milliseconds) the interval shows: how far the judge itself can be trusted (+4.7% with an interval
    reaching below +3% is not a clear miss)."""
    ratios = sorted(o / t - 1 for o, t in zip(ours, theirs, strict=True) if t > 0)
    if not ratios:
        raise ValueError("paired_ratio needs rounds with positive figures")
    n = len(ratios)
    # the largest k with P(Binomial(n, 1/2) < k) <= (1 - level) / 2: [ratios[k-1], ratios[n-k]] covers the median
    tail, k, below = (1 - level) / 2, 0, 0.0
    while k < n // 2 and below + math.comb(n, k) / 2**n <= tail:
        below += math.comb(n, k) / 2**n
        k += 1
    low, high = (ratios[k - 1], ratios[n - k]) if k > 0 else (ratios[0], ratios[-1])
    return statistics.median(ratios), low, high
