"""The GEMM family: every default-space configuration is correct; the op tunes, caches and dispatches."""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import tuneforge
from tuneforge import config
from tuneforge.compile.pool import default_pool
from tuneforge.cpuinfo import cpu_info
from tuneforge.kernels.gemm import Problem, default_space, exhaustive_space, vector_widths
from tuneforge.kernels.gemm import choices as gemm_choices
from tuneforge.kernels.gemm.space import (
    C_TYPES,
    FEW_COLS_MAX,
    FEW_COLS_ROWS,
    SMALL_M_MAX,
    describe,
    few_cols_space,
    padding,
    register_tiles,
    small_m_space,
)
from tuneforge.kernels.gemm.template import FEW_COLS, NO_AHEAD, SMALL_M, TEMPLATE, launch, runtime_args
from tuneforge.tune.template import TemplateChoice

from .conftest import run_python


@pytest.fixture(scope="module")
def kernels_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One cache for the configuration checks of this module, so each kernel compiles once."""
    root = tmp_path_factory.mktemp("gemm-kernels")
    with config.patch(cache_dir=root):
        yield root


def operands(m: int, n: int, k: int, dtype: str, layout: str, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    if layout == "transposed":  # column-major A and B: unit row stride
        return (rng.standard_normal((k, m)).astype(dtype).T, rng.standard_normal((n, k)).astype(dtype).T)
    if layout == "offset":  # views into larger buffers: non-zero offsets and padded row strides
        big_a = rng.standard_normal((m + 3, k + 5)).astype(dtype)
        big_b = rng.standard_normal((k + 2, n + 7)).astype(dtype)
        return big_a[3:, 5:], big_b[1:-1, 4:-3]
    return rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)


def expected(a: np.ndarray, b: np.ndarray, alpha: float, beta: float, c0: np.ndarray, bias: Any) -> np.ndarray:
    result = alpha * (a.astype(np.float64) @ b.astype(np.float64)) + beta * c0.astype(np.float64)
    return result + (bias.astype(np.float64) if bias is not None else 0.0)


def check_all_configs(m: int, n: int, k: int, dtype: str, layout: str, alpha: float = 1.0, beta: float = 0.0,
                      with_bias: bool = False) -> int:
    choices = [c for c in gemm_choices(Problem(m, n, k, dtype)) if isinstance(c, TemplateChoice)]
    return check_choices(choices, m, n, k, dtype, layout, alpha, beta, with_bias)


def check_choices(choices: list[TemplateChoice], m: int, n: int, k: int, dtype: str, layout: str, alpha: float = 1.0,
                  beta: float = 0.0, with_bias: bool = False) -> int:
    a, b = operands(m, n, k, dtype, layout)
    rng = np.random.default_rng(1)
    c0 = rng.standard_normal((m, n)).astype(dtype)
    bias = rng.standard_normal(n).astype(dtype) if with_bias else None
    want = expected(a, b, alpha, beta, c0, bias)
    tol = 2e-4 if dtype == "float32" else 1e-10
    scale = max(1.0, float(np.abs(want).max()))
    pool = default_pool()
    pool.wait([choice.build(pool) for choice in choices])  # compile in parallel; shared kernels build once
    for choice in choices:
        out = c0.copy()
        launch(choice.kernel(), [a, b, alpha, beta, bias, out], choice.config)
        err = float(np.abs(out - want).max()) / scale
        assert err < tol, f"{choice.info}: relative error {err} for {m}x{n}x{k} {dtype} {layout}"
    return len(choices)


ODD = [(1, 1, 1), (7, 33, 127), (127, 7, 33), (33, 127, 1000), (1000, 1, 7), (1, 1000, 33), (127, 1000, 1),
       (20, 130, 67)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", ODD, ids=["x".join(map(str, s)) for s in ODD])
def test_every_default_config_matches_numpy_on_odd_shapes(kernels_dir: Path, shape: tuple[int, int, int],
                                                          dtype: str) -> None:
    assert check_all_configs(*shape, dtype, "contiguous") >= 2


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_one_sliver_of_b_over_deep_k_blocks(kernels_dir: Path, dtype: str) -> None:
    # 29 columns: one sliver for the chosen tiles, so KC is B's sliver in half of L2 (2048 doubles with 1 MiB):
    # K = 4100 is two or three k-blocks, the last one short, C read back between them
    assert check_all_configs(203, 29, 4100, dtype, "contiguous", alpha=0.5, beta=-1.5, with_bias=True) >= 2


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_blocked_tiles_on_fewer_columns_than_two_vectors(kernels_dir: Path, dtype: str) -> None:
    # The default space leaves such shapes to the few-columns kernel; the exhaustive one still has the blocked
    # kernel's edges there: each register tile, packed and not, on both parallel loops.
    for m, n, k in [(127, 7, 33), (1000, 1, 7), (45, 3, 130), (33, 8, 50)]:
        problem = Problem(m, n, k, dtype)
        blocked = [c for c in gemm_choices(problem) if isinstance(c, TemplateChoice) and c.template is TEMPLATE]
        assert bool(blocked) == (n >= 2 * vector_widths(cpu_info())[0] // problem.itemsize)  # two vectors
        firsts: dict[tuple[Any, ...], dict[str, Any]] = {}
        for c in exhaustive_space(problem, threads=2):
            firsts.setdefault((c["VEC_BYTES"], c["MR"], c["NV"], c["PACK_A"], c["PACK_B"], c["par"]), c)
        check_choices(TEMPLATE.choices(list(firsts.values())), m, n, k, dtype, "offset", alpha=0.5, beta=-1.0,
                      with_bias=True)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_unpacked_edges_over_many_blocks(kernels_dir: Path, dtype: str) -> None:
    # A block pads its right edge of B and its bottom edge of A once and reuses them for every tile of the other
    # loop (kernel.cpp.j2's macro): small blocks make many of them (several MC, NC and KC blocks, a k-block with a
    # tail), with A or B or both read unpacked, over both parallel loops and both loop orders.
    m, n, k = 61, 75, 150
    configs = []
    for (mr, nv), loop in [(register_tiles(vector_widths(cpu_info())[0], cpu_info())[0], "ir_jr"),
                           (register_tiles(vector_widths(cpu_info())[0], cpu_info())[1], "ir_jr"),
                           (register_tiles(vector_widths(cpu_info())[0], cpu_info())[0], "jr_ir")]:
        nr = nv * vector_widths(cpu_info())[0] // Problem(m, n, k, dtype).itemsize
        for (pa, pb), (threads, par) in itertools.product([(0, 0), (1, 0), (0, 1)], [(1, 0), (2, 0), (2, 1)]):
            configs.append({"T": C_TYPES[dtype], "VEC_BYTES": vector_widths(cpu_info())[0], "MR": mr, "NV": nv,
                            "PACK_A": pa, "PACK_B": pb, "UNROLL": 4, "LOOP": loop, "NAME": "tuneforge_gemm",
                            "MC": 2 * mr, "KC": 64, "NC": 2 * nr, "threads": threads, "par": par})
    assert all(n % c["NC"] and m % c["MC"] and k % c["KC"] for c in configs)  # every kind of block has an edge
    check_choices(TEMPLATE.choices(configs), m, n, k, dtype, "offset", alpha=0.5, beta=-1.0, with_bias=True)
    check_choices(TEMPLATE.choices(configs), m, n, k, dtype, "transposed")


@pytest.mark.parametrize("layout", ["transposed", "offset"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_default_config_on_transposed_and_offset_inputs(kernels_dir: Path, layout: str, dtype: str) -> None:
    check_all_configs(33, 127, 7, dtype, layout)
    check_all_configs(127, 33, 100, dtype, layout)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_every_default_config_with_alpha_beta_bias(kernels_dir: Path, dtype: str) -> None:
    check_all_configs(33, 127, 65, dtype, "contiguous", alpha=0.5, beta=-2.0, with_bias=True)
    check_all_configs(7, 1000, 33, dtype, "offset", alpha=2.0, beta=1.0)
    check_all_configs(27, 200, 45, dtype, "transposed", alpha=-1.5, beta=0.5, with_bias=True)
    check_all_configs(127, 7, 1, dtype, "transposed", alpha=1.0, beta=0.0, with_bias=True)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_few_rows_kernel_with_threads_splitting_the_depth(kernels_dir: Path, dtype: str) -> None:
    # Three threads over uneven parts of K, one pass (M <= 8) and several (M = 20, 8 + 8 + 4 rows over column
    # blocks; the exhaustive space's), and fewer rows of B than threads (some parts empty); every stream layout.
    for (m, n, k), layout in [((1, 77, 301), "contiguous"), ((5, 130, 1000), "offset"), ((20, 50, 400), "transposed"),
                              ((3, 1, 2), "offset")]:
        space = small_m_space(Problem(m, n, k, dtype), cpu_info(), 3, most_rows=SMALL_M_MAX)
        configs = [dict(c, threads=3, par=par) for c in space for par in (1, 0)]
        assert {c["FAR"] for c in configs} == ({0, 1} if m <= 8 else {0})
        check_choices(SMALL_M.choices(configs), m, n, k, dtype, layout, alpha=0.5, beta=-1.0, with_bias=True)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_few_columns_kernel_every_rows_and_layout(kernels_dir: Path, dtype: str) -> None:
    # Every rows-per-pass and vector width (the exhaustive space), three threads over uneven chunks of rows, a
    # remainder of rows under ROWS, K with and without a vector tail, A gathered where its columns are strided.
    for (m, n, k), layout in [((37, 5, 29), "contiguous"), ((130, 8, 64), "offset"), ((61, 3, 100), "transposed"),
                              ((7, 1, 1), "offset"), ((4, 2, 0), "contiguous")]:
        space = few_cols_space(Problem(m, n, k, dtype), cpu_info(), 3, exhaustive=True)
        assert {c["NCOLS"] for c in space} == {n} and len({c["ROWS"] for c in space}) >= (2 if n <= 5 else 1)
        configs = [dict(c, threads=t) for c in space for t in (1, 3)]
        check_choices(FEW_COLS.choices(configs), m, n, k, dtype, layout, alpha=0.5, beta=-1.0, with_bias=True)
    # A layout with other columns than the build's (never dispatched so: N is in the key) is still right.
    five = FEW_COLS.choices(few_cols_space(Problem(9, 5, 40, dtype), cpu_info(), 2)[:1])[0]
    a, b = operands(9, 4, 40, dtype, "contiguous")
    out = np.zeros((9, 4), dtype)
    launch(five.kernel(), [a, b, 1.0, 0.0, None, out], five.config)
    np.testing.assert_allclose(out, a @ b, rtol=1e-4 if dtype == "float32" else 1e-12)
    assert not few_cols_space(Problem(9, FEW_COLS_MAX + 1, 40, dtype), cpu_info(), 2)


def test_few_columns_are_offered_up_to_eight_and_fit_the_registers() -> None:
    for n in range(1, FEW_COLS_MAX + 1):
        space = few_cols_space(Problem(3000, n, 700, "float32"), cpu_info(), 2)
        rows = sorted({c["ROWS"] for c in space})
        registers = 32 if space[0]["VEC_BYTES"] == 64 else 16
        assert 1 <= len(rows) <= 2 and all(r * n + 1 <= registers for r in rows)
        assert max(rows) == max(r for r in FEW_COLS_ROWS if r * n + 1 <= registers)  # the most that fit
        assert {c["threads"] for c in space} == {1, 2}
    assert {c["threads"] for c in few_cols_space(Problem(4, 2, 3, "float32"), cpu_info(), 2)} == {1}  # tiny: one


@pytest.mark.skipif("avx2" not in cpu_info().isa, reason="needs a CPU with AVX2")
def test_avx2_kernels_on_a_wider_cpu(kernels_dir: Path) -> None:
    # What an AVX2-only CPU runs: 32-byte vectors, whose aligned start in B differs from 64-byte ones.
    with config.patch(kernel_isa="avx2"):
        assert check_all_configs(1, 77, 301, "float32", "offset", alpha=0.5, beta=-1.0, with_bias=True) >= 3
        assert check_all_configs(5, 130, 203, "float64", "offset", alpha=2.0, beta=1.0) >= 3
        assert check_all_configs(33, 127, 65, "float32", "transposed", with_bias=True) >= 3


def test_beta_zero_ignores_nan_in_out(kernels_dir: Path) -> None:
    a, b = operands(3, 30, 40, "float32", "contiguous")
    choices = [c for c in gemm_choices(Problem(3, 30, 40, "float32")) if isinstance(c, TemplateChoice)]
    pool = default_pool()
    pool.wait([choice.build(pool) for choice in choices])
    for choice in choices:
        out = np.full((3, 30), np.nan, dtype=np.float32)
        launch(choice.kernel(), [a, b, 1.0, 0.0, None, out], choice.config)
        assert np.isfinite(out).all(), choice.info


def test_numpy_is_timed_as_the_dispatcher_calls_it() -> None:
    from tuneforge.kernels.gemm.op import numpy_bound

    a, b = operands(5, 6, 7, "float64", "contiguous")
    (reference,) = [c for c in gemm_choices(Problem(5, 6, 7, "float64")) if c.is_extern]
    out = np.full((5, 6), np.nan)
    plain = reference.bound([a, b, 1.0, 0.0, None, out])
    assert plain.func is np.matmul  # type: ignore[attr-defined]  # numpy.matmul itself, no Python frame between
    plain()
    np.testing.assert_allclose(out, a @ b)
    bias, c0 = np.arange(6.0), np.ones((5, 6))
    out = c0.copy()
    numpy_bound([a, b, 2.0, 3.0, bias, out])()
    np.testing.assert_allclose(out, expected(a, b, 2.0, 3.0, c0, bias))


def test_gemm_op_tunes_then_dispatches(gemm_tuning: Path) -> None:
    a, b = operands(64, 48, 32, "float32", "contiguous")
    out = tuneforge.gemm(a, b)
    np.testing.assert_allclose(out, a @ b, rtol=1e-4, atol=1e-4)
    bias = np.arange(48, dtype=np.float32)
    c = np.ones((64, 48), dtype=np.float32)
    tuneforge.gemm(a, b, c, alpha=2.0, beta=3.0, bias=bias)
    np.testing.assert_allclose(c, 2 * (a @ b) + 3 + bias, rtol=1e-4, atol=1e-3)
    from tuneforge.store.default import default_records

    ops = {r.op for r in default_records().records()}
    assert ops == {"gemm", "gemm_beta_bias"}
    at = np.asfortranarray(a)
    np.testing.assert_allclose(tuneforge.gemm(at, b), a @ b, rtol=1e-4, atol=1e-4)  # another layout: re-tuned
    assert len({r.key for r in default_records().records() if r.op == "gemm"}) == 2


def test_gemm_rejects_bad_input(gemm_tuning: Path) -> None:
    a = np.ones((3, 4), dtype=np.float32)
    with pytest.raises(ValueError, match=r"A\[M,K\] and B\[K,N\]"):
        tuneforge.gemm(a, np.ones((5, 2), dtype=np.float32))
    with pytest.raises(ValueError, match="float32 or float64"):
        tuneforge.gemm(a.astype(np.int32), np.ones((4, 2), dtype=np.int32))
    with pytest.raises(ValueError, match="bias must be"):
        tuneforge.gemm(a, np.ones((4, 2), dtype=np.float32), bias=np.ones(3, dtype=np.float32))
    with pytest.raises(ValueError, match="beta != 0 needs an out"):
        tuneforge.gemm(a, np.ones((4, 2), dtype=np.float32), beta=1.0)


def test_negative_strides_are_copied(gemm_tuning: Path) -> None:
    a, b = operands(16, 24, 8, "float64", "contiguous")
    np.testing.assert_allclose(tuneforge.gemm(a[::-1], b[:, ::-1]), a[::-1] @ b[:, ::-1], rtol=1e-12)


def test_fresh_process_uses_caches_without_building_or_benchmarking(gemm_tuning: Path, wrapper_compiler: Path) -> None:
    code = """
        import json, numpy as np
        import tuneforge
        from tuneforge import config
        from tuneforge.store.default import default_records, default_store
        a = np.ones((96, 80), dtype=np.float32); b = np.ones((80, 72), dtype=np.float32)
        with config.patch(autotune_bench_time_s=0.003, autotune_warmup_s=0.0, autotune_log={log!r}):
            c = tuneforge.gemm(a, b)
        print(json.dumps([float(c[0, 0]), default_store().stats().puts, default_records().count()]))
    """.format(log=str(gemm_tuning / "log.jsonl"))
    env = {"TUNEFORGE_CPP_CXX": str(wrapper_compiler)}
    first = json.loads(run_python(code, env=env).stdout)
    second = json.loads(run_python(code, env={**env, "TUNEFORGE_TEST_FORBID_COMPILE": "1"}).stdout)
    assert first[0] == second[0] == 80.0
    assert second[1] == first[1] and second[2] == first[2]  # nothing built, nothing measured
    sources = [json.loads(line)["source"] for line in (gemm_tuning / "log.jsonl").read_text().splitlines()]
    assert sources == ["tuned", "records"]


def test_wide_vector_paths_only_on_cpus_that_have_them() -> None:
    real = cpu_info()
    avx2_only = dataclasses.replace(real, arch="x86_64", isa=("avx", "avx2", "f16c", "fma", "sse4_2"))
    avx512 = dataclasses.replace(avx2_only, isa=(*avx2_only.isa, "avx512f"))
    arm = dataclasses.replace(real, arch="aarch64", isa=("neon",))
    problem = Problem(512, 512, 512, "float32")
    assert vector_widths(avx2_only) == [32] and vector_widths(avx512) == [64, 32] and vector_widths(arm) == [16]
    for cpu, allowed in ((avx2_only, {32}), (avx512, {64, 32}), (arm, {16})):
        assert {c["VEC_BYTES"] for c in default_space(problem, cpu)} <= allowed
        assert {c["VEC_BYTES"] for c in exhaustive_space(problem, cpu)} <= allowed
    assert {c["VEC_BYTES"] for c in default_space(problem, avx512)} == {64}


def test_default_space_size_and_kernel_count() -> None:
    from tuneforge.kernels.gemm.space import kernel_count

    for shape in [(64, 64, 64), (512, 512, 512), (32, 4096, 4096), (4096, 32, 4096), (4096, 4096, 32),
                  (2, 4096, 4096)]:
        configs = default_space(Problem(*shape, "float32"))
        assert 3 <= len(configs) <= 20 and kernel_count(configs) <= 3, shape
    assert default_space(Problem(1, 4096, 4096, "float32")) == []  # a GEMV: the few-rows kernel's alone
    gemv = gemm_choices(Problem(1, 4096, 4096, "float32"))
    assert gemv[0].name == "numpy_matmul" and {c.config["KU"] for c in gemv[1:]} == {4, 8}  # two builds


def test_thread_counts_in_the_default_space() -> None:
    def threads(shape: tuple[int, int, int], team: int) -> set[int]:
        return {c["threads"] for c in default_space(Problem(*shape, "float64"), threads=team)}

    assert threads((32, 32, 32), 2) == {1}  # too little work to share
    assert threads((64, 64, 64), 2) == {1, 2}
    assert threads((256, 256, 256), 2) == {1, 2}
    assert threads((512, 512, 512), 2) == {2}  # one thread cannot win, and timing it costs seconds
    assert threads((32, 4096, 4096), 2) == {2}
    assert threads((2048, 2048, 2048), 1) == {1}


def test_small_problems_try_tiles_that_fit_them() -> None:
    avx512 = dataclasses.replace(cpu_info(), arch="x86_64", isa=("avx2", "avx512f", "fma"))
    assert padding(Problem(64, 64, 64, "float32"), 14, 2, 64) == pytest.approx(70 / 64 - 1)
    assert padding(Problem(64, 100, 8, "float64"), 8, 2, 64) == pytest.approx(112 / 100 - 1)

    def tiles(shape: tuple[int, int, int], dtype: str = "float32") -> set[tuple[int, int]]:
        with config.patch(kernel_isa="auto"):
            return {(c["MR"], c["NV"]) for c in default_space(Problem(*shape, dtype), avx512, threads=2)}

    assert tiles((128, 128, 128)) == {(8, 2), (4, 4)}  # 8x2 first, then the other tile without padding
    assert tiles((32, 32, 32)) == {(8, 2), (12, 2)}  # 4x4 vectors of fp32 would pad 32 columns to 64
    assert tiles((32, 32, 32), "float64") == {(8, 2), (4, 4)}
    assert (14, 2) in tiles((1024, 1024, 1024)) and (8, 2) not in tiles((1024, 1024, 1024))  # large: by FMA:load

    avx2 = dataclasses.replace(cpu_info(), arch="x86_64", isa=("avx2", "fma"))

    def avx2_tiles(shape: tuple[int, int, int], dtype: str = "float32") -> set[tuple[int, int]]:
        with config.patch(kernel_isa="auto"):
            return {(c["MR"], c["NV"]) for c in default_space(Problem(*shape, dtype), avx2, threads=2)}

    # 16 registers: 6x2 first, though it pads 128 rows to 132, then a tile without padding (8x1; 3x4 would pad
    # least but needs 17 registers)
    assert avx2_tiles((128, 128, 128)) == {(6, 2), (8, 1)}
    assert avx2_tiles((128, 128, 128), "float64") == {(6, 2), (8, 1)}
    # large: the two tiles with 12 accumulators only (a third build never won there)
    assert avx2_tiles((1024, 1024, 1024)) == {(6, 2), (4, 3)}


def test_few_rows_and_a_b_from_memory_split_the_columns_on_one_block_of_rows() -> None:
    from tuneforge.kernels.gemm.space import AHEAD_MAX_M, AHEAD_MIN_BYTES, streams_b

    def splits(shape: tuple[int, int, int], dtype: str = "float32") -> set[tuple[int, int]]:
        """(par, blocks of rows) of each configuration on two threads."""
        return {(c["par"], -(-shape[0] // c["MC"])) for c in default_space(Problem(*shape, dtype), threads=2)
                if c["threads"] == 2}

    assert splits((32, 4096, 4096)) == {(1, 1)}  # 4x3 vectors would have split the rows: 32 = 2 x 4 x 4
    # and a rows split too (into as many blocks as L2's size makes: 4 with 512 KiB, 2 with 1 MiB)
    assert (1, 1) in splits((256, 4096, 4096)) and any(par == 0 and blocks >= 2
                                                        for par, blocks in splits((256, 4096, 4096)))
    assert (1, 1) not in splits((512, 4096, 4096))  # more rows than AHEAD_MAX_M
    assert (1, 1) not in splits((256, 1024, 1024))  # B (4 MiB) stays in cache
    assert streams_b(Problem(AHEAD_MAX_M, AHEAD_MIN_BYTES // 4096, 1024, "float32"))
    assert not streams_b(Problem(AHEAD_MAX_M, AHEAD_MIN_BYTES // 4096 - 1, 1024, "float32"))
    # The kernel decides where it prefetches ahead by the same constants.
    source = (Path(tuneforge.__file__).parent / "kernels" / "gemm" / "kernel.cpp.j2").read_text()
    assert f"constexpr int64_t AHEAD_MAX_M = {AHEAD_MAX_M};" in source
    assert f"constexpr double AHEAD_MIN_BYTES = {AHEAD_MIN_BYTES >> 20} << 20;" in source


def test_large_problems_leave_out_a_tile_that_pads_much_more_work() -> None:
    avx2 = dataclasses.replace(cpu_info(), arch="x86_64", isa=("avx2", "fma"))

    def tiles(shape: tuple[int, int, int], dtype: str = "float32") -> set[tuple[int, int]]:
        with config.patch(kernel_isa="auto"):
            return {(c["MR"], c["NV"]) for c in default_space(Problem(*shape, dtype), avx2, threads=2)}

    assert tiles((4096, 32, 4096)) == {(6, 2)}  # 4x3 vectors would pad 32 columns to 48
    assert tiles((4096, 64, 4096), "float64") == {(6, 2), (4, 3)}  # 64 to 72 doubles: within a fifth
    # a narrow B (at most NARROW_SLIVERS slivers) takes only the tiles that fit it best: 4x3 would pad 32 to 36
    assert tiles((4096, 32, 4096), "float64") == {(6, 2)}
    assert tiles((513, 257, 129)) == {(6, 2), (4, 3)}


def test_mid_size_problems_also_try_b_unpacked() -> None:
    def packs(shape: tuple[int, int, int]) -> set[tuple[int, int]]:
        return {(c["PACK_A"], c["PACK_B"]) for c in default_space(Problem(*shape, "float32"), threads=2)}

    assert packs((96, 1000, 300)) == {(1, 1), (0, 0), (1, 0)}  # below 2 x 512^3 flops
    assert packs((1024, 1024, 1024)) == {(1, 1)}  # ample work: B is reused by many M blocks


def test_few_rows_or_columns_take_the_tiles_that_pad_least() -> None:
    avx512 = dataclasses.replace(cpu_info(), arch="x86_64", isa=("avx2", "avx512f", "fma"))
    avx2 = dataclasses.replace(cpu_info(), arch="x86_64", isa=("avx2", "fma"))

    def tiles(cpu: Any, shape: tuple[int, int, int], dtype: str = "float32") -> set[tuple[int, int]]:
        with config.patch(kernel_isa="auto"):
            return {(c["MR"], c["NV"]) for c in default_space(Problem(*shape, dtype), cpu, threads=2)}

    assert tiles(avx512, (32, 4096, 4096)) == {(8, 3), (4, 4)}  # 14x2 vectors, the first tile, pad 32 rows to 42
    assert tiles(avx512, (17, 2048, 2048)) == {(6, 4), (4, 4)}  # 18 and 20 rows
    assert tiles(avx2, (20, 4096, 4096)) == {(4, 3), (6, 2)}
    # Where B is one sliver for some tile, the tiles that take it in one: 14x2 vectors of fp64 take 32 columns in two
    assert tiles(avx512, (4096, 32, 4096), "float64") == {(6, 4), (4, 4)}
    assert tiles(avx512, (4096, 32, 4096)) == {(14, 2), (12, 2)}  # 6x4 would pad fp32's 32 columns to 64
    assert tiles(avx512, (4096, 64, 4096), "float64") == {(6, 4), (4, 4)}  # two slivers; 8x3 pads 64 to 72
    assert tiles(avx512, (4096, 128, 4096)) == {(6, 4), (4, 4)}
    assert tiles(avx512, (4096, 129, 4096)) == {(8, 3)}  # three slivers (144 columns) where 6x4 pads to 192
    assert (14, 2) in tiles(avx512, (4096, 257, 4096))  # five slivers of 6x4 at the least: the usual order


def test_one_sliver_of_b_takes_a_deep_k_block() -> None:
    from tuneforge.kernels.gemm.space import blocking

    avx512 = dataclasses.replace(cpu_info(), arch="x86_64", isa=("avx2", "avx512f", "fma"))
    one_sliver = blocking(Problem(4096, 32, 4096, "float32"), 64, 14, 2, avx512)["KC"]
    many = blocking(Problem(4096, 1024, 4096, "float32"), 64, 14, 2, avx512)["KC"]
    assert one_sliver >= 4 * many  # B's sliver in half of L2, not A's in L1: each A sliver is used once
    assert blocking(Problem(4096, 33, 4096, "float32"), 64, 14, 2, avx512)["KC"] == many  # two slivers


def test_b_streamed_from_memory_is_also_tried_without_prefetching_ahead() -> None:
    configs = default_space(Problem(32, 4096, 4096, "float32"), threads=2)
    twins = [c for c in configs if c.get("AHEAD") == 0]
    assert twins and all(c["PACK_B"] for c in twins)
    for twin in twins:
        other = {k: v for k, v in twin.items() if k != "AHEAD"}
        assert other in configs  # the same configuration, prefetching
        assert runtime_args(twin)[-1] == runtime_args(other)[-1] | NO_AHEAD
        assert TEMPLATE.render(twin) == TEMPLATE.render(other)  # one build serves both
        assert describe(twin).endswith(" no-ahead") and "ahead" not in describe(other)
    assert (0, 0) not in {(c["PACK_A"], c["PACK_B"]) for c in configs}  # unpacked B: read from memory per pass
    assert not any("AHEAD" in c for c in default_space(Problem(512, 4096, 4096, "float32"), threads=2))


def test_the_librarys_threads_are_in_its_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    from tuneforge.cpuinfo import blas_threads
    from tuneforge.kernels import matmul

    def library_hash() -> str:
        return gemm_choices(Problem(64, 64, 64, "float32"))[0].hash_key

    for name in ("OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert blas_threads() == 3
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")  # OpenBLAS's own variable comes first
    assert blas_threads() == 1
    on_one = library_hash()
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    assert blas_threads() == 2 and library_hash() != on_one
    on_two = matmul.choices("float32")[0].hash_key  # the shipped matmul op's numpy choice likewise
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "1")
    assert matmul.choices("float32")[0].hash_key != on_two


def test_kernel_isa_setting_caps_the_vector_width() -> None:
    avx512 = dataclasses.replace(cpu_info(), arch="x86_64", isa=("avx2", "avx512f", "fma"))
    with config.patch(kernel_isa="avx2"):
        assert vector_widths(avx512) == [32]
        assert {c["VEC_BYTES"] for c in default_space(Problem(256, 256, 256, "float32"), avx512)} == {32}
    with config.patch(kernel_isa="auto"):
        assert vector_widths(avx512) == [64, 32]


@pytest.mark.parametrize("shape", [(128, 128, 128), (512, 512, 512), (8, 1024, 1024), (1, 3000, 3000), (32, 4096, 4096),
                                   (4096, 64, 4096)])
def test_a_search_of_the_exhaustive_space_starts_from_the_default_one(shape: tuple[int, int, int]) -> None:
    problem = Problem(*shape, "float32")
    marked = {json.dumps(c.params, sort_keys=True) for c in gemm_choices(problem, "exhaustive") if c.suggested}
    default = {json.dumps(c.params, sort_keys=True) for c in gemm_choices(problem, "default")[1:]}
    assert marked == default and default  # every default configuration lies in the exhaustive space, marked
    assert not any(c.suggested for c in gemm_choices(problem, "default"))


def test_the_exhaustive_space_leaves_one_thread_out_where_work_is_ample() -> None:
    from tuneforge.kernels.gemm.space import AMPLE_FLOPS

    ample, less = Problem(512, 512, 512, "float32"), Problem(500, 512, 512, "float32")
    assert ample.flops >= AMPLE_FLOPS > less.flops
    assert {c["threads"] for c in exhaustive_space(ample, threads=2)} == {2}
    assert {c["threads"] for c in exhaustive_space(less, threads=2)} == {1, 2}
    assert {c["threads"] for c in exhaustive_space(ample, threads=1)} == {1}  # kernel_threads=1: one is all there is


def test_a_gemv_compiles_its_few_rows_kernel_at_o2(gemm_tuning: Path) -> None:
    """One row is bound by memory (the kernel ran as fast at -O2) and -O3 doubled its compile: a GEMV's few-rows
    kernels carry -O2 after cpp.opt_level's -O3, so it wins; with more rows they compute and keep -O3. The blocked
    and few-columns kernels (intrinsics, unrolled by hand: the same inner loops at both levels) carry -O2 too."""
    from tuneforge.compile.cpp import compile_command
    from tuneforge.compile.toolchain import default_toolchain
    from tuneforge.kernels.gemm.template import GEMV

    def few_rows(m: int) -> list[TemplateChoice]:
        return [c for c in gemm_choices(Problem(m, 512, 256, "float32")) if isinstance(c, TemplateChoice)
                and c.template in (SMALL_M, GEMV)]

    gemv, eight = few_rows(1), few_rows(8)
    assert gemv and all(c.template is GEMV for c in gemv)
    assert eight and all(c.template is SMALL_M for c in eight)
    command = compile_command(gemv[0].cpp_build(), default_toolchain(), "kernel.cpp", "kernel.so")
    assert command.index("-O2") > command.index(f"-O{config.get_str('cpp.opt_level')}")
    assert "-O2" not in compile_command(eight[0].cpp_build(), default_toolchain(), "kernel.cpp", "kernel.so")
    for shape in ((512, 512, 512), (3000, 5, 700)):  # the blocked kernels; the few-columns ones
        others = [c for c in gemm_choices(Problem(*shape, "float32")) if isinstance(c, TemplateChoice)
                  and c.template not in (SMALL_M, GEMV)]
        assert others
        for choice in others:
            command = compile_command(choice.cpp_build(), default_toolchain(), "kernel.cpp", "kernel.so")
            assert command.index("-O2") > command.index(f"-O{config.get_str('cpp.opt_level')}"), choice.name
    out = np.empty((1, 512), np.float32)
    a, b = np.ones((1, 256), np.float32), np.full((256, 512), 0.5, np.float32)
    gemv[0].run([a, b, 1.0, 0.0, None, out])  # builds and runs as before
    np.testing.assert_allclose(out, a @ b)
