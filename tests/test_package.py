from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import run_python

HEAVY = ("torch", "ray", "redis", "triton", "numpy", "rich", "jinja2", "ctypes")


def test_import_is_light() -> None:
    out = run_python(f"""
        import sys, time, json
        t = time.perf_counter()
        import tuneforge
        elapsed = time.perf_counter() - t
        print(json.dumps([[m for m in {HEAVY!r} if m in sys.modules], elapsed]))
    """).stdout
    loaded, _elapsed = json.loads(out)
    assert loaded == []  # the time itself is measured in benchmarks/codecache.py, not asserted here


def test_public_names() -> None:
    out = run_python("""
        import tuneforge
        print(tuneforge.__version__, callable(tuneforge.cpp.load), callable(tuneforge.cpp.load_module),
              callable(tuneforge.python.load), issubclass(tuneforge.CompileError, tuneforge.TuneforgeError))
    """).stdout.split()
    assert out[1:] == ["True"] * 4


# --- CI must fail, not skip, when a test dependency cannot be installed ---------------------------------

REPO = Path(__file__).resolve().parent.parent


def inner_pytest(env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """Run one quick test of this suite in a child pytest, with `env` over the current environment."""
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/test_package.py::test_public_names"], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "TUNEFORGE_CACHE_DIR": str(tmp_path / "cache"), **env}, timeout=300)


def test_in_ci_a_missing_command_fails_the_run_instead_of_skipping(tmp_path: Path) -> None:
    empty = tmp_path / "empty-path"
    empty.mkdir()
    refused = inner_pytest({"CI": "true", "PATH": str(empty)}, tmp_path)
    out = refused.stdout + refused.stderr
    assert refused.returncode == pytest.ExitCode.USAGE_ERROR, out
    assert "g++ (not on PATH)" in out and "redis-server (not on PATH)" in out
    assert "1 passed" not in out
    # Outside CI the same machine runs the suite, and those tests skip with their reasons.
    allowed = inner_pytest({"CI": "", "PATH": str(empty)}, tmp_path)
    assert allowed.returncode == 0 and "1 passed" in allowed.stdout, allowed.stdout + allowed.stderr


def test_in_ci_a_module_that_does_not_import_fails_the_run(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "torch"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('libtorch_cpu.so: cannot open shared object file')\n")
    path = os.pathsep.join(p for p in (str(shadow.parent), os.environ.get("PYTHONPATH", "")) if p)
    refused = inner_pytest({"CI": "true", "PYTHONPATH": path}, tmp_path)
    out = refused.stdout + refused.stderr
    assert refused.returncode == pytest.ExitCode.USAGE_ERROR, out
    assert "python module torch (ImportError: libtorch_cpu.so" in out
    for present in ("redis", "zstandard"):  # only what is missing is named
        if importlib.util.find_spec(present) is not None:
            assert f"python module {present} " not in out


README_FOR_CI = """# x

```bash
echo first line
echo "README test command ran with CI=$CI"
```
"""
REAL_TOOLS = ("bash", "sh", "dirname", "awk", "sed", "id", "env", "mkdir", "cat", "chmod")


def stub(path: Path, body: str) -> None:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


@pytest.fixture
def ci_sandbox(tmp_path: Path) -> Path:
    """A copy of .ci/run in a tree of its own, on a PATH of stubs: apt-get, python3 (whose venv holds
    pip, python, ruff and mypy stubs), g++, redis-server and chromium, steered by FAKE_* variables; the real
    tools the script and the stubs use are linked in, and nothing else is on PATH."""
    repo, bin_dir = tmp_path / "repo", tmp_path / "bin"
    (repo / ".ci").mkdir(parents=True)
    bin_dir.mkdir()
    (repo / ".ci" / "run").write_text((REPO / ".ci" / "run").read_text())
    (repo / "README.md").write_text(README_FOR_CI)
    for tool in REAL_TOOLS:
        real = shutil.which(tool)
        assert real, f"{tool} is needed to run .ci/run in a sandbox"
        (bin_dir / tool).symlink_to(real)
    for command in ("g++", "redis-server", "chromium"):
        stub(bin_dir / command, "exit 0\n")
    log = tmp_path / "calls.log"
    # apt-get: FAKE_APT=fail refuses; =empty succeeds without providing anything; else installs a stub.
    stub(bin_dir / "apt-get", f"""echo "apt-get $*" >> {log}
[ "$FAKE_APT" = fail ] && exit 100
[ "$1" = install ] && [ "$FAKE_APT" != empty ] && for p; do case $p in -*) ;; *)
    printf '#!/bin/sh\\nexit 0\\n' > {bin_dir}/$p; chmod 755 {bin_dir}/$p;; esac; done
exit 0
""")
    venv_bin = repo / ".venv" / "bin"
    stub(bin_dir / "python3", f"""[ "$1 $2 $3" = "-m venv .venv" ] || exit 2
mkdir -p {venv_bin}
printf '#!/bin/sh\\necho "pip $*" >> {log}\\nexit ${{FAKE_PIP_RC:-0}}\\n' > {venv_bin}/pip
printf '#!/bin/sh\\necho "python $*" >> {log}\\nexit ${{FAKE_IMPORT_RC:-0}}\\n' > {venv_bin}/python
printf '#!/bin/sh\\nexit 0\\n' > {venv_bin}/ruff
printf '#!/bin/sh\\nexit 0\\n' > {venv_bin}/mypy
chmod 755 {venv_bin}/*
""")
    return tmp_path


def ci_run(sandbox: Path, **fake: str) -> tuple[int, str, str]:
    env = {"PATH": str(sandbox / "bin"), "HOME": str(sandbox), **fake}
    proc = subprocess.run([str(sandbox / "bin" / "bash"), str(sandbox / "repo" / ".ci" / "run")], env=env,
                          capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    log = sandbox / "calls.log"
    return proc.returncode, proc.stdout + proc.stderr, log.read_text() if log.exists() else ""


def test_ci_script_runs_the_readme_command_with_ci_set(ci_sandbox: Path) -> None:
    code, out, calls = ci_run(ci_sandbox)
    assert code == 0, out
    assert "README test command ran with CI=true" in out  # conftest's no-skip check is armed
    assert "pip install -q torch==" in calls and "apt-get" not in calls


def test_ci_script_installs_a_missing_command(ci_sandbox: Path) -> None:
    (ci_sandbox / "bin" / "redis-server").unlink()
    code, out, calls = ci_run(ci_sandbox)
    assert code == 0 and "README test command ran" in out, out
    assert "apt-get install -y -qq redis-server" in calls


@pytest.mark.parametrize("case", ["g++ apt fails", "g++ apt installs nothing", "redis apt fails",
                                  "redis apt installs nothing", "torch install fails", "torch does not import",
                                  "not root and no sudo", "sudo apt fails"])
def test_ci_script_fails_when_a_dependency_cannot_be_installed(ci_sandbox: Path, case: str) -> None:
    bin_dir = ci_sandbox / "bin"
    fake: dict[str, str] = {}
    missing = "redis-server" if case.startswith("redis") else "g++"
    if "apt" in case or "root" in case:
        (bin_dir / missing).unlink()
        fake["FAKE_APT"] = "empty" if "nothing" in case else "fail"
    if case == "torch install fails":
        fake["FAKE_PIP_RC"] = "1"
    if case == "torch does not import":
        fake["FAKE_IMPORT_RC"] = "1"
    if "root" in case or "sudo" in case:
        (bin_dir / "id").unlink()
        stub(bin_dir / "id", "echo 1000\n")
    if case == "sudo apt fails":
        stub(bin_dir / "sudo", '"$@"\n')
    code, out, _ = ci_run(ci_sandbox, **fake)
    assert code != 0, f"{case}: .ci/run exited 0\n{out}"
    assert "README test command ran" not in out  # stopped before the tests could skip
    named = "torch" if "torch" in case else missing
    assert "error: " in out and named in out.split("error: ", 1)[1], out


def test_ci_script_installs_a_missing_browser(ci_sandbox: Path) -> None:
    (ci_sandbox / "bin" / "chromium").unlink()
    code, out, calls = ci_run(ci_sandbox)
    assert code == 0 and "README test command ran" in out, out
    assert "apt-get install -y -qq chromium" in calls
