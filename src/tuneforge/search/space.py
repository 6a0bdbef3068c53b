"""Search spaces: named parameters, each an ordered list of values, and the restrictions a configuration obeys.

A configuration is a dict from every parameter's name to one of its values. The order of a parameter's values
is its neighbourhood (coordinate descent and mutation step to the value before or after), so give ranges in
order: `pow2(16, 256)` is [16, 32, 64, 128, 256].

Restrictions are Python expressions over the parameters and named constants (``"BM * BK * 4 <= smem"``,
checked as soon as the parameters they name are fixed, so enumeration never visits the product of the others
below a rejected prefix) or callables ``fn(config) -> bool`` (checked on whole configurations). Enumeration
is lazy: a space of 10^12 points is iterated, sampled and searched without ever being listed.
"""

from __future__ import annotations

import ast
import contextlib
import json
import math
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from tuneforge.dataclass_lite import dataclass
from tuneforge.errors import TuneforgeError

Config = dict[str, Any]
Predicate = Callable[[Mapping[str, Any]], bool]

# Below this many points (the product of the parameters' sizes) the valid configurations are listed once and
# sampled exactly; above it, sampling draws each parameter and rejects what the restrictions refuse.
LIST_LIMIT = 200_000
_REJECTION_TRIES = 10_000  # draws per sampled point before the restrictions are declared (nearly) unsatisfiable
_SCAN = 64  # values a neighbour is looked for along a parameter, each way

_OPERATORS = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div,
              ast.FloorDiv, ast.Mod, ast.Pow, ast.UnaryOp, ast.USub, ast.UAdd, ast.Not, ast.Compare, ast.Eq,
              ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.IfExp, ast.Name, ast.Load,
              ast.Constant, ast.Tuple, ast.List, ast.Call)
_FUNCTIONS: dict[str, Any] = {"min": min, "max": max, "abs": abs}


class SpaceError(TuneforgeError, ValueError):
    """A space that cannot be searched: an empty parameter, a restriction naming an unknown parameter, ..."""


def pow2(low: int, high: int) -> list[int]:
    """The powers of two from `low` to `high`, both included (each must be a power of two)."""
    for bound in (low, high):
        if not isinstance(bound, int) or bound < 1 or bound & (bound - 1):
            raise SpaceError(f"pow2({low}, {high}): the bounds must be powers of two, and {bound!r} is not")
    if low > high:
        raise SpaceError(f"pow2({low}, {high}): the low bound is above the high one")
    return [1 << e for e in range(low.bit_length() - 1, high.bit_length())]


def span(low: int, high: int, step: int = 1) -> list[int]:
    """The integers from `low` to `high`, both included, `step` apart."""
    if step < 1 or low > high:
        raise SpaceError(f"span({low}, {high}, {step}): needs low <= high and a step of at least 1")
    return list(range(low, high + 1, step))


@dataclass(frozen=True)
class Restriction:
    """One rule a configuration obeys: `check(config)`; `names` are the parameters it reads (None: all)."""

    text: str
    check: Predicate
    names: frozenset[str] | None


def _expression(text: str, params: Sequence[str], constants: Mapping[str, Any]) -> Restriction:
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        raise SpaceError(f"restriction {text!r} is not a Python expression: {exc.msg}") from None
    names: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, _OPERATORS):
            raise SpaceError(f"restriction {text!r} uses {type(node).__name__}: only arithmetic, comparisons, "
                             f"and/or/not, if-else and {', '.join(_FUNCTIONS)}() are allowed")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in _FUNCTIONS
                                               and not node.keywords):
            raise SpaceError(f"restriction {text!r} calls something other than {', '.join(_FUNCTIONS)}()")
        if isinstance(node, ast.Name) and node.id not in _FUNCTIONS:
            if node.id not in params and node.id not in constants:
                raise SpaceError(f"restriction {text!r} names {node.id!r}, which is neither a parameter "
                                 f"({', '.join(params)}) nor a constant: pass constants={{{node.id!r}: ...}}")
            if node.id in params:
                names.add(node.id)
    code = compile(tree, f"<restriction {text}>", "eval")
    fixed = {"__builtins__": {}, **_FUNCTIONS, **constants}

    def check(config: Mapping[str, Any]) -> bool:
        return bool(eval(code, fixed, dict(config)))  # the tree was checked above: no attributes, no calls

    return Restriction(text, check, frozenset(names))


