"""Generated Python source -> imported module, stored by content, without touching sys.path.

The entry keeps the source (``module.py``, which tracebacks and linecache read) and the marshalled
code object, because this environment may forbid ``.pyc`` files (PYTHONDONTWRITEBYTECODE) and
compiling a module on every load would cost most of a warm start.
"""

from __future__ import annotations

import importlib.util
import marshal
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any

from tuneforge.hashing import code_hash
from tuneforge.store.default import default_store
from tuneforge.store.tiers import from_remote_or

ARTIFACT_FORMAT = 1
SOURCE_NAME = "module.py"
CODE_NAME = "module.marshal"
MODULE_PREFIX = "tuneforge_generated_"

_modules: dict[tuple[str, str], ModuleType] = {}
_lock = threading.Lock()


def _key(source: str) -> str:
    # The bytecode format is tied to the interpreter's magic number: part of the key.
    extra = {"artifact": "python", "format": ARTIFACT_FORMAT,
             "magic": importlib.util.MAGIC_NUMBER.hex(), "impl": sys.implementation.cache_tag}
    return "py" + code_hash(source, extra=extra)


def _code_for(entry_path: Path, source: str) -> bytes:
    return marshal.dumps(compile(source, str(entry_path / SOURCE_NAME), "exec", dont_inherit=True))


def load(source: str, *, attrs: Mapping[str, Any] | None = None) -> ModuleType:
    """Import `source` as a module named ``tuneforge_generated_<key>``; the same source gives the same module.

    `attrs` are set on the module before its code runs (e.g. objects the generated code refers to).
    """
    store = default_store()
    key = _key(source)
    memo = (str(store.root), key)
    with _lock:
        module = _modules.get(memo)
        if module is not None:
            return module
        final_dir = store.root / "entries" / key[:2] / key  # where the entry will be published

        def write(staging: Path) -> Mapping[str, Any]:
            (staging / SOURCE_NAME).write_text(source)
            # Compiled against the published path so tracebacks name a file that exists.
            (staging / CODE_NAME).write_bytes(_code_for(final_dir, source))
            return {"python": sys.version.split()[0]}

        inputs = {"artifact": "python", "source_key": key}
        entry = store.get_or_build(key, from_remote_or(key, write), key_inputs=inputs)
        code = marshal.loads(entry.file(CODE_NAME).read_bytes())
        source_path = entry.file(SOURCE_NAME)
        if not isinstance(code, CodeType) or code.co_filename != str(source_path):
            code = compile(source, str(source_path), "exec", dont_inherit=True)  # the cache moved
        name = MODULE_PREFIX + key
        module = ModuleType(name)
        module.__file__ = str(source_path)
        module.__dict__.update(attrs or {})
        module.tuneforge_key = key  # type: ignore[attr-defined]
        sys.modules[name] = module  # lets pickle, inspect and linecache find it
        try:
            exec(code, module.__dict__)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        _modules[memo] = module
        return module
