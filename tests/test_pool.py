"""The parallel build pool: real compiler (through the logging wrapper), real worker processes.

Robust on a loaded 2-core machine: a condition that must come true is polled with a generous deadline
(PATIENCE); a process that must go away is waited for well within the time its slow compile would take
to end by itself (each test sleeps its own unusual number of seconds, also so that pgrep never sees
another test's compilers), so a build that does not kill it still fails the test.
"""

from __future__ import annotations

import ctypes
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tuneforge import config
from tuneforge.compile import builders
from tuneforge.compile import pool as pool_module
from tuneforge.compile.cpp import CppBuild
from tuneforge.compile.pool import BuildPool, BuildResult, default_pool
from tuneforge.errors import CompileError, ConfigError

SLOW = "TUNEFORGE_TEST_SLOW_COMPILE"
PATIENCE = 60.0  # seconds to wait for something that must happen (returns as soon as it does)


def source(n: int) -> str:
    return f'extern "C" int value_{n}() {{ return {n}; }}\n'


def compiles(wrapper: Path) -> int:
    log = wrapper.parent / "compiler.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def pgrep(pattern: str) -> list[int]:
    """Processes whose command line contains `pattern` (dots literal: "sleep 9.5" is not "sleep 925")."""
    proc = subprocess.run(["pgrep", "-f", pattern.replace(".", "\\.")], capture_output=True, text=True)
    return [int(p) for p in proc.stdout.split()]


