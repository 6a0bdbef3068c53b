"""What `tuneforge report` plots, gathered from tuning records as plain data (report_html.py draws it).

- `selections`: per selection key, every candidate's timing (median and p20/p80), its status and error;
- `parameter_effects`: per op and tunable parameter, each candidate's time relative to the best of its
  selection (so that shapes of different sizes compare), and the two parameters that matter most;
- `throughput`: for matrix products (inputs ``A[M,K], B[K,N]``), GFLOP/s of the pick and of the library call
  per shape, and this machine's nominal peak;
- `history`: one selection (op and inputs) measured at different times, on this system or another (a compiler
  or driver upgrade changes the system, and so the key): each choice's median by date;
- `convergence`: for selections a search strategy decided, the best time so far after each measurement.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import field
from typing import Any

from tuneforge.dataclass_lite import dataclass
from tuneforge.store.record import Record
from tuneforge.tune.searched import SEARCH_INFO

_ARRAY = re.compile(r"(float16|bfloat16|float32|float64)\[(\d+)x(\d+)")


@dataclass
class Candidate:
    name: str
    status: str
    median_ms: float | None
    p20_ms: float | None
    p80_ms: float | None
    params: dict[str, Any]
    error: str
    winner: bool = False


@dataclass
class Selection:
    key: str
    op: str
    inputs: str
    system: str
    created: float
    candidates: list[Candidate] = field(default_factory=list)  # ok ones fastest first, then the failed

    @property
    def winner(self) -> Candidate | None:
        return next((c for c in self.candidates if c.winner), None)


def _ok(record: Record) -> bool:
    return record.status == "ok" and record.median_ms is not None


def _by_key(records: Iterable[Record]) -> dict[str, list[Record]]:
    by_key: dict[str, list[Record]] = defaultdict(list)
    for record in records:
        by_key[record.key].append(record)
    return by_key


def selections(records: Iterable[Record]) -> list[Selection]:
    """One Selection per key, its winner the fastest ok candidate; newest selections first."""
    found = []
    for key, rows in _by_key(records).items():
        ok = sorted((r for r in rows if _ok(r)), key=lambda r: r.median_ms or 0.0)
        failed = sorted((r for r in rows if not _ok(r)), key=lambda r: r.choice_name)
        first = rows[0]
        selection = Selection(key, first.op, first.inputs, first.system, max(r.created for r in rows))
        for i, r in enumerate([*ok, *failed]):
            selection.candidates.append(Candidate(r.choice_name, r.status, r.median_ms, r.p20_ms, r.p80_ms,
                                                  dict(r.params), r.error, winner=i == 0 and _ok(r)))
        found.append(selection)
    return sorted(found, key=lambda s: -s.created)


@dataclass
class ParameterEffect:
    op: str
    name: str
    values: list[Any]  # one per measured candidate
    relative: list[float]  # its time over the best time of its selection (1.0: the best)
    spread: float  # how much the parameter matters: max/min of the median relative time per value


def _sortable(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, (int, float)) and not isinstance(value, bool) else (1, str(value))


def parameter_effects(found: Sequence[Selection]) -> list[ParameterEffect]:
    """Per op and parameter with two or more values, most influential first."""
    points: dict[tuple[str, str], list[tuple[Any, float]]] = defaultdict(list)
    for selection in found:
        best = min((c.median_ms for c in selection.candidates if c.median_ms is not None), default=None)
        if not best:
            continue
        for c in selection.candidates:
            if c.median_ms is None:
                continue
            for name, value in c.params.items():
                if isinstance(value, (int, float, str, bool)):
                    points[(selection.op, name)].append((value, c.median_ms / best))
    effects = []
    for (op, name), pairs in points.items():
        by_value: dict[Any, list[float]] = defaultdict(list)
        for value, relative in pairs:
            by_value[value].append(relative)
        if len(by_value) < 2:
            continue
        medians = [statistics.median(v) for v in by_value.values()]
        pairs.sort(key=lambda p: _sortable(p[0]))
        effects.append(ParameterEffect(op, name, [p[0] for p in pairs], [p[1] for p in pairs],
                                       max(medians) / min(medians)))
    return sorted(effects, key=lambda e: (e.op, -e.spread))


def heat_map(found: Sequence[Selection], op: str, first: str, second: str) -> tuple[list[Any], list[Any],
                                                                                    list[list[float | None]]]:
    """(values of `first`, values of `second`, median relative time per pair, None where nothing was measured)."""
    cells: dict[tuple[Any, Any], list[float]] = defaultdict(list)
    for selection in found:
        if selection.op != op:
            continue
        best = min((c.median_ms for c in selection.candidates if c.median_ms is not None), default=None)
        for c in selection.candidates:
            if best and c.median_ms is not None and first in c.params and second in c.params:
                cells[(c.params[first], c.params[second])].append(c.median_ms / best)
    xs = sorted({a for a, _ in cells}, key=_sortable)
    ys = sorted({b for _, b in cells}, key=_sortable)
    grid = [[statistics.median(cells[(x, y)]) if (x, y) in cells else None for x in xs] for y in ys]
    return xs, ys, grid


@dataclass
class Throughput:
    op: str
    dtype: str
    shapes: list[str] = field(default_factory=list)  # "MxNxK", by increasing work
    pick: list[float] = field(default_factory=list)  # GFLOP/s
    library: list[float | None] = field(default_factory=list)


def product_shape(inputs: str) -> tuple[str, int, int, int] | None:
    """(dtype, M, N, K) of a matrix product's inputs text ("float32[64x32], float32[32x16], ..."), else None."""
    arrays = _ARRAY.findall(inputs)
    if len(arrays) < 2 or arrays[0][2] != arrays[1][1]:
        return None
    return arrays[0][0], int(arrays[0][1]), int(arrays[1][2]), int(arrays[0][2])


