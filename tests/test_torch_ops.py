"""tuneforge.torch: the tuned mm/addmm operators, eager and under torch.compile, with autograd; your own tuned
operators (@tuneforge.torch.op); routing aten's products to them (Inductor pass, light backend)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="tuneforge.torch needs torch")

import torch
from torch._dynamo.utils import counters

import tuneforge
import tuneforge.torch as tft
from tuneforge.store.default import default_records

from .conftest import run_python


@pytest.fixture(autouse=True)
def tuning(torch_tuning: Path) -> Path:
    return torch_tuning


def close(x: Any, y: Any) -> None:
    torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_mm_and_addmm_match_aten_on_odd_and_strided_layouts(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    a, b = torch.randn(33, 20, dtype=dtype), torch.randn(20, 17, dtype=dtype)
    close(tft.mm(a, b), a @ b)
    wide = torch.randn(40, 60, dtype=dtype)
    strided, column_major = wide[:30:2, :20], wide[:20, 10:27].t().contiguous().t()
    close(tft.mm(strided, column_major), strided @ column_major)
    for bias in (torch.randn(17, dtype=dtype), torch.randn(33, 17, dtype=dtype), torch.randn(1, 17, dtype=dtype)):
        close(tft.addmm(bias, a, b), torch.addmm(bias, a, b))
        close(tft.addmm(bias, a, b, 0.5, 2.0), torch.addmm(bias, a, b, beta=0.5, alpha=2.0))
    x, w, bias = torch.randn(2, 3, 20, dtype=dtype), torch.randn(17, 20, dtype=dtype), torch.randn(17, dtype=dtype)
    close(tft.linear(x, w, bias), torch.nn.functional.linear(x, w, bias))
    close(tft.linear(x, w), torch.nn.functional.linear(x, w))
    # Through the dispatcher (what compiled graphs and traced code call), the same results.
    close(torch.ops.tuneforge.mm(a, b), a @ b)
    close(torch.ops.tuneforge.addmm(bias, a, b, 1.0, 3.0), torch.addmm(bias, a, b, alpha=3.0))


def test_known_layouts_take_their_bound_call_and_each_layout_has_its_own() -> None:
    from tuneforge.kernels.gemm import clear_dispatch
    from tuneforge.kernels.gemm.op import FRESH_PRODUCTS

    torch.manual_seed(0)
    base = torch.randn(24, 24)
    row_major, column_major, offset = base[:16, :8], base[:8, :16].t(), base[3:19, 5:13]  # all 16 x 8
    b = torch.randn(8, 12)
    for a in (row_major, column_major, offset):
        close(tft.mm(a, b), a @ b)  # the first product of a layout
    assert len(FRESH_PRODUCTS) == 2  # one bound call per layout: the offset view shares row_major's
    for _ in range(2):
        base.copy_(torch.randn(24, 24))  # new values, same layouts: the bound calls read them afresh
        for a in (row_major, column_major, offset):
            close(tft.mm(a, b), a @ b)
    close(tft.mm(row_major.double(), b.double()), row_major.double() @ b.double())  # another dtype, its own
    clear_dispatch()
    assert not FRESH_PRODUCTS


def test_the_tuned_layouts_are_tuned_once_and_recorded() -> None:
    a, b = torch.randn(48, 32), torch.randn(32, 24)
    tft.mm(a, b)
    ops = {r.op for r in default_records().records()}
    assert ops == {"gemm_torch"}, ops
    count = len(default_records().records())
    for _ in range(3):
        tft.mm(a, b)
        torch.ops.tuneforge.mm(a, b)
    assert len(default_records().records()) == count  # later calls: the layout's prepared call


def test_layouts_tuneforge_does_not_tune_run_atens_kernels() -> None:
    a, b = torch.randn(8, 4), torch.randn(4, 5)
    close(tft.mm(a.half(), b.half()).float(), (a.half() @ b.half()).float())
    batched = torch.randn(2, 8, 4)
    with pytest.raises(RuntimeError, match="matrix"):
        tft.mm(batched, b)
    with pytest.raises(RuntimeError, match="cannot be multiplied"):
        tft.mm(a, a)
    for m, k, n in ((0, 4, 3), (3, 0, 5), (3, 4, 0)):  # empty products, as aten makes them
        x, y = torch.randn(m, k), torch.randn(k, n)
        assert torch.equal(tft.mm(x, y), x @ y) and torch.equal(torch.ops.tuneforge.mm(x, y), x @ y)
        assert torch.equal(tft.addmm(torch.ones(n), x, y), torch.addmm(torch.ones(n), x, y))
    assert not default_records().records()


def test_gradients_match_atens() -> None:
    torch.manual_seed(1)
    a, b, bias = (torch.randn(6, 5, dtype=torch.float64, requires_grad=True),
                  torch.randn(5, 4, dtype=torch.float64, requires_grad=True),
                  torch.randn(4, dtype=torch.float64, requires_grad=True))
    assert torch.autograd.gradcheck(lambda a, b: tft.mm(a, b), (a, b))
    assert torch.autograd.gradcheck(lambda bias, a, b: tft.addmm(bias, a, b, 0.5, 2.0), (bias, a, b))
    full = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda c, a, b: tft.addmm(c, a, b), (full, a, b))
    # Only what needs a gradient gets one (the backward's products are tuned ops too).
    w = torch.randn(5, 4, dtype=torch.float64)
    tft.mm(a, w).sum().backward()
    assert w.grad is None and a.grad is not None
    assert any(r.op == "gemm_torch" and r.inputs.startswith("float64[6x4]") for r in default_records().records()) \
        or len({r.key for r in default_records().records()}) >= 2


def test_compiled_with_fullgraph_has_no_graph_break_and_matches() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 8))

    def forward(x: torch.Tensor) -> torch.Tensor:
        first, _, last = model
        h = torch.relu(tft.linear(x, first.weight, first.bias))
        return tft.linear(h, last.weight, last.bias)

    x = torch.randn(12, 16)
    compiled = torch.compile(forward, backend="aot_eager", fullgraph=True)
    close(compiled(x), model(x))
    compiled(x).sum().backward()  # the compiled graph differentiates through the ops
    assert model[0].weight.grad is not None
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_inductor_calls_the_tuned_kernel_straight_from_the_compiled_graph() -> None:
    from torch._inductor.utils import run_and_get_code

    a, b, bias = torch.randn(24, 16), torch.randn(16, 8), torch.randn(8)
    with torch.no_grad():
        result, code = run_and_get_code(torch.compile(lambda a, b, c: (tft.mm(a, b), tft.addmm(c, a, b, 1.0, 2.0)),
                                                      fullgraph=True), a, b, bias)
    close(result[0], a @ b)
    close(result[1], torch.addmm(bias, a, b, alpha=2.0))
    text = "\n".join(code)
    assert "torch.ops.tuneforge.python_cpu_mm_out(" in text
    assert "torch.ops.tuneforge.python_cpu_bias_mm_out(" in text
    assert "torch.ops.tuneforge.mm.default(" not in text  # not through the dispatcher


def test_the_router_sends_chosen_shapes_of_atens_products_to_tuneforge() -> None:
    from torch._inductor import config as inductor_config
    from torch._inductor.utils import run_and_get_code

    router = tft.MatmulRouter(shapes=[(24, 16, 8)])
    a, b, other = torch.randn(24, 16), torch.randn(16, 8), torch.randn(10, 16)
    with torch.no_grad(), inductor_config.patch(post_grad_custom_pre_pass=router):
        result, code = run_and_get_code(torch.compile(lambda a, b, o: (a @ b, o @ b), fullgraph=True), a, b, other)
    close(result[0], a @ b)
    close(result[1], other @ b)
    assert router.routed == 1  # (24, 16, 8) only
    assert "torch.ops.tuneforge.python_cpu_mm_out(" in "\n".join(code)
    assert {r.inputs.split(",")[0] for r in default_records().records()} == {"float32[24x16]"}
    assert tft.MatmulRouter([(24, 16, 8)]).uuid() == router.uuid() != tft.MatmulRouter().uuid()
    with pytest.raises(ValueError, match=r"\(M, K, N\)"):
        tft.MatmulRouter([(1, 2)])


def test_the_light_backend_trains_a_model_like_eager() -> None:
    torch.manual_seed(2)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    twin = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    twin.load_state_dict(model.state_dict())
    backend = tft.backend()
    compiled = torch.compile(model, backend=backend, fullgraph=True)
    x = torch.randn(8, 16)
    compiled(x).square().sum().backward()
    twin(x).square().sum().backward()
    for ours, theirs in zip(model.parameters(), twin.parameters(), strict=True):
        assert ours.grad is not None and theirs.grad is not None
        close(ours.grad, theirs.grad)
    assert backend.router.routed >= 4  # two products forward, their gradients' products backward
    assert not counters["graph_break"]


def _fast(x: torch.Tensor, factor: float, out: torch.Tensor) -> None:
    torch.mul(x, factor, out=out)


def _slow(x: torch.Tensor, factor: float, out: torch.Tensor) -> None:
    time.sleep(0.002)
    torch.mul(x, factor, out=out)


def test_a_tuned_custom_op_picks_the_fastest_choice_eager_and_compiled(tuning: Path) -> None:
    calls: list[str] = []

    def counted(x: torch.Tensor, factor: float, out: torch.Tensor) -> None:
        calls.append("fast")
        _fast(x, factor, out)

    @tft.op("tuneforge_tests::scale", [tuneforge.ExternChoice(_slow), tuneforge.ExternChoice(counted, name="fast")],
            backward=lambda ctx, grad: (grad * ctx.factor, None),
            setup_context=lambda ctx, inputs, output: setattr(ctx, "factor", inputs[1]))
    def scale(x: torch.Tensor, factor: float) -> torch.Tensor:
        return torch.empty_like(x)

    x = torch.randn(64, 8)
    close(scale(x, 3.0), 3 * x)
    winners = {r.choice_name for r in default_records().records() if r.op == "tuneforge_tests::scale"}
    assert winners == {"_slow", "fast"}  # both timed, recorded under the operator's name
    calls.clear()
    close(scale(x, 2.0), 2 * x)
    assert calls == ["fast"]  # the pick, called once
    compiled = torch.compile(lambda x: scale(x, 4.0) + 1, fullgraph=True, backend="aot_eager")
    close(compiled(x), 4 * x + 1)
    assert not counters["graph_break"]
    leaf = torch.randn(5, 3, requires_grad=True)
    scale(leaf, 5.0).sum().backward()
    close(leaf.grad, torch.full((5, 3), 5.0))
    with pytest.raises(ValueError, match="registered already"):
        tft.op("tuneforge_tests::scale", [tuneforge.ExternChoice(_fast)])(scale._allocate)


def test_bad_custom_op_declarations_name_the_problem() -> None:
    with pytest.raises(ValueError, match="'namespace::op_name'"):
        tft.op("no_namespace", [tuneforge.ExternChoice(_fast)])
    with pytest.raises(ValueError, match="setup_context is given without backward"):
        tft.op("tuneforge_tests::x", [tuneforge.ExternChoice(_fast)], setup_context=lambda *a: None)

    def two(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return x, x

    with pytest.raises(TypeError, match="returns one Tensor"):
        tft.op("tuneforge_tests::two", [tuneforge.ExternChoice(_fast)])(two)


def test_a_fresh_process_reuses_the_records(cache_dir: Path, tmp_path: Path) -> None:
    """Tuned eagerly in one process, the op compiled in a fresh one finds the record (and times nothing)."""
    program = """
        import torch, tuneforge.torch as tft
        model = torch.nn.Linear(40, 24)
        call = lambda x: tft.linear(x, model.weight, model.bias)
        if {compiled}:
            call = torch.compile(call, backend="aot_eager", fullgraph=True)
        x = torch.randn(16, 40)
        with torch.no_grad():
            torch.testing.assert_close(call(x), model(x), rtol=1e-4, atol=1e-4)
    """
    logs = [tmp_path / "first.jsonl", tmp_path / "second.jsonl"]
    for log, compiled in zip(logs, (False, True), strict=True):
        run_python(program.format(compiled=compiled), timeout=300,
                   env={"TUNEFORGE_AUTOTUNE_LOG": str(log), "TUNEFORGE_AUTOTUNE_BENCH_TIME_S": "0.003"})
    first, second = ([json.loads(line) for line in log.read_text().splitlines()] for log in logs)
    assert [e["source"] for e in first] == ["tuned"]
    assert [e["source"] for e in second] == ["records"]  # the record database, nothing timed
    assert second[0]["winner"] == first[0]["winner"]


def test_importing_tuneforge_does_not_import_torch() -> None:
    out = run_python("import sys, tuneforge; tuneforge.config; print('torch' in sys.modules)").stdout
    assert out.strip().splitlines()[-1] == "False"


@pytest.mark.gpu
def test_the_tuned_ops_run_on_cuda_tensors_eager_and_compiled() -> None:
    """CUDA fp16 tensors: tft.mm and tft.linear tune the GPU family (cuBLAS against Triton), match aten, and a
    fullgraph compile of a model calling them has no graph break."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    a = torch.randn(96, 160, device="cuda", dtype=torch.float16)
    b = torch.randn(160, 48, device="cuda", dtype=torch.float16)
    torch.testing.assert_close(tft.mm(a, b), a @ b, rtol=2e-2, atol=2e-2)
    model = torch.nn.Sequential(torch.nn.Linear(160, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)).cuda().half()

    def forward(x: torch.Tensor) -> torch.Tensor:
        first, _, last = model
        return tft.linear(torch.relu(tft.linear(x, first.weight, first.bias)), last.weight, last.bias)

    compiled = torch.compile(forward, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(a), model(a), rtol=2e-2, atol=2e-2)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert any("gemm" in r.op for r in default_records().records())  # the GPU family was tuned, not aten's run
