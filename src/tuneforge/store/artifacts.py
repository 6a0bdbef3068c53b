"""Content-addressed, crash-safe, multi-process artifact store.

Layout under ``root``::

    entries/<key[:2]>/<key>/      published entries: the files plus manifest.json
    tmp/                          staging dirs and doomed entries, named <label>.<host>.<pid>.<random>
    locks/<key[:2]>/<key>.lock    per-key build locks (flock); locks/prune.lock for eviction
    stats.json, stats.lock        counters shared by every process

An entry is built in a staging dir and published with one atomic ``os.rename``, so a reader never
sees a partial entry.  The last-used time is the mtime of ``manifest.json``, bumped on every hit.

A store whose directory cannot be written (a shared, pre-built cache mounted read-only) still serves
its entries; what it lacks is built in an overlay store in a private temp directory, announced by one
warning.  Cleanup never follows a symbolic link: ``entries``, ``tmp`` or ``locks`` being a link is
refused, links inside them are removed as links.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import stat
import weakref
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from tuneforge.forksafe import ForkSafeLock
from tuneforge.store import fsutil as fs
from tuneforge.store.entry import (
    MANIFEST,
    Entry,
    StoreError,
    check_files,
    check_manifest,
    fill_staging,
    json_dict,
    make_manifest,
    scan_entries,
    scan_staging,
    validate_file_name,
    validate_key,
)
from tuneforge.store.stats import PruneResult, StatsFile, StoreStats

__all__ = ["ArtifactStore", "Entry", "PruneResult", "StoreError", "StoreStats", "validate_file_name",
           "validate_key"]

log = logging.getLogger("tuneforge.store")

_PRUNE_FRACTION = 0.9  # an automatic prune goes down to this fraction of max_bytes
_STATS_FLUSH_INTERVAL_S = 5.0  # pending hit/miss counters are flushed at least this often (on use)


class _ReadOnly(StoreError):
    """Raised before anything is written when the store's directory turns out not to be writable."""


