"""How long a worker that died waits before it is started again (``llmgw_core.workers``):
at once after a steady life, else doubling with each quick death in a row, capped."""

from __future__ import annotations

from llmgw_core.workers import CAP, FIRST, STEADY, restart_delay


def test_a_worker_that_served_steadily_is_started_again_at_once() -> None:
    assert restart_delay(STEADY, 0) == (0.0, 0)
    # Its steady life forgives the quick deaths before it.
    assert restart_delay(STEADY + 60, 5) == (0.0, 0)


def test_quick_deaths_in_a_row_wait_twice_as_long_each_up_to_the_cap() -> None:
    quick, delays = 0, []
    for _ in range(10):
        delay, quick = restart_delay(0.2, quick)
        delays.append(delay)
    assert delays[:4] == [FIRST, 2 * FIRST, 4 * FIRST, 8 * FIRST]
    assert max(delays) == CAP and delays[-1] == CAP and quick == 10
