"""A template over a search space, as one candidate of a selection: its choices are made when a search asks.

`KernelTemplate.choices(configs)` makes every configuration's choice up front (~40 us each: 4 s for 10^5). A
`TemplateSpace` (``template.space(space)``) stands for all of them in `select(..., strategy=)` and makes a choice
only for what the strategy asks and for what the selection's records already hold, so a space of 10^8 points
costs what the search times. Without a strategy its listed configurations are all timed (a space too large to
list is refused). A selection holds at most one, beside library calls only: the search walks its space.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from tuneforge.store.record import Record
from tuneforge.tune.choices import Choice, dedupe

if TYPE_CHECKING:
    from tuneforge.search.space import Space  # loaded with a TemplateSpace: a select() without one needs none


class Template(Protocol):
    """What a TemplateSpace needs of a KernelTemplate (named so, not imported: the template module makes these)."""

    name: str
    identity: str

    def choices(self, configs: Iterable[Mapping[str, Any]]) -> list[Any]: ...


class TemplateSpace:
    """`template`'s configurations in `space` (a tuneforge.Space)."""

    def __init__(self, template: Template, space: Space) -> None:
        from tuneforge.search.space import Space

        if not isinstance(space, Space):
            raise TypeError(f"template {template.name!r}: space() takes a tuneforge.Space, not "
                            f"{type(space).__name__}")
        self.template, self.space = template, space
        self._made: dict[tuple[Any, ...], Choice] = {}
        # What a finished search of it is known by: the template's code, the values, the rules (an expression's
        # text; a callable by its name: code, like a prune hook) and the constants.
        self.identity = "tsp" + hashlib.sha256(json.dumps([
            template.identity, {name: [repr(v) for v in values] for name, values in space.values.items()},
            [r.text for r in space.restrictions], sorted((k, repr(v)) for k, v in space.constants.items()),
        ]).encode()).hexdigest()[:40]

    @property
    def name(self) -> str:
        return self.template.name

    @property
    def made(self) -> int:
        """How many choices of it exist in this process."""
        return len(self._made)

    def choice(self, config: Mapping[str, Any]) -> Choice:
        """The choice of one configuration of the space (made once)."""
        key = self.space.key(config)
        made = self._made.get(key)
        if made is None:
            made, = self.template.choices([config])
            made.name = f"{self.template.name}_{len(self._made)}"  # its hash is the template's and the values
            self._made[key] = made
        return made

    def any_point(self) -> dict[str, Any]:
        """One configuration of the space (to infer an output from, where no library call is among the choices)."""
        point = self.space.sample(random.Random(0), 1)
        if not point:
            raise ValueError(f"the space of template {self.name!r} has no valid configuration: "
                             f"{self.space.describe()}")
        return point[0]

    def listed(self) -> list[Choice] | None:
        """Every configuration's choice, where the space is small enough to list; else None."""
        configs = self.space.listed()
        return None if configs is None else [self.choice(c) for c in configs]

    def recorded(self, records: Iterable[Record]) -> list[Choice]:
        """The choices these records are of: their parameters in the space, and the hash this template gives them
        (a record of another template's, or of other values, is not one)."""
        found = []
        for record in records:
            params = record.params
            try:
                if not params or set(params) != set(self.space.names) or params not in self.space:
                    continue
            except TypeError:  # a value no parameter can have (a list, from JSON)
                continue
            choice = self.choice(params)
            if choice.hash_key == record.choice:
                found.append(choice)
        return found

    def __repr__(self) -> str:
        return f"<TemplateSpace {self.template.name}: {self.space.describe()}>"


def split_choices(name: str, choices: Sequence[Choice | TemplateSpace],
                  searching: bool) -> tuple[list[Choice], TemplateSpace | None]:
    """A selection's candidates, and the template space among them that its search walks. Without a search the
    space's listed configurations are candidates like any other."""
    spaces = [c for c in choices if isinstance(c, TemplateSpace)]
    rest = dedupe([c for c in choices if not isinstance(c, TemplateSpace)])
    if not spaces:
        return rest, None
    if len(spaces) > 1:
        raise ValueError(f"select({name!r}): one template space per selection ({len(spaces)} given); list the "
                         "configurations of the others as choices, or search them in selections of their own")
    space = spaces[0]
    if not searching:
        listed = space.listed()
        if listed is None:
            raise ValueError(f"select({name!r}): the space of template {space.name!r} ({space.space.describe()}) "
                             "is too large to time every configuration: pass strategy= (and budget=) to search it")
        return dedupe([*rest, *listed]), None
    configured = [c for c in rest if not c.is_extern]
    if configured:
        raise ValueError(f"select({name!r}): a template space is searched beside library calls only, and "
                         f"{configured[0].name!r} is not one: make it part of the space, or pass it in a selection "
                         "of its own")
    return rest, space
