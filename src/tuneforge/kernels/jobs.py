"""One shipped op to tune for one shape, as plain data, and the selection it stands for.

`tuneforge tune` runs one; `tuneforge.distributed.tune_many` sends many to other machines, where each is turned
into its selection again (choices are rebuilt where they run, never shipped)::

    job = ShapeJob("gemm", 512, 512, 512, "float32")
    problem = tuning_problem(job)              # the candidates, input specs, output spec, reference, sample
    selection = run_job(job)                   # select_detailed() on it
"""

from __future__ import annotations

from typing import Any

from tuneforge.dataclass_lite import dataclass
from tuneforge.tune.choices import Choice
from tuneforge.tune.searched import SearchPlan
from tuneforge.tune.select import Selection, select_detailed
from tuneforge.tune.specs import TensorSpec

OPS = ("gemm", "matmul")
CPU_DTYPES = ("float32", "float64")
CUDA_DTYPES = ("float16", "bfloat16", "float32")


class JobError(ValueError):
    """A ShapeJob that cannot be tuned as given (the message names the field to change, `reason` says why)."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason or message


@dataclass(frozen=True)
class ShapeJob:
    """Tune `op` for ``C[M,N] = A[M,K] @ B[K,N]`` of `dtype` on `device` over the `space` of candidates."""

    op: str
    m: int
    n: int
    k: int
    dtype: str = "float32"
    device: str = "cpu"
    space: str = "default"

    def __post_init__(self) -> None:
        if self.op not in OPS:
            raise JobError(f"op must be one of {', '.join(OPS)}, not {self.op!r}")
        for name in ("m", "n", "k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise JobError(f"{name} must be a positive integer, not {value!r}")
        if self.device not in ("cpu", "cuda"):
            raise JobError(f"device must be 'cpu' or 'cuda', not {self.device!r}")
        if self.device == "cuda" and self.op != "gemm":
            raise JobError(f"{self.op} has no GPU family; device 'cuda' tunes gemm")
        dtypes = CUDA_DTYPES if self.device == "cuda" else CPU_DTYPES
        if self.dtype not in dtypes:
            raise JobError(f"dtype {self.dtype!r} is not tuned on {self.device}; use one of {', '.join(dtypes)}")
        if self.space not in ("default", "exhaustive"):
            raise JobError(f"space must be 'default' or 'exhaustive', not {self.space!r}")

    @property
    def label(self) -> str:
        """How reports name it: 'gemm 512x512x512 float32' (' cuda' added on the GPU)."""
        return f"{self.op} {self.m}x{self.n}x{self.k} {self.dtype}" + (" cuda" if self.device == "cuda" else "")


@dataclass
class TuningProblem:
    """What select() takes for one job."""

    name: str
    choices: list[Choice]
    inputs: list[Any]  # input specs and scalars, in the choices' argument order
    out: TensorSpec
    reference: Choice | None  # None: the first choice
    sample: Any  # a RowSample (rank on the first rows of a large problem) or None

    def example_bytes(self) -> int:
        """Memory the example inputs and output take."""
        specs = [x for x in (*self.inputs, self.out) if isinstance(x, TensorSpec)]
        return sum(spec.storage_size * spec.itemsize for spec in specs)


def tuning_problem(job: ShapeJob) -> TuningProblem:
    """The candidates and inputs of `job`'s selection (GPU jobs: JobError where no GPU can be used)."""
    m, n, k = job.m, job.n, job.k
    if job.device == "cuda":
        from tuneforge.kernels.gemm_gpu.op import cuda_unavailable
        from tuneforge.kernels.gemm_gpu.op import tuning_problem as gpu_problem

        why = cuda_unavailable()
        if why is not None:
            raise JobError(f"device 'cuda': {why}", why)
        choices, specs, out, reference = gpu_problem(m, n, k, job.dtype, job.space)
        return TuningProblem(job.op, choices, specs, out, reference, None)
    inputs: list[Any] = [TensorSpec.contiguous((m, k), job.dtype), TensorSpec.contiguous((k, n), job.dtype)]
    out = TensorSpec.contiguous((m, n), job.dtype)
    if job.op == "gemm":
        from tuneforge.kernels.gemm import Problem
        from tuneforge.kernels.gemm import choices as gemm_choices
        from tuneforge.kernels.gemm.op import sample_for

        problem = Problem(m, n, k, job.dtype)
        return TuningProblem(job.op, gemm_choices(problem, job.space), [*inputs, 1.0, 0.0, None], out, None,
                             sample_for(problem))
    from tuneforge.kernels import matmul as family

    return TuningProblem(job.op, family.choices(job.dtype, job.space), inputs, out, None, None)


def run_job(job: ShapeJob, *, strategy: SearchPlan | None = None) -> Selection:
    """Select among `job`'s candidates (records first, else measured here)."""
    problem = tuning_problem(job)
    return select_detailed(problem.name, problem.choices, problem.inputs, out=problem.out,
                           reference=problem.reference, sample=problem.sample, strategy=strategy)
