"""@tuneforge.torch.op: your own tuned operator, registered with torch.library.

The decorated function allocates the operator's output from its inputs (``torch.empty_like(x)``, say). That one
function is both the operator's fake kernel, so torch.compile traces through it, and the first step of its real
kernel, which then picks (once per layout) the fastest of `choices` with select() and calls it as
``choice(*inputs, out)``::

    @tuneforge.torch.op("mylib::scale", [tuneforge.ExternChoice(scale_a), tuneforge.ExternChoice(scale_b)])
    def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
        return torch.empty_like(x)

    y = scale(x, 2.0)          # eager; or inside torch.compile(fullgraph=True)
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from tuneforge.tune.choices import Choice
from tuneforge.tune.select import select

__all__ = ["TunedOp", "op"]

ChoicesArg = Sequence[Choice] | Callable[..., Sequence[Choice]]
_NAME = re.compile(r"^[A-Za-z_]\w*::[A-Za-z_]\w*$")
_libraries: dict[str, Any] = {}  # namespace -> torch.library.Library, kept for the process's life
_ops: dict[str, TunedOp] = {}
_lock = threading.Lock()


class TunedOp:
    """A torch operator whose kernel is the fastest of its choices for each layout of its inputs."""

    def __init__(self, name: str, allocate: Callable[..., Any], choices: ChoicesArg, select_options: dict[str, Any]):
        self.name = name
        self._allocate = allocate
        self._choices = choices
        self._select_options = select_options
        self._picked: dict[tuple[Any, ...], Choice] = {}  # by layout: select()'s decision, without its key's cost
        namespace, _, short = name.partition("::")
        self.op: Any = getattr(getattr(torch.ops, namespace), short).default

    def __call__(self, *args: Any) -> Any:
        return self.op(*args)

    def kernel(self, *args: Any) -> Any:
        """The real kernel: allocate, pick (first call of a layout), call the pick."""
        out = self._allocate(*args)
        if any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            args = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)  # choices may use numpy
        layout = tuple(_layout(a) for a in args)
        best = self._picked.get(layout)
        if best is None:
            choices = self._choices(*args) if callable(self._choices) else self._choices
            best = select(self.name, list(choices), list(args), out=out, **self._select_options)
            self._picked[layout] = best
        best(*args, out)
        return out

    def forget(self) -> None:
        """Drop the in-process picks (the record database keeps the decisions)."""
        self._picked.clear()


def _layout(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), value.stride(), value.dtype, value.device, value.storage_offset())
    return type(value)  # as select(): a scalar's type shapes the tuning, its value does not


def op(name: str, choices: ChoicesArg, *, backward: Callable[..., Any] | None = None,
       setup_context: Callable[..., Any] | None = None, **select_options: Any) -> Callable[[Callable[..., Any]],
                                                                                        TunedOp]:
    """Register ``name`` ("namespace::op") as a torch operator tuned among `choices` (a list of Choices, or a
    function of the inputs that returns one). The decorated function, typed as torch.library.custom_op wants
    (Tensor, int, float, bool arguments; one Tensor result), allocates the output. `backward` and
    `setup_context` are torch.library.register_autograd's. Other keywords go to select() (reference=, rtol=,
    atol=, strategy=, budget=, ...)."""
    if not _NAME.match(name):
        raise ValueError(f"tuneforge.torch.op: name must be 'namespace::op_name' (identifiers), got {name!r}")
    if setup_context is not None and backward is None:
        raise ValueError(f"tuneforge.torch.op({name!r}): setup_context is given without backward")

    def register(allocate: Callable[..., Any]) -> TunedOp:
        schema = torch.library.infer_schema(allocate, mutates_args=())
        if "-> Tensor" not in schema or schema.endswith("Tensor[]"):
            raise TypeError(f"tuneforge.torch.op({name!r}): the decorated function returns one Tensor (the "
                            f"output it allocates); its schema is {schema}")
        namespace, _, short = name.partition("::")
        with _lock:
            if name in _ops:
                raise ValueError(f"tuneforge.torch.op: {name!r} is registered already in this process")
            library = _libraries.get(namespace)
            if library is None:
                library = _libraries[namespace] = torch.library.Library(namespace, "FRAGMENT")
            library.define(short + schema)
            tuned = TunedOp(name, allocate, choices, select_options)
            for key in ("CPU", "CUDA"):
                library.impl(short, tuned.kernel, key)
            torch.library.register_fake(name, allocate, lib=library)
            if backward is not None:
                torch.library.register_autograd(name, backward, setup_context=setup_context, lib=library)
            _ops[name] = tuned
        return tuned

    return register
