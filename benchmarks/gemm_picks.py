"""Pick-quality benchmark: does tuneforge.gemm's cold tuning pick what is fastest in steady state?

    python benchmarks/gemm_picks.py [--quick | --shapes 512x512x512 ... [--dtypes float32 ...]] [--threads 2]
                                    [--cold-runs 5] [--rounds 9] [--burst-s 0.02] [--output F]

Issue 13 ("picks that hold"): for each shape and dtype,

1. cold runs: --cold-runs times, a fresh child process over a fresh cache calls tuneforge.gemm once (it tunes
   the `default` space) and reports the pick (the record database's best row for the selection key, as
   benchmarks/gemm.py reads it) and the cold tuning time;
2. steady re-timing: one more child builds every candidate of the space (numpy.matmul included) and calls
   each exactly as the op calls a winner (op._prepare's bound call), in interleaved rounds: each round visits
   every candidate (order reversed every other round) and times a burst of calls after an untimed warm-up
   call; a candidate's figure is the median over rounds of the burst's median call. Two conditions:
   - quiet: only the candidate runs; after numpy's burst a pause lets OpenBLAS's threads stop spinning.
   - op: each timed call is a tuneforge.gemm call through the C dispatcher with the candidate registered as
     the layout's winner (as the op registers one: numpy's tuned ratio from the cold run's records), and it
     comes after the work of gemm_mixed.py's interleaved loop (the previous result's element-wise epilogue,
     then a 64x1024x64 np.matmul), so OpenBLAS's threads are still spinning and the caches hold the other
     work's data, as in a real program. A multi-threaded kernel's crowded calls are then the dispatcher's to
     hand to numpy (kernels/gemm/handoff.h): before each burst the candidate is registered afresh, makes ten
     quiet calls (its best time, which the hand-off compares with) and a few crowded ones (each way tried
     once), as it would early in a program. Only the gemm call is timed: the loop around it is ~100 us of
     numpy work whose own jitter would bury a 3% difference of a 5 us kernel.
   - mixed (shown, not judged): the same loop calling the bare candidate, without the dispatcher: what a
     kernel itself does beside spinning OpenBLAS workers.
   What the call leaves behind for its neighbours (its pool spinning, evicted data) is caught by another figure,
   "prog": the op loop's iteration time minus that of the same iteration without the gemm (timed in the same
   round), i.e. the gemm's cost to the program. It is shown, not judged: it is noisier.
3. each pick's steady time relative to the best candidate (pick/best - 1) in the quiet and op conditions: the
   pick holds when every cold run's pick is within 3% of the best in both; the picks agree when they are the
   same candidate, or within 3% of each other in both conditions.

Children run with blas_env.child_env (OPENBLAS_CORETYPE/L2_SIZE unset) and every library's threads = --threads.
Prints a table and writes benchmarks/results/gemm_picks.json (gemm_picks-subset.json for other cases, or --output).
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from blas_env import blas_report, child_env, load_note
from common import write_results
from gemm import Shape, add_case_arguments, shape_text
from gemm_mixed import SIDE_SHAPE

Case = tuple[str, Shape]
CASES: list[Case] = [("float32", s) for s in [(64, 64, 64), (512, 512, 512), (1024, 1024, 1024), (32, 4096, 4096),
                                             (1, 3000, 3000), (96, 1000, 300), (513, 257, 129)]] + \
                    [("float64", (17, 2048, 64)), ("float64", (512, 512, 512))]
QUICK: list[Case] = [("float32", (512, 512, 512)), ("float64", (17, 2048, 64))]
TOLERANCE = 0.03  # a pick within this of the best candidate holds
JUDGED = ("quiet", "op")  # the conditions a pick must hold in; "mixed" and "prog" are shown
CONDITIONS = (*JUDGED, "mixed")
OP_WARMUP = 5  # crowded calls before an op burst is timed: the hand-off tries each way once
QUIET_CALLS = 10  # quiet calls before an op burst, whose quickest is the kernel's best time to the hand-off
SETTLE_S = 0.15  # OpenBLAS's threads spin for 0.1-0.15 s after a call: the quiet condition waits that out
KERNEL_PAUSE_S = 0.01  # the kernels' own pool spins for up to 5 ms (pool.cpp's SPIN_NS)
MAX_BURST = 100


# ------------------------------------------------------------------------------------------- children

def operands(dtype: str, shape: Shape) -> tuple[Any, Any, Any]:
    import numpy as np

    m, n, k = shape
    rng = np.random.default_rng(0)
    return (rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype),
            np.empty((m, n), dtype=dtype))


def cold_child(dtype: str, shape: Shape) -> dict[str, Any]:
    """Tune once over this process's (fresh) cache; the pick and every candidate's tuning figure."""
    import tuneforge
    from tuneforge.kernels.gemm.op import op_name
    from tuneforge.store.default import default_records
    from tuneforge.tune.select import selection_key
    from tuneforge.tune.specs import TensorSpec

    a, b, out = operands(dtype, shape)
    started = time.perf_counter()
    tuneforge.gemm(a, b, out)
    cold = time.perf_counter() - started
    key = selection_key(op_name(0.0, None), [TensorSpec.of(a), TensorSpec.of(b), 1.0, 0.0, None, TensorSpec.of(out)])
    records = default_records()
    best = records.best(key)
    tuned = {r.choice: r.median_ms for r in records.get(key) if r.status == "ok"}
    return {"cold_s": cold, "hash": best.choice if best else "?", "name": best.choice_name if best else "?",
            "params": best.params if best else {}, "tuned_ms": tuned}


def candidates_for(dtype: str, shape: Shape, a: Any, b: Any, out: Any) -> list[dict[str, Any]]:
    """Every candidate of the default space, built and bound as the op binds a winner, and checked."""
    import numpy as np

    from tuneforge.kernels.gemm import op
    from tuneforge.kernels.gemm.space import Problem

    expected = a.astype("float64") @ b.astype("float64")
    scale = max(1.0, float(np.abs(expected).max()))
    found = []
    m, n, k = shape
    for choice in op.choices(Problem(m, n, k, dtype)):
        entry: dict[str, Any] = {"hash": choice.hash_key, "name": choice.name, "info": choice.info,
                                 "params": choice.params, "library": choice.is_extern}
        try:
            prepared = op._prepare(choice, a, b, out)
            call = prepared.call  # the very call the op makes for a winner
            out.fill(np.nan)
            call(1.0, 0.0, a, b, out, None)
            error = float(np.abs(out - expected).max()) / scale
            entry["error"] = error if error == error else float("inf")  # NaN: an element left unwritten
            entry["ok"] = entry["error"] < (1e-3 if dtype == "float32" else 1e-10)
            entry["call"] = call
            entry["prepared"] = prepared
        except Exception as exc:  # a candidate that does not build is no pick either
            entry.update(ok=False, error=str(exc)[:200])
        found.append(entry)
    return found


def burst_size(call: Callable[[], None], burst_s: float) -> int:
    call()
    started = time.perf_counter()
    call()
    return max(2, min(MAX_BURST, round(burst_s / max(time.perf_counter() - started, 1e-7))))


def timed_burst(call: Callable[[], None], before: Callable[[], None] | None, count: int,
                warmup: int = 1) -> tuple[float, float]:
    """(median call seconds, mean iteration seconds) over `count` iterations of `before` then `call`, after
    `warmup` untimed ones, and as many more as bench.RAMP_S takes (the cores come back to speed)."""
    from tuneforge.tune.bench import RAMP_S, warm_up

    warm_up(call, RAMP_S, before, at_least=warmup)
    calls = []
    started = time.perf_counter()
    for _ in range(count):
        if before is not None:
            before()
        t0 = time.perf_counter()
        call()
        calls.append(time.perf_counter() - t0)
    return statistics.median(calls), (time.perf_counter() - started) / count


def mixed_work(a: Any, b: Any, out: Any) -> Callable[[], None]:
    """What runs between two gemm calls of gemm_mixed.py's interleaved loop: the epilogue of the previous
    result (into a buffer of its own, so that every candidate computes the same thing) and numpy's own matmul."""
    import numpy as np

    rng = np.random.default_rng(1)
    x, y = rng.standard_normal(out.shape).astype(out.dtype), np.empty_like(out)
    side_m, side_n, side_k = SIDE_SHAPE
    p = rng.standard_normal((side_m, side_k)).astype(out.dtype)
    q = rng.standard_normal((side_k, side_n)).astype(out.dtype)
    r = np.empty((side_m, side_n), dtype=out.dtype)

    def work() -> None:
        np.add(out, x, out=y)
        np.tanh(y, out=y)
        np.matmul(p, q, out=r)
    return work