class ArtifactStore:
    """A directory of content-addressed entries shared safely by many processes.

    Construction does not touch the disk; directories are created on first write.
    """

    def __init__(self, root: Path | str, max_bytes: int = 5 * 2**30, *,
                 lock_timeout_s: float = 600.0) -> None:
        if max_bytes < 0:
            raise StoreError(f"max_bytes must be >= 0, got {max_bytes}")
        self.root = Path(os.path.abspath(os.path.expanduser(root)))
        self.max_bytes = int(max_bytes)
        self.lock_timeout_s = float(lock_timeout_s)
        self._entries = self.root / "entries"
        self._tmp = self.root / "tmp"
        self._locks = self.root / "locks"
        ref = weakref.ref(self)  # not self: the finaliser below must not keep the store alive

        def recount_bytes() -> int:
            store = ref()
            if store is None:
                raise StoreError("the store is gone")
            return sum(size for *_, size in store._scan())

        self._stats = StatsFile(self.root / "stats.json", self.root / "stats.lock", self._tmp,
                                min(self.lock_timeout_s, 30.0), recount_bytes=recount_bytes)
        # (dir inode, manifest dev, manifest inode, manifest size) of entries whose checksums this
        # instance has verified; the manifest mtime is left out because every hit bumps it.
        self._verified: dict[str, tuple[int, int, int, int]] = {}
        self._real_shards: set[str] = set()  # shards of entries/ seen to be real directories
        self._cleaned_temp = False
        self._mutex = ForkSafeLock()
        self._mode_checked = self._layout_checked = False  # whether it is writable, has no linked dirs
        self._overlay: ArtifactStore | None = None  # set when the store cannot be written
        weakref.finalize(self, self._stats.flush_quietly)  # on garbage collection or interpreter exit

    def __repr__(self) -> str:
        return f"ArtifactStore({str(self.root)!r}, max_bytes={self.max_bytes})"

    # ----------------------------------------------------------------------------------- paths, locks

    def _entry_dir(self, key: str) -> Path:
        """The directory of ``key``'s entry.  Lookups trust a shard this instance found real before;
        writes and removals check it again (:meth:`_check_shard`)."""
        shard = self._entries / key[:2]
        if shard.name not in self._real_shards:
            self._check_shard(shard)
        return shard / key

    def _check_shard(self, shard: Path) -> None:
        # Through a linked shard, lookups would discard, and builds write, outside the store.
        try:
            mode = os.lstat(shard).st_mode
        except FileNotFoundError:
            return
        if not stat.S_ISDIR(mode):
            self._real_shards.discard(shard.name)
            raise StoreError(f"artifact store {self.root}: {shard} is a symbolic link or file; remove it")
        self._real_shards.add(shard.name)

    def _key_lock_path(self, key: str) -> Path:
        return self._locks / key[:2] / f"{key}.lock"

    def _check_layout(self) -> None:
        """Refuse a store whose working directories are symlinks (cleanup would delete through them)."""
        try:
            fs.check_real_dirs(self._entries, self._tmp, self._locks)
        except OSError as exc:
            raise StoreError(f"artifact store {self.root}: {exc.strerror}") from None

    def _overlay_store(self) -> ArtifactStore | None:
        """The overlay that takes this store's writes if its directory cannot be written, else None."""
        if not self._mode_checked:
            self._mode_checked = True
            if not all(fs.writable_dir(d) for d in (self.root, self._entries, self._tmp, self._locks)):
                self._degrade("not writable")
        return self._overlay

    def _degrade(self, reason: str) -> ArtifactStore:
        with self._mutex:
            if self._overlay is None:
                root = fs.overlay_dir(self.root.parent) / self.root.name
                self._overlay = ArtifactStore(root, self.max_bytes, lock_timeout_s=self.lock_timeout_s)
                self._stats.readonly = True
                fs.warn_readonly(self.root, root, reason)
            return self._overlay

    def _read_only_error(self, doing: str) -> StoreError:
        return StoreError(f"artifact store {self.root} is read-only; cannot {doing} (make it writable)")

    @contextlib.contextmanager
    def _lock(self, path: Path, what: str) -> Iterator[None]:
        entered = False
        try:
            with fs.file_lock(path, self.lock_timeout_s):
                entered = True
                yield
        except fs.LockTimeout as exc:
            raise StoreError(f"timed out after {self.lock_timeout_s:g}s waiting for the lock on {what} "
                             f"({exc.path}); another process holds it") from None
        except OSError as exc:
            if entered or not fs.is_readonly_error(exc):
                raise
            raise _ReadOnly(f"cannot create the lock {path} ({exc.strerror})") from exc

    def _new_staging(self, key: str) -> Path:
        self._check_layout()
        try:
            return fs.make_temp_dir(self._tmp, key)
        except OSError as exc:
            if not fs.is_readonly_error(exc):
                raise
            raise _ReadOnly(f"cannot create a staging directory in {self._tmp} ({exc.strerror})") from exc

    def _trash(self, path: Path) -> Path | None:
        """Atomically move an entry dir out of ``entries/`` into ``tmp/``; None if it was already gone."""
        if not os.path.lexists(path):
            return None
        self._check_layout()  # renaming into a linked tmp/ would move the entry out of the store
        self._check_shard(path.parent)  # through a linked shard, the entry is not ours
        self._tmp.mkdir(parents=True, exist_ok=True)
        doomed = self._tmp / fs.temp_name("trash")
        try:
            os.rename(path, doomed)
        except FileNotFoundError:
            return None
        except OSError as exc:  # e.g. a read-only store: leave the entry where it is
            log.warning("cannot remove store entry %s: %s", path, exc)
            return None
        return doomed

    # ----------------------------------------------------------------------------------------- read

    def _lookup(self, key: str) -> Entry | None:
        """Find and verify an entry without counting a hit or miss; bad entries are removed."""
        if not self._layout_checked:
            self._check_layout()
            self._layout_checked = True
        path = self._entry_dir(key)
        try:
            dir_st = os.lstat(path)
        except FileNotFoundError:
            return None
        dir_ino = dir_st.st_ino
        mpath = path / MANIFEST
        problem: str | None
        try:
            if not stat.S_ISDIR(dir_st.st_mode):
                raise NotADirectoryError(f"{path} is not a directory")  # e.g. a planted symlink
            st = os.stat(mpath)
            manifest = json.loads(mpath.read_bytes())
        except FileNotFoundError:
            problem = "manifest.json is missing"
        except NotADirectoryError as exc:
            problem = str(exc)
        except (OSError, ValueError) as exc:
            problem = f"manifest.json is unreadable ({exc})"
        else:
            problem = check_manifest(key, manifest)
            if problem is None:
                stamp = (dir_ino, st.st_dev, st.st_ino, st.st_size)
                problem = check_files(path, manifest["files"], full=self._verified.get(key) != stamp)
        if problem is not None:
            self._discard_corrupt(key, path, dir_ino, problem)
            return None
        try:
            os.utime(mpath)  # last used, for LRU eviction
        except FileNotFoundError:
            return None  # evicted or removed just now
        except OSError:
            pass  # read-only store: still usable
        self._verified[key] = (dir_ino, st.st_dev, st.st_ino, st.st_size)
        return Entry(key, path, manifest)

    def _discard_corrupt(self, key: str, path: Path, dir_ino: int, reason: str) -> None:
        self._stats.add("corrupt")
        self._verified.pop(key, None)
        if self._overlay is not None:  # read-only: it cannot be removed, only ignored
            log.warning("artifact store entry %s is corrupt (%s); ignoring it", key, reason)
            return
        log.warning("artifact store entry %s is corrupt (%s); removing it", key, reason)
        doomed = self._trash(path)
        if doomed is None:
            return
        with contextlib.suppress(OSError):
            if os.lstat(doomed).st_ino != dir_ino:
                # The bad entry was replaced between our check and the rename: put the new one back.
                with contextlib.suppress(OSError):
                    os.rename(doomed, path)
                    return
        self._stats.add("bytes", -fs.tree_size(doomed))
        fs.remove_path(doomed)

    def get(self, key: str) -> Entry | None:
        """The verified entry for ``key``, or None (a miss).  A corrupt entry is removed and is a miss."""
        validate_key(key)
        overlay = self._overlay_store()
        entry = self._lookup(key)
        if entry is None and overlay is not None:
            entry = overlay._lookup(key)
        self._stats.add("hits" if entry is not None else "misses")
        self._stats.maybe_flush(_STATS_FLUSH_INTERVAL_S)
        return entry

    def contains(self, key: str) -> bool:
        """Cheap existence check (no checksums, no counters)."""
        overlay = self._overlay_store()
        return (self._entry_dir(validate_key(key)) / MANIFEST).is_file() or (
            overlay is not None and overlay.contains(key))

    # ---------------------------------------------------------------------------------------- write

    def put(self, key: str, files: Mapping[str, bytes | str | Path], *, meta: Mapping[str, Any] | None = None,
            key_inputs: Mapping[str, Any] | None = None) -> Entry:
        """Publish an entry.  ``str`` values are written as UTF-8, ``Path`` values are copied.

        If the key already exists (another writer won the race) the existing entry is returned and the
        new data is discarded: the same key means the same content.
        """
        validate_key(key)
        for name in files:
            validate_file_name(name)
        meta_d, inputs_d = json_dict(meta, "meta"), json_dict(key_inputs, "key_inputs")
        overlay = self._overlay_store()
        existing = self._lookup(key)  # don't copy big files just to throw them away
        if existing is not None:
            return existing
        if overlay is not None:
            return overlay.put(key, files, meta=meta_d, key_inputs=inputs_d)
        self._cleanup_temp_once()

        try:
            entry, published = self._stage_and_publish(key, lambda staging: fill_staging(staging, files), meta_d,
                                                        inputs_d)
        except _ReadOnly as exc:
            return self._degrade(str(exc)).put(key, files, meta=meta_d, key_inputs=inputs_d)
        if published:
            self._after_put(key)
        return entry

    def get_or_build(self, key: str, build: Callable[[Path], Mapping[str, Any] | None], *,
                     meta: Mapping[str, Any] | None = None,
                     key_inputs: Mapping[str, Any] | None = None) -> Entry:
        """Return the entry for ``key``, building it at most once across all processes.

        On a miss, takes the per-key lock, re-checks, and only then calls ``build(staging_dir)``, which
        writes the entry's files into the empty dir and may return extra meta.  If ``build`` raises,
        the staging dir is removed, the lock released, nothing is published, and the error propagates.
        """
        validate_key(key)
        meta_d, inputs_d = json_dict(meta, "meta"), json_dict(key_inputs, "key_inputs")
        overlay = self._overlay_store()
        entry = self._lookup(key)
        if entry is not None:
            self._stats.add("hits")
            self._stats.maybe_flush(_STATS_FLUSH_INTERVAL_S)
            return entry
        if overlay is None:
            try:
                return self._build_here(key, build, meta_d, inputs_d)
            except _ReadOnly as exc:  # raised before build() ran: nothing to undo
                overlay = self._degrade(str(exc))
        return overlay.get_or_build(key, build, meta=meta_d, key_inputs=inputs_d)

    def _build_here(self, key: str, build: Callable[[Path], Mapping[str, Any] | None], meta_d: dict[str, Any],
                    inputs_d: dict[str, Any]) -> Entry:
        with self._lock(self._key_lock_path(key), f"key {key!r}"):
            entry = self._lookup(key)  # built by another process while we waited?
            if entry is not None:
                self._stats.add("hits")
                return entry
            self._stats.add("misses")
            self._cleanup_temp_once()

            def run_build(staging: Path) -> dict[str, dict[str, Any]]:
                extra = build(staging)
                if extra is not None:
                    meta_d.update(json_dict(extra, f"meta returned by the build of {key!r}"))
                return scan_staging(key, staging)

            entry, published = self._stage_and_publish(key, run_build, meta_d, inputs_d)
        if published:
            self._after_put(key)
        return entry

    def _stage_and_publish(self, key: str, fill: Callable[[Path], dict[str, dict[str, Any]]], meta: dict[str, Any],
                           inputs: dict[str, Any]) -> tuple[Entry, bool]:
        """Let ``fill`` write the files into a fresh staging dir (returning their table), then publish it;
        the staging dir is gone afterwards either way. Returns the entry and whether this call published it."""
        staging = self._new_staging(key)
        try:
            table = fill(staging)
            return self._publish(key, staging, table, meta, inputs)
        finally:
            fs.remove_path(staging)

    def _publish(self, key: str, staging: Path, table: dict[str, dict[str, Any]], meta: dict[str, Any],
                 key_inputs: dict[str, Any]) -> tuple[Entry, bool]:
        """Write the manifest and rename ``staging`` into place; return (entry, whether we published)."""
        manifest = make_manifest(key, table, meta, key_inputs)
        data = json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8")
        fs.write_file(staging / MANIFEST, data)
        fs.fsync_dir(staging)
        target = self._entries / key[:2] / key
        target.parent.mkdir(parents=True, exist_ok=True)
        self._check_shard(target.parent)  # after mkdir, which takes a link for a directory
        for _ in range(3):
            try:
                os.rename(staging, target)
            except OSError as exc:
                if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                    raise
                existing = self._lookup(key)  # someone else published first (or it was corrupt: retry)
                if existing is not None:
                    return existing, False
                continue
            fs.fsync_dir(target.parent)
            st = os.stat(target / MANIFEST)
            self._verified[key] = (os.stat(target).st_ino, st.st_dev, st.st_ino, st.st_size)
            self._stats.add("puts")
            self._stats.add("bytes", sum(int(f["size"]) for f in table.values()) + len(data))
            return Entry(key, target, manifest), True
        raise StoreError(f"could not publish entry {key!r} at {target}: the target keeps reappearing")

    def _after_put(self, key: str) -> None:
        totals = self._stats.flush()
        if totals["bytes"] > self.max_bytes:
            self._prune(int(self.max_bytes * _PRUNE_FRACTION), keep=key)

    # ---------------------------------------------------------------------------------- maintenance

    def _scan(self) -> list[tuple[float, str, Path, int]]:
        """(last used, key, path, size) of every published entry."""
        self._check_layout()
        return scan_entries(self._entries)

    def keys(self) -> list[str]:
        """The keys of all published entries (not verified)."""
        return sorted(key for _, key, _, _ in self._scan())

    def remove(self, key: str) -> bool:
        """Remove an entry; return whether it existed."""
        if self._overlay_store() is not None:
            raise self._read_only_error(f"remove {key!r}")
        doomed = self._trash(self._entry_dir(validate_key(key)))
        self._verified.pop(key, None)
        if doomed is None:
            return False
        self._stats.add("bytes", -fs.tree_size(doomed))
        fs.remove_path(doomed)
        self._stats.flush()
        return True

    def clear(self) -> int:
        """Remove every entry; return how many were removed."""
        if self._overlay_store() is not None:
            raise self._read_only_error("clear it")
        removed = 0
        with self._lock(self._locks / "prune.lock", "the store (prune)"):
            for _, key, path, _ in self._scan():
                doomed = self._trash(path)
                self._verified.pop(key, None)
                if doomed is not None:
                    self._stats.add("bytes", -fs.tree_size(doomed))
                    fs.remove_path(doomed)
                    removed += 1
        self._stats.flush()
        return removed

    def prune(self, max_bytes: int | None = None) -> PruneResult:
        """Evict least-recently-used entries until the store holds at most ``max_bytes`` (default: bound)."""
        if self._overlay_store() is not None:
            raise self._read_only_error("prune it")
        self.cleanup_temp()
        return self._prune(self.max_bytes if max_bytes is None else max_bytes, keep=None)

    def _prune(self, target: int, keep: str | None) -> PruneResult:
        removed = freed = 0
        with self._lock(self._locks / "prune.lock", "the store (prune)"):
            found = sorted(self._scan())
            total = sum(size for *_, size in found)
            for _, key, path, size in found:
                if total <= target:
                    break
                if key == keep:
                    continue
                doomed = self._trash(path)
                self._verified.pop(key, None)
                total -= size  # gone either way
                if doomed is not None:
                    fs.remove_path(doomed)
                    removed += 1
                    freed += size
            if total > target:
                log.warning("artifact store %s holds %d bytes after pruning, above the bound %d (the entry "
                            "just stored is larger than that)", self.root, total, target)
            self._stats.add("evictions", removed)
            self._stats.flush(set_bytes=total)
        if removed:
            log.info("evicted %d entries (%d bytes) from %s", removed, freed, self.root)
        return PruneResult(removed=removed, freed_bytes=freed, remaining_bytes=total)

    def _cleanup_temp_once(self) -> None:
        with self._mutex:
            if self._cleaned_temp:
                return
            self._cleaned_temp = True
        self.cleanup_temp()

    def cleanup_temp(self, max_age_s: float = 24 * 3600) -> int:
        """Remove staging dirs left by dead writers on this host, and any older than ``max_age_s``."""
        if self._overlay_store() is not None:
            return 0  # nothing of ours can be there, and nothing can be removed
        self._check_layout()  # a linked tmp/ would let this delete outside the store
        return fs.remove_stale_temp(self._tmp, max_age_s)

    # ---------------------------------------------------------------------------------------- stats

    def stats(self) -> StoreStats:
        """Counters merged across processes (this process's pending ones are flushed first)."""
        totals = self._stats.flush()
        entries = len(self._scan())
        return StoreStats(hits=totals["hits"], misses=totals["misses"], puts=totals["puts"],
                          evictions=totals["evictions"], corrupt=totals["corrupt"], bytes=totals["bytes"],
                          entries=entries, max_bytes=self.max_bytes)

    def reset_stats(self) -> None:
        """Zero the counters (all processes); the byte total is recomputed from a scan, not zeroed."""
        self._stats.flush(reset=True, set_bytes=sum(size for *_, size in self._scan()))

    def flush_stats(self) -> None:
        """Merge this process's pending counters into ``stats.json``."""
        self._stats.flush()
