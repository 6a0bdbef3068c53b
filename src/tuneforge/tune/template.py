"""Kernel templates: Jinja2 source rendered with a configuration, then compiled as a choice.

Rendering is strict (an undefined variable is an error naming the template and the variable).
A template may leave placeholders with ``{{ hook("name") }}``; hooks are rendered last, once the
body exists, so a hook can depend on what the body turned out to be (a signature, a table of
constants). Parameters listed in ``runtime_params`` are not rendered: they go to the launcher at
call time, so configurations differing only in them share one compiled artifact.

A tuning record remembers where a choice's compiled code is (artifact key and entry function), so a
warm start loads it without a render. Records come from outside too (``records import``, shipped
bundles), so that hint is only taken when the artifact says it was built from this very choice's
render (its render identity, kept in the artifact's meta); otherwise the choice is built from its
own source. A hint naming code that is not the choice's (another configuration's or dtype's kernel,
not a module, not a key) is counted (`rejected_hints`) and logged once per process; one that is only
out of date (the artifact is gone, or was built under other cpp.* settings) is dropped quietly.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuneforge.errors import TemplateError
from tuneforge.hashing import key_hash
from tuneforge.tune.choices import Builder, ConfiguredChoice, completed_future, failed_future, key_value
from tuneforge.tune.process_library import build_ahead, load_process_library
from tuneforge.warn_once import first_time

if TYPE_CHECKING:
    from tuneforge.search.space import Space
    from tuneforge.tune.template_space import TemplateSpace

Launcher = Callable[[Callable[..., Any], Sequence[Any], Mapping[str, Any]], Any]
# (kernel, args, config) -> the launcher's call on those arguments as a call of no arguments (Choice.bound)
Binder = Callable[[Callable[..., Any], Sequence[Any], Mapping[str, Any]], Callable[[], Any]]
Hook = Callable[[Mapping[str, Any], str], str]

_registry: dict[str, tuple[str, str]] = {}  # template name -> (source, signature)
_registry_lock = threading.Lock()
_HOOK_MARK = "\x00tuneforge-hook:{}\x00"
RENDERED_NAME = "rendered.txt"  # a kept render's file in its store entry

log = logging.getLogger("tuneforge.tune")
_hints_lock = threading.Lock()
_hints_rejected = 0


def rejected_hints() -> int:
    """How many record hints this process ignored because they did not name the choice's own artifact."""
    with _hints_lock:
        return _hints_rejected


def _reject_hint(choice: TemplateChoice, hint: tuple[str, str], reason: str) -> None:
    global _hints_rejected
    with _hints_lock:
        _hints_rejected += 1
    if first_time("tune.rejected-record-hint"):  # a forged bundle would otherwise warn per choice and shape
        log.warning("ignored a tuning record that names compiled code not built for %s (%s: artifact %.60r, "
                    "entry %.60r); built it from its own source. Records come from the local database, "
                    "`tuneforge records import` and shipped bundles: check those you added. Further ignored "
                    "records are counted (tuneforge.tune.template.rejected_hints()) but not logged.",
                    choice.name, reason, hint[0], hint[1])


def _environment() -> Any:
    import jinja2  # lazily: only templates need it

    return jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True,
                              autoescape=False)


