"""The agent's wait between tries while the control plane cannot be reached."""

from __future__ import annotations

import pytest

from agent.main import MAX_RETRY_S, retry_wait


@pytest.mark.parametrize(
    ("interval", "waits"),
    [
        # The default 5 s heartbeat: 5, 10, then 15 s at most, so a control plane that
        # comes back hears every node within 15 s, inside LLMGW_NODE_LOST_AFTER (30 s).
        (5.0, [5, 10, 15, 15, 15, 15]),
        (1.0, [1, 2, 3, 3]),
        (2.0, [2, 4, 6, 6]),
        # A long heartbeat interval is never made longer; MAX_RETRY_S caps the rest.
        (30.0, [30, 60, 60]),
        (120.0, [120, 120]),
    ],
)
def test_retries_grow_to_three_intervals_at_most(interval: float, waits: list[float]) -> None:
    assert [retry_wait(interval, n) for n in range(1, len(waits) + 1)] == waits


def test_many_failures_never_wait_past_the_cap() -> None:
    assert retry_wait(5.0, 10_000) == 15
    assert retry_wait(100.0, 10_000) == max(100.0, MAX_RETRY_S) and retry_wait(5.0, 0) == 5