def shared(configs: Sequence[Mapping[str, Any]]) -> Config:
    """The parameters all of `configs` set to the same value: what a group of configurations (those compiled into
    one build, say) has in common, as a point of a coarser space."""
    first = configs[0]
    return {name: value for name, value in first.items() if all(c.get(name, _MISSING) == value for c in configs[1:])}


def point_of(params: Mapping[str, Any]) -> Config:
    """A choice's or record's parameters as a point for `Space.from_points`: names that can be parameters (Python
    identifiers), and values that can be keys (a list or dict value stands as its JSON text)."""
    def hashable(value: Any) -> Any:
        try:
            hash(value)
            return value
        except TypeError:
            return json.dumps(value, sort_keys=True, default=str)

    return {name: hashable(value) for name, value in params.items() if name.isidentifier()}


def aligned(points: Sequence[Mapping[str, Any]], tag: str = "_group") -> list[Config]:
    """`points` with every parameter name any of them has (None where one lacks it), told apart by a `tag`
    parameter (their position) when two would otherwise be the same point: ready for `Space.from_points`."""
    names = list(dict.fromkeys(name for p in points for name in p))
    out = [{name: p.get(name) for name in names} for p in points]
    if not names or len({tuple(map(repr, p.values())) for p in out}) < len(out):
        out = [{**p, tag: i} for i, p in enumerate(out)]
    return out


_MISSING = object()


