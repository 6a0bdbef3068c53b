"""Shared fixtures: every test gets its own cache directory; helpers to run code in a fresh process."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

# Never touch the user's real cache: the whole session (and its child processes) use a scratch dir.
# Set before tuneforge is imported, because settings are read from the environment at import.
os.environ["TUNEFORGE_CACHE_DIR"] = tempfile.mkdtemp(prefix="tuneforge-tests-")

# A suite started in the background of a shell without job control (`pytest &` in a script) inherits SIGINT
# ignored, and so would every tuneforge process the tests start: Python installs no KeyboardInterrupt handler then,
# and the Ctrl-C tests (a tuning interrupted, the driver of a cluster) would see their commands run to the end.
# An ignored disposition survives exec; a handled one is reset to the default there.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

from tuneforge import config

# In CI a missing test dependency fails the run: the tests that need it would otherwise skip, and a
# green run would hide that nothing of the kind was tested. .ci/run sets CI=true (and installs them).
CI_COMMANDS = ("g++", "redis-server", "chromium")
CI_MODULES = ("torch", "redis", "zstandard", "triton", "sklearn", "ray", "plotly")
_IMPORT_PROBE = """
import importlib, sys
for name in sys.argv[1:]:
    try:
        importlib.import_module(name)
    except Exception as exc:
        print(f"python module {name} ({type(exc).__name__}: {exc})")
"""


def missing_test_dependencies() -> list[str]:
    """What the suite needs that is not here; the modules are imported in a child process, so torch's
    threads and allocator never enter the process that forks the test workers."""
    missing = [f"{name} (not on PATH)" for name in CI_COMMANDS if shutil.which(name) is None]
    proc = subprocess.run([sys.executable, "-c", _IMPORT_PROBE, *CI_MODULES], capture_output=True, text=True,
                          timeout=300)
    missing += proc.stdout.splitlines()
    from tuneforge.compile.cuda_toolchain import find_nvcc, find_nvrtc

    missing += [f"{name} (the CUDA builder's tests)" for name, path in (("nvcc", find_nvcc()), ("NVRTC", find_nvrtc()))
                if path is None]
    if proc.returncode != 0:
        missing.append(f"the import check itself failed: {proc.stderr.strip()[-300:]}")
    return missing


def pytest_configure() -> None:
    if os.environ.get("CI", "").strip().lower() not in ("true", "1", "yes"):
        return
    missing = missing_test_dependencies()
    if missing:
        raise pytest.UsageError("CI is set, and these test dependencies are missing (their tests would be "
                                "skipped, not run): " + "; ".join(missing) + ". Install them (bash .ci/run "
                                "does), or unset CI to let those tests skip.")


@pytest.fixture
def cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """An empty cache directory used by this process and by any child process the test starts."""
    root = tmp_path / "cache"
    monkeypatch.setenv("TUNEFORGE_CACHE_DIR", str(root))
    with config.patch(cache_dir=root):
        yield root


def cuda_torch() -> Any:
    """torch, where it has a CUDA GPU; else the test is skipped, saying why (a gpu test's first line)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    return torch


def run_python(code: str, *, env: dict[str, str] | None = None, check: bool = True,
               timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter with the current environment (plus `env`)."""
    full_env = {**os.environ, **(env or {})}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full_env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"child failed ({proc.returncode}):\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    return proc


@pytest.fixture
def wrapper_compiler(tmp_path: Path) -> Path:
    """A compiler wrapper that logs each real compile (not probes) and can be told to refuse them."""
    log = tmp_path / "compiler.log"
    script = tmp_path / "logging-g++"
    script.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        case " $* " in
          *" -shared "*)
            echo "$*" >> {log}
            if [ -n "$TUNEFORGE_TEST_FORBID_COMPILE" ]; then echo "compiler forbidden" >&2; exit 97; fi
            if [ -n "$TUNEFORGE_TEST_SLOW_COMPILE" ]; then sleep "$TUNEFORGE_TEST_SLOW_COMPILE"; fi
            ;;
        esac
        exec g++ "$@"
        """))
    script.chmod(0o755)
    return script


from .redis_server import redis_clean, redis_private, redis_url  # noqa: E402, F401


@pytest.fixture
def gemm_tuning(cache_dir: Path) -> Iterator[Path]:
    """For tuneforge.gemm tests: fast benchmarks, an empty cache, no memo and no prepared calls."""
    from tuneforge.kernels.gemm import clear_dispatch
    from tuneforge.tune.select import clear_memo

    clear_memo()
    clear_dispatch()
    with config.patch(autotune_bench_time_s=0.003, autotune_warmup_s=0.0, autotune_min_repeats=2):
        yield cache_dir
    clear_dispatch()


@pytest.fixture
def torch_tuning(gemm_tuning: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """gemm_tuning for torch tests: Inductor's caches of their own (a graph compiled by an earlier run would skip the
    passes a test watches), Dynamo's caches and counters reset."""
    import torch
    from torch._dynamo.utils import counters

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    torch._dynamo.reset()
    counters.clear()
    yield gemm_tuning
    torch._dynamo.reset()


@contextlib.contextmanager
def tuning_in_process(cache_dir: Path, *, bench_time_s: float, min_repeats: int) -> Iterator[Path]:
    """For select() tests timing their own choices: no memo before or after, trials in this process, no warm-up
    and no settling pauses."""
    from tuneforge.tune.select import clear_memo

    clear_memo()
    with config.patch(autotune_bench_time_s=bench_time_s, autotune_warmup_s=0.0, autotune_min_repeats=min_repeats,
                      autotune_isolate=False, autotune_settle_s=0.0):
        yield cache_dir
    clear_memo()


@pytest.fixture
def quick_tuning(cache_dir: Path) -> Iterator[Path]:
    """For select() tests: an empty cache, no memo, and benchmarks cut to a few milliseconds."""
    from tuneforge.tune.select import clear_memo

    clear_memo()
    with config.patch(autotune_bench_time_s=0.003, autotune_warmup_s=0.0, autotune_min_repeats=2,
                      autotune_settle_s=0.0):
        yield cache_dir
    clear_memo()
