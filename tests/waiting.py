"""Waiting for a condition with a deadline, never for a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    what: str = "the condition",
    *,
    every: float = 0.01,
) -> T:
    """Return ``predicate()``'s first truthy value; fail naming ``what`` (and the last
    value it gave) after ``timeout`` s.

    It looks again every ``every`` s (10 ms; a look that asks a database or a process over
    HTTP may want longer): as soon as the condition holds the test goes on, and a slow
    machine only makes it wait longer, up to the deadline. The suite's other waits
    (``tests.gateway.harness.wait``, ``tests.e2e.conftest.wait_for``) are this one with
    their own defaults.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"waited {timeout:g} s for {what}; it did not happen (last: {value!r})"
            )
        time.sleep(every)


def budget_minute_with(seconds: float = 25.0) -> None:
    """Return once the keys' budget minute (a fixed 60 s window of the wall clock,
    gateway.path.limits) has at least ``seconds`` left: a test that spends a key's ``rpm``
    through real processes, one request after another, must not see the window start
    again between them. At most one window's wait."""

    def left() -> float:
        return 60 - time.time() % 60

    if left() < seconds:
        wait_until(lambda: left() >= seconds, 61, "the next budget minute", every=0.05)
