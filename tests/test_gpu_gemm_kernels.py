"""The Triton GEMM kernels: rendering, and correctness under Triton's interpreter on CPU tensors.

The interpreter is chosen when triton is imported (``TRITON_INTERPRET=1``): triton.language's own helpers
(tl.cdiv, ...) are jit functions decorated at that import, so setting the variable later, or wrapping a
kernel in InterpretedFunction, fails with "Cannot call @triton.jit'd outside of the scope of a kernel".
Other tests in this process may import triton normally (compiling for a GPU target needs that), so the
kernels run in one child process started with the variable set, which answers one case per line.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import select
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from tuneforge.errors import TemplateError
from tuneforge.kernels.gemm_gpu import ACTIVATIONS, Config, Epilogue, arguments, index_fits, render, specialization
from tuneforge.kernels.gemm_gpu.render import _TEMPLATES, KINDS

CHILD = r'''
import inspect, json, os, sys, traceback, warnings
assert os.environ.get("TRITON_INTERPRET") == "1"
import numpy as np
import torch
from tuneforge.compile.python import load
from tuneforge.kernels.gemm_gpu import Config, Epilogue, launch, render

np.seterr(all="ignore")  # exp(-x) overflows to inf for very negative x in gelu/silu: the result is still right
warnings.filterwarnings("ignore")
DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}

def kernel(kind, dtype, ep):
    r = render(kind, dtype, ep)
    fn = getattr(load(r.source), r.name)
    assert "@triton.jit" in inspect.getsource(fn.fn)  # Triton reads the source back from the file
    return fn

def tensor(rows, cols, layout, dtype, gen):
    """A rows x cols tensor laid out as asked: row-major, transposed (column-major) or every other column."""
    if layout == "t":
        return torch.randn(cols, rows, generator=gen).to(dtype).t()
    if layout == "strided":
        return torch.randn(rows, 2 * cols, generator=gen).to(dtype)[:, ::2]
    return torch.randn(rows, cols, generator=gen).to(dtype)

def run(case):
    gen = torch.Generator().manual_seed(case.get("seed", 0))
    dtype, (m, n, k) = DTYPES[case["dtype"]], case["shape"]
    config, ep = Config(**case["config"]), Epilogue(**case["epilogue"])
    layouts = case.get("layouts", {})
    a = tensor(m, k, layouts.get("a"), dtype, gen)
    b = tensor(k, n, layouts.get("b"), dtype, gen)
    out = tensor(m, n, layouts.get("c"), dtype, gen)
    bias = torch.randn(n, generator=gen).to(dtype) if ep.bias else None
    alpha, beta = case.get("alpha", 1.0), case.get("beta", 0.0) if ep.beta else 0.0
    c_in = out.double().clone()
    kernels = {kind: kernel(kind, case["dtype"], ep) for kind in config.kernels}
    launch(kernels, config, case["dtype"], ep, a, b, out, bias=bias, alpha=alpha, beta=beta)
    ref = alpha * (a.double() @ b.double()) + beta * c_in
    if bias is not None:
        ref += bias.double()
    act = {"none": lambda x: x, "relu": torch.relu, "silu": torch.nn.functional.silu,
           "gelu_tanh": lambda x: torch.nn.functional.gelu(x, approximate="tanh")}[ep.activation]
    ref = act(ref)
    scale = float(k) ** 0.5
    rtol, atol = (1e-4, 1e-4 * scale) if case["dtype"] == "float32" else (1e-2, 1e-2 * scale)
    ratio = ((out.double() - ref).abs() / (atol + rtol * ref.abs())).max().item()
    return {"ratio": ratio, "types": sorted({type(f).__name__ for f in kernels.values()})}

for line in sys.stdin:
    try:
        result = run(json.loads(line))
    except Exception:
        result = {"error": traceback.format_exc()[-3000:]}
    print(json.dumps(result), flush=True)
'''


class Interpreter:
    """The child process running kernels under TRITON_INTERPRET=1."""

    def __init__(self) -> None:
        # A file, not a pipe: nobody reads stderr while the child runs, and a full pipe would block it.
        self.stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115  (closed in close())
        env = {**os.environ, "TRITON_INTERPRET": "1"}
        self.proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.stderr, text=True, env=env)

    def run(self, case: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(case) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.stderr.seek(0)
            raise AssertionError(f"the interpreter process gave no answer; stderr:\n{self.stderr.read()[-3000:]}")
        result: dict[str, Any] = json.loads(line)
        assert "error" not in result, result["error"]
        return result

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


@pytest.fixture(scope="module")
def interp() -> Iterator[Interpreter]:
    for module in ("torch", "triton", "numpy"):
        if importlib.util.find_spec(module) is None:  # find_spec: this process stays without triton
            pytest.skip(f"{module} is not installed")
    child = Interpreter()
    yield child
    child.close()


def case(shape: tuple[int, int, int], config: Config, dtype: str = "float32", *, layouts: dict[str, str] | None = None,
         alpha: float = 1.0, beta_value: float = 0.0, seed: int = 0, **epilogue: Any) -> dict[str, Any]:
    """One kernel run; `epilogue` are Epilogue's fields (beta=True reads out, scaled by beta_value)."""
    return {"shape": shape, "config": config.as_dict(), "dtype": dtype, "epilogue": epilogue,
            "layouts": layouts or {}, "alpha": alpha, "beta": beta_value, "seed": seed}


