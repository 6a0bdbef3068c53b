"""Large copies and fills in parts on threads (tune/bulk.py): the same result as numpy's own, on every layout."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from tuneforge.tune import bulk, verify


@pytest.fixture
def small_parallel_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    # parts from 4 KB, so that the tests' arrays are split without allocating 16 MB each
    monkeypatch.setattr(bulk, "PARALLEL_BYTES", 4096)
    monkeypatch.setattr(bulk, "usable_cores", lambda: 3)


def test_large_contiguous_arrays_are_split_and_others_are_not(small_parallel_bytes: None) -> None:
    big = np.zeros((64, 33), dtype=np.float32)  # 8448 bytes: split among the 3 cores allowed
    assert bulk.parts_for(big) == 3
    assert bulk.parts_for(np.zeros(100, dtype=np.float32)) == 1  # below PARALLEL_BYTES
    assert bulk.parts_for(np.zeros((33, 64), dtype=np.float32).T) == 1  # not C-contiguous
    assert bulk.parts_for(big, np.zeros((64, 33), dtype=np.float64)) == 1  # another dtype
    assert bulk.parts_for(big, np.zeros((64, 34), dtype=np.float32)) == 1  # another size


def test_each_part_runs_once_on_threads_of_its_own() -> None:
    seen: list[tuple[int, int, str]] = []
    lock = threading.Lock()

    def work(index: int, part: slice) -> None:
        with lock:
            seen.append((index, part.start, part.stop, threading.current_thread().name))

    bulk.in_parts(work, 10, 3)
    assert sorted(item[:3] for item in seen) == [(0, 0, 3), (1, 3, 6), (2, 6, 10)]
    assert all(item[3].startswith("tuneforge-bulk") for item in seen)
    seen.clear()
    bulk.in_parts(work, 10, 1)  # one part: inline, on the caller's thread
    assert seen == [(0, 0, 10, threading.current_thread().name)]
    seen.clear()
    bulk.in_parts(work, 10, 3, workers=1)  # three parts on one worker: inline, in order
    assert seen == [(i, start, stop, threading.current_thread().name)
                    for i, (start, stop) in enumerate([(0, 3), (3, 6), (6, 10)])]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int16", "complex64"])
def test_copies_and_fills_in_parts_equal_numpys(small_parallel_bytes: None, dtype: str) -> None:
    rng = np.random.default_rng(1)
    source = (rng.standard_normal((97, 61)) * 100).astype(dtype)
    copied = bulk.copy(source)
    assert copied.dtype == source.dtype and copied.shape == source.shape and copied.flags.c_contiguous
    assert not np.shares_memory(copied, source)
    np.testing.assert_array_equal(copied, source)
    target = np.zeros_like(source)
    bulk.copy_into(target, source)
    np.testing.assert_array_equal(target, source)
    bulk.fill(target, 7)
    assert (target == 7).all()


def test_other_layouts_go_through_numpy_unchanged(small_parallel_bytes: None) -> None:
    base = np.arange(64 * 80, dtype=np.float64).reshape(64, 80)
    strided = base[:, ::2]  # not contiguous: copied by numpy itself, into a contiguous array
    copied = bulk.copy(strided)
    np.testing.assert_array_equal(copied, strided)
    target = np.zeros((64, 40))
    bulk.copy_into(target, strided)
    np.testing.assert_array_equal(target, strided)
    bulk.copy_into(target, 3.0)  # a scalar broadcast, as np.copyto does
    assert (target == 3.0).all()
    bulk.fill(strided, -1.0)
    assert (base[:, ::2] == -1.0).all() and (base[:, 1::2] >= 0).all()


def test_snapshot_restore_and_poison_of_large_arrays(small_parallel_bytes: None) -> None:
    rng = np.random.default_rng(2)
    a = rng.standard_normal((128, 64))
    out = np.empty((128, 64))
    args: list[Any] = [a, 2.0, out]
    verify.poison(out)
    assert np.isnan(out).all()
    saved = verify.snapshot(args)
    assert saved[1] is None and np.isnan(saved[2]).all()
    a[5:9] = 0.0
    out[:] = 1.0
    verify.restore(args, saved)
    np.testing.assert_array_equal(a, saved[0])
    assert np.isnan(out).all()