class Space:
    """Named parameters with ordered values, and restrictions (module docstring)."""

    def __init__(self, params: Mapping[str, Sequence[Any]],
                 restrictions: Sequence[str | Predicate] = (), *, constants: Mapping[str, Any] | None = None) -> None:
        if not params:
            raise SpaceError("a space needs at least one parameter")
        self.names: tuple[str, ...] = tuple(params)
        self.values: dict[str, tuple[Any, ...]] = {}
        for name, values in params.items():
            if not isinstance(name, str) or not name.isidentifier():
                raise SpaceError(f"parameter name {name!r} must be a Python identifier (restrictions name it)")
            if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
                raise SpaceError(f"parameter {name!r}: give its values as a list, not {type(values).__name__}")
            vals = tuple(values)
            if not vals:
                raise SpaceError(f"parameter {name!r} has no values")
            try:
                distinct = len(set(vals))
            except TypeError:
                raise SpaceError(f"parameter {name!r}: values must be hashable (numbers, strings, ...)") from None
            if distinct != len(vals):
                raise SpaceError(f"parameter {name!r} lists a value twice: {list(vals)}")
            self.values[name] = vals
        self.constants = dict(constants or {})
        clash = sorted(set(self.constants) & set(self.names))
        if clash:
            raise SpaceError(f"{clash} are both parameters and constants")
        self._index = {name: {v: i for i, v in enumerate(vals)} for name, vals in self.values.items()}
        self.restrictions: list[Restriction] = []
        for rule in restrictions:
            if isinstance(rule, str):
                self.restrictions.append(_expression(rule, self.names, self.constants))
            elif callable(rule):
                self.restrictions.append(Restriction(getattr(rule, "__name__", repr(rule)), rule, None))
            else:
                raise SpaceError(f"a restriction is an expression string or a callable, not {rule!r}")
        # at depth d (parameters 0..d fixed) the restrictions whose last named parameter is d are checked
        position = {name: i for i, name in enumerate(self.names)}
        self._at_depth: list[list[Restriction]] = [[] for _ in self.names]
        for r in self.restrictions:
            depth = len(self.names) - 1 if r.names is None or not r.names else max(position[n] for n in r.names)
            self._at_depth[depth].append(r)
        self._listed: list[Config] | None = None
        self._exact = False  # the listing is a set of recorded points (from_points), not the restricted product
        self._positions: Any = None  # the members' positions, a numpy array (from_points spaces, on first use)
        self._listed_keys: list[tuple[Any, ...]] | None = None  # the listing's keys (on first use)
        self._position_of: dict[tuple[Any, ...], tuple[int, ...]] = {}  # positions(), remembered

    @classmethod
    def from_points(cls, points: Sequence[Mapping[str, Any]]) -> Space:
        """The space of exactly these configurations (a recorded run's, for replay): each parameter's values are
        those seen, sorted; the one restriction is membership."""
        if not points:
            raise SpaceError("no points to make a space of")
        names = list(dict.fromkeys(name for p in points for name in p))
        missing = next(((i, n) for i, p in enumerate(points) for n in names if n not in p), None)
        if missing is not None:
            raise SpaceError(f"point {missing[0]} has no value for parameter {missing[1]!r}: every point must set "
                             "the same parameters")
        values = {}
        for name in names:
            seen = list(dict.fromkeys(p[name] for p in points))
            with contextlib.suppress(TypeError):  # mixed types: keep first-seen order
                seen.sort(key=lambda v: (v is not None, v))  # None (a parameter some points lack) first
            values[name] = seen
        members = {tuple(p[n] for n in names) for p in points}

        def recorded(config: Mapping[str, Any]) -> bool:
            return tuple(config[n] for n in names) in members

        space = cls(values, [recorded])
        # the points are the listing, whatever the product of the values seen (a recorded GEMM space: 10^6)
        space._listed = sorted(({n: p[n] for n in names} for p in {space.key(p): p for p in points}.values()),
                               key=space.position)
        space._exact = True
        return space

    # ------------------------------------------------------------------------------------------- size

    @property
    def size_bound(self) -> int:
        """The product of the parameters' sizes: what enumeration would visit without restrictions."""
        return math.prod(len(v) for v in self.values.values())

    def listed(self) -> list[Config] | None:
        """Every valid configuration, in order, when the space is small enough to list (LIST_LIMIT); else None."""
        if self._listed is None and self.size_bound <= LIST_LIMIT:
            self._listed = list(self)
        return self._listed

    def listed_keys(self) -> list[tuple[Any, ...]] | None:
        """The keys of `listed()`, in its order (kept: a search looks through them once per evaluation, and keying a
        thousand-point listing each time made replaying a search to its end take minutes)."""
        listed = self.listed()
        if listed is None:
            return None
        if self._listed_keys is None or len(self._listed_keys) != len(listed):
            self._listed_keys = [self.key(c) for c in listed]
        return self._listed_keys

    def untried(self, exclude: set[tuple[Any, ...]] | Mapping[tuple[Any, ...], Any]) -> list[Config] | None:
        """The listed configurations whose keys are not in `exclude` (the listing's own dicts, in its order); None
        when the space is too large to list."""
        listed, keys = self.listed(), self.listed_keys()
        if listed is None or keys is None:
            return None
        return [c for c, k in zip(listed, keys, strict=True) if k not in exclude]

    def count(self) -> int:
        """How many valid configurations there are (enumerates them: mind a huge space)."""
        listed = self.listed()
        return len(listed) if listed is not None else sum(1 for _ in self)

    # ------------------------------------------------------------------------------------------- membership

    def key(self, config: Mapping[str, Any]) -> tuple[Any, ...]:
        """A hashable identity of a configuration: its values in parameter order."""
        return tuple(config[name] for name in self.names)

    def config(self, key: Sequence[Any]) -> Config:
        """The configuration whose `key` this is."""
        return dict(zip(self.names, key, strict=True))

    def problem(self, config: Mapping[str, Any]) -> str | None:
        """Why `config` is not in the space (None: it is)."""
        missing = [n for n in self.names if n not in config]
        if missing:
            return f"no value for {', '.join(missing)}"
        extra = sorted(set(config) - set(self.names))
        if extra:
            return f"{', '.join(map(str, extra))} {'is not a parameter' if len(extra) == 1 else 'are not parameters'}"
        for name in self.names:
            if config[name] not in self._index[name]:
                return f"{name}={config[name]!r} is not one of {list(self.values[name])}"
        for r in self.restrictions:
            if not self._holds(r, config):
                return f"restriction {r.text!r} does not hold"
        return None

    def __contains__(self, config: object) -> bool:
        return isinstance(config, Mapping) and self.problem(config) is None

    def _holds(self, restriction: Restriction, config: Mapping[str, Any]) -> bool:
        try:
            return restriction.check(config)
        except ZeroDivisionError:
            return False
        except Exception as exc:
            raise SpaceError(f"restriction {restriction.text!r} failed on {dict(config)}: "
                             f"{type(exc).__name__}: {exc}") from None

    def position(self, config: Mapping[str, Any]) -> tuple[int, ...]:
        """Each parameter's value as its index in the parameter's list (an ordinal encoding for models)."""
        return tuple(self._index[name][config[name]] for name in self.names)

    def positions(self, keys: Iterable[tuple[Any, ...]]) -> Any:
        """The `position` of each key's configuration, as rows of an integer numpy array (remembered per key:
        models re-encode everything timed so far at every step)."""
        import numpy as np

        known, index = self._position_of, [self._index[name] for name in self.names]
        rows = []
        for key in keys:
            row = known.get(key)
            if row is None:
                row = known[key] = tuple(ix[v] for ix, v in zip(index, key, strict=True))
            rows.append(row)
        return np.array(rows, dtype=np.intp).reshape(len(rows), len(self.names))

    # ------------------------------------------------------------------------------------------- walking

    def __iter__(self) -> Iterator[Config]:
        """Every valid configuration, in order (the first parameter varies slowest), lazily."""
        if self._exact and self._listed is not None:
            return iter([dict(c) for c in self._listed])
        names, values, at_depth = self.names, self.values, self._at_depth
        config: Config = {}
        last = len(names) - 1

        def walk(depth: int) -> Iterator[Config]:
            name = names[depth]
            for value in values[name]:
                config[name] = value
                if all(self._holds(r, config) for r in at_depth[depth]):
                    if depth == last:
                        yield dict(config)
                    else:
                        yield from walk(depth + 1)
            del config[name]

        return walk(0)

    def sample(self, rng: random.Random, count: int = 1, exclude: set[tuple[Any, ...]] | None = None) -> list[Config]:
        """Up to `count` distinct valid configurations drawn uniformly, none of whose keys is in `exclude`."""
        exclude = exclude or set()
        fresh = self.untried(exclude)
        if fresh is not None:
            return [dict(c) for c in rng.sample(fresh, min(count, len(fresh)))]
        found: dict[tuple[Any, ...], Config] = {}
        tries = 0
        while len(found) < count:
            tries += 1
            if tries > _REJECTION_TRIES * count:
                if not found:
                    raise SpaceError(f"no configuration satisfied the restrictions in {tries - 1} random draws: "
                                     f"they reject (nearly) the whole space of {self.size_bound} points")
                break
            config = {name: rng.choice(vals) for name, vals in self.values.items()}
            k = self.key(config)
            if k not in exclude and k not in found and all(self._holds(r, config) for r in self.restrictions):
                found[k] = config
        return list(found.values())

    def neighbours(self, config: Mapping[str, Any], radius: int = 1) -> list[Config]:
        """For each parameter and direction, the `radius` nearest valid configurations that differ from `config`
        in that parameter: the same configuration with the parameter's next values that the restrictions allow
        (up to _SCAN values away). In a space of recorded points, where parameters move together (a block size
        that is a multiple of a tile size), the recorded point with the parameter's next value that differs from
        `config` in the fewest other parameters."""
        if self._exact:
            return self._nearest_members(config, radius)
        found = []
        for name in self.names:
            i, values = self._index[name][config[name]], self.values[name]
            for direction in (-1, 1):
                taken, j = 0, i + direction
                while taken < radius and 0 <= j < len(values) and abs(j - i) <= _SCAN:
                    other = {**config, name: values[j]}
                    if all(self._holds(r, other) for r in self.restrictions):
                        found.append(other)
                        taken += 1
                    j += direction
        return found

    def _nearest_members(self, config: Mapping[str, Any], radius: int) -> list[Config]:
        import numpy as np

        assert self._listed is not None
        if self._positions is None:
            self._positions = self.positions(self.listed_keys() or ()).astype(np.int64)
        members = self._positions
        here = np.array(self.position(config), dtype=np.int64)
        differ = members != here
        changed, steps = differ.sum(axis=1), np.abs(members - here).sum(axis=1)
        found: list[int] = []
        for p in range(len(self.names)):
            # fewest other parameters changed, then fewest steps in all
            score = (changed - differ[:, p]) * (int(steps.max()) + 1) + steps
            column = members[:, p]
            for direction in (-1, 1):
                ahead = np.unique(column[(column - here[p]) * direction > 0])
                for v in (ahead if direction > 0 else ahead[::-1])[:radius]:
                    rows = np.flatnonzero(column == v)
                    best = int(rows[np.argmin(score[rows])])
                    if best not in found:  # moving one parameter or another can land on the same member
                        found.append(best)
        return [dict(self._listed[i]) for i in found]

    def describe(self) -> str:
        parts = [f"{name}[{len(vals)}]" for name, vals in self.values.items()]
        rules = f", {len(self.restrictions)} restriction(s)" if self.restrictions else ""
        return f"{' x '.join(parts)} = {self.size_bound} points{rules}"
