"""Writing what gathered in memory off the request path, in batches, by a thread.

``Batcher`` is what the guard's recorder (``guard.records``) and the gateway's usage
(``gateway.records.usage``) share: a thread that writes every ``interval`` seconds in one
transaction, one flush at a time, a failed batch put back under what gathered meanwhile
(nothing is lost), and what is left written at stop and at the process's exit. A subclass
says how to take a batch (``_take``, None when there is nothing), write it (``_write``)
and put it back (``_put_back``).

A write that fails is logged whole (its traceback) the first time in a row, then in one
line at most every ``FAILURE_LOG_EVERY`` seconds with the count so far, and the first write
that succeeds again says after how many failures: a database away for minutes does not fill
the log with a traceback every interval.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from abc import ABC, abstractmethod
from typing import Any

from django.db import close_old_connections, connection

log = logging.getLogger(__name__)

FAILURE_LOG_EVERY = 60.0  # seconds between the one-line reports of writes failing in a row
# The longest a stop waits for a write under way (its database call is bounded by the
# connect and statement timeouts; this bounds a write that is stuck anyway).
STOP_WAIT = 90.0


class Batcher(ABC):
    thread_name = "batcher"
    what = "counts"  # for the log: "the guard's counts", "the gateway's usage"

    def _init_batches(self, interval: float) -> None:
        self.interval = interval
        self._flushing = threading.Lock()  # one flush at a time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failures = 0  # writes failed in a row
        self._failure_logged = -float("inf")
        self.failure_log_every = FAILURE_LOG_EVERY
        self.stop_wait = STOP_WAIT

    @abstractmethod
    def _take(self) -> Any | None:
        """Take what gathered (under the subclass's lock); None when there is nothing."""

    @abstractmethod
    def _write(self, batch: Any) -> None:
        """Write a batch in one transaction."""

    @abstractmethod
    def _put_back(self, batch: Any) -> None:
        """Put a batch that could not be written back under what gathered meanwhile."""

    @property
    def running(self) -> bool:
        """Return whether the background thread is writing."""
        return self._thread is not None and self._thread.is_alive()

    def flush(self) -> None:
        """Write what has gathered, in the calling thread; on failure keep it and raise."""
        with self._flushing:
            batch = self._take()
            if batch is None:
                return
            try:
                self._write(batch)
            except BaseException:
                self._put_back(batch)
                raise

    def start(self) -> None:
        """Start the background thread (once), and write what is left at exit."""
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self.thread_name, daemon=True)
        self._thread.start()
        atexit.register(self.stop)

    def stop(self) -> None:
        """Stop the background thread and write what is left (in the calling thread)."""
        thread = self._thread
        if thread is not None:
            self._stop.set()
            thread.join(self.stop_wait)
            if thread.is_alive():
                # A write stuck past every bound: what it holds, and what gathered since,
                # is not written; the process stops anyway.
                log.error("%s: a write was still under way after %.0f s; stopping without "
                          "writing the rest", self.what, self.stop_wait)  # fmt: skip
                return
            self._thread = None
        try:
            self.flush()
        except Exception:
            log.exception("%s: the last of them could not be written", self.what)

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                try:
                    close_old_connections()
                    self.flush()
                except Exception as error:
                    self._failed(error)
                else:
                    if self.failures:
                        log.warning("wrote %s again after %d failed writes", self.what,
                                    self.failures)  # fmt: skip
                        self.failures = 0
        finally:
            connection.close()

    def _failed(self, error: Exception) -> None:
        """Log a failed write: whole the first time in a row, then a line at most every
        ``failure_log_every`` seconds."""
        self.failures += 1
        now = time.monotonic()
        if self.failures == 1:
            self._failure_logged = now
            log.error("writing %s failed; trying again", self.what, exc_info=error)
        elif now - self._failure_logged >= self.failure_log_every:
            self._failure_logged = now
            log.error("writing %s has failed %d times in a row (the last: %s: %s); trying again",
                      self.what, self.failures, type(error).__name__, error)  # fmt: skip
