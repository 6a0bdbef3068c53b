"""The GEMM kernel template and how a configuration calls it."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tuneforge.kernels.gemm.space import describe
from tuneforge.tune.template import KernelTemplate

# Parameters that are run-time arguments of the compiled kernel: configurations that differ only
# in them share one artifact. Packing is decided outside the inner loops, so it costs nothing there
# to leave it to run time, and a cold tuning compiles one kernel per register tile instead of three.
RUNTIME_PARAMS = ("MC", "KC", "NC", "threads", "par", "PACK_A", "PACK_B", "AHEAD")
# The few-rows kernel's prefetch distance and stream layout are run-time arguments too: a cold GEMV tuning built
# four kernels (~0.8 s each on 2 cores) for four (KU, PF, FAR) streams; it now builds one per KU.
SMALL_M_RUNTIME_PARAMS = (*RUNTIME_PARAMS, "PF", "FAR")

SIGNATURE = ("void tuneforge_gemm(int64_t M, int64_t N, int64_t K, int64_t rsa, int64_t csa, int64_t rsb, "
             "int64_t csb, int64_t rsc, int64_t csc, int64_t MC, int64_t KC, int64_t NC, int64_t threads, "
             "int64_t mode, double alpha, double beta, const {{ T }}* a, const {{ T }}* b, {{ T }}* c, "
             "const {{ T }}* bias)")


# Mode bit: the call's threads are the process's OpenMP team (torch's), not the kernels' own pool (pool.h). Set
# by the torch tensor path (op.gemm_into), never while tuning: the team runs the same chunks on as many threads.
HOST_TEAM = 16


def on_host_team(call: functools.partial[Any]) -> functools.partial[Any]:
    """A bound kernel call (`static_args` bound, mode last) that runs on the process's OpenMP team."""
    *leading, mode = call.args
    return functools.partial(call.func, *leading, int(mode) | HOST_TEAM)


def element_strides(arr: Any) -> tuple[int, int]:
    item = arr.itemsize
    return arr.strides[0] // item, arr.strides[1] // item


# Mode bit: never prefetch B's next block while computing this one (kernel.cpp.j2's Ahead; the kernel decides where it
# may pay, from M and the size of B, and a configuration with AHEAD = 0 turns it off: it paid 1.2-1.4x on a Zen 3 and
# cost 5-15% on a Zen 4). The results are the same.
NO_AHEAD = 128


def runtime_args(config: Mapping[str, Any]) -> tuple[int, int, int, int, int]:
    """A configuration's run-time arguments: MC, KC, NC, threads and the mode bits (1: the other parallel
    loop, `par`; 2: pack A; 4: pack B; NO_AHEAD: AHEAD = 0). The few-rows kernel ("MMAX" in the configuration)
    takes MC = 0, its prefetch distance PF in KC's place and FAR as mode bit 8."""
    mode = int(config["par"]) | (2 if config.get("PACK_A") else 0) | (4 if config.get("PACK_B") else 0)
    mode |= NO_AHEAD if config.get("AHEAD", 1) == 0 else 0
    if "MMAX" in config:
        return 0, int(config["PF"]), config["NC"], config["threads"], mode | (8 if config["FAR"] else 0)
    return config["MC"], config["KC"], config["NC"], config["threads"], mode


def static_args(a: Any, b: Any, out: Any, config: Mapping[str, Any]) -> tuple[Any, ...]:
    """The leading arguments of a kernel call: sizes, element strides and the run-time parameters."""
    (m, k), n = a.shape, b.shape[1]
    return (m, n, k, *element_strides(a), *element_strides(b), *element_strides(out), *runtime_args(config))


def bind(kernel: Any, args: Sequence[Any], config: Mapping[str, Any]) -> functools.partial[Any]:
    """A compiled configuration's call on select()'s arguments (a, b, alpha, beta, bias, out), every argument
    bound: what timing calls, as the op's prepared call and its dispatcher make it."""
    a, b, alpha, beta, bias, out = args
    return functools.partial(kernel, *static_args(a, b, out, config), float(alpha), float(beta), a, b, out, bias)


