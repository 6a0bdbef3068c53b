"""Choices: the candidate implementations that autotuning builds, verifies and times.

A choice is called with the selection's arguments: for ``select()`` that is the inputs followed by
the output buffer; for ``@autotune`` the launcher's own arguments. Building returns a future so that
many choices can compile at once; running happens only after the build has finished.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any, Protocol

from tuneforge.hashing import KeyMaterialError, key_hash, stable_dumps


class Builder(Protocol):
    """Where compiled choices are built: the build pool (`tuneforge.compile.pool.BuildPool`)."""

    def submit(self, build: Any, *, label: str = "") -> Future[Any]: ...


def completed_future(value: Any = None) -> Future[Any]:
    """A future that already holds `value` (a choice built without a pool, or nothing to build)."""
    future: Future[Any] = Future()
    future.set_result(value)
    return future


def failed_future(exc: BaseException) -> Future[Any]:
    """A future that already failed with `exc` (a build that could not even start)."""
    future: Future[Any] = Future()
    future.set_exception(exc)
    return future


def _source_hash(fn: Callable[..., Any]) -> str | None:
    """Hash of a Python function's source, so editing the function is a new choice."""
    try:
        return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()
    except (OSError, TypeError):
        return None  # builtins, ufuncs, C extensions: their name and module identify them


_PLAIN = (bool, int, float, str)


def key_value(value: Any) -> Any:
    """`value` as key material: itself when `stable_dumps` can encode it, else its repr."""
    if value is None or type(value) in _PLAIN:  # encodable as they are: a GEMM's 1584 configurations, 33k values,
        return value  # took 0.15 s of its cold search to check
    try:
        stable_dumps(value)
        return value
    except KeyMaterialError:
        return repr(value)


class Choice(ABC):
    """One candidate. Subclasses define how it is built and called."""

    name: str
    is_extern: bool = False
    is_native: bool = False  # compiled code that may crash the process: trials go to the isolated worker
    # A pick of its family's heuristics (e.g. in the GEMM's default space as well as the exhaustive one): a search
    # over the candidates starts from it (select(..., strategy=)). Not part of what runs: no hash_key change.
    suggested: bool = False

    @property
    @abstractmethod
    def hash_key(self) -> str:
        """Identity of what runs: equal keys mean interchangeable choices (deduplicated)."""

    @property
    def params(self) -> dict[str, Any]:
        """Parameters shown in reports and kept in records."""
        return {}

    @property
    def info(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.params.items())

    @property
    def family(self) -> str:
        """What kind of code runs (a library function, a template): choices of one family differ only
        in parameters, which is how a decision for one shape is mapped onto another shape's choices."""
        return f"{type(self).__name__}:{self.name}"

    def record_hints(self) -> dict[str, str]:
        """What this choice's tuning record should keep to find its code again (e.g. where its compiled
        code is stored): given back to `use_record` when a later selection takes the record."""
        return {}

    def use_record(self, info: Mapping[str, Any]) -> None:  # noqa: B027 - optional hook, a no-op by default
        """Take hints from this choice's tuning record (what `record_hints` gave, among other info)."""

    def build(self, builder: Builder | None = None) -> Future[Any]:
        """Prepare the choice to run (compile it); the future fails with the build error."""
        return completed_future()

    def sample_rows(self, rows: int, total: int) -> int:
        """How many of the `total` rows this choice runs on when a selection asks for a sample of about `rows`
        (tune/sample.py). A choice whose cost per row is the same on a sample opts in (a GEMM configuration,
        rounding to its M blocks); by default it runs the whole problem: a library call's fixed costs and own
        blocking would make its sample's estimate unfair, and the reference's run is one of its runs anyway."""
        return total

    @abstractmethod
    def run(self, args: Sequence[Any]) -> Any:
        """Call the choice once with the selection's arguments (after build)."""

    def bound(self, args: Sequence[Any]) -> Callable[[], Any]:
        """`run` on `args` as a call of no arguments, with what it would redo on every call done once: what
        timing runs (after build). The times then hold the choice's call as the op makes it in use, not the
        generic path's own work: a GEMM launcher's sizes and strides took 2 us of a 9 us 64^3 kernel's
        trial, against 0.6 us of numpy's, and numpy won the shapes where the kernel was 1.2-1.5x faster."""
        return functools.partial(self.run, args)

    def __call__(self, *args: Any) -> Any:
        return self.run(args)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {self.info}>".replace(" >", ">")


def _accepts_out(fn: Callable[..., Any]) -> bool:
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(fn, numpy.ufunc):
        return True
    try:
        return "out" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


