"""tuneforge.gemm on CPU torch tensors: zero-copy views for the kernels, torch.matmul as a candidate."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="CPU torch tensors need torch")

import torch

import tuneforge
from tuneforge.kernels.gemm import clear_dispatch, op
from tuneforge.kernels.gemm.space import Problem
from tuneforge.store.default import default_records
from tuneforge.tune.select import clear_memo

from .conftest import run_python


@pytest.fixture(autouse=True)
def fresh(cache_dir: Path) -> None:
    clear_memo()
    clear_dispatch()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gemm_on_cpu_tensors_writes_into_the_tensor(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    a, b = torch.randn(33, 20, dtype=dtype), torch.randn(20, 17, dtype=dtype)
    out = torch.full((33, 17), float("nan"), dtype=dtype)
    assert tuneforge.gemm(a, b, out) is out
    torch.testing.assert_close(out, a @ b)
    made = tuneforge.gemm(a, b)  # allocated: a tensor, like the inputs
    assert isinstance(made, torch.Tensor) and made.dtype == dtype
    torch.testing.assert_close(made, a @ b)
    bias, c = torch.randn(17, dtype=dtype), torch.randn(33, 17, dtype=dtype)
    expected = 0.5 * (a @ b) + 2.0 * c + bias
    tuneforge.gemm(a, b, c, alpha=0.5, beta=2.0, bias=bias)
    torch.testing.assert_close(c, expected)


def test_strided_views_are_taken_as_they_are() -> None:
    base = torch.randn(40, 60)
    a, b = base[:30:2, :20], base[:20, 10:50].t().contiguous().t()  # every other row; column-major
    out = torch.empty(15, 40)
    tuneforge.gemm(a, b, out)
    torch.testing.assert_close(out, a @ b)


def test_torch_matmul_is_a_candidate_for_tensors_only() -> None:
    names = [c.name for c in op.choices(Problem(64, 64, 64, "float32"), library="torch")[:2]]
    assert names == ["numpy_matmul", "torch_matmul"]
    assert "torch_matmul" not in [c.name for c in op.choices(Problem(64, 64, 64, "float32"))]
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    tuneforge.gemm(a, b)
    tuned = {r.choice_name for r in default_records().records()}
    assert "torch_matmul" in tuned and {r.op for r in default_records().records()} == {"gemm_torch"}


def test_the_library_extern_computes_the_epilogue() -> None:
    from tuneforge.kernels.gemm.torch_cpu import torch_gemm

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 7)), rng.standard_normal((7, 3))
    bias, out = rng.standard_normal(3), np.full((5, 3), np.nan)
    torch_gemm(a, b, 2.0, 0.0, bias, out)
    np.testing.assert_allclose(out, 2.0 * (a @ b) + bias)
    before = out.copy()
    torch_gemm(a, b, 1.0, 0.5, None, out)
    np.testing.assert_allclose(out, a @ b + 0.5 * before)


def test_bad_tensors_name_the_argument() -> None:
    a = torch.randn(4, 4)
    with pytest.raises(ValueError, match=r"requires grad; pass b\.detach\(\)"):
        tuneforge.gemm(a, torch.randn(4, 4, requires_grad=True))
    with pytest.raises(TypeError, match="b must be one too"):
        tuneforge.gemm(a, np.ones((4, 4), np.float32))
    with pytest.raises(ValueError, match="float32 and float64; a is torch.float16"):
        tuneforge.gemm(a.half(), a.half())
    with pytest.raises(ValueError, match="beta != 0 needs an out tensor"):
        tuneforge.gemm(a, a, beta=1.0)


def test_numpy_callers_never_import_torch(cache_dir: Path) -> None:
    out = run_python("""
        import sys
        import numpy as np
        import tuneforge
        tuneforge.gemm(np.ones((8, 8), np.float32), np.ones((8, 8), np.float32))
        print("torch" in sys.modules)
    """).stdout
    assert out.strip().splitlines()[-1] == "False"
