"""Triton kernels -> compiled GPU binaries (cubin, PTX, Triton's metadata), cached by content in the artifact store.

A `TritonBuild` names a @triton.jit function in generated Python source (a rendered template) and how to
compile it. Its key (`artifact_key`) covers the source and what Triton's JIT hashes of the function and
the helpers it calls, the signature, constexprs, warps and stages, Triton's version, the target GPU
(never "whatever is here": a build for the current device is keyed by that device's arch), the ptxas
Triton runs, Triton's resolved options and its cache-invalidating environment variables.

`build` compiles without a GPU for an explicit target and stores every file Triton produces for the
kernel in one entry (through the local store and the remote tier, like C++ artifacts). `load` turns
the stored files back into Triton's launchable `CompiledKernel` the way Triton does on its own cache
hits, without compiling. `launcher` is what tuneforge's choices run: the stored cubin launched through
the CUDA driver (compile/triton_launch.py), and given the key a tuning record kept, found without
importing Triton at all (the key's own computation needs Triton's hash of the function).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import tempfile
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import field
from pathlib import Path
from typing import Any, Protocol

from tuneforge.compile import builders
from tuneforge.compile.failed import keep_failed
from tuneforge.compile.triton_env import (
    GpuTarget,
    TritonBuildError,
    cache_env_vars,
    current_target,
    import_triton,
    ptxas_version,
    resolve_target,
    resolved_options,
)
from tuneforge.dataclass_lite import dataclass
from tuneforge.errors import CompileError
from tuneforge.forksafe import ForkSafeLock
from tuneforge.hashing import code_hash, key_hash
from tuneforge.store.artifacts import Entry
from tuneforge.store.default import default_store
from tuneforge.store.entry import KEY_RE
from tuneforge.store.tiers import artifact_tiers

__all__ = ["ARTIFACT_FORMAT", "GpuTarget", "Launcher", "TritonArtifact", "TritonBuild", "TritonBuildError",
           "artifact_key", "build", "build_identity", "compiled_kernel", "kernel_files", "launcher", "load"]

log = logging.getLogger("tuneforge.compile.triton")

ARTIFACT_FORMAT = 1
KEY_PREFIX = "tri"
SOURCE_NAME = "kernel_source.py"  # the Python source, for `cache explain` and for loading by key
STEM = "kernel"  # Triton's files are stored as kernel.<ext>: a kernel's own name could be "manifest"
Constexpr = int | float | bool | str
# Triton's specialization attributes: (argument index,) -> [[name, value], ...], e.g. {(0,): [["tt.divisibility", 16]]}
Attrs = Mapping[tuple[int, ...], Sequence[Sequence[Any]]]


@dataclass(frozen=True)
class TritonBuild:
    """One Triton compilation as plain data (it can be sent to a build pool worker).

    `signature` maps every argument of the kernel, in order, to its Triton type ("*fp16", "i32", ...;
    "constexpr" for those given in `constexprs`). `target=None` means this process's GPU. `attrs` are
    Triton's specialization attributes of the arguments by index, as its JIT derives them from the
    values it is called with (``{(0,): [["tt.divisibility", 16]]}``: a pointer aligned to 16 bytes, an
    int that is a multiple of 16); they change the code, so they are part of the key.
    """

    source: str
    kernel: str
    signature: Mapping[str, str]
    constexprs: Mapping[str, Constexpr] = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 3
    target: GpuTarget | None = None
    attrs: Attrs = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Own copies: a caller mutating its dict afterwards must not change a build (or its hash).
        object.__setattr__(self, "signature", dict(_checked_signature(self.signature)))
        object.__setattr__(self, "constexprs", dict(_checked_constexprs(self.constexprs, self.signature)))
        object.__setattr__(self, "attrs", _checked_attrs(self.attrs, len(self.signature)))
        if not isinstance(self.source, str) or not self.source.strip():
            raise TritonBuildError("TritonBuild.source: need the Python source text of the kernel's module")
        if not isinstance(self.kernel, str) or not self.kernel.isidentifier():
            raise TritonBuildError(f"TritonBuild.kernel: need the name of the @triton.jit function, "
                                   f"got {self.kernel!r}")
        if not _is_int(self.num_warps) or self.num_warps < 1 or self.num_warps & (self.num_warps - 1):
            raise TritonBuildError(f"TritonBuild.num_warps: need a power of two >= 1, got {self.num_warps!r}")
        if not _is_int(self.num_stages) or self.num_stages < 1:
            raise TritonBuildError(f"TritonBuild.num_stages: need an int >= 1, got {self.num_stages!r}")
        if self.target is not None and not isinstance(self.target, GpuTarget):
            raise TritonBuildError(f"TritonBuild.target: need a GpuTarget or None, got {type(self.target).__name__}")

    def __hash__(self) -> int:  # dict fields: hash what equality compares
        return hash((self.source, self.kernel, tuple(sorted(self.signature.items())),
                     tuple(sorted(self.constexprs.items(), key=lambda kv: kv[0])), self.num_warps,
                     self.num_stages, self.target, json.dumps(_attrs_material(self.attrs))))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _checked_signature(signature: object) -> Mapping[str, str]:
    if not isinstance(signature, Mapping):
        raise TritonBuildError(f"TritonBuild.signature: need a mapping of argument name -> Triton type, "
                               f"got {type(signature).__name__}")
    for name, kind in signature.items():
        if not isinstance(name, str) or not name.isidentifier():
            raise TritonBuildError(f"TritonBuild.signature: {name!r} is not an argument name")
        if not isinstance(kind, str) or not kind or kind != kind.strip():
            raise TritonBuildError(f"TritonBuild.signature[{name!r}]: need a Triton type such as '*fp16', "
                                   f"'i32' or 'constexpr', got {kind!r}")
    return signature


def _checked_constexprs(constexprs: object, signature: Mapping[str, str]) -> Mapping[str, Constexpr]:
    if not isinstance(constexprs, Mapping):
        raise TritonBuildError(f"TritonBuild.constexprs: need a mapping of name -> value, "
                               f"got {type(constexprs).__name__}")
    for name, value in constexprs.items():
        if signature.get(name) != "constexpr":
            raise TritonBuildError(f"TritonBuild.constexprs[{name!r}]: the signature must give {name!r} the "
                                   f"type 'constexpr' (it has {signature.get(name)!r})")
        if not isinstance(value, (int, float, bool, str)):
            raise TritonBuildError(f"TritonBuild.constexprs[{name!r}]: need an int, float, bool or str, "
                                   f"got {type(value).__name__}")
    missing = [name for name, kind in signature.items() if kind == "constexpr" and name not in constexprs]
    if missing:
        raise TritonBuildError(f"TritonBuild.constexprs: no value for the constexpr argument(s) {missing}")
    return constexprs


def _checked_attrs(attrs: object, arity: int) -> dict[tuple[int, ...], list[list[Any]]]:
    """A normalized copy: index tuples -> lists of [name, value] pairs with JSON values (they go into the key)."""
    if not isinstance(attrs, Mapping):
        raise TritonBuildError(f"TritonBuild.attrs: need a mapping of (argument index,) -> [[name, value], ...], "
                               f"got {type(attrs).__name__}")
    checked: dict[tuple[int, ...], list[list[Any]]] = {}
    for where, pairs in attrs.items():
        if not (isinstance(where, tuple) and where and all(_is_int(i) for i in where) and 0 <= where[0] < arity):
            raise TritonBuildError(f"TritonBuild.attrs: key {where!r} must be a tuple of argument indices "
                                   f"(0..{arity - 1})")
        if not isinstance(pairs, Sequence) or isinstance(pairs, str) or not all(
                isinstance(p, Sequence) and not isinstance(p, str) and len(p) == 2 and isinstance(p[0], str)
                and isinstance(p[1], (int, str, bool)) for p in pairs):
            raise TritonBuildError(f"TritonBuild.attrs[{where!r}]: need a list of [name, value] pairs such as "
                                   f"[['tt.divisibility', 16]], got {pairs!r}")
        checked[tuple(where)] = [[str(name), value] for name, value in pairs]
    return checked


def _attrs_material(attrs: Attrs) -> list[list[Any]]:
    return [[list(where), [list(p) for p in pairs]] for where, pairs in sorted(attrs.items())]


@dataclass(frozen=True)
class TritonArtifact:
    key: str
    entry: Entry
    compiled: bool  # this call ran triton.compile (False: served from the store or the remote)
    kernel: str
    metadata: dict[str, Any] = field(repr=False, hash=False, default_factory=dict)  # Triton's metadata JSON
    key_inputs: dict[str, Any] = field(repr=False, hash=False, default_factory=dict)

    @property
    def path(self) -> Path:
        return self.entry.path

    @property
    def binary_path(self) -> Path:
        return self.entry.file(self.entry.meta["binary"])


# --------------------------------------------------------------------------------------------- keys


def _description(build: TritonBuild, target: GpuTarget | None) -> list[str]:
    """What a CompileError shows as its command: the call and the arguments that matter."""
    where = "current-device" if target is None else f"{target.backend}:{target.arch}:{target.warp_size}"
    return ["triton.compile", f"kernel={build.kernel}", f"target={where}", f"num_warps={build.num_warps}",
            f"num_stages={build.num_stages}", f"signature={json.dumps(build.signature)}",
            f"constexprs={json.dumps(build.constexprs)}",
            *([f"attrs={json.dumps(_attrs_material(build.attrs))}"] if build.attrs else [])]


def _failure(build: TritonBuild, key: str, target: GpuTarget | None, what: str, exc: BaseException) -> CompileError:
    command = _description(build, target)
    text = "".join(traceback.format_exception_only(type(exc), exc)).rstrip()
    kept = _keep_failed(key, build, command, text)
    first = text.strip().splitlines()[-1] if text.strip() else type(exc).__name__
    return CompileError(f"Triton kernel {build.kernel!r}: {what}: {first}", command=command, stderr=text,
                        source_path=kept)


def _keep_failed(key: str, build: TritonBuild, command: Sequence[str], error: str) -> Path | None:
    return keep_failed(key, SOURCE_NAME, build.source, command, error)


def build_identity(build: TritonBuild, target: GpuTarget) -> str:
    """What `build` is for `target`, hashed without Triton: kept in the artifact's meta, so that a key taken
    from a tuning record (data from outside) is trusted only for the build it was made from."""
    return "tid" + key_hash({
        "source_sha256": hashlib.sha256(build.source.encode()).hexdigest(), "kernel": build.kernel,
        "signature": [[name, kind] for name, kind in build.signature.items()],
        "constexprs": dict(build.constexprs), "num_warps": build.num_warps, "num_stages": build.num_stages,
        "target": {"backend": target.backend, "arch": target.arch, "warp_size": target.warp_size},
        "attrs": _attrs_material(build.attrs)})


def jit_function(build: TritonBuild) -> Any:
    """The kernel's JITFunction, from the source imported as a generated module (tuneforge.compile.python),
    so that triton.jit can read the function's source from a real file. CompileError if it does not import."""
    triton = import_triton()
    from tuneforge.compile import python as generated

    try:
        module = generated.load(build.source)
    except Exception as exc:
        key = KEY_PREFIX + code_hash(build.source, extra={"kernel": build.kernel, "failed": "import"})
        raise _failure(build, key, build.target, "its source does not import", exc) from exc
    fn = getattr(module, build.kernel, None)
    # Under TRITON_INTERPRET=1 (set when triton was imported) @triton.jit makes an InterpretedFunction.
    interpreted = getattr(getattr(triton.runtime, "interpreter", None), "InterpretedFunction", None)
    kinds = (triton.runtime.jit.JITFunction, *((interpreted,) if isinstance(interpreted, type) else ()))
    if not isinstance(fn, kinds):
        found = "nothing" if fn is None else f"a {type(fn).__name__}"
        raise TritonBuildError(f"TritonBuild.kernel: the source defines no @triton.jit function {build.kernel!r} "
                               f"(found {found})")
    if list(build.signature) != list(fn.arg_names):
        raise TritonBuildError(f"TritonBuild.signature: names {list(build.signature)} must be the arguments of "
                               f"{build.kernel} in order: {list(fn.arg_names)}")
    return fn


