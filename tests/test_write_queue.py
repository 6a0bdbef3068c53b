"""The remote tier's write-behind queue on its own: order, bounds, flush, close, a failing write.

Each step waits for the state it needs (with a generous deadline, PATIENCE) rather than for a time to
pass, so a loaded machine makes these tests slower, never wrong.
"""

from __future__ import annotations

import threading
import time

import pytest

from tuneforge.store.write_queue import WriteQueue

PATIENCE = 60.0


def wait_until_writing(queue: WriteQueue[int]) -> None:
    deadline = time.monotonic() + PATIENCE
    while queue._busy == 0 and time.monotonic() < deadline:  # the writer has taken an item
        time.sleep(0.001)
    assert queue._busy, "the writer never took the first item"


def test_items_are_written_in_order_by_one_thread() -> None:
    written: list[int] = []
    threads: set[str] = set()

    def write(item: int) -> None:
        threads.add(threading.current_thread().name)
        written.append(item)

    queue: WriteQueue[int] = WriteQueue(write, lambda item: None, size=100, name="test-writer")
    assert all(queue.offer(i) for i in range(50))
    assert queue.flush(PATIENCE)
    assert written == list(range(50)) and threads == {"test-writer"}


def test_a_full_queue_refuses_and_flush_times_out_on_a_stuck_write() -> None:
    release = threading.Event()
    queue: WriteQueue[int] = WriteQueue(lambda item: release.wait(PATIENCE) and None, lambda item: None, size=2,
                                        name="test-writer")
    assert queue.offer(1)
    wait_until_writing(queue)  # item 1 is in flight, stuck until released
    assert queue.offer(2) and queue.offer(3)
    assert not queue.offer(4)  # two waiting: full
    assert not queue.flush(0.05)
    release.set()
    assert queue.flush(PATIENCE)


def test_close_returns_what_was_never_written_and_refuses_more() -> None:
    written: list[int] = []

    def write(item: int) -> None:
        # The write in flight ends only once close() has begun (a timer could fire before close() is
        # called on a loaded machine, and the writer would then take the next items too).
        deadline = time.monotonic() + PATIENCE
        while not queue.closed and time.monotonic() < deadline:
            time.sleep(0.001)
        written.append(item)

    queue: WriteQueue[int] = WriteQueue(write, lambda item: None, size=10, name="test-writer")
    for i in range(4):
        queue.offer(i)
    wait_until_writing(queue)
    left = queue.close(PATIENCE)
    assert written == [0] and left == [1, 2, 3]  # the write in flight finished; the rest came back
    assert queue.closed and not queue.offer(9)


def test_a_failing_write_is_reported_and_the_writer_goes_on() -> None:
    lost: list[int] = []
    written: list[int] = []

    def write(item: int) -> None:
        if item == 1:
            raise RuntimeError("boom")
        written.append(item)

    queue: WriteQueue[int] = WriteQueue(write, lost.append, size=10, name="test-writer")
    for i in range(3):
        queue.offer(i)
    assert queue.flush(PATIENCE)
    assert lost == [1] and written == [0, 2]


def test_size_must_be_a_positive_integer() -> None:
    for size in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="queue_size"):
            WriteQueue(lambda item: None, lambda item: None, size=size, name="x")  # type: ignore[arg-type]
