"""The `tuneforge` command ends a user error in a short message on stderr, never in a Python traceback.

Every test runs the real command (the installed console script, else ``python -m tuneforge``) in a child
process, because the failures covered here happen where only a real process shows them: settings read
at import, the exit status, signals, exit handlers.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tuneforge.store.records import BUNDLE_FORMAT, BUNDLE_VERSION, Record

# Fast benchmarking: these tests are about what the command prints, not about the timings.
FAST = {"TUNEFORGE_AUTOTUNE_BENCH_TIME_S": "0.003", "TUNEFORGE_AUTOTUNE_WARMUP_S": "0",
        "TUNEFORGE_AUTOTUNE_MIN_REPEATS": "2", "TUNEFORGE_AUTOTUNE_SETTLE_S": "0"}


def tuneforge_command() -> list[str]:
    """The console script installed next to this interpreter, as a user runs it; else `python -m tuneforge`."""
    script = Path(sys.executable).with_name("tuneforge")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "tuneforge"]


def run_cli(*args: str, env: dict[str, str] | None = None, module: bool = False,
            timeout: float = 300) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "tuneforge"] if module else tuneforge_command()
    return subprocess.run([*command, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def assert_short_error(proc: subprocess.CompletedProcess[str], *fragments: str, max_lines: int = 3) -> None:
    """Non-zero exit, no traceback anywhere, a few lines on stderr that contain every fragment."""
    shown = f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    assert proc.returncode != 0, shown
    assert "Traceback" not in proc.stdout + proc.stderr, shown
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert 1 <= len(lines) <= max_lines, shown
    for fragment in fragments:
        assert fragment in proc.stderr, f"{fragment!r} missing; {shown}"


@pytest.mark.parametrize("var,value,args,fragment", [
    ("TUNEFORGE_COMPILE_THREADS", "abc", ("config", "show"), "'abc'"),
    ("TUNEFORGE_AUTOTUNE_BENCH_TIME_S", "nan", ("tune", "matmul", "--shape", "8x8x8"), "nan"),
    ("TUNEFORGE_REMOTE_TIMEOUT_S", "inf", ("cache", "stats"), "finite"),
    ("TUNEFORGE_COMPILE_TIMEOUT_S", "1e999", ("records", "list"), "finite"),
    ("TUNEFORGE_REMOTE_URL", "http://user:hunter2@cache.example:6379/0", ("config", "show"), "redis://"),
    ("TUNEFORGE_REMOTE_SECRET", "", ("cache", "stats"), "empty"),
    ("TUNEFORGE_DEBUG", "perhaps", ("--version",), "'perhaps'"),
])
@pytest.mark.parametrize("module", [False, True], ids=["script", "python-m"])
def test_bad_environment_value_is_one_line_naming_the_variable(cache_dir: Path, var: str, value: str,
                                                               args: tuple[str, ...], fragment: str,
                                                               module: bool) -> None:
    proc = run_cli(*args, env={var: value}, module=module)
    assert_short_error(proc, var, fragment, max_lines=1)
    assert "hunter2" not in proc.stderr  # a password in a rejected URL is not echoed either


def test_bad_config_file_is_one_line_naming_the_file(cache_dir: Path, tmp_path: Path) -> None:
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"format": "tuneforge-config", "version": 1,
                                "settings": {"autotune.bench_time_s": "inf"}}))
    assert_short_error(run_cli("config", "show", env={"TUNEFORGE_CONFIG": str(path)}), str(path),
                       "autotune.bench_time_s", max_lines=1)


@pytest.mark.parametrize("keys", [("aaa", "bbb"), ("nosuchkey0000000", "nosuchkey1111111"),
                                  ("../../etc/passwd", "x")])
def test_cache_explain_with_unknown_keys(cache_dir: Path, keys: tuple[str, str]) -> None:
    assert_short_error(run_cli("cache", "explain", *keys), f"no artifact with key {keys[0]}",
                       "tuneforge cache list", max_lines=1)


@pytest.mark.parametrize("args", [("cache", "stats"), ("cache", "prune"), ("cache", "clear"), ("cache", "list"),
                                  ("records", "list"), ("records", "clear"), ("tune", "matmul", "--shape", "8x8x8")])
@pytest.mark.parametrize("below", [False, True], ids=["is-a-file", "under-a-file"])
def test_cache_dir_that_is_a_file(tmp_path: Path, args: tuple[str, ...], below: bool) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache directory should be\n")
    root = blocker / "cache" if below else blocker
    proc = run_cli(*args, env={"TUNEFORGE_CACHE_DIR": str(root), **FAST})
    assert_short_error(proc, str(root), "TUNEFORGE_CACHE_DIR", max_lines=1)
    assert blocker.read_text().startswith("a file where")


def _make_read_only(root: Path) -> bool:
    """Make `root` and everything in it unwritable, even for root (chattr +i); False where impossible."""
    if os.geteuid() == 0:
        chattr = shutil.which("chattr")
        if chattr is None or subprocess.run([chattr, "-R", "+i", str(root)], capture_output=True).returncode:
            return False
    else:
        for path in [root, *root.rglob("*")]:
            path.chmod(path.stat().st_mode & ~0o222)
    probe = root / "artifacts" / "probe"
    try:
        probe.write_text("x")
    except OSError:
        return True
    probe.unlink()
    return False


def _make_writable(root: Path) -> None:
    if os.geteuid() == 0 and shutil.which("chattr"):
        subprocess.run(["chattr", "-R", "-i", str(root)], capture_output=True)
    for path in [root, *root.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)


def test_prune_and_clear_on_a_read_only_cache(cache_dir: Path) -> None:
    filled = run_cli("doctor")  # compiles and caches one artifact
    assert filled.returncode == 0, filled.stderr
    try:
        if not _make_read_only(cache_dir):
            pytest.skip("cannot make a directory read-only here (root without chattr, or a filesystem "
                        "without the immutable attribute)")
        for args in (("cache", "prune"), ("cache", "prune", "--max-size", "1"), ("cache", "clear")):
            assert_short_error(run_cli(*args), str(cache_dir))
    finally:
        _make_writable(cache_dir)


def _bundle(path: Path, **fields: object) -> Path:
    record = Record(key="k1", choice="c1", status="ok", op="matmul", choice_name="n", median_ms=1.0).to_json()
    path.write_text(json.dumps({"format": BUNDLE_FORMAT, "version": BUNDLE_VERSION,
                                "records": [{**record, **fields}]}))
    return path


@pytest.mark.parametrize("field,literal", [("count", str(10**30)), ("count", str(-(10**30))),
                                          ("median_ms", "1e999"), ("created", "1e999"),
                                          ("created", str(10**400))])
def test_records_import_with_numbers_out_of_range(cache_dir: Path, tmp_path: Path, field: str,
                                                  literal: str) -> None:
    path = _bundle(tmp_path / "bundle.json", **{field: f"@{field}@"})
    path.write_text(path.read_text().replace(f'"@{field}@"', literal))
    assert_short_error(run_cli("records", "import", str(path)), str(path), max_lines=1)
    listing = run_cli("records", "list")
    assert listing.returncode == 0 and "matmul" not in listing.stdout  # nothing half-imported


@pytest.mark.parametrize("depth", [100_000, 2_000])
def test_records_import_of_deeply_nested_json(cache_dir: Path, tmp_path: Path, depth: int) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * depth + "]" * depth)
    assert_short_error(run_cli("records", "import", str(path)), str(path), max_lines=1)
    nested = _bundle(tmp_path / "nested.json", params={"p": "@"})
    nested.write_text(nested.read_text().replace('"@"', "[" * depth + "]" * depth))
    assert_short_error(run_cli("records", "import", str(nested)), str(nested), max_lines=1)


def test_tune_refuses_a_shape_that_cannot_fit_before_compiling(cache_dir: Path, wrapper_compiler: Path) -> None:
    started = time.monotonic()
    proc = run_cli("tune", "gemm", "--shape", "10000000x10000000x10000000", "--dtype", "float32",
                   env={"TUNEFORGE_CPP_CXX": str(wrapper_compiler), "TUNEFORGE_TEST_FORBID_COMPILE": "1"})
    assert_short_error(proc, "--shape 10000000x10000000x10000000 float32", "TiB", "available", max_lines=1)
    assert time.monotonic() - started < 60  # refused up front, not after trying to allocate
    assert not (wrapper_compiler.parent / "compiler.log").exists()  # nothing was compiled


def test_unexpected_error_is_one_line_unless_debugging(cache_dir: Path) -> None:
    # A command added by an extension fails with an error no one anticipated.
    script = textwrap.dedent("""
        import sys
        from tuneforge import cli

        @cli.main.command("explode")
        def explode() -> None:
            raise TypeError("an unanticipated bug")

        sys.argv = ["tuneforge", *sys.argv[1:]]
        cli.run()
    """)
    plain = subprocess.run([sys.executable, "-c", script, "explode"], capture_output=True, text=True)
    assert_short_error(plain, "TypeError", "an unanticipated bug", "TUNEFORGE_DEBUG=1", max_lines=1)
    for extra_args, env in ((["--debug", "explode"], {}), (["explode"], {"TUNEFORGE_DEBUG": "1"})):
        debug = subprocess.run([sys.executable, "-c", script, *extra_args], capture_output=True, text=True,
                               env={**os.environ, **env})
        assert debug.returncode == 1
        assert "Traceback" in debug.stderr and "an unanticipated bug" in debug.stderr


def test_ctrl_c_that_python_would_swallow_still_stops_the_command(cache_dir: Path) -> None:
    # Ctrl-C landing in a __del__ (or one of the import system's weakref callbacks) raises where Python
    # prints "Exception ignored" and goes on.
    script = textwrap.dedent("""
        import os, signal, sys, time
        from tuneforge import cli

        class Finalized:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.5)  # the handler runs here, inside __del__

        @cli.main.command("linger")
        def linger() -> None:
            Finalized()
            time.sleep(30)

        sys.argv = ["tuneforge", *sys.argv[1:]]
        cli.run()
    """)
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script, "linger"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 130, proc
    assert time.monotonic() - started < 25  # stopped, not after the command's 30 s
    assert [line for line in proc.stderr.splitlines() if line.strip()] == ["interrupted"], proc.stderr


@pytest.fixture
def started_tune(cache_dir: Path) -> Iterator[subprocess.Popen[str]]:
    """`tuneforge tune gemm` running long enough to be interrupted, in its own process group (a terminal's)."""
    env = {**os.environ, "TUNEFORGE_AUTOTUNE_BENCH_TIME_S": "2", "TUNEFORGE_AUTOTUNE_MIN_REPEATS": "50"}
    proc = subprocess.Popen([*tuneforge_command(), "tune", "gemm", "--shape", "384x384x384"], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        # Started: the command has created its cache (it is past importing and into tuning).
        while not (cache_dir / "artifacts").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()


@pytest.mark.parametrize("whom", ["process-group", "process"])
@pytest.mark.parametrize("after_s", [0.0, 1.0])
def test_ctrl_c_during_tune(started_tune: subprocess.Popen[str], whom: str, after_s: float) -> None:
    time.sleep(after_s)  # at once, or while building and benchmarking
    if whom == "process-group":  # what Ctrl-C in a terminal does
        os.killpg(started_tune.pid, signal.SIGINT)
    else:
        os.kill(started_tune.pid, signal.SIGINT)
    stdout, stderr = started_tune.communicate(timeout=120)
    assert started_tune.returncode == 130, (stdout, stderr)
    assert "Traceback" not in stdout + stderr, stderr
    assert [line for line in stderr.splitlines() if line.strip()] == ["interrupted"], stderr


def test_ctrl_c_while_exiting_lets_exit_handlers_finish(cache_dir: Path, tmp_path: Path) -> None:
    # Stands for the record and statistics flushes the store registers while a command runs: Ctrl-C
    # arrives in the middle of one, after the command itself has finished.
    flushed = tmp_path / "flushed"
    script = textwrap.dedent(f"""
        import atexit, os, signal, sys
        from pathlib import Path
        from tuneforge import cli, config

        def flush() -> None:
            os.kill(os.getpid(), signal.SIGINT)
            Path({str(flushed)!r}).write_text("done")

        describe = config.describe
        def describe_and_register() -> object:
            atexit.register(flush)
            return describe()
        config.describe = describe_and_register
        sys.argv = ["tuneforge", "config", "show"]
        cli.run()
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 130, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.strip() == "interrupted", proc.stderr
    assert "tuneforge settings" in proc.stdout  # the command's output is complete
    assert flushed.read_text() == "done"

