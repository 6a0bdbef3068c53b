"""What an input looks like, without its data: `TensorSpec`, the tuning key of an input, example inputs.

A spec is plain data (dtype name, sizes, strides and storage offset in elements, device), so it can be
stored, compared, sent to another process and turned back into a random input of exactly that layout.
numpy arrays are the default; torch tensors are supported when torch is installed (imported lazily).
"""

from __future__ import annotations

import math
import random
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np

from tuneforge.cpuinfo import usable_cores
from tuneforge.dataclass_lite import dataclass
from tuneforge.tune import bulk

__all__ = ["InputGenerator", "TensorSpec", "example_input", "example_inputs", "key_of", "preserve_rng_state"]

# A per-argument replacement for the random data: called as generator(spec, rng), returns an array
# (or tensor) with the spec's sizes; it is copied into the spec's layout when its own layout differs.
InputGenerator = Callable[["TensorSpec", "np.random.Generator"], Any]  # a string: numpy.random loads lazily

FRAMEWORKS = ("numpy", "torch")
# Element sizes of torch dtypes that numpy does not have.
_TORCH_ONLY_ITEMSIZE = {
    "bfloat16": 2, "complex32": 4, "float8_e4m3fn": 1, "float8_e4m3fnuz": 1, "float8_e5m2": 1,
    "float8_e5m2fnuz": 1, "float8_e8m0fnu": 1,
}
_MAX_BASE_DEPTH = 64


def _numpy_dtype(name: str) -> np.dtype[Any] | None:
    if name in ("bfloat16", "complex32") or name.startswith("float8"):
        return None
    try:
        return np.dtype(name)
    except TypeError:
        return None


def _dtype_name(dtype: Any) -> str:
    """Canonical dtype name: numpy's name, or a torch dtype's name without the ``torch.`` prefix."""
    if isinstance(dtype, str):
        text = dtype.removeprefix("torch.")
        numpy_dtype = _numpy_dtype(text)
        return numpy_dtype.name if numpy_dtype is not None else text
    if type(dtype).__module__.startswith("torch"):
        return str(dtype).removeprefix("torch.")
    try:
        name: str = np.dtype(dtype).name
    except TypeError:
        raise ValueError(f"not a dtype: {dtype!r}") from None
    return name


def _torch() -> Any:
    import torch

    return torch


def _is_torch_tensor(obj: Any) -> bool:
    if "torch" not in sys.modules and not type(obj).__module__.startswith("torch"):
        return False
    return isinstance(obj, _torch().Tensor)


