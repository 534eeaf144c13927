"""llmgw_core.batches: a write that keeps failing (the database away) is logged whole once,
then in a line at most a minute, and its return is said once."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from llmgw_core.batches import FAILURE_LOG_EVERY, Batcher
from tests.waiting import wait_until


class Failing(Batcher):
    """Counts a batch of one each interval; its writes fail while ``away`` is set."""

    what = "the test's counts"

    def __init__(self) -> None:
        self._init_batches(0.005)
        self.away = threading.Event()
        self.away.set()
        self.written = 0

    def _take(self) -> Any | None:
        return 1

    def _write(self, batch: Any) -> None:
        if self.away.is_set():
            raise ConnectionError("the database is away")
        self.written += batch

    def _put_back(self, batch: Any) -> None:
        pass


def test_a_write_failing_in_a_row_is_logged_whole_once_then_a_line_a_minute(
    caplog: pytest.LogCaptureFixture,
) -> None:
    assert FAILURE_LOG_EVERY == 60
    batcher = Failing()
    with caplog.at_level(logging.INFO, logger="llmgw_core.batches"):
        batcher.start()
        try:
            wait_until(lambda: batcher.failures >= 50, 30, "fifty failed writes")
            records = [r for r in caplog.records if r.name == "llmgw_core.batches"]
            # Fifty failures within the minute: one record, with its traceback.
            assert len(records) == 1 and records[0].exc_info, records
            assert "the database is away" in caplog.text
            # The minute is over (shortened here): one line, no traceback, with the count.
            batcher.failure_log_every = 0.0
            wait_until(lambda: len(caplog.records) >= 2, 30, "the line a minute")
            line = caplog.records[1]
            assert not line.exc_info and "failed" in line.getMessage()
            assert "times in a row" in line.getMessage() and "ConnectionError" in line.getMessage()
            batcher.failure_log_every = 3600.0
            caplog.clear()
            batcher.away.clear()  # back
            wait_until(lambda: batcher.written > 0, 30, "a write again")
            wait_until(lambda: "again after" in caplog.text, 30, "its return said")
            assert batcher.failures == 0
        finally:
            batcher.stop()


class Stuck(Batcher):
    """A write that never ends (a database call stuck past every bound)."""

    what = "the stuck counts"

    def __init__(self) -> None:
        self._init_batches(0.005)
        self.writing = threading.Event()
        self.release = threading.Event()

    def _take(self) -> Any | None:
        return 1

    def _write(self, batch: Any) -> None:
        self.writing.set()
        self.release.wait(60)  # bounded, so the test's thread ends

    def _put_back(self, batch: Any) -> None:
        pass


def test_a_stop_beside_a_stuck_write_is_bounded_and_says_what_is_not_written(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A process that stops (atexit calls stop) is not held by a write that never ends."""
    batcher = Stuck()
    batcher.stop_wait = 0.2
    batcher.start()
    wait_until(batcher.writing.is_set, what="a write under way")
    stopper = threading.Thread(target=batcher.stop)
    stopper.start()
    stopper.join(30)
    try:
        assert not stopper.is_alive(), "stop waited on the stuck write"
        assert "a write was still under way" in caplog.text
    finally:
        batcher.release.set()
