"""tuneforge.torch.pack_linears: nn.Linear layers for inference with their weights copied and packed once, eager
and under torch.compile (no graph break), refusing what they cannot do."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="tuneforge.torch needs torch")

import torch
from torch._dynamo.utils import counters

import tuneforge.torch as tft
from tuneforge.store.default import default_records


@pytest.fixture(autouse=True)
def tuning(torch_tuning: Path) -> Path:
    return torch_tuning


class Block(torch.nn.Module):
    def __init__(self, width: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.inner = torch.nn.Sequential(torch.nn.Linear(width, 2 * width, dtype=dtype), torch.nn.ReLU())
        self.out = torch.nn.Linear(2 * width, 7, bias=False, dtype=dtype)

    def forward(self, x: Any) -> Any:
        return self.out(self.inner(x))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_packed_layers_match_the_originals_eager_and_compiled(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    model = Block(24, dtype).eval()
    original = copy.deepcopy(model)
    assert tft.pack_linears(model) == 2
    assert isinstance(model.inner[0], tft.PackedLinear) and isinstance(model.out, tft.PackedLinear)
    assert model.state_dict().keys() == original.state_dict().keys()  # the parameters stay where they were
    tol = {"rtol": 1e-4, "atol": 1e-4} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-10}
    with torch.no_grad():
        for x in (torch.randn(5, 24, dtype=dtype), torch.randn(2, 3, 24, dtype=dtype)):  # 2-D and 3-D inputs
            torch.testing.assert_close(model(x), original(x), **tol)
        x = torch.randn(9, 24, dtype=dtype)
        for backend in ("aot_eager", tft.backend()):
            torch._dynamo.reset()
            compiled = torch.compile(model, backend=backend, fullgraph=True)
            torch.testing.assert_close(compiled(x), original(x), **tol)
    assert not counters["graph_break"], dict(counters["graph_break"])
    # The products were tuned with torch's matmul as the library candidate, each layout once.
    ops = {record.op for record in default_records().records()}
    assert {"gemm_bias_packed_torch", "gemm_packed_torch"} <= ops, ops


def test_the_packed_weight_is_a_snapshot() -> None:
    torch.manual_seed(1)
    layer = torch.nn.Linear(16, 8)
    holder = torch.nn.Sequential(layer)
    x = torch.randn(4, 16)
    with torch.no_grad():
        before = layer(x)
        tft.pack_linears(holder)
        layer.weight.add_(1.0)  # changed after packing: not seen until packed again
        torch.testing.assert_close(holder(x), before, rtol=1e-5, atol=1e-5)
        repacked = torch.nn.Sequential(layer)  # packed again: sees it
        tft.pack_linears(repacked)
        torch.testing.assert_close(repacked(x), layer(x), rtol=1e-5, atol=1e-5)


def test_what_it_cannot_do_is_refused_or_left_alone() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 8, dtype=torch.bfloat16))
    assert tft.pack_linears(model) == 1 and type(model[1]) is torch.nn.Linear  # bfloat16: not tuned, left alone
    x = torch.randn(3, 8, requires_grad=True)
    with pytest.raises(RuntimeError, match="for inference"):
        model[0](x)
    with torch.no_grad(), pytest.raises(ValueError, match="float32 on the CPU; the input is torch.float64"):
        model[0](torch.randn(3, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="CPU float32/float64 nn.Linear"):
        tft.PackedLinear(torch.nn.Linear(4, 4, dtype=torch.float16))
