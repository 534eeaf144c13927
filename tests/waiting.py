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
