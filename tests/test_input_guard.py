"""Watching large inputs for writes (tune/input_guard.py): real read-only pages, real faults, in a child process
(as in a benchmark worker: the guard installs a SIGSEGV handler, which the test process keeps out of)."""

from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import pytest

from tuneforge.tune import verify
from tuneforge.tune.input_guard import InputGuard

from .conftest import run_python

_SETUP = """
    import ctypes, threading
    import numpy as np
    import tuneforge
    from tuneforge.tune import input_guard, verify

    input_guard.enable()
    n = 3_000_000  # 24 MB, above GUARD_MIN_BYTES
    a = np.random.default_rng(0).standard_normal(n)
    args = [a, np.ones(16), np.zeros(n)]
    initial = verify.snapshot(args)
    guard = input_guard.InputGuard(args, initial, [0, 1])
"""


def test_writes_from_python_native_code_and_threads_are_found_and_restored(cache_dir: Path) -> None:
    proc = run_python(_SETUP + """
    assert sorted(guard._pages) == [0]  # the small input is compared as before
    assert guard.unchanged(0) and not guard.unchanged(1)
    assert guard.changed(args, initial) == [] and float(a.sum()) == float(initial[0].sum())  # reads work

    scribble = tuneforge.cpp.load(r'''
        #include <cstdint>
        #include <thread>
        extern "C" void scribble(double* p, int64_t at) { std::thread t([=] { p[at] = -2.0; }); t.join(); }
    ''').scribble
    scribble.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    def in_thread(*args):
        thread = threading.Thread(target=a.__setitem__, args=args)
        thread.start()
        thread.join()

    writes = {
        "python thread": lambda: in_thread(n // 2, 7.0),
        "native thread": lambda: scribble(a.ctypes.data, n // 3),
        "numpy in place": lambda: np.add(a, 1.0, out=a),
        "first element": lambda: a.__setitem__(0, 5.0),  # maybe in the partial first page: compared
        "last element": lambda: a.__setitem__(n - 1, 5.0),
    }
    for name, write in writes.items():
        write()
        assert not guard.unchanged(0) and guard.changed(args, initial) == [0], name
        guard.restore()
        assert np.array_equal(a, initial[0]) and guard.unchanged(0), name  # restored and watched again
    guard.close()
    a[7] = 3.0  # writable, not watched
    assert not guard.unchanged(0) and guard.changed(args, initial) == [0]
    print("ok")
    """, env={"TUNEFORGE_CACHE_DIR": str(cache_dir)}, timeout=300)
    assert proc.stdout.split()[-1] == "ok", proc.stderr


def test_a_handler_a_library_installs_later_goes_behind_the_guard(cache_dir: Path) -> None:
    proc = run_python(_SETUP + """
    import faulthandler
    faulthandler.enable()  # a SIGSEGV handler of its own, installed after the guard's, as a choice's library might
    guard.restore()  # after each choice: the guard's handler goes back in front
    a[n // 2] = 1.0
    assert not guard.unchanged(0)
    guard.restore()
    assert np.array_equal(a, initial[0])
    print("ok")
    """, env={"TUNEFORGE_CACHE_DIR": str(cache_dir)}, timeout=300)
    assert proc.stdout.split()[-1] == "ok", proc.stderr


@pytest.mark.parametrize("faulthandler", [False, True])
def test_other_faults_still_kill_the_process(cache_dir: Path, faulthandler: bool) -> None:
    """Also with a handler installed after the guard's that hands the fault back (faulthandler, having dumped the
    stack): it must not come back to the guard for ever."""
    proc = run_python(_SETUP + f"""
    if {faulthandler}:
        import faulthandler
        faulthandler.enable()
        guard.restore()  # the guard's handler in front again
    assert guard._pages
    print("armed", flush=True)
    ctypes.string_at(0)  # a null read: not the guard's
    print("survived")
    """, env={"TUNEFORGE_CACHE_DIR": str(cache_dir)}, timeout=120, check=False)
    assert proc.returncode == -signal.SIGSEGV, proc
    assert proc.stdout.split() == ["armed"]


def test_outside_a_benchmark_worker_nothing_is_watched() -> None:
    a = np.random.default_rng(0).standard_normal(3_000_000)
    args = [a, np.zeros(3)]
    initial = verify.snapshot(args)
    guard = InputGuard(args, initial, [0])
    assert not guard.unchanged(0) and guard.changed(args, initial) == []
    a[1_000_000] = 9.0  # no fault, no handler: compared as before
    assert guard.changed(args, initial) == [0]
    guard.restore()
    assert np.array_equal(a, initial[0])