def op_registrations(dtype: str, a: Any, b: Any, out: Any, live: list[dict[str, Any]]) -> tuple[Any, list[Any]]:
    """The C dispatcher, and for each candidate the arguments that register it as the layout's winner (with
    numpy's tuned ratio over it from the cold run's records, as the op registers a winner)."""
    from tuneforge.kernels.gemm import dispatch, op
    from tuneforge.kernels.gemm.space import Problem

    dispatch.load_in_background(op._gemm_python)
    fast = dispatch.wait()
    if fast is None:
        raise SystemExit("the C dispatcher could not be built: the op condition needs it")
    m, n, k = a.shape[0], b.shape[1], a.shape[1]
    candidates = op.choices(Problem(m, n, k, dtype))
    by_hash = {c.hash_key: c for c in candidates}
    registrations = []
    for e in live:
        prepared = e["prepared"]
        ratio = 0.0
        if prepared.kind == dispatch.KERNEL:
            ratio = op._library_ratio(op.op_name(0.0, None), [a, b, 1.0, 0.0, None, out], candidates,
                                      by_hash[e["hash"]])
        e["library_ratio"] = ratio
        registrations.append((a, b, out, 0.0, None, "default", prepared.kind, prepared.call, prepared.address,
                              prepared.params, ratio))
    return fast, registrations


