"""`tuneforge report`: one self-contained HTML file of plots from the record database (Plotly).

Why Plotly: one pure-Python dependency (the `report` extra) whose figures carry their data and render in any
browser from a single file, plotly.js inlined once (about 4.6 MB, no network needed to view it), with hover,
zoom, error bars and heat maps built in. Importing tuneforge never imports it.

Sections (report_data.py gathers them): each selection's candidates (bars, p20-p80 error bars, the winner
highlighted, failures with their first error lines), each tunable parameter's effect (time relative to the
best of its selection, per value; a heat map of the two that matter most), GFLOP/s across shapes of matrix
products against the library call and the nominal peak, history of a selection measured at several times, and
the best-so-far curve of searched selections.
"""

from __future__ import annotations

import html
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tuneforge.store.record import Record
from tuneforge.tune import report_data as data

MAX_SELECTIONS = 40  # per op: the newest, so a database of thousands of keys still gives a readable page
MAX_PARAMETERS = 6  # per op: the most influential
_WINNER, _OTHER, _LIBRARY = "#2e7d32", "#90a4ae", "#1565c0"
_PLOT_CONFIG = {"displaylogo": False, "responsive": True}


def _plotly() -> Any:
    try:
        import plotly.graph_objects as go
    except ImportError as exc:
        raise ImportError("tuneforge report draws with Plotly: pip install 'tuneforge[report]'") from exc
    return go


def _figure_html(figure: Any) -> str:
    return str(figure.to_html(full_html=False, include_plotlyjs=False, config=_PLOT_CONFIG))


def _selection_section(go: Any, selection: data.Selection) -> str:
    ok = [c for c in selection.candidates if c.median_ms is not None]
    failed = [c for c in selection.candidates if c.median_ms is None or c.status != "ok"]
    parts = [f"<h3>{html.escape(selection.op)}({html.escape(selection.inputs)})</h3>",
             f"<p class='key'>key {html.escape(selection.key)}; winner "
             f"<b>{html.escape(selection.winner.name if selection.winner else 'none')}</b></p>"]
    if ok:
        medians = [c.median_ms or 0.0 for c in ok]
        figure = go.Figure(go.Bar(
            x=[c.name for c in ok], y=medians,
            error_y={"type": "data", "symmetric": False,
                     "array": [max(0.0, (c.p80_ms or m) - m) for c, m in zip(ok, medians, strict=True)],
                     "arrayminus": [max(0.0, m - (c.p20_ms or m)) for c, m in zip(ok, medians, strict=True)]},
            marker_color=[_WINNER if c.winner else _LIBRARY if not c.params else _OTHER for c in ok],
            hovertext=[", ".join(f"{k}={v}" for k, v in c.params.items()) for c in ok]))
        figure.update_layout(height=320, margin={"t": 10, "b": 80}, yaxis_title="median ms (p20-p80)",
                             xaxis_tickangle=-40)
        parts.append(_figure_html(figure))
    if failed:
        rows = "".join(f"<tr><td>{html.escape(c.name)}</td><td class='status'>{html.escape(c.status)}</td>"
                       f"<td><pre>{html.escape(chr(10).join(c.error.splitlines()[:4]))}</pre></td></tr>"
                       for c in failed)
        parts.append(f"<table class='failed'><tr><th>choice</th><th>status</th><th>error</th></tr>{rows}</table>")
    return "\n".join(parts)


def _parameter_section(go: Any, found: Sequence[data.Selection]) -> str:
    effects = data.parameter_effects(found)
    parts = []
    for op in sorted({e.op for e in effects}):
        mine = [e for e in effects if e.op == op][:MAX_PARAMETERS]
        parts.append(f"<h3>{html.escape(op)}</h3><p>time over the best of its selection, per value; the spread "
                     "(slowest value's median over the fastest's) says how much a knob matters: " +
                     ", ".join(f"{html.escape(e.name)} {e.spread:.2f}x" for e in mine) + "</p>")
        for effect in mine:
            figure = go.Figure(go.Box(x=[str(v) for v in effect.values], y=effect.relative, boxpoints="all",
                                      jitter=0.3, marker_color=_OTHER, name=effect.name))
            figure.update_layout(height=260, margin={"t": 30, "b": 40}, title=f"{effect.name}",
                                 yaxis_title="relative time", xaxis_title=effect.name, showlegend=False)
            parts.append(_figure_html(figure))
        if len(mine) >= 2:
            xs, ys, grid = data.heat_map(found, op, mine[0].name, mine[1].name)
            figure = go.Figure(go.Heatmap(x=[str(x) for x in xs], y=[str(y) for y in ys], z=grid,
                                          colorscale="Viridis_r", colorbar={"title": "relative"}))
            figure.update_layout(height=360, margin={"t": 30}, title=f"{mine[0].name} x {mine[1].name}",
                                 xaxis_title=mine[0].name, yaxis_title=mine[1].name)
            parts.append(_figure_html(figure))
    return "\n".join(parts) or "<p>No selection has candidates with parameters.</p>"


