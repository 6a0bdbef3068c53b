"""Records name where a choice's compiled code is; they must never choose which code runs.

A record arrives from outside (``records import``, a shipped bundle), so its artifact and entry
are only a hint: taken when the artifact was built from that very choice, otherwise ignored,
counted and logged once, and the choice is built from its own source. Real g++ throughout.
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

from tuneforge import config, warn_once
from tuneforge.compile import cpp, python
from tuneforge.store.record import BUNDLE_FORMAT, BUNDLE_VERSION, Record, write_bundle
from tuneforge.tune.template import KernelTemplate, TemplateChoice, rejected_hints

from .conftest import run_python

SOURCE = r"""
#include <stdint.h>
extern "C" void {{ NAME }}(const double* a, double* out, int64_t n) {
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] * {{ FACTOR }};
}
"""


def _launch(kernel: Any, args: Any, config: Any) -> None:
    a, out = args
    kernel(a, out, a.size)


SCALE = KernelTemplate("test_record_trust_scale", SOURCE, signature="void {{ NAME }}(const double* a, double* out, "
                       "int64_t n)", launcher=_launch, runtime_params=("unused_at_build",))


def scale(factor: int, name: str = "scale", unused: int = 0) -> TemplateChoice:
    return TemplateChoice(SCALE, {"FACTOR": factor, "NAME": name, "unused_at_build": unused, "LABEL": 0},
                          f"scale{factor}_{name}")


def run(choice: TemplateChoice) -> float:
    out = np.zeros(4)
    choice.run([np.ones(4), out])
    return float(out[0])


@pytest.fixture
def fresh_warning(cache_dir: Path,
                  caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """A cache of its own, and this process's 'logged once' flag cleared so the test sees the warning."""
    warn_once.forget("tune.rejected-record-hint")
    caplog.set_level(logging.WARNING, logger="tuneforge.tune")
    yield caplog


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "ignored a tuning record" in r.getMessage()]


def test_own_record_loads_without_a_render(fresh_warning: pytest.LogCaptureFixture) -> None:
    built = scale(2)
    assert run(built) == 2.0
    warm = scale(2, unused=7)  # differs only in a runtime parameter: the same artifact, legitimately
    before = rejected_hints()
    warm.use_record({"artifact": built.artifact_key, "entry": built.entry})
    assert run(warm) == 2.0
    assert warm._source is None and warm.artifact_key == built.artifact_key  # no render: the hint was taken
    assert rejected_hints() == before and warnings_of(fresh_warning) == []


