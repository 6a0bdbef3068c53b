"""Loading and launching cubins through the CUDA driver API, called with ctypes on libcuda.so.

No dependency at all: cuda-python (or cupy's RawModule) would add a package, and its import, to do what a
dozen driver calls do here; the driver library is on every machine with an NVIDIA GPU, and torch uses
the same primary context, so kernels loaded here run on torch's tensors and streams.

Every CUresult is checked; a failure raises `CudaError` with the driver's error name and text. Loaded
modules are kept per process and context (a forked child, whose contexts are invalid, loads again).
"""

from __future__ import annotations

import ctypes
import functools
import os
from collections.abc import Sequence
from typing import Any

from tuneforge.errors import TuneforgeError

_LIBRARY = "libcuda.so.1"
_ATTR_CC_MAJOR, _ATTR_CC_MINOR = 75, 76  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR
_FUNC_MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
_DEFAULT_SHARED_LIMIT = 48 * 1024  # above this, dynamic shared memory must be opted into per function
_NOT_FOUND = 500  # CUDA_ERROR_NOT_FOUND
_NO_BINARY_FOR_GPU = 209  # CUDA_ERROR_NO_BINARY_FOR_GPU
_HANDLE, _P = ctypes.c_void_p, ctypes.POINTER
_KERNEL_ARG_TYPES = (ctypes._SimpleCData, ctypes.Structure, ctypes.Union, ctypes.Array)

_PROTOTYPES: dict[str, list[Any]] = {
    "cuInit": [ctypes.c_uint],
    "cuGetErrorName": [ctypes.c_int, _P(ctypes.c_char_p)],
    "cuGetErrorString": [ctypes.c_int, _P(ctypes.c_char_p)],
    "cuDeviceGet": [_P(ctypes.c_int), ctypes.c_int],
    "cuDeviceGetAttribute": [_P(ctypes.c_int), ctypes.c_int, ctypes.c_int],
    "cuCtxGetCurrent": [_P(_HANDLE)],
    "cuCtxSetCurrent": [_HANDLE],
    "cuCtxGetDevice": [_P(ctypes.c_int)],
    "cuDevicePrimaryCtxRetain": [_P(_HANDLE), ctypes.c_int],
    "cuModuleLoadData": [_P(_HANDLE), ctypes.c_char_p],
    "cuModuleGetFunction": [_P(_HANDLE), _HANDLE, ctypes.c_char_p],
    "cuFuncSetAttribute": [_HANDLE, ctypes.c_int, ctypes.c_int],
    "cuLaunchKernel": [_HANDLE, *[ctypes.c_uint] * 7, _HANDLE, _P(_HANDLE), _P(_HANDLE)],
}


class CudaError(TuneforgeError, RuntimeError):
    """The CUDA driver is missing or a driver call failed; `name` is the CUresult's name (CUDA_ERROR_...)."""

    def __init__(self, message: str, *, call: str = "", code: int | None = None, name: str = "") -> None:
        self.call, self.code, self.name = call, code, name
        super().__init__(message)


@functools.cache
def driver() -> ctypes.CDLL:
    """libcuda with its prototypes declared, initialised (cuInit) once per process."""
    try:
        lib = ctypes.CDLL(_LIBRARY)
    except OSError as exc:
        raise CudaError(f"no CUDA driver: cannot load {_LIBRARY} ({exc}); this machine has no usable NVIDIA GPU",
                        call="dlopen") from None
    for name, argtypes in _PROTOTYPES.items():
        function = getattr(lib, name)
        function.argtypes, function.restype = argtypes, ctypes.c_int
    check("cuInit", lib.cuInit(0), lib)
    return lib


def _error_text(lib: ctypes.CDLL, code: int) -> tuple[str, str]:
    name, text = ctypes.c_char_p(), ctypes.c_char_p()
    lib.cuGetErrorName(code, ctypes.byref(name))
    lib.cuGetErrorString(code, ctypes.byref(text))
    return ((name.value or b"CUDA_ERROR_%d" % code).decode(), (text.value or b"unknown error").decode())


def check(call: str, result: int, lib: ctypes.CDLL | None = None, hint: str = "") -> None:
    """Raise CudaError naming `call` and the driver's error if `result` is not CUDA_SUCCESS."""
    if result == 0:
        return
    name, text = _error_text(lib or driver(), result)
    raise CudaError(f"{call} failed: {name}: {text}" + (f" ({hint})" if hint else ""), call=call, code=result,
                    name=name)


