"""Which GEMM configurations to try for a problem: the `default` space (about a dozen, chosen from the
shape, dtype, vector ISA and cache sizes) and the `exhaustive` space.

Vector widths come from the CPU actually detected: AVX-512 (64-byte vectors) only where avx512f is
present, AVX2 (32) where avx2+fma are, NEON (16) on aarch64; never compiled for a CPU without them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from tuneforge import config
from tuneforge.cpuinfo import CpuInfo, cpu_info, usable_cores
from tuneforge.dataclass_lite import dataclass

C_TYPES = {"float32": "float", "float64": "double"}
COMPILE_PARAMS = ("T", "VEC_BYTES", "MR", "NV", "UNROLL", "LOOP", "NAME")  # see template.RUNTIME_PARAMS


@dataclass(frozen=True)
class Problem:
    m: int
    n: int
    k: int
    dtype: str  # float32 or float64

    @property
    def itemsize(self) -> int:
        return 4 if self.dtype == "float32" else 8

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k


_ISA_BYTES = {"avx512": 64, "avx2": 32, "neon": 16, "sse": 16}


def vector_widths(cpu: CpuInfo) -> list[int]:
    """Vector sizes in bytes this CPU runs natively, widest first (capped by the kernel_isa setting)."""
    if cpu.arch in ("aarch64", "arm64"):
        widths = [16] if cpu.has("neon") else []
    else:
        widths = []
        if cpu.has("avx512f"):
            widths.append(64)
        if cpu.has("avx2") and cpu.has("fma"):
            widths.append(32)
        widths = widths or [16]  # SSE2 is part of x86-64
    cap = config.get_str("kernel_isa")
    if cap != "auto":
        widths = [w for w in widths if w <= _ISA_BYTES[cap]] or widths[-1:]
    return widths


def _registers(vec_bytes: int, cpu: CpuInfo) -> int:
    return 32 if vec_bytes == 64 or cpu.arch in ("aarch64", "arm64") else 16


def register_tiles(vec_bytes: int, cpu: CpuInfo, spilling: bool = False) -> list[tuple[int, int]]:
    """(MR, NV) register tiles that fit the register file (MR*NV accumulators + NV B vectors + 1 A),
    best first by the ratio of FMAs to loads; with `spilling`, also 3x4 vectors on 16 registers (17 of them: it
    keeps accumulators on the stack and ran at 0.5-0.8x the 6x2 tile on a Zen 3, 128^3-1024^3 fp32; only the
    exhaustive space, whose recordings hold it, still builds it)."""
    if _registers(vec_bytes, cpu) == 32:
        return [(14, 2), (8, 3), (6, 4), (12, 2), (4, 4), (28, 1), (8, 2)]
    return [(6, 2), (4, 3), *([(3, 4)] if spilling else []), (12, 1), (8, 1)]


def tile_count(vec_bytes: int, cpu: CpuInfo) -> int:
    """How many register tiles the default space builds where it builds the most. With 16 registers only 6x2 and
    4x3 reach the FMA peak: 12x1 and 8x1 ran 13-20% behind them on 512^3 and 1024^3 fp32 (Zen 3, 2 threads), and a
    third build is 0.8-1.9 s of compiler in a cold tuning."""
    return 3 if _registers(vec_bytes, cpu) == 32 else 2


def max_threads() -> int:
    """Threads a kernel may use: the `kernel_threads` setting, else every core this process may use."""
    return config.get_int("kernel_threads") or usable_cores()


def describe(config_: dict[str, Any]) -> str:
    """The AUTOTUNE table's info column: the tunables, compactly."""
    isa = {64: "avx512", 32: "avx2", 16: "sse/neon"}.get(config_["VEC_BYTES"], str(config_["VEC_BYTES"]))
    if "NCOLS" in config_:
        return f"{isa} columns={config_['NCOLS']} rows x{config_['ROWS']} t={config_['threads']}"
    if "MMAX" in config_:
        # .get: records written before FAR existed describe the configurations they tuned
        far = " far" if config_.get("FAR") else ""
        return (f"{isa} rows<={config_['MMAX']} stream B x{config_['KU']}{far} prefetch={config_['PF']} "
                f"NB={config_['NC']} t={config_['threads']}{'/depth' if config_['par'] else ''}")
    packs = "AB" if config_["PACK_A"] and config_["PACK_B"] else "A" if config_["PACK_A"] else \
        "B" if config_["PACK_B"] else "-"
    return (f"{isa} {config_['MR']}x{config_['NV']}v pack={packs} u{config_['UNROLL']} {config_['LOOP']} "
            f"MC={config_['MC']} KC={config_['KC']} NC={config_['NC']} t={config_['threads']}"
            f"{'/cols' if config_['par'] else ''}{' no-ahead' if config_.get('AHEAD', 1) == 0 else ''}")


