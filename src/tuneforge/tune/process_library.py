"""A library that every module of a template shares (`KernelTemplate(process_library=)`): C++ built once as a plain
library and loaded once per process with its symbols global, before the process loads one of the template's
modules, which find what it exports by name (dlsym). The GEMM kernels' thread pool is one (kernels/gemm/pool.cpp).

A selection submits its build to the build pool with the template's first module (`build_ahead`), so that it is
stored by the time a benchmark worker loads the first module (`load_process_library`): no process compiles it on the
way to a measurement, and no thread of the parent runs a compiler while the build pool forks its workers (a child
forked meanwhile keeps the compiler's exec-status pipe open, and the parent waited on it for ever: seen with
in-process timing). Where it does not build, the modules run without it (they must: a warning says why, once).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

from tuneforge.forksafe import ForkSafeLock
from tuneforge.warn_once import warn_once

if TYPE_CHECKING:
    from concurrent.futures import Future

    from tuneforge.compile.cpp import CppBuild
    from tuneforge.tune.choices import Builder


class Owner(Protocol):
    """What of a template (tune/template.py, which imports this module) its library is built from."""

    name: str
    process_library: str
    flags: tuple[str, ...]
    openmp: bool
    include_dirs: tuple[str, ...]


log = logging.getLogger("tuneforge.tune")

_lock = ForkSafeLock()  # a build pool may fork while another thread loads one
# By the library's source: templates that share one (the GEMM templates, some with other flags) load it once, built
# with the options of the first of them
_loaded: dict[str, bool] = {}  # source -> whether it is loaded (False: it did not build)
_submitted: set[str] = set()  # sources a build pool was given


def _request(template: Owner) -> CppBuild:
    from tuneforge.compile.cpp import library_request

    return library_request(template.process_library, flags=template.flags, openmp=template.openmp,
                           include_dirs=template.include_dirs)


def build_ahead(template: Owner, builder: Builder) -> Future[Any] | None:
    """Give `builder` the library's build (once per process and library): nobody waits for it here. Its future, or
    None where it was given before (or is loaded)."""
    with _lock:
        if template.process_library in _submitted or template.process_library in _loaded:
            return None
        _submitted.add(template.process_library)
    try:
        return builder.submit(_request(template), label=f"{template.name} (process library)")
    except Exception as exc:  # load_process_library builds it itself, and says why if it cannot
        log.debug("%s: the process library was not submitted ahead: %s", template.name, exc)
        return None


def load_process_library(template: Owner) -> bool:
    """Load the template's library in this process (built or fetched from the store, once). False where it did
    not build: the template's modules then run without it."""
    loaded = _loaded.get(template.process_library)
    if loaded is not None:
        return loaded
    from tuneforge.compile.cpp import load as load_library

    with _lock:
        loaded = _loaded.get(template.process_library)
        if loaded is None:
            try:
                load_library(template.process_library, flags=template.flags, openmp=template.openmp,
                             include_dirs=template.include_dirs, global_symbols=True)
                loaded = True
            except Exception as exc:  # a compiler or store failure: the modules still run without it
                warn_once(log, f"process-library-{template.name}", "the library that template %r's modules share "
                          "did not build or load (%s); they run without it", template.name, exc)
                loaded = False
            _loaded[template.process_library] = loaded
    return loaded
