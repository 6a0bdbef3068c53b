"""Environment checks behind `tuneforge doctor`: each check is data, so tests can read them."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

from tuneforge import config
from tuneforge.dataclass_lite import dataclass


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    required: bool = True


def _compiler_checks() -> list[Check]:
    from tuneforge.compile.toolchain import default_toolchain
    from tuneforge.errors import TuneforgeError

    try:
        tc = default_toolchain()
    except TuneforgeError as exc:
        return [Check("C++ compiler", False, str(exc))]
    from tuneforge.compile.toolchain import openmp_available

    march = " ".join(tc.target_flags(tc.march))
    has_openmp = openmp_available(tc)
    checks = [
        Check("C++ compiler", True, f"{tc.command[-1]} ({tc.version})"),
        Check("target CPU", True, march),
        Check("OpenMP", has_openmp, " ".join(tc.openmp_flags or ()) if has_openmp
              else "not available (install libgomp or libomp)", required=False),
    ]
    try:
        from tuneforge.compile.cpp import load

        started = time.perf_counter()
        lib = load('extern "C" int tuneforge_doctor(int x) { return x + 1; }\n')
        ok = lib.tuneforge_doctor(41) == 42
        checks.append(Check("compile and load", ok, f"{(time.perf_counter() - started) * 1e3:.1f} ms"))
    except TuneforgeError as exc:
        checks.append(Check("compile and load", False, str(exc).splitlines()[0]))
    return checks


def _cache_dir_check() -> Check:
    root = config.get_path("cache_dir")
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".doctor.{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
        return Check("cache dir writable", True, str(root))
    except OSError as exc:
        return Check("cache dir writable", False, f"{root}: {exc} (set TUNEFORGE_CACHE_DIR)")


def _meminfo_available() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        # Free pages only (no reclaimable page cache): an underestimate, used where /proc is missing.
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, OSError, ValueError):
        return None


def _cgroup_available() -> int | None:
    """What a container's cgroup memory limit (v2 or v1) still allows; None when there is none."""
    candidates: list[tuple[Path, str, str]] = []
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.strip().split(":", 2)
                if controllers == "":  # v2: one unified hierarchy
                    root, files = Path("/sys/fs/cgroup"), ("memory.max", "memory.current")
                elif "memory" in controllers.split(","):
                    root, files = Path("/sys/fs/cgroup/memory"), ("memory.limit_in_bytes", "memory.usage_in_bytes")
                else:
                    continue
                # Inside a container the cgroup path of /proc is often not mounted: fall back to the root.
                candidates += [(root / path.lstrip("/"), *files), (root, *files)]
    except (OSError, ValueError):
        return None
    for base, limit_name, usage_name in candidates:
        try:
            limit = (base / limit_name).read_text().strip()
            if limit == "max" or int(limit) >= 2**60:  # v1 spells "no limit" as a huge number
                return None
            return max(0, int(limit) - int((base / usage_name).read_text()))
        except (OSError, ValueError):
            continue
    return None


def available_memory() -> int | None:
    """Bytes this process can still allocate without swapping or being killed; None when unknown.

    /proc/meminfo describes the host; inside a container the cgroup limit is what ends a process.
    """
    known = [n for n in (_meminfo_available(), _cgroup_available()) if n is not None]
    return min(known) if known else None


def _memory_check() -> Check:
    from tuneforge.parsing import format_size

    available = available_memory()
    return Check("memory available", available is not None,
                 format_size(available) if available is not None else "unknown", required=False)


def _optional(module: str, purpose: str) -> Check:
    present = importlib.util.find_spec(module) is not None  # found, not imported: stays fast
    return Check(f"optional: {module}", present, purpose if present else f"not installed ({purpose})",
                 required=False)


def run_checks() -> list[Check]:
    from tuneforge.cpuinfo import cpu_info

    cpu = cpu_info()
    checks = [Check("CPU", True, f"{cpu.model} ({cpu.cores} cores)"),
              Check("ISA features", True, " ".join(cpu.isa) or "none detected", required=False),
              _memory_check(), _cache_dir_check()]
    checks += _compiler_checks()
    checks += [_optional("redis", "remote cache tier, pip install 'tuneforge[redis]'"),
               _optional("ray", "distributed tuning, pip install 'tuneforge[distributed]'"),
               _optional("torch", "torch tensors as inputs, pip install 'tuneforge[torch]'"),
               _optional("triton", "Triton kernels (GPU)")]
    return checks
