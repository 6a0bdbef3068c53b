"""C++ source -> shared library (loaded with ctypes) or CPython extension module, cached by content.

The key of an artifact is the hash of everything that determines it (see `key_material`): the
exact source, the whole command line with file names replaced by placeholders, the compiler's
identity (its own content hash), the target CPU named explicitly, the contents of include
directories, the Python ABI for extension modules, and the artifact format version.
"""

from __future__ import annotations

import concurrent.futures
import ctypes
import functools
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import platform
import re
import sys
import sysconfig
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

from tuneforge import config
from tuneforge.compile import builders, pch, split_module
from tuneforge.compile.bindings import bindings_unit, module_source, parse_prototype
from tuneforge.compile.failed import keep_failed, run_compiler
from tuneforge.compile.toolchain import Toolchain, default_toolchain
from tuneforge.dataclass_lite import dataclass
from tuneforge.errors import CompileError
from tuneforge.hashing import key_hash
from tuneforge.store.artifacts import Entry
from tuneforge.store.default import default_store
from tuneforge.store.entry import KEY_RE
from tuneforge.store.tiers import artifact_tiers

log = logging.getLogger("tuneforge.compile")

ARTIFACT_FORMAT = 1
SOURCE_NAME = "source.cpp"
LIBRARY_NAME = "kernel.so"
MODULE_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
_HEADER = re.compile(r"\.(h|hh|hpp|hxx|inc|inl|cuh|tcc)$")


@dataclass(frozen=True)
class CppBuild:
    """Everything that describes one build, as plain data (so it can be sent to another process)."""

    source: str
    flags: tuple[str, ...] = ()
    openmp: bool = False
    include_dirs: tuple[str, ...] = ()
    python_module: bool = False
    # A module with generated bindings: the prototypes and the user's part of `source` (split_module.py
    # compiles them as two units where it can); `object_file`: the object of such bindings alone.
    functions: tuple[str, ...] = ()
    user_source: str = ""
    object_file: bool = False
    # Sources compiled once each into an object of their own (a stored artifact, with the module's options) and
    # linked into the module: code that every module of a template shares and no configuration changes (the GEMM
    # kernels' thread pool: compiling it into each kernel was a third of every build).
    link_sources: tuple[str, ...] = ()
    # Who asked for the build (a template choice's render identity) and the functions the module
    # exports: kept in the artifact's meta so a record naming the artifact can be checked without a
    # render, but not part of the key (or of equality): the same source is the same artifact.
    origin: str = field(default="", compare=False)
    entries: tuple[str, ...] = field(default=(), compare=False)

    @property
    def output_name(self) -> str:
        if self.object_file:
            return split_module.OBJECT_NAME
        return f"module{MODULE_SUFFIX}" if self.python_module else LIBRARY_NAME


@dataclass(frozen=True)
class CppArtifact:
    key: str
    entry: Entry
    compiled: bool  # this call ran the compiler (False: served from the store)
    key_inputs: dict[str, Any] = field(repr=False, default_factory=dict)

    @property
    def library_path(self) -> Path:
        return self.entry.file(self.entry.meta["output"])


_digests: dict[str, tuple[tuple[tuple[str, int, int], ...], str]] = {}


def include_dir_digest(directory: str) -> str:
    """Content hash of the headers under an include directory; re-read only when a header changed."""
    root = Path(directory)
    if not root.is_dir():
        raise CompileError(f"include directory {directory} does not exist", command=[], stderr="",
                           source_path=None)
    headers = sorted(p for p in root.rglob("*") if _HEADER.search(p.name) and p.is_file())
    signature = tuple((p.relative_to(root).as_posix(), p.stat().st_size, p.stat().st_mtime_ns) for p in headers)
    known = _digests.get(directory)
    if known is not None and known[0] == signature:
        return known[1]
    digest = hashlib.sha256()
    for path in headers:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    _digests[directory] = (signature, digest.hexdigest())
    return digest.hexdigest()


def _python_include() -> str:
    return sysconfig.get_paths()["include"]


def _effective_flags(build: CppBuild) -> list[str]:
    flags = [*config.get_strs("cpp.flags"), *build.flags]
    if build.python_module and platform.system() == "Darwin":
        flags += ["-undefined", "dynamic_lookup"]
    return flags


def _user_include_dirs(build: CppBuild) -> list[str]:
    return [str(d.resolve()) for d in config.get_paths("cpp.include_dirs")] + list(build.include_dirs)


