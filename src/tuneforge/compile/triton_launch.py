"""Launching a stored Triton kernel through the CUDA driver (compile/cuda_driver.py), without importing Triton.

Importing Triton costs ~140 ms, three times the budget of a warm start (a fresh process that finds its
decision and kernels in the caches). Everything a launch needs is in the stored entry: the cubin, the
kernel's name, its warps and shared memory (Triton's metadata JSON) and the signature it was compiled
for. The calling convention is Triton's: the non-constexpr arguments in signature order, then one
pointer per scratch buffer the compiler knows of (global, then profile scratch; null when the kernel
needs none). Kernels that need more than that (scratch memory, clusters, cooperative or PDL launches,
TMA descriptors) are `LaunchUnsupported`, and the caller launches them through Triton instead.
"""

from __future__ import annotations

import ctypes
import functools
import json
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tuneforge.compile import cuda_driver
from tuneforge.dataclass_lite import dataclass
from tuneforge.errors import TuneforgeError
from tuneforge.store.artifacts import Entry

__all__ = ["LaunchPlan", "LaunchUnsupported", "StoredTritonKernel", "plan"]

Convert = Callable[[Any], Any]


class LaunchUnsupported(TuneforgeError):
    """The stored kernel needs a launch feature this launcher does not do (the message says which)."""


def _half(value: Any) -> ctypes.c_uint16:
    return ctypes.c_uint16(struct.unpack("<H", struct.pack("<e", float(value)))[0])


