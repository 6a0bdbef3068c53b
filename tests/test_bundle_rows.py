"""Bundle rows are validated for what later uses of them need, when the bundle is read.

``info.args`` is what nearest-shape lookups compare: a row whose args has another shape passed
loading and then broke every selection of its op. A shipped bundle now leaves such a row out (one
warning naming the file and row, counted); ``records import`` refuses the file and names the row.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tuneforge import config
from tuneforge.store.default import default_records
from tuneforge.store.record import BUNDLE_FORMAT, BUNDLE_VERSION, Record, RecordError, args_problem, check_bundle
from tuneforge.store.shipped import BundleSet
from tuneforge.tune.choices import ExternChoice
from tuneforge.tune.select import clear_memo, select_detailed

OP = "bundle_rows_add"
GOOD_ARGS = [["float64", [64]], ["float64", [64]], ["float64", [64]]]
BAD_ARGS: list[Any] = [
    5,
    "float64[64]",
    {"0": ["float64", [64]]},
    [None, None, None],
    [["float64"], ["float64", [64]], ["float64", [64]]],
    [["float64", [64], "extra"], ["float64", [64]], ["float64", [64]]],
    [[7, [64]], ["float64", [64]], ["float64", [64]]],
    [["", [64]], ["float64", [64]], ["float64", [64]]],
    [["float64", 64], ["float64", [64]], ["float64", [64]]],
    [["float64", ["64"]], ["float64", [64]], ["float64", [64]]],
    [["float64", [None]], ["float64", [64]], ["float64", [64]]],
    [["float64", [64.5]], ["float64", [64]], ["float64", [64]]],
    [["float64", [True]], ["float64", [64]], ["float64", [64]]],
    [["float64", [-1]], ["float64", [64]], ["float64", [64]]],
]


def fast() -> ExternChoice:
    return ExternChoice(np.add, name="fast")


def slow() -> ExternChoice:
    return ExternChoice(np.add, name="slow")


def row(key: str, choice: ExternChoice, median_ms: float, args: Any) -> dict[str, Any]:
    return Record(key=key, choice=choice.hash_key, op=OP, choice_name=choice.name, status="ok", median_ms=median_ms,
                  count=3, system="elsewhere", info={"family": choice.family, "args": args},
                  created=time.time()).to_json()


def bundle_with(bad_args: Any) -> dict[str, Any]:
    """Two good rows for one shape (row 0, 2), and one row of another shape whose args are `bad_args` (row 1)."""
    return {"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "exported": time.time(),
            "records": [row("selgood0000", fast(), 0.01, GOOD_ARGS), row("selbad00000", fast(), 0.01, bad_args),
                        row("selgood0000", slow(), 0.02, GOOD_ARGS)]}


def write(path: Path, bundle: dict[str, Any]) -> Path:
    path.write_text(json.dumps(bundle))  # not write_bundle: it would refuse the bad row
    return path


def test_args_as_select_writes_them_are_fine() -> None:
    assert args_problem(GOOD_ARGS) is None
    assert args_problem([["scalar:float", []], ["float32", [3, 0, 5]]]) is None
    assert args_problem([]) is None


@pytest.mark.parametrize("bad_args", BAD_ARGS, ids=range(len(BAD_ARGS)))
def test_bad_args_are_refused_by_check_bundle(bad_args: Any) -> None:
    with pytest.raises(RecordError, match=r"shipped\.json: record 1: record field 'info\.args'"):
        check_bundle(bundle_with(bad_args), "shipped.json")


@pytest.mark.parametrize("bad_args", BAD_ARGS, ids=range(len(BAD_ARGS)))
def test_shipped_bundle_skips_the_bad_row_and_nearest_works(tmp_path: Path, bad_args: Any,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    path = write(tmp_path / "shipped.json", bundle_with(bad_args))
    shipped = BundleSet()
    with caplog.at_level(logging.WARNING, logger="tuneforge.store"):
        assert shipped.add(path) == 2
    assert shipped.skipped == {str(path.resolve()): 1}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(path.resolve()) in warnings[0] and "record 1" in warnings[0]
    assert shipped.get("selbad00000") == []
    found = shipped.nearest(OP, [["float64", [80]]] * 3, "here")
    assert found is not None and found.key == "selgood0000" and len(found.records) == 2


def test_a_bundle_that_is_not_a_bundle_is_still_an_error(tmp_path: Path) -> None:
    path = tmp_path / "wrong.json"
    path.write_text(json.dumps({"format": "something-else", "records": []}))
    with pytest.raises(RecordError, match="wrong.json is not a tuneforge records bundle"):
        BundleSet().add(path)


def test_records_import_refuses_the_file_and_names_the_row(cache_dir: Path, tmp_path: Path) -> None:
    path = write(tmp_path / "import.json", bundle_with(BAD_ARGS[-5]))
    with pytest.raises(RecordError, match=r"import\.json: record 1: record field 'info\.args': argument 0"):
        default_records().import_bundle(path)
    assert default_records().count() == 0  # all or nothing: nothing was written


@pytest.fixture
def fresh(cache_dir: Path) -> Iterator[Path]:
    clear_memo()
    yield cache_dir
    clear_memo()


def test_selection_answered_from_a_bundle_with_a_bad_row(fresh: Path, tmp_path: Path) -> None:
    path = write(tmp_path / "select.json", bundle_with(BAD_ARGS[-5]))  # sizes ["64"]: loads, then broke nearest
    a, b, out = np.ones(80), np.full(80, 2.0), np.empty(80)
    with config.patch(bundles=(path,), autotune_cache_only=True):
        selection = select_detailed(OP, [slow(), fast()], [a, b], out=out)
    assert selection.source == "bundle-nearest" and selection.choice.name == "fast"
    selection.choice(a, b, out)
    assert (out == 3.0).all()