def _include_dirs(build: CppBuild) -> list[str]:
    return _user_include_dirs(build) + ([_python_include()] if build.python_module else [])


def compile_command(build: CppBuild, toolchain: Toolchain, source: str, output: str) -> list[str]:
    flags = [*_effective_flags(build), "-c"] if build.object_file else _effective_flags(build)
    return toolchain.command_line(source, output, opt_level=config.get_str("cpp.opt_level"),
                                  march=toolchain.resolve_march(config.get_str("cpp.march")), openmp=build.openmp,
                                  flags=flags, include_dirs=_include_dirs(build), shared=not build.object_file)


def key_material(build: CppBuild, toolchain: Toolchain) -> dict[str, Any]:
    """The inputs of an artifact's key; kept in its manifest so `tuneforge cache explain` can diff them."""
    digests = {d: include_dir_digest(d) for d in _user_include_dirs(build)}
    placeholders = {d: f"<include:{digest[:16]}>" for d, digest in digests.items()}
    if build.python_module:
        placeholders[_python_include()] = "<python-include>"
    command = compile_command(build, toolchain, "<source>", "<output>")
    command = [f"-I{placeholders[a[2:]]}" if a.startswith("-I") and a[2:] in placeholders else a
               for a in command[len(toolchain.command):]]
    material: dict[str, Any] = {
        "artifact": "cpp-object" if build.object_file else "cpp-module" if build.python_module else "cpp-shared",
        "format": ARTIFACT_FORMAT,
        "source_sha256": hashlib.sha256(build.source.encode()).hexdigest(),
        "command": command,
        "compiler": toolchain.identity(),
        "march": toolchain.resolve_march(config.get_str("cpp.march")),
        "include_dirs": {placeholders[d]: digest for d, digest in digests.items()},
    }
    if build.python_module:
        material["python"] = {"implementation": sys.implementation.name, "soabi": sysconfig.get_config_var("SOABI"),
                              "version": list(sys.version_info[:2])}
    if build.link_sources:  # only where there are: every other artifact keeps its key
        material["link_sources_sha256"] = [hashlib.sha256(s.encode()).hexdigest() for s in build.link_sources]
    return material


def _keep_failed(key: str, build: CppBuild, command: Sequence[str], stderr: str) -> Path | None:
    return keep_failed(key, SOURCE_NAME, build.source, command, stderr)


def _compile_into(staging: Path, key: str, build: CppBuild, toolchain: Toolchain) -> dict[str, Any]:
    (staging / SOURCE_NAME).write_text(build.source)
    started = time.perf_counter()
    linked, bindings = _prerequisites(build, toolchain)
    unit_command = compile_command(build, toolchain, SOURCE_NAME, build.output_name)  # ends ``-o OUTPUT SOURCE``
    command = [*unit_command, *linked]
    proc = None
    if bindings is not None:
        proc = split_module.compile_module(staging, user_source=build.user_source, functions=build.functions,
                                           output=build.output_name, command=unit_command, bindings=bindings,
                                           objects=linked)
    header = None
    if proc is None and build.python_module and not build.object_file:
        header = pch.header_for(unit_command, toolchain)
    if header is not None:  # the same source and object code, Python.h read precompiled (pch.py)
        proc = run_compiler([*unit_command[:-3], "-Winvalid-pch", "-include", str(header), *unit_command[-3:],
                             *linked], cwd=staging, what="C++ compile",
                            keep=lambda output: _keep_failed(key, build, command, output))
        if proc.returncode == 0 and "Winvalid-pch" in proc.stderr:  # ignored (damaged): read as text, slowly
            pch.discard(header)
        elif proc.returncode != 0:  # the source's fault, or the header's: without it, the compiler says which
            plain = run_compiler(command, cwd=staging, what="C++ compile",
                                 keep=lambda output: _keep_failed(key, build, command, output))
            if plain.returncode == 0:
                log.debug("compiling %s with the precompiled header %s failed, without it not: discarded", key, header)
                pch.discard(header)
            proc = plain
    if proc is None:
        proc = run_compiler(command, cwd=staging, what="C++ compile",
                            keep=lambda output: _keep_failed(key, build, command, output))
    if proc.returncode != 0 or not (staging / build.output_name).is_file():
        kept = _keep_failed(key, build, command, proc.stderr)
        raise CompileError(f"C++ compile failed with exit code {proc.returncode}", command=command,
                           stderr=proc.stderr, source_path=kept, returncode=proc.returncode)
    if config.get_bool("debug"):
        log.info("compiled %s: %s", key, " ".join(command))
    module = _INIT.findall(build.source)[0] if build.python_module and not build.object_file else None
    meta: dict[str, Any] = {"output": build.output_name, "compile_seconds": round(time.perf_counter() - started, 4),
                            "compiler_warnings": proc.stderr[-4000:], "module": module}
    if build.origin:
        meta.update(origin=build.origin, entries=list(build.entries), settings=_settings_digest())
    return meta