def driver_version() -> int:
    """The CUDA driver's version (e.g. 12080 for 12.8); a CudaError where there is no driver."""
    lib = driver()
    version = ctypes.c_int()
    check("cuDriverGetVersion", lib.cuDriverGetVersion(ctypes.byref(version)), lib)
    return int(version.value)


def _current(lib: ctypes.CDLL) -> int:
    ctx = _HANDLE()
    check("cuCtxGetCurrent", lib.cuCtxGetCurrent(ctypes.byref(ctx)), lib)
    return ctx.value or 0


def current_context() -> int:
    """The calling thread's context (torch's, once torch has used the GPU), else device 0's primary
    context made current: the one torch uses, so both share memory and streams. Retained for good."""
    lib = driver()
    ctx = _current(lib)
    if ctx:
        return ctx
    device, primary = ctypes.c_int(), _HANDLE()
    check("cuDeviceGet", lib.cuDeviceGet(ctypes.byref(device), 0), lib)
    check("cuDevicePrimaryCtxRetain", lib.cuDevicePrimaryCtxRetain(ctypes.byref(primary), device), lib)
    check("cuCtxSetCurrent", lib.cuCtxSetCurrent(primary), lib)
    return primary.value or 0


def device_arch() -> str:
    """sm_XX of the current context's device, else of device 0 (without creating a context)."""
    lib = driver()
    device = ctypes.c_int()
    if _current(lib):
        check("cuCtxGetDevice", lib.cuCtxGetDevice(ctypes.byref(device)), lib)
    else:
        check("cuDeviceGet", lib.cuDeviceGet(ctypes.byref(device), 0), lib)
    major, minor = ctypes.c_int(), ctypes.c_int()
    check("cuDeviceGetAttribute", lib.cuDeviceGetAttribute(ctypes.byref(major), _ATTR_CC_MAJOR, device), lib)
    check("cuDeviceGetAttribute", lib.cuDeviceGetAttribute(ctypes.byref(minor), _ATTR_CC_MINOR, device), lib)
    return f"sm_{major.value}{minor.value}"


def device_attribute(attribute: int, ordinal: int) -> int:
    """cuDeviceGetAttribute of device `ordinal` (the driver's numbering, which is CUDA_VISIBLE_DEVICES' as
    torch's is); needs no context."""
    lib = driver()
    device, value = ctypes.c_int(), ctypes.c_int()
    check("cuDeviceGet", lib.cuDeviceGet(ctypes.byref(device), ordinal), lib)
    check("cuDeviceGetAttribute", lib.cuDeviceGetAttribute(ctypes.byref(value), attribute, device), lib)
    return value.value


def _dims(value: int | Sequence[int], what: str) -> tuple[int, int, int]:
    dims = (value,) if isinstance(value, int) else tuple(value)
    if not 1 <= len(dims) <= 3 or not all(isinstance(d, int) and d >= 1 for d in dims):
        raise ValueError(f"{what} must be a positive int or 1 to 3 positive ints, not {value!r}")
    return (*dims, 1, 1)[:3]  # type: ignore[return-value]  # exactly three after the slice


def kernel_arg(value: Any, index: int) -> Any:
    """A launch argument as a ctypes object: ints (and tensors, by data_ptr()) are pointers; scalars must
    come typed (c_int, c_float, c_int64, ...), since a Python number does not say its width."""
    if isinstance(value, _KERNEL_ARG_TYPES):
        return value
    if hasattr(value, "data_ptr"):
        value = value.data_ptr()
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 64:
        return ctypes.c_void_p(value)
    raise TypeError(f"kernel argument {index} ({value!r}): give a device pointer (int or tensor) or a ctypes "
                    "scalar such as ctypes.c_int(n) or ctypes.c_float(x)")


def _stream_handle(stream: Any) -> int:
    handle = getattr(stream, "cuda_stream", stream)  # torch.cuda.Stream, or a raw CUstream
    if not isinstance(handle, int):
        raise TypeError(f"stream must be a CUstream handle (int) or a torch.cuda.Stream, not {stream!r}")
    return handle