@dataclass(frozen=True)
class TensorSpec:
    """Layout of one input: dtype name, sizes, strides and storage offset (in elements), device.

    ``framework`` is ``"numpy"`` or ``"torch"``: what `example_input` builds. Left empty, it is
    ``"torch"`` when the device is not the CPU or numpy has no such dtype (bfloat16), else ``"numpy"``.
    It is not part of `key_of`: the same layout tunes the same whatever array type carries it.
    """

    dtype: str
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int = 0
    device: str = "cpu"
    device_index: int | None = None
    framework: str = ""

    def __post_init__(self) -> None:
        set_field = object.__setattr__
        set_field(self, "dtype", _dtype_name(self.dtype))
        set_field(self, "sizes", tuple(int(s) for s in self.sizes))
        set_field(self, "strides", tuple(int(s) for s in self.strides))
        set_field(self, "offset", int(self.offset))
        if len(self.sizes) != len(self.strides):
            raise ValueError(f"TensorSpec: {len(self.sizes)} sizes {self.sizes} but "
                             f"{len(self.strides)} strides {self.strides}")
        if any(s < 0 for s in self.sizes):
            raise ValueError(f"TensorSpec: negative size in {self.sizes}")
        if any(s < 0 for s in self.strides):
            raise ValueError(f"TensorSpec: negative stride in {self.strides} (negative strides are not supported)")
        if self.offset < 0:
            raise ValueError(f"TensorSpec: negative storage offset {self.offset}")
        framework = self.framework
        if not framework:
            framework = "torch" if self.device != "cpu" or _numpy_dtype(self.dtype) is None else "numpy"
            set_field(self, "framework", framework)
        if framework not in FRAMEWORKS:
            raise ValueError(f"TensorSpec: framework must be one of {FRAMEWORKS}, not {framework!r}")
        if framework == "numpy":
            if self.device != "cpu":
                raise ValueError(f"TensorSpec: numpy arrays live on the CPU, not {self.device!r} "
                                 f"(use framework='torch')")
            if _numpy_dtype(self.dtype) is None:
                raise ValueError(f"TensorSpec: numpy has no dtype {self.dtype!r} (use framework='torch')")

    @classmethod
    def of(cls, obj: Any) -> TensorSpec:
        """The spec of a numpy array (or numpy scalar), a torch tensor, or a spec (returned as is)."""
        if isinstance(obj, TensorSpec):
            return obj
        if isinstance(obj, np.generic):
            obj = np.asarray(obj)
        if isinstance(obj, np.ndarray):
            return cls._of_numpy(obj)
        if _is_torch_tensor(obj):
            return cls(dtype=str(obj.dtype), sizes=tuple(obj.shape), strides=tuple(obj.stride()),
                       offset=obj.storage_offset(), device=obj.device.type, device_index=obj.device.index,
                       framework="torch")
        raise TypeError(f"TensorSpec.of: expected a numpy array, a torch tensor or a TensorSpec, "
                        f"got {type(obj).__name__}")

    @classmethod
    def _of_numpy(cls, arr: np.ndarray[Any, Any]) -> TensorSpec:
        itemsize = arr.dtype.itemsize
        strides = []
        for byte_stride in arr.strides:
            if byte_stride < 0:
                raise ValueError(f"array has negative strides {arr.strides} (bytes), e.g. from a[::-1]; "
                                 f"negative strides are not supported: pass a copy (np.ascontiguousarray)")
            if itemsize and byte_stride % itemsize:
                raise ValueError(f"array stride of {byte_stride} bytes is not a multiple of its {arr.dtype} "
                                 f"item size ({itemsize} bytes); pass a copy (np.ascontiguousarray)")
            strides.append(byte_stride // itemsize if itemsize else 0)
        return cls(dtype=arr.dtype.name, sizes=tuple(arr.shape), strides=tuple(strides),
                   offset=_numpy_offset(arr), framework="numpy")

    @classmethod
    def contiguous(cls, sizes: Sequence[int], dtype: Any = "float32", *, device: str = "cpu",
                   device_index: int | None = None, framework: str = "") -> TensorSpec:
        """A C-contiguous (row-major) spec with offset 0."""
        sizes = tuple(int(s) for s in sizes)
        strides = [1] * len(sizes)
        for i in range(len(sizes) - 2, -1, -1):
            strides[i] = strides[i + 1] * max(sizes[i + 1], 1)
        return cls(dtype=dtype, sizes=sizes, strides=tuple(strides), device=device,
                   device_index=device_index, framework=framework)

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)

    @property
    def itemsize(self) -> int:
        numpy_dtype = _numpy_dtype(self.dtype)
        if numpy_dtype is not None:
            return numpy_dtype.itemsize
        if self.dtype in _TORCH_ONLY_ITEMSIZE:
            return _TORCH_ONLY_ITEMSIZE[self.dtype]
        if "torch" in sys.modules and isinstance(getattr(sys.modules["torch"], self.dtype, None),
                                                 sys.modules["torch"].dtype):
            return int(getattr(sys.modules["torch"], self.dtype).itemsize)
        raise ValueError(f"unknown item size of dtype {self.dtype!r}")

    @property
    def storage_size(self) -> int:
        """Elements of storage the view needs: its offset plus the span its sizes and strides reach."""
        if self.numel == 0:
            return self.offset
        return self.offset + 1 + sum((size - 1) * stride for size, stride in zip(self.sizes, self.strides, strict=True))

    def is_contiguous(self) -> bool:
        """Row-major contiguous; like torch, dimensions of size 1 may have any stride."""
        if self.numel == 0:
            return True
        expected = 1
        for size, stride in zip(reversed(self.sizes), reversed(self.strides), strict=True):
            if size != 1 and stride != expected:
                return False
            expected *= size
        return True

    def sizes_text(self) -> str:
        """``512x256``; ``scalar`` for a 0-d input."""
        return "x".join(str(s) for s in self.sizes) if self.sizes else "scalar"

    def describe(self) -> str:
        """``float32[512x256]``, with strides and offset when not plainly contiguous:
        ``float32[512x256 @1,512]``, ``float32[512x256 @256,1 +8]``; a non-CPU device is appended."""
        inner = "x".join(str(s) for s in self.sizes)
        if not self.is_contiguous() or self.offset:
            inner += " @" + ",".join(str(s) for s in self.strides)
        if self.offset:
            inner += f" +{self.offset}"
        text = f"{self.dtype}[{inner}]"
        if self.device != "cpu":
            text += f" {self.device}" + (f":{self.device_index}" if self.device_index is not None else "")
        return text


