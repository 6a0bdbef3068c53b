"""File-system helpers of the store, public because the layers above use them too: cross-process
locks, durable writes, temp names, the one test of "this place cannot be written" (the store, the
compiler probe and the CLI must agree on what a read-only cache is), and the private overlay directory
that a read-only cache falls back to.

Removal never follows a symbolic link: a link planted in the cache must not let a cleanup delete files
outside it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import re
import shutil
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

_CHUNK = 1 << 20
log = logging.getLogger("tuneforge.store")

# errno values that say "this place cannot be written" (as opposed to a transient failure)
READONLY_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


def is_readonly_error(exc: BaseException) -> bool:
    """Whether ``exc`` says that a place cannot be written (read-only mount, permissions), as opposed to
    a failure worth a warning or a retry."""
    return isinstance(exc, OSError) and exc.errno in READONLY_ERRNOS


class LockTimeout(Exception):
    """Raised by :func:`file_lock` when the lock could not be taken in time."""

    def __init__(self, path: Path, timeout_s: float) -> None:
        super().__init__(f"timed out after {timeout_s:g}s waiting for lock {path}")
        self.path = path
        self.timeout_s = timeout_s


# flock() locks belong to an open file description, so two threads of one process that each open the
# lock file would exclude each other -- but a thread that shares a descriptor would not.  We open the file
# per acquisition and also serialise threads with one threading.Lock per lock path.
_thread_locks: dict[str, threading.Lock] = {}
_thread_locks_guard = threading.Lock()


def _reset_after_fork() -> None:
    global _thread_locks_guard
    _thread_locks_guard = threading.Lock()
    _thread_locks.clear()


os.register_at_fork(after_in_child=_reset_after_fork)


def _thread_lock(path: Path) -> threading.Lock:
    with _thread_locks_guard:
        lock = _thread_locks.get(str(path))
        if lock is None:
            lock = _thread_locks[str(path)] = threading.Lock()
        return lock


@contextlib.contextmanager
def file_lock(path: Path, timeout_s: float) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) for the duration of the block.

    The kernel drops the lock when the holder dies, so a crashed process never blocks anyone.
    Polls with ``LOCK_NB`` and short sleeps; raises :class:`LockTimeout` after ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    tlock = _thread_lock(path)
    acquired = tlock.acquire(timeout=timeout_s) if timeout_s > 0 else tlock.acquire(blocking=False)
    if not acquired:
        raise LockTimeout(path, timeout_s)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            pause = 0.002
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise LockTimeout(path, timeout_s) from None
                    time.sleep(min(pause, remaining))
                    pause = min(pause * 2, 0.05)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)
    finally:
        tlock.release()


def fsync_dir(path: Path) -> None:
    """fsync a directory so that renames and new names in it are durable (best effort)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_file(path: Path, data: bytes) -> tuple[int, str]:
    """Write ``data`` to a new file, fsync it, and return (size, sha256 hex)."""
    with open(path, "xb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return len(data), hashlib.sha256(data).hexdigest()


def copy_file(src: Path, dst: Path) -> tuple[int, str]:
    """Copy ``src`` into a new file ``dst``, fsync it, and return (size, sha256 hex)."""
    digest = hashlib.sha256()
    size = 0
    with open(src, "rb") as fin, open(dst, "xb") as fout:
        while chunk := fin.read(_CHUNK):
            digest.update(chunk)
            fout.write(chunk)
            size += len(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    return size, digest.hexdigest()


def hash_file(path: Path, *, fsync: bool = False) -> tuple[int, str]:
    """Return (size, sha256 hex) of a file, optionally fsyncing it first."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        if fsync:
            os.fsync(f.fileno())
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def atomic_write(path: Path, data: bytes, tmp_dir: Path, *, label: str) -> None:
    """Replace ``path`` with ``data`` atomically (write a temp file in ``tmp_dir``, then os.replace)."""
    tmp_dir.mkdir(parents=True, exist_ok=True)
    tmp = tmp_dir / temp_name(label)
    try:
        with open(tmp, "xb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def remove_path(path: Path) -> None:
    """Remove a file or directory tree, ignoring anything already gone; a symlink is removed itself,
    never what it points to (rmtree's fd-based walk does not follow links inside the tree either)."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            shutil.rmtree(path, ignore_errors=True)
        else:
            os.unlink(path)
    except FileNotFoundError:
        pass


def move_aside(path: Path, label: str, expected_ino: int, *, companions: tuple[str, ...] = (),
               drop: tuple[str, ...] = ()) -> Path | None:
    """Rename ``path`` to ``<path>.<label>-<time>-<pid>`` if it is still the file with inode
    ``expected_ino`` (None if it is gone or was replaced).  Files named ``<path><suffix>`` for each of
    ``companions`` go with it and those for ``drop`` are removed, both BEFORE the file itself: once the
    name is free, a new file may be made there at once, and it must not find the old one's companions
    (SQLite would take a stale ``-wal`` beside a fresh database for its own).  The caller keeps other
    processes from replacing the file meanwhile (a lock); the inode is checked again before the file is
    renamed all the same.  Raises OSError if it cannot be moved."""
    aside = path.with_name(f"{path.name}.{label}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}")
    if not _same_file(path, expected_ino):
        return None
    for suffix in companions:
        with contextlib.suppress(FileNotFoundError):
            os.rename(f"{path}{suffix}", f"{aside}{suffix}")
    for suffix in drop:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{path}{suffix}")
    if not _same_file(path, expected_ino):
        return None
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return None
    return aside


def _same_file(path: Path, ino: int) -> bool:
    try:
        return os.stat(path).st_ino == ino
    except FileNotFoundError:
        return False


def check_real_dirs(*paths: Path) -> None:
    """Raise OSError naming the first of ``paths`` that exists but is a symlink or not a directory.

    Cleanup walks these directories and deletes what it finds; through a link it would delete files
    outside the cache.
    """
    for path in paths:
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(mode):
            raise OSError(errno.ELOOP, f"{path} is a symbolic link; tuneforge refuses a cache whose "
                          f"directories are links (replace it with a real directory)", str(path))
        if not stat.S_ISDIR(mode):
            raise OSError(errno.ENOTDIR, f"{path} is not a directory (remove it)", str(path))


def remove_stale_temp(tmp: Path, max_age_s: float) -> int:
    """Remove the items of ``tmp`` made by dead processes of this host or older than ``max_age_s``
    (links as links); return how many."""
    removed = 0
    now = time.time()
    try:
        items = list(os.scandir(tmp))
    except FileNotFoundError:
        return 0
    for item in items:
        owner = parse_temp_name(item.name)
        dead = owner is not None and owner[0] == hostname() and not pid_alive(owner[1])
        try:
            old = now - item.stat(follow_symlinks=False).st_mtime > max_age_s
        except FileNotFoundError:
            continue
        if dead or old:
            log.info("removing leftover staging %s", item.path)
            remove_path(Path(item.path))
            removed += 1
    return removed


def tree_size(path: Path) -> int:
    """Total size of the regular files directly inside ``path`` (entries are flat)."""
    total = 0
    with contextlib.suppress(FileNotFoundError), os.scandir(path) as it:
        for item in it:
            with contextlib.suppress(OSError):
                if item.is_file(follow_symlinks=False):
                    total += item.stat(follow_symlinks=False).st_size
    return total


def nearest_existing(path: Path) -> Path | None:
    """``path`` if it exists (as anything, a dangling link too), else its nearest existing parent."""
    return next((p for p in (path, *path.parents) if os.path.lexists(p)), None)


def writable_dir(path: Path) -> bool:
    """Whether new files can be made in ``path`` (or, if it does not exist, in its nearest existing
    parent). ``os.access`` sees a read-only mount even for root, where permission bits do not count."""
    existing = nearest_existing(path)
    return existing is not None and existing.is_dir() and os.access(existing, os.W_OK | os.X_OK)


def writable_file(path: Path) -> bool:
    """Whether ``path`` can be written (or created) and new files made beside it (as a database's
    journal is)."""
    return (not os.path.lexists(path) or os.access(path, os.W_OK)) and writable_dir(path.parent)


# Worker processes inherit what was announced, so a pool of them does not repeat the warning.
_NOTED_ENV = "_TUNEFORGE_READONLY_NOTED"


def warn_readonly(scope: Path, overlay: Path, reason: str) -> None:
    """One warning per process tree and cache directory that it is read-only and where new work goes
    (the record database and the artifact store below it share the warning)."""
    text = str(scope)
    noted = [w for w in os.environ.get(_NOTED_ENV, "").split(os.pathsep) if w]
    if any(text == w or text.startswith(w + os.sep) or w.startswith(text + os.sep) for w in noted):
        log.debug("%s is read-only (%s); using %s", scope, reason, overlay)
        return
    os.environ[_NOTED_ENV] = os.pathsep.join([*noted, text])
    log.warning("cache directory %s is read-only (%s): lookups use it; what this process builds or measures "
                "goes to %s", scope, reason, overlay)


def overlay_dir(of: Path) -> Path:
    """A private writable directory that stands in for the read-only cache directory ``of``.

    Shared by this user's processes under the temp dir, so a second process reuses what the first one
    built; the directory must be a real one owned by us and closed to others, since code is loaded
    from it. Otherwise (someone else made it) a fresh private one is used for this process.
    """
    known = _overlays.get(str(of))
    if known is not None:
        return known
    digest = hashlib.sha256(os.fsencode(str(of))).hexdigest()[:16]
    import tempfile  # only a read-only cache needs an overlay

    top = Path(tempfile.gettempdir()) / f"tuneforge-overlay-{os.geteuid()}"
    try:
        with contextlib.suppress(FileExistsError):
            os.mkdir(top, 0o700)
        st = os.lstat(top)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise PermissionError(errno.EACCES, "not a private directory of this user", str(top))
        path = top / digest
        path.mkdir(mode=0o700, exist_ok=True)
        check_real_dirs(path)
    except OSError as exc:
        path = Path(tempfile.mkdtemp(prefix=f"tuneforge-overlay-{digest}-"))
        log.warning("cannot use the shared overlay directory %s (%s); using %s for this process",
                    top, exc, path)
    _overlays[str(of)] = path
    return path


_overlays: dict[str, Path] = {}


_host_cache: list[str] = []


def hostname() -> str:
    """This machine's host name, reduced to characters that are safe in a file name."""
    if not _host_cache:
        _host_cache.append(re.sub(r"[^A-Za-z0-9-]", "_", os.uname().nodename) or "host")  # no socket import
    return _host_cache[0]


def temp_name(label: str) -> str:
    """``<label>.<host>.<pid>.<random>`` -- parsed back by :func:`parse_temp_name`."""
    return f"{label}.{hostname()}.{os.getpid()}.{os.urandom(6).hex()}"


def make_temp_dir(parent: Path, label: str) -> Path:
    """A new empty directory in ``parent`` (made if missing) named by :func:`temp_name`."""
    parent.mkdir(parents=True, exist_ok=True)
    while True:
        path = parent / temp_name(label)
        try:
            path.mkdir()
            return path
        except FileExistsError:  # pragma: no cover - 48 random bits
            continue


def parse_temp_name(name: str) -> tuple[str, int] | None:
    """Return (host, pid) of a name made by :func:`temp_name`, or None if it is not one."""
    parts = name.split(".")
    if len(parts) != 4 or not parts[2].isdigit():
        return None
    return parts[1], int(parts[2])


def pid_alive(pid: int) -> bool:
    """Whether a process with this id exists on this host."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError as exc:  # EPERM: it exists but belongs to someone else
        return exc.errno == errno.EPERM
    return True
