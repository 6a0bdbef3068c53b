"""The AUTOTUNE table on stderr and the JSON-lines selection log.

Table format (kept compatible with the reference system's, so existing log scrapers work)::

    AUTOTUNE matmul(512x512, 512x512)
      tiled_matmul_2 0.8123 ms 100.0% BM=64, BN=64, BK=32
      matmul 0.9011 ms 90.1%
    SingleProcess AUTOTUNE benchmarking takes 1.2345 seconds and 0.5432 seconds precompiling

Rows are fastest first, times in ms with 4 decimals, the percentage is best/this, and a row
without parameters keeps its trailing space (as the reference system prints it); failed choices
follow as ``  name inf ms 0.0% <status>: <reason>``.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import field
from pathlib import Path
from typing import IO, Any

from tuneforge import config
from tuneforge.dataclass_lite import dataclass

log = logging.getLogger("tuneforge.tune")


@dataclass
class Row:
    name: str
    status: str
    time_ms: float | None
    info: str = ""
    error: str = ""
    measured: bool = True  # False: timing came from the record database


@dataclass
class SelectionReport:
    op: str
    key: str
    sizes: list[str]
    inputs: list[str]
    rows: list[Row]
    winner: str
    source: str  # memo, records, tuned, single, cache_only, fallback
    isolated: bool = False
    build_s: float = 0.0
    verify_s: float = 0.0
    bench_s: float = 0.0
    startup_s: float = 0.0  # waiting for the benchmark worker to start
    setup_s: float = 0.0  # the trials' inputs and reference run
    statistic: str = "median"
    extra: dict[str, Any] = field(default_factory=dict)


def format_table(report: SelectionReport, limit: int | None) -> str:
    ok = sorted((r for r in report.rows if r.status == "ok" and r.time_ms is not None),
                key=lambda r: (r.time_ms, r.name))
    failed = [r for r in report.rows if r.status != "ok"]
    best = ok[0].time_ms if ok else None
    lines = [f"AUTOTUNE {report.op}({', '.join(report.sizes)})"]
    for row in (ok + failed)[:limit]:
        if row.status != "ok" or row.time_ms is None:
            reason = row.error.strip().splitlines()[0] if row.error.strip() else ""
            lines.append(f"  {row.name} inf ms 0.0% {row.status}: {reason}".rstrip())
        elif row.time_ms == 0:
            lines.append(f"  {row.name} {row.time_ms:.4f} ms <DIVIDED BY ZERO ERROR>")
        else:
            share = (best or 0.0) / row.time_ms
            lines.append(f"  {row.name} {row.time_ms:.4f} ms {share:.1%} {row.info}")
    if report.source in ("records", "memo", "cache_only", "fallback"):
        lines.append(f"AUTOTUNE decided from {report.source}: nothing benchmarked")
    else:
        mode = "SubProcess" if report.isolated else "SingleProcess"
        lines.append(f"{mode} AUTOTUNE benchmarking takes {report.verify_s + report.bench_s:.4f} seconds and "
                     f"{report.build_s:.4f} seconds precompiling" +
                     (f", after {report.startup_s:.4f} seconds waiting for the benchmark worker to start"
                      if report.startup_s >= 0.0005 else ""))
    lines += [f"AUTOTUNE confidence: {report.winner} {describe_confidence(entry)}"
              for entry in report.extra.get("confidence", [])]
    kept = report.extra.get("library_margin")
    if kept:
        lines.append(f"AUTOTUNE pick: {kept['kept']}, a library call, kept ahead of {kept['over']}: within "
                     f"{100 * kept['margin']:g}% of it (autotune.library_margin)")
    return "\n".join(lines) + "\n"


def describe_confidence(entry: dict[str, Any]) -> str:
    """A side-by-side re-timing's verdict (confirm.confidence) in words. The winner is the fastest over all its
    paired runs; in a near tie the per-round comparison can still go the other way, and then it says so."""
    rounds = f"{entry['faster_in']} of {entry['rounds']} paired rounds, by {100 * entry['by']:.1f}%"
    if entry["by"] > 0 and 2 * entry["faster_in"] > entry["rounds"]:
        return f"faster than {entry['versus']} in {rounds} (sign test p={entry['p']:.3g})"
    return f"level with {entry['versus']}: faster in {rounds} (sign test p={entry['p']:.3g})"


def print_table(report: SelectionReport, stream: IO[str] | None = None) -> None:
    debug = logging.getLogger("tuneforge").getEffectiveLevel() <= logging.DEBUG
    limit = None if debug else config.get_int("autotune.show")
    (stream or sys.stderr).write(format_table(report, limit))


def _log_path() -> Path | None:
    return config.get_optional_path("autotune.log")


def append_log(report: SelectionReport) -> None:
    """One JSON line per selection; appended with a single write so concurrent processes don't interleave."""
    path = _log_path()
    if path is None:
        return
    line = json.dumps({
        "time": time.time(), "op": report.op, "key": report.key, "inputs": report.inputs,
        "winner": report.winner, "source": report.source, "statistic": report.statistic,
        "build_s": round(report.build_s, 6), "verify_s": round(report.verify_s, 6),
        "bench_s": round(report.bench_s, 6), "startup_s": round(report.startup_s, 6),
        "setup_s": round(report.setup_s, 6),
        "choices": [{"name": r.name, "status": r.status, "time_ms": r.time_ms, "info": r.info,
                     "error": r.error[:500], "measured": r.measured} for r in report.rows],
        **report.extra,
    }, default=str) + "\n"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)
    except OSError as exc:
        log.warning("cannot append to the autotune log %s: %s", path, exc)


def emit(report: SelectionReport, *, benchmarked: bool) -> None:
    if benchmarked and config.get_bool("autotune.verbose"):
        print_table(report)
    append_log(report)


def sizes_of(specs: Sequence[Any]) -> list[str]:
    return [s.sizes_text() for s in specs]
