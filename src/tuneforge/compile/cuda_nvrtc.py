"""NVRTC (the CUDA runtime compiler library) driven through ctypes, run as a child process.

tuneforge runs this file as a script (``python -I cuda_nvrtc.py ...``), never imports it: NVRTC compiles
in the calling process, so only a child can be given a time-out and killed like nvcc, a crash inside
the library costs the child only, and the parent never maps the 140 MB library. It therefore uses the
standard library alone (no tuneforge import, so the child starts in ~15 ms).

    cuda_nvrtc.py version LIBRARY                            -> prints "major.minor"
    cuda_nvrtc.py compile LIBRARY SOURCE OUTPUT [OPTION...]  -> writes the cubin; the log goes to stderr

Exit status: 0 compiled, 1 the source did not compile (the log says why), 2 NVRTC itself failed.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

_COMPILATION_FAILED = 6  # NVRTC_ERROR_COMPILATION


class NvrtcFailure(Exception):
    """An NVRTC call returned an error other than a compile error."""


def _load(library: str) -> ctypes.CDLL:
    lib = ctypes.CDLL(library)
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p
    lib.nvrtcGetErrorString.argtypes = [ctypes.c_int]
    return lib


def _check(lib: ctypes.CDLL, call: str, result: int) -> None:
    if result != 0:
        message = lib.nvrtcGetErrorString(result) or b"unknown error"
        raise NvrtcFailure(f"{call} failed: {message.decode(errors='replace')} ({result})")


def version(lib: ctypes.CDLL) -> str:
    major, minor = ctypes.c_int(), ctypes.c_int()
    _check(lib, "nvrtcVersion", lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)))
    return f"{major.value}.{minor.value}"


def _log(lib: ctypes.CDLL, program: ctypes.c_void_p) -> str:
    size = ctypes.c_size_t()
    _check(lib, "nvrtcGetProgramLogSize", lib.nvrtcGetProgramLogSize(program, ctypes.byref(size)))
    buffer = ctypes.create_string_buffer(size.value)
    _check(lib, "nvrtcGetProgramLog", lib.nvrtcGetProgramLog(program, buffer))
    return buffer.value.decode(errors="replace")


def _cubin(lib: ctypes.CDLL, program: ctypes.c_void_p) -> bytes:
    size = ctypes.c_size_t()
    _check(lib, "nvrtcGetCUBINSize", lib.nvrtcGetCUBINSize(program, ctypes.byref(size)))
    if size.value == 0:  # a virtual (compute_XX) target gives PTX only; the caller never asks for one
        raise NvrtcFailure("NVRTC produced no cubin (was a virtual architecture given?)")
    buffer = ctypes.create_string_buffer(size.value)
    _check(lib, "nvrtcGetCUBIN", lib.nvrtcGetCUBIN(program, buffer))
    return buffer.raw


def compile_cubin(lib: ctypes.CDLL, source: str, name: str, options: list[str]) -> tuple[bytes | None, str]:
    """(cubin, log) of `source`; cubin is None when the source does not compile."""
    program = ctypes.c_void_p()
    _check(lib, "nvrtcCreateProgram",
           lib.nvrtcCreateProgram(ctypes.byref(program), source.encode(), name.encode(), 0, None, None))
    try:
        encoded = [o.encode() for o in options]
        argv = (ctypes.c_char_p * len(encoded))(*encoded)
        result = lib.nvrtcCompileProgram(program, len(encoded), argv)
        log = _log(lib, program)
        if result == _COMPILATION_FAILED:
            return None, log
        _check(lib, "nvrtcCompileProgram", result)
        return _cubin(lib, program), log
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "version":
        print(version(_load(argv[1])))
        return 0
    if len(argv) < 4 or argv[0] != "compile":
        print(__doc__, file=sys.stderr)
        return 2
    library, source, output, options = argv[1], Path(argv[2]), Path(argv[3]), argv[4:]
    try:
        cubin, log = compile_cubin(_load(library), source.read_text(), source.name, options)
    except (OSError, NvrtcFailure) as exc:
        print(exc, file=sys.stderr)
        return 2
    sys.stderr.write(log)
    if cubin is None:
        return 1
    output.write_bytes(cubin)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
