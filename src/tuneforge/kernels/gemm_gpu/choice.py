"""One configuration of the Triton GEMM family as a choice of ``select()``, and cuBLAS beside it.

A `GemmTritonChoice` is called like the CPU family's choices, with ``(a, b, alpha, beta, bias, out)``
(``out = act(alpha * a @ b + beta * out + bias)``), so records and reports of both look alike.

On a GPU it builds its kernel(s) (``mm``, or ``splitk`` + ``splitk_reduce``) as `TritonBuild`s for the
current device, specialized as Triton's JIT would specialize them for the layout it is tuned for (unit
strides as constexprs, ``tt.divisibility`` for 16-byte-aligned pointers and multiples of 16), and
launches the stored cubins. A call whose layout specializes differently (another alignment) gets a
kernel of its own, loaded (or compiled) once. Under Triton's interpreter the ``@triton.jit`` functions
run on CPU tensors instead, which is how this is tested without a GPU.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from dataclasses import asdict
from typing import Any

from tuneforge.compile.triton_env import build_target
from tuneforge.dataclass_lite import dataclass
from tuneforge.hashing import key_hash
from tuneforge.kernels.gemm_gpu.render import (
    GRIDS,
    Config,
    Epilogue,
    Rendered,
    arguments,
    constexprs,
    render,
    specialization,
    workspace_shape,
)
from tuneforge.tune.choices import Builder, ConfiguredChoice, completed_future, failed_future
from tuneforge.tune.triton_template import interpreting

__all__ = ["FAMILY", "GemmLayout", "GemmTritonChoice", "torch_gemm"]

FAMILY = "triton:gemm_gpu"
ALIGN = 16  # bytes: what tt.divisibility promises for a pointer
_MAX_PLANS = 64  # launch plans kept per choice (one per layout and alignment it was called with)


@dataclass(frozen=True)
class GemmLayout:
    """What a build specializes on: the sizes, the element strides, and which pointers are 16-byte aligned
    (a, b, out, bias). ``bias_stride`` is None without a bias."""

    m: int
    n: int
    k: int
    a_strides: tuple[int, int]
    b_strides: tuple[int, int]
    out_strides: tuple[int, int]
    bias_stride: int | None = None
    aligned: tuple[bool, bool, bool, bool] = (True, True, True, True)

    @classmethod
    def contiguous(cls, m: int, n: int, k: int, bias: bool = False) -> GemmLayout:
        """Row-major operands in fresh (aligned) allocations: what `select` makes its example inputs as."""
        return cls(m, n, k, (k, 1), (n, 1), (n, 1), 1 if bias else None)

    @classmethod
    def of(cls, a: Any, b: Any, out: Any, bias: Any = None) -> GemmLayout:
        """The layout of torch tensors a (MxK), b (KxN), out (MxN) and bias (N)."""
        pointers = [t.data_ptr() % ALIGN == 0 if t is not None else True for t in (a, b, out, bias)]
        return cls(int(a.shape[0]), int(b.shape[1]), int(a.shape[1]), tuple(a.stride()), tuple(b.stride()),
                   tuple(out.stride()), None if bias is None else int(bias.stride(0)),
                   (pointers[0], pointers[1], pointers[2], pointers[3]))


class _Probe:
    """A tensor's sizes, strides and address alignment: all that `arguments` and `specialization` read."""

    def __init__(self, shape: tuple[int, ...], strides: tuple[int, ...], aligned: bool) -> None:
        self.shape, self._strides, self._address = shape, strides, 0 if aligned else 2

    def stride(self, dim: int | None = None) -> Any:
        return self._strides if dim is None else self._strides[dim]

    def data_ptr(self) -> int:
        return self._address


def _probes(layout: GemmLayout, config: Config) -> tuple[_Probe, _Probe, _Probe, _Probe | None, _Probe]:
    m, n, k, aligned = layout.m, layout.n, layout.k, layout.aligned
    bias = None if layout.bias_stride is None else _Probe((n,), (layout.bias_stride,), aligned[3])
    splits, rows, cols = workspace_shape(config, m, n)
    return (_Probe((m, k), layout.a_strides, aligned[0]), _Probe((k, n), layout.b_strides, aligned[1]),
            _Probe((m, n), layout.out_strides, aligned[2]), bias, _Probe((splits, rows, cols), (rows * cols, cols, 1),
                                                                          True))