def artifact_key(build: TritonBuild) -> tuple[str, dict[str, Any]]:
    """The store key of `build` and the inputs it was hashed from (kept in the entry for `cache explain`)."""
    triton = import_triton()
    target = resolve_target(build.target)
    fn = jit_function(build)
    try:
        # Triton's hash of the function and every @jit helper it calls (which may live in other modules).
        jit_key = str(fn.cache_key)
    except Exception as exc:
        key = KEY_PREFIX + code_hash(build.source, extra={"kernel": build.kernel, "failed": "jit-key"})
        raise _failure(build, key, target, "Triton cannot hash it", exc) from exc
    material: dict[str, Any] = {
        "artifact": "triton",
        "format": ARTIFACT_FORMAT,
        "source_sha256": hashlib.sha256(build.source.encode()).hexdigest(),
        "jit_key": jit_key,
        "kernel": build.kernel,
        "signature": [[name, kind] for name, kind in build.signature.items()],
        "constexprs": dict(build.constexprs),
        "num_warps": build.num_warps,
        "num_stages": build.num_stages,
        "triton": str(triton.__version__),
        "target": {"backend": target.backend, "arch": target.arch, "warp_size": target.warp_size},
        "ptxas": ptxas_version(target),
        "options": resolved_options(target, build.num_warps, build.num_stages),
        "env": cache_env_vars(),
    }
    if build.attrs:  # only when given, so the keys of builds without them stay as they were
        material["attrs"] = _attrs_material(build.attrs)
    return KEY_PREFIX + key_hash(material), material


