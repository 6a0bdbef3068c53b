"""CUDA C++ source -> cubin for one real GPU architecture, cached by content, loaded with the driver API.

A cubin is built for exactly one real ``sm_XX`` (the one asked for, or the current GPU's): never a
virtual ``compute_XX`` (PTX) target, whose code the driver would compile again on every machine and
whose result would depend on the driver, so it could not be shared through the cache. The compiler
output is checked (CUDA ELF, the requested SM) before it is stored.

The key of an artifact (see `key_material`) is the hash of the exact source, the whole nvcc command line
(or NVRTC option list) with file names replaced by placeholders, the compiler's identity (kind, version,
content hash), the architecture, the contents of include directories, and the artifact format version.
Builds go through the artifact tiers (local store, then the remote), exactly like C++ builds.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import field, replace
from pathlib import Path
from typing import Any

from tuneforge import config
from tuneforge.compile import builders
from tuneforge.compile.cpp import include_dir_digest
from tuneforge.compile.cuda_driver import CudaError, CudaModule, current_context, device_arch, load_image
from tuneforge.compile.cuda_toolchain import NVRTC_RUNNER, CudaToolchain, select_toolchain
from tuneforge.compile.failed import keep_failed, run_compiler
from tuneforge.dataclass_lite import dataclass
from tuneforge.errors import CompileError
from tuneforge.hashing import key_hash
from tuneforge.store.artifacts import Entry
from tuneforge.store.tiers import artifact_tiers

log = logging.getLogger("tuneforge.compile")

ARTIFACT_FORMAT = 1
SOURCE_NAME = "source.cu"
CUBIN_NAME = "kernel.cubin"
EM_CUDA = 190  # the ELF machine number of CUDA cubins
_REAL_ARCH = re.compile(r"(?:sm_)?(\d{2,3})([af]?)")
_GENERIC_ARCH = re.compile(r"(compute|lto)_\w+|native|all|all-major")
# Flags that would change the target or the kind of output: the builder sets both itself.
_TARGET_FLAGS = frozenset({"-arch", "--gpu-architecture", "-gencode", "--generate-code", "-code", "--gpu-code",
                           "-ptx", "--ptx", "-fatbin", "--fatbin", "-cubin", "--cubin", "-c", "--compile", "-o",
                           "--output-file", "-rdc", "--relocatable-device-code", "-dlink", "--device-link", "-lib",
                           "--lib", "-E", "--preprocess"})


def normalise_arch(arch: str | int | None) -> str | None:
    """"sm_90", "90" or 90 -> "sm_90" ("sm_90a" keeps its suffix); None stays None (the current GPU's).
    Virtual or generic targets (compute_90, native, all) are refused: their code is not for one real GPU."""
    if arch is None:
        return None
    text = str(arch).strip().lower() if not isinstance(arch, bool) else ""
    if _GENERIC_ARCH.fullmatch(text):
        raise ValueError(f"arch={arch!r} is a virtual or generic target; tuneforge caches cubins for one real "
                         "GPU architecture only: give arch='sm_90' (or 90), or None for the current GPU's")
    match = _REAL_ARCH.fullmatch(text)
    if match is None:
        raise ValueError(f"arch={arch!r} is not a real GPU architecture: expected 'sm_XX' (e.g. 'sm_90', 'sm_90a'), "
                         "an int such as 90, or None for the current GPU's")
    return f"sm_{match.group(1)}{match.group(2)}"


def _check_flags(flags: Sequence[str]) -> None:
    for flag in flags:
        if flag.split("=", 1)[0] in _TARGET_FLAGS:
            raise ValueError(f"flag {flag!r} sets the target or the output; tuneforge builds one cubin for the "
                             "architecture given by the arch argument")


@dataclass(frozen=True)
class CudaBuild:
    """One CUDA build as plain data: `arch` normalised to "sm_XX", or None for the current GPU's;
    `compiler` None (nvcc, else NVRTC), "nvcc", "nvrtc", or a path to nvcc or libnvrtc.so."""

    source: str
    flags: tuple[str, ...] = ()
    arch: str | None = None
    include_dirs: tuple[str, ...] = ()
    compiler: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "arch", normalise_arch(self.arch))
        object.__setattr__(self, "flags", tuple(self.flags))
        object.__setattr__(self, "include_dirs", tuple(str(Path(d).resolve()) for d in self.include_dirs))
        _check_flags(self.flags)


@dataclass(frozen=True)
class CudaArtifact:
    key: str
    entry: Entry
    compiled: bool  # this call ran the compiler (False: served from the store or the remote)
    arch: str
    key_inputs: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def cubin_path(self) -> Path:
        return self.entry.file(self.entry.meta["output"])


def resolve_arch(arch: str | None) -> str:
    """`arch`, or the current GPU's sm_XX when it is None (an error naming the argument without a GPU)."""
    if arch is not None:
        return arch
    try:
        return device_arch()
    except CudaError as exc:
        raise CudaError(f"arch=None means the current GPU's architecture, but there is none to ask: {exc}. Pass "
                        "arch='sm_90' (the GPU the cubin is for) to build without a GPU", call=exc.call,
                        code=exc.code, name=exc.name) from None


def cubin_arch(image: bytes) -> int | None:
    """The SM number (90 for sm_90) a cubin is for, from its ELF header; None if it is not a CUDA cubin."""
    if len(image) < 52 or image[:4] != b"\x7fELF" or image[4] != 2:  # 64-bit ELF only
        return None
    if int.from_bytes(image[18:20], "little") != EM_CUDA:
        return None
    flags = int.from_bytes(image[48:52], "little")
    # ELF ABI version 8 (CUDA 13) moved the SM number from bits 0-7 to bits 8-15 of e_flags.
    return (flags >> 8) & 0xFF if image[8] >= 8 else flags & 0xFF


def compile_command(build: CudaBuild, toolchain: CudaToolchain, arch: str, source: str,
                    output: str) -> list[str]:
    """nvcc's whole command line, or NVRTC's option list (the compile itself then runs in a child process)."""
    includes = [f"-I{d}" for d in build.include_dirs]
    if toolchain.kind == "nvrtc":
        return [f"--gpu-architecture={arch}", *includes, *build.flags]
    return [toolchain.path, "-cubin", f"-arch={arch}", *includes, *build.flags, "-o", output, source]


def key_material(build: CudaBuild, toolchain: CudaToolchain, arch: str) -> dict[str, Any]:
    """The inputs of an artifact's key; kept in its manifest so `tuneforge cache explain` can diff them."""
    digests = {d: include_dir_digest(d) for d in build.include_dirs}
    placeholders = {f"-I{d}": f"-I<include:{digest[:16]}>" for d, digest in digests.items()}
    command = compile_command(build, toolchain, arch, "<source>", "<output>")
    if toolchain.kind == "nvcc":
        command = command[1:]  # the binary is named by its identity, not its path
    return {
        "artifact": "cuda-cubin",
        "format": ARTIFACT_FORMAT,
        "source_sha256": hashlib.sha256(build.source.encode()).hexdigest(),
        "command": [placeholders.get(a, a) for a in command],
        "compiler": toolchain.identity(),
        "arch": arch,
        "include_dirs": {f"<include:{digest[:16]}>": digest for digest in digests.values()},
    }


def artifact_key(build: CudaBuild, toolchain: CudaToolchain | None = None) -> tuple[str, dict[str, Any]]:
    """The store key of `build` and the inputs it was hashed from (arch None: the current GPU's)."""
    material = key_material(build, toolchain or select_toolchain(build.compiler), resolve_arch(build.arch))
    return "cuda" + key_hash(material), material


def _keep_failed(key: str, build: CudaBuild, command: Sequence[str], stderr: str) -> Path | None:
    return keep_failed(key, SOURCE_NAME, build.source, command, stderr)


def _runner_command(build: CudaBuild, toolchain: CudaToolchain, arch: str) -> list[str]:
    options = compile_command(build, toolchain, arch, SOURCE_NAME, CUBIN_NAME)
    if toolchain.kind == "nvrtc":
        return [sys.executable, "-I", NVRTC_RUNNER, "compile", toolchain.path, SOURCE_NAME, CUBIN_NAME, *options]
    return options


def _compile_into(staging: Path, key: str, build: CudaBuild, toolchain: CudaToolchain, arch: str) -> dict[str, Any]:
    (staging / SOURCE_NAME).write_text(build.source)
    command = _runner_command(build, toolchain, arch)
    started = time.perf_counter()
    proc = run_compiler(command, cwd=staging, what=f"CUDA compile ({toolchain.kind})",
                        keep=lambda output: _keep_failed(key, build, command, output))
    output = staging / CUBIN_NAME
    if proc.returncode != 0 or not output.is_file():
        kept = _keep_failed(key, build, command, proc.stderr)
        raise CompileError(f"CUDA compile ({toolchain.kind}) failed with exit code {proc.returncode}",
                           command=command, stderr=proc.stderr, source_path=kept, returncode=proc.returncode)
    built_for = cubin_arch(output.read_bytes())
    if built_for is None or f"sm_{built_for}" != arch.rstrip("af"):
        kept = _keep_failed(key, build, command, proc.stderr)
        what = "no CUDA cubin" if built_for is None else f"a cubin for sm_{built_for}"
        raise CompileError(f"{toolchain.kind} produced {what}, not one for {arch}; nothing was stored",
                           command=command, stderr=proc.stderr, source_path=kept)
    if config.get_bool("debug"):
        log.info("compiled %s: %s", key, " ".join(command))
    return {"output": CUBIN_NAME, "arch": arch, "compiler": toolchain.kind,
            "compile_seconds": round(time.perf_counter() - started, 4), "compiler_warnings": proc.stderr[-4000:]}


def build(build: CudaBuild) -> CudaArtifact:
    """The cubin for `build`, compiled only if neither the local store nor the remote holds it yet."""
    toolchain = select_toolchain(build.compiler)
    arch = resolve_arch(build.arch)
    material = key_material(build, toolchain, arch)
    key = "cuda" + key_hash(material)
    compiled = False

    def run_compiler(staging: Path) -> Mapping[str, Any]:
        nonlocal compiled
        compiled = True
        return _compile_into(staging, key, build, toolchain, arch)

    entry = artifact_tiers.get_or_build(key, run_compiler, key_inputs=material)
    return CudaArtifact(key=key, entry=entry, compiled=compiled, arch=arch, key_inputs=material)


_loaded: dict[tuple[Any, ...], CudaModule] = {}


def _build_for_pool(request: CudaBuild) -> tuple[str, Path, bool]:
    artifact = build(request)
    return artifact.key, artifact.cubin_path, artifact.compiled


builders.register(CudaBuild, lambda request: artifact_key(request)[0], _build_for_pool)


def request_for(source: str, *, arch: str | int | None = None, flags: Sequence[str] = (),
                include_dirs: Sequence[str | Path] = (), compiler: str | None = None) -> CudaBuild:
    """The build `load` asks for: the arguments over the ``cuda.*`` settings (`arch` None: ``cuda.arch``;
    `compiler` None: ``cuda.compiler``; ``cuda.flags`` and ``cuda.include_dirs`` before the arguments')."""
    from_setting = arch is None
    try:
        target = normalise_arch(config.get_optional_str("cuda.arch") if from_setting else arch)
    except ValueError as exc:
        if from_setting:  # name the setting (and its variable) to fix
            raise config.setting_error("cuda.arch", str(exc)) from None
        raise
    return CudaBuild(source=source, flags=(*config.get_strs("cuda.flags"), *flags), arch=target,
                     include_dirs=tuple(str(d) for d in (*config.get_paths("cuda.include_dirs"), *include_dirs)),
                     compiler=config.get_optional_str("cuda.compiler") if compiler is None else compiler)


def load(source: str, *, arch: str | int | None = None, flags: Sequence[str] = (),
         include_dirs: Sequence[str | Path] = (), compiler: str | None = None) -> CudaModule:
    """Build (or fetch) the cubin of `source` for the current GPU and load it into the current context.

    Kernels are found by name with ``module.function("name")``: declare them ``extern "C" __global__``.
    Unset arguments come from the ``cuda.*`` settings (see `request_for`); no arch anywhere means the
    current GPU's architecture, no compiler nvcc if there is one, else NVRTC.
    """
    request = request_for(source, arch=arch, flags=flags, include_dirs=include_dirs, compiler=compiler)
    context = current_context()
    request = replace(request, arch=resolve_arch(request.arch))
    memo = (request, os.getpid(), context, config.get_path("cache_dir"))
    module = _loaded.get(memo)
    if module is None:
        artifact = build(request)
        module = _loaded[memo] = load_image(artifact.cubin_path.read_bytes(), artifact.key, artifact.arch)
    return module
