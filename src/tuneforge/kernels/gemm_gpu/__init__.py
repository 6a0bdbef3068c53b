"""Triton GEMM kernels (mm and split-K, bias/beta/activation epilogues) and their configuration spaces."""

from tuneforge.kernels.gemm_gpu.render import (
    ACTIVATIONS,
    DTYPES,
    GRIDS,
    Config,
    Epilogue,
    Rendered,
    arguments,
    constexprs,
    index_fits,
    launch,
    mm_grid,
    reduce_grid,
    render,
    specialization,
    splitk_grid,
    workspace_shape,
)
from tuneforge.kernels.gemm_gpu.space import (
    A100_SXM,
    H100_SXM,
    DeviceLimits,
    default_space,
    exhaustive_space,
    fits,
    why_not,
)

__all__ = ["A100_SXM", "ACTIVATIONS", "DTYPES", "GRIDS", "H100_SXM", "Config", "DeviceLimits", "Epilogue", "Rendered",
           "arguments", "constexprs", "default_space", "exhaustive_space", "fits", "index_fits", "launch", "mm_grid",
           "reduce_grid", "render", "specialization", "splitk_grid", "why_not",
           "workspace_shape"]
