"""What a set of trials needs, as data (TrialJob), and the records they produce.

Kept apart from the trials themselves (`trials.py`) so a selection answered from records never loads
the benchmarking machinery.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import field, replace
from typing import TYPE_CHECKING, Any, Literal

from tuneforge import config
from tuneforge.dataclass_lite import dataclass
from tuneforge.errors import TuneforgeError
from tuneforge.store.record import Status
from tuneforge.store.records import Record
from tuneforge.tune.choices import Choice
from tuneforge.tune.device import job_device, on_visible_gpu
from tuneforge.tune.fingerprint import system_fingerprint
from tuneforge.tune.sample import RowSample
from tuneforge.tune.specs import TensorSpec, example_input, zeroed

if TYPE_CHECKING:
    from tuneforge.tune.bench import Timing


@dataclass
class TrialJob:
    """Everything needed to run trials, as data: picklable when its choices and generators are.

    Either `arg_specs` (+ `out_spec`) describe arguments to generate, or `live_args` holds the caller's
    own arguments (never sent to another process).
    """

    name: str
    key: str
    outputs: list[int]
    arg_specs: list[Any] = field(default_factory=list)
    out_spec: TensorSpec | None = None
    generators: Mapping[int, Callable[..., Any]] = field(default_factory=dict)
    rtol: float | None = None
    atol: float | None = None
    poison_outputs: bool = True
    inputs_text: str = ""
    live_args: list[Any] | None = None
    sample: RowSample | None = None  # rank the choices on a sample of the problem (sample.py)
    # The most rows a choice's sample runs on (measure.py): where the reference runs on spans of rows only
    # (RowSample.independent_rows), its first span is that long before any choice runs
    sample_head: int = field(default=0, compare=False)
    # Keep the example inputs and the reference's outputs where the trials ran, for the next job of this key (a
    # search measures in batches: each would otherwise make its inputs and run its reference again)
    keep_inputs: bool = field(default=False, compare=False)
    # Made while the choices compile (setup_ahead.py): the reference's run shared the cores with the compilers, so
    # the job proper does not count it as one of the reference's timed runs (bench.benchmark_cpu's first_ns)
    ahead: bool = field(default=False, compare=False)
    # What is re-timed side by side after the trials (confirm.py): "ties" (near ties, and a narrow win over the
    # reference), "all" (every choice timed: a search's finalists) or "none" (a search's batch, which leaves it to
    # its finalists: paired rounds in every batch cost a 512^3 search 0.9 s of its 10).
    confirm: str = field(default="ties", compare=False)
    # A search's batch whose builds' costs steer the search (not its last): each build's fastest configuration is
    # timed fully, not only the fastest few of all (screening.screened_contenders).
    rank_builds: bool = field(default=False, compare=False)
    # Choices timed in an earlier batch of this selection, by hash: their records stand (checked on these very
    # inputs) and they run again only in the side-by-side re-timing (a search's finalists: a full second timing
    # of each cost a one-batch search 0.35 s of its 2; a search's batch: the best so far, whose earlier record
    # sets the level of the batch's contenders, paired.py).
    timed: Mapping[str, Record] = field(default_factory=dict, compare=False)
    # A part of a selection whose choices are sent to the worker as their builds end (streamed.py): they are
    # checked and timed briefly; their contenders are timed fully, and near ties side by side, by the selection's
    # last job, among all of its choices and once the compilers are done.
    part: bool = field(default=False, compare=False)
    # The selection's choice count when this job holds a part of them (streamed.py), else 0: whether its choices
    # are screened (timed briefly first, screening.screen_budget) is decided by the whole selection's count.
    screen_among: int = field(default=0, compare=False)
    # "cpu" or "cuda:N": where the trials run and how they are timed (see device.py). Derived from the
    # specs (or the live arguments) once, here, so arguments on two GPUs fail when the job is made.
    device: str = field(init=False, default="cpu", compare=False)

    def __post_init__(self) -> None:
        specs = [*self.arg_specs, self.out_spec] if self.live_args is None else self.live_args
        self.device = job_device(specs)

    def for_worker(self) -> TrialJob:
        """This job as the benchmark worker of its device receives it: a GPU's worker sees that GPU alone, as
        "cuda:0", so the specs point there; a CPU job is sent as it is. The key and the inputs' text were made
        here and stay: records name no device, so nothing is mapped back."""
        if self.device == "cpu":
            return self
        out_spec = on_visible_gpu(self.out_spec) if self.out_spec is not None else None
        return replace(self, arg_specs=[on_visible_gpu(s) for s in self.arg_specs], out_spec=out_spec)

    def libraries(self) -> tuple[str, ...]:
        """What the benchmark worker imports before these trials: torch where an argument is a torch tensor or the
        trials run on a GPU (its inputs need it, and importing it in the first checked run would put 2 s inside
        the selection). Not merely because this process has torch loaded: a worker importing it beside the
        builds of a numpy selection took a core from them (a cold 128^3 GEMM 3.2 -> 4.3 s)."""
        specs = [*self.arg_specs, self.out_spec]
        torch_args = any(isinstance(s, TensorSpec) and s.framework == "torch" for s in specs)
        return ("torch",) if torch_args or self.device != "cpu" else ()

    def materialize(self) -> list[Any]:
        """The arguments: the live ones, or example inputs from the specs (seeded, RNG-neutral)."""
        if self.live_args is not None:
            return self.live_args
        seed = config.get_int("autotune.seed")
        args = [example_input(s, seed=seed + i, generator=self.generators.get(i)) if isinstance(s, TensorSpec)
                else s for i, s in enumerate(self.arg_specs)]
        if self.out_spec is not None:  # poisoned before any run (trials.py): its values would be thrown away
            args.append(zeroed(self.out_spec) if self.poison_outputs else
                        example_input(self.out_spec, seed=seed + len(args)))
        return args


# Marks a record that stands for "never run: the reference failed" (info key). Such a record only carries
# the reference's error from wherever the trials ran (a worker, this process) to `measure`, which raises
# it as NoValidChoicesError and never stores it: a choice that nothing could check must neither win nor
# be excluded by a record a later selection, with a working reference, would reuse.
REFERENCE_FAILED = "reference_failed"


def error_text(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, TuneforgeError) else f"{type(exc).__name__}: {exc}"


def reference_failed_record(job: TrialJob, choice: Choice, reference: str, error: str,
                            status: Status = "runtime_error") -> Record:
    """The stand-in record of a choice left unrun because the reference `reference` failed with `error`
    (`status`: ``runtime_error`` when it raised, ``crash`` or ``timeout`` when it killed or hung the worker)."""
    return make_record(job, choice, status, error=f"not run: the reference {reference} failed: {error}",
                       info={REFERENCE_FAILED: {"reference": reference, "status": status, "error": error}})


def reference_died(job: TrialJob, choices: Sequence[Choice], reference: Choice, status: Literal["crash", "timeout"],
                   detail: str, on_record: Callable[[Record], None]) -> None:
    """The reference crashed (`detail`: how the worker ended) or hung (`detail`: the limit) the worker:
    each choice gets the stand-in record that fails the selection (nothing could be verified)."""
    error = (f"the reference crashed the benchmark worker ({detail})" if status == "crash" else
             f"the reference did not finish within {detail} (autotune.bench_timeout_s); the worker was killed")
    for choice in choices:
        on_record(reference_failed_record(job, choice, reference.name, error, status))


def reference_failure(record: Record) -> tuple[str, str] | None:
    """(reference name, "status: its error") when `record` is a reference_failed_record, else None."""
    mark = record.info.get(REFERENCE_FAILED)
    if isinstance(mark, dict):
        return str(mark.get("reference", "")), f"{mark.get('status', 'runtime_error')}: {mark.get('error', '')}"
    return None


def _jsonable(params: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v if isinstance(v, (int, float, str, bool, type(None))) else repr(v) for k, v in params.items()}


def args_signature(job: TrialJob) -> list[list[Any]]:
    """Each argument as [dtype, sizes] (scalars as ["scalar:<type>", []]): what "nearest shape" compares."""
    specs = [*job.arg_specs, *([job.out_spec] if job.out_spec is not None else [])]
    return [[s.dtype, list(s.sizes)] if isinstance(s, TensorSpec) else [f"scalar:{type(s).__name__}", []]
            for s in specs]


def make_record(job: TrialJob, choice: Choice, status: Status, *, timing: Timing | None = None, error: str = "",
                info: Mapping[str, Any] | None = None) -> Record:
    stats: dict[str, Any] = {}
    if timing is not None:
        stats = {"median_ms": timing.median_ms, "min_ms": timing.min_ms, "mean_ms": timing.mean_ms,
                 "p20_ms": timing.p20_ms, "p80_ms": timing.p80_ms, "count": timing.count, "method": timing.method}
    # Where a compiled choice's code is, so a later selection loads it without a render (see use_record).
    extra: dict[str, Any] = {"family": choice.family, **choice.record_hints()}
    if job.live_args is None:
        extra["args"] = args_signature(job)
    return Record(key=job.key, choice=choice.hash_key, op=job.name, choice_name=choice.name, status=status,
                  error=error[:20000], params=_jsonable(choice.params), inputs=job.inputs_text,
                  system=system_fingerprint()["hash"], info={**extra, **(info or {})}, **stats)