def artifact_key(build: CppBuild, toolchain: Toolchain | None = None) -> tuple[str, dict[str, Any]]:
    """The store key of `build` under the current settings, and the inputs it was hashed from."""
    material = key_material(build, toolchain or default_toolchain())
    return "cpp" + key_hash(material), material


def build(build: CppBuild) -> CppArtifact:
    """Return the artifact for `build`, compiling it only if no process has stored it yet."""
    toolchain = default_toolchain()
    key, material = artifact_key(build, toolchain)
    compiled = False

    def run_compiler(staging: Path) -> Mapping[str, Any]:
        nonlocal compiled
        compiled = True
        return _compile_into(staging, key, build, toolchain)

    entry = artifact_tiers.get_or_build(key, run_compiler, key_inputs=material)  # local, remote, else compiled
    return CppArtifact(key=key, entry=entry, compiled=compiled, key_inputs=material)


def _prerequisites(module: CppBuild, toolchain: Toolchain) -> tuple[list[str], Path | None]:
    """The objects of `module`'s link sources and of its bindings (None: build it whole), built at once where
    neither is stored yet: one after the other they were most of a cold GEMM tuning's first module build (0.3 and
    0.35 s before its own 0.6), while the other core waited for them too."""
    if not module.link_sources:
        return [], _bindings_object(module, toolchain)
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(module.link_sources)) as threads:
        linked = [threads.submit(_link_object, module, number) for number in range(len(module.link_sources))]
        bindings = _bindings_object(module, toolchain)
        return [f.result() for f in linked], bindings


def _link_object(module: CppBuild, number: int) -> str:
    """The object of `module`'s link source `number` (built once for its options and stored), to link into it."""
    request = replace(module, source=module.link_sources[number], user_source="", functions=(), link_sources=(),
                      object_file=True, python_module=False, origin="", entries=())
    try:
        return str(build(request).library_path)
    except CompileError as exc:
        raise CompileError(f"link source {number + 1} of {len(module.link_sources)} of the module did not compile: "
                           f"{exc}", command=exc.command, stderr=exc.stderr, source_path=exc.source_path,
                           returncode=exc.returncode) from exc


def _bindings_object(module: CppBuild, toolchain: Toolchain) -> Path | None:
    """The object file of `module`'s generated bindings (built once for its prototypes and options), where the
    module is built in two units (split_module.py); None: build it whole."""
    if module.object_file or not split_module.applies(module.functions, toolchain):
        return None
    request = replace(module, source=bindings_unit(module.functions), user_source="", object_file=True, origin="",
                      entries=(), link_sources=())
    try:
        return build(request).library_path
    except CompileError as exc:  # the wrappers alone always compile, or the one-unit build will say why not
        log.debug("the bindings object of %s did not compile (%s); building the module whole", module.functions, exc)
        return None


def _build_for_pool(request: CppBuild) -> tuple[str, Path, bool]:
    artifact = build(request)
    return artifact.key, artifact.library_path, artifact.compiled


builders.register(CppBuild, lambda request: artifact_key(request)[0], _build_for_pool)


_libraries: dict[tuple[Any, ...], tuple[Any, str]] = {}  # memo -> (loaded library or module, artifact key)


def _request(source: str, flags: Iterable[str], openmp: bool | None, include_dirs: Iterable[str | os.PathLike[str]],
             python_module: bool) -> CppBuild:
    return CppBuild(source=source, flags=tuple(flags),
                    openmp=config.get_bool("cpp.openmp") if openmp is None else openmp,
                    include_dirs=tuple(str(Path(d).resolve()) for d in include_dirs), python_module=python_module)


