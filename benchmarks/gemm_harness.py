"""A shape's kernel configurations against OpenBLAS with no Python between the calls: for differences of a few percent.

    python benchmarks/gemm_harness.py --shape 512x512x512 [--dtype float32] [--threads 1 2] [--space default]
                                      [--rounds 21] [--repeats 0] [--settle-ms 200] [--blocking MC,KC,NC ...]

`gemm.py` times tuneforge.gemm and numpy.matmul from Python: a call costs each side about a microsecond more, and
on this host the speed of either moves by 5-10% from one second to the next, so two kernels 3% apart are not told
apart there. Here every kernel configuration of the shape's space (the candidates a tuning of that shape times,
compiled by tuneforge and called by their C addresses, with the arguments the op's prepared call passes; with
--blocking, the blocked ones again with other blockings) and OpenBLAS's cblas_?gemm (numpy's own library, as
threadpoolctl finds it) run from one C loop, in interleaved rounds: each round visits every variant, in reverse
order every other round, and times a burst of calls after 5 ms of untimed ones. A variant's time is the median of
its bursts' medians; its ratio is the median over rounds of OpenBLAS's burst median over its own (> 1: faster than
OpenBLAS), and "wins" counts the rounds where it was faster (a sign test: 15 of 21 or more is a 1-in-25 chance for
two equal variants). Before each burst the loop sleeps --settle-ms: OpenBLAS's threads spin for ~0.1 s after a
call and would take a core from a two-thread kernel timed next.

Each thread count runs in a child with blas_env.child_env (OPENBLAS_CORETYPE/L2_SIZE unset, every library's
threads set); the table names OpenBLAS's core type. OpenBLAS is called directly: numpy.matmul's own cost per call
(2-4 us here, a third of a 64^3 product) is in gemm.py's figures, not in these. Nothing is written: it is a tool
for kernel work, not a target's check.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import tempfile
from typing import Any

from blas_env import blas_report, child_env
from cli_args import three_sizes
from gemm import parse_shape, shape_text

HARNESS_SOURCE = r"""
#include <stdint.h>
#include <time.h>
#include <algorithm>
#include <vector>

typedef void (*Kernel)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                       int64_t, int64_t, int64_t, int64_t, double, double, const void*, const void*, void*,
                       const void*);
// cblas_?gemm, row-major, no transposes; an LP64 build's int arguments take the low half of these
typedef void (*Sgemm)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float, const void*, int64_t, const void*,
                      int64_t, float, void*, int64_t);
typedef void (*Dgemm)(int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double, const void*, int64_t,
                      const void*, int64_t, double, void*, int64_t);

static double now() {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

// kinds[v]: 0 a kernel (args: its 14 leading arguments), 1 cblas_sgemm, 2 cblas_dgemm (args: M, N, K, lda, ldb, ldc).
static void call(int64_t kind, uint64_t fn, const int64_t* s, const void* a, const void* b, void* c) {
    if (kind == 0)
        ((Kernel)fn)(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7], s[8], s[9], s[10], s[11], s[12], s[13], 1.0,
                     0.0, a, b, c, nullptr);
    else if (kind == 1)
        ((Sgemm)fn)(101, 111, 111, s[0], s[1], s[2], 1.0f, a, s[3], b, s[4], 0.0f, c, s[5]);
    else
        ((Dgemm)fn)(101, 111, 111, s[0], s[1], s[2], 1.0, a, s[3], b, s[4], 0.0, c, s[5]);
}

// out[round * n + v]: the median of variant v's burst in that round, in seconds.
extern "C" void harness(int64_t n, const int64_t* kinds, const uint64_t* fns, const int64_t* args, const void* a,
                        const void* b, void* c, int64_t repeats, int64_t rounds, int64_t settle_ns, double* out) {
    std::vector<double> times((size_t)repeats);
    for (int64_t r = 0; r < rounds; ++r) {
        for (int64_t j = 0; j < n; ++j) {
            const int64_t v = r % 2 ? n - 1 - j : j;
            if (settle_ns > 0) {
                const timespec pause{settle_ns / 1000000000, settle_ns % 1000000000};
                nanosleep(&pause, nullptr);
            }
            // untimed calls for 5 ms (one at least): a core left idle through the pause comes back to speed over
            // a few milliseconds, and a burst of small calls would be timed on the way up
            for (const double warm = now() + 0.005; now() < warm;) call(kinds[v], fns[v], args + 14 * v, a, b, c);
            for (int64_t i = 0; i < repeats; ++i) {
                const double started = now();
                call(kinds[v], fns[v], args + 14 * v, a, b, c);
                times[(size_t)i] = now() - started;
            }
            std::sort(times.begin(), times.end());
            out[r * n + v] = times[(size_t)(repeats / 2)];
        }
    }
}
"""


def parse_blocking(text: str) -> tuple[int, int, int]:
    return three_sizes(text, ",", "MC, KC and NC", "132,256,128")


def openblas_gemm(dtype: str) -> int:
    """The address of numpy's OpenBLAS cblas_sgemm or cblas_dgemm (whatever its symbol prefix and suffix)."""
    from threadpoolctl import threadpool_info

    letter = "s" if dtype == "float32" else "d"
    for pool in threadpool_info():
        if pool.get("internal_api") != "openblas":
            continue
        library = ctypes.CDLL(pool["filepath"])
        for name in (f"scipy_cblas_{letter}gemm64_", f"cblas_{letter}gemm64_", f"cblas_{letter}gemm"):
            if hasattr(library, name):
                return ctypes.cast(getattr(library, name), ctypes.c_void_p).value or 0
    raise SystemExit("numpy's OpenBLAS was not found (threadpoolctl lists no openblas library)")