class GemmTritonChoice(ConfiguredChoice):
    """One `Config` of the Triton GEMM family for one dtype and epilogue; see the module."""

    is_native = True  # a kernel can take the process (or the GPU context) down with it: trials isolated

    def __init__(self, config: Config, dtype: str, epilogue: Epilogue, layout: GemmLayout) -> None:
        self.gemm_config = config
        self.dtype = dtype
        self.epilogue = epilogue
        self.layout = layout
        self.config = config.as_dict()
        kind = "splitk" if config.split_k > 1 else "mm"
        self.name = f"triton_{kind}_{config.name}"
        sources = [hashlib.sha256(render(k, dtype, epilogue).source.encode()).hexdigest() for k in config.kernels]
        # The layout is left out: it only says which specialization to build ahead; run() specializes
        # for the tensors it is given, so the code that runs is decided by what is hashed here.
        self._hash = "tgm" + key_hash({"family": FAMILY, "kernels": list(config.kernels), "dtype": dtype,
                                       "epilogue": asdict(epilogue), "config": self.config, "sources": sources})
        self.artifact_keys: dict[str, str] = {}  # kernel kind -> its artifact, once built for `layout`
        self.key_hints: dict[str, str] = {}  # kernel kind -> the artifact its record names
        self._kernels: dict[tuple[Any, ...], Any] = {}
        self._plans: dict[tuple[Any, ...], list[tuple[Any, Any, list[str]]]] = {}  # see run()
        self._workspaces: dict[tuple[Any, ...], Any] = {}

    @property
    def family(self) -> str:
        return FAMILY

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_kernels": {}, "_plans": {}, "_workspaces": {}}  # loaded kernels stay here

    # ---------------------------------------------------------------------------------------------- build

    def triton_builds(self, layout: GemmLayout | None = None, target: Any = None) -> dict[str, Any]:
        """The `TritonBuild` of each kernel, specialized for `layout` (default: the one it is tuned for),
        for `target` (a GpuTarget; None: this process's GPU)."""
        layout = layout or self.layout
        a, b, out, bias, workspace = _probes(layout, self.gemm_config)
        return {kind: self._build(render(kind, self.dtype, self.epilogue), a, b, out, bias, workspace, target)
                for kind in self.gemm_config.kernels}

    def _build(self, r: Rendered, a: Any, b: Any, out: Any, bias: Any, workspace: Any, target: Any) -> Any:
        values = arguments(r, a, b, out, bias=bias, alpha=1.0, beta=1.0, workspace=workspace)
        return self._request(r, specialization(r, values), int(a.shape[0]), int(b.shape[1]), int(a.shape[1]),
                             target)

    def _request(self, r: Rendered, specialized: tuple[dict[str, str], dict[str, int], Any], m: int, n: int,
                 k: int, target: Any) -> Any:
        """The `TritonBuild` of kernel `r` for `specialization`'s answer on an m x n x k problem."""
        from tuneforge.compile.triton import TritonBuild

        signature, fixed, attrs = specialized
        consts = {**fixed, **constexprs(r.kind, self.gemm_config, m, n, k)}
        return TritonBuild(r.source, r.name, signature, consts, num_warps=self.gemm_config.num_warps,
                           num_stages=self.gemm_config.num_stages, target=target, attrs=_attrs(attrs))

    def build(self, builder: Builder | None = None) -> Future[Any]:
        if interpreting():
            return completed_future()  # the interpreter runs the sources themselves: nothing to compile
        try:
            # The target resolved here: the build pool's workers then need no GPU of their own.
            requests = self.triton_builds(target=build_target())
            if self._stored_as_recorded(requests):
                return completed_future([])  # a warm start: keying a build would import Triton (~150 ms)
            if builder is None:
                from tuneforge.compile import triton as triton_builder

                artifacts = {kind: triton_builder.build(request) for kind, request in requests.items()}
                self.artifact_keys = {kind: artifact.key for kind, artifact in artifacts.items()}
                return completed_future(list(artifacts.values()))
            futures = {kind: builder.submit(request, label=f"{self.name}:{kind}") for kind, request in requests.items()}
        except Exception as exc:  # e.g. no GPU to target, a compile error: this choice's own failure
            return failed_future(exc)
        for kind, future in futures.items():  # before _all's own callbacks: keys known once the builds are
            future.add_done_callback(functools.partial(self._built, kind))
        return _all(list(futures.values()))

    def _stored_as_recorded(self, requests: Mapping[str, Any]) -> bool:
        """Whether a tuning record named a stored entry for each of `requests` that was built from it
        (compile/triton.stored_entry, which needs no Triton): then nothing is built, and those keys are used."""
        if not self.key_hints or not set(requests) <= set(self.key_hints):
            return False
        from tuneforge.compile.triton import stored_entry

        found = {kind: stored_entry(self.key_hints[kind], request) for kind, request in requests.items()}
        if not all(entry is not None for entry in found.values()):
            return False
        self.artifact_keys = {kind: self.key_hints[kind] for kind in requests}
        return True

    def _built(self, kind: str, future: Future[Any]) -> None:
        if future.exception() is None:
            self.artifact_keys[kind] = str(future.result().key)

    def record_hints(self) -> dict[str, str]:
        """Once built: the artifact key of each kernel for the layout it was tuned for, so that a warm
        start launches them without importing Triton (see `use_record`)."""
        if set(self.artifact_keys) != set(self.gemm_config.kernels):
            return {}
        return {"artifacts": ",".join(f"{kind}={key}" for kind, key in sorted(self.artifact_keys.items()))}

    def use_record(self, info: Mapping[str, Any]) -> None:
        """Take the artifact keys the record kept; each is trusted only for the build it was made from
        (compile/triton.stored_entry), so a call of another layout builds its own kernels as before."""
        hints = info.get("artifacts")
        if isinstance(hints, str):
            pairs = (item.partition("=") for item in hints.split(","))
            self.key_hints = {kind: key for kind, _, key in pairs if kind in self.gemm_config.kernels and key}

    # ------------------------------------------------------------------------------------------------ run

    def run(self, args: Sequence[Any]) -> Any:
        a, b, alpha, beta, bias, out = args
        if interpreting():
            return self._run_interpreted(a, b, alpha, beta, bias, out)
        # Everything a launch needs but the pointers and alpha/beta follows from sizes, strides and the
        # pointers' alignment (they decide the kernel's specialization): planned once per such key, a call
        # then costs a dict lookup and the launches (arguments() and specialization() took ~30 us a call).
        key = (a.shape, b.shape, a.stride(), b.stride(), out.stride(), a.device.index, a.data_ptr() % ALIGN == 0,
               b.data_ptr() % ALIGN == 0, out.data_ptr() % ALIGN == 0,
               None if bias is None else (bias.stride(0), bias.data_ptr() % ALIGN == 0))
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plan(a, b, alpha, beta, bias, out)
            if len(self._plans) >= _MAX_PLANS:
                self._plans.clear()
            self._plans[key] = plan
        values = {"a_ptr": a, "b_ptr": b, "c_ptr": out, "bias_ptr": bias, "alpha": alpha, "beta": beta}
        if self.gemm_config.split_k > 1:
            values["ws_ptr"] = self._workspace(int(a.shape[0]), int(b.shape[1]), a.device)
        device = a.device.index
        for kernel, grid, names in plan:
            kernel(grid, [values[name] for name in names], device)
        return out

    def _plan(self, a: Any, b: Any, alpha: float, beta: float, bias: Any, out: Any) -> list[tuple[Any, Any, list[str]]]:
        """(launcher, grid, the names of its run-time arguments) per kernel, for tensors like these."""
        (m, k), n = a.shape, b.shape[1]
        config = self.gemm_config
        workspace = self._workspace(m, n, a.device) if config.split_k > 1 else None
        plan = []
        for kind in config.kernels:
            r = render(kind, self.dtype, self.epilogue)
            values = arguments(r, a, b, out, bias=bias, alpha=alpha, beta=beta, workspace=workspace)
            kernel, picks = self._kernel(r, values, m, n, k, a.device.index)
            plan.append((kernel, GRIDS[kind](config, m, n, k), [r.runtime_params[i] for i in picks]))
        return plan

    def _run_interpreted(self, a: Any, b: Any, alpha: float, beta: float, bias: Any, out: Any) -> Any:
        (m, k), n = a.shape, b.shape[1]
        config = self.gemm_config
        workspace = self._workspace(m, n, a.device) if config.split_k > 1 else None
        for kind in config.kernels:
            r = render(kind, self.dtype, self.epilogue)
            values = arguments(r, a, b, out, bias=bias, alpha=alpha, beta=beta, workspace=workspace)
            self._interpreted(r, m, n, k)[GRIDS[kind](config, m, n, k)](
                *values, **constexprs(kind, config, m, n, k), num_warps=config.num_warps, num_stages=config.num_stages)
        return out

    def _workspace(self, m: int, n: int, device: Any) -> Any:
        """The split-K partial sums, allocated once per shape and device (kernels of one stream reuse it)."""
        key = (m, n, str(device))
        found = self._workspaces.get(key)
        if found is None:
            import torch

            found = torch.empty(workspace_shape(self.gemm_config, m, n), dtype=torch.float32, device=device)
            self._workspaces = {key: found}  # one shape at a time: a choice is tuned and called per layout
        return found

    def _interpreted(self, r: Rendered, m: int, n: int, k: int) -> Any:
        found = self._kernels.get((r.kind, "interpreted"))
        if found is None:
            from tuneforge.compile.triton import TritonBuild, jit_function

            consts = constexprs(r.kind, self.gemm_config, m, n, k)
            found = jit_function(TritonBuild(r.source, r.name, r.signature, consts))
            self._kernels[(r.kind, "interpreted")] = found
        return found

    def _kernel(self, r: Rendered, values: tuple[Any, ...], m: int, n: int, k: int,
                device: int) -> tuple[Any, list[int]]:
        """The launcher of `r` specialized for `values` on `device`, and the places of its run-time arguments
        among `values` (loaded once per specialization)."""
        specialized = specialization(r, values)
        signature, fixed, attrs = specialized
        memo = (r.kind, m, n, k, tuple(sorted(fixed.items())), tuple(attrs), device)
        found: tuple[Any, list[int]] | None = self._kernels.get(memo)
        if found is None:
            from tuneforge.compile import triton as triton_builder
            from tuneforge.compile.triton_env import device_target

            request = self._request(r, specialized, m, n, k, device_target(device))
            # The launcher takes the arguments not specialized away, by their place among `values`.
            picks = [i for i, name in enumerate(r.runtime_params) if signature[name] != "constexpr"]
            found = (triton_builder.launcher(request, key=self.key_hints.get(r.kind)), picks)
            self._kernels[memo] = found
        return found


