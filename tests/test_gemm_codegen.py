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
from tuneforge.kernels.gemm.space import Problem, default_space, exhaustive_space, register_tiles
from tuneforge.kernels.gemm.template import TEMPLATE

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
    return [body for name, body in blocks
            if any(re.match(rf"\s+j\w+\s+{re.escape(name)}$", line) for line in body[-3:])
            and sum("vfmadd" in line for line in body) >= least]


def avx2_config(tile: tuple[int, int], dtype: str, space: str = "default") -> dict[str, object]:
    problem = Problem(512, 512, 512, dtype)
    with config.patch(kernel_isa="auto"):
        configs = default_space(problem, AVX2, threads=2) if space == "default" else \
            list(exhaustive_space(problem, AVX2, threads=2))
    return next(c for c in configs if (c["MR"], c["NV"]) == tile)


def compile_to_assembly(source: str, tmp_path: Path) -> str:
    path = tmp_path / "kernel.cpp"
    path.write_text(source)
    assert GCC is not None
    # as a build compiles it: cpp.opt_level's -O, then the template's flags (its own -O2 wins)
    subprocess.run([*GCC, "-O3", "-march=haswell", *TEMPLATE.flags, "-S", "-o",
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
