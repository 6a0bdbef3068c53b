"""What CPU this is: model name, the SIMD features actually usable, core count, cache sizes."""

from __future__ import annotations

import functools
import os
import platform
import re
from dataclasses import dataclass, field
from pathlib import Path

# Features that matter for generated kernels, under one spelling across architectures.
_X86_FEATURES = {
    "sse4_2": "sse4_2", "avx": "avx", "avx2": "avx2", "fma": "fma", "f16c": "f16c",
    "avx512f": "avx512f", "avx512bw": "avx512bw", "avx512dq": "avx512dq", "avx512vl": "avx512vl",
    "avx512_vnni": "avx512_vnni", "avx512_bf16": "avx512_bf16", "avx512_fp16": "avx512_fp16",
    "amx_tile": "amx_tile", "avx_vnni": "avx_vnni",
}
_ARM_FEATURES = {"asimd": "neon", "fphp": "fp16", "asimdhp": "fp16", "sve": "sve", "sve2": "sve2",
                 "asimddp": "dotprod", "i8mm": "i8mm", "bf16": "bf16"}


@dataclass(frozen=True)
class CpuInfo:
    model: str
    arch: str
    isa: tuple[str, ...]  # sorted, canonical names
    cores: int  # logical CPUs of the machine (not only those this process may use)
    # L1d, L2, L3 sizes; empty means "read them from the system" (cache_sizes(), only kernels need them)
    cache_bytes: dict[str, int] = field(default_factory=dict)

    def caches(self) -> dict[str, int]:
        return self.cache_bytes or cache_sizes()

    def has(self, feature: str) -> bool:
        return feature in self.isa


def _linux_cpuinfo() -> tuple[str, set[str]]:
    model, flags = "", set[str]()
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return model, flags
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model", "hardware") and not model:
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
        if model and flags:
            break
    return model, flags


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


@functools.lru_cache(maxsize=1)
def cpu_info() -> CpuInfo:
    arch = platform.machine().lower()
    system = platform.system()
    model, raw = "", set[str]()
    if system == "Linux":
        model, raw = _linux_cpuinfo()
    elif system == "Darwin":
        model = _darwin_sysctl("machdep.cpu.brand_string")
        raw = set(_darwin_sysctl("machdep.cpu.features").lower().split())
        raw |= set(_darwin_sysctl("machdep.cpu.leaf7_features").lower().split())
        if arch in ("arm64", "aarch64"):
            raw.add("asimd")  # every Apple silicon core has NEON
    table = _ARM_FEATURES if arch in ("aarch64", "arm64") else _X86_FEATURES
    isa = tuple(sorted({table[f] for f in raw if f in table}))
    return CpuInfo(model=model or platform.processor() or arch, arch=arch, isa=isa, cores=os.cpu_count() or 1)
