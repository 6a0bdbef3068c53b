"""Shared by the remote-tier tests (test_remote.py, test_remote_write_behind.py, test_remote_outages.py):
the records and artifacts they store, waiting and warning helpers, and their fixtures.

The fixtures are imported by those modules, not put in conftest.py: `fresh_warnings` is autouse and
must not reach the rest of the suite. `make_cache` is defined under another function name so that a
test module can import it without its tests' `make_cache` argument shadowing the import (ruff F811).
"""

from __future__ import annotations

import _ctypes
import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tuneforge import warn_once
from tuneforge.store.entry import make_manifest
from tuneforge.store.records import Record
from tuneforge.store.remote import RemoteCache

LOGGER = "tuneforge.store.remote"
KEY = "selkey-0123456789abcdef"
ART = "cppabcdefghijklmnop234567"


def record(key: str = KEY, choice: str = "c1", median_ms: float = 1.5) -> Record:
    return Record(key=key, choice=choice, op="mm", choice_name=f"tile-{choice}", status="ok",
                  median_ms=median_ms, min_ms=median_ms * 0.9, count=7, method="cpu", params={"tile": 16},
                  inputs='[["f32",[64,64]]]', system="sys1", info={"note": "x"}, created=1700000000.25)


def elf_library(size: int = 23000) -> bytes:
    """A file that reads as a shared library of this machine (a real one's ELF header) and is random after it."""
    with open(_ctypes.__file__, "rb") as f:
        header = f.read(64)
    return header + os.urandom(3000) + bytes(size - 3064)


def artifact(key: str = ART, files: dict[str, bytes] | None = None) -> tuple[dict[str, Any], dict[str, bytes]]:
    files = files if files is not None else {"kernel.so": elf_library(),
                                             "source.cpp": b"extern \"C\" void k() {}\n"}
    table = {name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()} for name, data in files.items()}
    return make_manifest(key, table, {"lang": "c++"}, {"source": "abc", "flags": ["-O3"]}), files


@pytest.fixture(autouse=True)
def fresh_warnings() -> None:
    warn_once.forget()  # one warning per process per kind: each test starts with none given


@pytest.fixture(name="make_cache")
def make_cache_fixture() -> Iterator[Callable[..., RemoteCache]]:
    made: list[RemoteCache] = []

    def make(url: str, **kwargs: Any) -> RemoteCache:
        # not the 0.5 s default: on a loaded CI host one slow round trip would be an error and open the breaker
        # (tests of time-outs pass their own)
        kwargs.setdefault("timeout_s", 10.0)
        cache = RemoteCache(url, **kwargs)
        made.append(cache)
        return cache

    yield make
    for cache in made:
        cache.close()


def wait_for(condition: Callable[[], bool], what: str, deadline_s: float = 20.0) -> None:
    """Poll until ``condition()`` holds: a generous deadline instead of a fixed sleep (the CI machine is loaded)."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {deadline_s}s waiting for {what}"
        time.sleep(0.02)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno >= logging.WARNING]
