"""Sources of failed builds, kept where the user can open them: ``<cache_dir>/failed/<key>/``.

Each builder (C++, CUDA, Triton) keeps the source it compiled, the command and the compiler's output
there when a build fails, and names the source in its CompileError.  Only the newest `KEEP` are kept.
`run_compiler` runs a compiler under ``compile_timeout_s`` and turns a time-out into that error.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path

from tuneforge import config
from tuneforge.compile.toolchain import run_command
from tuneforge.errors import CompileError

__all__ = ["KEEP", "keep_failed", "run_compiler"]

KEEP = 50  # failed builds kept for inspection

log = logging.getLogger("tuneforge.compile")


def keep_failed(key: str, source_name: str, source: str, command: Sequence[str], output: str) -> Path | None:
    """Write the failed build's source (as `source_name`), command and output; the source's path, or
    None when the cache directory cannot take them (a warning says why)."""
    failed_root = config.get_path("cache_dir") / "failed"
    target = failed_root / key
    try:
        target.mkdir(parents=True, exist_ok=True)
        (target / source_name).write_text(source)
        (target / "command.txt").write_text(" ".join(command) + "\n")
        (target / "stderr.txt").write_text(output if output.endswith("\n") or not output else output + "\n")
        for stale in sorted(failed_root.iterdir(), key=lambda p: p.stat().st_mtime)[:-KEEP]:
            shutil.rmtree(stale, ignore_errors=True)
    except OSError as exc:
        log.warning("cannot keep failed source under %s: %s", failed_root, exc)
        return None
    return target / source_name


def run_compiler(command: Sequence[str], *, cwd: Path, what: str,
                 keep: Callable[[str], Path | None]) -> subprocess.CompletedProcess[str]:
    """Run `command` in `cwd` within ``compile_timeout_s`` (its process group killed after that); on a
    time-out, `keep` the failed build and raise a CompileError saying `what` timed out."""
    timeout = config.get_float("compile_timeout_s")
    try:
        return run_command(list(command), cwd=cwd, timeout=timeout)
    except subprocess.TimeoutExpired:
        kept = keep(f"timed out after {timeout} s")
        raise CompileError(f"{what} timed out after {timeout:g} s (setting compile_timeout_s)",
                           command=list(command), stderr="", source_path=kept) from None
