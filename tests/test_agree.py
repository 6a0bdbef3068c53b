"""The ranks of one job take one pick per selection through the shared tier (tune/agree.py), on a real redis-server.

Each rank has a cache of its own and measures on its own; the choices are rigged so that, alone, rank 0 would
pick one and the other ranks the other.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path

# a round trip may take seconds on a loaded CI host: not the 0.5 s default, which would count it as an outage
REMOTE_ENV = {"TUNEFORGE_REMOTE_TIMEOUT_S": "10", "TUNEFORGE_REMOTE_ALLOW_UNSIGNED": "1"}

_CHOICES = """
import os, time

import numpy as np


def _work(x, out, slow):
    if slow:
        time.sleep(0.004)
    np.add(x, 1.0, out=out)


def plus_a(x, out):  # slow on rank 0
    _work(x, out, os.environ["RANK"] == "0")


def plus_b(x, out):  # slow on the other ranks
    _work(x, out, os.environ["RANK"] != "0")
"""

_RANK = """
import sys
import numpy as np
import tuneforge
from tuneforge.tune.choices import ExternChoice
from rigged import plus_a, plus_b

x = np.zeros(1000)
selection = tuneforge.select_detailed("rigged_plus", [ExternChoice(plus_a), ExternChoice(plus_b)], [x],
                                      out=np.empty(1000))
print("PICK", selection.choice.name, selection.source)
print("REDIS-PY", "redis" in sys.modules)
"""


def start_ranks(tmp_path: Path, ranks: Sequence[int], env: dict[str, str]) -> list[subprocess.Popen[str]]:
    (tmp_path / "rigged.py").write_text(_CHOICES)
    procs = []
    for rank in ranks:
        rank_env = {**os.environ, **env, "RANK": str(rank), "PYTHONPATH": str(tmp_path),
                    "TUNEFORGE_CACHE_DIR": str(tmp_path / f"rank{rank}"),
                    "TUNEFORGE_AUTOTUNE_BENCH_TIME_S": "0.2", "TUNEFORGE_AUTOTUNE_MIN_REPEATS": "20"}
        procs.append(subprocess.Popen([sys.executable, "-c", textwrap.dedent(_RANK)], env=rank_env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    return procs


def picks(procs: list[subprocess.Popen[str]]) -> list[tuple[str, str]]:
    found = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr
        line = next(line for line in stdout.splitlines() if line.startswith("PICK "))
        _, name, source = line.split()
        found.append((name, source))
    return found


def test_ranks_selecting_at_once_all_take_the_first_pick(tmp_path: Path, redis_clean: str) -> None:
    env = {"TUNEFORGE_REMOTE_URL": redis_clean, **REMOTE_ENV}
    found = picks(start_ranks(tmp_path, range(3), env))
    assert len({name for name, _ in found}) == 1, found
    assert sorted(source for _, source in found) == ["agreed", "agreed", "tuned"], found


def test_without_agreement_the_rigged_ranks_pick_differently(tmp_path: Path, redis_clean: str) -> None:
    """What the agreement prevents (and that the rigging works): each rank alone picks its own fastest."""
    env = {"TUNEFORGE_REMOTE_URL": redis_clean, **REMOTE_ENV, "TUNEFORGE_REMOTE_AGREE": "0"}
    found = picks(start_ranks(tmp_path, range(2), {**env, "TUNEFORGE_AUTOTUNE_FORCE": "1"}))
    assert [name for name, _ in found] == ["plus_b", "plus_a"], found


def test_a_rank_waiting_for_a_lease_holder_that_died_measures_itself(tmp_path: Path, redis_clean: str) -> None:
    from tuneforge import config
    from tuneforge.store.remote import RemoteCache

    # A lease taken by a "rank" that then died: it will never publish.
    with config.patch(remote_allow_unsigned=True):
        cache = RemoteCache(redis_clean)
        probe = subprocess.run([sys.executable, "-c", textwrap.dedent("""
            import numpy as np, tuneforge.tune.select as s
            from tuneforge.tune.choices import ExternChoice
            print(s.selection_key("rigged_plus", [np.zeros(1000), np.empty(1000)]))
        """)], capture_output=True, text=True, check=True, env={**os.environ, "TUNEFORGE_CACHE_DIR": str(tmp_path)})
        key = probe.stdout.strip()
        assert cache.put_first("lease", key, b"gone:1", ttl_s=60) is True
        cache.close()
    env = {"TUNEFORGE_REMOTE_URL": redis_clean, **REMOTE_ENV,
           "TUNEFORGE_REMOTE_AGREE_WAIT_S": "1.5"}
    started = time.monotonic()
    found = picks(start_ranks(tmp_path, [0], env))
    assert found == [("plus_b", "tuned")], found  # measured (on rank 0 plus_a is slow) ...
    assert time.monotonic() - started >= 1.5  # ... after waiting out the lease's holder


def test_a_forced_retune_replaces_the_pick_that_later_ranks_take(tmp_path: Path, redis_clean: str) -> None:
    env = {"TUNEFORGE_REMOTE_URL": redis_clean, **REMOTE_ENV}
    (rank1,) = picks(start_ranks(tmp_path, [1], env))  # rank 1 alone first: plus_b is slow there
    assert rank1 == ("plus_a", "tuned")
    forced = picks(start_ranks(tmp_path, [0], {**env, "TUNEFORGE_AUTOTUNE_FORCE": "1"}))
    assert forced == [("plus_b", "tuned")]  # rank 0 re-measured: its own pick replaces the published one
    later = picks(start_ranks(tmp_path, [1], env))  # rank 1 again: its records say plus_a, the pick plus_b
    assert later == [("plus_b", "agreed")], later


def test_a_rank_deciding_from_shared_records_reads_the_pick_and_imports_no_redis_client(
        tmp_path: Path, redis_clean: str) -> None:
    env = {"TUNEFORGE_REMOTE_URL": redis_clean, **REMOTE_ENV}
    (first,) = start_ranks(tmp_path, [1], env)
    stdout, stderr = first.communicate(timeout=300)
    assert "PICK plus_a tuned" in stdout and "REDIS-PY True" in stdout, stderr  # it measured and published
    (warm,) = start_ranks(tmp_path, [2], env)  # a cache of its own: the decision comes from the remote's records
    stdout, stderr = warm.communicate(timeout=300)
    assert warm.returncode == 0, stderr
    assert "PICK plus_a" in stdout and "REDIS-PY False" in stdout, (stdout, stderr)
