from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tuneforge import config
from tuneforge.errors import NoValidChoicesError
from tuneforge.store.default import default_records, default_store
from tuneforge.tune.choices import ExternChoice
from tuneforge.tune.select import clear_memo, select, select_detailed
from tuneforge.tune.specs import TensorSpec

from . import tuning_kernels as k
from .conftest import run_python


@pytest.fixture
def tuning(cache_dir: Path) -> Iterator[Path]:
    """Fast benchmarks, an empty cache and no in-process memo."""
    clear_memo()
    with config.patch(autotune_bench_time_s=0.005, autotune_warmup_s=0.0, autotune_min_repeats=3):
        yield cache_dir
    clear_memo()


def arrays(n: int = 64, dtype: str = "float64") -> list[np.ndarray]:
    return [np.ones(n, dtype=dtype), np.ones(n, dtype=dtype)]


def test_no_choices_is_an_error(tuning: Path) -> None:
    with pytest.raises(NoValidChoicesError, match="no choices"):
        select("add", [], arrays())


def test_one_choice_is_returned_without_benchmarking(tuning: Path) -> None:
    only = ExternChoice(k.add_slow)
    selection = select_detailed("add", [only], arrays(), out=np.empty(64))
    assert selection.choice is only and selection.source == "single" and selection.benchmarked == []
    assert default_records().count() == 0


def test_fastest_valid_choice_wins_and_failures_are_recorded(tuning: Path) -> None:
    choices = [ExternChoice(k.add_slow), ExternChoice(k.add_raises), ExternChoice(k.add_wrong),
               ExternChoice(k.add_partial), ExternChoice(k.add), ExternChoice(k.add_slower),
               *k.ADD_TEMPLATE.choices([{"BODY": k.BROKEN_BODY}])]
    selection = select_detailed("add", choices, arrays(), out=np.empty(64))
    assert selection.choice.name == "add"
    status = {r.choice_name: r.status for r in default_records().get(selection.key)}
    assert status == {"add_slow": "ok", "add_raises": "runtime_error", "add_wrong": "wrong_result",
                      "add_partial": "wrong_result", "add": "ok", "add_slower": "ok", "test_add_0": "compile_error"}
    errors = {r.choice_name: r.error for r in default_records().get(selection.key)}
    assert "kernel exploded" in errors["add_raises"]
    assert "not C++" in errors["test_add_0"] or "error" in errors["test_add_0"]
    assert "wrong result" in errors["add_wrong"] and "non-finite" in errors["add_partial"]
    assert sorted(selection.benchmarked) == ["add", "add_slow", "add_slower"]


def test_all_failing_lists_every_reason(tuning: Path) -> None:
    choices = [ExternChoice(k.add_raises), *k.ADD_TEMPLATE.choices([{"BODY": k.BROKEN_BODY}])]
    with pytest.raises(NoValidChoicesError) as info:
        select("add", choices, arrays(), out=np.empty(64))
    text = str(info.value)
    assert "add_raises: runtime_error" in text and "kernel exploded" in text
    assert "test_add_0: compile_error" in text


def test_template_choice_can_win(tuning: Path) -> None:
    choices = [ExternChoice(k.add_slower), *k.ADD_TEMPLATE.choices([{"BODY": k.GOOD_BODY}])]
    winner = select("add", choices, arrays(), out=np.empty(64))
    a, b = np.arange(5.0), np.full(5, 2.0)
    out = np.zeros(5)
    winner(a, b, out)
    assert winner.name == "test_add_0" and out.tolist() == [2.0, 3.0, 4.0, 5.0, 6.0]