# -------------------------------------------------------------------------------------------- build

# Triton's cache directory is process-wide (a knob that also sets os.environ), so compiles in one process
# take turns; processes (the build pool's workers) compile in parallel.
_compile_lock = ForkSafeLock()


def compile_into(staging: Path, key: str, build: TritonBuild, target: GpuTarget) -> dict[str, Any]:
    """Compile `build` for `target` into `staging` (Triton's own cache private to the call): the entry's metadata."""
    triton = import_triton()
    from triton import knobs
    from triton.compiler import ASTSource

    fn = jit_function(build)
    source = ASTSource(fn, dict(build.signature), dict(build.constexprs), _triton_attrs(build))
    options = {"num_warps": build.num_warps, "num_stages": build.num_stages}
    scratch = tempfile.mkdtemp(prefix="tuneforge-triton-")  # Triton's own cache: private, so it compiles
    started = time.perf_counter()
    try:
        with _compile_lock, knobs.cache.scope(), knobs.compilation.scope():
            knobs.cache.dir = scratch
            knobs.cache.manager_class = None  # its file manager in `scratch`, whatever TRITON_CACHE_MANAGER says
            knobs.compilation.store_binary_only = False  # keep PTX and the IRs too
            try:
                compiled = triton.compile(source, target=target.to_triton(), options=options)
            except Exception as exc:
                raise _failure(build, key, target, "triton.compile failed", exc) from exc
        seconds = time.perf_counter() - started
        files: dict[str, str] = {}
        for name, path in compiled.metadata_group.items():
            ext = name.rpartition(".")[2]
            files[ext] = f"{STEM}.{ext}"
            shutil.copyfile(path, staging / files[ext])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    binary_ext = "cubin"  # the one backend GpuTarget allows (cuda)
    if binary_ext not in files or "json" not in files:
        raise CompileError(f"Triton kernel {build.kernel!r}: triton.compile left no {binary_ext} or metadata "
                           f"(it wrote {sorted(files)})", command=_description(build, target), stderr="",
                           source_path=None)
    (staging / SOURCE_NAME).write_text(build.source)
    log.debug("compiled triton kernel %s (%s) in %.3f s", build.kernel, key, seconds)
    return {"kernel": build.kernel, "files": files, "binary": files[binary_ext], "metadata": files["json"],
            "source": SOURCE_NAME, "triton_hash": str(compiled.hash), "signature": dict(build.signature),
            "constexprs": dict(build.constexprs), "num_warps": build.num_warps, "num_stages": build.num_stages,
            "target": {"backend": target.backend, "arch": target.arch, "warp_size": target.warp_size},
            "shared": int(compiled.metadata.shared), "compile_seconds": round(seconds, 4),
            "build_identity": build_identity(build, target)}


