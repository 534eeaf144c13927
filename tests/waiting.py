"""Waiting for a condition with a deadline, never for a fixed time."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, what: str = "the condition") -> T:
    """Return ``predicate()``'s first truthy value; fail naming ``what`` after ``timeout`` s.

    It looks again every 10 ms: as soon as the condition holds the test goes on, and a
    slow machine only makes it wait longer, up to the deadline.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}; it did not happen")
        time.sleep(0.01)