class CudaFunction:
    """A kernel of a loaded module; call it with the grid, the block and the kernel's arguments."""

    def __init__(self, module: CudaModule, name: str, handle: int) -> None:
        self.module, self.name, self.handle = module, name, handle
        self._shared_limit = _DEFAULT_SHARED_LIMIT

    def __call__(self, grid: int | Sequence[int], block: int | Sequence[int], args: Sequence[Any],
                 shared_mem: int = 0, stream: Any = 0) -> None:
        """Launch asynchronously on `stream` (0: the legacy default stream)."""
        lib = driver()
        self.module.make_current()
        gx, gy, gz = _dims(grid, "grid")
        bx, by, bz = _dims(block, "block")
        values = [kernel_arg(a, i) for i, a in enumerate(args)]
        params = (_HANDLE * max(len(values), 1))(*[ctypes.addressof(v) for v in values])
        if shared_mem > self._shared_limit:
            check("cuFuncSetAttribute", lib.cuFuncSetAttribute(self.handle, _FUNC_MAX_DYNAMIC_SHARED, shared_mem), lib)
            self._shared_limit = shared_mem
        check("cuLaunchKernel", lib.cuLaunchKernel(self.handle, gx, gy, gz, bx, by, bz, shared_mem,
                                                   _stream_handle(stream), params, None), lib,
              hint=f"kernel {self.name}, grid {(gx, gy, gz)}, block {(bx, by, bz)}")

    def launch(self, grid: tuple[int, int, int], threads: int, values: Sequence[Any], shared_mem: int,
               stream: int) -> None:
        """`__call__` for callers that did its work already (a tuned op's every call): `values` are ctypes
        objects, `stream` a raw CUstream, the grid three positive ints, and the caller made sure the
        current context is the module's (see triton_launch.StoredTritonKernel)."""
        lib = driver()
        params = (_HANDLE * max(len(values), 1))(*[ctypes.addressof(v) for v in values])
        if shared_mem > self._shared_limit:
            check("cuFuncSetAttribute", lib.cuFuncSetAttribute(self.handle, _FUNC_MAX_DYNAMIC_SHARED, shared_mem), lib)
            self._shared_limit = shared_mem
        result = lib.cuLaunchKernel(self.handle, grid[0], grid[1], grid[2], threads, 1, 1, shared_mem, stream, params,
                                    None)
        if result != 0:
            check("cuLaunchKernel", result, lib, hint=f"kernel {self.name}, grid {grid}, block {(threads, 1, 1)}")

    def __repr__(self) -> str:
        return f"CudaFunction({self.name!r}, module={self.module.key})"


class CudaModule:
    """A cubin loaded into a CUDA context; `function(name)` finds an ``extern "C" __global__`` kernel."""

    def __init__(self, handle: int, context: int, key: str, arch: str) -> None:
        self.handle, self.context, self.key, self.arch = handle, context, key, arch
        self._functions: dict[str, CudaFunction] = {}

    def function(self, name: str) -> CudaFunction:
        known = self._functions.get(name)
        if known is None:
            lib = driver()
            self.make_current()
            handle = _HANDLE()
            result = lib.cuModuleGetFunction(ctypes.byref(handle), self.handle, name.encode())
            hint = 'declare the kernel extern "C" so its name is not mangled' if result == _NOT_FOUND else ""
            check(f"cuModuleGetFunction({name!r})", result, lib, hint)
            known = self._functions[name] = CudaFunction(self, name, handle.value or 0)
        return known

    def make_current(self) -> None:
        """Make this module's context current on a thread that has none; refuse another device's context."""
        lib = driver()
        current = _current(lib)
        if current == self.context:
            return
        if current:
            raise CudaError(f"module {self.key} was loaded in another CUDA context (another device?) than the "
                            "current one: load it again on this device", call="cuCtxGetCurrent")
        check("cuCtxSetCurrent", lib.cuCtxSetCurrent(self.context), lib)

    def __repr__(self) -> str:
        return f"CudaModule({self.key}, {self.arch})"


_modules: dict[tuple[int, int, str], CudaModule] = {}


def load_image(image: bytes, key: str, arch: str) -> CudaModule:
    """The cubin `image` (stored under `key`) loaded into the current context, once per process and context."""
    context = current_context()
    memo = (os.getpid(), context, key)
    module = _modules.get(memo)
    if module is None:
        lib = driver()
        handle = _HANDLE()
        result = lib.cuModuleLoadData(ctypes.byref(handle), image)
        hint = f"the cubin is for {arch}, the device is {device_arch()}" if result == _NO_BINARY_FOR_GPU else ""
        check("cuModuleLoadData", result, lib, hint)
        module = _modules[memo] = CudaModule(handle.value or 0, context, key, arch)
    return module