def alive(pid: int) -> bool:
    """Running (a zombie that nobody reaped yet counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat[stat.rindex(b")") + 2:].split()[0] != b"Z"


def eventually(condition: Callable[[], Any], timeout: float = PATIENCE) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


@pytest.fixture
def cxx(cache_dir: Path, wrapper_compiler: Path) -> Iterator[Path]:
    with config.patch(cpp_cxx=str(wrapper_compiler)):
        yield wrapper_compiler


@pytest.fixture
def make_pool() -> Iterator[Callable[..., BuildPool]]:
    pools: list[BuildPool] = []

    def make(workers: int = 2, start_method: str | None = None) -> BuildPool:
        pools.append(BuildPool(workers, start_method=start_method))
        return pools[-1]

    yield make
    for pool in pools:
        pool.shutdown()


def test_builds_are_deduplicated_by_key(cxx: Path, make_pool: Callable[..., BuildPool]) -> None:
    pool = make_pool()
    futures = [pool.submit(CppBuild(source(i % 3)), label=f"choice{i}") for i in range(8)]
    assert futures[0] is futures[3] is futures[6] and futures[1] is futures[4] is futures[7]
    assert futures[2] is futures[5] and len({id(f) for f in futures}) == 3
    results = [f.result(timeout=60) for f in futures]
    assert [r.compiled for r in results[:3]] == [True, True, True]
    both = pool.build_all([("first", CppBuild(source(0))), ("same source", CppBuild(source(0))),
                           ("second", CppBuild(source(1)))], progress=False)
    assert both["first"] is both["same source"] is results[0] and both["second"] is results[1]
    assert compiles(cxx) == 3
    assert all(os.path.isabs(r.library_path) for r in results)
    assert ctypes.CDLL(results[2].library_path).value_2() == 2


def test_build_past_its_timeout_is_killed(cxx: Path, make_pool: Callable[..., BuildPool],
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SLOW, "92.3")
    pool = make_pool(workers=1)
    started = time.monotonic()
    with config.patch(compile_timeout_s=1):
        future = pool.submit(CppBuild(source(1)))
    with pytest.raises(CompileError, match="timed out") as info:
        future.result(timeout=PATIENCE)
    assert time.monotonic() - started < PATIENCE  # stopped at its 1 s limit, not after the 92 s compile
    assert info.value.source_path is not None and info.value.source_path.is_file()
    assert eventually(lambda: not pgrep("sleep 92.3"), timeout=20)  # killed: < 92.3 s from the start


def test_pool_kills_a_worker_past_the_pool_deadline(cxx: Path, make_pool: Callable[..., BuildPool],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # The compiler's own limit (60 s) is not reached: the pool's (60 - 58.5 = 1.5 s) is.
    monkeypatch.setattr(pool_module, "TIMEOUT_GRACE_S", -58.5)
    monkeypatch.setenv(SLOW, "91.7")
    pool = make_pool(workers=1)
    with config.patch(compile_timeout_s=60):
        future = pool.submit(CppBuild(source(2)), label="hung")
    with pytest.raises(CompileError, match="hung timed out.*worker process was killed"):
        future.result(timeout=PATIENCE)
    assert eventually(lambda: not pgrep("sleep 91.7"), timeout=20)  # the worker killed its compiler


def test_failed_build_fails_only_its_future(cxx: Path, make_pool: Callable[..., BuildPool]) -> None:
    pool = make_pool()
    bad = CppBuild('extern "C" int broken() { return undefined_thing; }')
    results = pool.build_all([("good", CppBuild(source(5))), ("bad", bad), ("good too", CppBuild(source(6)))],
                             progress=False)
    error = results["bad"]
    assert isinstance(error, CompileError) and "undefined_thing" in error.stderr and error.returncode
    assert error.source_path is not None and error.source_path.is_file()
    assert isinstance(results["good"], BuildResult) and isinstance(results["good too"], BuildResult)
    retry = pool.submit(bad)  # a failure is forgotten: the next submit tries again
    with pytest.raises(CompileError):
        retry.result(timeout=60)
    assert compiles(cxx) == 4


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_start_methods_and_worker_reuse(cxx: Path, make_pool: Callable[..., BuildPool], method: str) -> None:
    pool = make_pool(start_method=method)
    assert not pool.started
    first = pool.submit(CppBuild(source(10))).result(timeout=60)
    assert pool.started and first.compiled
    pids = pool.worker_pids()
    assert pids and os.getpid() not in pids
    # Settings travel with each task, also those changed after the workers started.
    with config.patch(cpp_flags=["-DTF_VALUE=42"]):
        flagged = pool.submit(CppBuild('extern "C" int flagged() { return TF_VALUE; }')).result(timeout=60)
    assert ctypes.CDLL(flagged.library_path).flagged() == 42
    assert pool.worker_pids() == pids  # the same workers took the second build


def test_builds_run_in_parallel(cxx: Path, make_pool: Callable[..., BuildPool],
                                monkeypatch: pytest.MonkeyPatch) -> None:
    # Each build sleeps 2 s (no CPU: load barely stretches it) before compiling. One after another,
    # four builds take the sum of their own durations, however slow the compiles are; on 2 workers
    # about half of it. "< 80 % of the sum" proves overlap and leaves room for a loaded machine.
    pause = 2.0
    monkeypatch.setenv(SLOW, str(pause))
    pool = make_pool(workers=2, start_method="fork")
    pool.submit(CppBuild(source(20))).result(timeout=PATIENCE)  # workers up, compiler probed
    seen_together = threading.Event()
    done = threading.Event()

    def watch() -> None:  # two compilers alive at one moment: parallel, whatever the timings
        while not done.is_set():
            if len(pgrep(f"sleep {pause}")) >= 2:
                seen_together.set()
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    started = time.perf_counter()
    try:
        results = pool.build_all([(f"b{i}", CppBuild(source(21 + i))) for i in range(4)], progress=False)
    finally:
        elapsed = time.perf_counter() - started
        done.set()
        watcher.join()
    builds = [r for r in results.values() if isinstance(r, BuildResult) and r.compiled]
    assert len(builds) == 4, results
    serial = sum(r.seconds for r in builds)
    assert serial >= 4 * pause
    assert seen_together.is_set(), "never saw two builds running at once on 2 workers"
    assert elapsed < 0.8 * serial, f"4 builds taking {serial:.2f} s one after another took {elapsed:.2f} s " \
                                   "on 2 workers: not in parallel"


def test_build_all_writes_nothing_unless_asked(cxx: Path, make_pool: Callable[..., BuildPool],
                                               capfd: pytest.CaptureFixture[str]) -> None:
    stdout, stderr = sys.stdout, sys.stderr
    capfd.readouterr()
    pool = make_pool()
    builds = [("ok", CppBuild(source(30))), ("bad", CppBuild("this is not C++"))]
    quiet = pool.build_all(builds, progress=False)
    implicit = pool.build_all([("ok", CppBuild(source(31)))])  # stderr is not a terminal: no bar
    assert isinstance(quiet["ok"], BuildResult) and isinstance(quiet["bad"], CompileError)
    assert isinstance(implicit["ok"], BuildResult)
    assert capfd.readouterr() == ("", "")
    assert sys.stdout is stdout and sys.stderr is stderr
    pool.build_all([("x", CppBuild(source(32))), ("y", CppBuild(source(33)))], progress=True)
    out, err = capfd.readouterr()
    assert out == "" and "building" in err and "2/2" in err
    assert sys.stdout is stdout and sys.stderr is stderr


def test_shutdown_leaves_no_worker_or_compiler(cxx: Path, make_pool: Callable[..., BuildPool],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SLOW, "89.3")
    pool = make_pool()
    futures = [pool.submit(CppBuild(source(40))), pool.submit(CppBuild(source(42)))]
    assert eventually(lambda: len(pool.running()) == 2 and len(pgrep("sleep 89.3")) == 2)
    pids = pool.worker_pids()
    assert len(pids) == 2 and all(alive(pid) for pid in pids)
    pool.shutdown()
    assert all(f.cancelled() for f in futures) and not pool.started
    assert not [pid for pid in pids if alive(pid)]
    assert eventually(lambda: not pgrep("sleep 89.3"), timeout=20)
    pool.shutdown()  # idempotent
    monkeypatch.delenv(SLOW)
    again = pool.submit(CppBuild(source(40)))  # a later submit starts new workers
    other = pool.submit(CppBuild(source(41)))
    pool.shutdown(cancel=False)  # waits for the builds it was given
    assert again.result(timeout=0).compiled and other.result(timeout=0).compiled  # done: no waiting
    assert not pool.started and not [pid for pid in pids if alive(pid)]


def test_killed_worker_fails_its_build_only(cxx: Path, make_pool: Callable[..., BuildPool],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # Long enough that both builds are running at one moment even when the second worker starts late.
    monkeypatch.setenv(SLOW, "3")
    pool = make_pool(workers=2)
    victim = pool.submit(CppBuild(source(50)), label="victim")
    bystander = pool.submit(CppBuild(source(51)), label="bystander")
    running = eventually(lambda: (lambda r: r if len(r) == 2 else None)(pool.running()))
    assert running, "both builds should be running"
    os.kill(running["victim"], signal.SIGKILL)
    with pytest.raises(CompileError, match=r"victim: its worker process \(pid \d+\) died \(killed by SIGKILL\)"):
        victim.result(timeout=PATIENCE)
    assert bystander.result(timeout=PATIENCE).compiled  # submitted again to the new workers
    again = pool.submit(CppBuild(source(50)), label="victim")
    assert again is not victim
    assert ctypes.CDLL(again.result(timeout=PATIENCE).library_path).value_50() == 50


_SUBMITTER = os.getpid()


def _die_outside_the_submitter(text: str) -> CppBuild:
    """Unpickles to a CppBuild in this process; kills any other process that unpickles it."""
    if os.getpid() != _SUBMITTER:
        os._exit(7)
    return CppBuild(text)


class PoisonBuild(CppBuild):
    """A build whose arrival kills the worker before it can start it."""

    def __reduce__(self) -> tuple[Any, ...]:
        return _die_outside_the_submitter, (self.source,)


def test_a_worker_dead_before_starting_a_task_is_not_blamed_on_it(cxx: Path, make_pool: Callable[..., BuildPool]
                                                                  ) -> None:
    pool = make_pool(workers=2, start_method="fork")
    poison = pool.submit(PoisonBuild(source(60)), label="poison")
    # Each worker it reaches dies before announcing the start: the task goes to another one, three
    # times in all, then fails naming what happened; other builds are not touched.
    with pytest.raises(CompileError, match=r"poison: 3 build worker processes died before they could start it "
                                           r"\(the last exited with status 7\)"):
        poison.result(timeout=PATIENCE)
    assert ctypes.CDLL(pool.submit(CppBuild(source(61))).result(timeout=PATIENCE).library_path).value_61() == 61
    assert compiles(cxx) == 1  # the poisoned build never reached a compiler


@dataclass(frozen=True)
class NoteBuild:
    """A kind of build of this test's own: writes its text to a file (registered below)."""

    text: str
    directory: str