def _memo_key(request: CppBuild) -> tuple[Any, ...]:
    # Settings that change the artifact are part of the in-process memo too, so a patch() is honoured.
    return (request, config.get_path("cache_dir"), config.get_optional_str("cpp.cxx"), config.get_strs("cpp.flags"),
            config.get_str("cpp.march"), config.get_str("cpp.opt_level"), config.get_paths("cpp.include_dirs"))


def library_request(source: str, *, flags: Sequence[str] = (), openmp: bool | None = None,
                    include_dirs: Sequence[str | os.PathLike[str]] = ()) -> CppBuild:
    """The build of a plain shared library (see load), as data: what a build pool worker needs."""
    return _request(source, flags, openmp, include_dirs, python_module=False)


def load(source: str, *, flags: Sequence[str] = (), openmp: bool | None = None,
         include_dirs: Sequence[str | os.PathLike[str]] = (), global_symbols: bool = False) -> ctypes.CDLL:
    """Build (or fetch from the store) a shared library from C++ source and load it with ctypes.

    Export functions with ``extern "C"`` to call them by name. ``openmp=None`` uses the cpp.openmp setting.
    ``global_symbols``: its symbols join the process's global scope (RTLD_GLOBAL), where other libraries and
    modules find them by name, e.g. with ``dlsym(RTLD_DEFAULT, ...)``.
    """
    request = library_request(source, flags=flags, openmp=openmp, include_dirs=include_dirs)
    memo = (*_memo_key(request), global_symbols)
    known = _libraries.get(memo)
    if known is not None:
        library: ctypes.CDLL = known[0]
        return library
    artifact = build(request)
    mode = ctypes.RTLD_GLOBAL if global_symbols else ctypes.RTLD_LOCAL
    library = ctypes.CDLL(str(artifact.library_path), mode=mode)
    # For users (e.g. `tuneforge cache explain <key>`); tuneforge itself takes keys from load_module_keyed.
    library.tuneforge_key = artifact.key  # type: ignore[attr-defined]
    _libraries[memo] = (library, artifact.key)
    return library


_INIT = re.compile(r"\bPyInit_([A-Za-z_][A-Za-z0-9_]*)\s*\(")


def module_request(source: str, *, functions: Sequence[str] = (), flags: Sequence[str] = (),
                   openmp: bool | None = None, include_dirs: Sequence[str | os.PathLike[str]] = (),
                   origin: str = "", link_sources: Sequence[str] = ()) -> CppBuild:
    """The build of an extension module (see load_module), as data: what a build pool worker needs.

    `origin` names who asks (see `CppBuild.origin`); it goes into the artifact's meta, not its key.
    `link_sources`: see `CppBuild.link_sources` (their contents are part of the key).
    """
    full_source = module_source(source, functions) if functions else source
    names = _INIT.findall(full_source)
    if len(names) != 1:
        raise CompileError("an extension module source must define exactly one PyInit_<name> function "
                           f"(found {len(names)}); or pass functions=[...] to generate the bindings",
                           command=[], stderr="", source_path=None)
    request = _request(full_source, flags, openmp, include_dirs, python_module=True)
    entries = tuple(parse_prototype(f).name for f in functions)
    return replace(request, origin=origin, entries=entries, functions=tuple(functions),
                   user_source=source if functions else "", link_sources=tuple(link_sources))


def _import_extension(name: str, path: Path) -> ModuleType:
    loader = importlib.machinery.ExtensionFileLoader(name, str(path))
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


class ArtifactMismatch(Exception):
    """A key that a record names does not hold the code the caller expects; the message says why.

    `suspect` is False where the record is merely out of date (the caller's own code, built under
    other cpp.* settings), True where it names code that is not the caller's at all.
    """

    def __init__(self, message: str, *, suspect: bool = True) -> None:
        super().__init__(message)
        self.suspect = suspect


def _settings_digest() -> str:
    # The settings that change a build's command line (the compiler itself is in the selection key).
    # cpp.march as set ("detect" by default), unresolved: resolving costs the compiler probe that a warm
    # start avoids, and the CPU it would detect is in the selection key already.
    return _digest_of((config.get_strs("cpp.flags"), config.get_str("cpp.march"), config.get_str("cpp.opt_level"),
                       config.get_paths("cpp.include_dirs")))


@functools.lru_cache(maxsize=8)
def _digest_of(settings: tuple[Any, ...]) -> str:
    return key_hash(list(settings))  # on every load of a recorded winner: hashed once per settings state


_by_key: dict[tuple[str, str], tuple[ModuleType, dict[str, Any]]] = {}