def test_choices_are_timed_by_their_bound_call(tuning: Path) -> None:
    # Each slow choice's `run` spends 8 ms around the work (a launcher's per-call sizes and strides, a library
    # wrapper's checks) that its bound call does once: timed by the bound call, both beat a choice that takes 4 ms
    # however it is called, and their times are the work's. Timed through `run`, both would lose to it.
    slow_run = ExternChoice(k.add_slower, name="add_bound", bind=k.bind_add)
    slow_launcher = k.BOUND_ADD_TEMPLATE.choices([{"BODY": k.GOOD_BODY}])[0]
    choices = [ExternChoice(k.add_slow), slow_run, slow_launcher]
    selection = select_detailed("add", choices, arrays(), out=np.empty(64))
    records = selection.records
    assert selection.choice.name in ("add_bound", "test_add_bound_0")
    for choice in (slow_run, slow_launcher):
        assert records[choice.hash_key].status == "ok"
        assert records[choice.hash_key].median_ms < 2.0, records[choice.hash_key]
    assert records[choices[0].hash_key].median_ms > 3.5
    out = np.zeros(64)
    slow_launcher.run([np.ones(64), np.ones(64), out])  # the launcher still serves calls: same result
    assert out.tolist() == [2.0] * 64


def test_bound_calls_of_each_kind_of_choice(tuning: Path) -> None:
    from tuneforge.tune.choices import CallableChoice

    a, b, out = np.arange(4.0), np.full(4, 2.0), np.zeros(4)
    ExternChoice(k.add).bound([a, b, out])()  # takes `out`: called with it
    assert out.tolist() == [2.0, 3.0, 4.0, 5.0]
    out[...] = 0
    ExternChoice(np.add, out=False).bound([a, b, out])()  # no `out`: its result is copied into the buffer
    assert out.tolist() == [2.0, 3.0, 4.0, 5.0]
    out[...] = 0
    CallableChoice(k.add_configured, {"label": "x"}).bound([a, b, out])()
    assert out.tolist() == [2.0, 3.0, 4.0, 5.0]
    out[...] = 0
    (template,) = k.ADD_TEMPLATE.choices([{"BODY": k.GOOD_BODY}])  # no binder: the launcher, bound
    template.build().result()
    template.bound([a, b, out])()
    assert out.tolist() == [2.0, 3.0, 4.0, 5.0]
    # what timing calls is no part of a choice's identity: its records stay its own
    assert ExternChoice(k.add, bind=k.bind_add).hash_key == ExternChoice(k.add).hash_key
    with pytest.raises(TypeError, match="bind must be callable"):
        ExternChoice(k.add, bind="np.add")  # type: ignore[arg-type]


def test_what_an_extern_choice_depends_on_is_its_identity_and_not_its_call(tuning: Path) -> None:
    one, two = ExternChoice(k.add, depends={"threads": 1}), ExternChoice(k.add, depends={"threads": 2})
    assert one.hash_key != two.hash_key  # a record timed on one thread does not answer for two
    assert ExternChoice(k.add, depends={}).hash_key == ExternChoice(k.add).hash_key
    a, b, out = np.arange(4.0), np.full(4, 2.0), np.zeros(4)
    two.bound([a, b, out])()  # k.add takes no `threads`: depends is not passed to it
    assert out.tolist() == [2.0, 3.0, 4.0, 5.0]
    slower = ExternChoice(k.add_slower)
    first = select_detailed("add", [one, slower], arrays(), out=np.empty(64))
    assert sorted(first.benchmarked) == ["add", "add_slower"]
    again = select_detailed("add", [two, slower], arrays(), out=np.empty(64))
    assert again.benchmarked == ["add"]  # measured anew, not answered by one's record (add_slower's is kept)


def test_wrong_template_is_excluded(tuning: Path) -> None:
    choices = [ExternChoice(k.add_slower), *k.ADD_TEMPLATE.choices([{"BODY": k.WRONG_BODY}])]
    selection = select_detailed("add", choices, arrays(), out=np.empty(64))
    assert selection.choice.name == "add_slower"
    assert selection.records[choices[1].hash_key].status == "wrong_result"


