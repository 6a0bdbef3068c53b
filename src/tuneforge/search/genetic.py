"""A genetic search: generations of configurations bred from the fastest found so far.

Each generation (`population` configurations, a batch that builds and times in parallel) is bred from the
`population` fastest configurations told so far: two parents picked by tournament (the faster of two drawn at
random), each parameter taken from one or the other (uniform crossover), then each parameter mutated with
probability `mutation` (one or two steps along its values, or now and then any value). A child that breaks a
restriction or was tried already is bred again; when breeding finds nothing new, random configurations fill
the generation. The first generation is random.
"""

from __future__ import annotations

from typing import Any

from tuneforge.search.space import Config, Space
from tuneforge.search.strategy import FAILED, Strategy

_BREED_TRIES = 20  # attempts per child before a random configuration takes its place


class Genetic(Strategy):
    name = "genetic"

    def __init__(self, space: Space, seed: int = 0, *, population: int = 12, mutation: float | None = None) -> None:
        super().__init__(space, seed)
        if population < 2:
            raise ValueError("genetic needs a population of at least 2")
        if mutation is not None and not 0 <= mutation <= 1:
            raise ValueError("genetic: mutation is a probability, between 0 and 1")
        self.population = population
        self.mutation = 1 / len(space.names) if mutation is None else mutation
        self._generation: list[Config] = []
        self.generations = 0

    def _propose(self, n: int) -> list[Config]:
        if not self._generation:
            if self.pending:
                return []  # the generation's last costs decide the parents of the next
            self._generation = self._breed()
            self.generations += 1
        taken, self._generation = self._generation[:n], self._generation[n:]
        return taken

    def _breed(self) -> list[Config]:
        told = [(cost, key) for key, cost in self.costs.items() if cost < FAILED]
        told.sort()
        parents = [self.space.config(key) for _, key in told[:self.population]]
        children: dict[tuple[Any, ...], Config] = {}
        if len(parents) >= 2:
            exclude = self.exclude()
            for _ in range(self.population):
                for _ in range(_BREED_TRIES):
                    child = self._mutate(self._cross(self._tournament(parents), self._tournament(parents)))
                    key = self.space.key(child)
                    if key not in exclude and key not in children and child in self.space:
                        children[key] = child
                        break
        missing = self.population - len(children)
        if missing > 0:
            exclude = self.exclude() | set(children)
            children.update((self.space.key(c), c) for c in self.space.sample(self.rng, missing, exclude))
        return list(children.values())

    def _tournament(self, parents: list[Config]) -> Config:
        # parents are sorted fastest first: the smaller of two random positions is the faster
        return parents[min(self.rng.randrange(len(parents)), self.rng.randrange(len(parents)))]

    def _cross(self, a: Config, b: Config) -> Config:
        return {name: (a if self.rng.random() < 0.5 else b)[name] for name in self.space.names}

    def _mutate(self, config: Config) -> Config:
        for name in self.space.names:
            if self.rng.random() >= self.mutation:
                continue
            values = self.space.values[name]
            if self.rng.random() < 0.2:
                config[name] = self.rng.choice(values)
            else:
                i = values.index(config[name]) + self.rng.choice((-2, -1, 1, 2))
                config[name] = values[min(max(i, 0), len(values) - 1)]
        return config
