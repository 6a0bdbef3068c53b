"""What CPU this is: model name, the SIMD features actually usable, core count, cache sizes.

These facts name the machine in every tuning record's key (tune.fingerprint.system_fingerprint), so they
must tell apart machines whose timings differ even where the marketing name does not: a cloud VM
says "AMD EPYC" for several generations, and an ARM kernel often has no model name at all. The
vendor/family/model numbers (x86) or implementer/part (ARM) are kept as `ident` for that.
"""

from __future__ import annotations

import functools
import os
import platform
import re
from dataclasses import field
from pathlib import Path

from tuneforge.dataclass_lite import dataclass

# Features that matter for generated kernels, under one spelling across architectures.
_X86_FEATURES = {
    "sse4_2": "sse4_2", "avx": "avx", "avx2": "avx2", "fma": "fma", "f16c": "f16c",
    "avx512f": "avx512f", "avx512bw": "avx512bw", "avx512dq": "avx512dq", "avx512vl": "avx512vl",
    "avx512_vnni": "avx512_vnni", "avx512_bf16": "avx512_bf16", "avx512_fp16": "avx512_fp16",
    "amx_tile": "amx_tile", "avx_vnni": "avx_vnni",
    # Vector extensions -march=native lets the compiler use: a VM that masks one of them (same model
    # name) runs different code, so its records must not be shared.
    "ssse3": "ssse3", "sse4_1": "sse4_1", "bmi2": "bmi2", "avx512cd": "avx512cd", "avx512ifma": "avx512ifma",
    "avx512vbmi": "avx512vbmi", "avx512_vbmi2": "avx512_vbmi2", "avx512_bitalg": "avx512_bitalg",
    "avx512_vpopcntdq": "avx512_vpopcntdq", "avx512_vp2intersect": "avx512_vp2intersect", "gfni": "gfni",
    "vaes": "vaes", "vpclmulqdq": "vpclmulqdq", "amx_bf16": "amx_bf16", "amx_int8": "amx_int8",
}
_ARM_FEATURES = {"asimd": "neon", "fphp": "fp16", "asimdhp": "fp16", "sve": "sve", "sve2": "sve2",
                 "asimddp": "dotprod", "i8mm": "i8mm", "bf16": "bf16", "sme": "sme"}

# The only file read on Linux; a name, not a literal, so tests can show a key follows its content.
PROC_CPUINFO = Path("/proc/cpuinfo")
# /proc/cpuinfo fields that identify the silicon beyond its name (x86: vendor, family, model;
# ARM: implementer, variant, part). Not the stepping: steppings of one model run the same code alike.
_IDENT_FIELDS = ("vendor_id", "cpu family", "model", "cpu implementer", "cpu variant", "cpu part")


@dataclass(frozen=True)
class CpuInfo:
    model: str
    arch: str
    isa: tuple[str, ...]  # sorted, canonical names
    cores: int  # logical CPUs of the machine (not only those this process may use)
    # L1d, L2, L3 sizes; empty means "read them from the system" (cache_sizes(), only kernels need them)
    cache_bytes: dict[str, int] = field(default_factory=dict)
    ident: str = ""  # e.g. "vendor_id=AuthenticAMD,cpu family=26,model=2"; empty where unknown

    def caches(self) -> dict[str, int]:
        return self.cache_bytes or cache_sizes()

    def has(self, feature: str) -> bool:
        return feature in self.isa


def _linux_cpuinfo() -> tuple[str, set[str], str]:
    """(model name, raw feature flags, ident) of the first processor listed."""
    model, flags, ident = "", set[str](), dict[str, str]()
    try:
        text = PROC_CPUINFO.read_text(errors="replace")
    except OSError:
        return model, flags, ""
    for line in text.splitlines():
        if not line.strip():
            if model and flags:
                break  # the first processor's block is complete; the others repeat it
            continue  # no name yet: ARM kernels may name the board in a block at the end
        key, _, value = line.partition(":")
        key, value = key.strip().lower(), value.strip()
        if key in ("model name", "cpu model", "hardware") and not model:
            model = value
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
        elif key in _IDENT_FIELDS and key not in ident:
            ident[key] = value
    return model, flags, ",".join(f"{k}={ident[k]}" for k in _IDENT_FIELDS if k in ident)


def _darwin_sysctl(name: str) -> str:
    import subprocess  # only on macOS

    try:
        return subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


@functools.lru_cache(maxsize=1)
def cache_sizes() -> dict[str, int]:
    sizes: dict[str, int] = {}
    base = Path("/sys/devices/system/cpu/cpu0/cache")
    if not base.is_dir():
        return sizes
    for index in sorted(base.glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size_text = (index / "size").read_text().strip()
        except OSError:
            continue
        match = re.fullmatch(r"(\d+)([KMG]?)", size_text)
        if not match or kind == "Instruction":
            continue
        scale = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30}[match.group(2)]
        name = "L1d" if level == "1" else f"L{level}"
        sizes[name] = int(match.group(1)) * scale
    return sizes


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), or the machine's where that is unknown."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


# What sizes OpenBLAS's thread pool when it loads, the first one set deciding.
BLAS_THREAD_VARIABLES = ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS")


def blas_threads() -> int:
    """The threads numpy's OpenBLAS runs on, as its environment sets them when it loads (BLAS_THREAD_VARIABLES; else
    every core this process may use). A change made later through threadpoolctl is not seen."""
    for name in BLAS_THREAD_VARIABLES:
        value = os.environ.get(name, "").split(",")[0].strip()
        if value.isdigit() and int(value) > 0:
            return int(value)
    return usable_cores()


@functools.lru_cache(maxsize=1)
def cpu_info() -> CpuInfo:
    arch = platform.machine().lower()
    system = platform.system()
    model, raw, ident = "", set[str](), ""
    if system == "Linux":
        model, raw, ident = _linux_cpuinfo()
    elif system == "Darwin":
        model = _darwin_sysctl("machdep.cpu.brand_string")
        raw = set(_darwin_sysctl("machdep.cpu.features").lower().split())
        raw |= set(_darwin_sysctl("machdep.cpu.leaf7_features").lower().split())
        if arch in ("arm64", "aarch64"):
            raw.add("asimd")  # every Apple silicon core has NEON
    table = _ARM_FEATURES if arch in ("aarch64", "arm64") else _X86_FEATURES
    isa = tuple(sorted({table[f] for f in raw if f in table}))
    return CpuInfo(model=model or platform.processor() or arch, arch=arch, isa=isa, cores=os.cpu_count() or 1,
                   ident=ident)
