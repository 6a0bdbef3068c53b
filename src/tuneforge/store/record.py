"""Tuning records as data: the `Record` type, its JSON form, and versioned bundle files.

A bundle is ``{"format": "tuneforge-records", "version": 1, "exported": <unix time>, "records": [...]}``
with one `Record.to_json()` per row; a package ships one and loads it with `RecordDB.import_bundle`.
Rows are checked for everything a later use of them relies on, not only their types: ``info.args``
(what nearest-shape lookups compare) must be a list of ``[dtype, sizes]`` pairs, so a bad row is
refused when the bundle is read, never when a selection happens to reach it.
Everything here is re-exported by `tuneforge.store.records`, which holds the database itself.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import gzip
import json
import math
import numbers
import os
from collections.abc import Callable
from dataclasses import field
from pathlib import Path
from typing import Any, Literal, get_args

from tuneforge.dataclass_lite import dataclass
from tuneforge.errors import TuneforgeError

__all__ = ["BUNDLE_FORMAT", "BUNDLE_VERSION", "STATUSES", "Record", "RecordError", "Status", "args_problem",
           "check_bundle", "read_bundle", "read_records", "write_bundle"]

# How a measurement ended; the Literal is the one list, so the type checker and the runtime check agree.
Status = Literal["ok", "compile_error", "runtime_error", "timeout", "crash", "wrong_result"]
STATUSES: tuple[Status, ...] = get_args(Status)
BUNDLE_FORMAT = "tuneforge-records"
BUNDLE_VERSION = 1

# statistic name -> column; the only text the database ever places into SQL, and only after this lookup
STAT_COLUMNS = {"median": "median_ms", "min": "min_ms", "mean": "mean_ms"}
_TIMINGS = ("median_ms", "min_ms", "mean_ms", "p20_ms", "p80_ms")
_TEXTS = ("key", "choice", "op", "choice_name", "status", "method", "error", "inputs", "system")
_REQUIRED = ("key", "choice", "op", "choice_name", "status")
_NON_EMPTY = ("key", "choice", "op")


class RecordError(TuneforgeError):
    """A bad record or bundle, a database that cannot be used (locked, newer schema, read-only), ..."""


def check_statistic(statistic: str) -> str:
    column = STAT_COLUMNS.get(statistic) if isinstance(statistic, str) else None
    if column is None:
        raise RecordError(f"unknown statistic {statistic!r} (expected one of {', '.join(STAT_COLUMNS)})")
    return column


def json_text(value: Any, what: str) -> str:
    try:
        return json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise RecordError(f"record field {what!r} must be JSON-serialisable: {exc}") from None


@dataclass(frozen=True)
class Record:
    """The measurement of one choice for one selection key. Fields are validated on construction."""

    key: str
    choice: str
    op: str
    choice_name: str
    status: Status
    median_ms: float | None = None
    min_ms: float | None = None
    mean_ms: float | None = None
    p20_ms: float | None = None
    p80_ms: float | None = None
    count: int = 0
    method: str = ""
    error: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    inputs: str = ""
    system: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    created: float = 0.0

    def __post_init__(self) -> None:
        def bad(name: str, expected: str) -> RecordError:
            return RecordError(f"record field {name!r}: expected {expected}, got {getattr(self, name)!r}")

        for name in _TEXTS:
            if not isinstance(getattr(self, name), str):
                raise bad(name, "a string")
        for name in _NON_EMPTY:
            if not getattr(self, name):
                raise bad(name, "a non-empty string")
        if self.status not in STATUSES:
            raise RecordError(f"record field 'status': unknown status {self.status!r} "
                              f"(expected one of {', '.join(STATUSES)})")
        for name in (*_TIMINGS, "created"):
            value = getattr(self, name)
            if value is None and name != "created":
                continue
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
                    or value < 0:  # numbers.Real: numpy scalars are welcome too
                raise bad(name, "a finite number >= 0" + ("" if name == "created" else " or None"))
            object.__setattr__(self, name, float(value))
        count: Any = self.count
        if isinstance(count, bool) or not isinstance(count, numbers.Integral) or count < 0:
            raise bad("count", "an integer >= 0")
        object.__setattr__(self, "count", int(count))
        for name in ("params", "info"):
            value = getattr(self, name)
            if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
                raise bad(name, "a dict with string keys")
            json_text(value, name)

    def time(self, statistic: str = "median") -> float | None:
        """The ``median``, ``min`` or ``mean`` time in milliseconds (None if not measured)."""
        value: float | None = getattr(self, check_statistic(statistic))
        return value

    def scaled(self, factor: float, **info: Any) -> Record:
        """This record with every timing figure times `factor`, and `info` added to its info."""
        figures = {name: value * factor for name in _TIMINGS if (value := getattr(self, name)) is not None}
        return dataclasses.replace(self, **figures, info={**self.info, **info})

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict of every field (params and info are copies)."""
        return {f.name: copy.deepcopy(getattr(self, f.name)) for f in dataclasses.fields(self)}

    @classmethod
    def from_json(cls, d: Any) -> Record:
        """Build a record from :meth:`to_json` output; RecordError names a missing, unknown or bad field."""
        if not isinstance(d, dict):
            raise RecordError(f"a record must be a JSON object, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(str(k) for k in d if k not in known)
        if unknown:
            raise RecordError(f"unknown record field(s) {', '.join(map(repr, unknown))}")
        for name in _REQUIRED:
            if name not in d:
                raise RecordError(f"record field {name!r} is missing")
        return cls(**{k: copy.deepcopy(v) for k, v in d.items()})


def args_problem(args: Any) -> str | None:
    """What is wrong with a record's ``info.args`` (None: fine), as `tune.job.args_signature` writes it:
    one ``[dtype, sizes]`` pair per argument, dtype a string (``"scalar:<type>"`` for a scalar) and sizes
    a list of integers >= 0."""
    if not isinstance(args, list):
        return f"expected a list of [dtype, sizes] pairs, got {type(args).__name__}"
    for i, arg in enumerate(args):
        if not (isinstance(arg, list) and len(arg) == 2):
            return f"argument {i}: expected a [dtype, sizes] pair, got {json.dumps(arg)[:80]}"
        dtype, sizes = arg
        if not isinstance(dtype, str) or not dtype:
            return f"argument {i}: the dtype must be a non-empty string, got {json.dumps(dtype)[:80]}"
        if not isinstance(sizes, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                                  for n in sizes):
            return f"argument {i}: the sizes must be a list of integers >= 0, got {json.dumps(sizes)[:80]}"
    return None


def _check_uses(record: Record) -> None:
    """Fields that pass the type checks but would break a use of the row later (see the module docs)."""
    if "args" in record.info:
        problem = args_problem(record.info["args"])
        if problem is not None:
            raise RecordError(f"record field 'info.args': {problem}")


BadRow = Callable[[int, RecordError], None]


def check_bundle(bundle: Any, where: str, *, on_bad_row: BadRow | None = None) -> list[Record]:
    """Validate a bundle document and return its records; RecordError names ``where``, the index and field.

    With `on_bad_row`, a row that fails validation is passed to it (index, error) and left out instead
    of failing the whole bundle; a document that is not a bundle at all is still an error.
    """
    if not isinstance(bundle, dict):
        raise RecordError(f"{where} is not a tuneforge records bundle: expected a JSON object, "
                          f"got {type(bundle).__name__}")
    if bundle.get("format") != BUNDLE_FORMAT:
        raise RecordError(f"{where} is not a tuneforge records bundle: format is {bundle.get('format')!r}, "
                          f"expected {BUNDLE_FORMAT!r}")
    version = bundle.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise RecordError(f"{where} has an invalid bundle version {version!r}")
    if version > BUNDLE_VERSION:
        raise RecordError(f"{where} has bundle version {version}, newer than this tuneforge supports "
                          f"({BUNDLE_VERSION}); upgrade tuneforge to read it")
    items = bundle.get("records")
    if not isinstance(items, list):
        raise RecordError(f"{where}: 'records' must be a list, got {type(items).__name__}")
    records = []
    for index, item in enumerate(items):
        try:
            record = Record.from_json(item)
            _check_uses(record)
        except RecordError as exc:
            if on_bad_row is None:
                raise RecordError(f"{where}: record {index}: {exc}") from None
            on_bad_row(index, exc)
            continue
        records.append(record)
    return records


def write_bundle(bundle: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Validate ``bundle`` and write it to ``path`` atomically (a temporary file, then ``os.replace``)."""
    target = Path(path)
    check_bundle(bundle, "bundle")
    data = json.dumps(bundle, indent=1, sort_keys=True, allow_nan=False).encode() + b"\n"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
    try:
        with open(tmp, "xb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _load_json(path: str | os.PathLike[str]) -> tuple[Any, str]:
    where = f"bundle file {os.fspath(path)}"
    try:
        text = Path(path).read_bytes()
        if text[:2] == b"\x1f\x8b":  # gzip's magic: a bundle kept compressed (shipped test data, say)
            text = gzip.decompress(text)
    except FileNotFoundError:
        raise RecordError(f"{where} does not exist") from None
    except (OSError, EOFError) as exc:
        raise RecordError(f"{where} cannot be read: {exc}") from None
    try:
        return json.loads(text), where
    except ValueError as exc:
        raise RecordError(f"{where} is not valid JSON: {exc}") from None


def read_bundle(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and validate a bundle file; RecordError names the file and what is wrong with it."""
    bundle, where = _load_json(path)
    check_bundle(bundle, where)
    result: dict[str, Any] = bundle
    return result


def read_records(path: str | os.PathLike[str], *, on_bad_row: BadRow | None = None) -> list[Record]:
    """The records of a bundle file, validated once; `on_bad_row` as in `check_bundle`."""
    bundle, where = _load_json(path)
    return check_bundle(bundle, where, on_bad_row=on_bad_row)