def op_burst(fast: Any, registration: tuple[Any, ...], work: Callable[[], None], count: int) -> tuple[float, float]:
    """An op burst (module docstring): the candidate registered afresh, its quiet calls, then the timed loop."""
    a, b, out = registration[:3]
    fast.register(*registration)
    time.sleep(SETTLE_S)  # OpenBLAS's workers idle: the quiet calls teach the hand-off the kernel's best time
    for _ in range(QUIET_CALLS):  # back to back: the first, after the pause, wakes the kernel's pool
        fast.gemm(a, b, out, 1.0, 0.0, None, "default")
    return timed_burst(lambda: fast.gemm(a, b, out, 1.0, 0.0, None, "default"), work, count, OP_WARMUP)


def steady_child(dtype: str, shape: Shape, rounds: int, burst_s: float) -> dict[str, Any]:
    """Every candidate timed side by side, quiet, through the op in the mixed loop, and bare in it (module
    docstring)."""
    load = load_note()
    a, b, out = operands(dtype, shape)
    entries = candidates_for(dtype, shape, a, b, out)
    live = [e for e in entries if e["ok"]]
    fast, registrations = op_registrations(dtype, a, b, out, live)
    calls = [(lambda c=e["call"]: c(1.0, 0.0, a, b, out, None)) for e in live]
    counts = [burst_size(call, burst_s) for call in calls]
    work = mixed_work(a, b, out)
    samples: dict[str, list[list[float]]] = {name: [[] for _ in live] for name in ("quiet", "op", "mixed", "loop")}
    base_loops: list[float] = []
    gc.disable()  # a collection inside one candidate's burst would be charged to it
    try:
        for round_ in range(rounds):
            order = list(range(len(live))) if round_ % 2 == 0 else list(reversed(range(len(live))))
            time.sleep(SETTLE_S)
            for i in order:
                samples["quiet"][i].append(timed_burst(calls[i], None, counts[i])[0])
                time.sleep(SETTLE_S if live[i]["library"] else KERNEL_PAUSE_S)
            base_loops.append(timed_burst(lambda: None, work, max(counts))[1])
            for i in order:  # no pauses: the program would not pause either
                samples["mixed"][i].append(timed_burst(calls[i], work, counts[i])[0])
            for i in order:
                call_s, loop_s = op_burst(fast, registrations[i], work, counts[i])
                samples["op"][i].append(call_s)
                samples["loop"][i].append(loop_s - base_loops[-1])
    finally:
        gc.enable()
        fast.clear()
    for i, e in enumerate(live):
        e["burst"] = counts[i]
        for name in ("quiet", "op", "mixed"):
            e[f"{name}_us"] = statistics.median(samples[name][i]) * 1e6
            e[f"{name}_spread"] = spread(samples[name][i])
        e["prog_us"] = statistics.median(samples["loop"][i]) * 1e6
    for e in entries:
        e.pop("call", None)
        e.pop("prepared", None)
    return {"blas": blas_report(), "load": load, "base_loop_us": statistics.median(base_loops) * 1e6,
            "candidates": entries}


