"""tuneforge.gemm on CPU torch tensors: zero-copy views for the kernels, torch.matmul as a candidate."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="CPU torch tensors need torch")

import torch

import tuneforge
from tuneforge.kernels.gemm import clear_dispatch, op
from tuneforge.kernels.gemm.space import Problem
from tuneforge.store.default import default_records
from tuneforge.tune.select import clear_memo

from .conftest import run_python


@pytest.fixture(autouse=True)
def fresh(cache_dir: Path) -> None:
    clear_memo()
    clear_dispatch()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gemm_on_cpu_tensors_writes_into_the_tensor(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    a, b = torch.randn(33, 20, dtype=dtype), torch.randn(20, 17, dtype=dtype)
    out = torch.full((33, 17), float("nan"), dtype=dtype)
    assert tuneforge.gemm(a, b, out) is out
    torch.testing.assert_close(out, a @ b)
    made = tuneforge.gemm(a, b)  # allocated: a tensor, like the inputs
    assert isinstance(made, torch.Tensor) and made.dtype == dtype
    torch.testing.assert_close(made, a @ b)
    bias, c = torch.randn(17, dtype=dtype), torch.randn(33, 17, dtype=dtype)
    expected = 0.5 * (a @ b) + 2.0 * c + bias
    tuneforge.gemm(a, b, c, alpha=0.5, beta=2.0, bias=bias)
    torch.testing.assert_close(c, expected)


def test_strided_views_are_taken_as_they_are() -> None:
    base = torch.randn(40, 60)
    a, b = base[:30:2, :20], base[:20, 10:50].t().contiguous().t()  # every other row; column-major
    out = torch.empty(15, 40)
    tuneforge.gemm(a, b, out)
    torch.testing.assert_close(out, a @ b)


def test_torch_matmul_is_the_library_candidate_for_tensors_and_numpy_for_arrays() -> None:
    # numpy's OpenBLAS threads would fight torch's OpenMP team in a torch program: never picked for tensors
    for_tensors = [c.name for c in op.choices(Problem(64, 64, 64, "float32"), library="torch")]
    for_arrays = [c.name for c in op.choices(Problem(64, 64, 64, "float32"))]
    assert for_tensors[0] == "torch_matmul" and "numpy_matmul" not in for_tensors
    assert for_arrays[0] == "numpy_matmul" and "torch_matmul" not in for_arrays
    assert for_tensors[1:] == for_arrays[1:]
    a, b = torch.randn(64, 64), torch.randn(64, 64)
    tuneforge.gemm(a, b)
    tuned = {r.choice_name for r in default_records().records()}
    assert "torch_matmul" in tuned and {r.op for r in default_records().records()} == {"gemm_torch"}


def test_the_library_extern_computes_the_epilogue() -> None:
    from tuneforge.kernels.gemm.torch_cpu import torch_gemm

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((5, 7)), rng.standard_normal((7, 3))
    bias, out = rng.standard_normal(3), np.full((5, 3), np.nan)
    torch_gemm(a, b, 2.0, 0.0, bias, out)
    np.testing.assert_allclose(out, 2.0 * (a @ b) + bias)
    before = out.copy()
    torch_gemm(a, b, 1.0, 0.5, None, out)
    np.testing.assert_allclose(out, a @ b + 0.5 * before)


def test_bad_tensors_name_the_argument() -> None:
    a = torch.randn(4, 4)
    with pytest.raises(ValueError, match=r"requires grad; pass b\.detach\(\)"):
        tuneforge.gemm(a, torch.randn(4, 4, requires_grad=True))
    with pytest.raises(TypeError, match="b must be one too"):
        tuneforge.gemm(a, np.ones((4, 4), np.float32))
    with pytest.raises(ValueError, match="float32 and float64; a is torch.float16"):
        tuneforge.gemm(a.half(), a.half())
    with pytest.raises(ValueError, match="beta != 0 needs an out tensor"):
        tuneforge.gemm(a, a, beta=1.0)


def test_numpy_callers_never_import_torch(cache_dir: Path) -> None:
    out = run_python("""
        import sys
        import numpy as np
        import tuneforge
        tuneforge.gemm(np.ones((8, 8), np.float32), np.ones((8, 8), np.float32))
        print("torch" in sys.modules)
    """).stdout
    assert out.strip().splitlines()[-1] == "False"


# Only the first two-thread kernel is tuned; the tensor calls, then the array calls, report which of the
# process's threads ran: tuneforge's own pool is named "tuneforge-pool", torch's OpenMP workers are not.
_TEAM_CHILD = """
import os
import numpy as np
import torch
import tuneforge
from tuneforge.kernels.gemm import op

everything = op.choices
op.choices = lambda problem, space="default", library="numpy": [
    c for c in everything(problem, space, library) if getattr(c, "config", {}).get("threads") == 2][:1]


def cpu_ticks():
    # CPU time (clock ticks) of this process's threads but the main one: tuneforge's pool's, and the others'
    ticks = {"pool": 0, "others": 0}
    for t in os.listdir("/proc/self/task"):
        if int(t) != os.getpid():
            name = open(f"/proc/self/task/{t}/comm").read().strip()
            fields = open(f"/proc/self/task/{t}/stat").read().rpartition(")")[2].split()
            ticks["pool" if name == "tuneforge-pool" else "others"] += int(fields[11]) + int(fields[12])
    return ticks


def ran(calls):
    before = cpu_ticks()
    for _ in range(200):
        calls()
    after = cpu_ticks()
    return after["pool"] - before["pool"], after["others"] - before["others"]


