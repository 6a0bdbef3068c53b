"""How long a search may go on: evaluations (a count or a share of the space), seconds, and patience.

`Budget.parse` reads the command line's form: comma-separated limits, e.g. ``"100"``, ``"15%"``, ``"30s"``,
``"patience=20"`` or ``"15%,60s,patience=25"``. The search stops at whichever limit it reaches first.
"""

from __future__ import annotations

import math

from tuneforge.dataclass_lite import dataclass


@dataclass(frozen=True)
class Budget:
    evaluations: int | None = None  # configurations timed (failed ones count: they cost a build)
    fraction: float | None = None  # ... as a share of the space's valid configurations
    seconds: float | None = None  # wall-clock time of the search
    patience: int | None = None  # evaluations without a new best before giving up

    def __post_init__(self) -> None:
        for name in ("evaluations", "patience"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise ValueError(f"budget: {name} must be a whole number of at least 1, not {value!r}")
        if self.fraction is not None and not 0 < self.fraction <= 1:
            raise ValueError(f"budget: fraction must be in (0, 1], not {self.fraction!r}")
        if self.seconds is not None and not self.seconds > 0:
            raise ValueError(f"budget: seconds must be positive, not {self.seconds!r}")

    @classmethod
    def parse(cls, text: str) -> Budget:
        """``"100"``, ``"15%"``, ``"30s"``, ``"patience=20"``, or several of them separated by commas."""
        fields: dict[str, float | int] = {}
        for part in (p.strip() for p in text.split(",")):
            name: str
            value: float | int
            try:
                if part.startswith("patience="):
                    name, value = "patience", int(part.partition("=")[2])
                elif part.endswith("%"):
                    name, value = "fraction", float(part[:-1]) / 100
                elif part.endswith("s"):
                    name, value = "seconds", float(part[:-1])
                else:
                    name, value = "evaluations", int(part)
            except ValueError:
                raise ValueError(f"budget {text!r}: cannot read {part!r}; write a count (100), a share of the "
                                 "space (15%), seconds (30s) or patience=N, separated by commas") from None
            if name in fields:
                raise ValueError(f"budget {text!r} gives {name} twice")
            fields[name] = value
        return cls(**fields)  # type: ignore[arg-type]

    def limit(self, space_size: int | None) -> int | None:
        """The most evaluations allowed, for a space of `space_size` valid configurations (None: unknown)."""
        limits = [self.evaluations] if self.evaluations is not None else []
        if self.fraction is not None and space_size is not None:
            limits.append(max(1, math.ceil(self.fraction * space_size)))
        return min(limits) if limits else None

    def describe(self) -> str:
        parts = [f"{self.evaluations} evaluations"] if self.evaluations is not None else []
        if self.fraction is not None:
            parts.append(f"{100 * self.fraction:g}% of the space")
        if self.seconds is not None:
            parts.append(f"{self.seconds:g} s")
        if self.patience is not None:
            parts.append(f"patience {self.patience}")
        return ", ".join(parts) or "unlimited"