def test_decision_is_reused_and_new_choice_alone_is_benchmarked(tuning: Path) -> None:
    first = select_detailed("add", [ExternChoice(k.add_slow), ExternChoice(k.add_slower)], arrays(),
                            out=np.empty(64))
    assert first.source == "tuned" and sorted(first.benchmarked) == ["add_slow", "add_slower"]
    assert select_detailed("add", [ExternChoice(k.add_slow), ExternChoice(k.add_slower)], arrays(),
                           out=np.empty(64)).source == "memo"
    clear_memo()
    again = select_detailed("add", [ExternChoice(k.add_slow), ExternChoice(k.add_slower)], arrays(),
                            out=np.empty(64))
    assert again.source == "records" and again.benchmarked == [] and again.choice.name == "add_slow"
    more = select_detailed("add", [ExternChoice(k.add_slow), ExternChoice(k.add_slower), ExternChoice(k.add)],
                           arrays(), out=np.empty(64))
    assert more.benchmarked == ["add"] and more.choice.name == "add"
    fewer = select_detailed("add", [ExternChoice(k.add_slower), ExternChoice(k.add_slow)], arrays(),
                            out=np.empty(64))
    assert fewer.benchmarked == [] and fewer.choice.name == "add_slow"


def test_force_re_tunes_everything(tuning: Path) -> None:
    choices = [ExternChoice(k.add_slow), ExternChoice(k.add)]
    select("add", choices, arrays(), out=np.empty(64))
    with config.patch(autotune_force=True):
        forced = select_detailed("add", choices, arrays(), out=np.empty(64))
    assert forced.source == "tuned" and sorted(forced.benchmarked) == ["add", "add_slow"]


def test_cache_only_uses_cached_winner_or_fallback(tuning: Path) -> None:
    choices = [ExternChoice(k.add_slower), ExternChoice(k.add)]
    with config.patch(autotune_cache_only=True):
        cold = select_detailed("add", choices, arrays(), out=np.empty(64))
        assert cold.source == "fallback" and cold.choice.name == "add_slower" and cold.benchmarked == []
    assert default_records().count() == 0
    clear_memo()
    select("add", choices, arrays(), out=np.empty(64))
    clear_memo()
    with config.patch(autotune_cache_only=True):
        warm = select_detailed("add", [*choices, ExternChoice(k.add_slow)], arrays(), out=np.empty(64))
    assert warm.choice.name == "add" and warm.benchmarked == []


@pytest.mark.parametrize("change", ["dtype", "size", "stride", "offset"])
def test_layout_changes_re_tune(tuning: Path, change: str) -> None:
    choices = [ExternChoice(k.add_slow), ExternChoice(k.add)]
    base = np.ones((8, 8))
    select("add", choices, [base, base], out=np.empty((8, 8)))
    variant = {"dtype": np.ones((8, 8), dtype=np.float32), "size": np.ones((8, 9)),
               "stride": np.ones((8, 8)).T, "offset": np.ones(80)[3:67].reshape(8, 8)}[change]
    out = np.empty(variant.shape, dtype=variant.dtype)
    selection = select_detailed("add", choices, [variant, variant], out=out)
    assert selection.source == "tuned", change


def test_values_and_device_index_do_not_re_tune(tuning: Path) -> None:
    choices = [ExternChoice(k.add_slow), ExternChoice(k.add)]
    select("add", choices, [np.ones(16), np.ones(16)], out=np.empty(16))
    clear_memo()
    assert select_detailed("add", choices, [np.full(16, 7.0), np.arange(16.0)],
                           out=np.empty(16)).source == "records"
    spec = TensorSpec.of(np.ones(16))
    moved = TensorSpec(spec.dtype, spec.sizes, spec.strides, spec.offset, device="cpu", device_index=3)
    clear_memo()
    assert select_detailed("add", choices, [moved, moved], out=np.empty(16)).source == "records"


def test_input_writes_are_flagged_and_undone(tuning: Path) -> None:
    choices = [ExternChoice(k.add_slower), ExternChoice(k.add_in_place)]
    selection = select_detailed("add", choices, arrays(), out=np.empty(64))
    record = selection.records[choices[1].hash_key]
    assert record.status == "ok" and record.info["mutates_inputs"] == [0]


