"""The search commands of `tuneforge`: `replay`, and what `tune --strategy/--budget` make of their values."""

from __future__ import annotations

import importlib.util
from typing import Any

import click

from tuneforge.console import print_table


def search_plan(strategy: str | None, budget: str | None) -> Any:
    """The SearchPlan of --strategy/--budget (None: time every candidate); a bad value names its option."""
    if strategy is None and budget is None:
        return None
    from tuneforge.search.registry import names
    from tuneforge.tune.searched import SearchPlan

    if strategy is not None and strategy not in names():
        raise click.BadParameter(f"unknown search strategy {strategy!r}: choose one of {', '.join(names())}",
                                 param_hint="--strategy")
    try:
        return SearchPlan.of(strategy or "default", budget)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--budget") from None


@click.command()
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--strategy", "strategies", multiple=True, metavar="NAME",
              help="A search strategy to replay (repeatable; default: every one).")
@click.option("--seeds", type=click.IntRange(min=1), default=20, show_default=True, help="Runs per strategy.")
@click.option("--budget", default=None, metavar="LIMITS",
              help="Stop each run at: a count (100), a share of the space (15%), seconds (30s), patience=N.")
@click.option("--batch", type=click.IntRange(min=1), default=1, show_default=True,
              help="Configurations asked for at a time (what a parallel build would take).")
@click.option("--key", default=None, help="Only the selections whose key starts with this.")
@click.option("--by", type=click.Choice(["config", "build"]), default="config", show_default=True,
              help="What one evaluation is: a configuration, or a build (every configuration compiled into one "
                   "artifact, timed together, as select(..., strategy=) searches).")
def replay(path: str, strategies: tuple[str, ...], seeds: int, budget: str | None, batch: int,
           key: str | None, by: str) -> None:
    """Replay search strategies against a recorded exhaustive run (a records bundle, `records export`).

    For each selection with at least 8 recorded configurations, prints how many evaluations each strategy
    needed (median over the seeds) to find a configuration within 0-10% of the recorded best. A run ends at its
    budget or when it finds the recorded best.
    """
    from tuneforge.search import Budget
    from tuneforge.search.registry import names as strategy_names
    from tuneforge.search.replay import recordings, report_headers, report_rows
    from tuneforge.store.record import read_records

    limits = None
    if budget is not None:
        try:
            limits = Budget.parse(budget)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--budget") from None
    found = recordings(read_records(path), key=key, by_build=by == "build")
    if not found:
        raise click.ClickException(f"{path} has no selection with at least 8 recorded template configurations"
                                   + (f" under key {key!r}" if key else ""))
    have_sklearn = importlib.util.find_spec("sklearn") is not None  # the model strategy's
    chosen = list(strategies) or [n for n in strategy_names() if n != "model" or have_sklearn]
    for recording in found:
        try:
            rows = report_rows(recording, chosen, seeds=seeds, budget=limits, batch=batch)
        except (ValueError, ImportError) as exc:
            raise click.ClickException(str(exc)) from None
        print_table(recording.describe(), report_headers(), rows)
