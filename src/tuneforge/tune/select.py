"""select(): pick the fastest valid choice for these inputs, remembering the answer.

The flow (DESIGN "The flow of one selection"): key -> in-process memo -> record database ->
build the choices without a record -> verify against the reference -> benchmark -> record -> pick.
Records are per (selection key, choice), so a new choice in the list is the only one benchmarked,
and a decision is reused as long as the records cover every candidate.

Measuring holds a per-selection file lock under the cache directory: processes tuning one key at once
would time their kernels against each other and record disagreeing figures, so the others wait and
then read the records. A failure of the tuning machinery itself (example inputs too large to make, a
worker that cannot start) is not the candidates' fault: the fallback choice runs untuned, with one
warning and nothing recorded. A failing reference is the caller's to fix and raises.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import field
from typing import TYPE_CHECKING, Any, Literal, get_args

from tuneforge import config
from tuneforge.dataclass_lite import dataclass
from tuneforge.errors import ConfigError, NoValidChoicesError
from tuneforge.store.default import default_records
from tuneforge.store.fsutil import LockTimeout, file_lock
from tuneforge.store.records import Record
from tuneforge.store.shipped import Nearest
from tuneforge.store.tiers import RecordSource, record_tiers
from tuneforge.tune import agree
from tuneforge.tune.choices import Choice, ExternChoice
from tuneforge.tune.device import DeviceContextLost, cuda_index, job_device
from tuneforge.tune.fingerprint import selection_key as make_selection_key
from tuneforge.tune.fingerprint import system_fingerprint
from tuneforge.tune.job import TrialJob, args_signature, error_text
from tuneforge.tune.ranking import ranked as rank
from tuneforge.tune.sample import SAMPLED, RowSample
from tuneforge.tune.specs import TensorSpec, key_of
from tuneforge.tune.template_space import TemplateSpace, split_choices

if TYPE_CHECKING:
    from tuneforge.search import Budget
    from tuneforge.tune.measure import Outcome
    from tuneforge.tune.report import Row, SelectionReport
    from tuneforge.tune.searched import SearchPlan  # loaded when a search is asked for: a warm start needs none

log = logging.getLogger("tuneforge.tune")

_memo: dict[tuple[str, frozenset[str]], Choice] = {}
_memo_lock = threading.Lock()


# Where a decision came from: one candidate only, the in-process memo, a tier's records (local, remote,
# a shipped bundle's exact key or its nearest shape), a measurement (tuned), the records there are while
# some candidates lack one and measuring is off (cache_only), or untuned (fallback: no valid record under
# cache_only, or tuning itself failed). Reports and the JSON log show it; a Literal keeps the list whole.
Source = Literal["single", "memo", RecordSource, "bundle-nearest", "tuned", "cache_only", "fallback", "agreed"]
SOURCES: tuple[Source, ...] = get_args(Source)


@dataclass
class Selection:
    """The outcome of one select(): the winner, and how it was decided."""

    choice: Choice
    key: str
    source: Source
    benchmarked: list[str] = field(default_factory=list)  # names of choices timed by this call
    records: dict[str, Record] = field(default_factory=dict)  # hash_key -> record of each candidate
    report: SelectionReport | None = None


def _arg_key(value: Any) -> Any:
    if isinstance(value, TensorSpec):
        return key_of(value)
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return key_of(TensorSpec.of(value))
    return ("scalar", type(value).__name__)  # a scalar's type shapes the tuning, its value does not


def selection_key(name: str, args: Sequence[Any]) -> str:
    """Op name + every argument's key_of + this machine's fingerprint (+ the GPU's, for CUDA arguments)."""
    return make_selection_key(name, {"args": [_arg_key(a) for a in args]}, gpu=cuda_index(job_device(args)))


def _spec_or_value(value: Any) -> Any:
    if isinstance(value, TensorSpec) or not (hasattr(value, "shape") and hasattr(value, "dtype")):
        return value
    return TensorSpec.of(value)


def _describe(value: Any) -> str:
    return value.describe() if isinstance(value, TensorSpec) else repr(value)


def _sizes(value: Any) -> str:
    return value.sizes_text() if isinstance(value, TensorSpec) else repr(value)


def _ready(choice: Choice) -> Choice:
    choice.build().result()
    return choice


def _rows(candidates: Sequence[Choice], records: Mapping[str, Record], statistic: str,
          measured: set[str]) -> list[Row]:
    from tuneforge.tune.report import Row

    rows = []
    for c in candidates:
        r = records.get(c.hash_key)
        if r is not None:
            info = f"{c.info} (estimated on a sample)".lstrip() if SAMPLED in r.method else c.info
            rows.append(Row(c.name, r.status, r.time(statistic), info, r.error, measured=c.hash_key in measured))
    return rows


def select(name: str, choices: Sequence[Choice | TemplateSpace], inputs: Sequence[Any], *, out: Any = None,
           reference: Choice | Callable[..., Any] | None = None,
           generators: Mapping[int, Callable[..., Any]] | None = None, rtol: float | None = None,
           atol: float | None = None, accumulate: bool = False, sample: RowSample | None = None,
           strategy: str | SearchPlan | None = None, budget: Budget | str | None = None) -> Choice:
    """Return the fastest valid choice for inputs shaped like `inputs`; call it as ``choice(*inputs, out)``.

    `inputs` are arrays (only their specs are used: benchmarking runs on generated example inputs,
    never on your data) or TensorSpecs; `out` is the output buffer or its spec (default: the
    reference's result layout). `reference` is the choice whose output is taken as correct (default:
    the first ExternChoice). `generators` maps an input index to ``fn(spec, rng)`` for inputs that
    must hold valid values (indices). With `accumulate`, the output's initial contents matter (``C +=``).
    With `sample` (a RowSample), choices are checked and timed on the first rows of the arguments it names,
    and the fastest on the whole problem (see tune/sample.py): for problems whose every run is long.
    With `strategy` (a name from tuneforge.search, or a SearchPlan) or a `budget` ("15%", "100", "30s",
    "patience=20", or a search.Budget), only the configurations a search strategy asks for are timed
    (tune/searched.py); library calls always are. A `template.space(tuneforge.Space(...))` among `choices` stands
    for every configuration of that space, of which a search makes only those it asks for (tune/template_space.py).
    """
    return select_detailed(name, choices, inputs, out=out, reference=reference, generators=generators,
                           rtol=rtol, atol=atol, accumulate=accumulate, sample=sample, strategy=strategy,
                           budget=budget).choice


def select_detailed(name: str, choices: Sequence[Choice | TemplateSpace], inputs: Sequence[Any], *, out: Any = None,
                    reference: Choice | Callable[..., Any] | None = None,
                    generators: Mapping[int, Callable[..., Any]] | None = None, rtol: float | None = None,
                    atol: float | None = None, accumulate: bool = False, sample: RowSample | None = None,
                    strategy: str | SearchPlan | None = None, budget: Budget | str | None = None) -> Selection:
    """select(), returning the whole decision (key, source, records, what was benchmarked)."""
    plan = None
    if strategy is not None or budget is not None:
        from tuneforge.tune.searched import SearchPlan

        plan = SearchPlan.of(strategy or "default", budget)
    candidates, space = split_choices(name, choices, searching=plan is not None)
    if not candidates and space is None:
        raise NoValidChoicesError(f"select({name!r}) got no choices: pass at least one (an ExternChoice "
                                  "of the library call makes a good fallback)")
    ref = reference if reference is None or isinstance(reference, Choice) else ExternChoice(reference)
    ref = ref or next((c for c in candidates if c.is_extern), None)
    arg_specs = [_spec_or_value(x) for x in inputs]
    unknown = sorted((i for i in generators or {} if not (isinstance(i, int) and 0 <= i < len(arg_specs))), key=str)
    if unknown:  # else silently unused, and the inputs it was meant to make stay invalid
        raise ValueError(f"select({name!r}): generators given for arguments {unknown}, but there are "
                         f"{len(arg_specs)} inputs (indices 0..{len(arg_specs) - 1})")
    out_spec = _spec_or_value(out) if out is not None else None
    sizes = [_sizes(s) for s in arg_specs if isinstance(s, TensorSpec)]  # the header shows array sizes only
    if out_spec is None:
        try:
            values = TrialJob(name="", key="", outputs=[], arg_specs=list(arg_specs),
                              generators=dict(generators or {})).materialize()
        except Exception as exc:  # e.g. MemoryError: example inputs too large to make
            return _degraded(name, sizes, selection_key(name, arg_specs), candidates, exc)  # the key of no record
        model = ref or (candidates[0] if candidates or space is None else space.choice(space.any_point()))
        out_spec = _infer_out_spec(model, values)
    if sample is not None:
        _check_sample(name, sample, [*arg_specs, out_spec])
    key = selection_key(name, [*arg_specs, out_spec])
    described = [_describe(s) for s in [*arg_specs, out_spec]]

    def workload() -> TrialJob:
        return TrialJob(name=name, key=key, outputs=[len(arg_specs)], arg_specs=list(arg_specs), out_spec=out_spec,
                        generators=dict(generators or {}), rtol=rtol, atol=atol, poison_outputs=not accumulate,
                        inputs_text=", ".join(described), sample=sample)

    return decide(name, key, candidates, ref, workload, sizes=sizes, described=described, search=plan, space=space)


def _check_sample(name: str, sample: RowSample, specs: Sequence[Any]) -> None:
    """A sample must name arrays (the inputs, then the output) with the same number of rows."""
    bad = [i for i in sample.args
           if not (isinstance(i, int) and 0 <= i < len(specs) and isinstance(specs[i], TensorSpec) and specs[i].sizes)]
    if bad:
        raise ValueError(f"select({name!r}): sample=RowSample(args={list(sample.args)}) names {bad}, which are not "
                         f"arrays: positions 0..{len(specs) - 2} are the inputs, {len(specs) - 1} the output")
    rows = sorted({specs[i].sizes[0] for i in sample.args})
    if len(rows) > 1:
        raise ValueError(f"select({name!r}): the arguments sample=RowSample(args={list(sample.args)}) cuts differ in "
                         f"rows ({rows}); it cuts each to its first rows, so they must agree")
    if sample.independent_rows and len(specs) - 1 not in sample.args:
        raise ValueError(f"select({name!r}): sample=RowSample(args={list(sample.args)}, independent_rows=True) must "
                         f"cut the output ({len(specs) - 1}) too: its rows are compared span by span")


def decide(name: str, key: str, candidates: Sequence[Choice], reference: Choice | None,
           workload: Callable[[], TrialJob], *, sizes: list[str], described: list[str],
           search: SearchPlan | None = None, space: TemplateSpace | None = None) -> Selection:
    """The shared core of select() and @autotune: memo -> record tiers -> measure what is missing (or what a
    `search` asks for, unless these records hold its end) -> choose. With a template `space` (and a search), the
    candidates grow by its configurations that the records hold and that the search asks for."""
    if len(candidates) == 1 and space is None:
        return Selection(_ready(candidates[0]), key, "single")
    force = config.get_bool("autotune.force")
    memo_key = (key, frozenset([*(c.hash_key for c in candidates), *([space.identity] if space is not None else [])]))
    if not force:
        with _memo_lock:
            hit = _memo.get(memo_key)
        if hit is not None:
            return Selection(hit, key, "memo")
    statistic = config.get_str("autotune.statistic")
    job = workload()  # data only: inputs are generated when (and where) trials run
    candidates = list(candidates)
    if space is not None and not force:
        candidates += space.recorded(_key_records(key))
    found = _Found({}, "tuned") if force else _recall(name, key, candidates, job, statistic)
    if found.nearest is not None:
        log.info("%s(%s): no record; using the decision for the nearest tuned shape %s from a bundle",
                 name, ", ".join(sizes), found.nearest[1].inputs)
    elif _incomplete(found, candidates, search, space) and config.get_bool("autotune.cache_only"):
        found.source = "cache_only"
    elif _incomplete(found, candidates, search, space):
        found.agreed = None if force else agree.before_measuring(key, candidates)
        if found.agreed is None:
            try:
                _measure_missing(name, key, candidates, reference, job, found, force, search, space)
            except _MachineryFailed as failed:
                return _degraded(name, sizes, key, candidates, failed.cause)
    winner, source = _choose(name, sizes, candidates, found, statistic)
    if source not in ("bundle-nearest", "fallback", "cache_only"):  # one pick for the processes sharing a remote
        agreed = agree.publish(key, candidates, winner, replace=force) if found.benchmarked else \
            agree.recalled(key, candidates, winner)
        if agreed is not winner:
            winner, source = agreed, "agreed"
    from tuneforge.tune import report as reporting  # tables and logs load only when a decision is made

    report = reporting.SelectionReport(op=name, key=key, sizes=sizes, inputs=described,
                                       rows=_rows(candidates, found.records, statistic, found.measured),
                                       winner=winner.name, source=source, statistic=statistic)
    winner_record = found.records.get(winner.hash_key)
    if found.benchmarked and winner_record is not None:
        from tuneforge.tune.confirm import CONFIDENCE  # with the measuring machinery: a recall loads neither

        if winner_record.info.get(CONFIDENCE):
            report.extra["confidence"] = winner_record.info[CONFIDENCE]
    if found.displaced is not None and winner.is_extern:
        report.extra["library_margin"] = {"kept": winner.name, "over": found.displaced.name,
                                          "margin": config.get_float("autotune.library_margin")}
    if found.nearest is not None:
        near = found.nearest[1]
        report.extra["nearest"] = {"key": near.key, "inputs": near.inputs, "distance": round(near.distance, 3)}
    if found.outcome is not None:
        found.outcome.describe(report)
    reporting.emit(report, benchmarked=bool(found.benchmarked))
    with _memo_lock:
        _memo[memo_key] = winner
    return Selection(winner, key, source, found.benchmarked, found.records, report)


@dataclass
class _Found:
    """What a decision has to go on: records by choice hash, where they came from, a nearest-shape decision
    from a bundle, and what this call measured (the choice hashes, the names timed ok, the figures)."""

    records: dict[str, Record]
    source: Source
    nearest: tuple[Choice, Nearest] | None = None
    measured: set[str] = field(default_factory=set)
    benchmarked: list[str] = field(default_factory=list)
    outcome: Outcome | None = None
    agreed: Choice | None = None  # another process's published pick, taken instead of measuring
    displaced: Choice | None = None  # a kernel faster than the pick, a library call, by less than the margin

    def missing(self, candidates: Sequence[Choice]) -> list[Choice]:
        return [c for c in candidates if c.hash_key not in self.records]


def _recall(name: str, key: str, candidates: Sequence[Choice], job: TrialJob, statistic: str) -> _Found:
    """The candidates' records from the tiers; with none anywhere, maybe the nearest shape in a bundle."""
    records, source = record_tiers.lookup(key, {c.hash_key for c in candidates})
    found = _Found(records, source)
    if not records and config.get_bool("bundles_nearest"):
        nearest = record_tiers.nearest(name, args_signature(job), system_fingerprint()["hash"])
        chosen = _map_decision(nearest, candidates, statistic) if nearest is not None else None
        if nearest is not None and chosen is not None:
            found.nearest, found.source = (chosen, nearest), "bundle-nearest"
    return found


def _measure_missing(name: str, key: str, candidates: list[Choice], reference: Choice | None, job: TrialJob,
                     found: _Found, force: bool, search: SearchPlan | None = None,
                     space: TemplateSpace | None = None) -> None:
    """Measure the candidates without a record under the selection lock, committing each record as it comes;
    with a `search`, only those its strategy asks for (tune/searched.py)."""
    with _measuring(name, key):
        if not force:  # another process may have measured them while this one waited for the lock
            again = record_tiers.local(key, {c.hash_key for c in found.missing(candidates)})
            if again:
                found.records.update(again)
                found.source = "records"
        if search is not None:
            from tuneforge.tune.searched import search_candidates

            def measure_some(choices: Sequence[Choice], role: str) -> None:
                _measure_batch(key, choices, reference, job, found, role)

            marked = search_candidates(search, candidates, found.records, measure_some,
                                       config.get_str("autotune.statistic"), space,
                                       lambda records: record_tiers.commit_all(key, records))
            if marked is not None:
                record_tiers.commit_all(key, [marked])
            return
        missing = found.missing(candidates)
        if missing:
            _measure_batch(key, missing, reference, job, found)


def _measure_batch(key: str, choices: Sequence[Choice], reference: Choice | None, job: TrialJob, found: _Found,
                   role: str = "") -> None:
    """Measure `choices` (recorded or not), adding their records and figures to `found`. `role` in a search
    (searched.py): "batch" or "last" (the worker keeps the inputs and the reference's outputs for the next job, and
    leaves near ties to the finalists) or "finalists"; a choice with a record already is only re-timed side by side."""
    from tuneforge.tune.measure import measure  # build pool, workers, benchmarker: only when measuring

    if role or job.keep_inputs:
        earlier = [r for c in choices if (r := found.records.get(c.hash_key)) is not None and r.status == "ok"]
        batch = role in ("batch", "last")
        job = dataclasses.replace(job, keep_inputs=batch, rank_builds=role == "batch",
                                  timed={r.choice: r for r in earlier} if batch or role == "finalists" else {},
                                  confirm="none" if batch else "all" if role == "finalists" else "ties")
    with record_tiers.committing(key) as commit:  # each kept at once; shared once, at the end
        try:
            outcome = measure(job, choices, reference, on_record=commit)
        except (NoValidChoicesError, ConfigError, DeviceContextLost):
            raise  # the caller's to fix: a failing reference, a bad setting, a broken CUDA context
        except Exception as exc:  # the tuning machinery failed (memory, worker), not a candidate
            raise _MachineryFailed(exc) from exc
    found.records.update({r.choice: r for r in outcome.records})
    found.measured |= {c.hash_key for c in choices}
    found.benchmarked += [c.name for c in choices if c.hash_key in found.records
                          and found.records[c.hash_key].status == "ok" and c.name not in found.benchmarked]
    if found.outcome is None:
        found.outcome = outcome
    else:
        found.outcome.add(outcome)
    found.source = "tuned"


def _incomplete(found: _Found, candidates: Sequence[Choice], search: SearchPlan | None,
                space: TemplateSpace | None = None) -> bool:
    """Whether there is measuring to do: candidates lack records (a template space: its configurations do, until a
    search of it finished), and no finished `search` covers them."""
    if not found.missing(candidates) and space is None:
        return False
    if search is None:
        return True
    from tuneforge.tune.searched import finished

    return not finished(search, candidates, found.records, space)


def _key_records(key: str) -> list[Record]:
    """Every record of `key` that the local database holds, else the remote's: where a template space's recorded
    configurations are found."""
    local = default_records().get(key)
    return local if any(r.params for r in local) else record_tiers.remote_records(key)


class _MachineryFailed(Exception):
    """Measuring failed for a reason that is not a candidate's (see `_degraded`)."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _choose(name: str, sizes: Sequence[str], candidates: Sequence[Choice], found: _Found,
            statistic: str) -> tuple[Choice, Source]:
    """The winner (ready to run) and the decision's source: the nearest shape's mapping, else the fastest
    ok record that still builds, else (cache_only) the fallback; every candidate failed: NoValidChoicesError."""
    records = found.records
    for choice in candidates:
        if choice.hash_key in records:
            choice.use_record(records[choice.hash_key].info)
    if found.agreed is not None:
        return _ready(found.agreed), "agreed"
    ranked, found.displaced = rank(candidates, records, statistic)
    winner = found.nearest[0] if found.nearest is not None else _first_that_builds(ranked)
    source = found.source
    if winner is None:
        if source != "cache_only":
            reasons = {c.name: f"{records[c.hash_key].status}: {records[c.hash_key].error}".strip()
                       for c in candidates if c.hash_key in records}
            raise NoValidChoicesError(f"no valid choice for {name}({', '.join(sizes)}); every candidate failed",
                                      reasons)
        winner, source = _ready(_fallback(candidates)), "fallback"
    return winner, source


@contextlib.contextmanager
def _measuring(name: str, key: str) -> Iterator[None]:
    """Hold the selection's cross-process lock while measuring, so N processes tuning one key at once
    measure it once (the others then read its records) and never time their kernels against each other.

    A lock that cannot be had (a read-only cache, a holder stuck past lock_timeout_s) only costs the
    exclusion: the selection is measured anyway.
    """
    path = config.get_path("cache_dir") / "locks" / "select" / f"{key}.lock"
    timeout = config.get_float("lock_timeout_s")
    with contextlib.ExitStack() as held:
        try:
            try:
                held.enter_context(file_lock(path, 0))
            except LockTimeout:
                log.info("%s: waiting for another process measuring the same selection", name)
                held.enter_context(file_lock(path, timeout))
        except LockTimeout:
            log.warning("%s: another process has been measuring the same selection for %g s "
                        "(lock_timeout_s); measuring here too", name, timeout)
        except OSError as exc:
            log.debug("%s: no selection lock (%s); measuring without it", name, exc)
        yield


def _fallback(candidates: Sequence[Choice]) -> Choice:
    """What runs untuned: the first library call, else the first candidate."""
    if not candidates:  # a template space alone, nothing of it recorded yet
        raise NoValidChoicesError("nothing to run untuned: no library call among the choices, and no configuration "
                                  "of the template space was tuned yet; add an ExternChoice of the library call")
    return next((c for c in candidates if c.is_extern), candidates[0])


def _degraded(name: str, sizes: Sequence[str], key: str, candidates: Sequence[Choice], exc: Exception) -> Selection:
    """The fallback choice, untuned, after a failure of tuning itself (not of a candidate): one warning,
    nothing recorded, and memoised, so this process neither retries nor warns again."""
    memo_key = (key, frozenset(c.hash_key for c in candidates))
    with _memo_lock:
        hit = _memo.get(memo_key)
    if hit is not None:
        return Selection(hit, key, "memo")
    fallback = _fallback(candidates)
    log.warning("%s(%s): tuning failed (%s); using %s untuned, nothing recorded", name, ", ".join(sizes),
                error_text(exc), fallback.name)
    winner = _ready(fallback)
    with _memo_lock:
        _memo[memo_key] = winner
    return Selection(winner, key, "fallback")


def _map_decision(found: Nearest, candidates: Sequence[Choice], statistic: str) -> Choice | None:
    """The candidate most like the winner at the nearest shape: same family, most parameters equal."""
    ok = [r for r in found.records if r.status == "ok" and r.time(statistic) is not None]
    if not ok:
        return None
    best = min(ok, key=lambda r: (r.time(statistic), r.choice))
    family = best.info.get("family")
    scored = [(sum(1 for k, v in c.params.items() if best.params.get(k) == v), -i, c)
              for i, c in enumerate(candidates) if c.family == family]
    if not scored:
        return None
    return _first_that_builds([c for _, _, c in sorted(scored, key=lambda t: (t[0], t[1]), reverse=True)])


def _first_that_builds(ranked: Sequence[Choice]) -> Choice | None:
    for choice in ranked:
        try:
            return _ready(choice)
        except Exception as exc:  # e.g. the compiler went away since the record was written
            log.warning("recorded winner %s no longer builds (%s); trying the next", choice.name, exc)
    return None


def _infer_out_spec(ref: Choice, values: list[Any]) -> TensorSpec:
    """Run the reference once on example inputs without an output buffer and describe what it returns."""
    try:
        result = _ready(ref).run([*values, None])
    except Exception as exc:
        raise NoValidChoicesError(f"cannot tell the output layout: the reference {ref.name} failed with out=None; "
                                  "fix it or pass out= (an array or a TensorSpec) to select()",
                                  {ref.name: error_text(exc)}) from exc
    if result is None:
        raise NoValidChoicesError(f"cannot tell the output layout: {ref.name} returned None with out=None; "
                                  "pass out= (an array or a TensorSpec) to select()")
    return TensorSpec.of(result)


def clear_memo() -> None:
    """Forget in-process decisions (the record database keeps them)."""
    with _memo_lock:
        _memo.clear()
