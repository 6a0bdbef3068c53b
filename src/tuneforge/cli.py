"""The `tuneforge` command.

`run` is its entry point: whatever goes wrong because of what the user typed or configured (a bad
setting, a missing or unwritable file, a damaged bundle, Ctrl-C) ends in one line on stderr naming
the thing to fix, and a non-zero exit status, never in a Python traceback.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import click

from tuneforge import config
from tuneforge._version import __version__
from tuneforge.cli_report import report, write_html_report
from tuneforge.cli_search import replay, search_plan
from tuneforge.console import (
    describe_error,
    exit_interrupted,
    exiting,
    hold_interrupts_at_exit,
    keep_swallowed_interrupts,
    print_pairs,
    print_table,
    report_interrupt,
)
from tuneforge.errors import TuneforgeError
from tuneforge.parsing import format_size, parse_size
from tuneforge.store.fsutil import nearest_existing


def _cache_root() -> Path:
    """The cache directory, refused up front when it cannot be one (the OS error would name a subpath)."""
    root = config.get_path("cache_dir")
    existing = nearest_existing(root)
    if existing is not None and not existing.is_dir():
        what = "is not a directory" if existing == root else f"cannot be created: {existing} is a file"
        raise click.ClickException(f"the cache directory {root} {what}; point TUNEFORGE_CACHE_DIR "
                                   "(setting cache_dir) at a directory")
    return root


def _store() -> Any:
    from tuneforge.store.default import default_store

    _cache_root()
    return default_store()


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tuneforge")
@click.option("--debug", is_flag=True, help="Show the traceback of an unexpected error, keep build directories "
              "and print compiler commands (like TUNEFORGE_DEBUG=1).")
def main(debug: bool) -> None:
    """tuneforge: compile, cache and autotune kernels."""
    if debug:
        config.set("debug", True)


@main.group()
def cache() -> None:
    """Inspect and manage the artifact store."""


@cache.command("stats")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def cache_stats(as_json: bool) -> None:
    """Entries, size, hit rate, evictions and corrupt entries (like `ccache -s`)."""
    from tuneforge.store.tiers import remote_stats_file

    store = _store()
    s = store.stats()
    remote = remote_stats_file().flush()
    lookups = s.hits + s.misses
    hit_rate = s.hits / lookups if lookups else 0.0
    remote_url = config.get_optional_str("remote.url")
    if as_json:
        click.echo(json.dumps({"cache_dir": str(store.root), "entries": s.entries, "bytes": s.bytes,
                               "max_bytes": s.max_bytes, "hits": s.hits, "misses": s.misses,
                               "hit_rate": round(hit_rate, 4), "puts": s.puts, "evictions": s.evictions,
                               "corrupt": s.corrupt, "remote_configured": bool(remote_url),
                               "remote": remote}, indent=2))
        return
    remote_rows = describe_remote(remote) if remote_url or any(remote.values()) else [("remote cache", "off")]
    print_pairs("tuneforge artifact store", [
        ("cache directory", store.root),
        ("entries", s.entries),
        ("size", f"{format_size(s.bytes)} of {format_size(s.max_bytes)} "
                 f"({100 * s.bytes / s.max_bytes if s.max_bytes else 0:.1f}%)"),
        ("hits", s.hits),
        ("misses", s.misses),
        ("hit rate", f"{100 * hit_rate:.1f}%"),
        ("puts", s.puts),
        ("evictions", s.evictions),
        ("corrupt entries", s.corrupt),
        *remote_rows,
    ])


def describe_remote(counters: Mapping[str, int]) -> list[tuple[str, Any]]:
    """The remote tier's rows of `cache stats`, from its persistent counters."""
    lookups = counters["hits"] + counters["misses"]
    rate = f"{100 * counters['hits'] / lookups:.1f}%" if lookups else "-"
    return [("remote hits", counters["hits"]), ("remote misses", counters["misses"]), ("remote hit rate", rate),
            ("remote errors", counters["errors"]),
            ("remote lookups skipped", counters.get("skipped", 0)),
            ("remote rejected entries", counters["rejected"]),
            ("remote unusable entries", counters.get("unusable", 0)),
            ("remote puts", counters["puts"]), ("remote puts dropped", counters["dropped"])]


@cache.command("clear")
def cache_clear() -> None:
    """Remove every artifact (tuning records are kept)."""
    removed = _store().clear()
    click.echo(f"removed {removed} entries")