def _build_note(build: NoteBuild) -> tuple[str, Path, bool]:
    path = Path(build.directory) / f"{os.getpid()}-{build.text}.txt"
    path.write_text(build.text)
    return f"note{build.text}", path, True


builders.register(NoteBuild, lambda build: f"note{build.text}", _build_note)


def test_other_kinds_of_build_run_in_the_workers_too(cache_dir: Path, tmp_path: Path,
                                                     make_pool: Callable[..., BuildPool]) -> None:
    pool = make_pool(workers=2, start_method="fork")
    first, again = pool.submit(NoteBuild("a", str(tmp_path))), pool.submit(NoteBuild("a", str(tmp_path)))
    assert first is again  # de-duplicated by the key its builder gives
    result = first.result(timeout=PATIENCE)
    assert (result.key, Path(result.path).read_text()) == ("notea", "a")
    assert Path(result.path).name.split("-")[0] != str(os.getpid())  # built in a worker
    with pytest.raises(TypeError, match=r"builds .*CppBuild.*NoteBuild.*not str"):
        pool.submit("a")  # type: ignore[arg-type]


CHILD = """
import sys, time
from tuneforge import config
from tuneforge.compile.cpp import CppBuild
from tuneforge.compile.pool import BuildPool

if __name__ == "__main__":
    config.set("cpp.cxx", sys.argv[1])
    pool = BuildPool(2, start_method="spawn")
    future = pool.submit(CppBuild('extern "C" int orphan() { return 1; }'))
    while not pool.running():
        time.sleep(0.05)
    print(" ".join(map(str, pool.worker_pids())), flush=True)
    time.sleep(120)
"""


