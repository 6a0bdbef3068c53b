"""The fair reference environment for benchmark child processes, and what the child's BLAS libraries run.

This machine's environment sets OPENBLAS_CORETYPE=Haswell and OPENBLAS_L2_SIZE, which put numpy's OpenBLAS
on its AVX2 kernels even on an AVX-512 CPU; a user's machine sets neither, and OpenBLAS picks its kernels
by the CPU. Tests and CI keep the variables; a benchmark's children run without them (`child_env`), except
for an AVX2-capped comparison, where the references are capped at AVX2 as the tuned kernels are.

    env = child_env(threads=2, isa="auto", extra={"TUNEFORGE_CACHE_DIR": cache})   # in the parent
    print(blas_report())                                                          # in the child
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping
from typing import Any

# Set by this machine's environment, absent on a user's: they steer OpenBLAS's choice of kernels.
OPENBLAS_STEERING = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "TUNEFORGE_KERNEL_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
# With isa "avx2" every reference library is capped at AVX2 too, so the comparison is AVX2 against AVX2.
AVX2_CAPS = {"OPENBLAS_CORETYPE": "Haswell", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
             "ATEN_CPU_CAPABILITY": "avx2"}


def child_env(threads: int | None = None, isa: str = "auto", extra: Mapping[str, str] | None = None,
              base: Mapping[str, str] | None = None) -> dict[str, str]:
    """A copy of `base` (os.environ) for a benchmark child: OpenBLAS's steering variables removed, with
    `isa` "avx2" the references capped at AVX2, the kernels' ISA set to `isa`, every library's thread
    count to `threads` (when given), then `extra`. `base` itself is left as it is."""
    env = {name: value for name, value in (os.environ if base is None else base).items()
           if name not in OPENBLAS_STEERING}
    if isa == "avx2":
        env.update(AVX2_CAPS)
    env["TUNEFORGE_KERNEL_ISA"] = isa
    if threads is not None:
        env.update(dict.fromkeys(THREAD_VARIABLES, str(threads)))
    env.update(extra or {})
    return env


def _describe_pool(pool: Mapping[str, Any]) -> str:
    version = str(pool.get("version") or "").split(".")
    words = [str(pool.get("internal_api", "?")), ".".join(version[:3]) if version != [""] else "?"]
    if pool.get("architecture"):
        words.append(str(pool["architecture"]))
    if pool.get("threading_layer"):
        words.append(str(pool["threading_layer"]))
    return f"{' '.join(words)}, {pool.get('num_threads')} threads"


def blas_pools() -> list[str]:
    """The BLAS libraries loaded in this process, as threadpoolctl sees them: library, version, core type,
    threading layer and threads, e.g. "openblas 0.3.31 SkylakeX pthreads, 2 threads"."""
    from threadpoolctl import threadpool_info  # type: ignore[import-untyped]

    return [_describe_pool(pool) for pool in threadpool_info() if pool.get("user_api") == "blas"]


def openblas_core() -> str:
    """OpenBLAS's core type in this process ("SkylakeX", "Haswell"), or "?" when numpy's BLAS is not it."""
    import numpy as np
    from threadpoolctl import threadpool_info

    np.ones((2, 2)) @ np.ones((2, 2))  # numpy's BLAS is loaded with numpy; a call makes sure it is set up
    cores = [str(pool.get("architecture")) for pool in threadpool_info() if pool.get("internal_api") == "openblas"]
    return cores[0] if cores else "?"


def torch_report() -> str | None:
    """torch's matmul backends in brief (version, MKL, oneDNN, ATen's CPU capability, threads and parallel
    backend), or None when torch does not import."""
    try:
        import torch as torch_module
    except ImportError:
        return None
    torch: Any = torch_module  # parts of torch.backends are untyped
    config = torch.__config__.show()
    onednn = re.search(r"(?:oneDNN|MKL-DNN|MKLDNN) v([\w.]+)", config)
    mkl = re.search(r"Math Kernel Library Version ([\w.]+)", config)
    backend = re.search(r"ATen parallel backend: (\S+)", torch.__config__.parallel_info())
    parts = [f"torch {torch.__version__}",
             f"MKL {mkl.group(1) if mkl else ''}".strip() if torch.backends.mkl.is_available() else "no MKL",
             f"oneDNN {onednn.group(1) if onednn else ''}".strip() if torch.backends.mkldnn.is_available()
             else "no oneDNN",
             f"ATen {torch.backends.cpu.get_cpu_capability()}",
             f"{torch.get_num_threads()} threads ({backend.group(1) if backend else '?'})"]
    return ", ".join(parts)


def load_note() -> str:
    """The machine's load when a benchmark ran: other processes on the same cores skew every figure, and
    a library whose threads spin-wait (OpenBLAS, OpenMP) the most."""
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} CPUs"


def blas_report(with_torch: bool = False) -> str:
    """One line for a benchmark's table header: numpy's BLAS (and torch's backends when asked and loaded)."""
    openblas_core()
    line = "numpy: " + ("; ".join(blas_pools()) or "no BLAS found by threadpoolctl")
    steering = [f"{name}={os.environ[name]}" for name in OPENBLAS_STEERING if name in os.environ]
    line += f" [{' '.join(steering)}]" if steering else " [OPENBLAS_CORETYPE/L2_SIZE unset]"
    if with_torch and "torch" in sys.modules:
        line += f" | {torch_report()}"
    return line
