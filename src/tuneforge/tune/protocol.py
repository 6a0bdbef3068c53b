"""Length-prefixed pickle messages between the parent and a benchmark worker over pipes.

Only small data crosses: trial jobs (specs, sources, settings), events and records. Arrays never do:
the worker makes its own example inputs from the specs with the same seed.

Pickle sends functions and classes by name, so a launcher defined in the user's script arrives as
``__main__.launch_axpy`` and means nothing to the worker until it has imported that script:
`check_pickle` tells in one pickling pass whether an object can be sent at all and which such names
it needs, and a message that cannot be unpickled is reported as `Unreadable` (its bytes consumed,
the channel still in step) instead of killing the reader.
"""

from __future__ import annotations

import io
import os
import pickle
import select
import struct
import time
import types
from typing import Any

from tuneforge.dataclass_lite import dataclass

_HEADER = struct.Struct("<Q")


class ChannelClosed(EOFError):
    """The other side closed the pipe (normally: the worker died)."""


class ChannelTimeout(TimeoutError):
    """No message within the time allowed."""


class Unreadable(Exception):
    """A whole message arrived but could not be unpickled (e.g. it names a function this side lacks)."""


class _MainFinder(pickle.Pickler):
    """A pickler that notes every global of ``__main__`` the message refers to by name."""

    def __init__(self, file: io.BytesIO) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.found: set[str] = set()

    def reducer_override(self, obj: Any) -> Any:
        # Called for every function and class pickled (and the class of every instance), before the
        # default by-name reduction, which it leaves to pickle by returning NotImplemented.
        if isinstance(obj, (type, types.FunctionType)) and obj.__module__ == "__main__":
            self.found.add(f"__main__.{obj.__qualname__}")
        return NotImplemented


def main_references(obj: Any) -> set[str]:
    """Names in ``__main__`` that unpickling `obj` would look up, e.g. {'__main__.launch_axpy'}.

    Raises whatever pickling raises when `obj` cannot be pickled at all.
    """
    finder = _MainFinder(io.BytesIO())
    finder.dump(obj)
    return finder.found


@dataclass(frozen=True)
class PickleCheck:
    """What pickling an object once (as `send` would) tells: whether it can be sent, and what it needs."""

    error: str | None  # why it cannot be pickled; None when it can
    main_names: frozenset[str]  # names in ``__main__`` its unpickling looks up (see `main_references`)

    @property
    def picklable(self) -> bool:
        return self.error is None


def check_pickle(obj: Any) -> PickleCheck:
    """Pickle `obj` once: whether it can be sent to a worker, and which ``__main__`` names it refers to.

    One pass for both, because a choice may hold sizeable data (sources, configurations) and every
    choice is pickled again when it is sent.
    """
    try:
        found = main_references(obj)
    except Exception as exc:  # anything pickling raises: a lambda, a lock, a local class, a C handle
        return PickleCheck(f"{type(exc).__name__}: {exc}", frozenset())
    return PickleCheck(None, frozenset(found))


def send(fd: int, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    view = memoryview(_HEADER.pack(len(data)) + data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_exactly(fd: int, size: int, deadline: float | None) -> bytes:
    chunks, remaining = [], size
    while remaining:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise ChannelTimeout(f"no message within the time limit ({size - remaining} of {size} bytes)")
        chunk = os.read(fd, min(remaining, 1 << 20))
        if not chunk:
            raise ChannelClosed("pipe closed")
        chunks.append(chunk)
        remaining -= len(chunk)
    return b"".join(chunks)


def receive(fd: int, timeout: float | None = None) -> Any:
    deadline = None if timeout is None else time.monotonic() + timeout
    (size,) = _HEADER.unpack(_read_exactly(fd, _HEADER.size, deadline))
    data = _read_exactly(fd, size, deadline)
    try:
        return pickle.loads(data)
    except Exception as exc:
        raise Unreadable(f"{type(exc).__name__}: {exc}") from exc
