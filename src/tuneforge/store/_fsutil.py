"""File-system helpers for the artifact store: cross-process locks, durable writes, temp names."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

_CHUNK = 1 << 20


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
    """Remove a file or directory tree, ignoring anything already gone."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink()
    except FileNotFoundError:
        pass


def tree_size(path: Path) -> int:
    """Total size of the regular files directly inside ``path`` (entries are flat)."""
    total = 0
    with contextlib.suppress(FileNotFoundError), os.scandir(path) as it:
        for item in it:
            with contextlib.suppress(OSError):
                if item.is_file(follow_symlinks=False):
                    total += item.stat(follow_symlinks=False).st_size
    return total


_host_cache: list[str] = []


def hostname() -> str:
    """This machine's host name, reduced to characters that are safe in a file name."""
    if not _host_cache:
        _host_cache.append(re.sub(r"[^A-Za-z0-9-]", "_", os.uname().nodename) or "host")  # no socket import
    return _host_cache[0]


def temp_name(label: str) -> str:
    """``<label>.<host>.<pid>.<random>`` -- parsed back by :func:`parse_temp_name`."""
    return f"{label}.{hostname()}.{os.getpid()}.{os.urandom(6).hex()}"


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
