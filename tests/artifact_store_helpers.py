"""Shared by the artifact-store tests (test_store_artifacts.py, test_store_artifacts_concurrency.py,
test_store_artifacts_corruption.py): keys, store scripts run in child processes, a one-file build,
and a store root per test.

The `root` fixture is defined under another function name so that a test module can import it
without its tests' `root` argument shadowing the import (ruff F811); it is not in conftest.py because
the name is too generic for the whole suite.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

KEY = "ab12cd34ef56"
KEY2 = "ab99cd34ef56"

_PRELUDE = """
import sys, time, pathlib
from tuneforge.store.artifacts import ArtifactStore
root, work = sys.argv[1], pathlib.Path(sys.argv[2])
"""


def _script(body: str) -> str:
    return _PRELUDE + textwrap.dedent(body)


def spawn(body: str, *args: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", _script(body), *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_script(body: str, *args: object) -> str:
    proc = subprocess.run([sys.executable, "-c", _script(body), *map(str, args)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def file_writer(name: str, data: bytes) -> Callable[[Path], Mapping[str, Any] | None]:
    def build(staging: Path) -> None:
        (staging / name).write_bytes(data)
    return build


@pytest.fixture(name="root")
def root_fixture(tmp_path: Path) -> Path:
    return tmp_path / "store"