class KernelTemplate:
    """A named kernel template. ``signature`` is the C prototype of the entry function (itself rendered),
    or for ``language="python"`` the name of the entry function."""

    def __init__(self, name: str, source: str, *, signature: str, language: str = "cpp",
                 launcher: Launcher | None = None, binder: Binder | None = None,
                 hooks: Mapping[str, Hook] | None = None,
                 runtime_params: Iterable[str] = (), flags: Sequence[str] = (), openmp: bool = False,
                 include_dirs: Sequence[str] = (), describe: Callable[[dict[str, Any]], str] | None = None,
                 sample_rows: Callable[[dict[str, Any], int, int], int] | None = None,
                 link_sources: Sequence[str] = (), process_library: str = "") -> None:
        if language not in ("cpp", "python"):
            raise TemplateError(f"template {name!r}: language must be 'cpp' or 'python', not {language!r}")
        if link_sources and language != "cpp":
            raise TemplateError(f"template {name!r}: link_sources are C++ sources, for a C++ template only")
        if process_library and language != "cpp":
            raise TemplateError(f"template {name!r}: process_library is C++ source, for a C++ template only")
        with _registry_lock:
            known = _registry.get(name)
            if known is not None and known != (source, signature):
                raise TemplateError(f"duplicate template name {name!r}: another template with this name and a "
                                    "different source is already registered; give each template its own name")
            _registry[name] = (source, signature)
        self.name = name
        self.source = source
        self.signature = signature
        self.language = language
        self.launcher = launcher
        # What timing calls: the launcher's work that depends only on the arguments done once (without one, the
        # launcher itself each time)
        self.binder = binder
        self.hooks = dict(hooks or {})
        self.runtime_params = frozenset(runtime_params)
        self.flags = tuple(flags)
        self.openmp = openmp
        self.include_dirs = tuple(include_dirs)
        # C++ compiled once (not rendered) and linked into every configuration's module (CppBuild.link_sources)
        self.link_sources = tuple(link_sources)
        # C++ built as a plain library, loaded once per process with its symbols global before any of this
        # template's modules (process_library.py): what its modules share, found by name
        self.process_library = process_library
        self.describe = describe  # the info column of reports; default: every parameter
        # (config, rows, total) -> the rows a configuration runs on when a selection samples the problem
        # (Choice.sample_rows); default: all of them
        self.sample_rows = sample_rows
        # What identifies this template's code: choices are keyed by it plus their configuration, so
        # naming a choice never needs Jinja2 or a render (a warm start renders nothing).
        self.identity = hashlib.sha256(json.dumps([
            name, source, signature, language, list(self.flags), openmp, list(self.include_dirs),
            sorted(self.runtime_params), sorted(self.hooks),
            *([list(self.link_sources)] if self.link_sources else []),
            *([self.process_library] if self.process_library else [])]).encode()).hexdigest()
        self._compiled: Any = None
        # (what, render identity) -> rendered text or build request: a template's configurations that differ only
        # in runtime parameters share one source (a GEMM search's 97 configurations rendered, parsed and keyed
        # their 5 sources once each: 1.2 s of a 10 s cold search)
        self._memo: dict[tuple[str, str], Any] = {}

    def _render_text(self, text: str, values: Mapping[str, Any], what: str) -> str:
        import jinja2

        used: list[str] = []

        def hook(hook_name: str) -> str:
            if hook_name not in self.hooks:
                raise TemplateError(f"template {self.name!r}: unknown hook {hook_name!r} "
                                    f"(hooks: {', '.join(sorted(self.hooks)) or 'none'})")
            used.append(hook_name)
            return _HOOK_MARK.format(hook_name)

        try:
            if self._compiled is None or what != "source":
                compiled = _environment().from_string(text)
                if what == "source":
                    self._compiled = compiled
            else:
                compiled = self._compiled
            body: str = compiled.render({**values, "hook": hook})
        except jinja2.UndefinedError as exc:
            raise TemplateError(f"template {self.name!r} ({what}): {exc.message} — pass it in the configuration "
                                f"(given: {', '.join(sorted(values)) or 'nothing'})") from None
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"template {self.name!r} ({what}) line {exc.lineno}: {exc.message}") from None
        for hook_name in used:  # hooks last: they see the finished body
            body = body.replace(_HOOK_MARK.format(hook_name), self.hooks[hook_name](values, body))
        return body

    def render(self, config: Mapping[str, Any]) -> str:
        """The source for `config` (runtime parameters are not available to the template)."""
        values = {k: v for k, v in config.items() if k not in self.runtime_params}
        return self._render_text(self.source, values, "source")

    def render_kept(self, config: Mapping[str, Any]) -> str:
        """`render`, kept in the artifact store by the template's identity and the values: a process that
        renders what an earlier one did (a warm start) reads the text back instead of importing Jinja2
        and compiling the template (~35 ms). Templates with hooks (code, not text) always render."""
        values = {k: v for k, v in config.items() if k not in self.runtime_params}
        if self.hooks:
            return self.render(values)
        material = {k: key_value(v) for k, v in sorted(values.items())}
        key = "txt" + key_hash({"template": self.identity, "values": material})

        def write(staging: Path) -> Mapping[str, Any]:
            (staging / RENDERED_NAME).write_text(self.render(values), encoding="utf-8")
            return {"rendered": self.name}

        try:
            from tuneforge.store.tiers import artifact_tiers

            return artifact_tiers.get_or_build(key, write).file(RENDERED_NAME).read_text(encoding="utf-8")
        except TemplateError:
            raise
        except Exception as exc:  # a read-only or broken store: rendering still works
            log.debug("template %s: render not kept (%s)", self.name, exc)
            return self.render(values)

    def render_signature(self, config: Mapping[str, Any]) -> str:
        values = {k: v for k, v in config.items() if k not in self.runtime_params}
        return self._render_text(self.signature, values, "signature").strip()

    def choices(self, configs: Iterable[Mapping[str, Any]]) -> list[TemplateChoice]:
        return [TemplateChoice(self, config, f"{self.name}_{i}") for i, config in enumerate(configs)]

    def space(self, space: Space) -> TemplateSpace:
        """This template over a `tuneforge.Space`, as one candidate of `select(..., strategy=)`: choices are made
        only for what the search asks and what the records hold (tune/template_space.py)."""
        from tuneforge.tune.template_space import TemplateSpace

        return TemplateSpace(self, space)

    def __getstate__(self) -> dict[str, Any]:
        # Sent to benchmark workers as data: the compiled Jinja template is rebuilt there if needed.
        return {**self.__dict__, "_compiled": None, "_memo": {}}

    def memo(self, what: str, identity: str, make: Callable[[], Any]) -> Any:
        """`make()`, once per `what` and render identity (TemplateChoice.render_identity)."""
        key = (what, identity)
        found = self._memo.get(key)
        if found is None:
            found = self._memo[key] = make()
        return found

    def __repr__(self) -> str:
        return f"<KernelTemplate {self.name} ({self.language})>"


