"""Compiled choices run in an isolated worker: crashes and hangs cost that choice, never the selection."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from tuneforge.tune.choices import ExternChoice

from .conftest import run_python


def tagged_processes(tag: str) -> list[tuple[int, str]]:
    """(pid, command line) of every live process whose environment carries TUNEFORGE_TEST_TAG=tag."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes()
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
            state = Path(f"/proc/{entry}/stat").read_text().split(") ")[1].split()[0]
        except OSError:
            continue
        if f"TUNEFORGE_TEST_TAG={tag}".encode() in environ.split(b"\0"):
            found.append((int(entry), f"{state} {cmdline}"))
    return found


def leftover_processes(tag: str, deadline_s: float = 30.0) -> list[tuple[int, str]]:
    """The tagged processes still alive once they have had `deadline_s` to go ([] as soon as all have).

    A killed worker or compiler takes a moment to be reaped (by its parent's exit or PR_SET_PDEATHSIG)
    and longer on a loaded machine: poll for the condition instead of sleeping a fixed time.
    """
    deadline = time.monotonic() + deadline_s
    while True:
        found = tagged_processes(tag)
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.1)


SELECTION = """
    import json, os, sys
    import numpy as np
    from tuneforge import config
    from tuneforge.tune.choices import ExternChoice
    from tuneforge.tune.select import select_detailed
    from tests import tuning_kernels as k
    names = {names!r}
    with config.patch(autotune_bench_time_s=0.01, autotune_warmup_s=0.0, autotune_bench_timeout_s=10.0):
        s = select_detailed("crashy", [ExternChoice(k.add_slower), *k.crash_choices(names)],
                            [np.ones(256), np.ones(256)], out=np.empty(256))
    out = {{"winner": s.choice.params.get("LABEL", s.choice.name), "isolated": s.report.isolated,
           "records": {{r.params.get("LABEL", r.choice_name): [r.status, r.error] for r in s.records.values()}}}}
    print(json.dumps(out))
    sys.stdout.flush()
"""


def test_crashing_hanging_wrong_and_broken_choices_next_to_good_ones(cache_dir: Path) -> None:
    tag = uuid.uuid4().hex
    names = ["segfault", "good_slow", "abort", "hang", "wrong", "broken", "good"]
    # No wall-clock assert: a hang not cut at bench_timeout_s would run forever and hit this limit. 10 s: a fresh
    # worker after each crash must make its inputs within it on a busy host.
    proc = run_python(SELECTION.format(names=names), env={"TUNEFORGE_TEST_TAG": tag}, timeout=300)
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    records = result["records"]
    assert result["isolated"] is True
    assert result["winner"] == "good"
    assert records["segfault"][0] == "crash" and "SIGSEGV" in records["segfault"][1]
    assert records["abort"][0] == "crash" and "SIGABRT" in records["abort"][1]
    assert records["hang"][0] == "timeout" and "10 s" in records["hang"][1]
    assert records["wrong"][0] == "wrong_result" and "wrong result" in records["wrong"][1]
    assert records["broken"][0] == "compile_error" and "error" in records["broken"][1]
    assert records["good"][0] == "ok" and records["good_slow"][0] == "ok" and records["add_slower"][0] == "ok"
    assert leftover_processes(tag) == []  # the child exited: no worker, compiler or zombie of it is left


def test_worker_is_reused_and_leaves_no_zombies(cache_dir: Path) -> None:
    tag = uuid.uuid4().hex
    code = SELECTION.format(names=["segfault", "good"]) + """
    import subprocess
    from tuneforge.tune import runner
    pid_before = runner._workers["cpu"].pid
    with config.patch(autotune_bench_time_s=0.01, autotune_warmup_s=0.0):
        select_detailed("crashy2", [ExternChoice(k.add_slower), *k.crash_choices(["good", "good_slow"])],
                        [np.ones(64), np.ones(64)], out=np.empty(64))
    assert runner._workers["cpu"].pid == pid_before
    children = subprocess.run(["ps", "--ppid", str(os.getpid()), "-o", "pid=,stat=,args="],
                              capture_output=True, text=True).stdout.strip().splitlines()
    print(json.dumps(children))
    """
    children = json.loads(run_python(code, env={"TUNEFORGE_TEST_TAG": tag}).stdout.strip().splitlines()[-1])
    assert sum("tuneforge.tune.worker" in line for line in children) == 1  # one live, reused benchmark worker
    assert not any(line.split()[1].startswith("Z") for line in children)  # crashed workers were reaped
    assert not any("g++" in line or "cc1plus" in line for line in children)
    assert leftover_processes(tag) == []


def test_in_process_when_isolation_is_off(cache_dir: Path) -> None:
    code = SELECTION.format(names=["good"]).replace("autotune_bench_timeout_s=10.0",
                                                      "autotune_bench_timeout_s=10.0, autotune_isolate=False")
    result = json.loads(run_python(code).stdout.strip().splitlines()[-1])
    assert result["isolated"] is False and result["winner"] == "good"