class ExternChoice(Choice):
    """A library call, e.g. ``ExternChoice(numpy.matmul)``: called as ``fn(*inputs, out=out, **kwargs)``.

    Functions without an ``out`` parameter are called as ``fn(*inputs, **kwargs)`` and their result is
    copied into the output buffer. Its hash covers the name, the keyword arguments and the function's
    source where Python can see it. ``bind(args)``, where given, returns the call that timing makes instead
    (a call of no arguments with the same effect), for a library whose cheapest call differs from ``fn``'s.
    ``depends`` names what else the call's speed depends on (the threads the library runs on, say): hashed,
    so that a record timed under other conditions does not answer, and not passed to ``fn``.
    """

    is_extern = True

    def __init__(self, fn: Callable[..., Any], name: str | None = None, *, out: bool | None = None,
                 bind: Callable[[Sequence[Any]], Callable[[], Any]] | None = None,
                 depends: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        if not callable(fn):
            raise TypeError(f"ExternChoice needs a callable, got {fn!r}")
        if bind is not None and not callable(bind):
            raise TypeError(f"ExternChoice's bind must be callable (args -> a call of no arguments), got {bind!r}")
        self.fn = fn
        # What timing calls, where the library's cheapest call on some arguments is not `fn`'s (numpy.matmul
        # itself for a plain product, as gemm's dispatcher calls it): not hashed, the results are the same.
        self.bind = bind
        self.name = name or str(getattr(fn, "__name__", type(fn).__name__))
        self.kwargs = kwargs
        self.uses_out = _accepts_out(fn) if out is None else out
        self.depends = dict(depends or {})
        identity = {
            "name": self.name, "module": getattr(fn, "__module__", None),
            "qualname": getattr(fn, "__qualname__", None),
            "kwargs": {k: key_value(v) for k, v in sorted(kwargs.items())},
            "source": _source_hash(fn)}
        if self.depends:  # only then: the hashes of choices without it stay as they were
            identity["depends"] = {k: key_value(v) for k, v in sorted(self.depends.items())}
        self._hash = "ext" + key_hash(identity)

    @property
    def hash_key(self) -> str:
        return self._hash

    @property
    def params(self) -> dict[str, Any]:
        return {k: v if isinstance(v, (int, float, str, bool)) else repr(v) for k, v in self.kwargs.items()}

    def run(self, args: Sequence[Any]) -> Any:
        *inputs, out = args
        if self.uses_out:
            return self.fn(*inputs, out=out, **self.kwargs)
        result = self.fn(*inputs, **self.kwargs)
        if out is not None:
            if getattr(result, "shape", None) != getattr(out, "shape", None):
                raise ValueError(f"{self.name} returned shape {getattr(result, 'shape', None)}, "
                                 f"the output buffer has {getattr(out, 'shape', None)}")
            out[...] = result
        return out

    def bound(self, args: Sequence[Any]) -> Callable[[], Any]:
        if self.bind is not None:
            return self.bind(args)
        if not self.uses_out:
            return super().bound(args)
        *inputs, out = args
        return functools.partial(self.fn, *inputs, out=out, **self.kwargs)


class ConfiguredChoice(Choice):
    """A choice made of code plus a configuration: its hash and parameters come from both."""

    config: dict[str, Any]
    _hash: str

    @property
    def hash_key(self) -> str:
        return self._hash

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.config)


class CallableChoice(ConfiguredChoice):
    """A Python callable plus a configuration passed as keyword arguments (the `@autotune` configs)."""

    def __init__(self, fn: Callable[..., Any], config: Mapping[str, Any], name: str | None = None) -> None:
        self.fn = fn
        self.config = dict(config)
        self.name = name or f"{getattr(fn, '__name__', 'kernel')}[{self.info or 'default'}]"
        self._hash = "cfg" + key_hash({"fn": f"{getattr(fn, '__module__', '')}.{getattr(fn, '__qualname__', '')}",
                                       "source": _source_hash(fn),
                                       "config": {k: key_value(v) for k, v in sorted(self.config.items())}})

    @property
    def family(self) -> str:
        return f"callable:{getattr(self.fn, '__module__', '')}.{getattr(self.fn, '__qualname__', '')}"

    def run(self, args: Sequence[Any]) -> Any:
        return self.fn(*args, **self.config)

    def bound(self, args: Sequence[Any]) -> Callable[[], Any]:
        return functools.partial(self.fn, *args, **self.config)


def dedupe(choices: Sequence[Choice]) -> list[Choice]:
    """Drop later choices whose hash_key repeats an earlier one (same code, same parameters)."""
    seen: set[str] = set()
    unique = []
    for choice in choices:
        if not isinstance(choice, Choice):
            raise TypeError(f"not a tuneforge Choice: {choice!r} (wrap functions with ExternChoice)")
        if choice.hash_key not in seen:
            seen.add(choice.hash_key)
            unique.append(choice)
    return unique