MM_CONFIGS = [Config(16, 16, 16, group_m=1), Config(32, 16, 32, group_m=2, num_warps=2), Config(16, 32, 16)]
SPLITK_CONFIGS = [Config(16, 16, 16, split_k=2), Config(16, 32, 32, group_m=1, split_k=3),
                  Config(32, 16, 16, split_k=4)]
SHAPES = [(1, 17, 33), (37, 29, 51), (64, 48, 200), (5, 130, 7)]
EPILOGUES: list[dict[str, Any]] = [{}, {"bias": True, "activation": "relu"},
                                   {"beta": True, "activation": "gelu_tanh"},
                                   {"bias": True, "beta": True, "activation": "silu"}]
LAYOUTS = [{}, {"a": "t"}, {"b": "t", "c": "t"}, {"a": "strided", "b": "strided"}]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("kind", ["mm", "splitk"])
@pytest.mark.parametrize("i", range(len(SHAPES)), ids=lambda i: "x".join(map(str, SHAPES[i])))
def test_odd_shapes(interp: Interpreter, i: int, kind: str, dtype: str) -> None:
    configs = MM_CONFIGS if kind == "mm" else SPLITK_CONFIGS
    result = interp.run(case(SHAPES[i], configs[i % 3], dtype, layouts=LAYOUTS[i], alpha=0.5, beta_value=0.75,
                             seed=i, **EPILOGUES[i]))
    assert result["ratio"] <= 1.0
    assert result["types"] == ["InterpretedFunction"]


@pytest.mark.parametrize("config", MM_CONFIGS + SPLITK_CONFIGS, ids=lambda c: c.name)
def test_every_config_on_one_shape(interp: Interpreter, config: Config) -> None:
    assert interp.run(case((37, 29, 51), config, bias=True))["ratio"] <= 1.0


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("config", [MM_CONFIGS[0], SPLITK_CONFIGS[0]], ids=lambda c: c.name)
def test_activations_with_bias(interp: Interpreter, config: Config, activation: str) -> None:
    assert interp.run(case((20, 40, 48), config, bias=True, activation=activation, seed=3))["ratio"] <= 1.0


@pytest.mark.parametrize("layouts", [{"a": "t"}, {"b": "t"}, {"c": "t"}, {"a": "strided"}, {"b": "strided"}],
                         ids=lambda d: ",".join(f"{k}={v}" for k, v in d.items()))
@pytest.mark.parametrize("config", [MM_CONFIGS[1], SPLITK_CONFIGS[1]], ids=lambda c: c.name)
def test_layouts(interp: Interpreter, config: Config, layouts: dict[str, str]) -> None:
    result = interp.run(case((33, 18, 40), config, "float16", layouts=layouts, beta=True, beta_value=-1.0))
    assert result["ratio"] <= 1.0


@pytest.mark.parametrize("precision", ["ieee", "tf32", "tf32x3"])
def test_fp32_input_precisions_render_and_run(interp: Interpreter, precision: str) -> None:
    # The interpreter multiplies in fp32 whatever the precision: this checks the option compiles into a
    # valid tl.dot call; tf32's rounding is only visible on a GPU.
    assert interp.run(case((17, 19, 35), MM_CONFIGS[0], precision=precision))["ratio"] <= 1.0


@pytest.mark.xfail(strict=True, reason="Triton 3.8's interpreter multiplies bf16 tiles as their uint16 storage "
                   "(InterpreterBuilder.create_dot does not convert them)")
def test_bfloat16_dot_under_the_interpreter(interp: Interpreter) -> None:
    assert interp.run(case((16, 16, 16), MM_CONFIGS[0], "bfloat16"))["ratio"] <= 1.0


def test_bfloat16_epilogue_without_a_dot(interp: Interpreter) -> None:
    # alpha = 0 multiplies the interpreter's wrong bf16 product away: what is checked is the bf16 loads of
    # C and bias, the fp32 epilogue and the bf16 store, which the interpreter does right.
    result = interp.run(case((19, 23, 16), MM_CONFIGS[0], "bfloat16", alpha=0.0, beta_value=0.5, beta=True,
                             bias=True, activation="silu"))
    assert result["ratio"] <= 1.0


# --- rendering (no triton needed) ---------------------------------------------------------------------------

def kernel_params(source: str, name: str) -> list[tuple[str, bool]]:
    """(parameter, annotated tl.constexpr) of the function `name` in `source`."""
    fn = next(node for node in ast.walk(ast.parse(source)) if isinstance(node, ast.FunctionDef) and node.name == name)
    return [(arg.arg, arg.annotation is not None and ast.unparse(arg.annotation) == "tl.constexpr")
            for arg in fn.args.args]


