"""Generated Python code: ``tuneforge.python.load(source)`` imports it by content key."""

from tuneforge.compile.python import load

__all__ = ["load"]
