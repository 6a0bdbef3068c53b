"""The CUDA compilers: nvcc (a program) and NVRTC (a library), their discovery and identity.

nvcc is looked for in ``$CUDA_HOME/bin`` (or ``$CUDA_PATH/bin``), then on ``PATH``, then in the
``nvidia-cuda-nvcc`` wheel (``nvidia/cu13/bin``, or ``nvidia/cuda_nvcc/bin`` for CUDA 12). NVRTC, the
fallback when there is no nvcc, is ``libnvrtc.so`` from ``$CUDA_HOME``, the system's CUDA directories or
``LD_LIBRARY_PATH``, then the ``nvidia-cuda-nvrtc`` wheel. A compiler's identity (version and the content
hash of the binary) costs a subprocess and hashing tens of megabytes, so it is probed once per machine and
kept in ``<cache_dir>/toolchains/`` under the binary's path, size, mtime and inode, as toolchain.py does
for C++ compilers; a process that finds the record pays one stat() and a small JSON read.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tuneforge import config
from tuneforge.compile.toolchain import run_command, save_probe
from tuneforge.dataclass_lite import dataclass
from tuneforge.errors import ToolchainError
from tuneforge.hashing import file_hash

log = logging.getLogger("tuneforge.compile")

PROBE_FORMAT = 1
NVRTC_RUNNER = str(Path(__file__).with_name("cuda_nvrtc.py"))
_WHEEL_NVCC = ("nvidia/cu13/bin/nvcc", "nvidia/cuda_nvcc/bin/nvcc")
_WHEEL_NVRTC = ("nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib")
_SYSTEM_CUDA = ("/usr/local/cuda",)
_INSTALL_HINT = "set CUDA_HOME, put nvcc on PATH, or pip install nvidia-cuda-nvcc (or nvidia-cuda-nvrtc)"


@dataclass(frozen=True)
class CudaToolchain:
    kind: str  # "nvcc" or "nvrtc"
    path: str  # the nvcc executable or the libnvrtc shared library, absolute
    version: str  # nvcc: its release and build lines; nvrtc: "major.minor" from nvrtcVersion
    sha256: str  # content hash of `path`

    def identity(self) -> dict[str, Any]:
        """What names this compiler in a key: no absolute path, but its own content hash."""
        return {"kind": self.kind, "name": os.path.basename(self.path), "version": self.version,
                "sha256": self.sha256}


def _cuda_homes() -> list[Path]:
    return [Path(os.environ[name]) for name in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(name)]


def _site_dirs() -> list[Path]:
    return [Path(entry) for entry in sys.path if entry and os.path.isdir(entry)]


def _executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def find_nvcc() -> str | None:
    """$CUDA_HOME/bin/nvcc, then nvcc on PATH, then the nvidia-cuda-nvcc wheel; None if none is there."""
    candidates = [home / "bin" / "nvcc" for home in _cuda_homes()]
    on_path = shutil.which("nvcc")
    candidates += [Path(on_path)] if on_path else []
    candidates += [site / rel for site in _site_dirs() for rel in _WHEEL_NVCC]
    found = next((c for c in candidates if _executable(c)), None)
    return os.path.realpath(found) if found is not None else None


def _nvrtc_in(directory: Path) -> Path | None:
    if not directory.is_dir():
        return None
    # libnvrtc.so.13 (the soname), else the unversioned link a toolkit installs; never libnvrtc-builtins.
    names = [*sorted(directory.glob("libnvrtc.so.*"), key=lambda p: len(p.name)), directory / "libnvrtc.so"]
    return next((p for p in names if p.is_file()), None)


def find_nvrtc() -> str | None:
    """libnvrtc from $CUDA_HOME, /usr/local/cuda or LD_LIBRARY_PATH, then the nvidia-cuda-nvrtc wheel."""
    homes = [*_cuda_homes(), *map(Path, _SYSTEM_CUDA)]
    directories = [home / lib for home in homes for lib in ("lib64", "lib")]
    directories += [Path(d) for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    directories += [site / rel for site in _site_dirs() for rel in _WHEEL_NVRTC]
    found = next((lib for lib in map(_nvrtc_in, directories) if lib is not None), None)
    return os.path.realpath(found) if found is not None else None


def _probe_key(kind: str, path: str) -> str:
    st = os.stat(path)
    parts = [str(PROBE_FORMAT), kind, path, str(st.st_size), str(st.st_mtime_ns), str(st.st_ino)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _probe_nvcc(path: str) -> str:
    try:
        proc = run_command([path, "--version"], timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ToolchainError(f"cannot run nvcc at {path}: {exc}") from None
    lines = [line.strip() for line in proc.stdout.splitlines() if line.startswith(("Cuda compilation", "Build "))]
    if proc.returncode != 0 or not lines:
        raise ToolchainError(f"{path} --version does not look like nvcc: {(proc.stdout + proc.stderr)[:300]}")
    return "; ".join(lines)


def _probe_nvrtc(path: str) -> str:
    try:
        proc = run_command([sys.executable, "-I", NVRTC_RUNNER, "version", path], timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ToolchainError(f"cannot load NVRTC from {path}: {exc}") from None
    if proc.returncode != 0 or not proc.stdout.strip():
        raise ToolchainError(f"cannot load NVRTC from {path}: {proc.stderr.strip()[-300:]}")
    return proc.stdout.strip()


def _probe(kind: str, path: str) -> CudaToolchain:
    version = _probe_nvcc(path) if kind == "nvcc" else _probe_nvrtc(path)
    return CudaToolchain(kind=kind, path=path, version=version, sha256=file_hash(path))


@functools.lru_cache(maxsize=16)
def _probe_cached(kind: str, path: str, probe_key: str) -> CudaToolchain:
    record = config.get_path("cache_dir") / "toolchains" / f"cuda-{probe_key}.json"
    try:
        data = json.loads(record.read_text())
        if data.pop("probe_format") == PROBE_FORMAT:
            return CudaToolchain(**data)
    except (OSError, ValueError, KeyError, TypeError):
        pass  # missing or unreadable probe record: probe again
    toolchain = _probe(kind, path)
    save_probe(record, {"probe_format": PROBE_FORMAT, **asdict(toolchain)})
    return toolchain


def toolchain_at(kind: str, path: str) -> CudaToolchain:
    """The identity of the nvcc or NVRTC at `path` (probed once per machine, kept on disk)."""
    return _probe_cached(kind, path, _probe_key(kind, path))


def _explicit(path: str) -> CudaToolchain:
    resolved = os.path.realpath(os.path.expanduser(path))
    if not os.path.isfile(resolved):
        raise ToolchainError(f"CUDA compiler {path!r} (argument compiler) does not exist")
    kind = "nvrtc" if ".so" in os.path.basename(resolved) else "nvcc"
    return toolchain_at(kind, resolved)


def select_toolchain(compiler: str | None = None) -> CudaToolchain:
    """The CUDA compiler to use: None or "auto" (nvcc, else NVRTC), "nvcc", "nvrtc", or a path to either."""
    if compiler is not None and os.sep in compiler:
        return _explicit(compiler)
    if compiler not in (None, "auto", "nvcc", "nvrtc"):
        raise ToolchainError(f"compiler={compiler!r}: expected 'nvcc', 'nvrtc', 'auto' (None), or a path to nvcc "
                             "or libnvrtc.so")
    if compiler != "nvrtc":
        nvcc = find_nvcc()
        if nvcc is not None:
            return toolchain_at("nvcc", nvcc)
        if compiler == "nvcc":
            raise ToolchainError(f"compiler='nvcc' but no nvcc was found: {_INSTALL_HINT}")
    nvrtc = find_nvrtc()
    if nvrtc is not None:
        return toolchain_at("nvrtc", nvrtc)
    missing = "NVRTC (libnvrtc.so) was not found" if compiler == "nvrtc" else "neither nvcc nor NVRTC was found"
    raise ToolchainError(f"no CUDA compiler: {missing}; {_INSTALL_HINT}")
