"""Build a module with generated bindings as two translation units: the kernel without Python.h, and bindings
compiled once per set of prototypes and linked into every module that has them.

Why: a tuning run builds one module per configuration, each the user's kernel plus the same wrappers. Reading
Python.h was most of a small kernel's compile: a tiled matmul took 0.19 s as a module even with the precompiled
header (pch.py: loading it alone costs ~55 ms, building it 0.5 s) against 0.105 s as plain C++ (g++ 12, -O3, here).
The wrappers depend only on the prototypes and the compile options, so they are compiled once into an object file
(0.2 s), stored as an artifact of its own (its key: its source and the module's options), and linked in; the kernel
unit includes stdint.h and stddef.h only. Linked by gold where it is installed: 0.116 s a module in all.

The module is the same one: the same functions, wrappers, module name and artifact key; only how it was compiled
differs. Where the two-unit build does not work (a source that uses the CPython API or a header Python.h brought
in, a function without C linkage, or one it does not define: an alias of it in the kernel unit makes the last a
compile error rather than an import error), the caller compiles the one-unit module as before, so a source builds
in exactly the cases it did, and a broken one fails with the one-unit compile's message. Linux with g++ or clang++
only; setting ``cpp.split_bindings`` off never splits."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tuneforge import config
from tuneforge.compile.bindings import kernel_unit
from tuneforge.compile.failed import run_compiler
from tuneforge.compile.toolchain import Toolchain

log = logging.getLogger("tuneforge.compile")

UNIT_NAME = "unit.cpp"  # the kernel unit, in the staging directory while it is compiled
OBJECT_NAME = "bindings.o"


def applies(functions: Sequence[str], toolchain: Toolchain) -> bool:
    return (bool(functions) and sys.platform.startswith("linux") and toolchain.kind in ("gcc", "clang")
            and config.get_bool("cpp.split_bindings"))


def _linker(command: Sequence[str]) -> list[str]:
    """gold where it is installed and the command names no linker: it links a small module in half the time
    of ld.bfd (22 ms against 45 here), a sixth of a tiled matmul's whole build."""
    if any(a.startswith("-fuse-ld=") for a in command) or shutil.which("ld.gold") is None:
        return []
    return ["-fuse-ld=gold"]


def compile_module(staging: Path, *, user_source: str, functions: Sequence[str], output: str,
                   command: Sequence[str], bindings: Path,
                   objects: Sequence[str] = ()) -> subprocess.CompletedProcess[str] | None:
    """Compile the module of `user_source` and `functions` into ``staging/<output>`` with the `bindings` object
    (and `objects`) linked in; `command` is the one-unit compile command (ending with ``-o OUTPUT SOURCE``). None
    where the two-unit build did not work and the caller should compile the module whole."""
    unit = staging / UNIT_NAME
    unit.write_text(kernel_unit(user_source, functions))
    try:
        proc = run_compiler([*command[:-3], *_linker(command), *command[-3:-1], UNIT_NAME, str(bindings), *objects],
                            cwd=staging, what="C++ compile", keep=lambda output: None)
    finally:
        unit.unlink(missing_ok=True)
    if proc.returncode != 0 or not (staging / output).is_file():
        log.debug("the two-unit build of %s failed; compiling it whole:\n%s", list(functions), proc.stderr[-2000:])
        (staging / output).unlink(missing_ok=True)
        return None
    return proc
