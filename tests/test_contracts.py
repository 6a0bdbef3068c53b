"""Typed contracts between the tuning modules (issue 18, part 3).

Trial events are frozen dataclasses that pickle (they cross the worker's pipe); a choice says where its
compiled code is through `record_hints()`; loaders hand the artifact key back as a value; the
`Selection.source` and `Record.status` vocabularies are Literal types; no module imports another's
underscore names.
"""

from __future__ import annotations

import ast
import dataclasses
import os
import pickle
import struct
from pathlib import Path
from typing import Any, get_args

import pytest

from tuneforge.tune import job as job_module
from tuneforge.tune.choices import ExternChoice, completed_future, failed_future, key_value
from tuneforge.tune.events import (
    ChoiceConfirmed,
    ChoiceResult,
    ChoiceStarted,
    ContextLost,
    Event,
    InputsReady,
    JobFailed,
    JobUnreadable,
    ReferenceRan,
    TrialsDone,
    WorkerEvent,
)
from tuneforge.tune.job import TrialJob
from tuneforge.tune.specs import TensorSpec
from tuneforge.tune.trials import run_trials

from . import tuning_kernels as k

SRC = Path(__file__).resolve().parents[1] / "src" / "tuneforge"


# --- public helpers instead of underscore imports ---------------------------------------------------


def test_choice_helpers_are_public() -> None:
    assert completed_future(3).result() == 3
    assert isinstance(failed_future(ValueError("no")).exception(), ValueError)
    assert key_value(1.5) == 1.5 and key_value(object).startswith("<class")  # not key material: its repr


def test_no_module_imports_another_modules_underscore_names() -> None:
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tuneforge"):
                offenders += [f"{path.relative_to(SRC)}: {node.module}.{a.name}" for a in node.names
                              if a.name.startswith("_") and not a.name.startswith("__")]
    assert offenders == []


# --- trial events ------------------------------------------------------------------------------------


def _record() -> Any:
    from tuneforge.store.records import Record

    return Record(key="k", choice="c", op="op", choice_name="add", status="ok", median_ms=1.0)


EXAMPLES = [InputsReady(True), ReferenceRan(None), ReferenceRan("ValueError: no"), ChoiceStarted(2),
            ChoiceResult(2, _record()), ChoiceConfirmed(2, _record()), TrialsDone(0.5, 1.5),
            JobUnreadable("ModuleNotFoundError: x"), JobFailed("RuntimeError: y"),
            ContextLost(2, "k", "RuntimeError: CUDA error: an illegal memory access was encountered", 0.1, 0.2)]


def test_event_kinds_are_the_union_members() -> None:
    assert set(get_args(Event)) == {InputsReady, ReferenceRan, ChoiceStarted, ChoiceResult, ChoiceConfirmed,
                                    TrialsDone}
    assert set(get_args(WorkerEvent)) == {*get_args(Event), JobUnreadable, JobFailed, ContextLost}
    assert {type(e) for e in EXAMPLES} == set(get_args(WorkerEvent))


@pytest.mark.parametrize("event", EXAMPLES, ids=lambda e: type(e).__name__)
def test_events_are_frozen_and_survive_the_pipe(event: Any) -> None:
    assert pickle.loads(pickle.dumps(event, protocol=pickle.HIGHEST_PROTOCOL)) == event
    field = dataclasses.fields(event)[0].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(event, field, None)


def _job(n: int = 64) -> TrialJob:
    spec = TensorSpec(dtype="float64", sizes=(n,), strides=(1,))
    return TrialJob(name="add", key="sel-contracts", outputs=[2], arg_specs=[spec, spec], out_spec=spec)


def test_trials_emit_typed_events_in_order(quick_tuning: Path) -> None:
    events: list[Event] = []
    choices = [ExternChoice(k.add), ExternChoice(k.add_wrong)]
    run_trials(_job(), choices, choices[0], events.append)
    kinds = [type(e) for e in events]
    assert kinds[:2] == [InputsReady, ReferenceRan] and kinds[-1] is TrialsDone
    assert events[0] == InputsReady(True) and events[1] == ReferenceRan(None)
    results = {e.index: e.record for e in events if isinstance(e, ChoiceResult)}
    assert [e.index for e in events if isinstance(e, ChoiceStarted)] == [0, 1]
    assert results[0].status == "ok" and results[1].status == "wrong_result"
    done = events[-1]
    assert isinstance(done, TrialsDone) and done.verify_s >= 0 and done.bench_s > 0


def test_a_failing_reference_is_one_typed_error_and_stand_ins(quick_tuning: Path) -> None:
    events: list[Event] = []
    run_trials(_job(), [ExternChoice(k.add)], ExternChoice(k.add_raises), events.append)
    ref = events[1]
    assert isinstance(ref, ReferenceRan) and ref.error is not None
    assert not any(isinstance(e, ChoiceStarted) for e in events)  # nothing ran unverified
    stand_in = next(e for e in events if isinstance(e, ChoiceResult))
    assert job_module.reference_failure(stand_in.record) is not None


def test_the_worker_answers_an_unreadable_job_with_a_typed_event(quick_tuning: Path) -> None:
    from tuneforge.tune.worker_process import WorkerProcess

    worker = WorkerProcess()
    worker.wait_ready()
    try:
        data = b"ctuneforge_no_such_module\nthing\n."  # a pickle naming a module the worker cannot import
        os.write(worker.proc.stdin.fileno(), struct.pack("<Q", len(data)) + data)  # type: ignore[union-attr]
        answer = worker.receive(30)
        assert isinstance(answer, JobUnreadable) and "tuneforge_no_such_module" in answer.why
    finally:
        worker.kill()


