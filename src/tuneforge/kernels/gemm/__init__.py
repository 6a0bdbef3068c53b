"""The GEMM kernel family: C = alpha * A @ B + beta * C (+ bias), tuned per shape against OpenBLAS."""

from tuneforge.kernels.gemm.op import choices, clear_dispatch, gemm, gemm_into, numpy_gemm
from tuneforge.kernels.gemm.space import Problem, default_space, exhaustive_space, vector_widths

__all__ = ["Problem", "choices", "clear_dispatch", "default_space", "exhaustive_space", "gemm", "gemm_into",
           "numpy_gemm", "vector_widths"]
