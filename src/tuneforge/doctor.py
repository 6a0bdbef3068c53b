"""Environment checks behind `tuneforge doctor`: each check is data, so tests can read them."""

from __future__ import annotations

import importlib.util
import os
import time
from dataclasses import dataclass
from pathlib import Path

from tuneforge import config


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
    root = Path(config.get("cache_dir"))
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".doctor.{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
        return Check("cache dir writable", True, str(root))
    except OSError as exc:
        return Check("cache dir writable", False, f"{root}: {exc} (set TUNEFORGE_CACHE_DIR)")


def _optional(module: str, purpose: str) -> Check:
    present = importlib.util.find_spec(module) is not None  # found, not imported: stays fast
    return Check(f"optional: {module}", present, purpose if present else f"not installed ({purpose})",
                 required=False)


def run_checks() -> list[Check]:
    from tuneforge.cpuinfo import cpu_info

    cpu = cpu_info()
    checks = [Check("CPU", True, f"{cpu.model} ({cpu.cores} cores)"),
              Check("ISA features", True, " ".join(cpu.isa) or "none detected", required=False),
              _cache_dir_check()]
    checks += _compiler_checks()
    checks += [_optional("redis", "remote cache tier, pip install 'tuneforge[redis]'"),
               _optional("ray", "distributed tuning, pip install 'tuneforge[distributed]'"),
               _optional("torch", "torch tensors as inputs, pip install 'tuneforge[torch]'"),
               _optional("triton", "Triton kernels (GPU)")]
    return checks
