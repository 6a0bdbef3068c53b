"""GemmTritonChoice.run's launch plans, without a GPU: the launcher is a recorder, so every launch's kernel
specialization and run-time arguments can be compared with what `arguments` and `specialization` say."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from tuneforge.compile import triton as triton_builder  # noqa: E402
from tuneforge.compile import triton_env  # noqa: E402
from tuneforge.compile.triton import GpuTarget  # noqa: E402
from tuneforge.kernels.gemm_gpu import Config, Epilogue, GemmLayout, GemmTritonChoice  # noqa: E402
from tuneforge.kernels.gemm_gpu.render import arguments, render, specialization  # noqa: E402


class Recorder:
    """Stands for the launchers: one per specialization asked for, each noting its launches."""

    def __init__(self) -> None:
        self.built: list[Any] = []  # the TritonBuild of each launcher made
        self.launches: list[tuple[Any, tuple[int, ...], list[Any]]] = []

    def launcher(self, request: Any, *, key: str | None = None) -> Any:
        self.built.append(request)

        def launch(grid: tuple[int, ...], args: list[Any], device: int) -> None:
            self.launches.append((request, tuple(grid), list(args)))

        return launch


@pytest.fixture
def recorder(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    found = Recorder()
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(triton_builder, "launcher", found.launcher)
    monkeypatch.setattr(triton_env, "device_target", lambda device: GpuTarget(arch=90))
    return found


def expected_args(kind: str, choice: GemmTritonChoice, a: Any, b: Any, out: Any, bias: Any, alpha: float,
                  beta: float) -> tuple[dict[str, Any], list[Any]]:
    """What the planned launch of `kind` must be given: (its constexprs, its run-time arguments)."""
    r = render(kind, choice.dtype, choice.epilogue)
    workspace = choice._workspace(a.shape[0], b.shape[1], a.device) if choice.gemm_config.split_k > 1 else None
    values = arguments(r, a, b, out, bias=bias, alpha=alpha, beta=beta, workspace=workspace)
    signature, fixed, _ = specialization(r, values)
    return fixed, [v for name, v in zip(r.runtime_params, values, strict=True) if signature[name] != "constexpr"]


def same(got: list[Any], want: list[Any]) -> bool:
    return len(got) == len(want) and all(g is w if hasattr(w, "data_ptr") else g == w for g, w in zip(got, want,
                                                                                                         strict=True))


@pytest.mark.parametrize("config", [Config(32, 64, 32, num_warps=4, num_stages=3),
                                    Config(32, 64, 32, split_k=4, num_warps=4, num_stages=3)])
def test_planned_launches_pass_what_arguments_and_specialization_say(recorder: Recorder, config: Config) -> None:
    m, n, k = 48, 80, 1024
    epilogue = Epilogue(bias=True, beta=True, activation="relu")
    choice = GemmTritonChoice(config, "float16", epilogue, GemmLayout.contiguous(m, n, k, bias=True))
    a, b = torch.randn(m, k).half(), torch.randn(k, n).half()
    out, bias = torch.empty(m, n).half(), torch.randn(n).half()
    choice.run([a, b, 2.0, 0.5, bias, out])
    assert len(recorder.launches) == len(config.kernels)
    for (request, _, got), kind in zip(recorder.launches, config.kernels, strict=True):
        fixed, want = expected_args(kind, choice, a, b, out, bias, 2.0, 0.5)
        assert same(got, want), (kind, got, want)
        assert all(request.constexprs[name] == value for name, value in fixed.items())
    # Again, other alpha and beta: the same launchers, nothing specialized anew, the new scalars passed.
    made = len(recorder.built)
    choice.run([a, b, 3.0, 0.25, bias, out])
    assert len(recorder.built) == made
    for (_, _, got), kind in zip(recorder.launches[-len(config.kernels):], config.kernels, strict=True):
        assert same(got, expected_args(kind, choice, a, b, out, bias, 3.0, 0.25)[1])


def test_another_layout_or_alignment_gets_its_own_specialization(recorder: Recorder) -> None:
    m, n, k = 64, 96, 128
    choice = GemmTritonChoice(Config(32, 32, 32, num_warps=4, num_stages=3), "float32", Epilogue(),
                              GemmLayout.contiguous(m, n, k))
    wide = torch.randn(m, 2 * k)
    b, out = torch.randn(k, n), torch.empty(m, n)
    for a in (wide[:, :k], torch.randn(m, k), wide[:, 1:k + 1]):  # row stride 2K; K; 2K 4 bytes off
        choice.run([a, b, 1.0, 0.0, None, out])
        request, _, got = recorder.launches[-1]
        fixed, want = expected_args("mm", choice, a, b, out, None, 1.0, 0.0)
        assert same(got, want) and request.constexprs["stride_am"] == a.stride(0)
        assert all(request.constexprs[name] == value for name, value in fixed.items())
    assert len(recorder.built) == 3  # one kernel per stride and alignment: none reused for another
    assert [r.constexprs["stride_am"] for r in recorder.built] == [2 * k, k, 2 * k]
    assert recorder.built[0].attrs != recorder.built[2].attrs  # the misaligned A loses its divisibility


def test_the_byte_extent_of_a_tensor_covers_its_first_to_past_its_last_element() -> None:
    from tuneforge.kernels.gemm_gpu import op

    x = torch.empty(6, 8, dtype=torch.float16)
    assert op._extent(x) == 6 * 8 * 2
    assert op._extent(x.t()) == 6 * 8 * 2
    assert op._extent(x[:, 2:5]) == (5 * 8 + 4 + 1 - 2) * 2  # from x[0, 2] to past x[5, 4]
    assert op._extent(x[::2]) == (4 * 8 + 8) * 2
    assert op._extent(x[:0]) == op._extent(None) == 0


@pytest.mark.gpu
def test_an_output_that_is_an_input_gets_the_product_of_the_inputs_as_they_were() -> None:
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    import tuneforge

    a = torch.randn(256, 256, device="cuda", dtype=torch.float16)
    b = torch.randn(256, 256, device="cuda", dtype=torch.float16)
    want = (a.float() @ b.float()).half()
    for _ in range(2):  # the tuning call, then the dispatched one
        x = a.clone()
        tuneforge.gemm(x, b, out=x)
        assert torch.allclose(x.float(), want.float(), rtol=2e-2, atol=2e-1)
