"""Length-prefixed pickle messages between the parent and a benchmark worker over pipes.

Only small data crosses: trial jobs (specs, sources, settings), events and records. Arrays never do:
the worker makes its own example inputs from the specs with the same seed.
"""

from __future__ import annotations

import os
import pickle
import select
import struct
import time
from typing import Any

_HEADER = struct.Struct("<Q")


class ChannelClosed(EOFError):
    """The other side closed the pipe (normally: the worker died)."""


class ChannelTimeout(TimeoutError):
    """No message within the time allowed."""


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
    return pickle.loads(_read_exactly(fd, size, deadline))
