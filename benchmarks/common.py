"""Shared by the benchmark scripts."""

from __future__ import annotations

import compileall
from pathlib import Path

import tuneforge


def precompile_package() -> None:
    """Write tuneforge's .pyc files, as `pip install` does for a regular (non-editable) install.

    An editable install never gets them while PYTHONDONTWRITEBYTECODE is set (as on this machine), so
    start-up figures would otherwise include compiling tuneforge's own modules on every run.
    """
    compileall.compile_dir(str(Path(tuneforge.__file__).parent), quiet=1)
