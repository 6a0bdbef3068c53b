"""The README's headline command, exactly as the README spells it, run as a user runs it.

Only the benchmarking budget is shortened (through TUNEFORGE_AUTOTUNE_* variables, which a user may set
too): the command line, the console script and the compiled GEMM family are the real ones.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
from pathlib import Path

from .test_cli_errors import FAST, tuneforge_command

README = Path(__file__).resolve().parents[1] / "README.md"


def headline_arguments() -> list[str]:
    """The arguments of `tuneforge tune ...` in the README's first code block."""
    block = re.search(r"```(?:bash|sh|console)?\n(.*?)```", README.read_text(), re.DOTALL)
    assert block is not None, "README.md has no code block"
    for line in block.group(1).splitlines():
        for command in line.split("&&"):
            words = shlex.split(command)
            if words and Path(words[0]).name == "tuneforge" and words[1:2] == ["tune"]:
                return words[1:]
    raise AssertionError(f"the first code block of README.md runs no `tuneforge tune`:\n{block.group(1)}")


def test_readme_names_the_gemm_command() -> None:
    assert headline_arguments() == ["tune", "gemm", "--shape", "512x512x512", "--dtype", "float32"]


def test_readme_headline_command_tunes_then_answers_from_records(tmp_path: Path) -> None:
    args = headline_arguments()
    env = {**os.environ, **FAST, "TUNEFORGE_CACHE_DIR": str(tmp_path / "cache")}
    first = subprocess.run([*tuneforge_command(), *args], capture_output=True, text=True, env=env, timeout=600)
    assert first.returncode == 0, first.stderr
    table = first.stderr.splitlines()
    assert "AUTOTUNE gemm(512x512, 512x512)" in table, first.stderr
    rows = table[table.index("AUTOTUNE gemm(512x512, 512x512)") + 1:]
    assert any(row.startswith("  numpy_matmul ") for row in rows), first.stderr
    assert any(row.startswith("  tuneforge_gemm_") for row in rows), first.stderr
    assert re.search(r"^  \S+ \d+\.\d+ ms 100\.0%", first.stderr, re.MULTILINE), first.stderr  # the winner
    assert any(row.startswith("SubProcess AUTOTUNE benchmarking takes") for row in rows), first.stderr
    answer = re.fullmatch(r"gemm 512x512x512 float32: (\S+).* at [\d.]+ ms, [\d.]+ GFLOP/s; "
                          r"decided from tuned in [\d.]+ s", first.stdout.strip())
    assert answer is not None, first.stdout

    again = subprocess.run([*tuneforge_command(), *args], capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"gemm 512x512x512 float32: {answer.group(1)}"), again.stdout
    assert "decided from records" in again.stdout
    assert "nothing benchmarked" in again.stderr and "SubProcess AUTOTUNE benchmarking" not in again.stderr
