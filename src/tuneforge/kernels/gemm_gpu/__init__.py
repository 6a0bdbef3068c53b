"""Triton GEMM kernels (mm and split-K, bias/beta/activation epilogues), their configuration spaces, their
choices, and the op: `gemm_cuda` (what tuneforge.gemm does with CUDA tensors)."""

from tuneforge.kernels.gemm_gpu.choice import GemmLayout, GemmTritonChoice, torch_gemm
from tuneforge.kernels.gemm_gpu.op import clear_dispatch, cublas_choice, gemm_cuda, gpu_choices
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

__all__ = ["A100_SXM", "ACTIVATIONS", "DTYPES", "GRIDS", "H100_SXM", "Config", "DeviceLimits", "Epilogue",
           "GemmLayout", "GemmTritonChoice", "Rendered", "arguments", "clear_dispatch", "constexprs", "cublas_choice",
           "default_space", "exhaustive_space", "fits", "gemm_cuda", "gpu_choices", "index_fits", "launch", "mm_grid",
           "reduce_grid", "render", "specialization", "splitk_grid", "torch_gemm", "why_not", "workspace_shape"]
