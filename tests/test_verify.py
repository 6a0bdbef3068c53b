"""The verification tolerances: loose enough for rounding, tight enough to catch a wrong kernel.

A choice is only as trustworthy as this check: an error of 1e-3 relative in float64 or 5e-2 in
float32 (a wrong accumulator type, a dropped term, a bad blocking) must be rejected, while the rounding
differences of summing a long reduction (a GEMM's K = 4096) in another order must pass.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from tuneforge.tune import verify
from tuneforge.tune.verify import changed, compare, tolerances

RELATIVE_ERROR_REJECTED = {"float64": 1e-3, "float32": 5e-2}


def gemm(dtype: str, k: int, seed: int = 0) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """(A, B) of a GEMM with standard normal entries, so C's entries are about sqrt(k) in size."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((48, k)).astype(dtype), rng.standard_normal((k, 24)).astype(dtype)


def sequential_product(a: np.ndarray[Any, Any], b: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """A @ B summed one term after another in the working precision: the most rounding a correct kernel
    accumulates (blocked and pairwise sums, like numpy's, accumulate less)."""
    terms = a[:, :, None] * b[None, :, :]
    result: np.ndarray[Any, Any] = np.cumsum(terms, axis=1, dtype=a.dtype)[:, -1, :]
    return result


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_relative_error_everywhere_is_rejected(dtype: str) -> None:
    a, b = gemm(dtype, 256)
    want = a @ b
    problem = compare(want * (1 + RELATIVE_ERROR_REJECTED[dtype]), want)
    assert problem is not None and "wrong result" in problem


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_relative_error_in_one_element_is_rejected(dtype: str) -> None:
    a, b = gemm(dtype, 256)
    want = a @ b
    scale = float(np.abs(want).max())
    # Every element that is not tiny next to the largest: an error there is not rounding noise.
    candidates = np.argwhere(np.abs(want) >= 0.01 * scale)
    for index in map(tuple, candidates[:: max(1, len(candidates) // 25)]):
        got = want.copy()
        got[index] *= 1 + RELATIVE_ERROR_REJECTED[dtype]
        problem = compare(got, want)
        assert problem is not None, (index, want[index])
        assert f"{tuple(int(i) for i in index)}" in problem  # the message points at the element


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("k", [16, 1024, 4096])
def test_rounding_of_a_long_reduction_in_another_order_is_accepted(dtype: str, k: int) -> None:
    a, b = gemm(dtype, k)
    want = a @ b
    assert compare(sequential_product(a, b), want) is None
    exact = (a.astype(np.float64) @ b.astype(np.float64)).astype(dtype)
    assert compare(exact, want) is None
    assert compare(want, exact) is None


def test_default_tolerances_by_dtype() -> None:
    assert tolerances("float64") < (1e-6, 1e-6)  # far below the rejected 1e-3
    assert tolerances("float32") < (1e-3, 1e-3)
    assert tolerances(np.float32) == tolerances(np.dtype("float32")) == tolerances("torch.float32") == \
        tolerances("float32")
    assert tolerances("int64") == (0.0, 0.0) and tolerances("bool") == (0.0, 0.0)


def test_integers_must_match_exactly() -> None:
    want = np.arange(10, dtype=np.int64)
    got = want.copy()
    got[7] += 1
    assert compare(want.copy(), want) is None
    assert compare(got, want) == "wrong result at index (7,): got 8, expected 7 (exact match required)"


def test_non_finite_values_must_match() -> None:
    want = np.ones(4)
    assert compare(want, want.copy()) is None
    left_unwritten = np.array([1.0, np.nan, 1.0, 1.0])
    problem = compare(left_unwritten, want)
    assert problem is not None and "non-finite value mismatch at index (1,)" in problem
    assert compare(np.array([1.0, np.inf]), np.array([1.0, np.inf])) is None


def test_shape_mismatch_is_rejected() -> None:
    assert compare(np.ones(3), np.ones(4)) == "output shape (3,) differs from the reference's (4,)"


def test_explicit_tolerances_override_the_defaults() -> None:
    want = np.linspace(1.0, 2.0, 8)
    off = want * (1 + 1e-3)
    assert compare(off, want) is not None
    assert compare(off, want, rtol=1e-2) is None
    assert compare(want + 0.05, want, rtol=0.0, atol=0.01) is not None  # atol scales with max |want| = 2
    assert compare(want + 0.01, want, rtol=0.0, atol=0.01) is None


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_complex_results_are_compared_with_their_imaginary_parts(dtype: str) -> None:
    want = (np.arange(1, 9) + 1j * np.arange(1, 9)).astype(dtype)
    assert compare(want.copy(), want) is None
    assert compare(want.conj(), want) is not None


def test_changed_inputs_are_found_by_their_bytes_or_values() -> None:
    """A write anywhere into an input is seen: contiguous arrays are compared byte for byte, others by value;
    an untouched input holding NaN is unchanged."""
    big = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
    saved = big.copy()
    assert changed([big], [saved], [0]) == []
    big[1023, 1023] += 1.0  # the very last element
    assert changed([big], [saved], [0]) == [0]
    strided = np.arange(20.0)[::2]  # not contiguous: compared by value
    assert changed([strided], [strided.copy()], [0]) == []
    strided[3] = -1.0
    assert changed([strided], [np.arange(20.0)[::2].copy()], [0]) == [0]
    nan = np.full(5, np.nan)
    assert changed([nan, None], [nan.copy(), None], [0, 1]) == []


# --- torch tensors on a GPU are compared where they live (the same test, computed by torch) -------------------


def _verdicts(got: Any, want: Any, rtol: float, atol: float) -> tuple[bool, bool]:
    """(the host's verdict, the device path's verdict) on the same pair; the device path runs on CPU tensors."""
    torch = pytest.importorskip("torch")
    host = verify.compare(got, want, rtol=rtol, atol=atol) is None
    device = verify._compare_on_device(torch.from_numpy(got), torch.from_numpy(want), rtol, atol) is None
    return host, device


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
@pytest.mark.parametrize("error", [0.0, 1e-6, 1e-3, 1e-1, float("nan"), float("inf")])
def test_the_device_comparison_agrees_with_the_hosts(dtype: str, error: float) -> None:
    rng = np.random.default_rng(7)
    want = rng.standard_normal((37, 53)).astype(dtype)
    got = want.copy()
    got[11, 17] = (got[11, 17] + error) if np.isfinite(error) else error
    rtol, atol = verify.tolerances(dtype)
    host, device = _verdicts(got, want, rtol, atol)
    assert host == device


def test_the_device_comparison_names_the_problem() -> None:
    torch = pytest.importorskip("torch")
    want = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    wrong = want.clone()
    wrong[2, 1] += 5
    assert "at index (2, 1) got 14.0, expected 9.0" in verify._compare_on_device(wrong, want, 1e-4, 1e-5)
    unwritten = want.clone()
    unwritten[1, 3] = float("nan")
    assert "non-finite value mismatch at index (1, 3)" in verify._compare_on_device(unwritten, want, 1e-4, 1e-5)
    ints = torch.arange(6).reshape(2, 3)
    off = ints.clone()
    off[1, 0] = 9
    assert "index (1, 0)" in verify._compare_on_device(off, ints, 0.0, 0.0)
    assert verify._compare_on_device(ints, ints.clone(), 0.0, 0.0) is None
    assert "shape" in verify._compare_on_device(want[:2], want, 1e-4, 1e-5)


@pytest.mark.gpu
def test_cuda_outputs_and_inputs_are_checked_on_the_gpu() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    want = torch.randn(1024, 1024, device="cuda", dtype=torch.float16)
    assert verify.compare(want.clone(), want) is None
    wrong = want.clone()
    wrong[1000, 3] += 100
    assert "index (1000, 3)" in (verify.compare(wrong, want) or "")
    saved = verify.snapshot([want, wrong])
    wrong[0, 0] = float("nan")
    assert verify.changed([want, wrong], saved, [0, 1]) == [1]


@pytest.mark.parametrize("block", [7, 64, 1 << 17])
@pytest.mark.parametrize("dtype", ["float64", "float32", "float16", "complex128"])
@pytest.mark.parametrize("shape", [(300, 50), (5, 7, 40), (1000,)])
def test_blocked_comparison_agrees_with_the_whole_array_test(monkeypatch: pytest.MonkeyPatch, block: int,
                                                             dtype: str, shape: tuple[int, ...]) -> None:
    """Blocks of any size (the scratch buffers reused from block to block, the last block shorter) find what the
    whole-array test |got - want| <= atol * max|want| + rtol * |want| finds, and point at the worst element."""
    monkeypatch.setattr(verify, "_BLOCK_ELEMENTS", block)
    rng = np.random.default_rng(block + len(shape))
    want = rng.standard_normal(shape).astype(dtype)
    if dtype.startswith("complex"):
        want = want + 1j * rng.standard_normal(shape)
    rtol, atol = tolerances(dtype)
    assert compare(want.copy(), want) is None
    last = tuple(s - 1 for s in shape)  # in the last block
    for where in (last, tuple(s // 2 for s in shape)):
        got = want.copy()
        got[where] = want[where] * 1.5 + 1
        wide = np.complex128 if dtype.startswith("complex") else np.float64
        error = np.abs(got.astype(wide) - want.astype(wide)) - rtol * np.abs(want.astype(wide))
        assert error.max() > atol * max(float(np.abs(want).max()), 1.0)  # the whole-array test rejects it
        problem = compare(got, want)
        assert problem is not None and f"at index {tuple(int(i) for i in where)}" in problem, problem
    got = want.copy()
    got[last] = np.nan
    problem = compare(got, want)
    assert problem is not None and f"non-finite value mismatch at index {last}" in problem


def test_the_scratch_buffers_are_kept_per_thread_and_grow(monkeypatch: pytest.MonkeyPatch) -> None:
    """A comparison reuses its thread's scratch buffers (fresh 1 MiB ones cost a 512^2 float64 check 1.8 ms of page
    faults), grows them for a larger block, never shares them with another thread, and what a larger comparison
    left in them does not leak into a smaller one's verdict."""
    monkeypatch.setattr(verify, "_scratch", threading.local())  # none kept from the tests before
    first = verify._scratch_buffers(100, np.float64)
    again = verify._scratch_buffers(60, np.float64)
    assert again[0] is first[0] and again[1] is first[1] and first[0] is not first[1]
    grown = verify._scratch_buffers(5000, np.float64)
    assert grown[0].size >= 5000 and grown[0] is not first[0]
    assert verify._scratch_buffers(100, np.float32)[0].dtype == np.float32
    oversize = verify._scratch_buffers(verify._BLOCK_ELEMENTS + 1, np.float64)  # one very long row: not kept
    assert oversize[0].size > verify._BLOCK_ELEMENTS and verify._scratch_buffers(60, np.float64)[0] is grown[0]
    elsewhere: list[Any] = []
    thread = threading.Thread(target=lambda: elsewhere.append(verify._scratch_buffers(60, np.float64)))
    thread.start()
    thread.join()
    assert elsewhere[0][0] is not grown[0]
    rng = np.random.default_rng(3)
    large = rng.standard_normal((64, 80))
    wrong_large = large.copy()
    wrong_large[63, 79] += 100.0
    assert compare(wrong_large, large) is not None  # leaves large errors in the buffers
    small = rng.standard_normal((8, 9))
    assert compare(small.copy(), small) is None
    wrong_small = small.copy()
    wrong_small[7, 8] += 1.0
    problem = compare(wrong_small, small)
    assert problem is not None and "at index (7, 8)" in problem