def test_workers_die_with_a_killed_parent(cxx: Path, tmp_path: Path) -> None:
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(CHILD))
    env = {**os.environ, SLOW: "88.7"}
    with subprocess.Popen([sys.executable, str(script), str(cxx)], env=env, stdout=subprocess.PIPE,
                          text=True) as child:
        assert child.stdout is not None
        pids = [int(p) for p in child.stdout.readline().split()]
        assert pids and eventually(lambda: pgrep("sleep 88.7"))
        child.kill()
    assert eventually(lambda: not [pid for pid in pids if alive(pid)], timeout=20)
    assert eventually(lambda: not pgrep("sleep 88.7"), timeout=20)  # well before the compile would end


STOPPING = """
import sys, threading, time
from tuneforge import config
from tuneforge.compile.cpp import CppBuild
from tuneforge.compile.pool import BuildPool


def report(pool):
    while len(pool.running()) < 2:
        time.sleep(0.05)
    print(" ".join(map(str, pool.worker_pids())), flush=True)


if __name__ == "__main__":
    config.set("cpp.cxx", sys.argv[1])
    pool = BuildPool(2)
    builds = [(f"b{i}", CppBuild(f'extern "C" int stop{i}() {{ return {i}; }}')) for i in range(3)]
    threading.Thread(target=report, args=(pool,), daemon=True).start()
    if sys.argv[2] == "interrupt":
        try:
            pool.build_all(builds, progress=False)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
            sys.exit(3)
    else:  # leave with builds running (once the test has seen them: a line on stdin): shut down at exit
        for label, build in builds:
            pool.submit(build, label=label)
        sys.stdin.readline()
"""


