"""Large inputs that no choice wrote into are neither compared nor copied back after each choice.

Every choice's checked run is followed by a comparison of each input with its snapshot (did it write into its
inputs? then they are restored before each of its timed runs), and every choice ends with all arguments copied
back. For a 1x4096x4096 fp64 GEMV that was 25 ms each for B's 128 MB, 0.7 s of a 4 s cold tuning of 13
choices. In a benchmark worker, the whole pages of each input of GUARD_MIN_BYTES or more are made read-only
while the choices run (input_guard.cpp): a write into one faults once, is marked, and goes through. An input
whose pages were not written and whose few bytes outside them (the first and last partial pages) match the
snapshot is unchanged: a choice that writes into its inputs is still found, restored and reported as before.

Only in a benchmark worker (`enable`): a SIGSEGV handler and read-only pages are not for a user's process. Where
the helper cannot be built or a page cannot be protected, the inputs are compared and copied as before.
"""

from __future__ import annotations

import ctypes
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tuneforge.tune import verify

log = logging.getLogger("tuneforge.tune")

GUARD_MIN_BYTES = 16 << 20  # below this, comparing and copying an input costs less than 2 ms
_SLOTS = 64  # input_guard.cpp's
_SOURCE = Path(__file__).with_name("input_guard.cpp")

_enabled = False
_library: ctypes.CDLL | None = None
_load_failed = False
_free_slots = list(range(_SLOTS))


def enable() -> None:
    """Called by the benchmark worker: its trials guard their large inputs."""
    global _enabled
    _enabled = True


def _helper() -> ctypes.CDLL | None:
    global _library, _load_failed
    if _library is None and not _load_failed:
        try:
            from tuneforge.compile import cpp

            library = cpp.load(_SOURCE.read_text(), openmp=False)
            library.tf_guard_arm.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t]
            library.tf_guard_written.argtypes = library.tf_guard_disarm.argtypes = [ctypes.c_int]
            _library = library
        except Exception as exc:  # no compiler, say: compare and copy as before
            _load_failed = True
            log.debug("input guard unavailable (%s): inputs are compared after each choice", exc)
    return _library


def _span(value: Any) -> tuple[int, int] | None:
    """(address, bytes) of a contiguous array in host memory, else None."""
    if isinstance(value, np.ndarray):
        return (value.ctypes.data, value.nbytes) if value.flags.c_contiguous else None
    device = getattr(value, "device", None)
    if getattr(device, "type", None) == "cpu" and hasattr(value, "data_ptr") and value.is_contiguous():
        return value.data_ptr(), value.numel() * value.element_size()
    return None


class InputGuard:
    """Watches the large inputs among `args` (`initial`: their snapshots) for writes, until `close()`."""

    def __init__(self, args: Sequence[Any], initial: Sequence[Any], inputs: Sequence[int]) -> None:
        self._args, self._initial = list(args), list(initial)  # held: no armed page is freed under the guard
        self._inputs = list(inputs)
        self._pages: dict[int, tuple[int, int, int]] = {}  # input index -> (slot, first page, end of the last)
        library = _helper() if _enabled and sys.platform.startswith("linux") and _large(args, inputs) else None
        if library is None:
            return
        page = os.sysconf("SC_PAGE_SIZE")
        for i in inputs:
            span, saved = _span(args[i]), _span(initial[i])
            if span is None or saved is None or span[1] < GUARD_MIN_BYTES or saved[1] != span[1] or not _free_slots:
                continue
            start, end = -(-span[0] // page) * page, (span[0] + span[1]) // page * page
            slot = _free_slots.pop()
            self._pages[i] = (slot, start, end)
            if library.tf_guard_arm(slot, start, end - start) != 0:
                self._release(i)

    def unchanged(self, i: int) -> bool:
        """Whether input `i` is watched, none of its pages was written and its bytes outside them match."""
        watched = self._pages.get(i)
        if watched is None or _library is None or _library.tf_guard_written(watched[0]):
            return False
        _, start, end = watched
        address, size = _span(self._args[i]) or (0, 0)
        saved = (_span(self._initial[i]) or (0, 0))[0]
        memcmp = verify.memcmp
        if memcmp is None:
            return False
        head, tail = start - address, address + size - end
        return (head == 0 or memcmp(address, saved, head) == 0) and \
            (tail == 0 or memcmp(end, saved + (end - address), tail) == 0)

    def changed(self, args: Sequence[Any], initial: Sequence[Any]) -> list[int]:
        """verify.changed of the inputs, without comparing those the guard saw unchanged (`args` and `initial` may
        be cuts of the guarded arrays and their snapshots: an unchanged array has no changed cut)."""
        return verify.changed(args, initial, [i for i in self._inputs if not self.unchanged(i)])

    def restore(self) -> None:
        """verify.restore of every argument from its snapshot but the inputs the guard saw unchanged; the written
        ones are watched again once restored."""
        if self._pages and _library is not None:
            _library.tf_guard_install()  # a choice may have loaded a library with a SIGSEGV handler of its own
        kept = {i for i in self._pages if self.unchanged(i)}
        verify.restore(self._args, self._initial, [i for i in range(len(self._args)) if i not in kept])
        for i, (slot, start, end) in list(self._pages.items()):
            if i not in kept and _library is not None and _library.tf_guard_arm(slot, start, end - start) != 0:
                self._release(i)

    def close(self) -> None:
        """Make every watched page writable again (before the arrays may be freed or handed out)."""
        for i in list(self._pages):
            self._release(i)

    def _release(self, i: int) -> None:
        slot = self._pages.pop(i)[0]
        if _library is not None:
            _library.tf_guard_disarm(slot)
        _free_slots.append(slot)

    def __del__(self) -> None:
        self.close()


def _large(args: Sequence[Any], inputs: Sequence[int]) -> bool:
    return any((span := _span(args[i])) is not None and span[1] >= GUARD_MIN_BYTES for i in inputs)