EPILOGUE_OPTIONS = [Epilogue(), Epilogue(bias=True), Epilogue(beta=True, activation="relu"),
                    Epilogue(bias=True, beta=True, activation="gelu_tanh", precision="ieee")]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("epilogue", EPILOGUE_OPTIONS, ids=lambda e: e.name)
def test_signature_matches_the_kernel(kind: str, dtype: str, epilogue: Epilogue) -> None:
    r = render(kind, dtype, epilogue)
    params = kernel_params(r.source, r.name)
    assert [p for p, _ in params] == list(r.signature)
    assert [p for p, const in params if const] == list(r.constexpr_params)
    short = {"float16": "*fp16", "bfloat16": "*bf16", "float32": "*fp32"}[dtype]
    assert r.signature.get("c_ptr", short) == short and r.signature.get("a_ptr", short) == short
    assert set(r.signature.values()) <= {short, "*fp32", "i32", "fp32", "constexpr"}
    compile(r.source, r.name, "exec")


def test_sources_differ_by_epilogue_and_dtype() -> None:
    sources = {render("mm", d, e).source for d in ("float16", "bfloat16", "float32") for e in EPILOGUE_OPTIONS}
    assert len(sources) == 12
    names = {render("mm", d, e).name for d in ("float16", "bfloat16", "float32") for e in EPILOGUE_OPTIONS}
    assert len(names) == 12
    assert "tl.bfloat16" in render("mm", "bfloat16").source
    assert 'input_precision="tf32"' in render("mm", "float32").source
    assert "input_precision" not in render("mm", "float16").source
    assert "bias_ptr" in render("splitk_reduce", "float16", Epilogue(bias=True)).source
    # the partial pass has no epilogue: one source for every epilogue, precision apart
    assert len({render("splitk", "float16", e).source for e in EPILOGUE_OPTIONS}) == 1
    # options a dtype ignores do not make new kernels
    assert render("mm", "float16", Epilogue(precision="ieee")) == render("mm", "float16", Epilogue())


def test_strict_rendering_names_template_and_variable() -> None:
    values = {"name": "k", "dot_options": "", "has_bias": False, "has_beta": False, "activation": "none"}
    with pytest.raises(TemplateError, match=r"tuneforge_triton_mm.*'out_type' is undefined"):
        _TEMPLATES["mm"].render(values)
    with pytest.raises(TemplateError, match="unknown activation 'tanh'"):
        Epilogue(activation="tanh")
    with pytest.raises(TemplateError, match="unsupported dtype 'float64'"):
        render("mm", "float64")
    with pytest.raises(TemplateError, match="unknown GEMM kernel kind"):
        render("persistent", "float16")


class FakeTensor:
    """Shape and strides only: arguments() and specialization() read nothing else."""

    def __init__(self, shape: tuple[int, ...], strides: tuple[int, ...], address: int = 4096) -> None:
        self.shape, self._strides, self.address = shape, strides, address

    def data_ptr(self) -> int:
        return self.address

    def stride(self, dim: int | None = None) -> Any:
        return self._strides if dim is None else self._strides[dim]


def test_arguments_follow_the_signature_and_sizes_and_strides_specialize() -> None:
    a, b, out, bias = FakeTensor((8, 32), (1, 8)), FakeTensor((32, 16), (16, 1)), FakeTensor((8, 16), (16, 1)), \
        FakeTensor((16,), (1,), address=4098)
    r = render("mm", "float16", Epilogue(bias=True, beta=True))
    args = arguments(r, a, b, out, bias=bias, alpha=2.0, beta=0.5)
    named = dict(zip(r.runtime_params, args, strict=True))
    assert named["stride_am"] == 1 and named["stride_ak"] == 8 and named["K"] == 32
    assert named["alpha"] == 2.0 and named["beta"] == 0.5 and named["bias_ptr"] is bias
    signature, fixed, attrs = specialization(r, args)
    assert fixed == {"M": 8, "N": 16, "K": 32, "stride_am": 1, "stride_ak": 8, "stride_bk": 16, "stride_bn": 1,
                     "stride_cm": 16, "stride_cn": 1, "stride_bias": 1}  # a static shape, as Inductor's
    assert all(signature[p] == "constexpr" for p in fixed)
    assert [p for p in r.signature if signature[p] != "constexpr"] == ["a_ptr", "b_ptr", "c_ptr", "bias_ptr",
                                                                        "alpha", "beta"]
    aligned = {list(r.signature)[i] for (i,) in attrs}
    assert aligned == {"a_ptr", "b_ptr", "c_ptr"}  # bias is 2 bytes off
    assert all(v == [["tt.divisibility", 16]] for v in attrs.values())
    assert index_fits(a, b, out, None) and not index_fits(FakeTensor((2**16, 2**16), (2**16, 1)))
    with pytest.raises(ValueError, match="needs ws_ptr"):
        arguments(render("splitk", "float16"), a, b, out)
