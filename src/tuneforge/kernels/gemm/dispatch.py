"""The C fast path of tuneforge.gemm (dispatch.cpp): built once per machine, loaded from the cache after.

Tuned layouts are registered with it; a later call with a registered layout costs about as much as
calling the winner directly. Where it cannot be built (no compiler and no cached copy), gemm stays
on its Python path, which does the same work more slowly.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

# How the registered call runs (dispatch.cpp's Kind).
KERNEL, LIBRARY, CALL = 0, 1, 2

_SOURCE = Path(__file__).with_name("dispatch.cpp")
# pasted in, so that the module is one source file
_BUSY_THREADS = Path(__file__).with_name("busy_threads.h")
_HANDOFF = Path(__file__).with_name("handoff.h")
_lock = threading.Lock()
_loaded: ModuleType | None = None
_loader: threading.Thread | None = None


def _load(slow_path: Callable[..., Any]) -> None:
    global _loaded
    try:
        import numpy as np

        from tuneforge.compile.cpp import load_module

        source = (_SOURCE.read_text().replace("// @BUSY_THREADS@\n", _BUSY_THREADS.read_text(), 1)
                  .replace("// @HANDOFF@\n", _HANDOFF.read_text(), 1))
        module = load_module(source, include_dirs=[np.get_include()], openmp=False)
        module.init(slow_path, np.matmul)
        _loaded = module
    except Exception as exc:  # a missing compiler must not stop gemm: its Python path still works
        log.info("tuneforge.gemm: no C fast path (%s); calls take the Python path", exc)


def load_in_background(slow_path: Callable[..., Any]) -> None:
    """Start loading the dispatcher (once per process) with `slow_path` as its fall-back. In the
    background, because finding it in the cache means probing the compiler first: a process that
    makes one call should not wait for that."""
    global _loader
    with _lock:
        if _loader is None:
            _loader = threading.Thread(target=_load, args=(slow_path,), name="tuneforge-gemm-dispatch", daemon=True)
            _loader.start()


def wait(timeout: float | None = None) -> ModuleType | None:
    """The dispatcher once the background load has finished (None if it failed or was never started)."""
    loader = _loader
    if loader is not None:
        loader.join(timeout)
    return _loaded


def loaded() -> ModuleType | None:
    """The dispatcher if it is loaded by now, without waiting."""
    return _loaded


def _after_fork_in_child() -> None:
    # A load in flight in the parent has no thread here: let the child start its own.
    global _lock, _loader
    _lock = threading.Lock()
    if _loaded is None:
        _loader = None


os.register_at_fork(after_in_child=_after_fork_in_child)


def kernel_address(kernel: Any) -> int:
    """The C address of a compiled kernel's entry function, from its extension module's address table."""
    module, name = getattr(kernel, "__self__", None), getattr(kernel, "__name__", "")
    addresses = getattr(module, "tuneforge_addresses", {})
    address = addresses.get(name)
    if not isinstance(address, int) or address == 0:
        raise LookupError(f"no C address for kernel {name!r}")
    return address