@pytest.mark.parametrize("writer", ["IN_PLACE_BODY", "LATER_WRITE_BODY"])
def test_writes_into_large_inputs_are_found_and_undone(tuning: Path, writer: str) -> None:
    """Inputs of 24 MB: in the benchmark worker their pages are watched for writes instead of being compared and
    copied back (input_guard.py). A kernel that writes into one on its checked run is flagged; one that writes only
    in its timed runs is still undone: the kernel after it checks and times on the inputs as they were."""
    n = 3_000_000
    bodies = [{"BODY": getattr(k, writer)}, {"BODY": k.GOOD_BODY}]
    choices = [ExternChoice(k.add_slower), *k.ADD_TEMPLATE.choices(bodies)]
    selection = select_detailed("add_large", choices, arrays(n), out=np.empty(n))
    assert selection.report.isolated
    assert all(selection.records[c.hash_key].status == "ok" for c in choices), selection.records
    flagged = selection.records[choices[1].hash_key].info.get("mutates_inputs")
    assert flagged == ([0] if writer == "IN_PLACE_BODY" else None)


def test_benchmarks_run_on_generated_inputs_not_user_data(tuning: Path) -> None:
    a, b = np.arange(16.0), np.arange(16.0)
    select("add", [ExternChoice(k.add_in_place), ExternChoice(k.add)], [a, b], out=np.empty(16))
    assert a.tolist() == list(range(16))  # untouched