def spread(values: list[float]) -> float:
    """Interquartile range over the median: how much one candidate's rounds disagree."""
    if len(values) < 2:
        return 0.0
    q1, _, q3 = statistics.quantiles(values, n=4)
    return (q3 - q1) / statistics.median(values)


# ------------------------------------------------------------------------------------------- parent

def run_child(args: list[str], threads: int, cache: str) -> dict[str, Any]:
    env = child_env(threads, "auto", {"TUNEFORGE_CACHE_DIR": cache})
    proc = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"child {' '.join(args)} failed:\n{proc.stderr}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def measure_case(case: Case, args: argparse.Namespace) -> dict[str, Any]:
    dtype, shape = case
    spec = ["--dtypes", dtype, "--shapes", shape_text(shape)]
    cold: list[dict[str, Any]] = []
    cache = ""
    try:
        for i in range(args.cold_runs):
            if cache:
                shutil.rmtree(cache, ignore_errors=True)
            cache = tempfile.mkdtemp(prefix="tuneforge-gemm-picks-")
            cold.append(run_child(["--cold-child", *spec], args.threads, cache))
            print(f"  {dtype} {shape_text(shape)} cold run {i + 1}: {cold[-1]['name']} in {cold[-1]['cold_s']:.2f} s",
                  file=sys.stderr, flush=True)
        # the last cold run's cache: the candidates are compiled already, and re-timing does not compile
        steady = run_child(["--steady-child", *spec, "--rounds", str(args.rounds), "--burst-s", str(args.burst_s)],
                           args.threads, cache or tempfile.mkdtemp(prefix="tuneforge-gemm-picks-"))
    finally:
        if cache:
            shutil.rmtree(cache, ignore_errors=True)
    return judge(dtype, shape, cold, steady)


def find(candidates: list[dict[str, Any]], pick: dict[str, Any]) -> dict[str, Any] | None:
    """The steady entry of a cold pick: by hash, else by name and parameters (a template edited between the
    runs changes the hash, not the configuration)."""
    for c in candidates:
        if c["hash"] == pick["hash"]:
            return c
    return next((c for c in candidates if c["name"] == pick["name"] and c["params"] == pick["params"]), None)


