"""Shared by the benchmark scripts."""

from __future__ import annotations

import compileall
import json
from pathlib import Path
from typing import Any

import tuneforge


def precompile_package() -> None:
    """Write tuneforge's .pyc files, as `pip install` does for a regular (non-editable) install.

    An editable install never gets them while PYTHONDONTWRITEBYTECODE is set (as on this machine), so
    start-up figures would otherwise include compiling tuneforge's own modules on every run.
    """
    compileall.compile_dir(str(Path(tuneforge.__file__).parent), quiet=1)


def write_results(name: str, results: Any) -> None:
    """benchmarks/results/<name>.json, and say where it went."""
    out = Path(__file__).parent / "results" / f"{name}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
