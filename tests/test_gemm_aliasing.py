"""tuneforge.gemm when `out` shares a buffer with `a`, `b` or `bias` (issue 11, item 1).

A prepared call has the element strides of its layout bound in, so whatever gemm does about an
operand that overlaps `out` (it copies it) must hand the kernel an array with exactly those strides.
Every case here is a set of views of one buffer; the expected buffer is computed by numpy from
copies made before the call, and the whole buffer is compared, so a write outside `out` or a read
of the wrong elements both show. The wide-buffer cases read megabytes past the copy (a crash)
when the strides of the original are applied to a contiguous copy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

import tuneforge
from tuneforge.kernels.gemm import dispatch, op
from tuneforge.kernels.gemm.template import SMALL_M, TEMPLATE
from tuneforge.tune.choices import Choice
from tuneforge.tune.template import KernelTemplate, TemplateChoice

Operands = tuple[np.ndarray, np.ndarray, np.ndarray, "np.ndarray | None"]  # a, b, out, bias


@dataclass(frozen=True)
class Case:
    """Views of a shared buffer `buf` (and of `other`, for operands that share nothing)."""

    name: str
    shape: tuple[int, int]  # of the shared buffer
    views: Callable[[np.ndarray, np.ndarray], Operands]
    alpha: float = 1.25
    beta: float = 0.0


OTHER = (64, 64)  # the buffer of the operands that are not shared


def fields(buf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two interleaved matrices (fields x and y of records x, y, z) over the elements of `buf`."""
    records = buf.view(np.dtype([(name, buf.dtype) for name in "xyz"]))
    return records["x"], records["y"]


def _cases() -> list[Case]:
    return [
        # a: columns of one buffer, no element in common with out (the bounds-based test still copies)
        Case("a_beside_out", (24, 56), lambda buf, o: (buf[:, :16], o[:16, :40], buf[:, 16:], None), alpha=1.0),
        Case("a_beside_out_beta", (24, 80), lambda buf, o: (buf[:, :32], o[:32, :40], buf[:, 40:], None), beta=0.5),
        Case("a_transposed_beside_out", (64, 128), lambda buf, o: (buf[:16, :24].T, o[:16, :40], buf[:24, 32:72],
                                                                  None)),
        Case("a_is_out", (24, 100), lambda buf, o: (buf[:, 10:50], o[:40, :40], buf[:, 10:50], None)),
        Case("a_is_out_beta", (24, 100), lambda buf, o: (buf[:, 10:50], o[:40, :40], buf[:, 10:50], None), beta=1.0),
        Case("a_overlaps_out", (24, 100), lambda buf, o: (buf[:, :40], o[:40, :40], buf[:, 20:60], None)),
        Case("a_reversed_overlaps_out", (24, 100), lambda buf, o: (buf[::-1, :40], o[:40, :40], buf[:, 20:60], None)),
        Case("a_beside_reversed_out", (24, 100), lambda buf, o: (buf[:, :40], o[:40, :40], buf[::-1, 50:90], None)),
        Case("a_interleaved_with_out", (24, 120), lambda buf, o: (fields(buf)[0], o[:40, :40], fields(buf)[1], None)),
        # b
        Case("b_beside_out", (64, 80), lambda buf, o: (o[:24, :64], buf[:, :40], buf[:24, 40:], None)),
        Case("b_is_out", (24, 64), lambda buf, o: (o[:24, :24], buf[:, 8:48], buf[:, 8:48], None), beta=2.0),
        Case("b_overlaps_out", (24, 100), lambda buf, o: (o[:24, :24], buf[:, :40], buf[:, 10:50], None)),
        Case("b_transposed_beside_out", (64, 128), lambda buf, o: (o[:24, :32], buf[:40, :32].T, buf[:24, 64:104],
                                                                  None)),
        Case("b_interleaved_with_out", (24, 120), lambda buf, o: (o[:24, :24], fields(buf)[0], fields(buf)[1], None),
             beta=1.0),
        # bias: a row beside out, a row of out, a strided column beside out
        Case("bias_beside_out", (24, 96), lambda buf, o: (o[:24, :16], o[16:32, :40], buf[:, :40], buf[10, 50:90])),
        Case("bias_row_of_out", (24, 64), lambda buf, o: (o[:24, :16], o[16:32, :40], buf[:, 10:50], buf[3, 10:50]),
             beta=1.0),
        Case("bias_column_beside_out", (40, 64), lambda buf, o: (o[:24, :16], o[16:32, :40], buf[:24, :40],
                                                                 buf[:, 50])),
        # all three
        Case("all_beside_out", (64, 256), lambda buf, o: (buf[:24, :32], buf[:32, 32:72], buf[:24, 80:120],
                                                          buf[40, :40]), beta=0.75),
        Case("all_overlap_out", (40, 128), lambda buf, o: (buf[:24, :40], buf[:40, 20:60], buf[:24, :40],
                                                           buf[10, 5:45]), beta=0.5),
        # wide buffers: strides of the original applied to a compact copy read ~1 MiB past its end
        Case("a_in_wide_buffer", (64, 4096), lambda buf, o: (buf[:, :64], o[:64, :40], buf[:, 64:104], None)),
        Case("b_in_wide_buffer", (64, 4096), lambda buf, o: (o[:24, :64], buf[:, :40], buf[:24, 64:104], None)),
        Case("all_in_wide_buffer", (64, 4096), lambda buf, o: (buf[:24, :64], buf[:, 100:140], buf[:24, 64:104],
                                                                buf[30, 200:240]), beta=1.0),
    ]


