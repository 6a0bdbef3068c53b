"""What the compiler makes of the GEMM kernel's register tiles: accumulators stay in registers.

A tile whose accumulators the register allocator puts on the stack runs at about half speed (a store and a reload
on every k step), and no result check notices it. These tests compile the rendered kernel to assembly with the
compiler tuneforge builds with (GCC) and look at its loops of FMAs.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
from pathlib import Path

import pytest

from tuneforge import config
from tuneforge.compile.toolchain import default_toolchain
from tuneforge.cpuinfo import cpu_info
from tuneforge.kernels.gemm.space import Problem, default_space, exhaustive_space, few_cols_space, register_tiles
from tuneforge.kernels.gemm.template import FEW_COLS, TEMPLATE

AVX2 = dataclasses.replace(cpu_info(), arch="x86_64", isa=("avx2", "fma"))
STACK_VECTOR = re.compile(r"%[xy]mm\d+.*\(%rsp\)|\(%rsp\).*%[xy]mm\d+")


def _gcc() -> tuple[str, ...] | None:
    """The command of the compiler tuneforge builds with, if it is GCC (the allocator hint is GCC's)."""
    try:
        toolchain = default_toolchain()
    except Exception:  # no compiler at all
        return None
    return toolchain.command if toolchain.kind == "gcc" else None


GCC = _gcc()
needs_gcc = pytest.mark.skipif(GCC is None, reason="the kernel's allocator hint is for GCC")


def fma_loops(assembly: str, least: int) -> list[list[str]]:
    """The bodies of the assembly's loops (a label whose block jumps back to it) holding `least` FMAs or more."""
    blocks: list[tuple[str, list[str]]] = []
    for line in assembly.splitlines():
        label = re.match(r"^(\.?L\w+):", line)
        if label:
            blocks.append((label.group(1), []))
        elif blocks:
            blocks[-1][1].append(line)
    loops = []
    for name, body in blocks:  # a loop's body ends at its jump back (code after it is the loop's exit)
        back = next((i for i, line in enumerate(body) if re.match(rf"\s+j\w+\s+{re.escape(name)}$", line)), None)
        if back is not None and sum("vfmadd" in line for line in body[:back]) >= least:
            loops.append(body[:back + 1])
    return loops


def avx2_config(tile: tuple[int, int], dtype: str, space: str = "default") -> dict[str, object]:
    problem = Problem(512, 512, 512, dtype)
    with config.patch(kernel_isa="auto"):
        configs = default_space(problem, AVX2, threads=2) if space == "default" else \
            list(exhaustive_space(problem, AVX2, threads=2))
    return next(c for c in configs if (c["MR"], c["NV"]) == tile)


def compile_to_assembly(source: str, tmp_path: Path, flags: tuple[str, ...] = TEMPLATE.flags) -> str:
    path = tmp_path / "kernel.cpp"
    path.write_text(source)
    assert GCC is not None
    # as a build compiles it: cpp.opt_level's -O, then the template's flags (its own -O2 wins)
    subprocess.run([*GCC, "-O3", "-march=haswell", *flags, "-S", "-o",
                    str(tmp_path / "kernel.s"), str(path)], check=True, capture_output=True, text=True)
    return (tmp_path / "kernel.s").read_text()


@needs_gcc
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("tile", [(6, 2), (4, 3)])
def test_sixteen_register_tiles_keep_their_accumulators_in_registers(tile: tuple[int, int], dtype: str,
                                                                     tmp_path: Path) -> None:
    assembly = compile_to_assembly(TEMPLATE.render(avx2_config(tile, dtype)), tmp_path)
    loops = fma_loops(assembly, tile[0] * tile[1])
    assert loops, "no loop of the micro-kernel's FMAs found"
    spilled = [line.strip() for body in loops for line in body if STACK_VECTOR.search(line)]
    assert not spilled, f"{tile} tile keeps vectors on the stack in its k loop: {spilled[:4]}"


def test_the_seventeen_register_tile_is_only_in_the_exhaustive_space() -> None:
    """3x4 vectors need 17 registers of 16 (spilled accumulators, or B read from memory by every FMA: 15 loads a
    k step for 12 FMAs); only the exhaustive space, whose recordings hold it, builds it."""
    assert (3, 4) not in register_tiles(32, AVX2) and (3, 4) in register_tiles(32, AVX2, spilling=True)
    with config.patch(kernel_isa="auto"):
        for shape in [(128, 128, 128), (512, 512, 512), (17, 2048, 64), (96, 1000, 300)]:
            assert all((c["MR"], c["NV"]) != (3, 4) for c in default_space(Problem(*shape, "float32"), AVX2, 2))
    assert avx2_config((3, 4), "float32", "exhaustive")["MR"] == 3


@needs_gcc
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_few_columns_kernel_unrolls_its_rows_and_columns(dtype: str, tmp_path: Path) -> None:
    """At -O2 (its flags) GCC 12 left the loops over rows and columns rolled unless told to unroll them: one FMA a
    loop, the ROWS x N accumulators in memory, and 3000x5x700 1.5-3x slower than at -O3. The k loop must hold all
    ROWS x N FMAs, with no more vectors on the stack than 16 registers force (ROWS x N accumulators, ROWS rows of A
    and a vector of B: 3 rows of 5 columns keep two accumulators there, at -O3 too)."""
    with config.patch(kernel_isa="auto"):
        configs = few_cols_space(Problem(3000, 5, 700, dtype), AVX2, 2)
    for config_ in {c["ROWS"]: c for c in configs}.values():
        rows, cols = config_["ROWS"], config_["NCOLS"]
        assembly = compile_to_assembly(FEW_COLS.render(config_), tmp_path, FEW_COLS.flags)
        loops = fma_loops(assembly, rows * cols)
        assert loops, f"no loop of {rows} x {cols} FMAs: the loops over rows and columns were not unrolled"
        short = max(0, rows * cols + rows + 1 - 16)
        for body in loops:
            spilled = [line.strip() for line in body if STACK_VECTOR.search(line)]
            assert len(spilled) <= 2 * short, f"{rows} rows keep vectors on the stack in the k loop: {spilled[:4]}"