def _throughput_section(go: Any, found: Sequence[data.Selection], peak: dict[str, float]) -> str:
    parts = []
    for series in data.throughput(found):
        figure = go.Figure()
        figure.add_trace(go.Scatter(x=series.shapes, y=series.pick, mode="lines+markers", name="pick",
                                    line_color=_WINNER))
        figure.add_trace(go.Scatter(x=series.shapes, y=series.library, mode="lines+markers", name="library call",
                                    line_color=_LIBRARY))
        if series.dtype in peak:
            figure.add_hline(y=peak[series.dtype], line_dash="dash", annotation_text="nominal peak")
        figure.update_layout(height=340, margin={"t": 30}, title=f"{series.op} {series.dtype}",
                             yaxis_title="GFLOP/s", xaxis_title="M x N x K")
        parts.append(_figure_html(figure))
    return "\n".join(parts) or "<p>No matrix-product selection (inputs A[M,K], B[K,N]) with a pick.</p>"


def _history_section(go: Any, records: Sequence[Record]) -> str:
    parts = []
    for item in data.history(records)[:MAX_SELECTIONS]:
        figure = go.Figure()
        for name, points in sorted(item.series.items()):
            figure.add_trace(go.Scatter(x=[time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) for t, _ in points],
                                        y=[ms for _, ms in points], mode="lines+markers", name=name))
        figure.update_layout(height=300, margin={"t": 30}, yaxis_title="median ms",
                             title=f"{item.op}({item.inputs[:80]}) on {item.systems} system(s)")
        parts.append(_figure_html(figure))
    return "\n".join(parts) or "<p>No selection was measured more than once.</p>"


def _convergence_section(go: Any, records: Sequence[Record]) -> str:
    parts = []
    for item in data.convergence(records)[:MAX_SELECTIONS]:
        figure = go.Figure(go.Scatter(x=list(range(1, len(item.best_so_far) + 1)), y=item.best_so_far,
                                      mode="lines+markers", line_shape="hv", line_color=_WINNER))
        figure.update_layout(height=280, margin={"t": 30}, title=f"{item.op}({item.inputs[:80]})",
                             xaxis_title="candidates measured", yaxis_title="best ms so far")
        parts.append(_figure_html(figure))
    return "\n".join(parts) or "<p>No selection was decided by a search strategy.</p>"


def nominal_peak_gflops() -> dict[str, float]:
    """This machine's nominal FMA peak per dtype (all cores, the widest vectors, two FMA pipes, the clock
    /proc/cpuinfo reports), or {} where it cannot be told."""
    from tuneforge.cpuinfo import PROC_CPUINFO, cpu_info

    info = cpu_info()
    width = 64 if info.has("avx512f") else 32 if info.has("avx2") and info.has("fma") else 0
    try:
        mhz = next(float(line.split(":")[1]) for line in PROC_CPUINFO.read_text().splitlines()
                   if line.startswith("cpu MHz"))
    except (OSError, StopIteration, ValueError, IndexError):
        return {}
    if not width:
        return {}
    cycles = info.cores * mhz * 1e6
    return {"float32": cycles * (width / 4) * 2 * 2 / 1e9, "float64": cycles * (width / 8) * 2 * 2 / 1e9}


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; }
h2 { border-bottom: 1px solid #ccc; padding-bottom: .2em; margin-top: 2em; }
.key { color: #666; font-size: 85%; }
table.failed { border-collapse: collapse; margin: .5em 0 1.5em; font-size: 85%; }
table.failed td, table.failed th { border: 1px solid #ddd; padding: .2em .5em; vertical-align: top; }
td.status { color: #b71c1c; } pre { margin: 0; white-space: pre-wrap; }
"""


def render(records: Sequence[Record], *, title: str = "tuneforge report", peak: dict[str, float] | None = None) -> str:
    """The whole page as one string (plotly.js inlined)."""
    go = _plotly()
    from plotly.offline import get_plotlyjs

    found = data.selections(records)
    peak = nominal_peak_gflops() if peak is None else peak
    shown: list[data.Selection] = []
    for op in sorted({s.op for s in found}):
        shown += [s for s in found if s.op == op][:MAX_SELECTIONS]
    omitted = len(found) - len(shown)
    sections = [
        ("Selections", "\n".join(_selection_section(go, s) for s in shown) +
         (f"<p>{omitted} older selection(s) not shown.</p>" if omitted else "")),
        ("Parameters", _parameter_section(go, found)),
        ("Across shapes", _throughput_section(go, found, peak)),
        ("History", _history_section(go, records)),
        ("Search convergence", _convergence_section(go, records)),
    ]
    body = "\n".join(f"<h2>{name}</h2>\n{content}" for name, content in sections)
    summary = (f"{len(records)} record(s), {len(found)} selection(s) of {len({s.op for s in found})} op(s); made "
               f"{time.strftime('%Y-%m-%d %H:%M:%S')}")
    return (f"<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{_STYLE}</style><script>{get_plotlyjs()}</script></head>\n<body><h1>{html.escape(title)}</h1>"
            f"<p>{html.escape(summary)}</p>\n{body}\n</body></html>\n")


def write_report(path: str | os.PathLike[str], records: Sequence[Record], **options: Any) -> Path:
    """render() into `path`, written whole or not at all (a temporary file renamed over it)."""
    target = Path(path)
    text = render(records, **options)
    staging = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        staging.write_text(text, encoding="utf-8")
        os.replace(staging, target)
    finally:
        staging.unlink(missing_ok=True)
    return target.resolve()
