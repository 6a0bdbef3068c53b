"""User-facing output: rich tables on a terminal, plain aligned text when piped."""

from __future__ import annotations

import sys
from collections.abc import Sequence
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
