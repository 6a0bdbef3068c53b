"""Triton templates as choices of select(), run by Triton's interpreter on CPU tensors (no GPU needed).

Triton decides at import whether it interprets (TRITON_INTERPRET=1), so each case runs in a child
process with the variable set; the kernel, its grid and argument mapping live in a module the child
(and its benchmark worker) imports, because choices travel to the isolated worker by pickle.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="Triton templates need the triton package")
pytest.importorskip("torch", reason="Triton's interpreter runs on torch tensors")

from tuneforge.errors import TemplateError
from tuneforge.tune.triton_template import TritonConfig, TritonTemplate

from .conftest import run_python

KERNELS = '''
import triton
import triton.language as tl

SOURCE = """
import triton
import triton.language as tl


@triton.jit
def scale_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(x_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x * {{ factor }}{{ " + 1" if BLOCK == 64 and broken else "" }}, mask=mask)
"""

SIGNATURE = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}


def grid(config, args):
    return (triton.cdiv(args[0].numel(), config["BLOCK"]),)


def arguments(args):
    x, out = args
    return (x, out, x.numel())


def scaled(x, factor):
    return x * factor
'''

CHILD = '''
import json, sys, functools
import torch
from tuneforge import config
from tuneforge.tune.choices import ExternChoice
from tuneforge.tune.select import select_detailed
from tuneforge.tune.triton_template import TritonConfig, TritonTemplate
import tkernels

broken = sys.argv[1] == "broken"
template = TritonTemplate("scale", tkernels.SOURCE, "scale_kernel", tkernels.SIGNATURE, grid=tkernels.grid,
                          arguments=tkernels.arguments, render={"factor": 3.0, "broken": broken})
configs = [TritonConfig({"BLOCK": 64}, num_warps=2), TritonConfig({"BLOCK": 256}, num_warps=4)]
reference = ExternChoice(functools.partial(tkernels.scaled, factor=3.0), name="torch_scale")
x = torch.randn(1000)
with config.patch(autotune_bench_time_s=0.01, autotune_warmup_s=0.0):
    selection = select_detailed("scale", [*template.choices(configs), reference], [x], out=torch.empty(1000),
                                reference=reference)
out = torch.empty(1000)
selection.choice(x, out)
print(json.dumps({"winner": selection.choice.name, "source": selection.source,
                  "status": {r.choice_name: r.status for r in selection.records.values()},
                  "errors": [r.error for r in selection.records.values() if r.error],
                  "error": float((out - 3.0 * x).abs().max())}))
'''


def _run(tmp_path: Path, mode: str) -> dict[str, object]:
    (tmp_path / "tkernels.py").write_text(textwrap.dedent(KERNELS))
    proc = run_python(CHILD.replace("sys.argv[1]", repr(mode)),
                      env={"TRITON_INTERPRET": "1", "PYTHONPATH": str(tmp_path)}, timeout=300)
    result: dict[str, object] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def test_triton_choices_are_verified_and_timed_by_select(cache_dir: Path, tmp_path: Path) -> None:
    result = _run(tmp_path, "ok")
    status = result["status"]
    assert isinstance(status, dict) and len(status) == 3, result
    assert set(status.values()) == {"ok"}, result  # both configurations verified against the reference
    assert any(name.startswith("scale[BLOCK=64") for name in status) and result["source"] == "tuned"
    assert result["error"] == 0.0  # the winner, called, computes the op


def test_a_wrong_configuration_is_recorded_and_never_picked(cache_dir: Path, tmp_path: Path) -> None:
    result = _run(tmp_path, "broken")  # the BLOCK=64 render adds 1 to every element
    status = result["status"]
    assert isinstance(status, dict)
    wrong = [name for name, s in status.items() if s == "wrong_result"]
    assert len(wrong) == 1 and wrong[0].startswith("scale[BLOCK=64"), result
    assert not str(result["winner"]).startswith("scale[BLOCK=64") and result["error"] == 0.0


def test_configs_and_templates_refuse_bad_input() -> None:
    with pytest.raises(TemplateError, match="num_warps"):
        TritonConfig({"BLOCK": 64}, num_warps=0)
    with pytest.raises(TemplateError, match="constexpr"):
        TritonConfig({"BLOCK": [64]})  # type: ignore[dict-item]
    with pytest.raises(TemplateError, match="grid"):
        TritonTemplate("t", "", "k", {}, grid=None)  # type: ignore[arg-type]
    template = TritonTemplate("t-missing", "x = {{ missing }}", "k", {}, grid=lambda c, a: (1,))
    with pytest.raises(TemplateError, match="missing"):
        template.choices([{"BLOCK": 1}])
    with pytest.raises(TemplateError, match="duplicate template name"):  # names identify templates' code
        TritonTemplate("t-missing", "x = 1", "k", {}, grid=lambda c, a: (1,))


def test_choices_differ_by_configuration_and_source() -> None:
    template = TritonTemplate("t-differ", "# {{ factor }}", "k", {"BLOCK": "constexpr"}, grid=lambda c, a: (1,),
                              render={"factor": 2})
    a, b, c = template.choices([{"BLOCK": 64}, {"BLOCK": 128}, TritonConfig({"BLOCK": 64}, num_warps=8)])
    other = TritonTemplate("t-differ", "# {{ factor }}", "k", {"BLOCK": "constexpr"}, grid=lambda c, a: (1,),
                           render={"factor": 3}).choices([{"BLOCK": 64}])[0]
    assert len({a.hash_key, b.hash_key, c.hash_key, other.hash_key}) == 4
    assert a.family == other.family == "triton:t-differ" and a.params == {"BLOCK": 64, "num_warps": 4, "num_stages": 3}
    assert template.choices([{"BLOCK": 64}])[0].hash_key == a.hash_key  # stable


def test_a_choice_names_its_target_before_the_pool_builds_it(cache_dir: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from concurrent.futures import Future
    from typing import Any

    from tuneforge.compile import triton_env
    from tuneforge.compile.pool import BuildPool
    from tuneforge.compile.triton import GpuTarget

    source = KERNELS.split('SOURCE = """')[1].split('"""')[0]
    signature = {"x_ptr": "*fp32", "out_ptr": "*fp32", "n": "i32", "BLOCK": "constexpr"}
    template = TritonTemplate("t-target", source, "scale_kernel", signature, grid=lambda c, a: (1,),
                              render={"factor": 2.0, "broken": False})
    choice = template.choices([{"BLOCK": 128}])[0]

    triton_env.forget_targets()
    try:
        without = choice.build(None)  # no GPU: the choice fails at once, naming why, and submits nothing
        with pytest.raises(triton_env.TritonBuildError, match="no GPU"):
            without.result(timeout=0)

        triton_env.forget_targets()  # this process's GPU, as the driver would name it
        monkeypatch.setattr(triton_env, "current_target", lambda: GpuTarget(arch=90))
        submitted: list[Any] = []

        class Recording(BuildPool):
            def submit(self, build: object, *, label: str = "") -> Future[Any]:
                submitted.append(build)
                return super().submit(build, label=label)

        with Recording(1) as pool:
            result = choice.build(pool).result(timeout=300)
        assert [b.target for b in submitted] == [GpuTarget(arch=90)]  # resolved here, not in the worker
        assert result.compiled and Path(result.path).read_bytes()[:4] == b"\x7fELF"
    finally:
        triton_env.forget_targets()