@pytest.mark.parametrize("how", ["interrupt", "exit"])
def test_interrupt_and_exit_stop_workers_and_compilers(cxx: Path, tmp_path: Path, how: str) -> None:
    script = tmp_path / "stopping.py"
    script.write_text(textwrap.dedent(STOPPING))
    env = {**os.environ, SLOW: "87.9"}
    started = time.monotonic()
    with subprocess.Popen([sys.executable, str(script), str(cxx), how], env=env, stdout=subprocess.PIPE,
                          stdin=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None and child.stdin is not None
        pids = [int(p) for p in child.stdout.readline().split()]
        assert len(pids) == 2 and eventually(lambda: len(pgrep("sleep 87.9")) >= 2)
        if how == "interrupt":
            child.send_signal(signal.SIGINT)
        else:
            child.stdin.write("exit\n")
            child.stdin.flush()
        rest = child.stdout.read()
        code = child.wait(timeout=PATIENCE)
    assert time.monotonic() - started < PATIENCE  # it did not wait for the 88 s compiles to finish
    assert (code, rest) == ((3, "interrupted\n") if how == "interrupt" else (0, ""))
    assert not [pid for pid in pids if alive(pid)]
    assert eventually(lambda: not pgrep("sleep 87.9"), timeout=20)


def test_arguments_and_errors(cache_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="'threads'"):
        BuildPool(2, start_method="threads")
    with pytest.raises(ValueError, match="workers"):
        BuildPool(0)
    with pytest.raises(TypeError):
        BuildPool(1).submit("int x;")  # type: ignore[arg-type]
    # A build whose key cannot even be computed fails its own future, without starting workers.
    pool = BuildPool(1)
    future = pool.submit(CppBuild(source(1), include_dirs=(str(tmp_path / "missing"),)))
    with pytest.raises(CompileError, match="does not exist"):
        future.result(timeout=0)  # failed at submit: nothing to wait for
    assert not pool.started
    with pytest.raises(ValueError, match="duplicate"):
        pool.build_all([("a", CppBuild(source(1))), ("a", CppBuild(source(2)))])
    error = CompileError("failed", command=["g++", "x.cpp"], stderr="boom", source_path=tmp_path, returncode=1)
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.command, copy.stderr, copy.source_path, copy.returncode, str(copy)) == \
        (error.command, error.stderr, error.source_path, error.returncode, str(error))


def test_the_default_pools_start_method_follows_its_setting(cxx: Path) -> None:
    """compile.start_method: the default pool's workers forked (the platform's way on Linux) or started fresh by a
    fork server, which a process holding a CUDA context may start faster; a build runs either way."""
    try:
        assert default_pool().start_method is None
        with config.patch(compile_start_method="forkserver"):
            pool = default_pool()
            assert pool.start_method == "forkserver" and default_pool() is pool
            built = pool.submit(CppBuild(source(70)), label="served").result(timeout=PATIENCE)
            assert ctypes.CDLL(built.library_path).value_70() == 70
        assert default_pool().start_method is None
        with pytest.raises(ConfigError, match="compile.start_method"), config.patch(compile_start_method="vfork"):
            default_pool()
    finally:
        default_pool().shutdown()


def test_default_pool_is_shared_and_follows_settings(cache_dir: Path) -> None:
    first = default_pool()
    try:
        assert default_pool() is first
        with config.patch(compile_threads=first.workers + 1):
            second = default_pool()
            assert second is not first and second.workers == first.workers + 1
        third = default_pool()
        assert third.workers == first.workers
        pid = os.fork()
        if pid == 0:  # pragma: no cover - child
            os._exit(0 if default_pool() is not third and default_pool() is default_pool() else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        default_pool().shutdown()


def test_sigterm_swallowed_where_python_can_only_report_it_still_ends_the_worker() -> None:
    """SIGTERM landing in a ``__del__`` (or the import system's weakref callbacks) raises where Python
    prints the exception and goes on: the worker must still end at once, quietly, with its children killed."""
    script = textwrap.dedent("""
        import os, subprocess, sys, time
        from tuneforge.compile import pool_worker

        pool_worker._init_worker(None)
        child = subprocess.Popen(["sleep", "97"], start_new_session=True)
        print(child.pid, flush=True)
        pool_worker._in_task = True

        class Finalized:
            def __del__(self):
                os.kill(os.getpid(), 15)
                time.sleep(0.5)  # the handler runs here, inside __del__

        Finalized()
        print("went on", flush=True)
        time.sleep(30)  # the exit watch's backstop would end it after its grace: the test must not rely on it
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=PATIENCE)
    assert done.returncode == 128 + signal.SIGTERM, done
    assert "went on" not in done.stdout and done.stderr == "", done  # ended in __del__, nothing printed
    child_pid = int(done.stdout.split()[0])
    def running() -> bool:
        state = subprocess.run(["ps", "-o", "stat=", "-p", str(child_pid)], capture_output=True, text=True)
        return state.stdout.strip() not in ("", "Z")

    deadline = time.monotonic() + PATIENCE
    while running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running()
