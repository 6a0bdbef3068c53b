"""Launchers and references defined in the user's script (``__main__``), as the README tells users to write.

Each test runs a real script in a fresh interpreter: ``python script.py`` or ``python -m script``
(the isolated worker imports the script as ``__mp_main__``, its ``if __name__ == "__main__":`` block
does not run there) or ``python -c`` (nothing to import: the trials run in-process with one warning). Either way the
choices are benchmarked and verified; none is ever recorded as a crash because of where it was defined.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest

from .test_isolation import leftover_processes

WARNING = "cannot reach the benchmark worker"

# The README's quick-start template, with a reference and a launcher that notes which process ran it.
SCRIPT = r'''
import json, os, sys
import numpy as np
import tuneforge
from tuneforge.tune.select import select_detailed

with open(@MARKS@, "a") as f:
    f.write(f"module {__name__}\n")

_pid_noted = []

def launch_axpy(kernel, args, config):
    if not _pid_noted:  # once per process: which processes ran the trials
        _pid_noted.append(True)
        with open(@PIDS@, "a") as f:
            f.write(f"{os.getpid()}\n")
    x, y = args
    kernel(x, y, x.size)

def axpy_ref(x, out):
    out += 2 * x

tpl = tuneforge.KernelTemplate("axpy", r"""
    extern "C" void axpy(const float* x, float* y, long n) {
        {% if CRASH %} *(volatile int*)0 = 1; {% endif %}
        for (long i = 0; i < n; i += {{ STEP }})
            for (long j = i; j < i + {{ STEP }} && j < n; ++j) y[j] += 2 * x[j];
    }""", signature="void axpy(const float* x, float* y, long n)", launcher=launch_axpy)
axpy_choices = tpl.choices(@CONFIGS@)

def tune(op, n):
    x = np.random.rand(n).astype(np.float32)
    y = np.random.rand(n).astype(np.float32)
    s = select_detailed(op, axpy_choices, [x], out=y, reference=tuneforge.ExternChoice(axpy_ref),
                        accumulate=True)
    return {"winner": s.choice.name, "isolated": s.report.isolated,
            "records": {r.choice_name: [r.status, r.error] for r in s.records.values()}}

@BODY@
'''

GUARDED = '''
if __name__ == "__main__":
    with open(@MARKS@, "a") as f:
        f.write("main block\\n")
    print(json.dumps({"pid": os.getpid(), "results": [tune(@OP@, 1000), tune(@OP@, 1500)]}))
'''

OK_CONFIGS = [{"STEP": 8, "CRASH": 0}, {"STEP": 64, "CRASH": 0}]


@dataclass
class Run:
    proc: subprocess.CompletedProcess[str]
    pid: int
    results: list[dict[str, Any]]
    worker_pids: list[int]  # every process that ran a launcher, in order
    marks: list[str]  # lines the script's module level and main block wrote


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # One cache for the module: the tiny kernels compile once; each test tunes its own op name.
    return tmp_path_factory.mktemp("main-script-cache")


@pytest.fixture
def run_script(shared_cache: Path, tmp_path: Path) -> Iterator[Any]:
    tag = uuid4().hex

    def run(*, body: str = GUARDED, configs: list[dict[str, int]] = OK_CONFIGS, mode: str = "file") -> Run:
        pids, marks = tmp_path / "pids", tmp_path / "marks"
        text = SCRIPT.replace("@BODY@", body)
        for name, value in (("@MARKS@", repr(str(marks))), ("@PIDS@", repr(str(pids))),
                            ("@CONFIGS@", repr(configs)), ("@OP@", repr(f"axpy_{uuid4().hex[:8]}"))):
            text = text.replace(name, value)
        script = tmp_path / "tune_axpy.py"
        script.write_text(text)
        command = {"file": [sys.executable, str(script)], "module": [sys.executable, "-m", script.stem],
                   "c": [sys.executable, "-c", text]}[mode]
        env = {**os.environ, "TUNEFORGE_CACHE_DIR": str(shared_cache), "TUNEFORGE_TEST_TAG": tag,
               "TUNEFORGE_AUTOTUNE_BENCH_TIME_S": "0.005", "TUNEFORGE_AUTOTUNE_WARMUP_S": "0",
               "TUNEFORGE_AUTOTUNE_SETTLE_S": "0"}
        proc = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
        if proc.returncode != 0:
            raise AssertionError(f"the script failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        worker_pids = [int(p) for p in pids.read_text().split()] if pids.exists() else []
        lines = marks.read_text().splitlines() if marks.exists() else []
        return Run(proc, out["pid"], out["results"], worker_pids, lines)

    yield run
    assert leftover_processes(tag) == []  # no worker outlives the script


def assert_all_ok(run: Run) -> None:
    for result in run.results:
        assert result["winner"] in ("axpy_0", "axpy_1"), result  # a template choice won
        statuses = {name: status for name, (status, _) in result["records"].items()}
        assert statuses == {"axpy_0": "ok", "axpy_1": "ok"}, result["records"]


def test_script_file_launcher_and_reference_run_in_the_isolated_worker(run_script: Any) -> None:
    run = run_script()
    assert_all_ok(run)
    assert all(result["isolated"] for result in run.results)
    assert WARNING not in run.proc.stderr, run.proc.stderr
    assert len(run.worker_pids) == 1 and run.worker_pids[0] != run.pid  # one reused worker ran the trials


def test_script_run_as_a_module_runs_in_the_isolated_worker(run_script: Any) -> None:
    run = run_script(mode="module")  # python -m tune_axpy: the worker imports it by module name
    assert_all_ok(run)
    assert all(result["isolated"] for result in run.results) and WARNING not in run.proc.stderr
    assert len(run.worker_pids) == 1 and run.worker_pids[0] != run.pid
    assert sorted(run.marks) == ["main block", "module __main__", "module __mp_main__"]


def test_main_block_is_not_run_again_in_the_worker(run_script: Any) -> None:
    run = run_script()
    assert_all_ok(run)
    # The worker imported the script (module level ran there as __mp_main__), but never its main block.
    assert sorted(run.marks) == ["main block", "module __main__", "module __mp_main__"]


def test_python_c_runs_the_trials_in_process_with_one_warning(run_script: Any) -> None:
    run = run_script(mode="c")
    assert_all_ok(run)  # two selections, both verified and timed
    assert run.proc.stderr.count(WARNING) == 1, run.proc.stderr
    warning = next(line for line in run.proc.stderr.splitlines() if WARNING in line)
    assert "launch_axpy" in warning and "axpy_ref" in warning and "importable module" in warning
    assert run.worker_pids == [run.pid]  # nothing was sent to a worker that could not resolve it
    assert run.marks == ["module __main__", "main block"]


def test_script_that_cannot_be_imported_in_the_worker_runs_in_process_with_one_warning(run_script: Any) -> None:
    run = run_script(body='if __name__ != "__main__":\n    sys.exit(3)  # e.g. argument parsing\n' + GUARDED)
    assert_all_ok(run)
    assert run.proc.stderr.count(WARNING) == 1, run.proc.stderr
    warning = next(line for line in run.proc.stderr.splitlines() if WARNING in line)
    assert "SystemExit" in warning and "launch_axpy" in warning and 'if __name__ == "__main__"' in warning
    assert run.worker_pids == [run.pid]


def test_launcher_defined_in_the_main_block_runs_in_process_with_one_warning(run_script: Any) -> None:
    # Module level while the script runs, absent from the worker's import (the block does not run
    # there): only unpickling in the worker can tell, and that must not cost the choices a crash.
    body = GUARDED.replace('if __name__ == "__main__":\n', """if __name__ == "__main__":
    def launch_late(kernel, args, config):
        launch_axpy(kernel, args, config)
    axpy_choices[:] = tuneforge.KernelTemplate("axpy", tpl.source, signature=tpl.signature,
                                               launcher=launch_late).choices(@CONFIGS@)
