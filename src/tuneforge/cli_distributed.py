"""`tuneforge tune ... --ray ADDRESS`: the shapes' jobs on a Ray cluster, and a table of how each ended."""

from __future__ import annotations

import click

from tuneforge.console import print_table
from tuneforge.kernels.jobs import ShapeJob


def tune_on_ray(jobs: list[ShapeJob], address: str, force: bool) -> None:
    """Run `jobs` with tuneforge.distributed.tune_many at `address`; a table of results, exit status 1 when any
    job failed."""
    try:
        from tuneforge.distributed import Phases, tune_many
    except ImportError as exc:
        raise click.UsageError(f"--ray needs Ray: pip install 'tuneforge[distributed]' ({exc})") from None
    phases = Phases()
    try:
        results = tune_many(jobs, address, force=force, phases=phases)
    except (ValueError, RuntimeError, ConnectionError) as exc:
        raise click.ClickException(f"--ray {address}: {exc}") from None
    rows = []
    for result in results:
        timing = f"{result.median_ms:.4f}" if result.median_ms is not None else "-"
        rows.append([result.job.label, result.fingerprint[:12], result.host or "-", result.choice or "-", timing,
                     result.source or "-", result.error or "ok"])
    print_table("tuned on Ray", ["job", "fingerprint", "host", "pick", "median ms", "from", "status"], rows)
    click.echo(f"{len(jobs)} job(s) on {phases.nodes} node(s) in {phases.groups} fingerprint group(s): "
               f"{phases.builds} build(s) in {phases.build_s:.1f} s ({phases.builds_lost} lost and sent again), "
               f"measured in {phases.measure_s:.1f} s ({phases.jobs_retried} job(s) handed to another actor)")
    failed = [r for r in results if not r.ok]
    if failed:
        raise click.ClickException(f"{len(failed)} of {len(results)} job(s) failed")
