"""The public entry point for generated Python code: ``tuneforge.python.load(source)`` imports it by
content key. The code lives in `tuneforge.compile.python`; this is the name users import."""

from tuneforge.compile.python import load

__all__ = ["load"]