a, b = torch.randn(300, 700), torch.randn(700, 400)
for _ in range(3):
    out = tuneforge.gemm(a, b)
torch.testing.assert_close(out, a @ b, rtol=1e-4, atol=1e-3)
print("tensors", *ran(lambda: tuneforge.gemm(a, b)))
x, y = a.numpy().copy(), b.numpy().copy()
for _ in range(3):
    tuneforge.gemm(x, y)
np.testing.assert_allclose(tuneforge.gemm(x, y), x @ y, rtol=1e-4, atol=1e-3)
print("arrays", *ran(lambda: tuneforge.gemm(x, y)))
"""


def test_tensor_calls_run_on_torchs_openmp_team_and_array_calls_on_the_kernels_pool(tmp_path: Path) -> None:
    """A kernel called for torch tensors shares torch's OpenMP workers (whose spinning after torch's own ops would
    otherwise take the cores from a pool of its own); for numpy arrays it keeps its pool (pool.cpp: why)."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("a two-thread kernel needs two CPUs")
    proc = run_python(_TEAM_CHILD, env={"TUNEFORGE_CACHE_DIR": str(tmp_path), "OMP_NUM_THREADS": "2",
                                        "TUNEFORGE_AUTOTUNE_BENCH_TIME_S": "0.003"}, timeout=300)
    ticks = {line.split()[0]: tuple(map(int, line.split()[1:])) for line in proc.stdout.splitlines()}
    # CPU ticks of (tuneforge's pool, other threads) over 200 calls: the tensor calls' helper is torch's
    assert ticks["tensors"][0] == 0 and ticks["tensors"][1] > 0, proc.stdout
    assert ticks["arrays"][0] > 0, proc.stdout


_PROBE = """
import os
import sys

from tuneforge.tune.choices import ExternChoice


class NativeExtern(ExternChoice):  # counts as compiled code: its trials go to the isolated worker
    is_native = True


def torch_was_loaded(out):
    with open(os.environ["PROBE_LOG"], "a") as log:  # the worker's view, on each run
        log.write(f"{int('torch' in sys.modules)}\\n")
"""

_PRELOAD_CHILD = """
import sys
import numpy as np
{torch}
import tuneforge
from probe import NativeExtern, torch_was_loaded

for framework in __import__("os").environ["FRAMEWORKS"].split():
    out = np.zeros(1) if framework == "numpy" else __import__("torch").zeros(1)
    choices = [NativeExtern(torch_was_loaded, name="first"), NativeExtern(torch_was_loaded, name="second")]
    report = tuneforge.select_detailed("preload_probe_" + framework, choices, [], out=out).report
    print(int(report.isolated), "torch" in sys.modules)
    with open(__import__("os").environ["PROBE_LOG"], "a") as log:
        log.write("-\\n")
"""


@pytest.mark.parametrize(("parent_has_torch", "frameworks", "expected"), [
    (True, ["numpy"], ["0"]),  # the parent's torch is not the selection's: the worker leaves it to the builds' cores
    (False, ["numpy"], ["0"]),
    (False, ["torch"], ["1"]),  # torch tensors: imported before the first trial
    (True, ["numpy", "torch"], ["0", "1"]),  # a worker that runs on is told to import it before its next job
])
def test_a_worker_imports_torch_before_its_first_trial_when_the_job_needs_it(
        tmp_path: Path, parent_has_torch: bool, frameworks: list[str], expected: list[str]) -> None:
    """A choice on torch tensors would otherwise import it (2 s) in its first, checked, run in the worker."""
    (tmp_path / "probe.py").write_text(_PROBE)
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r})\n" + _PRELOAD_CHILD.format(
        torch="import torch" if parent_has_torch else "")
    log = tmp_path / "probe.log"
    proc = run_python(code, env={"TUNEFORGE_CACHE_DIR": str(tmp_path / "cache"), "PROBE_LOG": str(log),
                                 "FRAMEWORKS": " ".join(frameworks)}, timeout=300)
    assert proc.stdout.split()[::2] == ["1"] * len(frameworks), proc.stdout
    selections = [runs.split() for runs in log.read_text().split("-")[:-1]]
    assert len(selections) == len(frameworks)
    for runs, loaded in zip(selections, expected, strict=True):
        assert len(runs) > 2 and set(runs) == {loaded}, selections


def test_jobs_name_torch_for_torch_arguments_and_a_running_worker_imports_it_on_request(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tuneforge.tune.job import TrialJob
    from tuneforge.tune.specs import TensorSpec
    from tuneforge.tune.worker_process import WorkerProcess

    def job(framework: str) -> TrialJob:
        spec = TensorSpec("float32", (4, 4), (4, 1), framework=framework)
        return TrialJob(name="probe", key="k", outputs=[1], arg_specs=[spec], out_spec=spec)

    assert job("numpy").libraries() == () and job("torch").libraries() == ("torch",)
    (tmp_path / "import_probe.py").write_text(
        f"open({str(tmp_path / 'imported')!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # the worker takes this process's sys.path
    worker = WorkerProcess("cpu", ())
    try:
        worker.wait_ready()
        assert not (tmp_path / "imported").exists()
        worker.load(["import_probe"])
        worker.load(["import_probe"])  # asked once
        worker.send(("exit",))
        assert worker.proc.wait(timeout=60) == 0
    finally:
        worker.kill()
    assert (tmp_path / "imported").exists() and worker.libraries == {"import_probe"}
