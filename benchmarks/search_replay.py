"""Search strategies replayed on the shipped recorded exhaustive runs (tests/data/spaces, benchmarks/record_spaces.py).

    python benchmarks/search_replay.py [--seeds 20] [--strategies default random ...] [--by config build]
                                       [--files F ...] [--output F]

For each recording and strategy: the median over seeds of the evaluations needed to come within 2% of the
recorded best (as a share of the space; "-" when fewer than half the seeds got there), and within 0% and 5%,
unbudgeted. `--by config` counts configurations (each timed alone); `--by build` counts builds, as
`select(..., strategy=)` walks them (a build's cost is the best of the configurations compiled into it).
Issue 14's target: the default strategy within 2% in at most 15% of the evaluations, on every recording.
By build, the CPU GEMM recordings also get a row `default+hints`: the default strategy given the builds the GEMM's
default space compiles on a CPU of the recorded ISA, as `select` gives it the exhaustive space's suggested choices.
Also: the wall time of each replay (they run against recorded times: milliseconds per run but for `model`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from tuneforge.search.replay import Recording, reached, recordings, replay  # noqa: E402
from tuneforge.search.space import Config  # noqa: E402
from tuneforge.store.record import read_records  # noqa: E402

TARGET = 0.15
STRATEGIES = ["default", "coordinate_descent", "genetic", "random", "model"]


GEMM_FILE = re.compile(r"gemm-(avx512|avx2)-(float32|float64)-(\d+)x(\d+)x(\d+)\.")
BUILT = ("T", "VEC_BYTES", "MR", "NV", "UNROLL", "LOOP")  # what a GEMM build compiles in (kernels.gemm.space)


def gemm_hints(path: Path, recording: Recording) -> list[Config]:
    """The builds of a CPU GEMM recording that the GEMM's default space compiles for its problem on a CPU of the
    recorded ISA (2 threads, as recorded): what select() suggests to a search of the exhaustive space."""
    from tuneforge.cpuinfo import cpu_info
    from tuneforge.kernels.gemm.space import Problem, default_space

    found = GEMM_FILE.match(path.name)
    if found is None:
        return []
    isa = ("avx2", "fma", *(("avx512f",) if found[1] == "avx512" else ()))
    cpu = dataclasses.replace(cpu_info(), arch="x86_64", isa=isa)
    problem = Problem(int(found[3]), int(found[4]), int(found[5]), found[2])
    wanted = {tuple(c[k] for k in BUILT) for c in default_space(problem, cpu, threads=2)}
    return [p for p in recording.space.listed() or [] if tuple(p.get(k) for k in BUILT) in wanted]


def measure(recording: Recording, strategy: str, seeds: int, hints: list[Config] | None = None) -> dict[str, Any]:
    started = time.perf_counter()
    results = replay(recording, strategy, seeds=seeds, suggested=hints or [])
    elapsed = time.perf_counter() - started
    row: dict[str, Any] = {"strategy": strategy + ("+hints" if hints else ""), "seconds": elapsed}
    for r in reached(results, recording.best, (0.0, 0.02, 0.05)):
        got = r.reached * 2 > seeds
        row[f"within_{r.tolerance:g}"] = r.median / recording.size if got and math.isfinite(r.median) else None
        row[f"reached_{r.tolerance:g}"] = r.reached
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--strategies", nargs="+", default=STRATEGIES)
    parser.add_argument("--by", nargs="+", default=["config", "build"], choices=["config", "build"])
    parser.add_argument("--files", nargs="+", type=Path,
                        default=sorted((ROOT / "tests" / "data" / "spaces").glob("*.json.gz")))
    parser.add_argument("--output", type=Path, default=ROOT / "benchmarks" / "results" / "search_replay.json")
    args = parser.parse_args()
    rows = []
    header = f"{'recording':44} {'by':6} {'points':>6} {'strategy':19} {'to 2%':>8} {'to best':>8} {'to 5%':>8} " \
             f"{'time s':>7}  target"
    print(header)
    for path in args.files:
        records = read_records(path)
        for by in args.by:
            for recording in recordings(records, by_build=by == "build"):
                hints = gemm_hints(path, recording) if by == "build" and "default" in args.strategies else []
                for strategy, given in [(s, None) for s in args.strategies] + ([("default", hints)] if hints else []):
                    row = measure(recording, strategy, args.seeds, given)
                    row.update(file=path.name, by=by, points=recording.size)
                    rows.append(row)

                    def share(value: float | None) -> str:
                        return "-" if value is None else f"{100 * value:.1f}%"

                    verdict = ""
                    if strategy == "default":
                        ok = row["within_0.02"] is not None and row["within_0.02"] <= TARGET
                        verdict = "ok" if ok else "FAIL"
                    print(f"{path.name[:44]:44} {by:6} {recording.size:6d} {row['strategy']:19} "
                          f"{share(row['within_0.02']):>8} {share(row['within_0']):>8} {share(row['within_0.05']):>8} "
                          f"{row['seconds']:7.2f}  {verdict}", flush=True)
    print(f"to X: median over {args.seeds} seeds of the evaluations to come within X of the recorded best, as a share"
          f" of the space ('-': fewer than half the seeds got there); target: default within 2% in <= "
          f"{100 * TARGET:.0f}%")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"seeds": args.seeds, "rows": rows}, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
