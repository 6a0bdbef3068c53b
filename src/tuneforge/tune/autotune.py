"""@autotune: tune a kernel launcher's keyword configurations per key, then dispatch through a dict.

    @tuneforge.autotune(configs=[{"block": 32}, {"block": 64}], key=["n"])
    def scale(x, out, n, *, block): ...

The first call for a key benchmarks every configuration on that call's own arguments (arrays are
restored after every run, and left as they were before the winner runs for real), verifies them
against `reference` when one is given, and records the timings; later calls with the same key cost
a tuple build and a dict lookup. Records persist, so a new process reuses the decision.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from tuneforge.tune.choices import CallableChoice, Choice, dedupe
from tuneforge.tune.device import cuda_index, job_device
from tuneforge.tune.fingerprint import selection_key as make_selection_key
from tuneforge.tune.job import TrialJob
from tuneforge.tune.select import decide
from tuneforge.tune.verify import is_array

KeyFn = Callable[..., Any]
Prune = Callable[[list[dict[str, Any]], Sequence[Any], Mapping[str, Any]], Sequence[Mapping[str, Any]]]
_SCALARS = (int, float, str, bool, type(None))


def _normalise(value: Any) -> Any:
    """Hashable key part: scalars as they are, arrays as (shape, dtype, strides)."""
    if type(value) in _SCALARS:
        return value
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        strides = value.strides if isinstance(value.strides, tuple) else tuple(value.stride())
        return (tuple(value.shape), str(value.dtype), strides)
    return value if isinstance(value, tuple) else repr(value)


class Autotuner:
    """The callable that @autotune returns; ``.cache`` maps keys to the chosen configuration's runner."""

    def __init__(self, fn: Callable[..., Any], configs: Sequence[Mapping[str, Any]], key: Sequence[str] | KeyFn,
                 *, reference: Callable[..., Any] | None = None, prune: Prune | None = None,
                 name: str | None = None, rtol: float | None = None, atol: float | None = None) -> None:
        if not configs:
            raise ValueError(f"@autotune on {fn.__qualname__}: configs is empty")
        self.fn = fn
        self.configs = [dict(c) for c in configs]
        self.reference = reference
        self.prune = prune
        self.name = name or f"{fn.__module__}.{fn.__qualname__}"
        self.rtol, self.atol = rtol, atol
        self.cache: dict[Any, Callable[..., Any]] = {}
        self.decisions: dict[Any, Choice] = {}
        self._lock = threading.Lock()
        self._key = self._key_function(fn, key)
        functools.update_wrapper(self, fn)

    @staticmethod
    def _key_function(fn: Callable[..., Any], key: Sequence[str] | KeyFn) -> Callable[[tuple[Any, ...],
                                                                                          dict[str, Any]], Any]:
        if callable(key):
            user_key = key
            return lambda args, kwargs: _normalise(user_key(*args, **kwargs))
        names = list(key)
        params = list(inspect.signature(fn).parameters)
        unknown = [n for n in names if n not in params]
        if unknown:
            raise ValueError(f"@autotune key names {unknown} are not parameters of {fn.__qualname__} ({params})")
        positions = [(params.index(n), n) for n in names]
        if len(positions) == 1:  # the common case, made without a loop: every call builds its key
            (index, name), = positions

            def key_of_one(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
                value = args[index] if index < len(args) else kwargs[name]
                return (value if type(value) in _SCALARS else _normalise(value),)

            return key_of_one

        def key_of_call(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            return tuple([_normalise(args[i] if i < len(args) else kwargs[n]) for i, n in positions])

        return key_of_call

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = self._key(args, kwargs)
        runner = self.cache.get(key)
        if runner is None:
            runner = self._tune(key, args, kwargs)
        return runner(*args, **kwargs)

    def _candidates(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[CallableChoice]:
        configs = [dict(c) for c in self.configs]
        if self.prune is not None:
            configs = [dict(c) for c in self.prune(configs, args, kwargs)]
            if not configs:
                raise ValueError(f"@autotune on {self.fn.__qualname__}: prune removed every configuration")
        choices = dedupe([CallableChoice(self.fn, c, name=f"{self.fn.__name__}[{_config_text(c)}]") for c in configs])
        return [c for c in choices if isinstance(c, CallableChoice)]

    def _tune(self, key: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Callable[..., Any]:
        with self._lock:
            runner = self.cache.get(key)
            if runner is not None:
                return runner
            candidates = self._candidates(args, kwargs)
            values = list(args) + list(kwargs.values())
            # A decision on a GPU is that GPU's: keyed by it as select() keys its CUDA selections.
            selection_key = make_selection_key(self.name, {"autotune_key": repr(key)},
                                               gpu=cuda_index(job_device(values)))
            names = list(kwargs)

            def call_with(fn: Callable[..., Any], config: Mapping[str, Any]) -> Callable[[Sequence[Any]], Any]:
                return lambda vals: fn(*vals[:len(args)], **dict(zip(names, vals[len(args):], strict=True)),
                                       **config)

            bound = [_BoundChoice(c, call_with(self.fn, c.config)) for c in candidates]

            reference = (_BoundChoice(CallableChoice(self.reference, {}, name="reference"),
                                      call_with(self.reference, {})) if self.reference is not None else None)

            def workload() -> TrialJob:
                outputs = [i for i, v in enumerate(values) if is_array(v)]
                return TrialJob(name=self.name, key=selection_key, outputs=outputs, rtol=self.rtol, atol=self.atol,
                                poison_outputs=False, inputs_text=repr(key), live_args=values)

            selection = decide(self.name, selection_key, bound, reference, workload, sizes=[repr(key)],
                               described=[repr(key)])
            winner = selection.choice
            assert isinstance(winner, _BoundChoice)
            config = winner.inner.config
            runner = functools.partial(self.fn, **config)
            self.decisions[key] = winner.inner
            self.cache[key] = runner
            return runner


class _BoundChoice(Choice):
    """A CallableChoice called with one call's arguments (positional and keyword) during tuning."""

    def __init__(self, inner: CallableChoice, call: Callable[[Sequence[Any]], Any]) -> None:
        self.inner, self._call = inner, call
        self.name = inner.name

    @property
    def hash_key(self) -> str:
        return self.inner.hash_key

    @property
    def params(self) -> dict[str, Any]:
        return self.inner.params

    @property
    def family(self) -> str:
        return self.inner.family

    def run(self, args: Sequence[Any]) -> Any:
        return self._call(args)


def _config_text(config: Mapping[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in config.items()) or "default"


def autotune(configs: Sequence[Mapping[str, Any]], key: Sequence[str] | KeyFn, *,
             reference: Callable[..., Any] | None = None, prune: Prune | None = None, name: str | None = None,
             rtol: float | None = None, atol: float | None = None) -> Callable[[Callable[..., Any]], Autotuner]:
    """Decorate a launcher whose keyword arguments are the tunable parameters; see the module docstring.

    `key`: argument names whose values (arrays: shape, dtype, strides) select a tuning, or a callable
    taking the call's arguments. `reference`: a function with the launcher's signature (without the
    configuration) whose results every configuration must match. `prune(configs, args, kwargs)`
    returns the configurations worth timing for this call.
    """

    def wrap(fn: Callable[..., Any]) -> Autotuner:
        return Autotuner(fn, configs, key, reference=reference, prune=prune, name=name, rtol=rtol, atol=atol)

    return wrap
