"""A precompiled CPython header for extension-module builds (g++).

Every module tuneforge builds starts with the same four lines (PY_SSIZE_T_CLEAN, Python.h, stdint.h, stddef.h),
and reading Python.h was most of a small kernel's compile: 0.31 s for a tiled matmul module against 0.10 s for the
same kernel as a plain shared library (g++ 12 here). GCC loads a header precompiled with the same options instead
of reading it (0.07 s for Python.h), so the first module built with a set of options precompiles the prologue into
`<cache_dir>/pch/<digest>/`, and every later one is compiled with ``-include`` of it.

The artifact key does not change: the module's own source still includes the same headers (a second inclusion
is a no-op), so the object code is the same with or without it. The header is built once per compiler and
options, under a file lock (parallel builds wait for one), published by rename. When it cannot be built the
module is compiled without it; when g++ says it is not valid (-Winvalid-pch: a damaged file), or a compile with it
fails where one without it does not, it is discarded, and made again by the next module.
Setting ``cpp.precompiled_header`` off never uses one. clang++ (whose precompiled headers work otherwise) is
left as it was.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from pathlib import Path

from tuneforge import config
from tuneforge.compile.toolchain import Toolchain, run_command
from tuneforge.hashing import key_hash
from tuneforge.store.fsutil import LockTimeout, file_lock

log = logging.getLogger("tuneforge.compile")

PROLOGUE = "#define PY_SSIZE_T_CLEAN\n#include <Python.h>\n#include <stdint.h>\n#include <stddef.h>\n"
HEADER = "tf_python.h"
_failed: set[str] = set()  # digests that would not build in this process: not retried
_lock = threading.Lock()


def directory() -> Path:
    return config.get_path("cache_dir") / "pch"


def header_for(module_command: Sequence[str], toolchain: Toolchain) -> Path | None:
    """The prologue's header, precompiled for `module_command`'s options (built now if it is not yet), for
    ``-include``; None where there is none to use. `module_command` ends with ``-o OUTPUT SOURCE``."""
    if toolchain.kind != "gcc" or not config.get_bool("cpp.precompiled_header"):
        return None
    options = [a for a in module_command[:-3] if a != "-shared"]
    digest = key_hash({"options": options, "compiler": toolchain.identity(), "prologue": PROLOGUE})[:32]
    root = directory() / digest
    header, compiled = root / HEADER, root / (HEADER + ".gch")
    if compiled.is_file():
        return header
    if digest in _failed:
        return None
    try:
        with _lock, file_lock(root / ".lock", config.get_float("compile_timeout_s")):
            if not compiled.is_file():
                _build(options, header, compiled)
    except (OSError, LockTimeout, RuntimeError) as exc:
        log.debug("no precompiled header for %s (%s); compiling without one", digest, exc)
        _failed.add(digest)
        return None
    return header


def _build(options: Sequence[str], header: Path, compiled: Path) -> None:
    if not header.is_file():
        partial = header.with_name(f".{HEADER}.{os.getpid()}.tmp")
        partial.write_text(PROLOGUE)
        os.replace(partial, header)
    partial = compiled.with_name(f".{HEADER}.{os.getpid()}.gch")
    try:
        proc = run_command([*options, "-x", "c++-header", "-o", str(partial), str(header)],
                           timeout=config.get_float("compile_timeout_s"))
        if proc.returncode != 0 or not partial.is_file():
            raise RuntimeError(f"the compiler said: {proc.stderr.strip()[-300:]}")
        os.replace(partial, compiled)
    finally:
        partial.unlink(missing_ok=True)


def discard(header: Path) -> None:
    """Remove a precompiled header the compiler refused or failed with (damaged, or another compiler build's):
    the next module built with these options makes it again."""
    path = header.with_name(HEADER + ".gch")
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        log.debug("cannot remove %s: %s", path, exc)