def _numpy_offset(arr: np.ndarray[Any, Any]) -> int:
    """Element offset of a view from the start of its root ndarray's buffer (0 when it owns its data).

    Follows ``.base`` through non-ndarray holders too (``as_strided`` puts one in between).
    """
    root = arr
    node: Any = arr.base
    for _ in range(_MAX_BASE_DEPTH):
        if node is None:
            break
        if isinstance(node, np.ndarray):
            root = node
        node = getattr(node, "base", None)
    if root is arr:
        return 0
    byte_offset = int(arr.__array_interface__["data"][0]) - int(root.__array_interface__["data"][0])
    itemsize = arr.dtype.itemsize
    if byte_offset < 0 or (itemsize and byte_offset % itemsize):
        raise ValueError(f"array view starts {byte_offset} bytes from the start of its base array, which is not "
                         f"a whole, non-negative number of {arr.dtype} elements; pass a copy (np.ascontiguousarray)")
    return byte_offset // itemsize if itemsize else 0


def key_of(spec: TensorSpec) -> tuple[Any, ...]:
    """What a cached tuning result depends on: device type, dtype, sizes, strides, offset.

    Not the device index (any GPU of a kind tunes alike), not the data, not the array type.
    """
    return (spec.device, spec.dtype, spec.sizes, spec.strides, spec.offset)


@contextmanager
def preserve_rng_state() -> Iterator[None]:
    """Restore the global random states on exit: Python's `random`, numpy's, and torch's (CPU, and CUDA
    when initialised) when torch is already imported."""
    python_state = random.getstate()
    numpy_state = np.random.get_state()
    torch = sys.modules.get("torch")
    torch_state = torch.random.get_rng_state() if torch is not None else None
    cuda_states = None
    if torch is not None and torch.cuda.is_initialized():
        cuda_states = torch.cuda.get_rng_state_all()
    try:
        yield
    finally:
        random.setstate(python_state)
        np.random.set_state(numpy_state)
        if torch is not None:
            torch.random.set_rng_state(torch_state)
            if cuda_states is not None:
                torch.cuda.set_rng_state_all(cuda_states)


def _where(index: int | None) -> str:
    return "generator" if index is None else f"generator for argument {index}"


# From this many values, floats are drawn in PARTS parts, each from its own stream spawned from the seed, on up to
# PARTS threads, no more than the process may run on (numpy's generators release the GIL while they fill): a
# 4096x4096 float32 input took 0.26-0.36 s on one core of a 2-core VM and 0.13-0.14 on two, twice per cold GEMM
# tuning. The split is fixed, not the core count, so the values are the same on every machine.
PARALLEL_DRAW_FROM, PARTS = 1 << 22, 4


def _normal_float32(count: int, seed: int, rng: np.random.Generator) -> np.ndarray[Any, Any]:
    if count < PARALLEL_DRAW_FROM:
        return rng.standard_normal(count, dtype=np.float32)
    out = np.empty(count, dtype=np.float32)
    streams = np.random.SeedSequence(seed).spawn(PARTS)

    def fill(index: int, part: slice) -> None:
        np.random.default_rng(streams[index]).standard_normal(out=out[part], dtype=np.float32)

    bulk.in_parts(fill, count, PARTS, workers=min(PARTS, usable_cores()))
    return out


def _random_numpy(dtype: np.dtype[Any], count: int, rng: np.random.Generator, seed: int) -> np.ndarray[Any, Any]:
    if dtype == np.float32:  # drawn in the dtype itself: no float64 temporary to convert
        return _normal_float32(count, seed, rng)
    if dtype.kind == "f":
        # float64 too is drawn in float32, then widened: 0.17 s instead of 0.44 for 4096x4096 here, where the
        # benchmark worker's inputs were the largest part of a cold GEMV selection but the compiler's
        return _normal_float32(count, seed, rng).astype(dtype)
    if dtype.kind == "c":
        return (rng.standard_normal(count) + 1j * rng.standard_normal(count)).astype(dtype)
    if dtype.kind == "i":
        return rng.integers(-8, 9, count).astype(dtype)
    if dtype.kind == "u":
        return rng.integers(0, 17, count).astype(dtype)
    if dtype.kind == "b":
        return rng.integers(0, 2, count).astype(dtype)
    raise ValueError(f"cannot make random example values of dtype {dtype.name!r}")