def _attrs(attrs: Mapping[tuple[int], Any]) -> dict[tuple[int, ...], Any]:
    return {tuple(where): pairs for where, pairs in attrs.items()}


def _all(futures: list[Future[Any]]) -> Future[Any]:
    """One future for several builds: their results in order, or the first failure."""
    combined: Future[Any] = Future()
    left = [len(futures)]

    def done(_: Future[Any]) -> None:
        if combined.done():
            return
        failed = next((f.exception() for f in futures if f.done() and f.exception() is not None), None)
        if failed is not None:
            combined.set_exception(failed)
            return
        left[0] -= 1
        if left[0] == 0:
            combined.set_result([f.result() for f in futures])

    for future in futures:
        future.add_done_callback(done)
    return combined


def torch_gemm(a: Any, b: Any, alpha: float, beta: float, bias: Any, out: Any = None, *,
               activation: str = "none", tf32: bool = False) -> Any:
    """The library reference: torch.mm / torch.addmm (cuBLAS on CUDA tensors) with the epilogue
    ``out = act(alpha * a @ b + beta * out + bias)``; allocates `out` when it is None (and beta is 0).
    float32 products use TF32 exactly when `tf32` is true, whatever torch's own flag says."""
    import torch

    if out is None:
        if beta != 0:
            raise ValueError("beta != 0 needs an out tensor to accumulate into")
        out = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    matmul = torch.backends.cuda.matmul
    flag = matmul.allow_tf32
    if flag != tf32:
        matmul.allow_tf32 = tf32
    try:
        _products(torch, a, b, alpha, beta, bias, out)
    finally:
        if flag != tf32:
            matmul.allow_tf32 = flag
    if activation == "relu":
        out.relu_()
    elif activation == "silu":
        torch.nn.functional.silu(out, inplace=True)
    elif activation == "gelu_tanh":
        out.copy_(torch.nn.functional.gelu(out, approximate="tanh"))
    elif activation != "none":
        raise ValueError(f"unknown activation {activation!r}")
    return out


def _products(torch: Any, a: Any, b: Any, alpha: float, beta: float, bias: Any, out: Any) -> None:
    if beta == 0 and bias is None and alpha == 1:
        torch.mm(a, b, out=out)
    elif beta == 0 and bias is not None:
        torch.addmm(bias, a, b, alpha=alpha, out=out)  # cuBLASLt's bias epilogue
    else:  # beta == 0: addmm ignores out's contents (NaN included)
        out.addmm_(a, b, beta=beta, alpha=alpha)
        if bias is not None:
            out.add_(bias)
