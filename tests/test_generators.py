"""`generators=` is honoured: an input that is only valid with its generator (indices into a table).

Random example indices (integers in [-8, 8]) are out of range for a table of 4 rows: a choice that
checks its indices fails on them, so a selection only succeeds when the generator made the input, in
this process (library calls) and in the isolated benchmark worker (compiled choices). The generator
notes each call with the process it ran in.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tuneforge import config
from tuneforge.errors import NoValidChoicesError
from tuneforge.tune.choices import Choice, ExternChoice
from tuneforge.tune.select import select_detailed
from tuneforge.tune.specs import TensorSpec
from tuneforge.tune.template import KernelTemplate

from . import tuning_kernels as k

TABLE, COUNT = 4, 64


def _calls_log() -> Path:
    # The settings travel with every job, so the worker writes beside this process's cache too.
    return Path(config.get("cache_dir")) / "generator-calls.log"


def valid_indices(spec: TensorSpec, rng: np.random.Generator) -> np.ndarray[Any, Any]:
    _calls_log().parent.mkdir(parents=True, exist_ok=True)
    with open(_calls_log(), "a") as log:
        log.write(f"{os.getpid()} {spec.describe()}\n")
    return rng.integers(0, TABLE, size=spec.sizes)


def gather(table: Any, idx: Any, out: Any) -> None:
    if idx.min() < 0 or idx.max() >= table.shape[0]:
        raise IndexError(f"indices {idx.min()}..{idx.max()} outside the table of {table.shape[0]} rows")
    np.take(table, idx, out=out)


def gather_slow(table: Any, idx: Any, out: Any) -> None:
    k.time_sleep(0.002)
    gather(table, idx, out)


def _launch(kernel: Any, args: Sequence[Any], config: Mapping[str, Any]) -> None:
    table, idx, out = args
    kernel(table, idx, out, idx.size, table.shape[0])


# Module level, so the isolated worker can import the template, its launcher and the generator.
GATHER = KernelTemplate("test_generators_gather", r"""
#include <stdint.h>
#include <stdlib.h>
extern "C" void gather_kernel(const double* table, const int64_t* idx, double* out, int64_t n, int64_t rows) {
    for (int64_t i = 0; i < n; ++i) {
        if (idx[i] < 0 || idx[i] >= rows) abort();  // never reads outside the table
        out[i] = table[(idx[i] + {{ SHIFT }}) % rows];
    }
}
""", signature="void gather_kernel(const double* table, const int64_t* idx, double* out, int64_t n, int64_t rows)",
    launcher=_launch)


def inputs() -> list[Any]:
    return [np.arange(TABLE, dtype=np.float64), np.zeros(COUNT, dtype=np.int64)]


def generator_pids() -> list[int]:
    log = _calls_log()
    lines = log.read_text().splitlines() if log.exists() else []
    assert all(line.split(" ", 1)[1] == f"int64[{COUNT}]" for line in lines), lines
    return [int(line.split()[0]) for line in lines]


def test_without_the_generator_the_indices_are_invalid(quick_tuning: Path) -> None:
    with pytest.raises(NoValidChoicesError, match="outside the table"):
        select_detailed("gather", [ExternChoice(gather_slow), ExternChoice(gather)], inputs(), out=np.empty(COUNT))


def test_generator_makes_the_input_in_process(quick_tuning: Path) -> None:
    choices: list[Choice] = [ExternChoice(gather_slow), ExternChoice(gather)]
    selection = select_detailed("gather", choices, inputs(), out=np.empty(COUNT), generators={1: valid_indices})
    assert {r.choice_name: r.status for r in selection.records.values()} == {"gather_slow": "ok", "gather": "ok"}
    assert selection.choice.name == "gather" and selection.report is not None and not selection.report.isolated
    assert set(generator_pids()) == {os.getpid()}


def test_generator_makes_the_input_in_the_isolated_worker(quick_tuning: Path) -> None:
    choices: list[Choice] = [ExternChoice(gather_slow), *GATHER.choices([{"SHIFT": 0}, {"SHIFT": 1}])]
    selection = select_detailed("gather", choices, inputs(), out=np.empty(COUNT), generators={1: valid_indices})
    assert selection.report is not None and selection.report.isolated
    statuses = {r.choice_name: r.status for r in selection.records.values()}
    assert statuses == {"gather_slow": "ok", choices[1].name: "ok", choices[2].name: "wrong_result"}
    pids = generator_pids()
    assert pids and os.getpid() not in pids  # made where the trials ran, not here
    out = np.empty(3)
    selection.choice(np.array([5.0, 6.0, 7.0, 8.0]), np.array([3, 0, 2]), out)
    assert out.tolist() == [8.0, 5.0, 7.0]


def test_a_generator_for_an_argument_that_does_not_exist_is_an_error(quick_tuning: Path) -> None:
    with pytest.raises(ValueError, match=r"generators given for arguments \[2\].*2 inputs"):
        select_detailed("gather", [ExternChoice(gather_slow), ExternChoice(gather)], inputs(), out=np.empty(COUNT),
                        generators={2: valid_indices})