def judge(dtype: str, shape: Shape, cold: list[dict[str, Any]], steady: dict[str, Any]) -> dict[str, Any]:
    timed = [c for c in steady["candidates"] if c.get("ok")]
    best = {cond: min(timed, key=lambda c: float(c[f"{cond}_us"])) for cond in (*CONDITIONS, "prog")}
    picks = []
    for run in cold:
        entry = find(timed, run)
        row: dict[str, Any] = {"name": run["name"], "hash": run["hash"], "cold_s": run["cold_s"],
                               "found": entry is not None}
        if entry is not None:
            row["info"] = entry["info"]
            for cond in CONDITIONS:
                row[f"{cond}_rel"] = entry[f"{cond}_us"] / best[cond][f"{cond}_us"] - 1
            # prog is a difference of two loop times, near 0 or below for tiny kernels: a ratio of it means
            # nothing there, so it is kept as the extra microseconds per call over the cheapest candidate
            row["prog_extra_us"] = entry["prog_us"] - best["prog"]["prog_us"]
            row["holds"] = all(row[f"{cond}_rel"] <= TOLERANCE for cond in JUDGED)
        else:
            row["holds"] = False
        picks.append(row)
    return {"dtype": dtype, "shape": shape_text(shape), "candidates": steady["candidates"], "cold": cold,
            "picks": picks, "best": {cond: {"name": b["name"], "info": b["info"], f"{cond}_us": b[f"{cond}_us"]}
                                     for cond, b in best.items()},
            "numpy": next(({f"{cond}_us": c[f"{cond}_us"] for cond in (*CONDITIONS, "prog")}
                           for c in timed if c["library"]), None),
            "holds": all(p["holds"] for p in picks), "agree": agree(picks, timed),
            "base_loop_us": steady["base_loop_us"], "blas": steady["blas"], "load": steady["load"]}


def agree(picks: list[dict[str, Any]], timed: list[dict[str, Any]]) -> bool:
    """The same pick every time, or picks within TOLERANCE of each other in both conditions."""
    if len({p["hash"] for p in picks}) <= 1:
        return True
    chosen = [find(timed, p) for p in picks]
    if any(c is None for c in chosen):
        return False
    return all(max(c[f"{cond}_us"] for c in chosen if c) / min(c[f"{cond}_us"] for c in chosen if c) - 1
               <= TOLERANCE for cond in JUDGED)


def format_table(result: dict[str, Any]) -> str:
    lines = [f"{result['threads']}T {result['rows'][0]['blas'] if result['rows'] else ''}",
             f"before: {result['load_before']}; after: {result['load_after']}",
             f"{'dtype':8} {'shape':>14} {'cand':>4}  {'best quiet (us)':28} {'best op (us)':28} "
             f"{'best bare mixed (us)':28} {'numpy q/op/m us':>20}  {'picks (count)':30} {'+quiet':>6} {'+op':>6} "
             f"{'+mixed':>6} {'+prog us':>8} {'cold s':>9}  verdict"]
    for r in result["rows"]:
        names: dict[str, int] = {}
        for p in r["picks"]:
            names[p["name"]] = names.get(p["name"], 0) + 1
        found = [p for p in r["picks"] if p["found"]]
        worst = {cond: max((p[f"{cond}_rel"] for p in found), default=float("nan")) for cond in CONDITIONS}
        extra = max((p["prog_extra_us"] for p in found), default=float("nan"))
        colds = [p["cold_s"] for p in r["picks"]]
        numpy = r["numpy"] or {f"{cond}_us": float("nan") for cond in CONDITIONS}
        verdict = ("holds" if r["holds"] else "FAILS") + (", agree" if r["agree"] else ", DISAGREE")
        lines.append(
            f"{r['dtype']:8} {r['shape']:>14} {len(r['candidates']):4d}  "
            + " ".join(f"{best_text(r['best'][cond], cond):28}" for cond in CONDITIONS)
            + " " + "/".join(f"{numpy[f'{cond}_us']:6.1f}" for cond in CONDITIONS) + "  "
            f"{', '.join(f'{n} x{c}' for n, c in names.items()):30} "
            + " ".join(f"{100 * worst[cond]:5.1f}%" for cond in CONDITIONS)
            + f" {extra:8.1f} {statistics.median(colds):4.1f}/{max(colds):4.1f}  {verdict}")
    bases = "/".join(f"{r['base_loop_us']:.0f}" for r in result["rows"])
    lines.append(f"+quiet/+op/+mixed: the worst cold pick's steady time over the best candidate's (pick holds: <= "
                 f"{100 * TOLERANCE:.0f}% quiet and through the op in the mixed loop, on every cold run; +mixed, the "
                 f"bare kernel in that loop, is not judged); +prog us: the worst pick's extra cost to the op loop "
                 f"per call over the cheapest candidate's (loop time minus the loop without the gemm, base {bases} "
                 f"us; noisier, not judged); cold s: median/max tuning time of the {result['cold_runs']} cold runs; "
                 f"agree: one pick, or picks within {100 * TOLERANCE:.0f}% of each other (quiet and op)")
    lines.append(f"picks hold on {sum(r['holds'] for r in result['rows'])} of {len(result['rows'])} cases, "
                 f"agree on {sum(r['agree'] for r in result['rows'])}")
    return "\n".join(lines)