def _numpy_view(spec: TensorSpec, storage: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    itemsize = storage.dtype.itemsize
    view: np.ndarray[Any, Any] = np.ndarray(spec.sizes, dtype=storage.dtype, buffer=storage,
                                            offset=spec.offset * itemsize,
                                            strides=tuple(s * itemsize for s in spec.strides))
    return view


def _numpy_example(spec: TensorSpec, seed: int, generator: InputGenerator | None,
                   index: int | None) -> np.ndarray[Any, Any]:
    dtype = np.dtype(spec.dtype)
    rng = np.random.default_rng(seed)
    if generator is None:
        return _numpy_view(spec, _random_numpy(dtype, spec.storage_size, rng, seed))
    with preserve_rng_state():
        value = np.asarray(generator(spec, rng))
    if tuple(value.shape) != spec.sizes:
        raise ValueError(f"{_where(index)} returned shape {tuple(value.shape)}, but the spec "
                         f"{spec.describe()} has sizes {spec.sizes}")
    try:
        if value.dtype == dtype and TensorSpec.of(value) == spec:
            return value
    except ValueError:
        pass  # a layout TensorSpec cannot describe (negative strides): copy it below
    view = _numpy_view(spec, np.zeros(spec.storage_size, dtype=dtype))
    try:
        np.copyto(view, value, casting="same_kind")
    except TypeError as exc:
        raise ValueError(f"{_where(index)} returned dtype {value.dtype}, which cannot be cast to the spec's "
                         f"{spec.dtype}: {exc}") from None
    return view


def _torch_example(spec: TensorSpec, seed: int, generator: InputGenerator | None, index: int | None) -> Any:
    torch = _torch()
    dtype = getattr(torch, spec.dtype, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"torch has no dtype {spec.dtype!r}")
    device = torch.device(spec.device) if spec.device_index is None else torch.device(spec.device, spec.device_index)
    count = spec.storage_size
    if generator is not None:
        with preserve_rng_state():
            value = generator(spec, np.random.default_rng(seed))
        if not isinstance(value, torch.Tensor):
            value = torch.as_tensor(np.ascontiguousarray(value))
        if tuple(value.shape) != spec.sizes:
            raise ValueError(f"{_where(index)} returned shape {tuple(value.shape)}, but the spec "
                             f"{spec.describe()} has sizes {spec.sizes}")
        if value.dtype == dtype and value.device == device and TensorSpec.of(value) == spec:
            return value
        storage = torch.zeros(count, dtype=dtype, device=device)
        view = torch.as_strided(storage, spec.sizes, spec.strides, spec.offset)
        view.copy_(value)
        return view
    # Values are drawn on the CPU with a private generator (never the global one), so they are the same
    # on every device, then moved.
    cpu_rng = torch.Generator(device="cpu")
    cpu_rng.manual_seed(seed)
    if dtype.is_complex:
        flat = torch.randn(count, generator=cpu_rng, dtype=torch.complex64)
    elif dtype.is_floating_point:
        flat = torch.randn(count, generator=cpu_rng, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
    elif dtype == torch.bool:
        flat = torch.randint(0, 2, (count,), generator=cpu_rng, dtype=torch.int64)
    else:
        signed = torch.iinfo(dtype).min < 0
        flat = torch.randint(-8 if signed else 0, 9 if signed else 17, (count,), generator=cpu_rng, dtype=torch.int64)
    storage = flat.to(dtype=dtype).to(device=device)
    return torch.as_strided(storage, spec.sizes, spec.strides, spec.offset)


def example_input(spec: TensorSpec, *, seed: int = 0, generator: InputGenerator | None = None) -> Any:
    """Random data with exactly the spec's sizes, strides and offset, in storage big enough for the offset.

    Floats are standard normal (drawn in float32, whatever the dtype), signed integers in [-8, 8], unsigned in
    [0, 16], bools random; drawn from a generator seeded with `seed`, never from a global random state.
    ``generator(spec, rng)`` replaces the random data (valid indices, say); it runs with the global random states
    saved and restored.
    """
    return _example(spec, seed, generator, None)


def zeroed(spec: TensorSpec) -> Any:
    """Zeros with exactly the spec's sizes, strides and offset: an output buffer whose contents will be replaced
    (drawing random values for it cost a third of making a large GEMM's arguments)."""
    spec = TensorSpec.of(spec)
    if spec.framework == "torch":
        torch = _torch()
        device = torch.device(spec.device) if spec.device_index is None else torch.device(spec.device,
                                                                                           spec.device_index)
        storage = torch.zeros(spec.storage_size, dtype=getattr(torch, spec.dtype), device=device)
        return torch.as_strided(storage, spec.sizes, spec.strides, spec.offset)
    return _numpy_view(spec, np.zeros(spec.storage_size, dtype=np.dtype(spec.dtype)))


def _example(spec: TensorSpec, seed: int, generator: InputGenerator | None, index: int | None) -> Any:
    spec = TensorSpec.of(spec)
    if spec.framework == "torch":
        return _torch_example(spec, seed, generator, index)
    return _numpy_example(spec, seed, generator, index)


def example_inputs(specs: Sequence[TensorSpec], *, seed: int = 0,
                   generators: Mapping[int, InputGenerator] | None = None) -> list[Any]:
    """One example input per spec; argument i gets seed ``seed + i`` and ``generators.get(i)``."""
    generators = generators or {}
    unknown = sorted(i for i in generators if not 0 <= i < len(specs))
    if unknown:
        raise ValueError(f"generators given for arguments {unknown}, but there are only {len(specs)} specs")
    return [_example(spec, seed + i, generators.get(i), i) for i, spec in enumerate(specs)]
