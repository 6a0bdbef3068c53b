"""A constant B packed once (tuneforge.pack_b): every kernel configuration reads B packed whole right, on odd
shapes, several k-blocks, strided B and the epilogue; gemm(a, packed) tunes its own selection, packs once per
layout, and keeps to the snapshot it was given."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import tuneforge
from tuneforge.compile.pool import default_pool
from tuneforge.cpuinfo import cpu_info
from tuneforge.kernels.gemm import Problem, default_space, exhaustive_space
from tuneforge.kernels.gemm import packed as packed_module
from tuneforge.kernels.gemm.space import max_threads, small_m_space
from tuneforge.kernels.gemm.template import FEW_COLS, GEMV, PACKED, SMALL_M, launch_packed, pack_layout
from tuneforge.store.default import default_records
from tuneforge.tune.select import selection_key

from .test_gemm import expected, kernels_dir, operands  # noqa: F401  (kernels_dir: a module-scoped fixture)


def packed_choices(m: int, n: int, k: int, dtype: str) -> list:  # type: ignore[type-arg]
    """The default configurations, and each again with a k-block of 48 (several k-blocks, a short last one)."""
    configs = default_space(Problem(m, n, k, dtype))
    return PACKED.choices([*configs, *(dict(c, KC=48) for c in configs)])


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize(("shape", "layout"), [((1, 1, 1), "contiguous"), ((7, 33, 127), "transposed"),
                                               ((33, 127, 100), "offset"), ((127, 7, 33), "contiguous"),
                                               ((20, 130, 67), "transposed")])
def test_every_config_reads_b_packed_whole(kernels_dir: Path, shape: tuple[int, int, int], layout: str,  # noqa: F811
                                           dtype: str) -> None:
    m, n, k = shape
    a, b = operands(m, n, k, dtype, layout)
    rng = np.random.default_rng(2)
    c0, bias = rng.standard_normal((m, n)).astype(dtype), rng.standard_normal(n).astype(dtype)
    choices = packed_choices(m, n, k, dtype)
    default_pool().wait([choice.build() for choice in choices])
    tol = 2e-4 if dtype == "float32" else 1e-10
    for alpha, beta, with_bias in ((1.0, 0.0, False), (0.5, -2.0, True)):
        want = expected(a, b, alpha, beta, c0, bias if with_bias else None)
        scale = max(1.0, float(np.abs(want).max()))
        for choice in choices:
            out = c0.copy()
            launch_packed(choice.kernel(), [a, b, alpha, beta, bias if with_bias else None, out], choice.config)
            err = float(np.abs(out - want).max()) / scale
            assert err < tol, f"{choice.info} KC={choice.config['KC']}: relative error {err} for {shape} {layout}"


def test_gemm_with_a_packed_b_tunes_its_own_selection(gemm_tuning: Path) -> None:
    a, b = operands(32, 200, 300, "float32", "contiguous")
    w = tuneforge.pack_b(b)
    out = tuneforge.gemm(a, w)
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-3)
    key = selection_key("gemm_packed", [a, w.matrix, 1.0, 0.0, None, out])
    names = {r.choice_name for r in default_records().get(key)}
    assert "numpy_matmul" in names and len(names) >= 3  # the library and the kernels, timed on B packed ahead
    bias = np.arange(200, dtype=np.float32)
    c = np.ones((32, 200), dtype=np.float32)
    tuneforge.gemm(a, w, c, alpha=2.0, beta=3.0, bias=bias)
    np.testing.assert_allclose(c, 2 * (a @ b) + 3 + bias, rtol=1e-4, atol=1e-3)
    for _ in range(3):  # later calls: the prepared call, the same packs
        tuneforge.gemm(a, w, out)
    assert len(packed_module._calls) == 2


def test_each_kernel_layout_is_packed_once(gemm_tuning: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = operands(16, 64, 96, "float64", "contiguous")
    w = tuneforge.pack_b(b)
    monkeypatch.setattr(packed_module, "choices", lambda problem, space, library: PACKED.choices(
        default_space(problem)[:1]))  # a kernel must win: the only candidate
    made: list[object] = []
    real = packed_module.pack_whole
    monkeypatch.setattr(packed_module, "pack_whole", lambda *args: made.append(args) or real(*args))
    for _ in range(5):
        out = tuneforge.gemm(a, w)
    np.testing.assert_allclose(out, a @ b, rtol=1e-10, atol=1e-10)
    config = default_space(Problem(16, 64, 96, "float64"))[0]
    assert len(made) == 1 and list(w._packs) == [pack_layout(config, 8)]
    assert w.packed_bytes() >= 64 * 96 * 8


def test_a_packed_b_is_a_snapshot(gemm_tuning: Path) -> None:
    a, b = operands(8, 40, 50, "float64", "offset")
    before = b.copy()
    w = tuneforge.pack_b(b)
    b[...] = 0  # written after packing: not seen
    np.testing.assert_allclose(tuneforge.gemm(a, w), a @ before, rtol=1e-10, atol=1e-10)
    assert not w.matrix.flags.writeable
    with pytest.raises(ValueError):
        w.matrix[0, 0] = 1.0


def test_the_output_may_overlap_a(gemm_tuning: Path) -> None:
    a, b = operands(24, 24, 24, "float32", "contiguous")
    w = tuneforge.pack_b(b)
    want = a @ b
    tuneforge.gemm(a, w, a)  # out is a itself
    np.testing.assert_allclose(a, want, rtol=1e-4, atol=1e-3)


def test_bad_operands_are_named(gemm_tuning: Path) -> None:
    with pytest.raises(TypeError, match="2-D numpy array"):
        tuneforge.pack_b(np.ones(5))
    with pytest.raises(ValueError, match="float32 and float64"):
        tuneforge.pack_b(np.ones((3, 3), dtype=np.int32))
    with pytest.raises(ValueError, match="non-empty"):
        tuneforge.pack_b(np.ones((0, 3)))
    w = tuneforge.pack_b(np.ones((4, 5)))
    with pytest.raises(ValueError, match=r"A\[M,K\] and B\[K,N\]"):
        tuneforge.gemm(np.ones((3, 5)), w)
    with pytest.raises(ValueError, match="one dtype"):
        tuneforge.gemm(np.ones((3, 4), dtype=np.float32), w)
    with pytest.raises(ValueError, match="beta != 0"):
        tuneforge.gemm(np.ones((3, 4)), w, beta=1.0)


def test_the_exhaustive_space_is_offered_too() -> None:
    problem = Problem(9, 20, 30, "float32")
    few_rows = small_m_space(problem, cpu_info(), max_threads(), True)
    assert few_rows  # 9 rows: the exhaustive space's few-rows kernel
    assert len(packed_module.choices(problem, "exhaustive")) == 1 + len(list(exhaustive_space(problem))) + \
        len(few_rows)
    with pytest.raises(ValueError, match="space must be"):
        packed_module.choices(problem, "huge")


def test_the_packed_benchmark_measures_a_row(gemm_tuning: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
    import gemm_packed

    monkeypatch.setattr(gemm_packed, "ROUNDS", 1)
    row = gemm_packed.measure(8, 24, 40, "float64", "weight", with_torch=False)
    assert row["max_rel_error"] < 1e-12 and row["winner"] != "?"
    assert row["packed_gflops"] > 0 and row["numpy_gflops"] > 0 and "torch_gflops" not in row
    assert row["packed_over_unpacked"] > 0 and row["cold_s"] > 0


def test_few_columns_read_the_copy_unpacked(gemm_tuning: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A product of few columns offers the few-columns kernel, which copies B transposed itself: when it wins,
    nothing is packed either."""
    a, b = operands(60, 5, 200, "float64", "transposed")
    w = tuneforge.pack_b(b)
    few_cols = [c for c in packed_module.choices(Problem(60, 5, 200, "float64"), "default", "numpy")
                if getattr(c, "template", None) is FEW_COLS]
    assert few_cols
    monkeypatch.setattr(packed_module, "choices", lambda problem, space, library: few_cols[:1])
    out = np.empty((60, 5))
    packed_module.gemm_packed(a, w, out, 1.0, 0.0, None, "default", "numpy")
    np.testing.assert_allclose(out, a @ b, rtol=1e-12, atol=1e-12)
    assert w.packed_bytes() == 0 and not w._packs


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_few_rows_read_the_copy_unpacked(gemm_tuning: Path, monkeypatch: pytest.MonkeyPatch, library: str) -> None:
    """A GEMV-like product's selection offers the few-rows kernel, which streams the row-major copy as it is: when
    it wins, nothing is packed."""
    if library == "torch":
        pytest.importorskip("torch")
    a, b = operands(1, 300, 200, "float32", "transposed")
    w = tuneforge.pack_b(b)
    offered = packed_module.choices(Problem(1, 300, 200, "float32"), "default", library)
    few_rows = [c for c in offered if getattr(c, "template", None) in (SMALL_M, GEMV)]
    assert few_rows
    monkeypatch.setattr(packed_module, "choices", lambda problem, space, library: few_rows[:1])
    out = np.empty((1, 300), dtype=np.float32)
    bias = np.arange(300, dtype=np.float32)
    packed_module.gemm_packed(a, w, out, 2.0, 0.0, bias, "default", library)
    np.testing.assert_allclose(out, 2 * (a @ b) + bias, rtol=1e-4, atol=1e-3)
    assert w.packed_bytes() == 0 and not w._packs