INTERRUPTED = """
    import numpy as np
    from tuneforge import config
    from tuneforge.tune.choices import ExternChoice
    from tuneforge.tune.select import select_detailed
    from tests import tuning_kernels as k
    with config.patch(autotune_bench_time_s=0.01, autotune_warmup_s=0.0, autotune_bench_timeout_s=120.0,
                      autotune_log={log!r}):
        select_detailed("interrupted", [ExternChoice(k.add_slower), *k.crash_choices(["good", "hang", "good_slow"])],
                        [np.ones(64), np.ones(64)], out=np.empty(64))
"""


def test_sigint_mid_selection_leaves_store_and_records_consistent(cache_dir: Path, tmp_path: Path) -> None:
    tag = uuid.uuid4().hex
    env = {**os.environ, "TUNEFORGE_TEST_TAG": tag}
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(INTERRUPTED.format(log=str(tmp_path / "l")))],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    records_db = cache_dir / "records.db"
    while True:  # wait until the worker is stuck in the hanging kernel
        if any("tuneforge.tune.worker" in cmd for _, cmd in tagged_processes(tag)) and records_db.exists():
            check = run_python(f"""
                from tuneforge.store.records import RecordDB
                print(len(RecordDB({str(records_db)!r}, readonly=True).records("interrupted")))
            """)
            if int(check.stdout) >= 1:  # "good" is done; the hang runs next (library calls go last)
                break
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(f"the selection never reached the hanging kernel:\n{out}\n{err}")
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "KeyboardInterrupt" in err
    assert leftover_processes(tag) == []
    report = json.loads(run_python(f"""
        import json, sqlite3
        from tuneforge.store.default import default_store
        from tuneforge.store.records import RecordDB
        store = default_store()
        keys = store.keys()
        ok = [store.get(key) is not None for key in keys]
        db = RecordDB({str(records_db)!r})
        statuses = sorted(r.status for r in db.records("interrupted"))
        integrity = sqlite3.connect({str(records_db)!r}).execute("PRAGMA integrity_check").fetchone()[0]
        print(json.dumps([len(keys), all(ok), store.stats().corrupt, statuses, integrity]))
    """).stdout)
    n_keys, all_ok, corrupt, statuses, integrity = report
    assert n_keys >= 3 and all_ok and corrupt == 0 and integrity == "ok"
    assert statuses == ["ok"]  # what finished before the interrupt is kept; the hang and the rest are not


def test_worker_pinned_to_configured_cpus(cache_dir: Path) -> None:
    code = """
        from pathlib import Path
        from tuneforge import config
        from tuneforge.tune import runner
        with config.patch(autotune_worker_cpus=[0]):
            worker = runner._worker()
        status = Path(f"/proc/{worker.pid}/status").read_text()
        print(next(line.split()[1] for line in status.splitlines() if line.startswith("Cpus_allowed_list")))
    """
    assert run_python(code).stdout.strip() == "0"


pickled: dict[str, int] = {}  # choice name -> how often this process pickled it


class CountedChoice(ExternChoice):
    """A library call sent to the worker as if compiled, counting how often this process pickles it."""

    is_native = True

    def __getstate__(self) -> dict[str, Any]:
        pickled[self.name] = pickled.get(self.name, 0) + 1
        return dict(self.__dict__)


def test_each_choice_is_pickled_once_before_it_is_sent(cache_dir: Path) -> None:
    # One pass finds both whether a choice can reach the worker and which __main__ names it needs;
    # the second pickling is the send itself. A choice may carry a large source: no third pass.
    from tuneforge import config
    from tuneforge.tune.select import clear_memo, select_detailed

    from . import tuning_kernels as k

    clear_memo()
    pickled.clear()
    choices = [CountedChoice(k.add, "counted_add"), CountedChoice(k.add_slow, "counted_add_slow")]
    with config.patch(autotune_bench_time_s=0.003, autotune_warmup_s=0.0, autotune_min_repeats=2):
        selection = select_detailed("counted", choices, [np.ones(64), np.ones(64)], out=np.empty(64),
                                    reference=ExternChoice(k.add))
    assert selection.report is not None and selection.report.isolated
    assert {r.choice_name: r.status for r in selection.records.values()} == {"counted_add": "ok",
                                                                             "counted_add_slow": "ok"}
    assert pickled == {"counted_add": 2, "counted_add_slow": 2}


