from __future__ import annotations

import json

from .conftest import run_python

HEAVY = ("torch", "ray", "redis", "triton", "numpy", "rich", "jinja2", "ctypes")


def test_import_is_light() -> None:
    out = run_python(f"""
        import sys, time, json
        t = time.perf_counter()
        import tuneforge
        elapsed = time.perf_counter() - t
        print(json.dumps([[m for m in {HEAVY!r} if m in sys.modules], elapsed]))
    """).stdout
    loaded, _elapsed = json.loads(out)
    assert loaded == []  # the time itself is measured in benchmarks/codecache.py, not asserted here


def test_public_names() -> None:
    out = run_python("""
        import tuneforge
        print(tuneforge.__version__, callable(tuneforge.cpp.load), callable(tuneforge.cpp.load_module),
              callable(tuneforge.python.load), issubclass(tuneforge.CompileError, tuneforge.TuneforgeError))
    """).stdout.split()
    assert out[1:] == ["True"] * 4
