"""The build progress bar: shown on a terminal with the compile.progress setting on, drawn by rich."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

from tuneforge import config
from tuneforge.errors import ConfigError


def _progress_setting() -> bool:
    try:
        return config.get_bool("compile.progress")
    except ConfigError:  # the setting is declared in settings_schema; tolerate its absence
        return True


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def progress_wanted() -> bool:
    """A progress bar by default: only on a terminal, and only with the compile.progress setting on."""
    return _is_terminal(sys.stderr) and _progress_setting()


@contextlib.contextmanager
def progress_bar(show: bool, total: int) -> Iterator[Callable[[int], Any]]:
    """Yields advance(done); with ``show`` false it draws nothing (and rich is not imported)."""
    if not show:
        yield lambda done: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    # redirect_*=False: rich must not replace sys.stdout / sys.stderr while the bar is shown.
    with Progress(TextColumn("building"), MofNCompleteColumn(), BarColumn(), TimeElapsedColumn(),
                  console=Console(file=sys.stderr), redirect_stdout=False, redirect_stderr=False,
                  transient=False) as bar:
        task = bar.add_task("building", total=total)
        yield lambda done: bar.update(task, completed=done)
