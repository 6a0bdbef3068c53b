"""A real local Ray cluster for tests: ``ray start --head`` plus worker nodes on 127.0.0.1, each its own raylet.

Each node runs with a tuneforge cache directory of its own (as separate machines have), so what one node
builds reaches another only through the shared tier. Everything the cluster started is found by its temporary
directory (in every Ray process's command line) and killed at the end: ``ray stop`` would stop every Ray
cluster of the user on this machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .redis_server import free_port

RAY = shutil.which("ray", path=os.path.dirname(sys.executable)) or shutil.which("ray")
# For the cluster's nodes and its drivers. Without token authentication: where a ~/.ray/auth_token exists (any
# ray.init on this machine writes one) Ray 2.60's head enables it and a worker node's `ray start` is refused.
RAY_TEST_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def ray_processes(marker: str) -> list[int]:
    """Pids of the processes whose command line mentions `marker` (the cluster's temporary directory)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if marker.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
    return found


def descendants(roots: list[int]) -> list[int]:
    """`roots` and every process below them."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, ValueError, IndexError):
                stat = Path(f"/proc/{entry}/stat").read_text()
                parents[int(entry)] = int(stat.rpartition(")")[2].split()[1])
    found, frontier = set(roots), list(roots)
    while frontier:
        pid = frontier.pop()
        for child, parent in parents.items():
            if parent == pid and child not in found:
                found.add(child)
                frontier.append(child)
    return sorted(found)


class RayCluster:
    """A head node and worker nodes on this machine (one CPU each unless told), in `root`."""

    def __init__(self, root: Path, env: dict[str, str] | None = None) -> None:
        # Ray's unix sockets live under its temp dir, whose path must stay short (108 bytes for a socket path)
        self.temp = Path(tempfile.mkdtemp(prefix="tfray-", dir="/tmp"))
        self.root = root
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.env = {**os.environ, **(env or {}), **RAY_TEST_ENV}
        self.nodes: dict[str, list[int]] = {}  # name -> the pids its `ray start` left running

    def _start(self, name: str, args: list[str], cpus: int) -> None:
        assert RAY is not None, "the ray command is not installed"
        cache = self.root / name
        cache.mkdir(parents=True, exist_ok=True)
        before = set(ray_processes(str(self.temp)))
        env = {**self.env, "TUNEFORGE_CACHE_DIR": str(cache)}
        subprocess.run([RAY, "start", *args, f"--num-cpus={cpus}", "--num-gpus=0", "--disable-usage-stats",
                        "--object-store-memory=80000000", "--node-ip-address=127.0.0.1", f"--temp-dir={self.temp}"],
                       env=env, check=True, capture_output=True, text=True, timeout=180)
        self.nodes[name] = sorted(set(ray_processes(str(self.temp))) - before)

    def start_head(self, cpus: int = 1) -> None:
        self._start("head", ["--head", f"--port={self.port}", "--include-dashboard=false"], cpus)

    def add_worker(self, name: str, cpus: int = 1) -> None:
        self._start(name, [f"--address={self.address}"], cpus)

    def kill_node(self, name: str) -> None:
        """SIGKILL a node's processes (its raylet and everything under it: workers, actors, their benchmark
        workers and compilers) at once: the machine is gone."""
        for pid in descendants(self.nodes.pop(name)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def stop(self) -> None:
        for _ in range(3):  # workers started meanwhile are found on the next pass
            pids = ray_processes(str(self.temp))
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.5)
        shutil.rmtree(self.temp, ignore_errors=True)