CASES = _cases()
TOLERANCE = {"float32": (1e-4, 1e-3), "float64": (1e-12, 1e-10)}  # (rtol, atol) over K <= 64 terms


def fill(rng: np.random.Generator, shape: tuple[int, int], dtype: str) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def expected_buffer(case: Case, buf: np.ndarray, other: np.ndarray) -> np.ndarray:
    """`buf` after the call, from copies taken now: out's elements replaced, every other element as it was."""
    a, b, out, bias = (None if x is None else x.astype(np.float64) for x in case.views(buf, other))
    assert a is not None and b is not None and out is not None
    result = case.alpha * (a @ b) + (case.beta * out if case.beta != 0 else 0.0) + (0.0 if bias is None else bias)
    expected = buf.copy()
    case.views(expected, other.copy())[2][...] = result
    return expected


def check(case: Case, dtype: str, seed: int, call: Callable[[Operands, Case], Any]) -> None:
    rng = np.random.default_rng(seed)
    buf, other = fill(rng, case.shape, dtype), fill(rng, OTHER, dtype)
    expected = expected_buffer(case, buf, other)
    operands = case.views(buf, other)
    assert any(np.may_share_memory(operands[2], x) for x in operands[:2] + operands[3:] if x is not None)
    assert call(operands, case) is operands[2]
    rtol, atol = TOLERANCE[dtype]
    np.testing.assert_allclose(buf, expected, rtol=rtol, atol=atol, err_msg=f"case {case.name}")


def through_gemm(operands: Operands, case: Case) -> Any:
    a, b, out, bias = operands
    return tuneforge.gemm(a, b, out, alpha=case.alpha, beta=case.beta, bias=bias)


def twin(case: Case, dtype: str, seed: int) -> Operands:
    """The case's layout (same shapes, strides, dtypes) with every operand in a buffer of its own."""
    rng = np.random.default_rng(seed)
    pieces = [case.views(fill(rng, case.shape, dtype), fill(rng, OTHER, dtype))[i] for i in range(4)]
    a, b, out, bias = pieces
    assert a is not None and b is not None and out is not None
    return a, b, out, bias


# Real tuning takes about a second per layout on a small machine: a few cases cover whatever wins there.
TUNED_CASES = ("a_beside_reversed_out", "b_is_out", "bias_column_beside_out", "all_overlap_out", "all_in_wide_buffer")


def run_all(dtype: str, call: Callable[[Operands, Case], Any], after: Callable[[Case], None] | None = None,
            names: Sequence[str] | None = None) -> None:
    """Every case (or those named), twice (the first call of a layout tunes and prepares it, the second
    finds it); all failures are reported together so one run names every broken case."""
    failures = []
    for i, case in enumerate(CASES):
        if names is not None and case.name not in names:
            continue
        try:
            check(case, dtype, 2 * i, call)
            check(case, dtype, 2 * i + 1, call)
            if after is not None:
                after(case)
        except AssertionError as exc:
            failures.append(f"{case.name}: {exc}")
    assert not failures, f"{len(failures)} cases wrong:\n" + "\n\n".join(failures)


def winner_of(template: KernelTemplate) -> Callable[..., Choice]:
    """A stand-in for select() that picks the first configuration of `template` (of the gemm template when
    `template` has none for this shape, else the first kernel: fewer columns than two vectors get none of the
    gemm template's): a compiled kernel answers, whatever the timings would say."""

    def pick(name: str, choices: Sequence[Choice], inputs: Sequence[Any], **kwargs: Any) -> Choice:
        kernels = [c for c in choices if isinstance(c, TemplateChoice)]
        return next((c for c in kernels if c.template is template),
                    next((c for c in kernels if c.template is TEMPLATE), kernels[0]))

    return pick