def _size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return parse_size(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


@cache.command("prune")
@click.option("--max-size", callback=_size, metavar="SIZE",
              help="Evict least recently used entries down to SIZE (e.g. 500M, 2G); default: cache_max_bytes.")
def cache_prune(max_size: int | None) -> None:
    """Evict least recently used entries and remove leftovers of killed writers."""
    store = _store()
    temp = store.cleanup_temp()
    result = store.prune(max_size)
    click.echo(f"evicted {result.removed} entries ({format_size(result.freed_bytes)}), "
               f"{format_size(result.remaining_bytes)} left; removed {temp} stale temporary directories")


def _flatten(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        for k in sorted(value):
            yield from _flatten(value[k], f"{prefix}.{k}" if prefix else str(k))
    else:
        yield prefix, value


@cache.command("explain")
@click.argument("key1")
@click.argument("key2")
def cache_explain(key1: str, key2: str) -> None:
    """Say which key inputs differ between two artifacts."""
    from tuneforge.store.entry import StoreError

    store = _store()
    inputs = []
    for key in (key1, key2):
        try:
            entry = store.get(key)
        except StoreError:  # not even shaped like a key
            entry = None
        if entry is None:
            raise click.ClickException(f"no artifact with key {key} in {store.root} "
                                       "(list keys with `tuneforge cache list`)")
        inputs.append(dict(_flatten(entry.key_inputs)))
    a, b = inputs
    differing = [(name, json.dumps(a.get(name, "<absent>")), json.dumps(b.get(name, "<absent>")))
                 for name in sorted(set(a) | set(b)) if a.get(name, "<absent>") != b.get(name, "<absent>")]
    if not differing:
        click.echo("the key inputs are identical")
        return
    print_table(f"{len(differing)} key inputs differ", ("input", key1[:16], key2[:16]), differing)


@cache.command("list")
def cache_list() -> None:
    """Every artifact key with its kind and size."""
    store = _store()
    rows = []
    for key in sorted(store.keys()):
        entry = store.get(key)
        if entry is not None:
            size = sum(int(f["size"]) for f in entry.manifest["files"].values())
            rows.append((key, entry.key_inputs.get("artifact", "?"), format_size(size)))
    print_table(None, ("key", "kind", "size"), rows)


@main.group("config")
def config_group() -> None:
    """Show settings."""


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return " ".join(str(v) for v in value) if value else "(none)"
    return "(unset)" if value is None else str(value)


@config_group.command("show")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def config_show(as_json: bool) -> None:
    """Every setting, its value and where it came from (default, file, env, set)."""
    infos = config.describe()
    if as_json:
        click.echo(json.dumps([{"name": i.name, "value": config.jsonable(i.value), "source": i.source,
                                "env_var": i.env_var, "in_cache_key": i.in_cache_key} for i in infos], indent=2))
        return
    print_table("tuneforge settings", ("setting", "value", "source", "environment variable"),
                [(i.name, _show(i.value), i.source, i.env_var) for i in infos])


def _shapes(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> list[tuple[int, int, int]]:
    shapes = []
    for value in values:
        parts = value.lower().split("x")
        if len(parts) != 3 or not all(p.strip().isdigit() and int(p) > 0 for p in parts):
            raise click.BadParameter(f"expected MxNxK with positive integers (e.g. 512x512x512), got {value!r}")
        m, n, k = (int(p) for p in parts)
        shapes.append((m, n, k))
    return shapes


_OPS = ("gemm", "matmul")


def _check_example_memory(what: str, needed: int) -> None:
    """Refuse, before anything is compiled, a shape whose example inputs (`needed` bytes) cannot fit in memory."""
    from tuneforge.doctor import available_memory

    available = available_memory()
    if available is not None and needed > available:
        raise click.ClickException(f"{what} needs {format_size(needed)} for its example inputs and output; "
                                   f"{format_size(available)} of memory available. Tune a smaller shape.")


@main.command()
@click.argument("op", type=click.Choice(_OPS))
@click.option("--shape", "shapes", required=True, multiple=True, callback=_shapes, metavar="MxNxK",
              help="C[M,N] = A[M,K] @ B[K,N]; give it again for more shapes.")
@click.option("--dtype", type=click.Choice(["float32", "float64", "float16", "bfloat16"]), default="float32",
              show_default=True, help="float32/float64 on the CPU; float16/bfloat16/float32 on CUDA.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="cuda: the Triton GEMM family against cuBLAS, on the current GPU (gemm only).")
@click.option("--space", type=click.Choice(["default", "exhaustive"]), default="default", show_default=True,
              help="Candidate configurations to benchmark.")
@click.option("--force", is_flag=True, help="Re-benchmark even when records exist.")
@click.option("--strategy", default=None, metavar="NAME",
              help="Time only what this search strategy asks for (default, coordinate_descent, genetic, random, "
                   "model, exhaustive); without it, every candidate is timed.")
@click.option("--budget", default=None, metavar="LIMITS",
              help="The search's limits: a count (100), a share of the space (15%), seconds (30s), patience=N; "
                   "implies --strategy default. Default with --strategy: 15%,patience=40.")
@click.option("--report", "report_path", default=None, metavar="FILE",
              help="Also write the HTML report of the op's records to FILE and print its path.")
@click.option("--ray", "ray_address", default=None, metavar="ADDRESS",
              help="Tune on the Ray cluster at ADDRESS (host:port, or auto: the one this machine belongs to): "
                   "builds as Ray tasks on its nodes, measurements on one actor per host and fingerprint. Needs "
                   "the distributed extra.")
def tune(op: str, shapes: tuple[tuple[int, int, int], ...], dtype: str, device: str, space: str, force: bool,
         strategy: str | None, budget: str | None, report_path: str | None, ray_address: str | None) -> None:
    """Tune a shipped op for each shape and print the AUTOTUNE table.

    gemm: the tuned GEMM family (C = A @ B) against numpy.matmul (or, with --device cuda, the Triton
    family against cuBLAS); matmul: the small tiled example.
    """
    from tuneforge.kernels.jobs import ShapeJob

    if device == "cpu" and dtype not in ("float32", "float64"):
        raise click.BadParameter(f"{dtype} is for --device cuda; on the CPU: float32 or float64", param_hint="--dtype")
    if device == "cuda" and op != "gemm":
        raise click.BadParameter(f"{op} has no GPU family; --device cuda tunes gemm", param_hint="--device")
    if device == "cuda" and dtype == "float64":
        raise click.BadParameter("float64 is CPU-only; on CUDA: float16, bfloat16 or float32", param_hint="--dtype")
    jobs = [ShapeJob(op, m, n, k, dtype, device, space) for m, n, k in shapes]
    if ray_address is not None:
        if strategy is not None or budget is not None:
            raise click.BadParameter("a search (--strategy/--budget) runs on one machine; leave out --ray",
                                     param_hint="--ray")
        from tuneforge.cli_distributed import tune_on_ray

        _cache_root()
        tune_on_ray(jobs, ray_address, force)
    else:
        plan = search_plan(strategy, budget)
        for job in jobs:
            _tune_here(job, force, plan)
    if report_path is not None:
        click.echo(f"report: {write_html_report(report_path, op)}")


def _tune_here(job: Any, force: bool, plan: Any) -> None:
    """One job's selection in this process, with its AUTOTUNE table and a summary line."""
    import time

    from tuneforge.kernels.jobs import JobError, tuning_problem
    from tuneforge.tune.select import select_detailed

    try:
        problem = tuning_problem(job)
    except JobError as exc:  # no usable GPU
        raise click.UsageError(f"--device cuda: {exc.reason}; tune on a machine with an NVIDIA GPU, or use --device "
                               "cpu") from None
    _check_example_memory(f"--shape {job.m}x{job.n}x{job.k} {job.dtype}", problem.example_bytes())
    _cache_root()
    started = time.perf_counter()
    with config.patch(autotune_verbose=True, autotune_force=force or config.get_bool("autotune.force")):
        selection = select_detailed(problem.name, problem.choices, problem.inputs, out=problem.out,
                                    reference=problem.reference, sample=problem.sample, strategy=plan)
    elapsed = time.perf_counter() - started
    if selection.report is not None and not selection.benchmarked:
        from tuneforge.tune.report import format_table

        click.echo(format_table(selection.report, None), err=True, nl=False)
    record = selection.records.get(selection.choice.hash_key)
    timing = f" at {record.median_ms:.4f} ms" if record is not None and record.median_ms is not None else ""
    params = f" ({selection.choice.info})" if selection.choice.info else ""
    flops = (f", {2 * job.m * job.n * job.k / record.median_ms / 1e6:.1f} GFLOP/s"
             if timing and record and record.median_ms else "")
    click.echo(f"{job.label}: {selection.choice.name}{params}{timing}{flops}; "
               f"decided from {selection.source} in {elapsed:.2f} s")


@main.group()
def records() -> None:
    """Inspect, export and import tuning records."""


def _db() -> Any:
    from tuneforge.store.default import default_records

    _cache_root()
    return default_records()


@records.command("list")
@click.option("--op", default=None, help="Only this op.")
def records_list(op: str | None) -> None:
    """One line per selection key: op, inputs, choices, best choice and its time."""
    db = _db()
    rows = []
    keys: list[str] = db.keys(op)
    for key in keys:
        recs = db.get(key)
        best = db.best(key)
        rows.append((key[:20], recs[0].op, recs[0].inputs, len(recs),
                     best.choice_name if best else "-", f"{best.median_ms:.4f}" if best and best.median_ms else "-"))
    print_table(None, ("key", "op", "inputs", "choices", "best", "median ms"), rows)


@records.command("show")
@click.argument("key")
def records_show(key: str) -> None:
    """Every record of one selection key (a unique prefix is enough)."""
    db = _db()
    matches = [k for k in db.keys() if k.startswith(key)]
    if len(matches) != 1:
        raise click.ClickException(f"{len(matches)} selection keys start with {key!r}; "
                                   "list them with `tuneforge records list`")
    recs = sorted(db.get(matches[0]), key=lambda r: (r.status != "ok", r.median_ms or 0.0))
    click.echo(f"{matches[0]}  {recs[0].op}({recs[0].inputs})")
    print_table(None, ("choice", "status", "median ms", "min ms", "runs", "params", "error"),
                [(r.choice_name, r.status, f"{r.median_ms:.4f}" if r.median_ms is not None else "-",
                  f"{r.min_ms:.4f}" if r.min_ms is not None else "-", r.count,
                  ", ".join(f"{k}={v}" for k, v in r.params.items()), r.error.splitlines()[0] if r.error else "")
                 for r in recs])


@records.command("export")
@click.option("--op", default=None, help="Only this op.")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None, help="File (default: stdout).")
def records_export(op: str | None, output: str | None) -> None:
    """Write a versioned JSON bundle of the records."""
    from tuneforge.store.records import write_bundle

    bundle = _db().export_bundle(op)
    if output:
        write_bundle(bundle, output)
        click.echo(f"exported {len(bundle['records'])} records to {output}", err=True)
    else:
        click.echo(json.dumps(bundle, indent=1, sort_keys=True))


@records.command("import")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option("--keep", type=click.Choice(["better", "newer", "theirs"]), default="better", show_default=True,
              help="Which record wins when both have one for the same key and choice.")
def records_import(path: str, keep: str) -> None:
    """Merge a bundle into the local record database."""
    try:
        written = _db().import_bundle(path, keep=keep)
    except RecursionError:
        raise click.ClickException(f"cannot import {path}: its JSON is nested too deeply to be a bundle") from None
    except OverflowError as exc:
        raise click.ClickException(f"cannot import {path}: a number in it is out of range ({exc})") from None
    click.echo(f"imported {written} records from {path}")


@records.command("clear")
@click.option("--op", default=None, help="Only this op.")
def records_clear(op: str | None) -> None:
    """Delete tuning records (all, or one op's)."""
    click.echo(f"deleted {_db().clear(op)} records")


main.add_command(replay)
main.add_command(report)


@main.command()
def doctor() -> None:
    """Check the compiler, CPU features, cache directory and optional dependencies."""
    from tuneforge.doctor import run_checks

    checks = run_checks()
    print_table("tuneforge doctor", ("check", "status", "detail"),
                [(c.name, "ok" if c.ok else ("FAIL" if c.required else "missing"), c.detail) for c in checks])
    failed = [c.name for c in checks if c.required and not c.ok]
    if failed:
        raise click.ClickException("failed: " + ", ".join(failed))


_DEBUG_HINT = "run with TUNEFORGE_DEBUG=1 (or --debug) for the traceback"
# Kinds of error that come from what the user typed, configured or pointed at: their message is enough.
_USER_ERRORS: tuple[type[BaseException], ...] = (TuneforgeError, OSError, ValueError, OverflowError,
                                                 RecursionError, MemoryError)


def _debugging() -> bool:
    if "--debug" in sys.argv[1:]:
        return True
    try:
        return config.get_bool("debug")
    except Exception:  # the settings themselves may be what failed
        return False


def _status(args: list[str]) -> int:
    """Run the command; the exit status, with any error already reported on stderr."""
    try:
        problem = config.startup_error()
        if problem is not None:
            raise problem
        result = main.main(args, prog_name="tuneforge", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except (click.Abort, KeyboardInterrupt) as exc:
        if isinstance(exc, click.Abort) and not isinstance(exc.__context__, KeyboardInterrupt):
            click.echo("aborted", err=True)
            return 1
        report_interrupt()
        return 130
    except BrokenPipeError:
        # The reader of stdout went away (`tuneforge records export | head`): nothing left to tell it.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1
    except Exception as exc:  # the safety net: no traceback unless asked for
        if _debugging():
            traceback.print_exc()
        elif isinstance(exc, _USER_ERRORS):
            click.echo(f"error: {describe_error(exc, _configured_cache_dir())}", err=True)
        else:
            click.echo(f"error: unexpected {type(exc).__name__}: {describe_error(exc)} ({_DEBUG_HINT})", err=True)
        return 1


def _configured_cache_dir() -> Path | None:
    try:
        return config.get_path("cache_dir")
    except Exception:  # the settings themselves may be what failed
        return None


def run() -> None:
    """Entry point of the `tuneforge` console script and of `python -m tuneforge`."""
    hold_interrupts_at_exit()  # first, so that its exit handler runs after every other one
    keep_swallowed_interrupts()
    try:
        status = _status(sys.argv[1:])
        exiting()
    except KeyboardInterrupt:  # in the instant between the command and exiting()
        exit_interrupted()
    sys.exit(status)