def launch(kernel: Any, args: Sequence[Any], config: Mapping[str, Any]) -> None:
    """Call a compiled configuration with select()'s arguments: a, b, alpha, beta, bias, out."""
    bind(kernel, args, config)()


# Mode bits of a B packed ahead of the calls (kernel.cpp.j2's pack_b_whole): a call reads B packed whole (32), or
# makes no product and packs B whole into c (64).
PREPACKED, PACK_ONLY = 32, 64


def pack_layout(config: Mapping[str, Any], itemsize: int) -> tuple[int, int]:
    """What B packed whole depends on besides B: the register tile's width in elements (NR) and the k-block (KC)."""
    return int(config["NV"]) * int(config["VEC_BYTES"]) // itemsize, int(config["KC"])


def pack_whole(kernel: Any, b: Any, config: Mapping[str, Any]) -> Any:
    """B packed whole for `config`'s calls with mode bit PREPACKED, by the compiled kernel: a new 1-D array of
    round_up(N, NR) * K elements."""
    import numpy as np

    (k, n), (nr, kc) = b.shape, pack_layout(config, b.itemsize)
    packed = np.empty(-(-n // nr) * nr * k, dtype=b.dtype)
    kernel(0, n, k, 0, 1, *element_strides(b), 0, 1, 0, kc, 0, 1, PACK_ONLY, 1.0, 0.0, b, b, packed, None)
    return packed


# While tuning, each B array's packs, by pack_layout: configurations that share a layout share a pack, and a timed
# run never packs. Kept while the array lives (the trials' arguments), and only for it (a weak reference is checked).
_tuning_packs: dict[int, tuple[weakref.ReferenceType[Any], dict[tuple[int, int], Any]]] = {}


def _forget(key: int) -> None:
    _tuning_packs.pop(key, None)


def bind_packed(kernel: Any, args: Sequence[Any], config: Mapping[str, Any]) -> functools.partial[Any]:
    """`bind` with B packed whole (packed on the first call for this B and layout, kept while B lives)."""
    a, b, alpha, beta, bias, out = args
    entry = _tuning_packs.get(id(b))
    if entry is None or entry[0]() is not b:
        entry = _tuning_packs[id(b)] = (weakref.ref(b), {})
        weakref.finalize(b, _forget, id(b))
    packs = entry[1]
    layout = pack_layout(config, b.itemsize)
    packed = packs.get(layout)
    if packed is None:
        packed = packs[layout] = pack_whole(kernel, b, config)
    *head, mode = static_args(a, b, out, config)
    return functools.partial(kernel, *head, mode | PREPACKED, float(alpha), float(beta), a, packed, out, bias)


def launch_packed(kernel: Any, args: Sequence[Any], config: Mapping[str, Any]) -> None:
    """Call a compiled configuration with B packed whole (packed on its first call for this B, untimed after)."""
    bind_packed(kernel, args, config)()


def sample_rows(config: Mapping[str, Any], rows: int, total: int) -> int:
    """The rows a configuration runs on when a selection samples the problem (tune/sample.py): whole M blocks,
    as many for each thread where the threads split M (par 0), so that the sample runs every block, and shares
    them between the threads, as the whole problem does. The few-rows kernel (M <= 32) runs the whole."""
    if "MMAX" in config:
        return total
    if "NCOLS" in config:  # each row of C its own: whole passes of ROWS rows
        return min(total, -(-rows // int(config["ROWS"])) * int(config["ROWS"]))
    unit = int(config["MC"]) * (1 if config["par"] else int(config["threads"]))
    return min(total, -(-rows // unit) * unit)


_HERE = Path(__file__).parent
# The kernels' own thread pool (pool.cpp: why not OpenMP): its declarations pasted into each kernel's source, the pool
# compiled once (after them) and linked into each kernel's module, where it finds the process's one pool (the same
# source built as the templates' process library) and runs on it.
_POOL_API = (_HERE / "pool_api.h").read_text()
POOL = (_POOL_API + (_HERE / "pool.cpp").read_text(),)
POOL_LIBRARY = "#define TUNEFORGE_POOL_LIBRARY 1\n" + POOL[0]


def _source(template: str) -> str:
    return (_HERE / template).read_text().replace("// @POOL@\n", _POOL_API, 1)


FLAGS = ("-ffp-contract=fast", "-pthread")
# At -O2 (after the -O of cpp.opt_level: it wins): the blocked and few-columns kernels are written with vector
# intrinsics and unrolled by hand, and -O3 mostly duplicated their loops (the micro-kernels' instructions are the same
# at both levels, AVX2 and AVX-512 alike) for twice the compile: a kernel unit 0.81-0.91 -> 0.41-0.54 s here. What
# -O3 did do is kept where it pays: the blocked kernel's packing routines at -O3 (kernel.cpp.j2's OPT3; a whole -O3
# build then 2-3% faster, 5% without), the few-columns kernel's loops over rows and columns unrolled by pragmas (rolled
# at -O2: 1.5-3x slower on 3000x5x700). Measured against a template of the same source built with FLAGS (the -O of
# cpp.opt_level alone): patching cpp.opt_level changes nothing where these flags follow it.
O2_FLAGS = (*FLAGS, "-O2")


def _template(name: str, source: str, flags: tuple[str, ...], runtime_params: tuple[str, ...] = RUNTIME_PARAMS,
              launcher: Any = launch, binder: Any = bind) -> KernelTemplate:
    """A GEMM kernel template: the common signature, the pool linked in, the process's pool loaded first."""
    return KernelTemplate(name, _source(source), signature=SIGNATURE.replace("tuneforge_gemm", "{{ NAME }}"),
                          launcher=launcher, binder=binder, runtime_params=runtime_params, flags=flags, openmp=False,
                          link_sources=POOL, process_library=POOL_LIBRARY, describe=describe, sample_rows=sample_rows)


TEMPLATE = _template("tuneforge_gemm", "kernel.cpp.j2", O2_FLAGS)
# The same kernels, called with B packed whole ahead of time (tuneforge.pack_b): the same builds serve both.
PACKED = _template("tuneforge_gemm", "kernel.cpp.j2", O2_FLAGS, launcher=launch_packed, binder=bind_packed)
# Few rows (GEMV-like shapes): stream B once with all rows of C in cache. Same signature and launcher.
SMALL_M = _template("tuneforge_gemm_small_m", "small_m.cpp.j2", FLAGS, SMALL_M_RUNTIME_PARAMS)
# The same for one row (a GEMV), compiled at -O2 (after the -O of cpp.opt_level: it wins). There the kernel is bound
# by memory: each of the 12 default configurations of 1x4096x4096 ran as fast at -O2 as at -O3 (steady,
# interleaved, 2 threads, AMD EPYC AVX2: fp32 0.98-1.02x, fp64 0.95-1.01x), and -O3's unrolling took twice the
# compile (0.85 -> 0.40 s a kernel unit; a cold GEMV tuning's builds 1.75-1.85 -> 1.1-1.2 s of its 3.4). With
# more rows it computes, and -O3 ran up to 20% faster (8x4096x4096 fp32): those keep SMALL_M.
GEMV = _template("tuneforge_gemm_small_m", "small_m.cpp.j2", O2_FLAGS, SMALL_M_RUNTIME_PARAMS)
# Few columns (N <= 8): dot products along K, B copied transposed. Same signature and launcher.
FEW_COLS = _template("tuneforge_gemm_few_cols", "few_cols.cpp.j2", O2_FLAGS)


def few_rows_template(m: int) -> KernelTemplate:
    """The few-rows kernel's template for `m` rows: GEMV's for one."""
    return GEMV if m == 1 else SMALL_M