def test_a_recorded_artifact_that_fails_to_load_is_rebuilt_not_a_failed_choice(
        fresh_warning: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    built = scale(2)
    assert run(built) == 2.0
    from tuneforge.compile import cpp as cpp_module

    def unreadable(key: str, **_: Any) -> Any:
        raise OSError(f"Input/output error reading the entry of {key}")

    monkeypatch.setattr(cpp_module, "load_module_by_key", unreadable)  # a failing disk, which no test can make
    warm = scale(2)
    before = rejected_hints()
    warm.use_record({"artifact": built.artifact_key, "entry": built.entry})
    assert run(warm) == 2.0 and warm.artifact_key == built.artifact_key
    assert rejected_hints() == before and warnings_of(fresh_warning) == []  # not the record's fault


def test_record_pointing_at_another_candidates_artifact_is_ignored(fresh_warning: pytest.LogCaptureFixture) -> None:
    other = scale(3)
    assert run(other) == 3.0
    before = rejected_hints()
    for _ in range(2):  # two choices misled by the same bad bundle: counted twice, logged once
        mine = scale(2)
        mine.use_record({"artifact": other.artifact_key, "entry": other.entry})
        assert run(mine) == 2.0  # its own code ran, not the artifact the record named
        assert mine.artifact_key != other.artifact_key
    assert rejected_hints() == before + 2
    assert len(warnings_of(fresh_warning)) == 1
    assert "scale2_scale" in warnings_of(fresh_warning)[0]


def test_identical_source_from_another_configuration_is_not_a_bad_record(
        fresh_warning: pytest.LogCaptureFixture) -> None:
    first = scale(2)
    assert run(first) == 2.0
    twin = TemplateChoice(SCALE, {**first.config, "LABEL": 1}, "twin")  # LABEL is not in the source: same artifact
    before = rejected_hints()
    twin.use_record({"artifact": first.artifact_key, "entry": first.entry})
    assert run(twin) == 2.0 and twin.artifact_key == first.artifact_key
    assert rejected_hints() == before and warnings_of(fresh_warning) == []


def test_hints_that_are_not_this_choices_code_are_ignored(fresh_warning: pytest.LogCaptureFixture) -> None:
    own = scale(5)
    assert run(own) == 5.0
    ctypes_library = cpp.load('extern "C" int record_trust_probe() { return 1; }').tuneforge_key
    python_module = python.load("def f():\n    return 1\n").tuneforge_key
    hints = [
        ("../../../etc/passwd", "scale"),                           # not a key at all
        (ctypes_library, "record_trust_probe"),                     # a C++ artifact that is no module
        (python_module, "f"),                                       # another kind of artifact
        (own.artifact_key, "tuneforge_key"),                        # its own module, not its function
        (own.artifact_key, "PyInit_" + str(own.artifact_key)),
    ]
    before = rejected_hints()
    for artifact, entry in hints:
        choice = scale(5)
        choice.use_record({"artifact": artifact, "entry": entry})
        assert run(choice) == 5.0, (artifact, entry)
        assert (choice.artifact_key, choice.entry) == (own.artifact_key, own.entry)
    assert rejected_hints() == before + len(hints)
    assert len(warnings_of(fresh_warning)) == 1


def test_out_of_date_hints_are_dropped_quietly(fresh_warning: pytest.LogCaptureFixture) -> None:
    with config.patch(cpp_flags=["-DRECORD_TRUST_OTHER_SETTINGS"]):
        other_settings = scale(6)
        assert run(other_settings) == 6.0
    before = rejected_hints()
    for artifact in (other_settings.artifact_key, "cpp" + "a" * 52):  # its own code, other flags; a gone artifact
        choice = scale(6)
        choice.use_record({"artifact": artifact, "entry": other_settings.entry})
        assert run(choice) == 6.0 and choice.artifact_key not in (artifact, None)
    assert rejected_hints() == before and warnings_of(fresh_warning) == []  # a changed setting is no attack


GEMM_CHILD = """
    import json, logging, numpy as np
    import tuneforge
    from tuneforge.tune.template import rejected_hints
    logging.basicConfig(level=logging.WARNING)
    rng = np.random.default_rng(0)
    a = rng.standard_normal((40, 32)).astype(np.float32)
    b = rng.standard_normal((32, 48)).astype(np.float32)
    results = []
    for _ in range(3):  # the first call decides, later calls go through the prepared call / C dispatcher
        c = np.full((40, 48), np.nan, dtype=np.float32)
        tuneforge.gemm(a, b, c)
        results.append(float(np.max(np.abs(c - a @ b))))
    print(json.dumps({"errors": results, "rejected": rejected_hints()}))
"""


def forged_float32_bundle(path: Path) -> Path:
    """A bundle for the float32 gemm of GEMM_CHILD whose rows all point at a compiled float64 kernel."""
    from tuneforge.kernels.gemm import Problem, choices
    from tuneforge.tune.fingerprint import system_fingerprint
    from tuneforge.tune.select import selection_key
    from tuneforge.tune.specs import TensorSpec

    float64 = next(c for c in choices(Problem(40, 48, 32, "float64")) if isinstance(c, TemplateChoice))
    float64.kernel()  # a real float64 artifact in the cache: what the forged rows point at
    assert float64.artifact_key is not None and float64.entry is not None
    specs = [TensorSpec.contiguous((40, 32), "float32"), TensorSpec.contiguous((32, 48), "float32"), 1.0, 0.0, None,
             TensorSpec.contiguous((40, 48), "float32")]
    key = selection_key("gemm", specs)
    rows = []
    for i, choice in enumerate(choices(Problem(40, 48, 32, "float32"))):
        info: dict[str, Any] = {"family": choice.family}
        if isinstance(choice, TemplateChoice):
            info.update(artifact=float64.artifact_key, entry=float64.entry)
        rows.append(Record(key=key, choice=choice.hash_key, op="gemm", choice_name=choice.name, status="ok",
                           median_ms=1.0 if choice.is_extern else 0.001 * (i + 1), count=3,
                           system=system_fingerprint()["hash"], info=info, created=time.time()).to_json())
    write_bundle({"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION, "exported": time.time(), "records": rows}, path)
    return path


@pytest.mark.parametrize("how", ["bundle", "records import"])
def test_gemm_with_records_pointing_at_the_float64_kernel(cache_dir: Path, tmp_path: Path, how: str) -> None:
    bundle = forged_float32_bundle(tmp_path / "forged.json")
    env = {"TUNEFORGE_BUNDLES": str(bundle)}
    if how == "records import":
        env = {}
        run_python(f"""
            from tuneforge.store.default import default_records
            assert default_records().import_bundle({str(bundle)!r}) > 0
        """)
    proc = run_python(GEMM_CHILD, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert max(result["errors"]) < 1e-3, result
    assert result["rejected"] >= 1
    assert proc.stderr.count("ignored a tuning record") == 1