def test_a_worker_whose_parent_is_gone_before_it_is_ready_exits_quietly() -> None:
    """Ctrl-C while a worker starts: the parent closes its end of the pipe, and the worker's "ready" meets a broken
    pipe. It must end at once, printing no traceback to the terminal it shares with the parent."""
    from tuneforge.tune.protocol import send

    worker = subprocess.Popen([sys.executable, "-m", "tuneforge.tune.worker"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert worker.stdin is not None and worker.stdout is not None and worker.stderr is not None
    worker.stdout.close()  # gone before the worker answers
    send(worker.stdin.fileno(), {"sys_path": [p for p in sys.path if p], "cpus": []})
    worker.stdin.close()
    assert worker.wait(timeout=60) == 0
    assert "Traceback" not in worker.stderr.read().decode(), "the worker printed a traceback"


PREPARED = """
    import json, time
    import numpy as np
    import tuneforge
    from tuneforge import config
    from tuneforge.tune.choices import ExternChoice
    from tuneforge.tune.select import select_detailed
    from tests import tuning_kernels as k
    prepared = tuneforge.prepare("cpu", wait=True) if {prepare!r} else None
    with config.patch(autotune_bench_time_s=0.01, autotune_warmup_s=0.0, autotune_force=True,
                      autotune_log={log!r}):
        s = select_detailed("prepared", [ExternChoice(k.add_slower), *k.crash_choices(["good"])],
                            [np.ones(256), np.ones(256)], out=np.empty(256))
    print(json.dumps({{"prepared": prepared, "isolated": s.report.isolated}}))
"""


def test_a_prepared_worker_is_not_waited_for(cache_dir: Path, tmp_path: Path) -> None:
    """The choices built already (a first process), a fresh process's selection waits for its worker's start; with
    tuneforge.prepare() called first, it waits for nothing."""
    log = tmp_path / "selections.jsonl"

    def startup_s(prepare: bool) -> float:
        result = json.loads(run_python(PREPARED.format(prepare=prepare, log=str(log))).stdout.strip().splitlines()[-1])
        assert result["isolated"] is True and result["prepared"] in (None, True)
        return float(json.loads(log.read_text().splitlines()[-1])["startup_s"])

    startup_s(False)  # builds the choices
    unprepared = startup_s(False)
    assert unprepared > 0.01  # nothing hides the worker's start
    # a dict lookup and a check that it lives (a few microseconds; a preempted one on a busy host, milliseconds)
    assert startup_s(True) < min(0.05, unprepared / 4)


def test_prepare_checks_the_device_and_starts_nothing_without_isolation(cache_dir: Path) -> None:
    import pytest

    import tuneforge
    from tuneforge import config
    from tuneforge.tune import runner

    with pytest.raises(ValueError, match="'tpu'"):
        tuneforge.prepare("tpu")
    before = runner._workers.get("cpu")
    with config.patch(autotune_isolate=False):
        assert tuneforge.prepare("cpu") is False
    assert runner._workers.get("cpu") is before
    assert tuneforge.prepare("cpu") is True
    worker = runner._workers["cpu"]
    assert worker.alive() and tuneforge.prepare("cpu", wait=True) is True and runner._workers["cpu"] is worker
    assert worker.ready


def test_a_worker_is_ready_only_once_the_libraries_loaded_since_its_start_are_imported(
        tmp_path: Path, monkeypatch: Any) -> None:
    """prepare(wait=True), and every job, find a worker that has imported what it was asked to since it started
    (a preload has no answer of its own: a sync sent behind it does). A torch loaded into an idle worker so took
    2 s of a selection's setup, after a prepare that had returned at once."""
    from tuneforge.tune.worker_process import WorkerProcess

    stamp = tmp_path / "imported"
    (tmp_path / "slow_to_import.py").write_text(f"import time\ntime.sleep(0.4)\nopen({str(stamp)!r}, 'w').close()\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # the worker takes this process's sys.path when it starts
    worker = WorkerProcess("cpu")
    try:
        worker.wait_ready()
        worker.load(["slow_to_import", "no_such_module_anywhere"])  # one that fails to import is the job's to report
        assert not worker.ready
        worker.wait_ready()
        assert stamp.exists() and worker.ready
        worker.load(["slow_to_import"])  # loaded already: nothing sent, nothing waited for
        assert worker.ready
    finally:
        worker.kill()


def test_the_worker_writes_a_profile_of_each_job_when_asked(cache_dir: Path, tmp_path: Path) -> None:
    """autotune.worker_profile: where a selection's trials spend their time in the worker (the GPU benchmark's
    --profile reads them), one cProfile file per job; nothing is written without it."""
    import pstats

    from tests import tuning_kernels as k
    from tuneforge import config
    from tuneforge.tune.select import select_detailed

    folder = tmp_path / "profiles"
    args = [np.ones(256), np.ones(256)]
    with config.patch(autotune_bench_time_s=0.005, autotune_warmup_s=0.0, autotune_force=True):
        select_detailed("unprofiled", k.crash_choices(["good"]), args, out=np.empty(256))
        assert not folder.exists()
        with config.patch(autotune_worker_profile=folder):
            s = select_detailed("profiled", k.crash_choices(["good", "good_slow"]), args, out=np.empty(256))
    assert s.report.isolated
    # one per job (the setup made ahead of the builds, then the trials), each written once its events are sent
    deadline = time.monotonic() + 10
    while len(files := sorted(folder.glob("worker-*.prof"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert files and not list(folder.glob("*.partial"))
    functions = {name for f in files for (_, _, name) in pstats.Stats(str(f)).stats}  # type: ignore[attr-defined]
    assert "run_trials" in functions
