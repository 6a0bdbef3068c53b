"""What names this machine in a tuning record's key, and the selection key built from it.

A record tuned here answers only where the same code would run the same way: the same OS and
architecture, CPU (model, family/model numbers, vector ISA, core count), compiler (its own content
hash), Python and tuneforge; for a selection on a GPU also that GPU (name, compute capability, SM
count, memory), its driver and the CUDA, torch and Triton versions. These facts sit above the
compiler layer (the compiler's identity comes from its cached probe), so they live in `tune`, not
beside the content hashes of `hashing`.
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform
import sys
from collections.abc import Mapping
from typing import Any

from tuneforge import config
from tuneforge._version import __version__
from tuneforge.hashing import key_hash


def system_fingerprint() -> dict[str, Any]:
    """Facts about this machine that can change a tuning result: computed once per process and
    compiler setting (a record tuned with one compiler must not answer for another one)."""
    # The compiler is found from these three strings (toolchain.find_compiler): keying on them costs
    # a few dict lookups per call (~1.5 us), where resolving the compiler would stat PATH every select().
    return _fingerprint(config.get_optional_str("cpp.cxx") or "", os.environ.get("CXX", ""), os.environ.get("PATH", ""))


@functools.lru_cache(maxsize=8)
def _fingerprint(cxx_setting: str, cxx_env: str, path: str) -> dict[str, Any]:
    from tuneforge import cpuinfo  # here, not at import: a warm start from the in-process memo never needs it
    from tuneforge.compile.toolchain import default_toolchain

    cpu = cpuinfo.cpu_info()
    try:
        compiler: dict[str, Any] = default_toolchain().identity()
    except Exception as exc:  # a machine without a compiler still has a fingerprint
        compiler = {"error": type(exc).__name__}
    facts: dict[str, Any] = {
        "os": platform.system(),
        "machine": platform.machine(),
        "cpu_model": cpu.model,
        "cpu_id": cpu.ident,
        "isa": list(cpu.isa),
        "cores": cpu.cores,
        "compiler": compiler,
        "python": f"{sys.implementation.name}-{sys.version_info.major}.{sys.version_info.minor}",
        "tuneforge": __version__,
    }
    facts["hash"] = key_hash(facts)
    return facts


def clear_fingerprint_cache() -> None:
    """Forget the fingerprints computed so far (after the facts behind them were re-read)."""
    _fingerprint.cache_clear()


def gpu_facts(**facts: Any) -> dict[str, Any]:
    """A GPU's fingerprint from its facts (as `gpu_fingerprint` reads them), with their hash."""
    return {**facts, "hash": key_hash(facts)}


@functools.lru_cache(maxsize=16)
def gpu_fingerprint(index: int) -> dict[str, Any]:
    """Facts about CUDA device `index` (torch's numbering) that can change a tuning result."""
    import torch

    from tuneforge.compile.cuda_driver import driver_version

    props = torch.cuda.get_device_properties(index)
    triton_version = package_version("triton")
    return gpu_facts(name=props.name, capability=[props.major, props.minor], sms=props.multi_processor_count,
                     memory_bytes=props.total_memory, driver=driver_version(), cuda=torch.version.cuda,
                     torch=torch.__version__, triton=triton_version)


def package_version(name: str) -> str | None:
    """An installed package's version without importing it (importing Triton costs ~140 ms): from the name of
    the ``.dist-info`` folder beside the package that would be imported, else importlib.metadata (whose own
    import takes 20-60 ms, a warm start's budget)."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is not None and spec.submodule_search_locations:
        prefix = name.replace("-", "_") + "-"
        site = os.path.dirname(next(iter(spec.submodule_search_locations)))
        with contextlib.suppress(OSError):
            for entry in os.scandir(site):
                if entry.name.startswith(prefix) and entry.name.endswith(".dist-info"):
                    return entry.name[len(prefix):-len(".dist-info")]
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def selection_key(op: str, what: Mapping[str, Any], *, gpu: int | None = None) -> str:
    """The key of one selection: the op, what its decision depends on (`what`: the arguments' keys for
    select(), the launcher's key for @autotune), this machine's fingerprint and, for a selection on
    CUDA device `gpu`, that GPU's (a CPU selection's key is what it always was)."""
    facts = {"op": op, **what, "system": system_fingerprint()["hash"]}
    if gpu is not None:
        facts["gpu"] = gpu_fingerprint(gpu)["hash"]
    return "sel" + key_hash(facts)
