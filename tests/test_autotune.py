from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tuneforge
from tuneforge import config
from tuneforge.errors import NoValidChoicesError
from tuneforge.store.default import default_records
from tuneforge.tune.select import clear_memo

CALLS: list[tuple[int, int]] = []


@pytest.fixture
def tuning(cache_dir: Path) -> Iterator[Path]:
    clear_memo()
    CALLS.clear()
    with config.patch(autotune_bench_time_s=0.005, autotune_warmup_s=0.0, autotune_min_repeats=2):
        yield cache_dir


def make_scale() -> Any:
    @tuneforge.autotune(configs=[{"delay": 3}, {"delay": 0}, {"delay": 6}], key=["n"])
    def scale(x: np.ndarray, out: np.ndarray, n: int, *, delay: int) -> None:
        CALLS.append((n, delay))
        if delay:  # the winner does not sleep at all: a sleep's late wake-up on a busy host is milliseconds
            time.sleep(delay / 1000)
        out[:n] = 2 * x[:n]

    return scale


def test_first_call_tunes_later_calls_dispatch(tuning: Path) -> None:
    scale = make_scale()
    x, out = np.arange(8.0), np.zeros(8)
    scale(x, out, 8)
    assert out.tolist() == (2 * np.arange(8.0)).tolist()
    assert scale.decisions[(8,)].config == {"delay": 0}
    tuned_calls = len(CALLS)
    assert {d for _, d in CALLS} == {0, 3, 6}
    CALLS.clear()
    scale(x, out, 8)
    assert CALLS == [(8, 0)]  # dispatched straight to the winner
    scale(x, out, n=4)
    assert {d for _, d in CALLS[1:]} == {0, 3, 6} and len(scale.cache) == 2  # a new key tunes again
    assert tuned_calls > 3


def test_decision_persists_across_decorators(tuning: Path) -> None:
    make_scale()(np.ones(4), np.zeros(4), 4)
    CALLS.clear()
    clear_memo()
    fresh = make_scale()  # a new process would build exactly this object
    fresh(np.ones(4), np.zeros(4), 4)
    assert CALLS == [(4, 0)]


def test_arguments_restored_after_tuning(tuning: Path) -> None:
    @tuneforge.autotune(configs=[{"k": 1}, {"k": 2}], key=["x"])
    def accumulate(x: np.ndarray, *, k: int) -> None:
        x += 1  # in place: each tuning run must start from the caller's data

    x = np.zeros(3)
    accumulate(x)
    assert x.tolist() == [1.0, 1.0, 1.0]


def test_reference_excludes_wrong_config_and_prune(tuning: Path) -> None:
    def reference(x: np.ndarray, out: np.ndarray) -> None:
        out[...] = x + 1

    @tuneforge.autotune(configs=[{"v": "wrong"}, {"v": "right"}, {"v": "pruned"}], key=["x"], reference=reference,
                        prune=lambda configs, args, kwargs: [c for c in configs if c["v"] != "pruned"])
    def plus_one(x: np.ndarray, out: np.ndarray, *, v: str) -> None:
        assert v != "pruned"
        out[...] = x + (1 if v == "right" else 2)

    out = np.zeros(5)
    plus_one(np.ones(5), out)
    assert out.tolist() == [2.0] * 5
    statuses = {r.choice_name: r.status for r in default_records().records()}
    assert statuses == {"plus_one[v=wrong]": "wrong_result", "plus_one[v=right]": "ok"}


def test_callable_key_and_bad_key_names(tuning: Path) -> None:
    @tuneforge.autotune(configs=[{"a": 1}, {"a": 2}], key=lambda x: len(x) > 10)
    def f(x: list[int], *, a: int) -> int:
        return a

    f([1, 2])
    f([3, 4, 5])
    assert len(f.cache) == 1
    with pytest.raises(ValueError, match="not parameters"):
        tuneforge.autotune(configs=[{}], key=["missing"])(lambda x: x)


def test_failing_reference_lets_no_unverified_config_win(tuning: Path) -> None:
    def reference(x: np.ndarray, out: np.ndarray) -> None:
        raise RuntimeError("reference exploded")

    @tuneforge.autotune(configs=[{"v": "slow"}, {"v": "noop"}], key=["x"], reference=reference)
    def plus_one(x: np.ndarray, out: np.ndarray, *, v: str) -> None:
        if v == "slow":
            time.sleep(0.002)
            out[...] = x + 1  # "noop" leaves out alone: the fastest, and wrong

    out = np.zeros(5)
    with pytest.raises(NoValidChoicesError, match="reference reference of .* failed") as info:
        plus_one(np.ones(5), out)
    assert "reference exploded" in str(info.value)
    assert out.tolist() == [0.0] * 5 and plus_one.cache == {}
    assert [r for r in default_records().records() if r.status == "ok"] == []


@pytest.mark.gpu
def test_a_decision_on_cuda_tensors_is_keyed_by_the_gpu(tuning: Path) -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from tuneforge.tune import fingerprint

    @tuneforge.autotune(configs=[{"factor": 2}, {"factor": 2.0}], key=["n"])
    def twice(x: Any, out: Any, n: int, *, factor: float) -> None:
        torch.mul(x, factor, out=out)

    x = torch.arange(64.0, device="cuda")
    out = torch.empty_like(x)
    twice(x, out, 64)
    torch.testing.assert_close(out, 2 * x)
    what = {"autotune_key": repr(next(iter(twice.decisions)))}
    assert default_records().keys() == [fingerprint.selection_key(twice.name, what, gpu=0)]
    assert fingerprint.selection_key(twice.name, what, gpu=0) != fingerprint.selection_key(twice.name, what)


def test_keys_are_the_same_by_position_or_by_name_and_arrays_key_by_layout() -> None:
    from tuneforge.tune.autotune import Autotuner

    def launcher(x: Any, n: int, out: Any = None, *, block: int = 1) -> None: ...

    one = Autotuner._key_function(launcher, ["n"])
    assert one((None, 8), {}) == one((None,), {"n": 8}) == (8,)
    arrays = Autotuner._key_function(launcher, ["x"])
    a = np.zeros((4, 6), dtype=np.float32)
    assert arrays((a, 8), {}) == arrays((), {"x": np.ones((4, 6), dtype=np.float32)}) == (((4, 6), "float32", (24, 4)),)
    assert arrays((a.T, 8), {}) != arrays((a, 8), {})  # another layout, another tuning
    two = Autotuner._key_function(launcher, ["n", "x"])
    assert two((a, 8), {}) == two((a,), {"n": 8}) == (8, ((4, 6), "float32", (24, 4)))
    assert one(([1, 2], [3]), {}) == ("[3]",)  # anything else by its repr
