"""Processes tuning one selection at once measure it once (issue 11, item 15).

Measured side by side, processes slow each other's kernels down and record timings that disagree
(6 tuners of one GEMM shape picked 5 winners). A selection being measured is waited for, and the
waiting processes then take the records instead of measuring again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

PROCESSES = 4


def _ran(name: str) -> None:
    """Note one run of a choice in the shared log: which choice, which process."""
    with open(os.environ["TUNEFORGE_TEST_RUN_LOG"], "a") as log:
        log.write(f"{name} {os.getpid()}\n")


def add_1ms(a: Any, b: Any, out: Any) -> None:
    _ran("add_1ms")
    time.sleep(0.001)
    np.add(a, b, out=out)


def add_3ms(a: Any, b: Any, out: Any) -> None:
    _ran("add_3ms")
    time.sleep(0.003)
    np.add(a, b, out=out)


def add_6ms(a: Any, b: Any, out: Any) -> None:
    _ran("add_6ms")
    time.sleep(0.006)
    np.add(a, b, out=out)


CHILD = """
    import json, os, sys, time
    from pathlib import Path
    import numpy as np
    from tuneforge.tune.choices import ExternChoice
    from tuneforge.tune.select import select_detailed
    from tests import test_concurrent_tuning as t

    barrier = Path(sys.argv[1])
    (barrier / str(os.getpid())).touch()
    deadline = time.monotonic() + 60
    while len(list(barrier.iterdir())) < int(sys.argv[2]) and time.monotonic() < deadline:
        time.sleep(0.005)
    s = select_detailed("add", [ExternChoice(t.add_6ms), ExternChoice(t.add_3ms), ExternChoice(t.add_1ms)],
                        [np.ones(256), np.ones(256)], out=np.empty(256))
    print(json.dumps({"pid": os.getpid(), "winner": s.choice.name, "source": s.source,
                      "benchmarked": sorted(s.benchmarked)}))
"""


def test_processes_tuning_one_key_at_once_measure_it_once(cache_dir: Path, tmp_path: Path) -> None:
    run_log, barrier = tmp_path / "runs.log", tmp_path / "barrier"
    barrier.mkdir()
    env = {**os.environ, "TUNEFORGE_TEST_RUN_LOG": str(run_log), "TUNEFORGE_AUTOTUNE_BENCH_TIME_S": "0.01",
           "TUNEFORGE_AUTOTUNE_WARMUP_S": "0", "TUNEFORGE_AUTOTUNE_MIN_REPEATS": "3",
           "TUNEFORGE_AUTOTUNE_SETTLE_S": "0"}
    code = textwrap.dedent(CHILD)
    children = [subprocess.Popen([sys.executable, "-c", code, str(barrier), str(PROCESSES)], env=env,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for _ in range(PROCESSES)]
    results = []
    for child in children:
        out, err = child.communicate(timeout=180)
        assert child.returncode == 0, f"child failed:\n{out}\n{err}"
        results.append(json.loads(out.strip().splitlines()[-1]))

    assert {r["winner"] for r in results} == {"add_1ms"}, results
    tuned = [r for r in results if r["source"] == "tuned"]
    assert len(tuned) == 1, results
    assert tuned[0]["benchmarked"] == ["add_1ms", "add_3ms", "add_6ms"]
    assert all(r["source"] == "records" and r["benchmarked"] == [] for r in results if r is not tuned[0]), results
    runners: dict[str, set[int]] = defaultdict(set)
    for line in run_log.read_text().splitlines():
        name, pid = line.split()
        runners[name].add(int(pid))
    assert dict(runners) == {name: {tuned[0]["pid"]} for name in ("add_1ms", "add_3ms", "add_6ms")}, runners