def throughput(found: Sequence[Selection]) -> list[Throughput]:
    """Per op and dtype of matrix products: the pick's and the library call's GFLOP/s per shape."""
    rows: dict[tuple[str, str], list[tuple[int, str, float, float | None]]] = defaultdict(list)
    for selection in found:
        shape, winner = product_shape(selection.inputs), selection.winner
        if shape is None or winner is None or not winner.median_ms:
            continue
        dtype, m, n, k = shape
        flops = 2.0 * m * n * k
        library = next((c for c in selection.candidates if not c.params and c.median_ms), None)
        rows[(selection.op, dtype)].append((m * n * k, f"{m}x{n}x{k}", flops / winner.median_ms / 1e6,
                                            flops / library.median_ms / 1e6 if library and library.median_ms
                                            else None))
    found_rows = []
    for (op, dtype), items in sorted(rows.items()):
        items.sort()
        found_rows.append(Throughput(op, dtype, [i[1] for i in items], [i[2] for i in items], [i[3] for i in items]))
    return found_rows


@dataclass
class History:
    op: str
    inputs: str
    series: dict[str, list[tuple[float, float]]]  # choice name -> (created, median ms), oldest first
    systems: int  # how many systems (fingerprints) measured it


def history(records: Iterable[Record]) -> list[History]:
    """Selections (op and inputs) measured at more than one time: each choice's medians by date."""
    by_selection: dict[tuple[str, str], list[Record]] = defaultdict(list)
    for record in records:
        if _ok(record):
            by_selection[(record.op, record.inputs)].append(record)
    found = []
    for (op, inputs), rows in sorted(by_selection.items()):
        series: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for r in sorted(rows, key=lambda r: r.created):
            series[r.choice_name].append((r.created, r.median_ms or 0.0))
        if any(len(points) > 1 for points in series.values()):
            found.append(History(op, inputs, dict(series), len({r.system for r in rows})))
    return found


@dataclass
class Convergence:
    key: str
    op: str
    inputs: str
    best_so_far: list[float]  # ms, after each measured candidate (in the order they were measured)


def convergence(records: Iterable[Record]) -> list[Convergence]:
    """For every selection a search decided (its winner's record carries the search's identity)."""
    found = []
    for key, rows in _by_key(records).items():
        if not any(SEARCH_INFO in r.info for r in rows):
            continue
        best, curve = float("inf"), []
        for r in sorted(rows, key=lambda r: r.created):
            if _ok(r):
                best = min(best, r.median_ms or best)
            if best < float("inf"):
                curve.append(best)
        if curve:
            found.append(Convergence(key, rows[0].op, rows[0].inputs, curve))
    return found