def _check_built_for(key: str, meta: Mapping[str, Any], origin: str, entry: str) -> None:
    if not isinstance(meta.get("module"), str) or not isinstance(meta.get("output"), str):
        raise ArtifactMismatch(f"artifact {key} is not an extension module")
    if meta.get("origin") != origin:
        raise ArtifactMismatch(f"artifact {key} was not built from this choice's template and configuration")
    entries = meta.get("entries")
    if not isinstance(entries, list) or entry not in entries:
        raise ArtifactMismatch(f"artifact {key} does not export {entry!r} (it exports {entries!r})")
    if meta.get("settings") != _settings_digest():
        raise ArtifactMismatch(f"artifact {key} was built under other cpp.* settings", suspect=False)


def load_module_by_key(key: str, *, origin: str, entry: str) -> ModuleType | None:
    """The extension module stored under `key` (local store, else the remote), checked before it is imported.

    Used with keys that tuning records remember, so a warm start needs no template render and no
    compiler probe. A record is data from outside (an imported or shipped bundle), so the key is
    trusted only if the artifact's meta says it was built for `origin` (a template choice's render
    identity) under the current cpp.* settings and exports `entry`; otherwise ArtifactMismatch. None:
    the artifact is stored nowhere. Either way the caller goes back to the normal build.
    """
    if not isinstance(key, str) or not key.startswith("cpp") or not KEY_RE.fullmatch(key):
        raise ArtifactMismatch(f"{key!r} is not a C++ artifact key")
    memo = (str(default_store().root), key)
    known = _by_key.get(memo)
    if known is not None:
        _check_built_for(key, known[1], origin, entry)
        return known[0]
    stored = artifact_tiers.fetch(key)
    if stored is None:
        return None
    _check_built_for(key, stored.meta, origin, entry)
    module = _import_extension(stored.meta["module"], stored.file(stored.meta["output"]))
    module.tuneforge_key = key  # type: ignore[attr-defined]  # for users, as load_module's
    _by_key[memo] = (module, dict(stored.meta))
    return module


def load_module(source: str, *, functions: Sequence[str] = (), flags: Sequence[str] = (),
                openmp: bool | None = None, include_dirs: Sequence[str | os.PathLike[str]] = (),
                origin: str = "", link_sources: Sequence[str] = ()) -> ModuleType:
    """Build and import a CPython extension module: calls go straight in, without ctypes' overhead.

    Either `source` is a complete extension module (it defines ``PyInit_<name>``), or `functions`
    lists C prototypes of ``extern "C"`` functions in `source` (``"void add(float* out, const float* x,
    int64_t n)"``) and tuneforge generates the module around them: pointer arguments take numpy
    arrays (or anything with the buffer protocol) or integer addresses; integers and floats map to
    Python numbers. `origin` is kept in the artifact's meta (see `CppBuild.origin`). `link_sources`: C++ sources
    that many modules share (helpers the module's source declares), each compiled once with the same options into
    a stored object and linked in. The module's ``tuneforge_key`` attribute names its artifact, for users;
    tuneforge uses `load_module_keyed`.
    """
    return load_module_keyed(source, functions=functions, flags=flags, openmp=openmp, include_dirs=include_dirs,
                             origin=origin, link_sources=link_sources)[0]


def load_module_keyed(source: str, *, functions: Sequence[str] = (), flags: Sequence[str] = (),
                      openmp: bool | None = None, include_dirs: Sequence[str | os.PathLike[str]] = (),
                      origin: str = "", link_sources: Sequence[str] = ()) -> tuple[ModuleType, str]:
    """`load_module`, and the key of the artifact it came from (which a tuning record keeps)."""
    return load_request(module_request(source, functions=functions, flags=flags, openmp=openmp,
                                       include_dirs=include_dirs, origin=origin, link_sources=link_sources))


def load_request(request: CppBuild) -> tuple[ModuleType, str]:
    """The module a `module_request` describes (built or fetched from the store, loaded once per process and
    settings), and its artifact key."""
    memo = _memo_key(request)
    known = _libraries.get(memo)
    if known is not None:
        module: ModuleType = known[0]
        return module, known[1]
    artifact = build(request)
    module = _import_extension(_INIT.findall(request.source)[0], artifact.library_path)
    module.tuneforge_key = artifact.key  # type: ignore[attr-defined]  # for users: see load_module
    _libraries[memo] = (module, artifact.key)
    return module, artifact.key