def _triton_attrs(build: TritonBuild) -> dict[tuple[int, ...], list[list[Any]]]:
    return {where: [list(p) for p in pairs] for where, pairs in build.attrs.items()}  # Triton's own copy


def build(build: TritonBuild) -> TritonArtifact:
    """The artifact for `build`: from the local store, else the remote, else compiled (once across processes)."""
    key, material = artifact_key(build)
    target = GpuTarget(**material["target"])
    compiled = False

    def run_compiler(staging: Path) -> Mapping[str, Any]:
        nonlocal compiled
        compiled = True
        return compile_into(staging, key, build, target)

    entry = artifact_tiers.get_or_build(key, run_compiler, key_inputs=material)
    metadata = json.loads(entry.file(entry.meta["metadata"]).read_text())
    return TritonArtifact(key=key, entry=entry, compiled=compiled, kernel=build.kernel, metadata=metadata,
                          key_inputs=material)


def _build_for_pool(request: TritonBuild) -> tuple[str, Path, bool]:
    artifact = build(request)
    return artifact.key, artifact.binary_path, artifact.compiled


builders.register(TritonBuild, lambda request: artifact_key(request)[0], _build_for_pool)


def kernel_files(build_: TritonBuild) -> dict[str, bytes]:
    """Every file of the build's entry by name (kernel.cubin, kernel.ptx, kernel.json, ...): no GPU needed."""
    entry = build(build_).entry
    return {name: entry.file(name).read_bytes() for name in entry.files}


# --------------------------------------------------------------------------------------------- load

_loaded: dict[tuple[str, TritonBuild], Any] = {}
_load_lock = ForkSafeLock()


