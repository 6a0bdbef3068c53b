"""Generated Python source -> imported module, stored by content, without touching sys.path.

The entry keeps the source (``module.py``, which tracebacks and linecache read) and the marshalled
code object, because this environment may forbid ``.pyc`` files (PYTHONDONTWRITEBYTECODE) and
compiling a module on every load would cost most of a warm start.

Code objects are code: they come only from this machine's store, never from the remote tier (no one
shares them there, so a value found in Redis could only have been planted), and before one runs it
is checked against the source it was compiled from: the entry's meta records the sha256 of
``module.py`` and of ``module.marshal``, the source must be the one asked for, and the code must be
the one recorded.  An entry that fails (written by something else, half replaced, from an older
format) is rebuilt from the source.  This catches inconsistent entries; it cannot stop someone who
may write the cache directory, who could replace its shared libraries just as well.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import logging
import marshal
import sys
from collections.abc import Mapping
from pathlib import Path
from types import CodeType, ModuleType
from typing import Any

from tuneforge.forksafe import ForkSafeLock
from tuneforge.hashing import code_hash
from tuneforge.store.default import default_store
from tuneforge.store.entry import Entry

ARTIFACT_FORMAT = 2  # 2: meta records the sha256 of the source and of the code
SOURCE_NAME = "module.py"
CODE_NAME = "module.marshal"
MODULE_PREFIX = "tuneforge_generated_"

log = logging.getLogger("tuneforge.compile.python")

_modules: dict[tuple[str, str], ModuleType] = {}
_lock = ForkSafeLock()


def _key(source: str) -> str:
    # The bytecode format is tied to the interpreter's magic number: part of the key.
    extra = {"artifact": "python", "format": ARTIFACT_FORMAT,
             "magic": importlib.util.MAGIC_NUMBER.hex(), "impl": sys.implementation.cache_tag}
    return "py" + code_hash(source, extra=extra)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _code_for(entry_path: Path, source: str) -> bytes:
    return marshal.dumps(compile(source, str(entry_path / SOURCE_NAME), "exec", dont_inherit=True))


def _checked_code(entry: Entry, source_sha256: str) -> CodeType | str:
    """The entry's code object if it is the one compiled from the source asked for, else why not."""
    meta = entry.meta
    if meta.get("source_sha256") != source_sha256 or not isinstance(meta.get("code_sha256"), str):
        return "its meta does not record this source and its code"
    # The store checked the files against the manifest's sha256 when it served the entry, so the
    # manifest speaks for module.py; the code is hashed as read, since it is read anyway.
    if entry.manifest["files"].get(SOURCE_NAME, {}).get("sha256") != source_sha256:
        return f"{SOURCE_NAME} is not the source asked for"
    try:
        data = entry.file(CODE_NAME).read_bytes()
    except Exception as exc:  # a file missing or unreadable: the same as a mismatch
        return f"cannot read it ({exc})"
    if _sha256(data) != meta["code_sha256"]:
        return f"{CODE_NAME} is not the code compiled from {SOURCE_NAME}"
    try:
        code = marshal.loads(data)
    except Exception as exc:
        return f"{CODE_NAME} does not unmarshal ({exc})"
    return code if isinstance(code, CodeType) else f"{CODE_NAME} holds no code object"


def load(source: str, *, attrs: Mapping[str, Any] | None = None) -> ModuleType:
    """Import `source` as a module named ``tuneforge_generated_<key>``; the same source gives the same module.

    `attrs` are set on the module before its code runs (e.g. objects the generated code refers to). The
    module's ``tuneforge_key`` attribute names its artifact, for users; tuneforge uses `load_keyed`.
    """
    return load_keyed(source, attrs=attrs)[0]


def load_keyed(source: str, *, attrs: Mapping[str, Any] | None = None) -> tuple[ModuleType, str]:
    """`load`, and the key of the artifact the module came from (which a tuning record keeps)."""
    store = default_store()
    key = _key(source)
    memo = (str(store.root), key)
    with _lock:
        module = _modules.get(memo)
        if module is not None:
            return module, key
        final_dir = store.root / "entries" / key[:2] / key  # where the entry will be published
        source_bytes = source.encode("utf-8")
        source_sha256 = _sha256(source_bytes)

        def write(staging: Path) -> Mapping[str, Any]:
            # Compiled against the published path so tracebacks name a file that exists.
            code = _code_for(final_dir, source)
            (staging / SOURCE_NAME).write_bytes(source_bytes)
            (staging / CODE_NAME).write_bytes(code)
            return {"python": sys.version.split()[0], "source_sha256": source_sha256, "code_sha256": _sha256(code)}

        inputs = {"artifact": "python", "source_key": key}
        # The local store only: nothing puts generated Python into the remote tier (see the docstring).
        entry = store.get_or_build(key, write, key_inputs=inputs)
        code = _checked_code(entry, source_sha256)
        if isinstance(code, str):
            log.warning("python artifact %s does not match its source: %s; rebuilding it from the source",
                        key, code)
            with contextlib.suppress(Exception):  # e.g. a read-only store: then compile in memory below
                store.remove(key)
                entry = store.get_or_build(key, write, key_inputs=inputs)
                code = _checked_code(entry, source_sha256)
        source_path = entry.file(SOURCE_NAME)
        if not isinstance(code, CodeType) or code.co_filename != str(source_path):
            code = compile(source, str(source_path), "exec", dont_inherit=True)  # the cache moved, or no good entry
        name = MODULE_PREFIX + key
        module = ModuleType(name)
        module.__file__ = str(source_path)
        module.__dict__.update(attrs or {})
        module.tuneforge_key = key  # type: ignore[attr-defined]  # for users: see load
        sys.modules[name] = module  # lets pickle, inspect and linecache find it
        try:
            exec(code, module.__dict__)
        except BaseException:
            sys.modules.pop(name, None)
            raise
        _modules[memo] = module
        return module, key