def test_verbose_table_and_json_log(tuning: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tuning / "selections.jsonl"
    with config.patch(autotune_verbose=True, autotune_log=str(log)):
        select("add", [ExternChoice(k.add_slow), ExternChoice(k.add_raises), ExternChoice(k.add)],
               arrays(), out=np.empty(64))
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "AUTOTUNE add(64, 64)"
    assert err[1].startswith("  add ") and err[1].endswith(" ms 100.0% ")
    assert err[2].startswith("  add_slow ") and " ms " in err[2]
    assert err[3].startswith("  add_raises inf ms 0.0% runtime_error: RuntimeError: kernel exploded")
    assert err[4].startswith("SingleProcess AUTOTUNE benchmarking takes ") and err[4].endswith(" seconds precompiling")
    entry = json.loads(log.read_text().splitlines()[0])
    assert entry["op"] == "add" and entry["winner"] == "add" and entry["source"] == "tuned"
    assert {c["name"]: c["status"] for c in entry["choices"]}["add_raises"] == "runtime_error"
    # where the time went: the inputs and the reference's run before the trials, then checking and timing
    assert entry["setup_s"] > 0 and entry["verify_s"] > 0 and entry["bench_s"] > 0 and entry["startup_s"] == 0


def test_fresh_process_with_warm_records_builds_and_benchmarks_nothing(tuning: Path,
                                                                       wrapper_compiler: Path) -> None:
    code = """
        import json, numpy as np
        from tuneforge import config
        from tuneforge.store.default import default_store
        from tuneforge.tune.choices import ExternChoice
        from tuneforge.tune.select import select_detailed
        from tests import tuning_kernels as k
        with config.patch(autotune_bench_time_s=0.005, autotune_warmup_s=0.0):
            s = select_detailed("add", [ExternChoice(k.add_slower), *k.ADD_TEMPLATE.choices([{"BODY": k.GOOD_BODY}])],
                                [np.ones(64), np.ones(64)], out=np.empty(64))
        out = np.zeros(3); s.choice(np.ones(3), np.ones(3), out)
        import sys
        measuring = ("tuneforge.tune.measure", "tuneforge.tune.confirm", "tuneforge.tune.bench",
                     "tuneforge.search.space")
        print(json.dumps([s.choice.name, s.source, s.benchmarked, out.tolist(), default_store().stats().puts,
                          [m for m in measuring if m in sys.modules]]))
    """
    env = {"TUNEFORGE_CPP_CXX": str(wrapper_compiler)}
    first = json.loads(run_python(code, env=env).stdout)
    # Two artifacts stored: the module and the object of its bindings (compile/split_module.py).
    assert first[:5] == ["test_add_0", "tuned", ["add_slower", "test_add_0"], [2.0, 2.0, 2.0], 2]
    assert first[5][:3] == ["tuneforge.tune.measure", "tuneforge.tune.confirm", "tuneforge.tune.bench"]
    compiles = (wrapper_compiler.parent / "compiler.log").read_text().count("\n")
    # A warm start needs no -march probe (only builds do): a probe would write its result back here.
    targets = list((tuning / "toolchains").glob("*.target.json"))
    assert targets
    for probe in targets:
        probe.unlink()
    second = json.loads(run_python(code, env={**env, "TUNEFORGE_TEST_FORBID_COMPILE": "1"}).stdout)
    # ... nor the measuring machinery: a warm start's time is mostly imports
    assert second == ["test_add_0", "records", [], [2.0, 2.0, 2.0], 2, []]
    assert (wrapper_compiler.parent / "compiler.log").read_text().count("\n") == compiles
    assert list((tuning / "toolchains").glob("*.target.json")) == []


def test_example_generator_supplies_valid_values(tuning: Path) -> None:
    def take(data: np.ndarray, idx: np.ndarray, out: np.ndarray) -> None:
        np.take(data, idx, out=out)

    def take_slow(data: np.ndarray, idx: np.ndarray, out: np.ndarray) -> None:
        k.time_sleep(0.002)
        np.take(data, idx, out=out)

    def indices(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
        return rng.integers(0, 100, size=spec.sizes)

    data, idx = np.ones(100), np.zeros(10, dtype=np.int64)
    selection = select_detailed("take", [ExternChoice(take_slow), ExternChoice(take)], [data, idx],
                                out=np.empty(10), generators={1: indices})
    assert all(r.status == "ok" for r in selection.records.values())


def test_out_layout_inferred_from_reference(tuning: Path) -> None:
    selection = select_detailed("matmul", [ExternChoice(np.matmul), ExternChoice(np.dot)],
                                [np.ones((4, 3)), np.ones((3, 5))])
    assert selection.report is not None and selection.report.inputs[-1] == "float64[4x5]"
    assert os.path.exists(default_store().root.parent / "records.db")


def test_torch_tensors_select(tuning: Path) -> None:
    torch = pytest.importorskip("torch")

    def mm_slow(a: object, b: object) -> object:
        k.time_sleep(0.003)
        return torch.mm(a, b)  # type: ignore[arg-type]

    a, b = torch.ones(8, 4), torch.ones(4, 6)
    rng_state = torch.get_rng_state()
    selection = select_detailed("torch_mm", [ExternChoice(mm_slow), ExternChoice(torch.mm)], [a, b],
                                out=torch.empty(8, 6))
    assert selection.choice.name == "mm" and all(r.status == "ok" for r in selection.records.values())
    assert torch.equal(torch.get_rng_state(), rng_state)
    out = torch.empty(8, 6)
    selection.choice(a, b, out)
    assert torch.equal(out, torch.full((8, 6), 4.0))


HUGE = TensorSpec.contiguous([2**55], "float64")  # 256 PiB: more than any address space, so no swapping


def tuning_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("tuneforge") and r.levelname == "WARNING"]


@pytest.mark.parametrize("where", ["in-process", "in-process, out inferred", "isolated worker"])
def test_inputs_too_large_to_make_fall_back_with_one_warning(tuning: Path, caplog: pytest.LogCaptureFixture,
                                                             where: str) -> None:
    choices = [ExternChoice(k.add_slower), ExternChoice(k.add)]
    if where == "isolated worker":
        choices.append(k.ADD_TEMPLATE.choices([{"BODY": k.GOOD_BODY}])[0])
    out = None if where == "in-process, out inferred" else HUGE
    with caplog.at_level("WARNING"):
        first = select_detailed("add", choices, [HUGE, HUGE], out=out)
        again = select_detailed("add", choices, [HUGE, HUGE], out=out)
    assert first.choice.name == "add_slower" and first.source == "fallback"
    assert again.choice is first.choice and again.source == "memo"
    warnings = tuning_warnings(caplog)
    assert len(warnings) == 1, warnings
    assert "MemoryError" in warnings[0] and "add_slower" in warnings[0]
    assert default_records().count() == 0
    result = np.zeros(3)
    first.choice(np.ones(3), np.ones(3), result)
    assert result.tolist() == [2.0, 2.0, 2.0]


def test_a_worker_that_cannot_start_falls_back_with_one_warning(tuning: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    choices = [ExternChoice(k.add_slower), *k.ADD_TEMPLATE.choices([{"BODY": k.GOOD_BODY}])]
    with config.patch(autotune_worker_cpus=(4095,)), caplog.at_level("WARNING"):  # no such CPU: it exits at once
        selection = select_detailed("add", choices, arrays(), out=np.empty(64))
    assert selection.choice.name == "add_slower" and selection.source == "fallback"
    assert len(tuning_warnings(caplog)) == 1, tuning_warnings(caplog)
    assert default_records().count() == 0


def ones_but_killed_in_the_worker(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray[Any, Any]:
    """An example-input generator that the out-of-memory killer stops, but only in the benchmark worker."""
    if os.environ.get("TUNEFORGE_TEST_PARENT_PID") != str(os.getpid()):
        os.kill(os.getpid(), signal.SIGKILL)
    return np.ones(spec.sizes)


def test_a_worker_killed_before_any_choice_ran_records_no_crash(tuning: Path, monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    # Dying while making the inputs or running the reference is the machinery's failure: a crash record
    # for every choice would be reused by later selections as if each choice had crashed.
    monkeypatch.setenv("TUNEFORGE_TEST_PARENT_PID", str(os.getpid()))
    choices = [ExternChoice(k.add_slower), *k.ADD_TEMPLATE.choices([{"BODY": k.GOOD_BODY}])]
    with caplog.at_level("WARNING"):
        selection = select_detailed("add", choices, arrays(), out=np.empty(64),
                                    generators={0: ones_but_killed_in_the_worker})
    assert selection.choice.name == "add_slower" and selection.source == "fallback"
    warnings = tuning_warnings(caplog)
    assert len(warnings) == 1 and "before any choice ran" in warnings[0], warnings
    assert [r.status for r in default_records().records()] == []


def test_timed_runs_restore_an_accumulated_output_but_not_a_poisoned_one(tuning: Path) -> None:
    """Before each timed run, an output the choice accumulates into is set back to its initial values; a poisoned
    output (overwritten whole by any choice that passed its check) is not: copying it back cost as much as the
    run of a large GEMM."""
    seen: dict[bool, list[float]] = {False: [], True: []}

    def writer(accumulate: bool) -> Any:
        def run(a: Any, b: Any, out: Any) -> None:
            seen[accumulate].append(float(out[0]))
            if accumulate:
                out += a + b
            else:
                np.add(a, b, out=out)
        return run

    with config.patch(autotune_isolate=False):
        for accumulate in (False, True):
            choices = [ExternChoice(writer(accumulate), name="add"), ExternChoice(writer(accumulate), name="again")]
            select(f"restore-{accumulate}", choices, arrays(), out=np.ones(64), accumulate=accumulate)
    poisoned, accumulated = seen[False], seen[True]
    # the poison reaches the reference's run, its first timed run, the other choice's check and, when the two are
    # re-timed side by side (a near tie), the first run of that; every other timed run sees the previous result
    assert len(poisoned) >= 8 and 3 <= sum(np.isnan(poisoned)) <= 4, poisoned[:12]
    assert len(accumulated) >= 8 and len(set(accumulated)) == 1 and not np.isnan(accumulated[0])  # initial values