class TemplateChoice(ConfiguredChoice):
    """A template with one configuration; rendered when first needed, building compiles (or loads) it.

    Its hash is the template's identity plus the configuration. Once built, `artifact_key` names the
    compiled artifact (records keep it), and a choice given that key back (`use_record`) loads the
    artifact directly, without rendering the template or hashing the command line.
    """

    def __init__(self, template: KernelTemplate, config: Mapping[str, Any], name: str) -> None:
        self.template = template
        self.config = dict(config)
        self.name = name
        self.is_native = template.language == "cpp"
        self._source: str | None = None
        self._signature: str | None = None
        self._hash = "tpl" + key_hash({"template": template.identity,
                                       "config": {k: key_value(v) for k, v in sorted(self.config.items())}})
        self.artifact_key: str | None = None  # with entry: where the built code is (records keep both)
        self.entry: str | None = None
        self.artifact_hint: tuple[str, str] | None = None
        self._kernel: Callable[..., Any] | None = None
        self._future: Future[Any] | None = None
        self._lock = threading.Lock()

    @functools.cached_property
    def render_identity(self) -> str:
        """What the rendered source depends on (runtime parameters are not rendered): a build records it
        in its artifact, and a record's artifact is trusted only if it names this. Computed when first
        needed, since naming the candidates of a selection (every call of a new layout) must stay cheap."""
        rendered = {k: key_value(v) for k, v in sorted(self.config.items()) if k not in self.template.runtime_params}
        # hashed once per build (a GEMM search's 1584 configurations are 72 of them), known by its values' reprs
        seen = repr([(k, type(v).__qualname__, v) for k, v in rendered.items()])
        return str(self.template.memo("render_identity", seen, lambda: "rnd" + key_hash(
            {"template": self.template.identity, "config": rendered})))

    @property
    def source(self) -> str:
        if self._source is None:
            self._source = self.template.memo("source", self.render_identity, lambda: self.template.render(self.config))
        return self._source

    @property
    def signature(self) -> str:
        if self._signature is None:
            self._signature = self.template.memo("signature", self.render_identity,
                                                 lambda: self.template.render_signature(self.config))
        return self._signature

    def record_hints(self) -> dict[str, str]:
        """Once built: the artifact key and entry function of the compiled code, for its records."""
        hints = {"artifact": self.artifact_key, "entry": self.entry}
        return {name: value for name, value in hints.items() if isinstance(value, str)}

    def use_record(self, info: Mapping[str, Any]) -> None:
        """Remember where the record says the compiled code is (see `record_hints`); checked when it is
        loaded (`_load`)."""
        artifact, entry = info.get("artifact"), info.get("entry")
        if isinstance(artifact, str) and isinstance(entry, str) and self.is_native:
            self.artifact_hint = (artifact, entry)

    @property
    def family(self) -> str:
        return f"template:{self.template.name}"

    @property
    def info(self) -> str:
        if self.template.describe is not None:
            return self.template.describe(self.config)
        return super().info

    def sample_rows(self, rows: int, total: int) -> int:
        if self.template.sample_rows is not None:
            return self.template.sample_rows(self.config, rows, total)
        return total

    def __getstate__(self) -> dict[str, Any]:
        # Only data crosses to a worker: it loads the artifact from the store by itself.
        return {k: v for k, v in self.__dict__.items() if k not in ("_kernel", "_future", "_lock")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._kernel, self._future, self._lock = None, None, threading.Lock()

    def _load_hint(self, hint: tuple[str, str]) -> tuple[Callable[..., Any] | None, str]:
        """The kernel the record's hint names, if it is this choice's own; else None and, if the record
        names code that is not this choice's (not merely out of date or gone), why."""
        from tuneforge.compile.cpp import ArtifactMismatch, load_module_by_key

        artifact, entry = hint
        try:
            module = load_module_by_key(artifact, origin=self.render_identity, entry=entry)
        except ArtifactMismatch as exc:
            log.debug("%s: not using the recorded artifact: %s", self.name, exc)
            return None, str(exc) if exc.suspect else ""
        except Exception as exc:  # e.g. a damaged entry that will not import: the choice still builds itself
            log.debug("%s: the recorded artifact %s does not load (%s); building the choice instead",
                      self.name, artifact, exc)
            return None, ""
        kernel: Callable[..., Any] | None = getattr(module, entry, None) if module is not None else None
        return kernel, ""

    def _load(self) -> Callable[..., Any]:
        if self.template.process_library:
            load_process_library(self.template)
        hint, suspect = self.artifact_hint, ""
        if hint is not None:  # a record says where the compiled code is: no render needed if it is ours
            kernel, suspect = self._load_hint(hint)
            if kernel is not None:
                self._kernel = kernel
                self.artifact_key, self.entry = hint
                return kernel
            self.artifact_hint = None  # checked once: later loads build normally
        kernel = self._load_built()
        # The same source rendered for another configuration is the same artifact, built for (and marked
        # with) whichever choice came first: not a bad record, as the key it derives shows.
        if hint is not None and suspect and (self.artifact_key, self.entry) != hint:
            _reject_hint(self, hint, suspect)
        return kernel

    def _load_built(self) -> Callable[..., Any]:
        if self.template.language == "python":
            from tuneforge.compile.python import load_keyed

            module, key = load_keyed(self.source)
            entry = self.signature
        else:
            from tuneforge.compile.cpp import load_request

            request = self.cpp_build()
            entry = request.entries[0]
            module, key = load_request(request)
        kernel: Callable[..., Any] | None = getattr(module, entry, None)
        if kernel is None:
            raise TemplateError(f"template {self.template.name!r}: the built module has no function {entry!r}")
        self._kernel = kernel
        self.artifact_key, self.entry = key, entry
        return kernel

    def cpp_build(self) -> Any:
        """The C++ build of this choice as data (a `CppBuild`), for a build pool."""
        from tuneforge.compile.cpp import module_request

        return self.template.memo("build", self.render_identity, lambda: module_request(
            self.source, functions=[self.signature], flags=self.template.flags, openmp=self.template.openmp,
            include_dirs=self.template.include_dirs, origin=self.render_identity,
            link_sources=self.template.link_sources))

    def build(self, builder: Builder | None = None) -> Future[Any]:
        """Compile in the build pool when one is given (the parent loads the artifact only when it runs
        the choice), else compile and load here. Built once: a failed build stays failed."""
        with self._lock:
            if self._future is None:
                if builder is not None and self.is_native:
                    if self.template.process_library:
                        build_ahead(self.template, builder)
                    try:
                        self._future = builder.submit(self.cpp_build(), label=self.name)
                    except Exception as exc:
                        self._future = failed_future(exc)
                else:
                    try:
                        self._future = completed_future(self._load())
                    except Exception as exc:
                        self._future = failed_future(exc)
            return self._future

    def kernel(self) -> Callable[..., Any]:
        """The compiled entry function (loaded from the store on first use)."""
        if self._kernel is None:
            self.build().result()  # raises the build error, if any
            return self._kernel if self._kernel is not None else self._load()
        return self._kernel

    def run(self, args: Sequence[Any]) -> Any:
        kernel = self._kernel
        if kernel is None:
            self.build().result()  # raises the build error, if any
            kernel = self._kernel if self._kernel is not None else self._load()
        if self.template.launcher is not None:
            return self.template.launcher(kernel, args, self.config)
        return kernel(*args)

    def bound(self, args: Sequence[Any]) -> Callable[[], Any]:
        kernel = self.kernel()
        if self.template.binder is not None:
            return self.template.binder(kernel, args, self.config)
        if self.template.launcher is not None:
            return functools.partial(self.template.launcher, kernel, args, self.config)
        return functools.partial(kernel, *args)
