"""Argument types shared by the benchmark scripts' command lines."""

from __future__ import annotations

import argparse


def three_sizes(text: str, separator: str, names: str, example: str) -> tuple[int, int, int]:
    """'AxBxC' (with `separator` between) -> three positive integers, or an argparse error naming them (`names`,
    e.g. "M, N and K") and a well-formed `example`."""
    try:
        first, second, third = (int(size) for size in text.lower().split(separator))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {names}: three integers separated by {separator!r}, "
                                         f"as in {example}") from None
    if min(first, second, third) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: {names} must be at least 1")
    return first, second, third
