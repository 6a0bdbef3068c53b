"""`tuneforge report`: the record database as one self-contained HTML page of plots (tune/report_html.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click


def write_html_report(output: str, op: str | None) -> Path:
    """The report of the records (of `op`, or all) into `output`; a clear error when there is nothing to show or
    Plotly is missing."""
    from tuneforge.store.default import default_records

    records: list[Any] = default_records().records(op)
    if not records:
        raise click.ClickException(f"no tuning records{f' of op {op}' if op else ''} in this cache: tune "
                                   "something first (tuneforge tune gemm --shape 512x512x512)")
    try:
        from tuneforge.tune.report_html import write_report
    except ImportError as exc:  # pragma: no cover - the module itself has no third-party imports
        raise click.ClickException(str(exc)) from None
    try:
        return write_report(output, records, title=f"tuneforge report{f': {op}' if op else ''}")
    except ImportError as exc:
        raise click.ClickException(f"{exc}") from None
    except OSError as exc:
        raise click.ClickException(f"cannot write the report to {output}: {exc.strerror or exc}") from None


@click.command()
@click.option("--op", default=None, help="Only the selections of this op (e.g. gemm).")
@click.option("-o", "--output", default="tuneforge-report.html", show_default=True, metavar="FILE",
              help="Where to write the HTML file.")
def report(op: str | None, output: str) -> None:
    """Write an HTML report with plots of the tuning records (timings per selection, parameter effects,
    GFLOP/s across shapes, history, search convergence). Needs the report extra (Plotly)."""
    path = write_html_report(output, op)
    click.echo(f"report: {path}")