""")
    run = run_script(body=body)
    assert_all_ok(run)
    unreadable = [line for line in run.proc.stderr.splitlines() if "cannot read the trials" in line]
    assert len(unreadable) == 1 and "launch_late" in unreadable[0], run.proc.stderr
    assert run.worker_pids == [run.pid]
    assert "module __mp_main__" in run.marks


def test_script_that_tunes_at_module_level_works_without_nested_workers(run_script: Any) -> None:
    # The README's quick start has no main guard: importing it in the worker selects again there,
    # which must answer without measuring (and without starting a worker of its own).
    body = 'print(json.dumps({"pid": os.getpid(), "results": [tune(@OP@, 1000)]}))\n'
    run = run_script(body=body)
    assert_all_ok(run)
    assert run.results[0]["isolated"] and WARNING not in run.proc.stderr
    assert sorted(run.marks) == ["module __main__", "module __mp_main__"]
    assert len(run.worker_pids) == 1 and run.worker_pids[0] != run.pid
    # The worker's own print (its stdout is the script's stderr): answered from nothing, measured nothing.
    in_worker = [json.loads(line) for line in run.proc.stderr.splitlines() if line.startswith('{"pid"')]
    assert len(in_worker) == 1 and in_worker[0]["pid"] == run.worker_pids[0]
    assert in_worker[0]["results"][0]["records"] == {}


def test_crash_of_a_main_script_kernel_costs_that_choice_only(run_script: Any) -> None:
    configs = [{"STEP": 8, "CRASH": 1}, {"STEP": 8, "CRASH": 0}, {"STEP": 64, "CRASH": 0}]
    run = run_script(configs=configs)
    for result in run.results:
        records = result["records"]
        assert records["axpy_0"][0] == "crash" and "SIGSEGV" in records["axpy_0"][1]
        # The fresh worker after the crash imported the script again and ran the rest.
        assert records["axpy_1"][0] == "ok" and records["axpy_2"][0] == "ok"
        assert result["winner"] in ("axpy_1", "axpy_2")
    assert run.pid not in run.worker_pids


def test_an_unreadable_message_keeps_the_channel_in_step() -> None:
    from tuneforge.tune import protocol

    read_fd, write_fd = os.pipe()
    try:
        # A function of __main__ as pickle names it, read where __main__ has no such function.
        data = b"\x80\x04c__main__\nno_such_function\n."
        protocol.send(write_fd, ("before", 0))
        os.write(write_fd, protocol._HEADER.pack(len(data)) + data)
        protocol.send(write_fd, ("after", 1))
        assert protocol.receive(read_fd, 5) == ("before", 0)
        with pytest.raises(protocol.Unreadable, match="no_such_function"):
            protocol.receive(read_fd, 5)
        assert protocol.receive(read_fd, 5) == ("after", 1)
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_main_references_finds_functions_and_classes_of_main() -> None:
    import functools

    from tuneforge.tune.protocol import main_references

    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec("def launch(kernel, args, config): pass\nclass Params: pass\n", namespace)
    launch, params = namespace["launch"], namespace["Params"]
    sys.modules["__main__"].launch = launch  # type: ignore[attr-defined]  # pickle checks it is findable
    sys.modules["__main__"].Params = params  # type: ignore[attr-defined]
    try:
        found = main_references([functools.partial(launch), {"p": params()}, json.dumps])
    finally:
        del sys.modules["__main__"].launch, sys.modules["__main__"].Params  # type: ignore[attr-defined]
    assert found == {"__main__.launch", "__main__.Params"}


def test_check_pickle_says_what_cannot_be_sent_and_what_needs_main() -> None:
    import threading

    from tuneforge.tune.protocol import check_pickle

    namespace: dict[str, Any] = {"__name__": "__main__"}
    exec("def launch(kernel, args, config): pass\n", namespace)
    sys.modules["__main__"].launch = namespace["launch"]  # type: ignore[attr-defined]
    try:
        needs_main = check_pickle({"launcher": namespace["launch"], "other": json.dumps})
    finally:
        del sys.modules["__main__"].launch  # type: ignore[attr-defined]
    assert needs_main.picklable and needs_main.main_names == {"__main__.launch"}
    plain = check_pickle([json.dumps, 1, "x"])
    assert plain.picklable and plain.main_names == frozenset()
    lock = check_pickle({"lock": threading.Lock()})
    assert not lock.picklable and lock.error is not None and "lock" in lock.error
    assert lock.main_names == frozenset()