def _round_up(x: int, multiple: int) -> int:
    return max(multiple, (x + multiple - 1) // multiple * multiple)


def _balanced(total: int, most: int, multiple: int, parts: int = 1) -> int:
    """The block that cuts `total` into the fewest equal blocks of about `most` at most (a multiple of
    `multiple`), their count a multiple of `parts`: no thin last block, and as many blocks per thread."""
    count = -(-total // max(multiple, most))
    count = -(-count // parts) * parts
    return _round_up(-(-total // count), multiple)


def blocking(p: Problem, vec_bytes: int, mr: int, nv: int, cpu: CpuInfo, kc_scale: float = 1.0,
             threads: int = 1) -> dict[str, int]:
    """Cache blocking for the ir_jr order from the cache sizes: an A sliver (MR x KC), reused across a whole
    row of B slivers, fills about 60% of L1; a KC x NC block of B, streamed once per A sliver, half of L2; an
    MC x KC block of A half of L2, with as many MC blocks per thread when several threads split M. K, N and M
    are cut into equal blocks. Measured on 2048^3: KC 128 (B's sliver in half of L1, the former rule) ran at
    0.89x numpy on one core, KC 512 at 1.0x; the thin C updates of a short KC cost more than L1 misses."""
    s = p.itemsize
    nr = nv * vec_bytes // s
    l1 = cpu.caches().get("L1d", 32 * 1024)
    l2 = cpu.caches().get("L2", 512 * 1024)
    kc = _balanced(p.k, max(32, min(1024, int(l1 * 0.6 * kc_scale / (mr * s)))), 8)
    if p.n <= nr:
        # B is one sliver: each A sliver is used once, and L1 keeps nothing for a second use. KC as deep as B's
        # sliver in half of L2: fewer passes over C, longer runs of each row of A. 4096x32x4096 (AVX-512, Zen 4,
        # A unpacked, 2 threads): fp32 14x2 vectors KC 344 7.3 ms, 4096 6.6; fp64 6x4 KC 1024 10.4, 4096 10.0.
        kc = _balanced(p.k, max(32, int(l2 * 0.5 * kc_scale / (nr * s))), 8)
    half_l2 = int(l2 * 0.5 / (kc * s))  # rows or columns of a KC-deep block that fill half of L2
    nc = _balanced(p.n, half_l2, nr)
    mc = _balanced(p.m, half_l2, mr, threads)
    return {"MC": mc, "KC": kc, "NC": nc}


# Where the blocked kernel prefetches B's next block while it computes one (kernel.cpp.j2's Ahead, the same constants):
# up to this many rows of A, and a B of at least this many bytes (read from memory on every call).
AHEAD_MAX_M = 256
AHEAD_MIN_BYTES = 8 << 20


def streams_b(p: Problem) -> bool:
    """Few rows of A and a B too large for the caches: packing B, read from memory, is much of the call."""
    return p.m <= AHEAD_MAX_M and p.k * p.n * p.itemsize >= AHEAD_MIN_BYTES


def _config(p: Problem, vec: int, mr: int, nv: int, *, pack_a: int, pack_b: int, threads: int, par: int,
            cpu: CpuInfo, unroll: int = 4, loop: str = "ir_jr", kc_scale: float = 1.0) -> dict[str, Any]:
    config_ = {"T": C_TYPES[p.dtype], "VEC_BYTES": vec, "MR": mr, "NV": nv, "PACK_A": pack_a, "PACK_B": pack_b,
               "UNROLL": unroll, "LOOP": loop, "NAME": "tuneforge_gemm",
               **blocking(p, vec, mr, nv, cpu, kc_scale, threads if par == 0 else 1), "threads": threads, "par": par}
    if par and threads > 1 and streams_b(p):  # one block of rows: the threads own columns (columns_chunk)
        config_["MC"] = _round_up(p.m, mr)
    return config_


FEW_COLS_MAX = 8  # up to this many columns of C, the few-columns kernel (few_cols.cpp.j2) is a candidate
FEW_COLS_ROWS = (1, 2, 3, 4, 6, 8)  # rows of A one pass of it streams together


SMALL_TILE = (8, 2)  # the first tile tried on small problems (32 vector registers)
# B is narrow (its tiles, its packing: default_space) up to this many slivers of the widest register tile. From two
# to four (Zen 4, 2 threads; tuned picks): AVX-512 fp64 4096x128x4096 51.8 -> 45.8 ms a call (numpy 56-62),
# 1024x128x1024 2.73 -> 2.39 ms, fp32 2048x256x2048 11.0 -> 10.3; AVX2 (--isa avx2) fp64 4096x32x4096 the same
# 6x2-vector pick (16.6-17.0 ms) in a cold tuning of 2.4 s instead of 3.6.
NARROW_SLIVERS = 4


def padding(p: Problem, mr: int, nv: int, vec_bytes: int) -> float:
    """The share of a register tile's work spent on zero padding at the edges of C, for this problem."""
    nr = nv * vec_bytes // p.itemsize
    return (-(-p.m // mr) * mr) * (-(-p.n // nr) * nr) / (p.m * p.n) - 1


# Below this much work one thread does it all: waking a second costs more than it saves. From 2 x 48^3 flops both
# are tried: at 64^3 fp32, two threads ran 4.5 us against one's 6.5 (numpy: 5.7).
SHARED_FLOPS = 2 * 48**3
# From this much work on, every thread has ample work: one thread cannot win, and timing it is slow. Measured on
# 2 cores: 512^3, 32x4096x4096 and 4096x4096x32 ran 1.5-2.3x slower on one thread in every configuration, and its
# seven configurations took a tenth of a cold tuning of the skinny shapes.
AMPLE_FLOPS = 2 * 512**3


def default_space(p: Problem, cpu: CpuInfo | None = None, threads: int | None = None) -> list[dict[str, Any]]:
    """About a dozen configurations picked by heuristics; at most 3 distinct compiled kernels. None for a single
    row (GEMV): the few-rows kernel's (small_m_space) serve it, and a blocked tile would mostly multiply padding
    (2.5-6x slower than the few-rows kernel in every run here; its build was a third of a cold GEMV tuning)."""
    if p.m == 1:
        return []
    cpu = cpu or cpu_info()
    widest = vector_widths(cpu)[0]
    if p.n < 2 * (widest // p.itemsize) and p.n <= FEW_COLS_MAX:
        # Fewer columns than two vectors hold: the vectors of a blocked tile (two wide at least, but for 8x1/12x1
        # on AVX2) run part empty, and the few-columns kernel serves them. Steady, AVX2, 2 threads: 3000x5x700 fp32
        # blocked 1.5-7.3 ms, numpy 0.86, few columns 0.45 (and their three builds made a cold tuning 3.2 s instead
        # of 1.9-2.0); fp64 3000xNx700 for N = 5, 6, 7: few columns 717, 890, 939 us, blocked 1407-1523;
        # 4096x8x4096 fp32 4.96 ms against 10.7. At two vectors they are close: 3000x8x700 fp64 1060 against 1027.
        return []
    team = threads or max_threads()
    tiles = register_tiles(widest, cpu)
    small = p.flops <= 2 * 160**3
    skinny_m = p.m < 4 * tiles[0][0]
    if small:
        # The edges weigh on a small problem: 8x2 vectors first (16 accumulators: the fastest tile measured on
        # 64^3, 100^3 and 128^3 fp32), then the tiles that divide the problem (in steps of 2% of padded work; the
        # order of register_tiles within a step). At 128^3 fp32 on 2 threads, 4x4 and 8x2 (no padding) ran at
        # 200 GFLOP/s, 14x2 (9% padding) at 172; at 64^3, 6.5 us against 8.3 on one thread (numpy: 5.7).
        # With 16 vector registers (AVX2) 6x2 vectors comes first instead (no 8x2 there: 15 registers of 16).
        # 128^3 fp32 (2 threads, AMD EPYC): 6x2 62 us for all its 3% padding, 3x4 65-72 (it spills; no longer
        # offered), 8x1 74-78; 100^3 fp32 41 us against 45-47; 128^3 fp64 121 us against 126-140.
        first = SMALL_TILE if SMALL_TILE in tiles else tiles[0]
        tiles = sorted(tiles, key=lambda tile: (tile != first, int(padding(p, tile[0], tile[1], widest) * 50)))
    # Packing pays off when a block is reused: skip it where A (or B) is read about once anyway, and try without
    # packing B below ample work: on 96x1000x300 fp32 (2 threads), unpacked B ran in 275-285 us, packed in 348
    # (numpy: 350); its 1.2 MB of B is reused by only two M blocks.
    mid = p.flops < AMPLE_FLOPS
    packs = [(1, 1)] if not (small or mid or skinny_m or min(p.n, p.k) <= 64) else [(1, 1), (0, 0), (1, 0)]

    def slivers(tile: tuple[int, int]) -> int:
        return -(-p.n // (tile[1] * widest // p.itemsize))

    narrow = not small and min(slivers(tile) for tile in tiles) <= NARROW_SLIVERS
    if narrow:
        # Each A sliver serves a few slivers of B: packing it is a transposition for little reuse, and a narrow B
        # is compact as it is. fp32 4096x128x4096 (AVX-512, Zen 4, 2 threads), 6x4 vectors: unpacked 20.8 ms,
        # packed 23.2; unpacked won every cold tuning of 4096x32x4096 and 4096x64x4096 (both dtypes, 3 each).
        # Packed stays as a hedge for the first tile only (below): each candidate is a tenth of a cold tuning.
        packs = [(0, 0), (1, 1)]
    thread_options = [1] if p.flops < SHARED_FLOPS or team == 1 else sorted({1, team}, reverse=True)
    if p.flops >= AMPLE_FLOPS:
        thread_options = [team]
    chosen_tiles = tiles[:2] if len(packs) > 1 else tiles[:tile_count(widest, cpu)]
    if not small:  # a tile that pads a fifth more work than the first never won: 4096x32x4096 fp32, 4x3 vectors
        # (32 columns padded to 48) 16.9-33.6 ms against 6x2's 12.6; its build and trials were a quarter of the cold
        # tuning (4.0 s)
        least = padding(p, *chosen_tiles[0], widest)
        chosen_tiles = [t for t in chosen_tiles if padding(p, t[0], t[1], widest) <= least + 0.2]
    if skinny_m or narrow:  # a tall (wide) register tile would mostly multiply zero padding
        # The tiles that pad least (in steps of a tenth), B in the fewest slivers where it is narrow, then the list's
        # order. AVX-512, Zen 4, 2 threads: 32x4096x4096 fp32, 14x2 vectors (32 rows padded to 42) ran at 0.75x 8x3
        # and 4x4 (no padding); 4096x32x4096 fp64, 14x2 (two slivers of 16) 13.6 ms, 6x4 (one of 32) 10.0; fp64
        # 4096x64x4096, 8x3 (64 columns padded to 72) 30.4 ms, 6x4 (two slivers) 21.4; fp32 4096x128x4096, 14x2 28.7,
        # 8x3 27.0, 6x4 20.8 (OpenBLAS 24.3).
        def fit(tile: tuple[int, int]) -> tuple[int, int]:
            return int(padding(p, tile[0], tile[1], widest) * 10), slivers(tile) if narrow else 0

        fitting = sorted((t for t in tiles if t[0] <= max(p.m, 4)), key=fit)
        if narrow:  # only the best fit: on AVX2, 12x1 vectors take 32 fp32 columns in four slivers, 6x2 in two
            fitting = [t for t in fitting if fit(t) == fit(fitting[0])]
        chosen_tiles = fitting[:2] or tiles[-2:]
    configs = []
    # Too few rows to share, or few enough and a B read from memory: the threads split the columns. There each thread
    # packs its own columns' blocks with no wait between them (kernel.cpp.j2's columns_chunk); 4096x4096 B fp32,
    # 2 threads, AMD EPYC Zen 3, against the rows split: M = 32 15.0 against 32.8 ms, 64 27.7 against 35, 128 41.8
    # against 51-56, 256 77 against 89-97. With B in cache the rows split held its own (96x1000x300, 200x2000x500,
    # 256x1024x1024: 0.9-1.2x the columns split).
    split_columns = streams_b(p)
    if split_columns:
        # Packed B's next block prefetched while this one is computed (kernel.cpp.j2's Ahead) paid 1.2-1.4x on a Zen 3
        # and cost 5-15% on a Zen 4 (32x4096x4096, both dtypes, 1 and 2 threads): each packed configuration is also
        # tried without it. In place of the unpacked B, there read from memory by every pass over A's rows: it never
        # won on the Zen 4 (fp32 2 threads 9.5-11.8 ms against the best 8.3; fp64 24-34 against 19).
        packs = [pack for pack in packs if pack != (0, 0)]
    for (mr, nv), (pa, pb), t in itertools.product(chosen_tiles, packs, thread_options):
        if narrow and pa and (mr, nv) != chosen_tiles[0]:
            continue
        par = 1 if t > 1 and (p.m < t * 4 * mr or split_columns) else 0
        configs.append(_config(p, widest, mr, nv, pack_a=pa, pack_b=pb, threads=t, par=par, cpu=cpu))
        if split_columns and pb and (mr, nv) in chosen_tiles[:2]:
            configs.append({**configs[-1], "AHEAD": 0})
    # Second opinions on blocking (a shallower KC: half the A sliver in L1, twice the passes over C) and on
    # the parallel loop.
    mr, nv = chosen_tiles[0]
    for t in thread_options:
        configs.append(_config(p, widest, mr, nv, pack_a=packs[0][0], pack_b=packs[0][1], threads=t,
                               par=1 if t > 1 and (p.m < t * 4 * mr or split_columns) else 0, cpu=cpu, kc_scale=0.5))
    if team > 1 and not small:
        other = 0 if p.m < team * 4 * mr else 1
        configs.append(_config(p, widest, mr, nv, pack_a=1, pack_b=1, threads=team, par=1 - other, cpu=cpu))
    unique = {tuple(sorted(c.items())): c for c in configs}
    return list(unique.values())[:20]


SMALL_M_ROWS = (1, 2, 4, 8)  # rows of C one pass of the few-rows kernel accumulates
# Up to this many rows the exhaustive space tries the kernel in passes of 8 over an L3-resident block of B; the
# default space only where one pass does (M <= 8). Several passes lost to the blocked kernel split over columns
# (or to numpy) at every M tried on a Zen 4 (12, 16, 17, 32: by 1.1-1.7x), and their two builds and eight
# configurations were a third of a cold tuning of 32x4096x4096.
SMALL_M_MAX = 32


def small_m_space(p: Problem, cpu: CpuInfo, team: int, exhaustive: bool = False,
                  most_rows: int | None = None) -> list[dict[str, Any]]:
    """Configurations of the few-rows kernel (M <= 8, or `most_rows`; exhaustive: M <= 32): it reads B
    contiguously, once from memory."""
    if p.m > (most_rows or (SMALL_M_MAX if exhaustive else SMALL_M_ROWS[-1])):
        return []
    rows = next((r for r in SMALL_M_ROWS if r >= p.m), SMALL_M_ROWS[-1])
    l2 = cpu.caches().get("L2", 512 * 1024)
    l3 = cpu.caches().get("L3", 8 * 2**20)
    configs = []
    widths = vector_widths(cpu) if exhaustive else vector_widths(cpu)[:1]
    # One pass streams B once and is bound by memory, where one core can match two (on a Zen 5, 1.2-1.35x numpy on
    # one core); several passes compute, and need every core once the work is ample.
    threads = sorted({1, team}) if p.m <= rows or p.flops < AMPLE_FLOPS else [team]
    if p.m <= rows:  # one pass: column blocks sized for the rows of C kept in L2, and at least one per thread
        block = max(64, min(p.n, int(l2 * 0.25 / (rows * p.itemsize))))
        # (column block, threads, par): threads split the columns, or (par=1) the rows of B, so that each
        # core streams one contiguous part of B (measured on a Zen 5: up to 1.2x numpy on two threads).
        layouts = [(min(block, _round_up(-(-p.n // t), 64)), t, 0) for t in threads]
        layouts += [(block, team, 1)] if team > 1 and p.k >= 64 * team else []
        # (rows of B streamed at once, software prefetch distance in bytes, rows far apart): measured best on
        # a Zen 5 were 4-5 far-apart rows with 256 B prefetch on one core (1.2-1.35x numpy) and without
        # prefetch on two; adjacent rows are the hedge for prefetchers that favour one stream. Each KU is a build
        # of its own: 4 and 5 rows were within noise of each other on a Zen 4, so 5 is left to the exhaustive
        # space, and a GEMV's two builds take one round on two cores.
        streams = [(4, 256, 1), (4, 1024, 1), (4, 0, 1), (8, 1024, 0)]
    else:  # several passes over each K x NB block of B, which a quarter of L3 keeps (measured: 256-512 wide)
        block = max(64, min(p.n, int(l3 * 0.25 / (max(p.k, 1) * p.itemsize))) // 64 * 64)
        layouts = list(itertools.product(sorted({block, max(64, block // 2)}), threads, [0]))
        streams = [(4, 1024, 0), (8, 1024, 0)]
    if exhaustive:
        streams = list(itertools.product((2, 4, 5, 8, 16), (0, 256, 1024, 4096), (0, 1)))
    for vec, (ku, pf, far), (nb, t, par) in itertools.product(widths, streams, layouts):
        configs.append({"T": C_TYPES[p.dtype], "VEC_BYTES": vec, "MMAX": rows, "KU": ku, "PF": pf, "FAR": far,
                        "NAME": "tuneforge_gemm", "MC": 0, "KC": 0, "NC": nb, "threads": t, "par": par})
    return configs


def few_cols_space(p: Problem, cpu: CpuInfo, team: int, exhaustive: bool = False) -> list[dict[str, Any]]:
    """Configurations of the few-columns kernel (N <= FEW_COLS_MAX): dot products of A's rows with B's columns,
    vectorized along K. Its ROWS x N accumulators (and one vector of B) must fit the registers: the default space
    builds the largest such ROWS and the largest of at most half that, the exhaustive space every one on every
    vector width. N is compiled in, so each N builds its own: two builds are a cold tuning's share. Steady, AVX2,
    2 threads (numpy): 3000x5x700 fp32 3 rows 333 us, 1 row 403, 2 rows 419 (698); fp64 999, 1029, 1095 (3102);
    10000x3x256 fp32 4 rows 732, 3 rows 759, 2 rows 879 (1684); 2048x4x2048 fp64 3 rows 1482, 2 rows 1772, 1 row
    1833 (4096)."""
    if p.n > FEW_COLS_MAX:
        return []
    threads = [team] if p.flops >= AMPLE_FLOPS or team == 1 else sorted({1, team})
    if p.flops < SHARED_FLOPS:
        threads = [1]
    configs = []
    for vec in vector_widths(cpu) if exhaustive else vector_widths(cpu)[:1]:
        fitting = [r for r in FEW_COLS_ROWS if r * p.n + 1 <= _registers(vec, cpu)]
        if not exhaustive:
            fitting = sorted({fitting[-1], max(r for r in fitting if 2 * r <= fitting[-1] or r == 1)})
        for rows, t in itertools.product(fitting, threads):
            configs.append({"T": C_TYPES[p.dtype], "VEC_BYTES": vec, "NCOLS": p.n, "ROWS": rows,
                            "NAME": "tuneforge_gemm", "MC": 0, "KC": 0, "NC": 0, "threads": t, "par": 0})
    return configs


def exhaustive_space(p: Problem, cpu: CpuInfo | None = None, threads: int | None = None) -> Iterator[dict[str, Any]]:
    """Every vector width the CPU runs, every register tile, packing, unrolling, loop order, three
    blockings, and 1..threads threads with both parallel loops (one thread only below AMPLE_FLOPS: from there
    it lost in every configuration measured, and its timings were a third of a 512^3 search's); where B streams
    from memory, each packed-B configuration with and without the next block's prefetch (AHEAD)."""
    cpu = cpu or cpu_info()
    team = threads or max_threads()
    teams = [team] if p.flops >= AMPLE_FLOPS else sorted({1, team})
    seen = set()
    aheads = (1, 0) if streams_b(p) else (1,)  # where the kernel would prefetch B's next block: also without
    for vec in vector_widths(cpu):
        for (mr, nv), (pa, pb), unroll, loop, scale, t in itertools.product(
                register_tiles(vec, cpu, spilling=True), [(1, 1), (1, 0), (0, 1), (0, 0)], (1, 4, 8),
                ("jr_ir", "ir_jr"), (0.5, 1.0, 2.0), teams):
            for par, ahead in itertools.product((0, 1) if t > 1 else (0,), aheads if pb else (1,)):
                config = _config(p, vec, mr, nv, pack_a=pa, pack_b=pb, threads=t, par=par, cpu=cpu, unroll=unroll,
                                 loop=loop, kc_scale=scale)
                if not ahead:
                    config["AHEAD"] = 0
                marker = tuple(sorted(config.items()))
                if marker not in seen:
                    seen.add(marker)
                    yield config


def kernel_count(configs: list[dict[str, Any]]) -> int:
    """How many distinct compiled kernels a list of configurations needs."""
    return len({tuple(c[k] for k in COMPILE_PARAMS) for c in configs})