def child(shape: tuple[int, int, int], dtype: str, space: str, rounds: int, repeats: int, settle_ms: float,
          blockings: list[tuple[int, int, int]]) -> dict[str, Any]:
    import numpy as np

    import tuneforge
    from tuneforge.compile.pool import default_pool
    from tuneforge.kernels.gemm import Problem, dispatch
    from tuneforge.kernels.gemm import choices as gemm_choices
    from tuneforge.kernels.gemm.template import TEMPLATE, static_args
    from tuneforge.tune.template import TemplateChoice

    m, n, k = shape
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    c = np.empty((m, n), dtype=dtype)
    kernels = [choice for choice in gemm_choices(Problem(m, n, k, dtype), space)
               if isinstance(choice, TemplateChoice)]
    blocked = [choice for choice in kernels if choice.template is TEMPLATE]
    for mc, kc, nc in blockings:  # each blocked configuration again with this blocking (run-time: no new build)
        kernels += TEMPLATE.choices([{**choice.config, "MC": mc, "KC": kc, "NC": nc} for choice in blocked])
    seen: set[str] = set()
    kernels = [choice for choice in kernels if not (choice.hash_key in seen or seen.add(choice.hash_key))]
    pool = default_pool()
    pool.wait([choice.build(pool) for choice in kernels])
    names, kinds, fns, args = ["openblas"], [1 if dtype == "float32" else 2], [openblas_gemm(dtype)], \
        [m, n, k, k, n, n] + [0] * 8
    expected = a.astype(np.float64) @ b.astype(np.float64)
    for choice in kernels:
        static = static_args(a, b, c, choice.config)
        choice.kernel()(*static, 1.0, 0.0, a, b, c, None)  # its result, checked once
        error = float(np.abs(c - expected).max() / max(1.0, float(np.abs(expected).max())))
        if error > (1e-4 if dtype == "float32" else 1e-10):
            raise SystemExit(f"{choice.name} ({choice.info}) is wrong: relative error {error:.2e}")
        names.append(f"{choice.name} {choice.info}")
        kinds.append(0)
        fns.append(dispatch.kernel_address(choice.kernel()))
        args += list(static)
    count = len(names)
    flops = 2 * m * n * k
    lib = tuneforge.cpp.load(HARNESS_SOURCE, flags=["-O2"])
    out = (ctypes.c_double * (rounds * count))()
    bursts = repeats or max(3, min(51, int(0.02 / max(flops / 100e9, 1e-7))))  # ~20 ms of calls at 100 GFLOP/s
    lib.harness(ctypes.c_int64(count), (ctypes.c_int64 * count)(*kinds), (ctypes.c_uint64 * count)(*fns),
                (ctypes.c_int64 * len(args))(*args), ctypes.c_void_p(a.ctypes.data), ctypes.c_void_p(b.ctypes.data),
                ctypes.c_void_p(c.ctypes.data), ctypes.c_int64(bursts), ctypes.c_int64(rounds),
                ctypes.c_int64(int(settle_ms * 1e6)), out)
    per_round = [[out[r * count + v] for v in range(count)] for r in range(rounds)]
    return {"names": names, "per_round": per_round, "flops": flops, "bursts": bursts, "blas": blas_report(False)}


def table(result: dict[str, Any], threads: int) -> str:
    import statistics

    rounds = result["per_round"]
    lines = [f"{threads}T {result['blas']}; {len(rounds)} rounds of {result['bursts']} calls",
             f"{'variant':<70} {'us':>9} {'GFLOP/s':>8} {'/openblas':>9} {'wins':>6}"]
    for v, name in enumerate(result["names"]):
        median = statistics.median(r[v] for r in rounds)
        row = f"{name[:70]:<70} {median * 1e6:9.1f} {result['flops'] / median / 1e9:8.1f}"
        if v:  # against OpenBLAS, variant 0: the median of the rounds' ratios, and the rounds won
            ratio = statistics.median(r[0] / r[v] for r in rounds)
            row += f" {ratio:8.3f}x {sum(r[v] < r[0] for r in rounds):>3}/{len(rounds)}"
        else:
            row += f" {'1':>8}x"
        lines.append(row)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=parse_shape, required=True, help="MxNxK")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--space", choices=["default", "exhaustive"], default="default")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--repeats", type=int, default=0, help="timed calls a burst (0: about 20 ms of them)")
    parser.add_argument("--settle-ms", type=float, default=200.0)
    parser.add_argument("--blocking", type=parse_blocking, nargs="+", default=[],
                        help="MC,KC,NC: every blocked configuration again with this blocking too")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rounds < 1 or args.repeats < 0 or args.settle_ms < 0:
        parser.error("--rounds must be at least 1, --repeats and --settle-ms at least 0")
    if args.child is not None:
        print(json.dumps(child(args.shape, args.dtype, args.space, args.rounds, args.repeats, args.settle_ms,
                               args.blocking)))
        return
    for threads in args.threads:
        with tempfile.TemporaryDirectory(prefix="tuneforge-gemm-harness-") as cache:
            env = child_env(threads, "auto", {"TUNEFORGE_CACHE_DIR": cache})
            command = [sys.executable, __file__, "--child", str(threads), "--shape", shape_text(args.shape),
                       "--dtype", args.dtype, "--space", args.space, "--rounds", str(args.rounds),
                       "--repeats", str(args.repeats), "--settle-ms", str(args.settle_ms),
                       *(["--blocking", *(",".join(map(str, b)) for b in args.blocking)] if args.blocking else [])]
            proc = subprocess.run(command, env=env, capture_output=True, text=True)
            if proc.returncode != 0:
                raise SystemExit(proc.stderr)
            print(table(json.loads(proc.stdout.strip().splitlines()[-1]), threads), flush=True)


if __name__ == "__main__":
    main()
