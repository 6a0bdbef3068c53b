"""User-facing output: rich tables on a terminal, plain aligned text when piped; errors as one line.

A command-line user needs the message and the file or setting to fix, not the Python stack.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import CodeType, FrameType
from typing import IO, Any


def is_terminal(stream: IO[str] | None = None) -> bool:
    stream = stream or sys.stdout
    return bool(getattr(stream, "isatty", lambda: False)())


def print_table(title: str | None, headers: Sequence[str], rows: Sequence[Sequence[Any]],
                *, stream: IO[str] | None = None) -> None:
    """A table: boxed and coloured on a terminal; tab-free, aligned plain text otherwise."""
    stream = stream or sys.stdout
    cells = [[str(c) for c in row] for row in rows]
    if is_terminal(stream):
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title, show_header=bool(headers))
        for header in headers:
            table.add_column(header)
        for row in cells:
            table.add_row(*row)
        Console(file=stream).print(table)
        return
    if title:
        stream.write(title + "\n")
    all_rows = ([list(headers)] if headers else []) + cells
    widths = [max(len(r[i]) for r in all_rows) for i in range(len(all_rows[0]))] if all_rows else []
    for row in all_rows:
        stream.write("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip() + "\n")


def print_pairs(title: str | None, pairs: Sequence[tuple[str, Any]], *, stream: IO[str] | None = None) -> None:
    """`name  value` lines in the spirit of `ccache -s`."""
    print_table(title, (), [(name, value) for name, value in pairs], stream=stream)


def describe_error(exc: BaseException, cache_dir: Path | None = None) -> str:
    """One line for an error caused by input or environment; a path inside `cache_dir` is explained."""
    if isinstance(exc, OSError) and exc.filename is not None:
        path = os.fsdecode(exc.filename)
        text = f"{exc.strerror or exc}: {path}"
        if cache_dir is not None and Path(path).is_relative_to(cache_dir):
            text += f" (in the cache directory {cache_dir}, set by TUNEFORGE_CACHE_DIR)"
        return text
    if isinstance(exc, MemoryError):
        return f"out of memory{': ' + str(exc) if str(exc) else ''}"
    if isinstance(exc, RecursionError):
        return f"input nested too deeply ({exc})"
    return str(exc) or type(exc).__name__


# SIGINT is 2; shells report a process it ended as 128 + 2.
INTERRUPTED_STATUS = 130
_interrupt = {"reported": False, "pending": False}


def report_interrupt() -> None:
    """Say, once, that Ctrl-C stopped the command (after the terminal's ^C, hence the newline)."""
    if not _interrupt["reported"]:
        _interrupt["reported"] = True
        sys.stderr.write("\ninterrupted\n")
        sys.stderr.flush()


def exit_interrupted() -> None:
    """Report Ctrl-C and end the process now, with the status of an interrupted command."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed or broken stream: nothing to save
            stream.flush()
    if not _interrupt["reported"]:
        _interrupt["reported"] = True
        os.write(2, b"\ninterrupted\n")
    os._exit(INTERRUPTED_STATUS)


def _interrupted_while_exiting(signum: int, frame: FrameType | None) -> None:
    # A KeyboardInterrupt raised inside an exit handler prints a traceback and loses what that handler
    # was flushing (records, statistics): the first Ctrl-C lets them finish, a second one stops at once.
    if _interrupt["pending"]:
        exit_interrupted()
    _interrupt["pending"] = True


def _report_late_interrupt() -> None:
    if _interrupt["pending"]:
        exit_interrupted()


def hold_interrupts_at_exit() -> None:
    """Call first in a command: its exit handler runs after every later-registered one (they run LIFO)."""
    atexit.register(_report_late_interrupt)


def _redeliver_swallowed_interrupt(unraisable: Any) -> None:
    # Ctrl-C landing in a __del__ or a weakref callback (the import system has some) raises where
    # Python can only print it and go on: the command would keep running. Raise it again outside, from
    # a thread that waits for this hook to return (any pending signal would be raised in here).
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        threading.Thread(target=_interrupt_main_outside, args=(sys._getframe().f_code,),
                         name="tuneforge-interrupt", daemon=True).start()
        return
    sys.__unraisablehook__(unraisable)


def _interrupt_main_outside(hook: CodeType) -> None:
    main = threading.main_thread().ident or 0

    def in_hook() -> bool:
        frame = sys._current_frames().get(main)
        while frame is not None and frame.f_code is not hook:
            frame = frame.f_back
        return frame is not None

    while in_hook():
        time.sleep(0.001)
    signal.pthread_kill(main, signal.SIGINT)  # a real signal: it also ends a sleep or a wait


def keep_swallowed_interrupts() -> None:
    """Call first in a command: a Ctrl-C that Python would swallow stops the command all the same."""
    sys.unraisablehook = _redeliver_swallowed_interrupt


def exiting() -> None:
    """From now on the command is done and the process is exiting: Ctrl-C is held (see above)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _interrupted_while_exiting)
