"""Exceptions raised by tuneforge. Each carries what the user needs to fix the problem."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class TuneforgeError(Exception):
    """Base class of every tuneforge error."""


class ConfigError(TuneforgeError, ValueError):
    """A setting name or value is invalid; the message names the setting and its variable."""


class CompileError(TuneforgeError):
    """The compiler rejected a source. Carries its stderr, the command and the kept source file."""

    def __init__(self, message: str, *, command: Sequence[str], stderr: str, source_path: Path | None,
                 returncode: int | None = None) -> None:
        self.command = list(command)
        self.stderr = stderr
        self.source_path = source_path
        self.returncode = returncode
        super().__init__(message)

    def __reduce__(self) -> tuple[Any, ...]:
        # The keyword-only constructor defeats Exception's default pickling, and a compile error must
        # cross process boundaries (build pool workers) with its stderr, command and source path.
        rebuild = functools.partial(type(self), command=self.command, stderr=self.stderr,
                                    source_path=self.source_path, returncode=self.returncode)
        return (rebuild, self.args[:1], self.__dict__)

    def __str__(self) -> str:
        parts = [self.args[0]]
        if self.source_path is not None:
            parts.append(f"source kept at: {self.source_path}")
        parts.append("command: " + " ".join(self.command))
        if self.stderr.strip():
            parts.append("compiler output:\n" + self.stderr.rstrip())
        return "\n".join(parts)


class ToolchainError(TuneforgeError):
    """No usable compiler was found, or it cannot do what was asked (e.g. OpenMP)."""


class TemplateError(TuneforgeError):
    """A kernel template cannot be registered or rendered; names the template and the problem."""


class NoValidChoicesError(TuneforgeError):
    """Autotuning had no choice that built, ran and gave the right result; lists each choice's reason."""

    def __init__(self, message: str, reasons: dict[str, str] | None = None) -> None:
        self.reasons = dict(reasons or {})
        super().__init__(message)

    def __str__(self) -> str:
        lines = [self.args[0]]
        lines += [f"  {name}: {reason}" for name, reason in self.reasons.items()]
        return "\n".join(lines)
