"""The remote tier's circuit breaker on its own: open after a failure, one trial after retry_s, closed on success."""

from __future__ import annotations

import threading
import time

import pytest

from tuneforge.store import breaker as breaker_module
from tuneforge.store.breaker import CircuitBreaker


class Clock:
    """The breaker's clock, moved by the test: a busy host's stall between two calls must not open or close it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock()
    monkeypatch.setattr(breaker_module, "time", fake)
    return fake


def test_a_failure_opens_it_until_the_retry_time_and_then_lets_one_trial_through(clock: Clock) -> None:
    breaker = CircuitBreaker(retry_s=0.2)
    assert breaker.admit() and breaker.available
    assert breaker.failed() is True  # the first failure begins an outage
    clock.now += 0.19
    assert not breaker.admit() and not breaker.available
    clock.now += 0.02
    assert breaker.available
    assert breaker.admit()  # the one trial
    assert not breaker.admit() and not breaker.available  # nobody else while it is in flight
    assert breaker.failed() is False  # the same outage goes on
    assert not breaker.admit()


def test_a_success_closes_it_and_says_how_long_the_outage_lasted(clock: Clock) -> None:
    breaker = CircuitBreaker(retry_s=0.05)
    assert breaker.succeeded() is None  # no outage to end
    breaker.failed()
    clock.now += 0.06
    assert breaker.admit()
    lasted = breaker.succeeded()
    assert lasted == pytest.approx(0.06)
    assert breaker.admit() and breaker.admit()  # closed: every call goes through


def test_only_one_of_many_threads_gets_the_trial() -> None:
    breaker = CircuitBreaker(retry_s=0.01)
    breaker.failed()
    time.sleep(0.02)
    admitted: list[bool] = []
    threads = [threading.Thread(target=lambda: admitted.append(breaker.admit())) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert admitted.count(True) == 1


def test_closed_for_good_admits_nothing() -> None:
    breaker = CircuitBreaker(retry_s=30.0)
    breaker.closed_for_good = True
    assert not breaker.admit() and not breaker.available
