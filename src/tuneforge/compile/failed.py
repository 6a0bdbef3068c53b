"""Sources of failed builds, kept where the user can open them: ``<cache_dir>/failed/<key>/``.

Each builder (C++, CUDA, Triton) keeps the source it compiled, the command and the compiler's output
there when a build fails, and names the source in its CompileError.  Only the newest `KEEP` are kept.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Sequence
from pathlib import Path

from tuneforge import config

__all__ = ["KEEP", "keep_failed"]

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
