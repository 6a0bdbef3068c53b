"""Entries of the artifact store: key and file-name rules, the manifest, its verification, and finding
entries on disk (which never follows a symbolic link: a link is not an entry)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
from collections.abc import Mapping
from dataclasses import field
from pathlib import Path
from typing import Any

from tuneforge._version import __version__
from tuneforge.dataclass_lite import dataclass
from tuneforge.errors import TuneforgeError
from tuneforge.store.fsutil import copy_file, hash_file, tree_size, write_file

MANIFEST = "manifest.json"
FORMAT = "tuneforge-artifact-store"
FORMAT_VERSION = 1
KEY_RE = re.compile(r"[a-z0-9][a-z0-9_-]{7,127}")
NAME_RE = re.compile(r"[A-Za-z0-9._-]+")


class StoreError(TuneforgeError):
    """A bad key or file name, a lock time-out, or an entry that cannot be published."""


def validate_key(key: str) -> str:
    """Return ``key`` if it is a valid store key (``^[a-z0-9][a-z0-9_-]{7,127}$``), else raise."""
    if not isinstance(key, str) or not KEY_RE.fullmatch(key):
        raise StoreError(f"invalid store key {key!r}: keys must match ^[a-z0-9][a-z0-9_-]{{7,127}}$")
    return key


def validate_file_name(name: str) -> str:
    """Return ``name`` if it may be stored in an entry (a plain file name), else raise."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name) or name in (".", "..", MANIFEST):
        raise StoreError(
            f"invalid file name {name!r} for an artifact: use a plain name matching [A-Za-z0-9._-]+, "
            f"not {MANIFEST!r}, without directories")
    return name


def json_dict(value: Mapping[str, Any] | None, what: str) -> dict[str, Any]:
    """A JSON-serialisable copy of ``value`` (StoreError naming ``what`` otherwise)."""
    result = dict(value or {})
    try:
        json.dumps(result)
    except (TypeError, ValueError) as exc:
        raise StoreError(f"{what} must be JSON-serialisable: {exc}") from exc
    return result


@dataclass(frozen=True)
class Entry:
    """A published, verified entry: its key, directory and parsed manifest."""

    key: str
    path: Path
    manifest: dict[str, Any] = field(hash=False)

    def file(self, name: str) -> Path:
        """The path of one stored file (StoreError if the entry has no such file)."""
        files = self.manifest["files"]
        if name not in files:
            raise StoreError(f"entry {self.key!r} has no file {name!r} (it has {sorted(files)})")
        return self.path / name

    @property
    def files(self) -> list[str]:
        return sorted(self.manifest["files"])

    @property
    def meta(self) -> dict[str, Any]:
        meta: dict[str, Any] = self.manifest["meta"]
        return meta

    @property
    def key_inputs(self) -> dict[str, Any]:
        key_inputs: dict[str, Any] = self.manifest["key_inputs"]
        return key_inputs


def make_manifest(key: str, files: dict[str, dict[str, Any]], meta: dict[str, Any],
                  key_inputs: dict[str, Any]) -> dict[str, Any]:
    """The manifest of a new entry; ``files`` maps each name to ``{"size": n, "sha256": hex}``."""
    return {"format": FORMAT, "version": FORMAT_VERSION, "tuneforge": __version__, "key": key,
            "files": files, "meta": meta, "key_inputs": key_inputs, "created": time.time()}


def check_manifest(key: str, manifest: Any) -> str | None:
    """Return why a parsed manifest is malformed, or None."""
    if not isinstance(manifest, dict):
        return "manifest is not a JSON object"
    if manifest.get("format") != FORMAT or manifest.get("version") != FORMAT_VERSION:
        return f"unknown manifest format {manifest.get('format')!r} version {manifest.get('version')!r}"
    if manifest.get("key") != key:
        return f"manifest names key {manifest.get('key')!r}"
    files = manifest.get("files")
    if not isinstance(files, dict) or not all(isinstance(v, dict) for v in files.values()):
        return "manifest has no valid file table"
    if not isinstance(manifest.get("meta"), dict) or not isinstance(manifest.get("key_inputs"), dict):
        return "manifest has no meta/key_inputs"
    return None


def check_files(path: Path, files: dict[str, Any], *, full: bool) -> str | None:
    """Check every listed file's size, and its sha256 too when ``full``; return the problem or None."""
    for name, info in files.items():
        if not NAME_RE.fullmatch(name) or name in (".", "..", MANIFEST):
            return f"manifest lists a bad file name {name!r}"
        try:
            size = os.stat(path / name).st_size
            if size != info.get("size"):
                return f"{name}: size {size} != {info.get('size')}"
            if full and hash_file(path / name)[1] != info.get("sha256"):
                return f"{name}: sha256 mismatch"
        except FileNotFoundError:
            return f"{name} is missing"
        except OSError as exc:
            return f"{name} is unreadable ({exc})"
    return None


def scan_entries(entries: Path) -> list[tuple[float, str, Path, int]]:
    """(last used, key, path, size) of every entry directory under ``entries/<shard>/``."""
    found: list[tuple[float, str, Path, int]] = []
    try:
        shards = sorted(os.scandir(entries), key=lambda e: e.name)
    except FileNotFoundError:
        return found
    for shard in shards:
        if not shard.is_dir(follow_symlinks=False):  # a link out of the store is not a shard
            continue
        with contextlib.suppress(OSError), os.scandir(shard.path) as it:
            for item in it:
                if not KEY_RE.fullmatch(item.name) or not item.is_dir(follow_symlinks=False):
                    continue
                path = Path(item.path)
                try:
                    last_used = os.stat(path / MANIFEST).st_mtime
                except OSError:
                    last_used = 0.0  # broken entry: evict it first
                found.append((last_used, item.name, path, tree_size(path)))
    return found


def fill_staging(staging: Path, files: Mapping[str, bytes | str | Path]) -> dict[str, dict[str, Any]]:
    """Write ``files`` into a fresh staging dir (``str`` as UTF-8, ``Path`` copied); return their table."""
    table: dict[str, dict[str, Any]] = {}
    for name, value in files.items():
        if isinstance(value, Path):
            size, digest = copy_file(value, staging / name)
        elif isinstance(value, str):
            size, digest = write_file(staging / name, value.encode("utf-8"))
        elif isinstance(value, (bytes, bytearray, memoryview)):
            size, digest = write_file(staging / name, bytes(value))
        else:
            raise StoreError(f"file {name!r}: need bytes, str or Path, not {type(value).__name__}")
        table[name] = {"size": size, "sha256": digest}
    return table


def scan_staging(key: str, staging: Path) -> dict[str, dict[str, Any]]:
    """The file table of a filled staging dir (plain files only), each file fsynced."""
    table: dict[str, dict[str, Any]] = {}
    with os.scandir(staging) as it:
        for item in sorted(it, key=lambda e: e.name):
            validate_file_name(item.name)
            if not item.is_file(follow_symlinks=False):
                raise StoreError(f"build of {key!r} left {item.name!r}, which is not a plain file")
            size, digest = hash_file(Path(item.path), fsync=True)
            table[item.name] = {"size": size, "sha256": digest}
    return table