def best_text(best: dict[str, Any], cond: str) -> str:
    name = best["name"].replace("tuneforge_gemm", "tf").replace("numpy_matmul", "numpy")
    return f"{name} {best[f'{cond}_us']:.1f}"[:28]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_case_arguments(parser)
    parser.add_argument("--quick", action="store_true", help=f"{len(QUICK)} cases, 2 cold runs")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cold-runs", type=int, help="cold tuning runs per case (default 5; 2 with --quick)")
    parser.add_argument("--rounds", type=int, help="interleaved re-timing rounds (default 9; 5 with --quick)")
    parser.add_argument("--burst-s", type=float, default=0.02, help="seconds of calls per candidate and round")
    parser.add_argument("--output", type=Path, help="write the JSON here instead of benchmarks/results/")
    parser.add_argument("--cold-child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--steady-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.cold_runs = args.cold_runs or (2 if args.quick else 5)
    args.rounds = args.rounds or (5 if args.quick else 9)
    return args


def cases(args: argparse.Namespace) -> list[Case]:
    if args.shapes:
        return [(dtype, shape) for shape in args.shapes for dtype in args.dtypes or ["float32"]]
    chosen = QUICK if args.quick else CASES
    return [(dtype, shape) for dtype, shape in chosen if not args.dtypes or dtype in args.dtypes]


def src_status() -> str:
    """Uncommitted changes under src/ when this ran: the kernels may be someone's work in progress."""
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run(["git", "-C", str(root), "status", "--short", "src/"], capture_output=True, text=True)
    return proc.stdout.strip() if proc.returncode == 0 else "?"


def main() -> None:
    args = parse_args()
    if args.cold_child or args.steady_child:
        (dtype, shape), = cases(args)
        result = cold_child(dtype, shape) if args.cold_child else steady_child(dtype, shape, args.rounds, args.burst_s)
        print(json.dumps(result))
        return
    load_before = load_note()
    print(load_before, file=sys.stderr, flush=True)
    started = time.perf_counter()
    rows = [measure_case(case, args) for case in cases(args)]
    result = {"threads": args.threads, "cold_runs": args.cold_runs, "rounds": args.rounds, "burst_s": args.burst_s,
              "tolerance": TOLERANCE, "load_before": load_before, "load_after": load_note(),
              "wall_s": time.perf_counter() - started, "src_status": src_status(), "rows": rows}
    print(format_table(result))
    print(f"src/ changes: {result['src_status'] or 'none'}; {result['wall_s']:.0f} s")
    if args.output:
        args.output.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.output}")
    else:
        write_results("gemm_picks" if cases(args) == CASES and args.cold_runs == 5 else "gemm_picks-subset", result)


if __name__ == "__main__":
    main()