WINNERS = {"gemm_kernel": TEMPLATE, "small_m_kernel": SMALL_M, "tuned": None}


@pytest.fixture(params=list(WINNERS))
def winner(request: pytest.FixtureRequest, gemm_tuning: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    # gemm_tuning first: its clean-up (forgetting the prepared calls) then runs after the patches are undone
    template = WINNERS[request.param]
    if template is not None:
        monkeypatch.setattr(op, "select", winner_of(template))
    yield request.param


@pytest.fixture
def python_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """gemm without its C dispatcher, as in a process where it could not be built."""
    monkeypatch.setattr(dispatch, "_loaded", None)
    monkeypatch.setattr(dispatch, "load_in_background", lambda slow_path: None)
    monkeypatch.setattr(op, "_route", op._gemm_python)


@pytest.fixture
def c_path(winner: str) -> ModuleType:
    """The C dispatcher, loaded and answering (the way a process gets it: a layout called again)."""
    a = np.ones((4, 4), dtype=np.float32)
    for _ in range(2):
        tuneforge.gemm(a, a)
    module = dispatch.wait()
    assert module is not None, "the C fast path should build where a compiler is present"
    tuneforge.gemm(a, a)
    assert op._route is module.gemm
    return module


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_python_path(winner: str, python_path: None, dtype: str) -> None:
    """Without the C dispatcher: the first call of each layout tunes it, the second finds it prepared."""
    run_all(dtype, through_gemm, names=TUNED_CASES if winner == "tuned" else None)
    assert op._route is op._gemm_python and op._registered == set()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_c_fast_path(winner: str, c_path: ModuleType, dtype: str) -> None:
    """Through the C dispatcher with each case's layout registered (it hands calls whose operands overlap
    to the Python path, which must copy them as that layout was prepared)."""
    slow_calls: list[tuple[Any, ...]] = []

    def counted_slow_path(*args: Any) -> Any:
        slow_calls.append(args)
        return op._gemm_python(*args)

    def answered_in_c(case: Case) -> None:
        """The case's layout is registered: the same layout without sharing never reaches the Python path."""
        a, b, out, bias = twin(case, dtype, seed=99)
        if bias is not None and bias.strides[0] != bias.itemsize:
            return  # the C path hands a strided bias to the Python path on purpose
        before = len(slow_calls)
        assert c_path.gemm(a, b, out, case.alpha, case.beta, bias, "default") is out
        assert len(slow_calls) == before, f"case {case.name}: its layout was not registered with the C path"

    c_path.init(counted_slow_path, np.matmul)
    try:
        run_all(dtype, through_gemm, after=answered_in_c, names=TUNED_CASES if winner == "tuned" else None)
    finally:
        c_path.init(op._gemm_python, np.matmul)
    assert op._route is c_path.gemm


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_inputs_spread_over_a_vast_buffer_are_copied_compactly(gemm_tuning: Path, monkeypatch: pytest.MonkeyPatch,
                                                               python_path: None, dtype: str) -> None:
    """A copy keeping the strides of a few columns of a huge buffer would be as large as that buffer:
    such inputs are copied compactly and the call is made for the copies' own layout."""
    monkeypatch.setattr(op, "select", winner_of(TEMPLATE))
    monkeypatch.setattr(op, "_SPARSE_BYTES", 0)  # every case's inputs count as spread out now
    monkeypatch.setattr(op, "_SPARSE_RATIO", 1)
    run_all(dtype, through_gemm)


def test_copies_keep_the_layout_of_the_original() -> None:
    buf = np.arange(64 * 4096, dtype=np.float64).reshape(64, 4096)
    for view in (buf[:, :64], buf[::-1, 10:20], buf[:40:3, ::-7].T, buf[5, :], fields(buf[:, :120])[1]):
        copy = op._copy_with_strides(view)
        assert copy.strides == view.strides and copy.dtype == view.dtype and copy.flags.writeable
        assert copy.flags.aligned and not np.may_share_memory(copy, buf)
        np.testing.assert_array_equal(copy, view)
    vast = np.lib.stride_tricks.as_strided(buf, shape=(64, 64), strides=(2**30, 8))  # rows 1 GiB apart, never read
    assert op._copy_with_strides(vast) is None
