"""Choices used by the tuning tests: module-level so their source hashes are stable across processes."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from tuneforge.tune.choices import CallableChoice
from tuneforge.tune.template import KernelTemplate


def add(a: Any, b: Any, out: Any) -> None:
    np.add(a, b, out=out)


def add_slow(a: Any, b: Any, out: Any) -> None:
    time.sleep(0.004)
    np.add(a, b, out=out)


def add_slower(a: Any, b: Any, out: Any) -> None:
    time.sleep(0.008)
    np.add(a, b, out=out)


def add_wrong(a: Any, b: Any, out: Any) -> None:
    np.subtract(a, b, out=out)


def add_partial(a: Any, b: Any, out: Any) -> None:
    np.add(a[:-1], b[:-1], out=out[:-1])  # forgets the last element


def add_raises(a: Any, b: Any, out: Any) -> None:
    raise RuntimeError("kernel exploded")


def add_in_place(a: Any, b: Any, out: Any) -> None:
    a += b  # writes into its input
    out[...] = a


ADD_SOURCE = r"""
#include <stdint.h>
extern "C" void add_kernel(const double* a, const double* b, double* out, int64_t n) {
    {{ BODY }}
}
"""


def _launch(kernel: Any, args: Sequence[Any], config: Mapping[str, Any]) -> None:
    a, b, out = args
    kernel(a, b, out, a.size)


ADD_TEMPLATE = KernelTemplate("test_add", ADD_SOURCE,
                              signature="void add_kernel(const double* a, const double* b, double* out, int64_t n)",
                              launcher=_launch)
GOOD_BODY = "for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];"
BROKEN_BODY = "this is not C++;"
WRONG_BODY = "for (int64_t i = 0; i < n; ++i) out[i] = a[i] * b[i];"
IN_PLACE_BODY = "double* w = const_cast<double*>(a); for (int64_t i = 0; i < n; ++i) { w[i] += b[i]; out[i] = w[i]; }"
# right, but from its second run on it writes into `a` too: only its checked run leaves the inputs as they were
LATER_WRITE_BODY = GOOD_BODY + " static int runs = 0; if (++runs > 1) const_cast<double*>(a)[n / 2] = -1.0;"


def time_sleep(seconds: float) -> None:
    time.sleep(seconds)


CRASH_SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
// {{ LABEL }}
extern "C" void crash_kernel(const double* a, const double* b, double* out, int64_t n) {
    {{ BODY }}
}
"""

CRASH_TEMPLATE = KernelTemplate(
    "test_crash", CRASH_SOURCE,
    signature="void crash_kernel(const double* a, const double* b, double* out, int64_t n)", launcher=_launch)

BAD_BODIES = {
    "segfault": "volatile double* p = nullptr; *p = a[0];",
    "abort": "abort();",
    "hang": "for (;;) { __asm__ volatile(\"\"); }",
    "wrong": "for (int64_t i = 0; i < n; ++i) out[i] = a[i] - b[i];",
    "broken": "this will not compile;",
    "good": "for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];",
    # ~60x "good" at n = 256 (30 us a call against 0.3-0.55 here). At 50 passes it took 1.5 us, under 3x "good",
    # and this host's cores slow down 1.3-1.6x in spells of ms (docs/design.md, stop 52): enough, it seems, for a
    # 3 ms timing (quick_tuning) to go the other way or for "good" to be abandoned after a slow start (twice on CI a
    # test that asked for "good" got good_slow; never reproduced here)
    "good_slow": "for (int r = 0; r < 1000; ++r) for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i] + 0 * r;",
    # right, but about a second longer to compile: the compiler evaluates 400,000 iterations of a loop
    "slow_build": "static constexpr long z = [] { long s = 0; for (int j = 0; j < 2; ++j) for (long i = 0; "
                  "i < 200000; ++i) s += i % 7; return s - s; }(); "
                  "for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i] + z;",
}


def crash_choices(names: Sequence[str]) -> list[Any]:
    return [choice for name in names
            for choice in CRASH_TEMPLATE.choices([{"BODY": BAD_BODIES[name], "LABEL": name}])]


class GatedBuild(CallableChoice):
    """`fn` with a configuration, whose build ends when the test completes `gate`: a slow compile without the
    clock, for tests of what runs while builds are pending. Marked native, so that its trials go to the benchmark
    worker as a compiled choice's do (the gate stays here: it is no part of what runs)."""

    is_native = True

    def __init__(self, fn: Callable[..., Any], config: Mapping[str, Any], gate: Future[Any]) -> None:
        super().__init__(fn, config)
        self.gate = gate

    def build(self, builder: Any = None) -> Future[Any]:
        return self.gate

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "gate"}


def add_configured(a: Any, b: Any, out: Any, label: str = "") -> None:
    np.add(a, b, out=out)



def bind_add(args: Sequence[Any]) -> Callable[[], Any]:
    """add on `args` (a, b, out), as a call of no arguments: what ExternChoice(..., bind=bind_add) is timed by."""
    a, b, out = args
    return functools.partial(np.add, a, b, out=out)


def _launch_slowly(kernel: Any, args: Sequence[Any], config: Mapping[str, Any]) -> None:
    time.sleep(0.008)  # a launcher's per-call work that its binder does once
    _launch(kernel, args, config)


def _bind(kernel: Any, args: Sequence[Any], config: Mapping[str, Any]) -> Callable[[], Any]:
    a, b, out = args
    return functools.partial(kernel, a, b, out, a.size)


# ADD_TEMPLATE's kernel with a slow launcher and a binder that is not: timing calls the binder's call
BOUND_ADD_TEMPLATE = KernelTemplate("test_add_bound", ADD_SOURCE,
                                    signature="void add_kernel(const double* a, const double* b, double* out, "
                                              "int64_t n)", launcher=_launch_slowly, binder=_bind)
