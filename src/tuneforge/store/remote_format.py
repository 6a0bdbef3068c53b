"""The bytes of remote values: compression, the artifact body layout and its verification.

See `tuneforge.store.remote` for the whole value format and the trust model.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import struct
import sys
from collections.abc import Mapping
from typing import Any, Literal

from tuneforge.store.entry import MANIFEST, NAME_RE

FORMAT_VERSION = 1  # in every Redis key: bump it when a value's layout changes
SIGNED = b"TFS1"
UNSIGNED = b"TFU1"
ARTIFACT_MAGIC = b"TFAR"
_ARTIFACT_HEADER = struct.Struct(">4sHI")  # magic, format version, manifest length
MAC_LEN = hashlib.sha256().digest_size
# zstd rather than lz4: measured on .so files from a real artifact store, zstd level 3 gives 3.4-9.4x
# where lz4 gives 2.6-6.5x (2.9-7.7x at lz4-HC 9, which compresses 10x slower), and both decode at
# GB/s, so decoding costs microseconds for a kernel, far below one Redis round trip.
_ZSTD_LEVEL = 3


def mac(secret: bytes, rkey: bytes, payload: bytes | memoryview) -> bytes:
    """The signature of `payload` stored under the Redis key `rkey`."""
    # The key's length comes first so that no (key, payload) pair can be re-split into another.
    # Fed in pieces: joining them would copy the whole payload.
    digest = hmac.new(secret, struct.pack(">I", len(rkey)), hashlib.sha256)
    digest.update(rkey)
    digest.update(payload)
    return digest.digest()


def seal(secret: bytes | None, rkey: bytes, body: bytes) -> bytes:
    """The value that stores `body` under `rkey`: compressed, and signed when there is a secret."""
    payload = compress(body)
    return UNSIGNED + payload if secret is None else SIGNED + mac(secret, rkey, payload) + payload


def join_artifact(manifest_json: bytes, contents: Mapping[str, bytes]) -> bytes:
    """An artifact body: header, manifest JSON, then the files in sorted name order."""
    header = _ARTIFACT_HEADER.pack(ARTIFACT_MAGIC, FORMAT_VERSION, len(manifest_json))
    return b"".join([header, manifest_json, *(contents[name] for name in sorted(contents))])


def compress(body: bytes) -> bytes:
    import zstandard

    return zstandard.ZstdCompressor(level=_ZSTD_LEVEL, write_checksum=True,
                                    write_content_size=True).compress(body)


def decompress(payload: bytes | memoryview, limit: int) -> bytes:
    """Decompress one zstd frame whose declared size is at most ``limit``; raises on anything else."""
    import zstandard

    size = zstandard.frame_content_size(payload)
    if size < 0 or size > limit:
        raise ValueError(f"zstd frame declares {size} bytes (limit {limit})")
    return zstandard.ZstdDecompressor().decompress(payload)


def check_artifact(key: str, manifest: Any, files: Mapping[str, bytes | memoryview]) -> str | None:
    """Why ``files`` do not match ``manifest`` (names, sizes, sha256) or its key, or None."""
    if not isinstance(manifest, dict):
        return "the manifest is not a JSON object"
    if manifest.get("key") != key:
        return f"the manifest names key {manifest.get('key')!r}"
    table = manifest.get("files")
    if not isinstance(table, dict):
        return "the manifest has no file table"
    if set(table) != set(files):
        return f"the manifest lists files {sorted(table)} but the entry has {sorted(files)}"
    for name, info in table.items():
        if not NAME_RE.fullmatch(name) or name in (".", "..", MANIFEST):
            return f"bad file name {name!r}"
        if not isinstance(info, dict) or info.get("size") != len(files[name]):
            return f"{name}: size {len(files[name])} does not match the manifest"
        if info.get("sha256") != hashlib.sha256(files[name]).hexdigest():
            return f"{name}: sha256 does not match the manifest"
    return None


# Files that the loaders hand to dlopen (ctypes, extension modules): they must be shared libraries.
_LIBRARY_SUFFIXES = (".so",)
_ET_DYN = 3


@functools.lru_cache(maxsize=1)
def _host_elf() -> tuple[int, int, int] | None:
    """(class, byte order, machine) of this interpreter's ELF image; None where it is not ELF."""
    try:
        with open(sys.executable, "rb") as f:
            header = f.read(20)
    except OSError:
        return None
    if len(header) < 20 or header[:4] != b"\x7fELF":
        return None
    return header[4], header[5], int.from_bytes(header[18:20], _byte_order(header))


def _byte_order(header: bytes) -> Literal["little", "big"]:
    return "little" if header[5] == 1 else "big"


def _library_problem(name: str, data: bytes | memoryview) -> str | None:
    header = bytes(data[:20])
    if len(header) < 20 or header[:4] != b"\x7fELF":
        return f"{name} is not an ELF file"
    order = _byte_order(header)
    if int.from_bytes(header[16:18], order) != _ET_DYN:
        return f"{name} is not an ELF shared library"
    host = _host_elf()
    if host is not None and (header[4], header[5], int.from_bytes(header[18:20], order)) != host:
        return f"{name} is an ELF library for another machine type"
    return None


def check_usable(manifest: dict[str, Any], files: Mapping[str, bytes | memoryview]) -> str | None:
    """Why an artifact that passed check_artifact still cannot be used by this process, or None.

    Checksums only show that the files are the ones the writer meant; this checks what the loaders
    rely on: the meta is an object, the ``output`` it names is one of the files, and the libraries
    are ELF shared objects for this machine (on Linux, where tuneforge builds ELF).
    """
    meta = manifest.get("meta", {})
    if not isinstance(meta, dict):
        return f"its meta is a {type(meta).__name__}, not a JSON object"
    output = meta.get("output")
    if output is not None and (not isinstance(output, str) or output not in files):
        return f"its meta names output {output!r}, which is not one of its files {sorted(files)}"
    module = meta.get("module")
    if module is not None and not isinstance(module, str):
        return f"its meta names module {module!r}, which is not a string"
    if sys.platform.startswith("linux"):
        libraries = {name for name in files if name.endswith(_LIBRARY_SUFFIXES)}
        if isinstance(output, str) and output.endswith(_LIBRARY_SUFFIXES):
            libraries.add(output)
        for name in sorted(libraries):
            problem = _library_problem(name, files[name])
            if problem is not None:
                return problem
    return None


def split_artifact(body: bytes) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Parse and verify an artifact body; ValueError says what is wrong with it."""
    if len(body) < _ARTIFACT_HEADER.size:
        raise ValueError("shorter than its header")
    magic, version, manifest_len = _ARTIFACT_HEADER.unpack_from(body)
    if magic != ARTIFACT_MAGIC or version != FORMAT_VERSION:
        raise ValueError(f"unknown artifact header {magic!r} version {version}")
    start = _ARTIFACT_HEADER.size
    manifest = json.loads(body[start:start + manifest_len])
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise ValueError("the manifest has no file table")
    view = memoryview(body)
    offset = start + manifest_len
    files: dict[str, bytes] = {}
    for name in sorted(manifest["files"]):
        info = manifest["files"][name]
        size = info.get("size") if isinstance(info, dict) else None
        if isinstance(size, bool) or not isinstance(size, int) or size < 0 or offset + size > len(body):
            raise ValueError(f"{name}: bad size {size!r}")
        files[name] = bytes(view[offset:offset + size])
        offset += size
    if offset != len(body):
        raise ValueError(f"{len(body) - offset} bytes after the last file")
    return manifest, files