def compiled_kernel(build_: TritonBuild) -> Any:
    """Triton's ``CompiledKernel`` for `build_`, made from the stored files as Triton does on a hit in its own
    cache (the file group and the hash), never compiling what a tier holds. Needs no GPU until launched."""
    artifact = build(build_)
    import_triton()
    from triton.compiler import ASTSource
    from triton.compiler.compiler import CompiledKernel

    meta = artifact.entry.meta
    group = {f"{build_.kernel}.{ext}": str(artifact.entry.file(name)) for ext, name in meta["files"].items()}
    source = ASTSource(jit_function(build_), dict(build_.signature), dict(build_.constexprs), _triton_attrs(build_))
    kernel = CompiledKernel(source, group, meta["triton_hash"])  # reads every file now: eviction cannot hurt it
    kernel.tuneforge_key = artifact.key  # for users, as the C++ loaders' tuneforge_key
    return kernel


class Launcher(Protocol):
    """A kernel ready to launch: ``launcher(grid, runtime_args, device)`` on torch's current stream of
    `device`, the run-time arguments (those not constexpr) in signature order."""

    key: str

    def __call__(self, grid: Sequence[int], args: Sequence[Any], device: int) -> None: ...


class _TritonLaunched:
    """A `Launcher` over Triton's CompiledKernel, for kernels the driver launcher does not do."""

    def __init__(self, kernel: Any, build_: TritonBuild, key: str) -> None:
        self.key, self._kernel = key, kernel
        self._order = [(name, build_.constexprs.get(name)) for name in build_.signature]

    def __call__(self, grid: Sequence[int], args: Sequence[Any], device: int) -> None:
        runtime = iter(args)  # a CompiledKernel takes every argument, the constexprs' values included
        self._kernel[tuple(grid)](*(next(runtime) if value is None else value for _, value in self._order))


_launchers: dict[tuple[str, TritonBuild], Launcher] = {}


def stored_entry(key: str, build_: TritonBuild) -> Entry | None:
    """The entry stored under `key` (local store, else the remote) if its meta says it was built from
    `build_` (whose target must be given); None otherwise: not a Triton key, stored nowhere, or built from
    something else (a record from another build, or tampered with). Needs neither Triton nor a GPU."""
    if build_.target is None or not isinstance(key, str) or not key.startswith(KEY_PREFIX) \
            or not KEY_RE.fullmatch(key):
        return None
    try:
        entry = artifact_tiers.fetch(key)
    except Exception as exc:  # a damaged entry, an unreachable remote: the caller builds instead
        log.debug("artifact %s from a record does not load: %s", key, exc)
        return None
    if entry is None:
        return None
    if entry.meta.get("build_identity") != build_identity(build_, build_.target):
        log.warning("not using artifact %s named by a tuning record: it was not built from this kernel's build",
                    key)
        return None
    return entry


def launcher(build_: TritonBuild, *, key: str | None = None) -> Launcher:
    """A launcher of `build_` on this process's GPU (`build_.target` must be the GPU's), memoised per process.

    With `key` (a tuning record's, see `stored_entry`), a stored entry built from `build_` is launched
    without importing Triton; otherwise the artifact comes from `build` (the store, the remote, else
    compiled). Launched through the CUDA driver unless it needs what only Triton's launcher does.
    """
    memo = (str(default_store().root), build_)
    with _load_lock:
        known = _launchers.get(memo)
    if known is not None:
        return known
    from tuneforge.compile.triton_launch import LaunchUnsupported, StoredTritonKernel

    entry = stored_entry(key, build_) if key is not None else None
    if entry is None:
        entry = build(build_).entry
    found: Launcher
    try:
        found = StoredTritonKernel(entry, build_.signature)
    except LaunchUnsupported as exc:
        log.debug("%s: launched through Triton (%s)", build_.kernel, exc)
        found = _TritonLaunched(load(build_), build_, entry.key)
    with _load_lock:
        return _launchers.setdefault(memo, found)


def load(build_: TritonBuild) -> Any:
    """The launchable ``CompiledKernel`` of `build_` (``kernel[grid](*every_argument)``, constexprs included),
    from the store without compiling (built first if no tier holds it); memoised per process. Needs a GPU,
    of the build's target when it names one."""
    memo = (str(default_store().root), build_)
    with _load_lock:
        known = _loaded.get(memo)
    if known is not None:
        return known
    here = current_target("load() makes a launchable kernel for this process's GPU",
                          "build() and kernel_files() compile and store kernels without one")
    if build_.target is not None and build_.target != here:
        raise TritonBuildError(f"TritonBuild.target: {build_.target} is not this process's GPU ({here})")
    kernel = compiled_kernel(build_)
    with _load_lock:
        return _loaded.setdefault(memo, kernel)
