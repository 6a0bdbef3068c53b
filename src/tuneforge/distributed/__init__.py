"""Builds and benchmarks on a Ray cluster (the `distributed` extra: ``pip install 'tuneforge[distributed]'``).

    from tuneforge.distributed import ShapeJob, tune_many
    results = tune_many([ShapeJob("gemm", 512, 512, 512), ShapeJob("gemm", 1024, 64, 4096)], address="auto")

Importing this package imports Ray; ``import tuneforge`` never does. See driver.py for the phases, builds.py
for the builds as Ray tasks and bench.py for the measuring actors.
"""

from __future__ import annotations

from tuneforge.distributed.bench import JobResult
from tuneforge.distributed.driver import Phases, tune_many
from tuneforge.kernels.jobs import ShapeJob

__all__ = ["JobResult", "Phases", "ShapeJob", "tune_many"]
