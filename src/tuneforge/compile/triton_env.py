"""What besides the kernel itself decides Triton's output: the GPU target, ptxas, Triton's resolved options.

Kept apart from the builder (`tuneforge.compile.triton`) because each answer is probed once per process
(or per file) and goes into every key. Triton is imported lazily: importing tuneforge never loads it.
"""

from __future__ import annotations

import functools
import hashlib
import os
import subprocess
from types import ModuleType
from typing import Any

from tuneforge.dataclass_lite import dataclass
from tuneforge.errors import TuneforgeError

BACKENDS = ("cuda",)  # what the key knows how to identify (ptxas); hip would need its own toolchain identity


class TritonBuildError(TuneforgeError, ValueError):
    """A Triton build is invalid (the message names the field) or cannot be done here (e.g. no GPU)."""


@dataclass(frozen=True)
class GpuTarget:
    """The GPU a kernel is compiled for: ``arch`` is the compute capability as an int (sm_90 -> 90)."""

    backend: str = "cuda"
    arch: int = 90
    warp_size: int = 32

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise TritonBuildError(f"GpuTarget.backend: {self.backend!r} is not supported (supported: {BACKENDS})")
        if isinstance(self.arch, bool) or not isinstance(self.arch, int) or self.arch <= 0:
            raise TritonBuildError(f"GpuTarget.arch: need the compute capability as a positive int "
                                   f"(e.g. 90 for sm_90), got {self.arch!r}")
        if isinstance(self.warp_size, bool) or not isinstance(self.warp_size, int) or self.warp_size <= 0:
            raise TritonBuildError(f"GpuTarget.warp_size: need a positive int, got {self.warp_size!r}")

    def to_triton(self) -> Any:
        from triton.backends.compiler import GPUTarget

        return GPUTarget(self.backend, self.arch, self.warp_size)


def import_triton() -> ModuleType:
    """The triton package, or a TritonBuildError that says how to get it."""
    try:
        import triton
    except ImportError as exc:
        raise TritonBuildError(f"Triton kernels need the triton package, which does not import here ({exc}); "
                               "install it (pip install triton)") from exc
    module: ModuleType = triton
    return module


def current_target(why: str = "TritonBuild.target is None, which means the current GPU",
                   advice: str = "pass target=GpuTarget(backend=..., arch=..., warp_size=...) to compile "
                                 "without a GPU") -> GpuTarget:
    """The target of this process's current GPU; TritonBuildError (`why`, the cause, `advice`) when there is none."""
    import_triton()
    from triton.runtime.driver import driver

    try:
        found = driver.active.get_current_target()
    except Exception as exc:  # Triton's own message ("0 active drivers") does not say what to do
        raise TritonBuildError(f"{why}, and this process has no GPU ({exc}); {advice}") from exc
    return GpuTarget(str(found.backend), found.arch, int(found.warp_size))


@functools.cache
def device_target(index: int) -> GpuTarget:
    """The target of CUDA device `index` (torch's numbering), asked once, without importing Triton (a warm
    start must not pay for it): the same answer as Triton's driver, compute capability major * 10 + minor."""
    import torch

    major, minor = torch.cuda.get_device_capability(index)
    return GpuTarget("cuda", int(major) * 10 + int(minor), 32)


def build_target() -> GpuTarget:
    """This process's current GPU: what a choice's builds name, resolved in the process that tunes, so that
    the build pool's workers (forked, perhaps after CUDA started here) never ask a driver themselves."""
    try:
        import torch
    except ImportError:
        return _triton_target()
    if not torch.cuda.is_available():
        return _triton_target()  # its error says what to do
    return device_target(int(torch.cuda.current_device()))


@functools.cache
def _triton_target() -> GpuTarget:
    return current_target()


def forget_targets() -> None:
    """Ask the devices again (the targets are cached per process)."""
    device_target.cache_clear()
    _triton_target.cache_clear()


def resolve_target(target: GpuTarget | None) -> GpuTarget:
    return current_target() if target is None else target


_versions: dict[str, tuple[tuple[int, int], str]] = {}
_digests: dict[str, tuple[tuple[int, int], str]] = {}


def _stamp(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def ptxas_version(target: GpuTarget) -> str:
    """The ``--version`` text of the ptxas Triton runs for `target` (it picks one per arch and honours
    TRITON_PTXAS_PATH); asked once per binary, again only if the file changed."""
    import_triton()
    from triton.backends.nvidia.compiler import get_ptxas

    try:
        path = str(get_ptxas(target.arch).path)
        stamp = _stamp(path)
    except (RuntimeError, OSError) as exc:
        raise TritonBuildError(f"cannot find the ptxas that Triton uses for sm_{target.arch}: {exc}") from exc
    known = _versions.get(path)
    if known is not None and known[0] == stamp:
        return known[1]
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        raise TritonBuildError(f"{path} --version failed: {exc}") from exc
    _versions[path] = (stamp, proc.stdout.strip())
    return proc.stdout.strip()


def _file_sha256(path: str) -> str:
    stamp = _stamp(path)
    known = _digests.get(path)
    if known is not None and known[0] == stamp:
        return known[1]
    with open(path, "rb") as handle:
        digest = hashlib.sha256(handle.read()).hexdigest()
    _digests[path] = (stamp, digest)
    return digest


def resolved_options(target: GpuTarget, num_warps: int, num_stages: int) -> dict[str, Any]:
    """Triton's full option set for this build, as key material: the defaults it fills in come partly from
    the environment (PTXAS_OPTIONS, TRITON_DEFAULT_FP_FUSION, ...), and libraries are named by content."""
    import_triton()
    from triton.compiler.compiler import make_backend

    options = make_backend(target.to_triton()).parse_options({"num_warps": num_warps, "num_stages": num_stages})
    material: dict[str, Any] = {}
    for name, value in sorted(vars(options).items()):
        if name == "extern_libs":  # absolute paths: a key names the libraries' content instead
            value = {lib: _file_sha256(str(path)) for lib, path in (value or ())}
        elif isinstance(value, tuple):
            value = list(value)
        material[name] = value
    return material


def cache_env_vars() -> dict[str, str]:
    """The environment variables Triton itself says change compiled code (those that are set)."""
    import_triton()
    from triton._C.libtriton import get_cache_invalidating_env_vars

    return {str(k): str(v) for k, v in get_cache_invalidating_env_vars().items()}