def _bfloat16(value: Any) -> ctypes.c_uint16:
    bits = struct.unpack("<I", struct.pack("<f", float(value)))[0]
    return ctypes.c_uint16((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16)  # round to nearest even


def _pointer(value: Any) -> ctypes.c_void_p:
    address = value.data_ptr() if hasattr(value, "data_ptr") else value
    if address is None:
        return ctypes.c_void_p(0)
    if not isinstance(address, int) or isinstance(address, bool):
        raise TypeError(f"a pointer argument needs a tensor or an address (int), not {type(value).__name__}")
    return ctypes.c_void_p(address)


_SCALARS: dict[str, Convert] = {
    "i1": ctypes.c_int8, "i8": ctypes.c_int8, "i16": ctypes.c_int16, "i32": ctypes.c_int32,
    "i64": ctypes.c_int64, "u1": ctypes.c_uint8, "u8": ctypes.c_uint8, "u16": ctypes.c_uint16,
    "u32": ctypes.c_uint32, "u64": ctypes.c_uint64, "fp32": ctypes.c_float, "f32": ctypes.c_float,
    "fp64": ctypes.c_double, "fp16": _half, "bf16": _bfloat16,
}


def converter(kind: str) -> Convert:
    """How a Python value becomes the kernel parameter of Triton type `kind` ("*fp16", "i32", "fp32", ...)."""
    if kind.startswith("*"):
        return _pointer
    found = _SCALARS.get(kind)
    if found is None:
        raise LaunchUnsupported(f"argument type {kind!r} (tuples, tensor descriptors) is launched through Triton")
    return found


@dataclass(frozen=True)
class LaunchPlan:
    """How to launch one compiled kernel: its entry name, block size, dynamic shared memory, a converter per
    run-time argument (in order) and how many null scratch pointers follow them."""

    name: str
    threads: int
    shared: int
    kinds: tuple[str, ...]
    scratch_pointers: int

    def parameters(self) -> list[str]:
        """The kernel's parameter types as the PTX declares them (u64 for pointers): for checking a plan."""
        ptx = {"i1": "u8", "i8": "u8", "u1": "u8", "u8": "u8", "i16": "u16", "u16": "u16", "fp16": "u16",
               "bf16": "u16", "i32": "u32", "u32": "u32", "i64": "u64", "u64": "u64", "fp32": "f32", "f32": "f32",
               "fp64": "f64"}
        return [("u64" if kind.startswith("*") else ptx[kind]) for kind in self.kinds] + ["u64"] * self.scratch_pointers


def plan(metadata: Mapping[str, Any], signature: Mapping[str, str]) -> LaunchPlan:
    """The launch plan of a kernel from Triton's metadata and the signature it was compiled with; raises
    `LaunchUnsupported` for what only Triton's own launcher does."""
    unsupported = [what for what, needed in (
        ("a cluster of CTAs", int(metadata.get("num_ctas", 1)) != 1),
        ("global scratch memory", int(metadata.get("global_scratch_size", 0)) > 0),
        ("profile scratch memory", int(metadata.get("profile_scratch_size", 0)) > 0),
        ("a cooperative launch", bool(metadata.get("launch_cooperative_grid"))),
        ("programmatic dependent launch", bool(metadata.get("launch_pdl"))),
        ("TMA descriptors", bool(metadata.get("tensordesc_meta"))),
        ("tensor memory", int(metadata.get("tmem_size", 0)) > 0),
    ) if needed]
    if unsupported:
        raise LaunchUnsupported(f"kernel {metadata.get('name')!r} needs {', '.join(unsupported)}")
    if "global_scratch_size" not in metadata or "name" not in metadata or "shared" not in metadata:
        raise LaunchUnsupported("the metadata is not that of Triton >= 3.5 (no global_scratch_size, name or shared)")
    kinds = tuple(kind for kind in signature.values() if kind != "constexpr")
    for kind in kinds:
        converter(kind)  # LaunchUnsupported for a type without a converter
    # Triton >= 3.5 appends a global and a profile scratch pointer to every kernel's parameters.
    scratch = 1 + int("profile_scratch_size" in metadata)
    warps, warp = int(metadata["num_warps"]), int(metadata.get("warp_size", 32))
    return LaunchPlan(str(metadata["name"]), warps * warp, int(metadata["shared"]), kinds, scratch)


@functools.cache
def _stream_of() -> Callable[[int], int]:
    """How to read torch's current stream on a device (the stream Triton launches on), found once: a
    launch happens on every call of a tuned op."""
    import torch

    get_raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if get_raw is not None:
        return lambda device: int(get_raw(device))
    return lambda device: int(torch.cuda.current_stream(device).cuda_stream)


class StoredTritonKernel:
    """A stored Triton kernel, launchable as ``kernel(grid, runtime_args, device)`` on torch's current stream.

    The cubin is loaded into the device's context when first launched; the entry's files are read now,
    so the store may evict the entry afterwards.
    """

    def __init__(self, entry: Entry, signature: Mapping[str, str]) -> None:
        self.key = entry.key
        meta = entry.meta
        metadata = json.loads(entry.file(meta["metadata"]).read_text())
        self.plan = plan(metadata, signature)
        self.arch = f"sm_{meta['target']['arch']}"
        self._image = entry.file(meta["binary"]).read_bytes()
        self._converters = [converter(kind) for kind in self.plan.kinds]
        self._tail = [ctypes.c_void_p(0) for _ in range(self.plan.scratch_pointers)]
        self._function: cuda_driver.CudaFunction | None = None
        self._context = 0

    def _loaded(self) -> cuda_driver.CudaFunction:
        context = cuda_driver.current_context()
        if self._function is None or context != self._context:
            module = cuda_driver.load_image(self._image, self.key, self.arch)
            self._function, self._context = module.function(self.plan.name), context
        return self._function

    def __call__(self, grid: Sequence[int], args: Sequence[Any], device: int) -> None:
        if len(args) != len(self._converters):
            raise TypeError(f"kernel {self.plan.name} takes {len(self._converters)} run-time arguments, "
                            f"got {len(args)}")
        if not all(grid):
            return  # an empty grid: nothing to do (the driver would refuse it)
        values = [convert(value) for convert, value in zip(self._converters, args, strict=True)]
        dims = (*grid, 1, 1)[:3]
        if len(grid) > 3 or not all(isinstance(d, int) and d > 0 for d in dims):
            raise ValueError(f"kernel {self.plan.name}: the grid must be 1 to 3 positive ints, not {grid!r}")
        # _loaded() made the module's context the current one (or loaded it into the current one)
        self._loaded().launch(dims, self.plan.threads, [*values, *self._tail], self.plan.shared,  # type: ignore[arg-type]
                              _stream_of()(device))

    def __repr__(self) -> str:
        return f"StoredTritonKernel({self.plan.name!r}, {self.key})"
