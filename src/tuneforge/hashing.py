"""Content keys: stable serialisation of key material (the machine's fingerprint is `tune/fingerprint.py`).

A key must be the same in every process, on every machine and Python version that would produce
the same artifact, so key material is serialised by an explicit, type-tagged encoder rather than
pickle, repr() or hash(): maps and sets are sorted, floats are written exactly, and absolute paths
are refused (a key must not depend on where a cache happens to live).
"""

from __future__ import annotations

import base64
import dataclasses
import enum
import hashlib
import json
import math
import os
import sys
from pathlib import PurePath
from typing import Any

# Bumped when the encoding below changes, so old and new keys can never collide.
KEY_FORMAT_VERSION = 1


class KeyMaterialError(TypeError):
    """A value cannot take part in a key (unsupported type or an absolute path)."""


def _encode(obj: Any) -> Any:
    """Map key material onto JSON values with explicit type tags."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return {"int": str(obj)}
    if isinstance(obj, float):
        # float.hex is exact and identical across platforms; nan/inf get a fixed spelling.
        return {"float": obj.hex() if math.isfinite(obj) else repr(obj)}
    if isinstance(obj, bytes):
        return {"bytes": base64.b64encode(obj).decode("ascii")}
    if isinstance(obj, (list, tuple)):
        return {type(obj).__name__: [_encode(v) for v in obj]}
    if isinstance(obj, (set, frozenset)):
        return {"set": sorted((_encode(v) for v in obj), key=_canonical)}
    if isinstance(obj, dict):
        items = [[_encode(k), _encode(v)] for k, v in obj.items()]
        return {"dict": sorted(items, key=lambda kv: _canonical(kv[0]))}
    if isinstance(obj, enum.Enum):
        return {"enum": f"{type(obj).__module__}.{type(obj).__qualname__}", "value": _encode(obj.value)}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
        return {"dataclass": f"{type(obj).__module__}.{type(obj).__qualname__}", "fields": _encode(fields)}
    if isinstance(obj, PurePath):
        if obj.is_absolute():
            raise KeyMaterialError(f"absolute path {str(obj)!r} cannot be part of a key; hash the file's "
                                   "content instead (keys must not depend on where files live)")
        return {"path": obj.as_posix()}
    numpy_dtype = _numpy_dtype_str(obj)
    if numpy_dtype is not None:
        return {"dtype": numpy_dtype}
    hook = getattr(obj, "__tuneforge_key__", None)
    if callable(hook):
        return {"custom": f"{type(obj).__module__}.{type(obj).__qualname__}", "value": _encode(hook())}
    raise KeyMaterialError(f"cannot use a {type(obj).__qualname__} in a key: use str, int, float, bytes, "
                           "tuple, list, dict, set, enum, dataclass, numpy dtype or define __tuneforge_key__()")


def _numpy_dtype_str(obj: Any) -> str | None:
    numpy = sys.modules.get("numpy")  # only when the caller already uses numpy: never import it here
    if numpy is None:
        return None
    if isinstance(obj, numpy.dtype):
        return str(obj.str)
    if isinstance(obj, type) and issubclass(obj, numpy.generic):
        return str(numpy.dtype(obj).str)
    return None


def _canonical(encoded: Any) -> str:
    return json.dumps(encoded, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def stable_dumps(obj: Any) -> bytes:
    """Canonical bytes of key material: equal values give equal bytes in any process."""
    return _canonical([KEY_FORMAT_VERSION, _encode(obj)]).encode("ascii")


def _b32(digest: bytes) -> str:
    return base64.b32encode(digest).decode("ascii").rstrip("=").lower()


def key_hash(obj: Any) -> str:
    """52-character lowercase base32 sha256 of the stable serialisation of `obj`."""
    return _b32(hashlib.sha256(stable_dumps(obj)).digest())


def code_hash(content: str | bytes, extra: Any = None) -> str:
    """Key of a source text (exact bytes; nothing stripped) plus optional extra key material."""
    data = content.encode("utf-8") if isinstance(content, str) else bytes(content)
    digest = hashlib.sha256(b"tuneforge-code\0" + data)
    if extra is not None:
        digest.update(b"\0extra\0" + stable_dumps(extra))
    return _b32(digest.digest())


def file_hash(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    """sha256 hex digest of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(chunk):
            digest.update(block)
    return digest.hexdigest()
