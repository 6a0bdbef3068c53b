"""The C++ compiler: discovery, identity, target CPU, OpenMP support, and the command line.

Probing a compiler costs tens of milliseconds (several subprocesses), which would dominate a cache
hit, so probe results are kept in ``<cache_dir>/toolchains/`` under a key made of the compiler
binary's path, size and mtime and the CPU's identity (the same idea as ccache's compiler_check):
a fresh process pays one stat() and one small JSON read.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tuneforge import config, cpuinfo
from tuneforge.dataclass_lite import dataclass
from tuneforge.errors import ToolchainError
from tuneforge.hashing import file_hash
from tuneforge.parsing import DETECT_MARCH
from tuneforge.store.fsutil import is_readonly_error

log = logging.getLogger("tuneforge.compile")

PROBE_FORMAT = 5
_CANDIDATES = ("g++", "clang++", "c++")


@dataclass(frozen=True)
class Toolchain:
    command: tuple[str, ...]  # compiler (and any launcher prefix), absolute paths
    kind: str  # gcc, clang or unknown
    version: str  # first line of --version
    target: str  # -dumpmachine
    binary_sha256: str
    # The OpenMP flags of this compiler family. Whether its runtime is installed is only checked when
    # asked (openmp_available): a test compile costs more than the rest of the probe together.
    openmp_flags: tuple[str, ...] | None

    @property
    def march(self) -> str:
        """The real CPU name the compiler picks for -march=native (probed on first use)."""
        return cpu_target(self)[0]

    @property
    def native_extra_flags(self) -> tuple[str, ...]:
        """Features -march=native turns on or off beyond that CPU name (a newer CPU than the compiler
        knows, e.g. AVX-512 on a Zen 5 seen by gcc 12 as znver3): named explicitly, never "native"."""
        return cpu_target(self)[1]

    def identity(self) -> dict[str, Any]:
        """What names this compiler in a key: no absolute path, but its own content hash."""
        return {"name": os.path.basename(self.command[-1]), "kind": self.kind, "version": self.version,
                "target": self.target, "sha256": self.binary_sha256}

    def resolve_march(self, setting: str) -> str:
        """The CPU name the cpp.march setting stands for: the detected one for 'detect' (probed only
        here, when a build needs it), else the setting itself."""
        return self.march if setting == DETECT_MARCH else setting

    def target_flags(self, march: str) -> list[str]:
        """-march for `march`, plus the detected extra features when `march` is the detected CPU."""
        return [f"-march={march}", *(self.native_extra_flags if march == self.march else ())]

    def command_line(self, source: str, output: str, *, opt_level: str, march: str, openmp: bool,
                     flags: Sequence[str], include_dirs: Sequence[str], shared: bool = True) -> list[str]:
        """The full compile command (paths as given, so the caller can put placeholders in the key)."""
        cmd = [*self.command, f"-O{opt_level}", *self.target_flags(march), "-fPIC"]
        if shared:
            cmd.append("-shared")
        if openmp:
            if self.openmp_flags is None:
                raise ToolchainError(f"{self.command[-1]} is not a known OpenMP compiler (gcc or clang); "
                                     "set cpp.openmp off or use g++/clang++")
            cmd.extend(self.openmp_flags)
        cmd.extend(f"-I{d}" for d in include_dirs)
        cmd.extend(flags)
        cmd.extend(["-o", output, source])
        return cmd


def run_command(cmd: Sequence[str], *, cwd: str | Path | None = None, timeout: float | None = None,
                input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a compiler; on time-out kill its whole process group (cc1plus, as, ld), not only the driver."""
    with subprocess.Popen(list(cmd), cwd=cwd, stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        try:
            out, err = proc.communicate(input_text, timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            out, err = proc.communicate()
            raise subprocess.TimeoutExpired(list(cmd), timeout or 0.0, out, err) from None
        except BaseException:  # KeyboardInterrupt included: never leave a compiler running
            _kill_group(proc)
            raise
    return subprocess.CompletedProcess(list(cmd), proc.returncode, out, err)


def _kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        proc.kill()
    proc.wait()


def _resolve(spec: str) -> tuple[str, ...]:
    words = shlex.split(spec)
    if not words:
        raise ToolchainError("empty compiler command")
    resolved = []
    for word in words:
        path = shutil.which(word) if os.sep not in word else (word if os.access(word, os.X_OK) else None)
        if path is None:
            raise ToolchainError(f"C++ compiler {word!r} not found or not executable "
                                 "(set cpp.cxx / TUNEFORGE_CPP_CXX or $CXX to a working compiler)")
        # absolute, but not through symlinks: a driver reads its mode from the name it is run by (clang++ links
        # C++ where its target, clang, does not; ccache's g++ link runs g++)
        resolved.append(os.path.abspath(path))
    return tuple(resolved)


def find_compiler() -> tuple[str, ...]:
    """cpp.cxx setting, then $CXX, then g++, clang++, c++ on PATH."""
    explicit = config.get_optional_str("cpp.cxx") or os.environ.get("CXX")
    if explicit:
        return _resolve(explicit)
    for name in _CANDIDATES:
        if shutil.which(name):
            return _resolve(name)
    raise ToolchainError("no C++ compiler found: install g++ or clang++, or set TUNEFORGE_CPP_CXX")


@functools.lru_cache(maxsize=16)
def _probe_key(command: tuple[str, ...]) -> str:
    cpu = cpuinfo.cpu_info()
    parts: list[str] = [str(PROBE_FORMAT), cpu.model, cpu.ident, ",".join(cpu.isa)]
    for binary in command:
        st = os.stat(binary)
        parts += [binary, str(st.st_size), str(st.st_mtime_ns), str(st.st_ino)]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:32]


def _gcc_enabled_features(command: tuple[str, ...], march: str) -> tuple[str, set[str]]:
    out = run_command([*command, f"-march={march}", "-Q", "--help=target"], timeout=60).stdout
    match = re.search(r"^\s*-march=\s*(\S+)", out, re.MULTILINE)
    enabled = set(re.findall(r"^\s*-m([a-z0-9][a-z0-9-]*)\s+\[enabled\]", out, re.MULTILINE))
    return (match.group(1) if match else ""), enabled


def _detect_march(command: tuple[str, ...], kind: str) -> tuple[str, tuple[str, ...]]:
    if kind == "gcc":
        name, native = _gcc_enabled_features(command, "native")
        if name and name != "native":
            _, named = _gcc_enabled_features(command, name)
            extra = [f"-m{f}" for f in sorted(native - named)] + [f"-mno-{f}" for f in sorted(named - native)]
            return name, tuple(extra)
    elif kind == "clang":
        proc = run_command([*command, "-march=native", "-###", "-x", "c++", "-c", "-"], timeout=60,
                           input_text="")
        match = re.search(r'"-target-cpu"\s+"([^"]+)"', proc.stderr)
        if match and match.group(1) != "native":
            return match.group(1), ()
    # A compiler that cannot tell: fall back to a portable level implied by the CPU's features.
    cpu = cpuinfo.cpu_info()
    if cpu.arch in ("x86_64", "amd64"):
        if cpu.has("avx512f"):
            return "x86-64-v4", ()
        return ("x86-64-v3" if cpu.has("avx2") and cpu.has("fma") else "x86-64-v2"), ()
    return ("armv8-a" if cpu.arch in ("aarch64", "arm64") else "generic"), ()


@functools.lru_cache(maxsize=8)
def openmp_available(toolchain: Toolchain) -> bool:
    """Whether an OpenMP program compiles and links here (a test compile, once per process)."""
    if toolchain.openmp_flags is None:
        return False
    source = "#include <omp.h>\nint main(){int n=0;\n#pragma omp parallel\n{n=omp_get_num_threads();}\nreturn n<1;}\n"
    with tempfile.TemporaryDirectory(prefix="tuneforge-omp-") as tmp:
        Path(tmp, "t.cpp").write_text(source)
        proc = run_command([*toolchain.command, *toolchain.openmp_flags, "t.cpp", "-o", "t"], cwd=tmp, timeout=120)
        return proc.returncode == 0


def _probe(command: tuple[str, ...]) -> Toolchain:
    started = time.perf_counter()
    try:  # one run of `-v` names both the version and the target (a fresh machine pays one fork, not two)
        verbose = run_command([*command, "-v"], timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise ToolchainError(f"cannot run C++ compiler {' '.join(command)}: {exc}") from None
    text = verbose.stderr + verbose.stdout
    version_line = next((line.strip() for line in text.splitlines() if " version " in line), "")
    target = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Target:")), "")
    if verbose.returncode != 0 or not version_line:
        raise ToolchainError(f"{' '.join(command)} -v does not look like a C++ compiler: {text.strip()[:300]}")
    lowered = version_line.lower()
    kind = "clang" if "clang" in lowered else "gcc" if lowered.startswith(("gcc", "g++")) else "unknown"
    version = version_line
    binary_sha = hashlib.sha256("".join(file_hash(b) for b in command).encode()).hexdigest()
    toolchain = Toolchain(command=command, kind=kind, version=version, target=target,
                          binary_sha256=binary_sha, openmp_flags=("-fopenmp",) if kind in ("gcc", "clang") else None)
    log.debug("probed %s in %.0f ms: %s", command[-1], (time.perf_counter() - started) * 1e3, toolchain)
    return toolchain


def _probe_cached(command: tuple[str, ...]) -> Toolchain:
    directory = config.get_path("cache_dir") / "toolchains"
    path = directory / f"{_probe_key(command)}.json"
    try:
        data = json.loads(path.read_text())
        if data.pop("probe_format") == PROBE_FORMAT:
            flags = data.pop("openmp_flags")
            return Toolchain(command=tuple(data.pop("command")),
                             openmp_flags=None if flags is None else tuple(flags), **data)
    except (OSError, ValueError, KeyError, TypeError):
        pass  # missing or unreadable probe record: probe again
    toolchain = _probe(command)
    save_probe(path, {"probe_format": PROBE_FORMAT, **asdict(toolchain)})
    return toolchain


def save_probe(path: Path, data: dict[str, Any]) -> None:
    """Write a probe's result (JSON) atomically; a cache that cannot take it only costs probing again."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except OSError as exc:
        # A read-only cache (shared, pre-built) is reported once by the store; probing again is cheap.
        quiet = is_readonly_error(exc)
        log.log(logging.DEBUG if quiet else logging.WARNING, "cannot save compiler probe to %s: %s", path.parent, exc)


_targets: dict[tuple[str, ...], tuple[str, tuple[str, ...]]] = {}


def cpu_target(toolchain: Toolchain) -> tuple[str, tuple[str, ...]]:
    """(march, extra feature flags) for this compiler on this CPU: probed on first use (two compiler
    runs), then kept on disk beside the identity probe. Only builds need it, not lookups."""
    known = _targets.get(toolchain.command)
    if known is not None:
        return known
    path = config.get_path("cache_dir") / "toolchains" / f"{_probe_key(toolchain.command)}.target.json"
    try:
        data = json.loads(path.read_text())
        if data.get("probe_format") == PROBE_FORMAT:
            known = (str(data["march"]), tuple(data["extra"]))
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if known is None:
        known = _detect_march(toolchain.command, toolchain.kind)
        save_probe(path, {"probe_format": PROBE_FORMAT, "march": known[0], "extra": list(known[1])})
    _targets[toolchain.command] = known
    return known


@functools.lru_cache(maxsize=16)
def _toolchain_for(command: tuple[str, ...]) -> Toolchain:
    return _probe_cached(command)


def default_toolchain() -> Toolchain:
    """The compiler the settings name, probed once per process (and once per machine on disk)."""
    return _toolchain_for(find_compiler())
