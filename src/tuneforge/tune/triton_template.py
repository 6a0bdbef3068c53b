"""Triton kernel templates: a ``@triton.jit`` source and a grid, as choices for ``select()``.

    template = TritonTemplate("add", SOURCE, "add_kernel", {"x": "*fp32", "out": "*fp32", "n": "i32",
                              "BLOCK": "constexpr"}, grid=add_grid, arguments=add_arguments)
    choices = template.choices([TritonConfig({"BLOCK": 256}, num_warps=4), TritonConfig({"BLOCK": 1024})])
    select("add", [*choices, ExternChoice(torch.add)], x, out=out)

The source is Jinja2 (strict: an undefined variable names the template and the variable), rendered
with ``render`` values plus the configuration's constexprs, ``num_warps`` and ``num_stages``; a
source that uses none of those renders once for every configuration, and the constexprs go to the
compiler (and into the artifact key) instead.  ``grid(config, args)`` gives the launch grid from the
configuration (its constexprs, ``num_warps``, ``num_stages``) and the selection's arguments;
``arguments(args)`` maps the selection's arguments (inputs, then the output) to the kernel's
run-time arguments, in signature order (default: as they are).  Both must be module-level functions
when the trials run in the isolated worker: choices travel there by pickle.

On a GPU, a choice's build is a `TritonBuild` for the current device, compiled in the build pool and
cached as an artifact (compile/triton.py); the choice launches the stored kernel.  Under Triton's
interpreter (``TRITON_INTERPRET=1`` when triton is imported), nothing is compiled: the ``@triton.jit``
function runs on CPU tensors, which is how the templates are tested without a GPU.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import field
from typing import Any

from tuneforge.dataclass_lite import dataclass
from tuneforge.errors import TemplateError
from tuneforge.hashing import key_hash
from tuneforge.tune.choices import Builder, ConfiguredChoice, completed_future, failed_future, key_value
from tuneforge.tune.template import KernelTemplate

__all__ = ["TritonChoice", "TritonConfig", "TritonTemplate", "interpreting"]

Constexpr = int | float | bool | str
Grid = Callable[[Mapping[str, Any], Sequence[Any]], tuple[int, ...]]
Arguments = Callable[[Sequence[Any]], Sequence[Any]]


def interpreting() -> bool:
    """Whether Triton runs kernels in its interpreter in this process (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class TritonConfig:
    """One configuration: constexpr values and the launch options, as triton.Config holds them."""

    kwargs: Mapping[str, Constexpr] = field(default_factory=dict)
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        for name, value in self.kwargs.items():
            if not isinstance(name, str) or not isinstance(value, (int, float, bool, str)):
                raise TemplateError(f"TritonConfig.kwargs: {name!r}={value!r} is not a constexpr "
                                    "(int, float, bool or str)")
        for option in ("num_warps", "num_stages"):
            value = getattr(self, option)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise TemplateError(f"TritonConfig.{option} must be a positive integer, not {value!r}")

    def as_dict(self) -> dict[str, Constexpr]:
        """The constexprs plus ``num_warps`` and ``num_stages``: what `grid` and the render see."""
        return {**self.kwargs, "num_warps": self.num_warps, "num_stages": self.num_stages}


class TritonTemplate:
    """A Triton kernel source with its signature, grid and argument mapping; see the module."""

    def __init__(self, name: str, source: str, kernel: str, signature: Mapping[str, str], *, grid: Grid,
                 arguments: Arguments | None = None, render: Mapping[str, Any] | None = None) -> None:
        if not callable(grid):
            raise TemplateError(f"TritonTemplate {name!r}: grid must be a function (config, args) -> grid")
        if arguments is not None and not callable(arguments):
            raise TemplateError(f"TritonTemplate {name!r}: arguments must be a function args -> kernel arguments")
        self.name = name
        self.kernel = kernel
        self.signature = dict(signature)
        self.grid = grid
        self.arguments = arguments
        self.render_values = dict(render or {})
        self._template = KernelTemplate(f"triton:{name}", source, signature=kernel, language="python")

    def render(self, config: TritonConfig) -> str:
        return self._template.render({**self.render_values, **config.as_dict()})

    def choices(self, configs: Iterable[TritonConfig | Mapping[str, Constexpr]]) -> list[TritonChoice]:
        """One choice per configuration (a plain mapping is the constexprs, with default launch options)."""
        return [TritonChoice(self, c if isinstance(c, TritonConfig) else TritonConfig(dict(c))) for c in configs]

    def __repr__(self) -> str:
        return f"TritonTemplate({self.name!r}, kernel={self.kernel!r})"


class TritonChoice(ConfiguredChoice):
    """One configuration of a `TritonTemplate`: built by the build pool on a GPU, interpreted otherwise."""

    is_native = True  # a kernel can take the process (or the GPU context) down with it: trials isolated

    def __init__(self, template: TritonTemplate, config: TritonConfig) -> None:
        self.template = template
        self.triton_config = config
        self.config = dict(config.as_dict())
        self.source = template.render(config)
        self.name = f"{template.name}[{', '.join(f'{k}={v}' for k, v in self.config.items())}]"
        self._hash = "tri" + key_hash({
            "template": template.name, "kernel": template.kernel, "source": key_hash(self.source),
            "signature": template.signature, "config": {k: key_value(v) for k, v in sorted(self.config.items())}})
        self.artifact_key: str | None = None  # once built: where the compiled kernel is (records keep it)
        self.key_hint: str | None = None  # the artifact its record names
        self._kernel: Any = None  # under the interpreter: the @triton.jit function
        self._launchers: dict[int, Any] = {}  # on a GPU: device -> the compiled kernel's launcher

    @property
    def family(self) -> str:
        return f"triton:{self.template.name}"

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_kernel": None, "_launchers": {}}  # loaded kernels stay in their process

    def triton_build(self, target: Any = None) -> Any:
        """The `TritonBuild` of this choice for `target` (a GpuTarget; None: the GPU of the process that
        builds it)."""
        from tuneforge.compile.triton import TritonBuild

        return TritonBuild(self.source, self.template.kernel, self.template.signature,
                           dict(self.triton_config.kwargs), num_warps=self.triton_config.num_warps,
                           num_stages=self.triton_config.num_stages, target=target)

    def build(self, builder: Builder | None = None) -> Future[Any]:
        if interpreting():
            return completed_future()  # the interpreter runs the source itself: nothing to compile
        try:
            from tuneforge.compile.triton_env import build_target

            # The target resolved here: the build pool's workers then need no GPU (or CUDA) of their own.
            request = self.triton_build(build_target())
            if self.key_hint is not None:
                from tuneforge.compile.triton import stored_entry

                if stored_entry(self.key_hint, request) is not None:  # a warm start: no Triton import to key it
                    self.artifact_key = self.key_hint
                    return completed_future()
            if builder is None:
                from tuneforge.compile import triton as triton_builder

                artifact = triton_builder.build(request)
                self.artifact_key = artifact.key
                return completed_future(artifact)
            future = builder.submit(request, label=self.name)
        except Exception as exc:  # e.g. no GPU to target, a compile error: this choice's own failure
            return failed_future(exc)
        future.add_done_callback(self._built)
        return future

    def _built(self, future: Future[Any]) -> None:
        if future.exception() is None:
            self.artifact_key = str(future.result().key)

    def record_hints(self) -> dict[str, str]:
        """Once built: the kernel's artifact key, so that a warm start launches it without importing Triton."""
        return {"artifact": self.artifact_key} if self.artifact_key else {}

    def use_record(self, info: Mapping[str, Any]) -> None:
        """Take the artifact key the record kept (trusted only for the build it was made from)."""
        key = info.get("artifact")
        self.key_hint = key if isinstance(key, str) else None

    def _interpreted(self) -> Any:
        if self._kernel is None:
            from tuneforge.compile import triton as triton_builder

            self._kernel = triton_builder.jit_function(self.triton_build())
        return self._kernel

    def _launcher(self, device: int) -> Any:
        found = self._launchers.get(device)
        if found is None:
            from tuneforge.compile import triton as triton_builder
            from tuneforge.compile.triton_env import device_target

            request = self.triton_build(device_target(device))
            found = self._launchers[device] = triton_builder.launcher(request, key=self.key_hint)
        return found

    def run(self, args: Sequence[Any]) -> Any:
        values = list(self.template.arguments(args)) if self.template.arguments is not None else list(args)
        grid = tuple(self.template.grid(self.config, args))
        if interpreting():
            self._interpreted()[grid](*values, **self.triton_config.kwargs)
        else:
            device = _current_device()
            self._launcher(device)(grid, values, device)
        return args[-1] if args else None


def _current_device() -> int:
    import torch

    return int(torch.cuda.current_device())
