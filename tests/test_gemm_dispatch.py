"""tuneforge.gemm's C fast path: registered layouts, what it refuses, and that refusals stay correct."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import tuneforge
from tuneforge.kernels.gemm import clear_dispatch, dispatch, op


@pytest.fixture
def fast(gemm_tuning: Path) -> ModuleType:
    """The dispatcher, after one tuned call has loaded it."""
    a = np.ones((4, 4), dtype=np.float32)
    tuneforge.gemm(a, a)  # tunes
    tuneforge.gemm(a, a)  # a repeated layout: starts loading the dispatcher in the background
    module = dispatch.wait()
    assert module is not None, "the C fast path should build where a compiler is present"
    tuneforge.gemm(a, a)  # and once it is there, the layout is registered on the Python path's next hit
    assert module.size() == 1 and op._route is module.gemm
    return module


def rand(*shape: int, dtype: str = "float32", seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def test_tuned_layouts_take_the_c_path(fast: ModuleType) -> None:
    assert op._route is fast.gemm
    before = fast.size()
    a, b = rand(33, 17), rand(17, 9, seed=1)
    np.testing.assert_allclose(tuneforge.gemm(a, b), a @ b, rtol=1e-4, atol=1e-4)  # tunes, registers
    assert fast.size() == before + 1
    out = np.empty((33, 9), dtype=np.float32)
    for seed in range(3):  # later calls: same layout, new data, answered by the registered call
        a, b = rand(33, 17, seed=seed), rand(17, 9, seed=seed + 7)
        assert tuneforge.gemm(a, b, out) is out
        np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)
    bias, c = rand(9, seed=5), rand(33, 9, seed=6)
    expected = 0.5 * (a @ b) + 2 * c + bias
    tuneforge.gemm(a, b, c, alpha=0.5, beta=2, bias=bias)  # a variant of its own: tuned, then fast
    np.testing.assert_allclose(c, expected, rtol=1e-4, atol=1e-4)
    c2 = rand(33, 9, seed=6)
    tuneforge.gemm(a, b, c2, alpha=0.5, beta=2, bias=bias)
    np.testing.assert_allclose(c2, expected, rtol=1e-4, atol=1e-4)


def registered_kernel(fast: ModuleType, a: np.ndarray, b: np.ndarray, out: np.ndarray, beta: float,
                      bias: Any) -> None:
    """Register the first default-space kernel for this layout, whatever select() would choose."""
    from tuneforge.kernels.gemm.space import Problem, default_space
    from tuneforge.kernels.gemm.template import TEMPLATE, runtime_args

    choice = TEMPLATE.choices(default_space(Problem(a.shape[0], b.shape[1], a.shape[1], a.dtype.name)))[0]
    kernel = choice.kernel()
    params = runtime_args(choice.config)
    assert fast.register(a, b, out, beta, bias, "default", dispatch.KERNEL, kernel, dispatch.kernel_address(kernel),
                         params)


def test_kernel_entries_call_the_compiled_code_directly(fast: ModuleType) -> None:
    a, b, c = rand(20, 30, dtype="float64"), rand(30, 10, dtype="float64", seed=1), rand(20, 10, dtype="float64")
    bias = rand(10, dtype="float64", seed=2)
    registered_kernel(fast, a, b, c, 1.0, bias)
    calls = []
    fast.init(lambda *args: calls.append(args), np.matmul)  # any fall-back would show up here
    try:
        c0 = c.copy()
        assert fast.gemm(a, b, c, 1.5, 1.0, bias, "default") is c
        np.testing.assert_allclose(c, 1.5 * (a @ b) + c0 + bias, rtol=1e-12)
        assert calls == []
        c0 = c.copy()
        fast.gemm(a, b, c, np.float64(0.5), 2, bias, "default")  # numpy.float64 and int scalars are taken too
        np.testing.assert_allclose(c, 0.5 * (a @ b) + 2 * c0 + bias, rtol=1e-12)
        assert calls == []
        fast.gemm(a, b, c, 1.0, 1.0, bias[::-1].copy()[::-1], "default")  # negative-stride bias: refused
        fast.gemm(a, b, c, np.float32(1.0), 1.0, bias, "default")  # a float32 scalar: the Python path
        assert len(calls) == 2
    finally:
        fast.init(op._gemm_python, np.matmul)


def test_library_and_python_entries(fast: ModuleType) -> None:
    a, b, out = rand(5, 6), rand(6, 7, seed=1), np.empty((5, 7), dtype=np.float32)
    seen: list[tuple[Any, ...]] = []

    def python_call(alpha: float, beta: float, a: Any, b: Any, out: Any, bias: Any) -> None:
        seen.append((alpha, beta))
        out[...] = alpha * (a @ b)

    assert fast.register(a, b, out, 0.0, None, "exhaustive", dispatch.CALL, python_call, 0, ())
    assert fast.gemm(a, b, out, 2, 0, None, "exhaustive") is out
    np.testing.assert_allclose(out, 2 * (a @ b), rtol=1e-5)
    assert seen == [(2, 0)]
    assert fast.register(a, b, out, 0.0, None, "default", dispatch.LIBRARY, python_call, 0, ())
    fast.gemm(a, b, out, 1.0, 0.0, None, "default")  # the plain case goes to numpy.matmul itself
    assert len(seen) == 1
    np.testing.assert_allclose(out, a @ b, rtol=1e-5)
    fast.gemm(a, b, out, 3.0, 0.0, None, "default")  # with an epilogue: the prepared call
    assert seen[-1] == (3.0, 0.0)


def test_register_refuses_what_it_cannot_key(fast: ModuleType) -> None:
    a = rand(3, 3)
    assert not fast.register(a, a, a, 0.0, None, "fastest", dispatch.CALL, print, 0, ())  # unknown space
    assert not fast.register(a.tolist(), a, a, 0.0, None, "default", dispatch.CALL, print, 0, ())
    with pytest.raises(ValueError, match="needs its address"):
        fast.register(a, a, a, 0.0, None, "default", dispatch.KERNEL, print, 0, (1, 1, 1, 1, 0))
    with pytest.raises(ValueError, match="kind must be"):
        fast.register(a, a, a, 0.0, None, "default", 7, print, 0, ())


@pytest.mark.parametrize("winner", ["tuned", "kernel"])
def test_overlapping_output_is_computed_from_the_inputs_as_they_were(fast: ModuleType, winner: str) -> None:
    a, b = rand(64, 64), rand(64, 64, seed=1)
    expected = a @ b
    tuneforge.gemm(rand(64, 64, seed=2), b)  # tune this layout first
    if winner == "kernel":  # whatever won, a compiled kernel now answers this layout
        registered_kernel(fast, a, b, np.empty_like(a), 0.0, None)
    assert tuneforge.gemm(a, b, out=b) is b  # B's rows would be overwritten while still needed
    np.testing.assert_allclose(b, expected, rtol=1e-4, atol=1e-4)
    c, b = rand(64, 64, seed=3), rand(64, 64, seed=4)
    expected = c @ b + c
    tuneforge.gemm(c, b, out=c, beta=1.0)
    np.testing.assert_allclose(c, expected, rtol=1e-4, atol=1e-4)


def test_read_only_output_and_odd_bias(fast: ModuleType) -> None:
    a, b = rand(8, 12), rand(12, 16, seed=1)
    out = np.empty((8, 16), dtype=np.float32)
    tuneforge.gemm(a, b, out)
    out.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        tuneforge.gemm(a, b, out)
    strided = rand(32, seed=4)[::2]  # a bias view with stride 2: the kernels read it as a copy
    result = tuneforge.gemm(a, b, bias=strided)
    np.testing.assert_allclose(result, a @ b + strided, rtol=1e-4, atol=1e-4)
    result = tuneforge.gemm(a, b, bias=strided.copy())
    np.testing.assert_allclose(result, a @ b + strided, rtol=1e-4, atol=1e-4)


def test_clear_forgets_every_layout(fast: ModuleType) -> None:
    assert fast.size() > 0
    clear_dispatch()
    assert fast.size() == 0 and op._dispatch == {}
    a = rand(4, 4)
    np.testing.assert_allclose(tuneforge.gemm(a, a), a @ a, rtol=1e-5)  # from the records again
    assert fast.size() == 1


def test_a_forked_child_may_load_the_dispatcher_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    import os
    import threading

    monkeypatch.setattr(dispatch, "_loaded", None)
    monkeypatch.setattr(dispatch, "_loader", threading.Thread(target=lambda: None))  # "in flight" at the fork
    pid = os.fork()
    if pid == 0:  # the child: the parent's load has no thread here, so it must be free to start its own
        os._exit(0 if dispatch._loader is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert dispatch._loader is not None  # the parent is untouched


def test_the_dispatcher_learns_numpys_tuned_time_relative_to_the_winner(cache_dir: Path) -> None:
    """A kernel whose threads would share cores hands its calls to numpy only while numpy would be faster: until
    both have been seen so, numpy's tuned time over the winner's, read from the selection's records, says."""
    from tuneforge.kernels.gemm import op
    from tuneforge.kernels.gemm.space import Problem
    from tuneforge.store.default import default_records
    from tuneforge.tune.select import selection_key

    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((48, 40)), rng.standard_normal((40, 56))
    out = np.empty((48, 56))
    tuneforge.gemm(a, b, out)
    candidates = op.choices(Problem(48, 56, 40, "float64"))
    args = [a, b, 1.0, 0.0, None, out]
    medians = {r.choice: r.median_ms for r in default_records().get(selection_key("gemm", args))}
    library = candidates[0]
    assert library.name == "numpy_matmul" and medians.get(library.hash_key)
    timed = [c for c in candidates[1:] if medians.get(c.hash_key)]
    assert timed, "no kernel was timed"
    for choice in timed:
        expected = medians[library.hash_key] / medians[choice.hash_key]
        assert op._library_ratio("gemm", args, candidates, choice) == pytest.approx(expected)
    assert op._library_ratio("gemm", args, candidates[1:], timed[0]) == 0.0  # no numpy candidate: not known