# --- record hints: the artifact round-trip lives with the choice --------------------------------------


def test_choices_without_compiled_code_have_no_hints() -> None:
    assert ExternChoice(k.add).record_hints() == {}


def test_a_template_choice_hints_where_its_code_is_once_built(cache_dir: Path) -> None:
    from tuneforge.tune.job import make_record

    from .test_record_trust import run, scale

    built = scale(3, name="contracts")
    assert built.record_hints() == {}  # nothing built yet: nothing to point at
    assert run(built) == 3.0
    hints = built.record_hints()
    assert set(hints) == {"artifact", "entry"} and hints["entry"] == "contracts"
    assert hints["artifact"].startswith("cpp")
    record = make_record(_job(), built, "ok")
    assert {name: record.info[name] for name in hints} == hints  # what the record keeps
    warm = scale(3, name="contracts")
    warm.use_record(record.info)  # the reader of the same hints
    assert run(warm) == 3.0 and warm._source is None  # loaded from the hint: no render
    assert warm.record_hints() == hints


def test_a_python_template_choice_hints_its_module(cache_dir: Path) -> None:
    from tuneforge.tune.template import KernelTemplate, TemplateChoice

    template = KernelTemplate("test_contracts_py", "def twice(x):\n    return {{ F }} * x\n", signature="twice",
                              language="python")
    choice = TemplateChoice(template, {"F": 2}, "twice")
    assert choice.run([4]) == 8
    assert choice.record_hints()["entry"] == "twice" and choice.record_hints()["artifact"].startswith("py")


# --- loaders hand the artifact key back as a value ----------------------------------------------------

KEYED_SOURCE = 'extern "C" int contracts_probe(int x) { return x + 1; }\n'


def test_load_module_keyed_returns_the_key_the_record_keeps(cache_dir: Path) -> None:
    from tuneforge.compile import cpp
    from tuneforge.store.default import default_store

    module, key = cpp.load_module_keyed(KEYED_SOURCE, functions=["int contracts_probe(int x)"])
    assert module.contracts_probe(1) == 2 and default_store().get(key) is not None
    again, same = cpp.load_module_keyed(KEYED_SOURCE, functions=["int contracts_probe(int x)"])
    assert (again, same) == (module, key)  # the in-process memo keeps the key with the module
    assert cpp.load_module(KEYED_SOURCE, functions=["int contracts_probe(int x)"]) is module
    assert module.tuneforge_key == key  # kept for users who read it


def test_python_load_keyed_returns_the_key(cache_dir: Path) -> None:
    from tuneforge.compile import python

    module, key = python.load_keyed("def f():\n    return 5\n")
    assert module.f() == 5 and key.startswith("py")
    assert python.load_keyed("def f():\n    return 5\n") == (module, key)
    assert python.load("def f():\n    return 5\n") is module and module.tuneforge_key == key


def test_tuneforge_never_reads_the_tuneforge_key_attribute() -> None:
    readers = []
    for path in sorted(SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            reads = (isinstance(node, ast.Attribute) and node.attr == "tuneforge_key"
                     and isinstance(node.ctx, ast.Load))
            if reads or (isinstance(node, ast.Constant) and node.value == "tuneforge_key"):
                readers.append(f"{path.relative_to(SRC)}:{node.lineno}")
    assert readers == []


# --- Literal vocabularies -----------------------------------------------------------------------------


def test_statuses_are_the_status_literal() -> None:
    from tuneforge.store.record import STATUSES, Record, RecordError, Status

    assert STATUSES == get_args(Status) == ("ok", "compile_error", "runtime_error", "timeout", "crash",
                                            "wrong_result")
    with pytest.raises(RecordError, match="unknown status 'lost'"):
        Record(key="k", choice="c", op="op", choice_name="n", status="lost")  # type: ignore[arg-type]


def _sources_in_select() -> set[str]:
    """Every literal select.py (and the record tiers' lookup, whose source it passes on) gives as a Selection's
    source: `source = ...` or `x.source = ...`, tuple unpacking, Selection(...), _Found(...)."""
    found: set[str] = set()

    def tuples(value: ast.expr) -> list[ast.Tuple]:
        if isinstance(value, ast.IfExp):
            return tuples(value.body) + tuples(value.orelse)
        return [value] if isinstance(value, ast.Tuple) else []

    def constant(node: ast.expr) -> None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)

    def is_source(target: ast.expr) -> bool:
        return ((isinstance(target, ast.Name) and target.id == "source")
                or (isinstance(target, ast.Attribute) and target.attr == "source"))

    positions = {"Selection": 2, "_Found": 1}  # where a source sits among a constructor's arguments
    trees = [ast.parse((SRC / "tune" / "select.py").read_text()), ast.parse((SRC / "store" / "tiers.py").read_text())]
    for node in (n for tree in trees for n in ast.walk(tree)):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                if is_source(target):
                    constant(node.value)
                elif isinstance(target, ast.Tuple):
                    at = [i for i, t in enumerate(target.elts) if is_source(t)]
                    for value, i in ((v, i) for v in tuples(node.value) for i in at):
                        constant(value.elts[i])
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in positions
              and len(node.args) > positions[node.func.id]):
            constant(node.args[positions[node.func.id]])
    return found


def test_selection_sources_are_exactly_the_source_literal() -> None:
    from tuneforge.tune.select import SOURCES, Source

    assert get_args(Source) == SOURCES
    assert _sources_in_select() == set(SOURCES)  # every value used is named, and every name is used
    assert {"remote", "bundle", "bundle-nearest"} <= set(SOURCES)
