"""A reference that fails must never let an unverified choice win (issue 11, item 4).

Without a working reference nothing can be checked, and a kernel that does nothing is the fastest of
all: it must neither win nor be recorded as ``ok``, and no record written then may stop a later
selection (with a working reference) from verifying every choice. The reference raises in this
process, raises in the isolated worker, or does not build.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tuneforge import config
from tuneforge.errors import NoValidChoicesError
from tuneforge.store.default import default_records
from tuneforge.tune.choices import Choice, ExternChoice
from tuneforge.tune.select import clear_memo, select_detailed, selection_key
from tuneforge.tune.specs import TensorSpec
from tuneforge.tune.template import KernelTemplate

from . import tuning_kernels as k

N = 64


def noop(a: Any, b: Any, out: Any) -> None:
    """Leaves the output untouched: the fastest choice there is, and a wrong one."""


def broken_reference(a: Any, b: Any, out: Any) -> None:
    raise RuntimeError("reference exploded")


def _launch(kernel: Any, args: Sequence[Any], config: Mapping[str, Any]) -> None:
    a, b, out = args
    kernel(a, b, out, a.size)


# Module level, so the isolated worker can import the template, the launcher and the references.
TEMPLATE = KernelTemplate("test_reference_failure", r"""
#include <stdint.h>
extern "C" void add_kernel(const double* a, const double* b, double* out, int64_t n) {
    {{ BODY }}
}
""", signature="void add_kernel(const double* a, const double* b, double* out, int64_t n)", launcher=_launch)
NOOP_BODY = "(void)a; (void)b; (void)out; (void)n;"
GOOD_BODY = "for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];"


def inputs() -> list[np.ndarray]:
    return [np.ones(N), np.ones(N)]


def key() -> str:
    spec = TensorSpec.contiguous([N], "float64")
    return selection_key("add", [spec, spec, spec])


def ok_records() -> dict[str, str]:
    return {r.choice_name: r.status for r in default_records().get(key()) if r.status == "ok"}


def assert_verified_later(choices: list[Choice], noop_name: str, good_name: str, *, isolated: bool = False) -> None:
    """With a working reference, the no-op is measured (no record of the failed run was reused) and loses."""
    clear_memo()
    selection = select_detailed("add", choices, inputs(), out=np.empty(N), reference=ExternChoice(k.add))
    assert selection.choice.name == good_name and selection.source == "tuned"
    statuses = {r.choice_name: r.status for r in default_records().get(key())}
    assert statuses[noop_name] == "wrong_result", statuses
    assert statuses[good_name] == "ok"
    assert selection.report is not None and selection.report.isolated == isolated


def test_reference_raising_in_process_fails_the_selection(quick_tuning: Path) -> None:
    choices: list[Choice] = [ExternChoice(noop), ExternChoice(k.add_slow)]
    with pytest.raises(NoValidChoicesError) as info:
        select_detailed("add", choices, inputs(), out=np.empty(N), reference=ExternChoice(broken_reference))
    text = str(info.value)
    assert "reference broken_reference" in text and "reference exploded" in text
    assert ok_records() == {}
    assert_verified_later(choices, "noop", "add_slow")


def test_reference_raising_in_the_isolated_worker_fails_the_selection(quick_tuning: Path) -> None:
    choices: list[Choice] = list(TEMPLATE.choices([{"BODY": NOOP_BODY}, {"BODY": GOOD_BODY}]))
    assert all(c.is_native for c in choices) and config.get("autotune.isolate")
    with pytest.raises(NoValidChoicesError) as info:
        select_detailed("add", choices, inputs(), out=np.empty(N), reference=ExternChoice(broken_reference))
    assert "reference broken_reference" in str(info.value) and "reference exploded" in str(info.value)
    assert ok_records() == {}
    assert_verified_later(choices, choices[0].name, choices[1].name, isolated=True)


def test_reference_that_does_not_build_fails_the_selection(quick_tuning: Path) -> None:
    broken = KernelTemplate("test_reference_failure_broken", "this is not C++; {{ X }}",
                            signature="void add_kernel(const double* a, const double* b, double* out, int64_t n)",
                            launcher=_launch).choices([{"X": 1}])[0]
    choices: list[Choice] = [ExternChoice(noop), ExternChoice(k.add_slow)]
    with pytest.raises(NoValidChoicesError) as info:
        select_detailed("add", choices, inputs(), out=np.empty(N), reference=broken)
    assert f"{broken.name}: compile_error" in str(info.value)
    assert ok_records() == {}
    assert_verified_later(choices, "noop", "add_slow")


def test_reference_raising_while_inferring_the_output_layout_names_it(quick_tuning: Path) -> None:
    with pytest.raises(NoValidChoicesError, match="reference broken_reference failed with out=None") as info:
        select_detailed("add", [ExternChoice(noop), ExternChoice(k.add_slow)], inputs(),
                        reference=ExternChoice(broken_reference))
    assert "reference exploded" in str(info.value)
