from __future__ import annotations

import sys
import traceback
from pathlib import Path

import pytest

import tuneforge

from .conftest import run_python

GENERATED = "def kernel(x):\n    y = x + 1\n    return y / (x - x)  # generated line 3\n"


def test_traceback_shows_the_generated_line(cache_dir: Path) -> None:
    module = tuneforge.python.load(GENERATED)
    with pytest.raises(ZeroDivisionError) as info:
        module.kernel(2)
    text = "".join(traceback.format_exception(info.value))
    assert "return y / (x - x)  # generated line 3" in text
    assert module.__file__ is not None and module.__file__ in text and "line 3" in text


def test_same_source_same_module_and_no_sys_path_change(cache_dir: Path) -> None:
    path_before = list(sys.path)
    first = tuneforge.python.load("VALUE = 41\n")
    assert tuneforge.python.load("VALUE = 41\n") is first
    assert first.VALUE == 41 and sys.modules[first.__name__] is first
    assert tuneforge.python.load("VALUE = 42\n").VALUE == 42
    assert sys.path == path_before


def test_attrs_are_visible_to_the_generated_code(cache_dir: Path) -> None:
    module = tuneforge.python.load("RESULT = helper(3)\n", attrs={"helper": lambda x: x * 2})
    assert module.RESULT == 6


def test_fresh_process_loads_stored_module(cache_dir: Path) -> None:
    code = """
        import tuneforge
        from tuneforge.store.default import default_store
        m = tuneforge.python.load("def f():\\n    return 'stored'\\n")
        s = default_store().stats()
        print(m.f(), s.hits, s.puts)
    """
    assert run_python(code).stdout.split() == ["stored", "0", "1"]
    assert run_python(code).stdout.split() == ["stored", "1", "1"]
