"""The public entry point for CUDA C++ kernels: ``tuneforge.cuda.load(source)`` builds a cubin for the
current GPU (nvcc, else NVRTC; cached by content like C++ builds, locally and in the remote tier) and
loads it through the CUDA driver API; ``module.function("name")(grid, block, args)`` launches a kernel.
``tuneforge.cuda.build(CudaBuild(..., arch="sm_90"))`` compiles without a GPU. The code lives in
`tuneforge.compile.cuda`; this name is the one users import and the one that stays stable when the
compile layer moves."""

from tuneforge.compile.cuda import CudaArtifact, CudaBuild, artifact_key, build, cubin_arch, load
from tuneforge.compile.cuda_driver import CudaError, CudaFunction, CudaModule

__all__ = ["CudaArtifact", "CudaBuild", "CudaError", "CudaFunction", "CudaModule", "artifact_key", "build",
           "cubin_arch", "load"]
